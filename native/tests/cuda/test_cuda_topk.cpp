// The device top-k against the CPU device (test_cuda_ops group "topk").
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "cuda_test.h"
#include "ops/device.h"
#include "test.h"

namespace dfltest {

// topk: the k best ids and values of each row (larger first, lower id on ties, NaN as -inf, rows with fewer than k
// finite values padded with id -1 and -inf) equal the CPU's exactly, the log-sum-exps within 1e-6. Vocabularies from
// below one chunk to Qwen3.5's; rows of spread values, of many ties, and of a few finite values among -inf and NaN.
// The kernels by k: DFL_CUDA_TOPK_SELECT_MIN_K=1 runs selection for every k, =65 the arg-max passes for every k.
// Also times k = 1 .. 64 on the vocabularies of the served models.
void test_topk() {
    Rng r(31);
    for (const int64_t n : {37, 2048, 5000, 129280, 151936, 248320})
        for (const int64_t rows : {1, 3})
            for (const int k : {1, 8, 22, 64})
                for (const char *kind : {"spread", "ties", "sparse"}) {
                    if (std::strcmp(kind, "sparse") == 0 && (rows > 1 || k < 22)) continue;
                    std::vector<float> x((size_t)(rows * n));
                    for (size_t i = 0; i < x.size(); i++) {
                        const float v = r.sym(6.0f);
                        if (std::strcmp(kind, "ties") == 0)
                            x[i] = std::round(v * 2.0f) / 2.0f;  // 25 values: every candidate list has ties
                        else if (std::strcmp(kind, "sparse") == 0)
                            x[i] = i % 97 == 5 ? v : (i % 97 == 11 ? NAN : -INFINITY);  // fewer than k finite
                        else
                            x[i] = v;
                    }
                    Dual logits(x), ids((size_t)(rows * k) * 4), vals((size_t)(rows * k) * 4), lse((size_t)rows * 4);
                    for (const bool g : {false, true})
                        (g ? g_gpu : g_cpu)->topk(logits.p(g), rows, n, k, ids.p<int32_t>(g), vals.p(g), lse.p(g));
                    const std::string name = "topk n=" + std::to_string(n) + " rows=" + std::to_string(rows) +
                                             " k=" + std::to_string(k) + " " + kind;
                    compare_ids(name + " ids", ids);
                    compare(name + " values", vals, 0.0);
                    compare(name + " lse", lse, 1e-6);
                }
    // k = 3 is a greedy step's (the pick and two end-of-generation ids it may suppress), 64 a draw's without top-k
    for (const int k : {1, 3, 8, 16, 64})
        for (const int64_t n : {4096, 151936, 248320})
            for (const int64_t rows : {1, 8}) {
                std::vector<float> x((size_t)(rows * n));
                for (auto &v : x) v = r.sym(6.0f);
                Dual logits(x), ids((size_t)(rows * k) * 4), vals((size_t)(rows * k) * 4), lse((size_t)rows * 4);
                const double us = dfltest::time_gpu_us(
                    [&] { g_gpu->topk(logits.gp(), rows, n, k, ids.gp<int32_t>(), vals.gp(), lse.gp()); }, 50);
                std::printf("time topk n=%lld rows=%lld k=%d: %.1f us a call\n", (long long)n, (long long)rows, k, us);
            }
}

}  // namespace dfltest

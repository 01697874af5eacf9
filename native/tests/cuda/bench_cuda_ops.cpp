// The speed groups of test_cuda_ops ("bench"): prefill attention and the products on the qwen3-8b layer shapes, timed
// on the GPU device alone.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"
#include "cuda_test.h"
#include "ops/cuda/cuda_device.h"
#include "ops/device.h"
#include "rand_rows.h"
#include "test.h"
#include "test_batch.h"

namespace dfltest {

using namespace dfl;

// Prefill attention speed: one entry of 4096 tokens (qwen3-8b: 32 query heads, 8 KV heads of 128, f16 cache), median
// of 5 timed calls. Causal work: 2 GEMM-like products of T * T / 2 * head_dim multiply-adds per head.
void bench_attention() {
    auto *cd = dynamic_cast<cuda::CudaDevice *>(g_gpu);
    if (!cd) return;
    Rng r(6);
    const int n_head = 32, n_kv = 8, hd = 128;
    const int64_t T = 4096;
    Batch b({{(int32_t)T, 0, 0, false}}, 16, r);
    const int64_t rows = b.pool_rows() * n_kv;
    const auto kh = rand_rows(DFL_TYPE_F16, rows, hd, r), vh = rand_rows(DFL_TYPE_F16, rows, hd, r);
    DevBuf kc(g_gpu, kh.size(), "k"), vc(g_gpu, vh.size(), "v");
    g_gpu->to_device(kc.get(), kh.data(), kh.size());
    g_gpu->to_device(vc.get(), vh.data(), vh.size());
    const auto qh = rand_vec(r, (size_t)(T * n_head * hd), 2.0f);
    DevBuf Q(g_gpu, qh.size() * 4, "q"), O(g_gpu, qh.size() * 4, "o");
    g_gpu->to_device(Q.get(), qh.data(), qh.size() * 4);
    AttnCall a;
    a.Q = Q.f();
    a.out = O.f();
    a.n_head = n_head;
    a.scale = 1.0f / std::sqrt((float)hd);
    a.kv.k = kc.get<uint8_t>();
    a.kv.v = vc.get<uint8_t>();
    a.kv.type_k = a.kv.type_v = DFL_TYPE_F16;
    a.kv.k_row = a.kv.v_row = type_row_bytes(DFL_TYPE_F16, hd);
    a.kv.n_kv = n_kv;
    a.kv.head_dim = hd;
    a.kv.block_size = 16;
    const BatchMeta m = b.meta(true);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 2; i++) g_gpu->attention(m, a);
    std::vector<float> ms;
    for (int i = 0; i < 5; i++) {
        cudaEventRecord(e0, cd->stream());
        g_gpu->attention(m, a);
        cudaEventRecord(e1, cd->stream());
        cudaEventSynchronize(e1);
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        ms.push_back(t);
    }
    g_gpu->sync();
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    const double flop = 2.0 * 2.0 * (double)T * (double)T / 2.0 * hd * n_head;
    std::printf("bench attention %s prefill T=%lld h=%d kv=%d hd=%d f16 cache  %8.3f ms  %6.1f TFLOP/s\n",
                cuda::attention_gemm_path(m, a) ? "tensor-core" : "cuda-core", (long long)T, n_head, n_kv, hd, med,
                flop / (med * 1e-3) / 1e12);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

// Decode and batched-decode product speed on the qwen3-8b layer shapes (q|k|v, o, gate|up, down), the weights prepared
// as the engine prepares them (q8_0 repacked): per call, 20 calls back to back between two events (as in a replayed
// step, launch gaps included), median of 5. "layer" runs the four in order. GB/s counts each weight byte once per call.
// The layer's products in `type` (qkv, o, gate+up, down), random rows uploaded and prepared as a model's are; bytes
// their size in the file's format. qwen3-8b's, or with DFL_BENCH_LAYER=qwen35-27b the 27B qwen35's DeltaNet layer
// (qkv|z|b|a, out, gate|up, down), whose 5120-row products at 16 tokens are the 16-row verify's gap (issue 11), or with
// DFL_BENCH_LAYER=deepseek4-flash the V4-Flash layer's plain products (wq_a|wkv, wq_b, wo_b, the shared expert's
// gate|up and down; not the grouped wo_a nor the routed experts, which take their own ops), whose one-token rates
// bound issue 13's step.
struct LayerShape {
    int64_t n_out, n_in;
};
static const std::vector<LayerShape> &layer_shapes() {
    static const std::vector<LayerShape> qwen3_8b = {{6144, 4096}, {4096, 4096}, {24576, 4096}, {4096, 12288}};
    static const std::vector<LayerShape> qwen35_27b = {{16480, 5120}, {5120, 6144}, {34816, 5120}, {5120, 17408}};
    static const std::vector<LayerShape> ds4_flash = {{1536, 4096}, {32768, 1024}, {4096, 8192}, {4096, 4096}, {4096, 2048}};
    const char *env = std::getenv("DFL_BENCH_LAYER");
    const std::string layer = env ? env : "";
    return layer == "qwen35-27b" ? qwen35_27b : layer == "deepseek4-flash" ? ds4_flash : qwen3_8b;
}
// The largest inputs and outputs of the layer's products (the bench's X and Y buffers are sized from them).
static int64_t layer_max(bool inputs) {
    int64_t n = 0;
    for (const LayerShape &sh : layer_shapes()) n = std::max(n, inputs ? sh.n_in : sh.n_out);
    return n;
}

static std::vector<Weight> layer_weights(uint32_t type, Rng &r, std::vector<size_t> &bytes) {
    std::vector<Weight> layer;
    for (const LayerShape &sh : layer_shapes()) {
        const auto host = rand_rows(type, sh.n_out, sh.n_in, r);
        Weight W;
        W.type = type;
        W.n_in = sh.n_in;
        W.n_out = sh.n_out;
        W.row_bytes = type_row_bytes(type, W.n_in);
        W.data = g_gpu->upload_weight(host.data(), host.size(), true);
        g_gpu->prepare_weight(W);
        layer.push_back(W);
        bytes.push_back(host.size());
    }
    return layer;
}

void bench_gemv() {
    auto *cd = dynamic_cast<cuda::CudaDevice *>(g_gpu);
    if (!cd) return;
    Rng r(5);
    const uint32_t types[] = {DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_Q6_K, DFL_TYPE_F16};
    constexpr int64_t kMaxT = 512;  // 128: a batch of 8 verify blocks; 512: a prefill chunk
    // DFL_BENCH_TOKENS="1 16 23" times those token counts only (at most kMaxT)
    std::vector<int64_t> Ts = {1, 2, 4, 8, 16, 32, 64, 128, kMaxT};
    if (const char *env = std::getenv("DFL_BENCH_TOKENS"); env && *env) {
        Ts.clear();
        std::istringstream in(env);
        for (int64_t t; in >> t;)
            if (t >= 1 && t <= kMaxT) Ts.push_back(t);
    }
    DevBuf X(g_gpu, (size_t)layer_max(true) * 4 * kMaxT, "x"), Y(g_gpu, (size_t)layer_max(false) * 4 * kMaxT, "y");
    {
        const auto xh = rand_vec(r, (size_t)layer_max(true) * kMaxT);
        g_gpu->to_device(X.get(), xh.data(), xh.size() * 4);
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    // Median per-call milliseconds of 20 calls back to back, replayed from a CUDA graph as a decode step is (no host
    // launch cost, which may bound a small product's two launches of ~8 us in all; the PDL overlap between products
    // is kept), or launched one by one where the capture fails or DFL_BENCH_GRAPHS=0.
    const char *bg = std::getenv("DFL_BENCH_GRAPHS");
    const bool graphs = !(bg && std::strcmp(bg, "0") == 0);
    std::printf("bench gemv: %s\n", graphs ? "timed as graph replays" : "timed as launches");
    auto time = [&](const std::vector<Weight> &ws, int64_t T) {
        auto calls = [&] {
            for (int i = 0; i < 20; i++)
                for (const Weight &w : ws) g_gpu->matmul(w, X.f(), T, Y.f());
        };
        for (const Weight &w : ws) g_gpu->matmul(w, X.f(), T, Y.f());  // (grows the scratch before any capture)
        uintptr_t g = 0;
        if (graphs) {
            g_gpu->graph_begin();
            calls();
            g = g_gpu->graph_end();
            if (!g) std::printf("bench gemv: capture failed, timing launches (%s T=%lld)\n", tname(ws[0].type), (long long)T);
        }
        std::vector<float> ms;
        for (int rep = 0; rep < 5; rep++) {
            cudaEventRecord(e0, cd->stream());
            if (g)
                g_gpu->graph_launch(g);
            else
                calls();
            cudaEventRecord(e1, cd->stream());
            cudaEventSynchronize(e1);
            float t = 0;
            cudaEventElapsedTime(&t, e0, e1);
            ms.push_back(t / 20);
        }
        g_gpu->graph_free(g);
        std::sort(ms.begin(), ms.end());
        return (double)ms[ms.size() / 2];
    };
    for (uint32_t type : types) {
        std::vector<size_t> bytes;
        const std::vector<Weight> layer = layer_weights(type, r, bytes);
        size_t layer_bytes = 0;
        for (size_t i = 0; i < layer.size(); i++) {
            const Weight &W = layer[i];
            layer_bytes += bytes[i];
            for (int64_t T : Ts) {
                const double ms = time({W}, T);
                std::printf("bench gemv %-5s %5lldx%-5lld T=%-3lld %8.1f us  %7.1f GB/s\n", tname(type), (long long)W.n_out,
                            (long long)W.n_in, (long long)T, ms * 1e3, (double)bytes[i] / (ms * 1e-3) / 1e9);
            }
        }
        for (int64_t T : Ts) {
            const double ms = time(layer, T);
            std::printf("bench gemv %-5s layer       T=%-3lld %8.1f us  %7.1f GB/s  %8.0f tok/s\n", tname(type), (long long)T,
                        ms * 1e3, (double)layer_bytes / (ms * 1e-3) / 1e9, (double)T / (ms * 1e-3));
        }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

// The layer's products once per case, nothing timed: for a profiler (ncu) to catch each kernel once. DFL_PROFILE_CASES
// lists type:tokens cases, e.g. "q8_0:1 q4_K:32" (the default: one token and 8 and 32 of q8_0 and q4_K).
void profile_gemv() {
    const char *env = std::getenv("DFL_PROFILE_CASES");
    const std::string cases = env && *env ? env : "q8_0:1 q8_0:8 q8_0:32 q4_K:1 q4_K:8 q4_K:32";
    Rng r(5);
    constexpr int64_t kMaxT = 64;
    DevBuf X(g_gpu, (size_t)layer_max(true) * 4 * kMaxT, "x"), Y(g_gpu, (size_t)layer_max(false) * 4 * kMaxT, "y");
    {
        const auto xh = rand_vec(r, (size_t)layer_max(true) * kMaxT);
        g_gpu->to_device(X.get(), xh.data(), xh.size() * 4);
    }
    std::istringstream in(cases);
    for (std::string c; in >> c;) {
        const size_t colon = c.find(':');
        const std::string type_name = c.substr(0, colon);
        const int64_t T = colon == std::string::npos ? 1 : std::atoll(c.c_str() + colon + 1);
        constexpr uint32_t kNone = ~0u;
        uint32_t type = kNone;
        for (uint32_t t : {DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_Q6_K, DFL_TYPE_F16})
            if (type_name == tname(t)) type = t;
        if (type == kNone || T < 1 || T > kMaxT) {
            std::printf("FAIL profile case %s: want type:tokens, type q8_0|q4_K|q6_K|f16, 1..%lld tokens\n", c.c_str(),
                        (long long)kMaxT);
            g_failures++;
            continue;
        }
        std::vector<size_t> bytes;
        for (const Weight &W : layer_weights(type, r, bytes)) g_gpu->matmul(W, X.f(), T, Y.f());
        g_gpu->sync();
        std::printf("profile gemv %s T=%lld: the layer's four products\n", tname(type), (long long)T);
    }
}

}  // namespace dfltest

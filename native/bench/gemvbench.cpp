// How fast the CPU's integer kernels multiply one token (decode) and 8 tokens, per weight type, on the packed layout
// the engine uses: a matrix small enough to stay in L2 (the kernels' own rate) and one of 150-290 MB (the rate from
// memory), GB/s of weights read. Issue 18: whether a type's decode is bound by its tile or by the memory.
//   make -C native gemvbench && native/build/gemvbench [THREADS...]
//   GEMVBENCH_GEMM=1 native/build/gemvbench [THREADS...]: 512-token products instead (the prefill kernels)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <sys/mman.h>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/qgemm.h"
#include "quant.h"
#include "../tests/weights.h"

using namespace dfl;
using dfltest::make_weight;
using dfltest::random_weight;

namespace {

// The packed layout in 2 MB pages where the kernel allows them (the engine packs into huge-page chunks of 128 MB,
// CpuDevice::pack_buffer; a buffer a matrix here).
struct Packed {
    uint8_t *p = nullptr;
    explicit Packed(uint64_t bytes) {
        if (bytes == 0) return;
        const uint64_t size = (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
        p = (uint8_t *)std::aligned_alloc(2u << 20, size);
        madvise(p, size, MADV_HUGEPAGE);
    }
    Packed(Packed &&o) noexcept : p(o.p) { o.p = nullptr; }
    ~Packed() { std::free(p); }
    uint8_t *data() const { return p; }
    bool empty() const { return p == nullptr; }
};

// W's packed layout, as the engine packs it at load, into a buffer of its own (empty where the kernels keep none).
Packed pack(Weight &W) {
    Packed packed(int8_packed_bytes(W));
    if (!packed.empty()) {
        int8_pack_groups(W, 0, int8_pack_group_count(W), packed.data());
        W.packed = packed.data();
    }
    return packed;
}

double seconds_per_call(ThreadPool &pool, Scratch &scratch, const Weight &W, const float *X, int64_t T, float *Y) {
    using Clock = std::chrono::steady_clock;
    for (int i = 0; i < 3; i++) matmul(pool, scratch, W, X, T, Y);
    int reps = 1;
    for (;;) {
        const auto t0 = Clock::now();
        for (int i = 0; i < reps; i++) matmul(pool, scratch, W, X, T, Y);
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (s > 0.2) return s / reps;
        reps *= 2;
    }
}

}  // namespace

int main(int argc, char **argv) {
    std::vector<int> threads;
    for (int i = 1; i < argc; i++) threads.push_back(std::atoi(argv[i]));
    if (threads.empty()) threads = {1, 2};
    std::printf("kernels %s\n%8s %6s %14s %6s %10s %10s\n", int8_kernels(), "type", "threads", "matrix", "tokens",
                "us/call", "GB/s");
    dfltest::Rng rng(7);
    struct Shape {
        int64_t n_in, n_out;
    };
    // GEMVBENCH_TYPE=q4_K: that type only (a tile change measured without the rest)
    const char *only = std::getenv("GEMVBENCH_TYPE");
    const auto wanted = [&](uint32_t type) { return only == nullptr || std::strcmp(only, type_name(type)) == 0; };
    // GEMVBENCH_GEMM=1: prompt products (512 tokens) of Qwen3-0.6B's gate|up and Qwen3-4B's gate shapes, GMAC/s: the
    // prefill kernels' rate on one thread and on all, to tell a slow tile from a slow split (DFLASH_CPU_INT8 picks
    // the set).
    if (std::getenv("GEMVBENCH_GEMM")) {
        for (uint32_t type : {DFL_TYPE_Q8_0, DFL_TYPE_Q4_K})
            for (const Shape s : {Shape{1024, 6144}, Shape{2560, 9728}}) {
                if (!wanted(type)) continue;
                const std::vector<uint8_t> raw = random_weight(type, s.n_in, s.n_out, rng);
                Weight W = make_weight(type, s.n_in, s.n_out, raw);
                const Packed packed = pack(W);
                const int64_t T = 512;
                std::vector<float> X((size_t)(T * s.n_in)), Y((size_t)(T * s.n_out));
                for (auto &x : X) x = rng.sym();
                for (int th : threads) {
                    ThreadPool pool(th);
                    Scratch scratch(th);
                    const double s_call = seconds_per_call(pool, scratch, W, X.data(), T, Y.data());
                    const double gmac = (double)s.n_in * s.n_out * T / s_call / 1e9;
                    std::printf("%8s %6d %7lldx%-6lld %6lld %10.2f %10.2f GMAC/s  (%.1f a thread)\n", type_name(type),
                                th, (long long)s.n_out, (long long)s.n_in, (long long)T, s_call * 1e6, gmac, gmac / th);
                }
            }
        return 0;
    }
    for (uint32_t type : {DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_Q4_0, DFL_TYPE_Q6_K})
        for (const Shape s : {Shape{1024, 256}, Shape{4096, 65536}}) {
            if (!wanted(type)) continue;
            const std::vector<uint8_t> raw = random_weight(type, s.n_in, s.n_out, rng);
            Weight W = make_weight(type, s.n_in, s.n_out, raw);
            const Packed packed = pack(W);
            std::vector<float> X((size_t)(8 * s.n_in)), Y((size_t)(8 * s.n_out));
            for (auto &x : X) x = rng.sym();
            for (int th : threads) {
                ThreadPool pool(th);
                Scratch scratch(th);
                for (int64_t T : {int64_t(1), int64_t(8)}) {
                    const double s_call = seconds_per_call(pool, scratch, W, X.data(), T, Y.data());
                    std::printf("%8s %6d %7lldx%-6lld %6lld %10.2f %10.2f\n", type_name(type), th, (long long)s.n_out,
                                (long long)s.n_in, (long long)T, s_call * 1e6, (double)raw.size() / s_call / 1e9);
                }
            }
        }
    // One decode step's products of a Qwen3-0.6B shape (28 layers of q|k|v, o, gate|up, down, then the head), each
    // matrix its own allocation as in a loaded model: what a step's products cost without the rest of the step.
    for (uint32_t type : {DFL_TYPE_Q8_0, DFL_TYPE_Q4_K}) {
        if (!wanted(type)) continue;
        std::vector<Shape> shapes;
        for (int l = 0; l < 28; l++)
            for (const Shape s : {Shape{1024, 4096}, Shape{2048, 1024}, Shape{1024, 6144}, Shape{3072, 1024}})
                shapes.push_back(s);
        shapes.push_back(Shape{1024, 151936});
        std::vector<std::vector<uint8_t>> raws;
        std::vector<Packed> packs;
        std::vector<Weight> ws;
        uint64_t bytes = 0;
        for (const Shape &s : shapes) {
            raws.push_back(random_weight(type, s.n_in, s.n_out, rng));
            Weight W = make_weight(type, s.n_in, s.n_out, raws.back());
            packs.push_back(pack(W));
            ws.push_back(W);
            bytes += raws.back().size();
        }
        std::vector<float> X(4096), Y(151936);
        for (auto &x : X) x = rng.sym();
        for (int th : threads) {
            ThreadPool pool(th);
            Scratch scratch(th);
            auto step = [&] {
                for (const Weight &W : ws) matmul(pool, scratch, W, X.data(), 1, Y.data());
            };
            step();
            const auto t0 = std::chrono::steady_clock::now();
            constexpr int kSteps = 20;
            for (int i = 0; i < kSteps; i++) step();
            const double s_step = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kSteps;
            std::printf("%8s %6d %14s %6d %10.2f %10.2f   (Qwen3-0.6B step's products, %.0f MB)\n", type_name(type), th,
                        "0.6B step", 1, s_step * 1e6, (double)bytes / s_step / 1e9, bytes / 1e6);
        }
    }
    return 0;
}

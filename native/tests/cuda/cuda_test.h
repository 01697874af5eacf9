// What both CUDA op test programs share (test_cuda_ops.cpp, test_cuda_ds4.cpp): the two devices, buffers with the same
// bytes on both, the comparison of their outputs, and the driver (the GPU check and the loop over groups of cases).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "ops/device.h"
#include "rand_rows.h"
#include "test.h"

namespace dfltest {

inline dfl::Device *g_cpu = nullptr, *g_gpu = nullptr;
inline int g_cases = 0;

// The short name of a weight or cache type, for case names.
inline const char *tname(uint32_t t) {
    switch (t) {
    case DFL_TYPE_F32: return "f32";
    case DFL_TYPE_F16: return "f16";
    case DFL_TYPE_BF16: return "bf16";
    case DFL_TYPE_Q8_0: return "q8_0";
    case DFL_TYPE_Q4_0: return "q4_0";
    case DFL_TYPE_Q4_K: return "q4_K";
    case DFL_TYPE_Q6_K: return "q6_K";
    default: return "?";
    }
}

// One device of the two: the GPU's (gpu) or the CPU's.
inline dfl::Device *dev(bool gpu) { return gpu ? g_gpu : g_cpu; }

// The hyper-connection groups of test_cuda_ds4 (test_cuda_ds4_hc.cpp).
void test_hc();
void test_hc_pre_norm();
void test_hc_site();
void test_hc_post_site();
void test_keep_quant();

// The matmul and embed group of test_cuda_ops (test_cuda_matmul.cpp).
void test_matmul_embed();
// The Gated DeltaNet group of test_cuda_ops (test_cuda_gdn.cpp).
void test_gdn();
void test_topk();

// The speed groups of test_cuda_ops (bench_cuda_ops.cpp).
void bench_attention();
void bench_gemv();
void bench_sync();
void profile_gemv();

// One buffer with the same bytes on the CPU and the GPU device. Without initial bytes it is poisoned (every byte 0xFF,
// a NaN in f32 and f16), so an output a device does not write fails its comparison.
struct Dual {
    dfl::DevBuf c, g;
    size_t bytes;
    explicit Dual(size_t n_bytes, const void *init = nullptr)
        : c(g_cpu, n_bytes, "test"), g(g_gpu, n_bytes, "test"), bytes(n_bytes) {
        if (init)
            set(init);
        else
            poison();
    }
    template <class T>
    explicit Dual(const std::vector<T> &v) : Dual(v.size() * sizeof(T), v.data()) {}
    void set(const void *src) {
        if (!bytes) return;
        g_cpu->to_device(c.get(), src, bytes);
        g_gpu->to_device(g.get(), src, bytes);
    }
    void poison() {
        std::vector<uint8_t> p(bytes, 0xFF);
        set(p.data());
    }
    template <class T = float>
    T *cp() const { return c.get<T>(); }
    template <class T = float>
    T *gp() const { return g.get<T>(); }
    template <class T = float>
    T *p(bool gpu) const { return gpu ? gp<T>() : cp<T>(); }
    // the buffer's bytes on one device, as T
    template <class T = float>
    std::vector<T> read(bool gpu) const {
        std::vector<T> v(bytes / sizeof(T));
        (gpu ? g_gpu : g_cpu)->to_host(v.data(), (gpu ? g : c).get(), bytes);
        return v;
    }
};

// A random weight of `type` (rand_rows.h) uploaded to both devices: wc on the CPU, wg on the GPU.
struct DualWeight {
    std::vector<uint8_t> host;
    dfl::Weight wc, wg;
    DualWeight(uint32_t type, int64_t n_out, int64_t n_in, Rng &r) : host(rand_rows(type, n_out, n_in, r)) {
        wc.type = wg.type = type;
        wc.n_in = wg.n_in = n_in;
        wc.n_out = wg.n_out = n_out;
        wc.row_bytes = wg.row_bytes = type_row_bytes(type, n_in);
        wc.data = g_cpu->upload_weight(host.data(), host.size(), true);
        wg.data = g_gpu->upload_weight(host.data(), host.size(), true);
    }
};

// Microseconds a call of run takes on the GPU, launches back to back (reps after one warm-up call).
template <class F>
double time_gpu_us(F run, int reps) {
    run();
    g_gpu->sync();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; i++) run();
    g_gpu->sync();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
}

inline std::vector<float> rand_vec(Rng &r, size_t n, float a = 1.0f) {
    std::vector<float> v(n);
    for (auto &x : v) x = r.sym(a);
    return v;
}

// Relative L2 error of the GPU's floats against the CPU's; positions non-finite on both sides count as equal
// (never-written poison on both), on one side fail, and an output neither device wrote fails.
inline bool compare(const std::string &name, const std::vector<float> &got, const std::vector<float> &ref, double tol) {
    g_cases++;
    double num = 0, den = 0;
    size_t bad = 0, first = 0, finite = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const bool gn = !std::isfinite(got[i]), rn = !std::isfinite(ref[i]);
        if (gn && rn) continue;
        finite++;
        if (gn != rn) {
            if (!bad++) first = i;
            continue;
        }
        const double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    const bool ok = bad == 0 && err <= tol && (finite > 0 || ref.empty());
    if (!finite && !ref.empty())
        std::printf("FAIL %-66s neither device wrote any value\n", name.c_str());
    else if (bad)
        std::printf("FAIL %-66s %zu non-finite mismatches (first at %zu: gpu %g cpu %g)\n", name.c_str(), bad, first,
                    got[first], ref[first]);
    else
        std::printf("%s %-66s rel err %.3g (bound %.3g)\n", ok ? "ok  " : "FAIL", name.c_str(), err, tol);
    if (!ok) g_failures++;
    return ok;
}

inline bool compare(const std::string &name, const Dual &d, double tol) {
    return compare(name, d.read<float>(true), d.read<float>(false), tol);
}

// Two buffers bit for bit (a fused kernel against the ops it replaces, both on the GPU).
template <class T>
inline bool same_bits(const std::string &name, const std::vector<T> &got, const std::vector<T> &ref) {
    g_cases++;
    const bool ok = got.size() == ref.size() && std::memcmp(got.data(), ref.data(), got.size() * sizeof(T)) == 0;
    std::printf("%s %-66s %s\n", ok ? "ok  " : "FAIL", name.c_str(), ok ? "bitwise equal" : "bits differ");
    if (!ok) g_failures++;
    return ok;
}

// The GPU's int32 outputs against the CPU's, exactly (ids, picks).
inline bool compare_ids(const std::string &name, const Dual &d) {
    g_cases++;
    const std::vector<int32_t> got = d.read<int32_t>(true), ref = d.read<int32_t>(false);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < ref.size(); i++)
        if (got[i] != ref[i] && !bad++) first = i;
    if (bad)
        std::printf("FAIL %-66s %zu of %zu ids differ (first at %zu: gpu %d cpu %d)\n", name.c_str(), bad, ref.size(),
                    first, got[first], ref[first]);
    else
        std::printf("ok   %-66s %zu ids identical\n", name.c_str(), ref.size());
    if (bad) g_failures++;
    return bad == 0;
}

// Whether there is a CUDA device; without one, says the program skips (CI machines have no GPU: it then exits 0).
inline bool cuda_present(const char *suite) {
    int n_gpus = 0;
    const cudaError_t ce = cudaGetDeviceCount(&n_gpus);
    if (ce != cudaSuccess || n_gpus == 0) {
        std::printf("skip: no CUDA device (%s); %s need a GPU\n", ce != cudaSuccess ? cudaGetErrorString(ce) : "none found",
                    suite);
        return false;
    }
    return true;
}

struct Group {
    const char *name;
    void (*fn)();
};

// Runs every group, or those among the n_names names; a group that throws fails and the next still runs.
template <size_t N>
void run_groups(const Group (&groups)[N], int n_names, char **names) {
    for (const Group &g : groups) {
        // every group, or those named (several groups may share a name: "bench")
        if (n_names > 0 && std::none_of(names, names + n_names, [&](const char *n) { return std::strcmp(n, g.name) == 0; }))
            continue;
        try {
            g.fn();
        } catch (const std::exception &e) {
            std::printf("FAIL %s: exception: %s\n", g.name, e.what());
            g_failures++;
        }
    }
}

// A test program's main: line-buffered output even into a pipe or file (a device fault ends the process from a
// destructor, and the lines already printed must show how far it got), exit 0 without a GPU, the CPU and GPU devices,
// every group or those named by the arguments, and the count.
template <size_t N>
int run_cuda_tests(int argc, char **argv, const char *suite, const char *what, const Group (&groups)[N]) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    if (!cuda_present(suite)) return 0;
    std::unique_ptr<dfl::Device> cpu = dfl::make_cpu_device(0), gpu = dfl::make_cuda_device(0);
    g_cpu = cpu.get();
    g_gpu = gpu.get();
    std::printf("%s: comparing %s against %s\n", what, g_gpu->name().c_str(), g_cpu->name().c_str());
    for (int i = 1; i < argc; i++)  // a name that is no group's is a typo, not an empty pass
        if (std::none_of(groups, groups + N, [&](const Group &g) { return std::strcmp(argv[i], g.name) == 0; })) {
            std::printf("FAIL unknown group %s\n", argv[i]);
            return 2;
        }
    run_groups(groups, argc - 1, argv + 1);
    std::printf("%d cases, %d failed\n", g_cases, g_failures);
    return g_failures == 0 ? 0 : 1;
}

}  // namespace dfltest

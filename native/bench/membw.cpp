// membw: read bandwidth of this machine, the denominator of the engine's decode bound (weight bytes per token over
// bytes per second). Usage: membw [threads...]   (default: 1 and every core)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static float sum_avx2(const float *p, size_t n) {
    __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        a = _mm256_add_ps(a, _mm256_load_ps(p + i));
        b = _mm256_add_ps(b, _mm256_load_ps(p + i + 8));
        c = _mm256_add_ps(c, _mm256_load_ps(p + i + 16));
        d = _mm256_add_ps(d, _mm256_load_ps(p + i + 24));
    }
    float v[8];
    _mm256_storeu_ps(v, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
    return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}
#endif

static float sum(const float *p, size_t n) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) return sum_avx2(p, n);
#endif
    float s[8] = {0};
    for (size_t i = 0; i < n; i++) s[i & 7] += p[i];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

int main(int argc, char **argv) {
    const size_t n = (size_t)1 << 28;  // 1 GiB of floats: far beyond any cache
    float *p = (float *)std::aligned_alloc(64, n * sizeof(float));
    if (!p) return 1;
    std::vector<int> counts;
    for (int i = 1; i < argc; i++) counts.push_back(std::atoi(argv[i]));
    if (counts.empty()) counts = {1, (int)std::max(1u, std::thread::hardware_concurrency())};
    std::vector<std::thread> init;
    const unsigned hc = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned t = 0; t < hc; t++)  // first touch from every core
        init.emplace_back([=] {
            for (size_t i = n / hc * t; i < n / hc * (t + 1); i++) p[i] = 1.0f;
        });
    for (auto &t : init) t.join();
    volatile float sink = 0;
    for (int th : counts) {
        double best = 0;
        for (int rep = 0; rep < 5; rep++) {
            const auto t0 = std::chrono::steady_clock::now();
            std::vector<std::thread> ts;
            std::vector<float> r((size_t)th);
            for (int t = 0; t < th; t++) ts.emplace_back([&, t] { r[(size_t)t] = sum(p + n / th * t, n / th); });
            for (auto &t : ts) t.join();
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            best = std::max(best, (double)n * sizeof(float) / s / 1e9);
            sink = sink + r[0];
        }
        std::printf("threads %d: read %.1f GB/s\n", th, best);
    }
    std::free(p);
    return 0;
}

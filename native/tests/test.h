// Minimal test harness: TEST(name) { ... } registers a test; CHECK* record failures and continue.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace dfltest {

struct Case {
    const char *name;
    std::function<void()> fn;
};
// Inline so that every test program (tests/*.cpp linked together, each CUDA test alone) has exactly one of each.
inline std::vector<Case> &registry() {
    static std::vector<Case> r;
    return r;
}
inline int g_failures = 0;

struct Reg {
    Reg(const char *n, std::function<void()> f) { registry().push_back({n, std::move(f)}); }
};

// Deterministic generator for test data (xorshift64*).
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 2685821657736338717ull;
    }
    double uniform() { return (double)(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0,1)
    float sym(float a = 1.0f) { return (float)((uniform() * 2 - 1) * a); }
    double normal() {
        double u1 = uniform(), u2 = uniform();
        if (u1 < 1e-300) u1 = 1e-300;
        return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
};

}  // namespace dfltest

#define DFL_CAT2(a, b) a##b
#define DFL_CAT(a, b) DFL_CAT2(a, b)
#define TEST(name)                                                              \
    static void name();                                                         \
    static dfltest::Reg DFL_CAT(reg_, name)(#name, name);                       \
    static void name()

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            std::printf("  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);          \
            dfltest::g_failures++;                                                          \
        }                                                                                   \
    } while (0)

// |got - want| <= tol * max(1, scale)
#define CHECK_CLOSE(got, want, tol)                                                                            \
    do {                                                                                                       \
        const double g_ = (double)(got), w_ = (double)(want);                                                  \
        if (!(std::fabs(g_ - w_) <= (tol))) {                                                                  \
            std::printf("  %s:%d: %s = %.9g, want %.9g (tol %.3g)\n", __FILE__, __LINE__, #got, g_, w_,        \
                        (double)(tol));                                                                        \
            dfltest::g_failures++;                                                                             \
        }                                                                                                      \
    } while (0)

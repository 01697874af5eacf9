// Shared helpers of the CPU engine: errors, half-precision conversion, small utilities.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "dflash.h"

namespace dfl {

// Error carries a dfl_status across the C++ code; api.cpp turns it into a return code and a last_error message.
struct Error : std::runtime_error {
    dfl_status code;
    Error(dfl_status c, const std::string &msg) : std::runtime_error(msg), code(c) {}
};

[[noreturn]] inline void fail(dfl_status code, const std::string &msg) { throw Error(code, msg); }

// A DFL_* switch of the environment: one that is on by default is off only with NAME=0, one that is off by default on
// only with NAME=1 (kernels and paths kept for comparisons in one run, or not yet the default).
inline bool env_switch(const char *name, bool on_by_default) {
    const char *e = std::getenv(name);
    return on_by_default ? !(e && std::strcmp(e, "0") == 0) : (e && std::strcmp(e, "1") == 0);
}

// A DFL_* number of the environment (tunings kept for comparisons in one run): def where it is unset or empty.
inline int64_t env_int(const char *name, int64_t def) {
    const char *e = std::getenv(name);
    return e && *e ? std::atoll(e) : def;
}

// Hot kernels are built twice: portable x86-64-v2 and x86-64-v3 (AVX2/FMA); the loader picks one at run time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(DFL_NO_MULTIVERSION)
#define DFL_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define DFL_MULTIVERSION
#endif

// Asks for the cache lines of [p, p + bytes) (prefetcht0 on x86). The empty asm keeps the loop: GCC deleted such loops
// as loops without side effects once inlined into a larger function (attention's, 2026-12-04).
inline void prefetch_bytes(const void *p, uint64_t bytes) {
    for (uint64_t l = 0; l < bytes; l += 64) {
        __builtin_prefetch((const char *)p + l);
        asm volatile("");
    }
}

inline float fp32_from_bits(uint32_t w) {
    float f;
    std::memcpy(&f, &w, 4);
    return f;
}
inline uint32_t fp32_to_bits(float f) {
    uint32_t w;
    std::memcpy(&w, &f, 4);
    return w;
}

// IEEE binary16 -> binary32, exact (subnormals, inf and NaN included).
inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1F;
    const uint32_t man = h & 0x3FF;
    if (exp == 0) {
        if (man == 0) return fp32_from_bits(sign);
        // subnormal: man * 2^-24
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    if (exp == 31) return fp32_from_bits(sign | 0x7F800000u | (man << 13));
    return fp32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

// binary32 -> binary16, round to nearest even, overflow to inf.
inline uint16_t f32_to_f16(float f) {
    uint32_t x = fp32_to_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000;
    x &= 0x7FFFFFFFu;
    if (x >= 0x7F800000u) return (uint16_t)(sign | 0x7C00 | (x > 0x7F800000u ? 0x200 : 0));  // inf / NaN
    if (x >= 0x477FF000u) return (uint16_t)(sign | 0x7C00);  // rounds to >= 65520 -> inf
    if (x < 0x38800000u) {  // below the smallest normal half: subnormal or zero
        if (x < 0x33000000u) return (uint16_t)sign;  // < 2^-25 rounds to zero
        const uint32_t e = x >> 23;
        const uint32_t m = (x & 0x7FFFFF) | 0x800000;
        // value = m * 2^(e-150); in units of the half subnormal step 2^-24 that is m >> (126 - e)
        const uint32_t s = 126 - e;
        uint32_t q = m >> s;
        const uint32_t rem = m & ((1u << s) - 1);
        const uint32_t half = 1u << (s - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    // normal: rebias exponent 127 -> 15, round mantissa 23 -> 10 bits
    uint32_t h = ((x >> 13) - (112u << 10));
    const uint32_t rem = x & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

inline float bf16_to_f32(uint16_t b) { return fp32_from_bits((uint32_t)b << 16); }

inline uint16_t f32_to_bf16(float f) {
    uint32_t x = fp32_to_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x0040);  // quiet NaN
    return (uint16_t)((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace dfl

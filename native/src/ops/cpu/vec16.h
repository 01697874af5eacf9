// 16-lane float kernels of the CPU device (attention, swiglu, top-k): GCC's generic vectors, one source built for
// AVX-512, AVX2 and the baseline, the same element-wise operations in the same order on every target.
#pragma once

#include <cstdint>
#include <cstring>

#include "common.h"

namespace dfl {

// The functions built on these vectors: the same element-wise float operations in the same order on any target, so
// the AVX-512 clone (16 lanes a register, twice the work per instruction of the AVX2 one) gives bitwise the same
// results.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DFL_WIDE_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DFL_WIDE_MULTIVERSION
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

// The helpers below take and return 64-byte vectors: they must inline into each clone of their caller, since a
// call between an AVX-512 clone and an out-of-line copy built for the baseline passes the vectors differently (an
// out-of-line exp16_nonpos read its argument from memory while the v4 clone left it in zmm0).
#define DFL_VEC_INLINE static inline __attribute__((always_inline))

DFL_VEC_INLINE v16f load16f(const float *p) {
    v16f v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// fma(a, b, c) lane by lane, rounded once: vfmadd on the x86-64-v3 and v4 clones, the C library's fmaf on the
// default one, so every target gives the same bits. Attention's products and sums are fused (half the vector
// operations of a multiply then an add, which the build's -ffp-contract=off otherwise asks for everywhere).
DFL_VEC_INLINE v16f fma16(v16f a, v16f b, v16f c) {
    v16f r;
    for (int k = 0; k < 16; k++) r[k] = __builtin_fmaf(a[k], b[k], c[k]);
    return r;
}

// exp(x) of 16 floats x <= 0 (softmax numerators, score - max), the same operations on every target: n = round(x
// log2 e) by the 1.5 * 2^23 trick, r = x - n ln 2 with ln 2 in two parts, exp(r) by Cephes' degree-6 polynomial, then
// 2^n through the exponent bits; 0 below -87.3 (where 2^n would leave the normal range) and for -inf. Within 2 ulp of
// expf over [-87.3, 0].
DFL_VEC_INLINE v16f exp16_nonpos(v16f x) {
    const v16f floor_x = v16f{} - 87.3f;
    const v16f xc = x < floor_x ? floor_x : x;  // -inf and tiny values: a finite n below, zeroed at the end
    const v16f magic = v16f{} + 12582912.0f;
    const v16f n = (xc * 1.44269504088896341f + magic) - magic;
    v16f r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v16f p = v16f{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const v16f y = p * (r * r) + r + 1.0f;
    const v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;
    v16f scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return x < floor_x ? v16f{} : y * scale;
}

// The largest of 16 lanes by halves (max is exact, so any order gives the same value; a lane at a time was a
// dependent chain of 16 compares). No lane may be NaN (one could win, depending on where it sits).
DFL_VEC_INLINE float max_lane(v16f m) {
    v16f h = __builtin_shufflevector(m, m, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    m = h > m ? h : m;
    h = __builtin_shufflevector(m, m, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    m = h > m ? h : m;
    h = __builtin_shufflevector(m, m, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    m = h > m ? h : m;
    h = __builtin_shufflevector(m, m, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    m = h > m ? h : m;
    return m[0];
}

DFL_MULTIVERSION static inline void scale_vec(float a, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] *= a;
}

}  // namespace dfl

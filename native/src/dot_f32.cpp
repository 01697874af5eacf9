// Dense float dot products (f32 rows against f32 activations): the float path's reference kernel dot_f32 and the
// blocked kernels that give its bits for several rows and tokens at once.
#include <cstdint>

#include "f32_vec.h"
#include "quant.h"

namespace dfl {

DFL_MULTIVERSION float dot_f32(const float *a, const float *b, int64_t n) {
    v8sf s0 = {0, 0, 0, 0, 0, 0, 0, 0}, s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 += load8(a + i) * load8(b + i);
        s1 += load8(a + i + 8) * load8(b + i + 8);
    }
    float r = hsum8(s0 + s1);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

DFL_MULTIVERSION void dot4_f32(const float *w, const float *x, int64_t n, float *out) {
    const float *w0 = w, *w1 = w + n, *w2 = w + 2 * n, *w3 = w + 3 * n;
    v8sf z = {0, 0, 0, 0, 0, 0, 0, 0};
    v8sf a0 = z, a1 = z, b0 = z, b1 = z, c0 = z, c1 = z, d0 = z, d1 = z;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const v8sf x0 = load8(x + i), x1 = load8(x + i + 8);
        a0 += load8(w0 + i) * x0;
        a1 += load8(w0 + i + 8) * x1;
        b0 += load8(w1 + i) * x0;
        b1 += load8(w1 + i + 8) * x1;
        c0 += load8(w2 + i) * x0;
        c1 += load8(w2 + i + 8) * x1;
        d0 += load8(w3 + i) * x0;
        d1 += load8(w3 + i + 8) * x1;
    }
    float r0 = hsum8(a0 + a1), r1 = hsum8(b0 + b1), r2 = hsum8(c0 + c1), r3 = hsum8(d0 + d1);
    for (; i < n; i++) {
        r0 += w0[i] * x[i];
        r1 += w1[i] * x[i];
        r2 += w2[i] * x[i];
        r3 += w3[i] * x[i];
    }
    out[0] = r0;
    out[1] = r1;
    out[2] = r2;
    out[3] = r3;
}


// 4 rows x 6 tokens: out[t * 4 + r] = dot_f32(w + r * n, x + t * x_stride, n) bitwise, with each loaded weight
// register serving six tokens and each activation register four rows: dot4_f32 loaded 10 registers for 16
// multiply-adds and ran at about a third of the machine's float rate in a prompt's products. A 16-lane register holds
// a pair's two 8-lane sums side by side (lanes 0-7: dot_f32's s0, elements i..i+7; lanes 8-15: s1, i+8..i+15), so
// one 16-lane multiply and add is exactly dot_f32's two, and s0 + s1 is the low half plus the high half. 24
// accumulators: only with 32 vector registers (AVX-512: see dot_blocked_f32_ok); elsewhere it would spill.
typedef float v16sf __attribute__((vector_size(64)));

__attribute__((target_clones("arch=x86-64-v4", "default"))) void dot4x6_f32(const float *w, int64_t n, const float *x,
                                                                             int64_t x_stride, float *out) {
    constexpr int R = 4, C = 6;
    v16sf s[C][R];
#pragma GCC unroll 24
    for (int k = 0; k < R * C; k++) s[k / R][k % R] = v16sf{};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v16sf wr[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) std::memcpy(&wr[r], w + r * n + i, 64);
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) {
            v16sf xc;
            std::memcpy(&xc, x + c * x_stride + i, 64);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) s[c][r] += wr[r] * xc;
        }
    }
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++) {
            const v16sf a = s[c][r];
            const v8sf lo = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7);
            const v8sf hi = __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
            float v = hsum8(lo + hi);
            for (int64_t j = i; j < n; j++) v += w[r * n + j] * x[c * x_stride + j];
            out[c * R + r] = v;
        }
}

}  // namespace dfl

// 8-lane float vectors shared by the dense float dot products (dot_f32.cpp) and the fused dequantize-and-dot
// kernels (quant.cpp): one load and one fixed reduction order, so every kernel sums as dot_f32 does.
#pragma once

#include <cstring>

namespace dfl {

typedef float v8sf __attribute__((vector_size(32)));

static inline v8sf load8(const float *p) {
    v8sf v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum8(v8sf v) {
    // fixed pairwise order so every caller reduces identically
    const float a = (v[0] + v[4]) + (v[2] + v[6]);
    const float b = (v[1] + v[5]) + (v[3] + v[7]);
    return a + b;
}

}  // namespace dfl

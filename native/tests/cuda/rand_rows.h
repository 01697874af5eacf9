// Random weight rows both CUDA op test programs multiply (test_cuda_ops.cpp, test_cuda_ds4.cpp): the bytes of each
// type's rows, and rows of random codes with block scales small enough that products stay in range.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"
#include "quant.h"
#include "test.h"

namespace dfltest {

// Bytes of one block of each quantized type (the packed GGUF layouts of quant.h).
constexpr int kQ8_0Bytes = (int)sizeof(dfl::BlockQ8_0), kQ4_0Bytes = (int)sizeof(dfl::BlockQ4_0),
              kQ4_KBytes = (int)sizeof(dfl::BlockQ4_K), kQ6_KBytes = (int)sizeof(dfl::BlockQ6_K);

inline uint64_t type_row_bytes(uint32_t t, int64_t n) {
    using namespace dfl;
    switch (t) {
    case DFL_TYPE_F32: return (uint64_t)n * 4;
    case DFL_TYPE_F16:
    case DFL_TYPE_BF16: return (uint64_t)n * 2;
    case DFL_TYPE_Q8_0: return (uint64_t)(n / QK8_0) * kQ8_0Bytes;
    case DFL_TYPE_Q4_0: return (uint64_t)(n / QK8_0) * kQ4_0Bytes;
    case DFL_TYPE_Q4_K: return (uint64_t)(n / QK_K) * kQ4_KBytes;
    case DFL_TYPE_Q6_K: return (uint64_t)(n / QK_K) * kQ6_KBytes;
    default: return 0;
    }
}

inline void put_u16(uint8_t *p, uint16_t v) { std::memcpy(p, &v, 2); }

// n_rows rows of n random elements of `type` with sane block scales; f32 elements are uniform in [-f32_amp, f32_amp).
inline std::vector<uint8_t> rand_rows(uint32_t type, int64_t n_rows, int64_t n, Rng &r, float f32_amp = 1.0f) {
    using namespace dfl;
    const uint64_t rb = type_row_bytes(type, n);
    std::vector<uint8_t> b((size_t)(rb * n_rows));
    for (auto &x : b) x = (uint8_t)r.next();
    for (int64_t row = 0; row < n_rows; row++) {
        uint8_t *p = b.data() + row * rb;
        switch (type) {
        case DFL_TYPE_F32:
            for (int64_t i = 0; i < n; i++) {
                const float f = r.sym(f32_amp);
                std::memcpy(p + 4 * i, &f, 4);
            }
            break;
        case DFL_TYPE_F16:
            for (int64_t i = 0; i < n; i++) put_u16(p + 2 * i, f32_to_f16(r.sym()));
            break;
        case DFL_TYPE_BF16:
            for (int64_t i = 0; i < n; i++) put_u16(p + 2 * i, f32_to_bf16(r.sym()));
            break;
        case DFL_TYPE_Q8_0:
            for (int64_t k = 0; k < n / QK8_0; k++) {
                uint8_t *blk = p + k * kQ8_0Bytes;
                put_u16(blk, f32_to_f16(0.002f + 0.01f * (float)r.uniform()));
                for (int j = 0; j < QK8_0; j++)
                    if (blk[2 + j] == 0x80) blk[2 + j] = 0x81;  // -128 never comes out of quantize_row
            }
            break;
        case DFL_TYPE_Q4_0:
            for (int64_t k = 0; k < n / QK8_0; k++) put_u16(p + k * kQ4_0Bytes, f32_to_f16(0.002f + 0.01f * (float)r.uniform()));
            break;
        case DFL_TYPE_Q4_K:
            for (int64_t k = 0; k < n / QK_K; k++) {
                uint8_t *blk = p + k * kQ4_KBytes;
                put_u16(blk, f32_to_f16(0.001f + 0.004f * (float)r.uniform()));
                put_u16(blk + 2, f32_to_f16(0.001f + 0.004f * (float)r.uniform()));
            }
            break;
        case DFL_TYPE_Q6_K:
            for (int64_t k = 0; k < n / QK_K; k++) {
                uint8_t *blk = p + k * kQ6_KBytes;
                put_u16(blk + 208, f32_to_f16(0.0005f + 0.002f * (float)r.uniform()));
            }
            break;
        }
    }
    return b;
}

}  // namespace dfltest

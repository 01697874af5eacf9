// Tensor element types: block layouts, row sizes, dequantization, and the float kernels built on them.
#pragma once

#include <cstdint>

#include "common.h"

namespace dfl {

constexpr int QK4_0 = 32;
constexpr int QK8_0 = 32;
constexpr int QK_K = 256;

#pragma pack(push, 1)
// q4_0: element j of the block is (low nibble of qs[j] - 8) * d, element j + 16 is (high nibble of qs[j] - 8) * d.
struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];
};
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[QK8_0];
};
struct BlockQ4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
};
struct BlockQ6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18, "q4_0 block");
static_assert(sizeof(BlockQ8_0) == 34, "q8_0 block");
static_assert(sizeof(BlockQ4_K) == 144, "q4_K block");
static_assert(sizeof(BlockQ6_K) == 210, "q6_K block");

// 6-bit scale and min of sub-block j (of 32 elements) of a q4_K super-block (gguf-and-quant §3.5).
inline void q4k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// Elements per block and bytes per block of a type; 0 for unsupported types.
int type_block(uint32_t type);
int type_block_bytes(uint32_t type);
const char *type_name(uint32_t type);
bool weight_type_ok(uint32_t type);  // usable as a weight
bool cache_type_ok(uint32_t type);   // usable as a KV cache element type

// Bytes of a row of n elements (n must be a multiple of the block size).
inline uint64_t row_bytes(uint32_t type, int64_t n) {
    return (uint64_t)(n / type_block(type)) * (uint64_t)type_block_bytes(type);
}

// dst[0..n) = src row of n elements, converted to f32.
void dequant_row(uint32_t type, const void *src, float *dst, int64_t n);
// dst row of n elements = src (f32, f16, bf16 or q8_0 only).
void quantize_row(uint32_t type, const float *src, void *dst, int64_t n);

// Float kernels. Each dot product of one pair of rows is computed the same way wherever it is called, so results do
// not depend on how a batch is composed.
float dot_f32(const float *a, const float *b, int64_t n);
// out[r] = dot(w + r*n, x) for r in 0..3
void dot4_f32(const float *w, const float *x, int64_t n, float *out);
// out[t * 4 + r] = dot(w + r*n, x + t*x_stride) for r in 0..3, t in 0..5, bitwise dot_f32's; fast only where
// dot_blocked_f32_ok() (32 vector registers).
void dot4x6_f32(const float *w, int64_t n, const float *x, int64_t x_stride, float *out);
bool dot_blocked_f32_ok();
// dot(row of `type`, x) over n elements, dequantizing on the fly; bitwise equal to dot_f32(dequant_row(row), x).
float dot_row(uint32_t type, const void *row, const float *x, int64_t n);
// Tests only: use the portable kernels even where AVX2 is available.
void force_generic_kernels(bool on);

}  // namespace dfl

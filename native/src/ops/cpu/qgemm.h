// Integer matmul for quantized weights (q4_0, q8_0, q4_K, q6_K): the activations are quantized once per matmul to int8
// blocks of 32 (one float scale per block, like q8_0) and multiplied with the weight codes by integer instructions
// (AVX-512 VNNI, AVX-VNNI or AVX2 maddubs, picked at run time), so no weight is ever converted to float.
//
// Every (weight row, token) dot product runs the same sequence of operations whichever tile computes it, so a token's
// output does not depend on which other tokens share its batch or on how the work is split over threads.
#pragma once

#include <cstdint>

#include "ops/device.h"

namespace dfl {

constexpr int kActBlock = 32;

// T activation rows quantized to int8 blocks of kActBlock: q holds T rows of n_in codes; d and dsum hold, per row,
// n_in/kActBlock block scales and block sums (d * sum of the block's codes, for the q4_K min term).
struct QuantizedActs {
    const int8_t *q = nullptr;
    const float *d = nullptr;
    const float *dsum = nullptr;
    // Only for the AVX-512 tiles (int8_wants_pair_layout()): per block, -128 * the sum of its codes (the q8_0 tiles
    // multiply codes + 128; q4_0 divides it by 16), and per 16 codes -32 * their sum (q6_K multiplies codes + 32 in
    // 16-element sub-blocks of their own scale; two values per block).
    const int32_t *bias = nullptr;
    const int32_t *bias16 = nullptr;
    int64_t n_in = 0;

    int64_t n_blocks() const { return n_in / kActBlock; }
    const int32_t *biases(int64_t t) const { return bias + t * n_blocks(); }
    const int32_t *biases16(int64_t t) const { return bias16 + t * 2 * n_blocks(); }
    const int8_t *codes(int64_t t) const { return q + t * n_in; }
    const float *scales(int64_t t) const { return d + t * n_blocks(); }
    const float *sums(int64_t t) const { return dsum + t * n_blocks(); }
};

// Quantizes one row of n floats (n a multiple of kActBlock): per block d = max|x| / 127, q = round(x / d).
void quantize_act_row(const float *x, int64_t n, int8_t *q, float *d, float *dsum);

// Whether the kernels read QuantizedActs::bias and bias16, and fills them for one row from its codes.
bool int8_wants_pair_layout();
void expand_act_row(const int8_t *q, int64_t n, int32_t *bias, int32_t *bias16);

// Whether W's product runs on the integer kernels (its type has one and they are enabled).
bool int8_matmul_applies(const Weight &W);

// Y[t][r] for rows [r0, r1) of W and tokens [t0, t1) of A; Y rows have W.n_out elements.
void int8_gemm_block(const Weight &W, const QuantizedActs &A, int64_t r0, int64_t r1, int64_t t0, int64_t t1,
                     float *Y);

// The active kernels' own layout of W, packed once at load (Weight::packed; only the AVX-512 kernels have one, for
// q4_0, q8_0, q4_K and q6_K: groups of 16 rows interleaved, the size of the original, + 1 % for q6_K). int8_packed_bytes is 0 when
// there is none; int8_pack_groups writes groups [g0, g1) of int8_pack_group_count(W) into dst, the layout's start.
uint64_t int8_packed_bytes(const Weight &W);
// Rows a packed group holds, and its bytes (int8_packed_bytes of one group): group g starts g bytes-of-a-group in.
constexpr int kInt8GroupRows = 16;
uint64_t int8_pack_group_bytes(const Weight &W);
bool int8_packs_type(uint32_t type);
int64_t int8_pack_group_count(const Weight &W);
void int8_pack_groups(const Weight &W, int64_t g0, int64_t g1, uint8_t *dst);

// Which integer kernels run: "avx512amx", "avx512vnni", "avxvnni", "avx2", "generic", "avx512amx-emu"
// (tests), or "off" (the float path).
const char *int8_kernels();
// Tokens a task of a prompt product (int8_gemm_block's t1 - t0) should take with the active kernels.
int64_t int8_token_block();
// Tests and benchmarks: "off" sends quantized weights back to the float path; "generic", "avx2", "avxvnni",
// "avx512vnni" force a kernel set (falls back to the best supported one below it); "" or "auto" picks the best.
// The environment variable DFLASH_CPU_INT8 sets the initial choice the same way.
void set_int8_kernels(const char *name);

}  // namespace dfl

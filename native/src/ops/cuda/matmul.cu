// Embedding lookup and Y = X W^T for every weight type.
//  - Repacked q8_0 and q4_K up to 64 tokens: int8 activations (gemv_int8.cu, gemv_kquant.cu: dp4a GEMVs; mma_q8p.cu,
//    mma_q4k.cu: int8 tensor cores).
//  - T == 1 (decode): one warp per output row streams the row once, decoding it in registers, f32 accumulation; the
//    activations are tiny and stay in L1/L2. This memory-bound path is the single-sequence decode speed (the warp
//    GEMV of the weights no int8 kernel takes: gemv_float.cu).
//  - 2 <= T <= 64 (batched decode, DFlash verify blocks, small prefill chunks), other f16/bf16/quantized weights: a
//    tensor-core kernel on the packed weights (mmq.cu) that reads every weight byte once per call and decodes
//    it once for all tokens. f32 weights, and the odd-addressed tensors it refuses, keep the GEMV (T <= 8, or in chunks
//    of 8 up to 32 tokens for quantized weights) and cuBLAS.
//  - Prefill (T > 64): tensor cores through cuBLAS (gemm.cu).
#include <algorithm>
#include <atomic>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

// Quantized weights: up to this many tokens (a DFlash verify block is 16) run the GEMV in chunks of kGemvMaxTokens.
constexpr int64_t kGemvChunkedMaxTokens = 32;

// Most tokens the repacked-q8_0 dp4a kernel takes (in passes of 16, each reading the weight once) before the
// tensor-core kernel does: 32 by default (measured on the H200: two dp4a passes beat one mmq pass at 32 tokens),
// DFL_CUDA_Q8P_MAX_TOKENS overrides it (for comparisons in one run).
static int64_t q8p_max_tokens() {
    static const int64_t n = std::max<int64_t>(0, env_int("DFL_CUDA_Q8P_MAX_TOKENS", 32));
    return n;
}

__global__ void embed_kernel(uint32_t type, const uint8_t *W, uint64_t row_bytes, int64_t n_in, int64_t n_rows,
                             const int32_t *tokens, float *out) {
    const int64_t t = blockIdx.x;
    const int32_t tok = tokens[t];
    float *o = out + t * n_in;
    if (tok < 0 || tok >= n_rows) {  // an out-of-range id must not read out of bounds; NaN makes it visible
        for (int64_t i = threadIdx.x; i < n_in; i += blockDim.x) o[i] = __int_as_float(0x7fc00000);
        return;
    }
    const uint8_t *row = W + (uint64_t)tok * row_bytes;
    for (int64_t i = threadIdx.x; i < n_in; i += blockDim.x) o[i] = load_elem(type, row, i);
}

void launch_embed(cudaStream_t s, const Weight &W, const int32_t *tokens, int64_t T, float *out) {
    if (T <= 0) return;
    embed_kernel<<<(unsigned)T, 256, 0, s>>>(W.type, W.data, W.row_bytes, W.n_in, W.n_out, tokens, out);
    check_launch("embed");
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// Most tokens of a 16-bit weight's product on the GEMV (each row read once for all of them) instead of the
// tensor-core kernel: up to 8 (kGemvMaxTokens; DFL_CUDA_GEMV16_TOKENS=N, 1: the tensor cores from 2). Why:
// mmq_kernel<__half> ran DeepSeek V4's f16 compressor and indexer products of a batch-8 step at ~0.4 TB/s, 31-42 us
// each alone on grids of 16-128 blocks (ncu 12-07 13:1x), where one token's GEMV of the compressor took ~10. The
// 4-layer V4-Flash step on an H100, alternated twice (12-07 15:2x): b8 2.178 / 2.172 -> 2.142 / 2.149 ms, b1 and b32
// even.
static int64_t gemv16_tokens() {
    static const int64_t n =
        std::max<int64_t>(1, std::min(kGemvMaxTokens, env_int("DFL_CUDA_GEMV16_TOKENS", kGemvMaxTokens)));
    return n;
}

// Whether launch_matmul would take cuBLAS for T tokens of every part of a matrix laid side by side (a part has no
// packed layout of its own, so no int8 kernel takes it beyond 64 tokens).
bool gemm_takes_parts(int64_t T) {
    return T > std::max({kMmqMaxTokens, kGemvChunkedMaxTokens, i8_mma_max_tokens()});
}

// Whether T tokens of W take launch_matmul's repacked q8_0 kernels (launch_gemv_q8p).
bool q8p_takes(const Weight &W, int64_t T) {
    return (T <= q8p_max_tokens() || T <= i8_mma_max_tokens()) && q8p_ok(W);
}

void launch_matmul(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y) {
    if (T <= 0 || W.n_out <= 0) return;
    if (W.type != DFL_TYPE_F32 && W.type != DFL_TYPE_F16 && W.type != DFL_TYPE_BF16 && W.type != DFL_TYPE_Q8_0 &&
        W.type != DFL_TYPE_Q4_K && W.type != DFL_TYPE_Q6_K)
        fail(DFL_ERR_UNSUPPORTED, "matmul: unsupported weight type " + std::to_string(W.type));
    // The path depends only on T and the weight type (and, for the tensor-core path, that the bytes are readable as
    // 16-bit words, true of every GGUF tensor): T == 1 is the GEMV, batched decode and verify blocks the tensor-core
    // kernel on the packed weights, prefill cuBLAS.
    if (q8p_takes(W, T)) {  // q8_0 repacked at load: int8 activations
        launch_gemv_q8p(dev, W, X, T, Y);
        return;
    }
    if (T >= q4k_mma_min_tokens() && T <= i8_mma_max_tokens() && q4k_mma_ok(W)) {  // q4_K on int8 tensor cores
        launch_gemv_q4k_mma(dev, W, X, T, Y);
        return;
    }
    if (T <= kGemvMaxTokens && q4k_i8_on() && q4k_i8_ok(W, GemvZ{}) && aligned16(X)) {  // q4_K on int8 activations
        launch_gemv_q4k_i8(dev, W, X, T, Y, GemvZ{}, 1);
        return;
    }
    if (T >= 2 && T <= i8_mma_max_tokens() && q6k_mma_on() && q6k_mma_ok(W)) {  // q6_K on int8 tensor cores
        launch_gemv_q6k_mma(dev, W, X, T, Y);
        return;
    }
    if (T <= kGemvMaxTokens && q6k_i8_on() && q6k_i8_ok(W)) {  // q6_K on int8 activations
        launch_gemv_q6k_i8(dev, W, X, T, Y);
        return;
    }
    if (T < kMmqMinTokens || (T <= gemv16_tokens() && (W.type == DFL_TYPE_F16 || W.type == DFL_TYPE_BF16))) {
        launch_gemv(dev.stream(), W, X, T, Y);
        return;
    }
    if (T <= kMmqMaxTokens && mmq_ok(W)) {
        launch_mmq(dev, W, X, T, Y);
        return;
    }
    if (T <= kGemvMaxTokens) {
        launch_gemv(dev.stream(), W, X, T, Y);
        return;
    }
    const bool quantized = W.type == DFL_TYPE_Q8_0 || W.type == DFL_TYPE_Q4_K || W.type == DFL_TYPE_Q6_K;
    if (quantized && T <= kGemvChunkedMaxTokens) {
        // verify-sized batches: re-reading the packed weight once per 8 tokens moves less memory than writing and
        // re-reading an f16 copy of it for cuBLAS
        for (int64_t t0 = 0; t0 < T; t0 += kGemvMaxTokens)
            launch_gemv(dev.stream(), W, X + t0 * W.n_in, std::min(kGemvMaxTokens, T - t0), Y + t0 * W.n_out);
        return;
    }
    launch_gemm(dev, W, X, T, {GemmOut{0, W.n_out, Y, W.n_out}});
}

}  // namespace cuda
}  // namespace dfl

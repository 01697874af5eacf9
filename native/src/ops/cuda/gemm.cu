// Products of more than 64 tokens (prefill) on tensor cores through cuBLAS, for launch_matmul and matmul_parts.
// f16/bf16 weights are used as they are; quantized weights are dequantized to f16 in chunks of rows in the device
// scratch (repacked q8_0 and q4_K by 16-byte words, others element by element); X is converted to the weight's
// 16-bit type once per product; f32 accumulation and output. f32 weights go through SGEMM (no TF32), exact to f32
// rounding.
#include <algorithm>
#include <string>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {


__global__ void f32_to_16bit_kernel(const float *x, int64_t n, void *out, bool bf16) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (bf16)
            ((uint16_t *)out)[i] = f32_to_bf16_bits(x[i]);
        else
            ((__half *)out)[i] = __float2half_rn(x[i]);
    }
}

// Rows [r0, r0 + gridDim.x) of W dequantized to f16, one block per row.
__global__ void dequant_rows_f16_kernel(uint32_t type, const uint8_t *W, uint64_t row_bytes, int64_t n_in, int64_t r0,
                                        __half *out) {
    const int64_t r = blockIdx.x;
    const uint8_t *row = W + (uint64_t)(r0 + r) * row_bytes;
    __half *o = out + r * n_in;
    for (int64_t i = threadIdx.x; i < n_in; i += blockDim.x) o[i] = __float2half_rn(load_elem(type, row, i));
}

// The same for q8_0 repacked at load (prepare_weight) and q4_K by 16-byte words (DFL_CUDA_DEQUANT_FAST=0: the kernel
// above, which reads a byte at a time through load_elem's type switch; prefill dequantizes every weight each forward,
// qwen3-8b q8_0: 8.7 GB read, 16.4 GB written). A chunk's rows are read as one run of blocks: the repacked q8_0 quants
// and scales, and q4_K rows of whole super-blocks, are contiguous from row to row, so a thread finds its block
// without dividing by the row length. Each thread takes kDequantPer words, all loaded before any is converted.
// H200 (pp512 qwen3-8b, tok/s): per element -> words 11,502 -> 12,664 (q8_0), 9,720 -> 10,415 (q4_K) at 12-03 22:12;
// q4_K a thread per output word instead of per 32-byte chunk (128 contiguous bytes a thread) 12,988 -> 17,060 at 23:47.
constexpr int kDequantPer = 2;

template <class Dq>
__global__ void dequant_words_kernel(Dq dq, int64_t n_words, __half *out) {
    const int64_t first = (int64_t)blockIdx.x * blockDim.x * kDequantPer + threadIdx.x;
    typename Dq::Raw raw[kDequantPer];
#pragma unroll
    for (int k = 0; k < kDequantPer; k++) {
        const int64_t w = first + (int64_t)k * blockDim.x;
        if (w < n_words) raw[k] = dq.load(w);
    }
#pragma unroll
    for (int k = 0; k < kDequantPer; k++) {
        const int64_t w = first + (int64_t)k * blockDim.x;
        if (w < n_words) dq.store(raw[k], w, out);
    }
}

// q8_0: a word is 16 quants (a warp's loads one contiguous run) and its block's scale; 32 bytes of f16 out.
struct DequantQ8p {
    const int8_t *qs;
    const uint16_t *dw;
    struct Raw {
        int4 q;
        float d;
    };
    __device__ Raw load(int64_t w) const { return Raw{__ldg((const int4 *)qs + w), half_bits_to_f32(__ldg(dw + w / 2))}; }
    __device__ void store(const Raw &r, int64_t w, __half *out) const {
        const int words[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        uint4 h[2];
        uint32_t *hw = (uint32_t *)h;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int v = words[j / 2] >> (16 * (j % 2));
            const __half2 p = __floats2half2_rn(r.d * (float)(int8_t)(v & 0xFF), r.d * (float)(int8_t)((v >> 8) & 0xFF));
            hw[j] = *(const uint32_t *)&p;
        }
        uint4 *o = (uint4 *)(out + 16 * w);
        o[0] = h[0];
        o[1] = h[1];
    }
};

// q4_K: a word is 8 elements of a sub-block (one 16-byte output word, so a warp's stores are one contiguous run and a
// warp covers one super-block), from the low or high nibbles of 8 quant bytes, with the super-block's header.
struct DequantQ4K {
    const uint8_t *W;
    struct Raw {
        uint4 hdr;
        uint2 q;
    };
    __device__ Raw load(int64_t w) const {
        const uint8_t *blk = W + (uint64_t)(w / 32) * kQ4_KBytes;
        const int wi = (int)(w % 32), sub = wi / 4;
        return Raw{__ldg((const uint4 *)blk), __ldg((const uint2 *)(blk + 16 + 32 * (sub / 2) + 8 * (wi % 4)))};
    }
    __device__ void store(const Raw &r, int64_t w, __half *out) const {
        const int sub = (int)(w % 32) / 4, shift = 4 * (sub % 2);
        int sc, m;
        q4k_scale_min_hdr(r.hdr, sub, sc, m);
        const float d = half_bits_to_f32((uint16_t)(r.hdr.x & 0xFFFF)) * (float)sc,
                    mn = half_bits_to_f32((uint16_t)(r.hdr.x >> 16)) * (float)m;
        const uint32_t b[2] = {r.q.x >> shift, r.q.y >> shift};
        uint4 h;
        uint32_t *hw = (uint32_t *)&h;
#pragma unroll
        for (int j = 0; j < 4; j++) {  // elements 2j, 2j + 1: bytes 2j, 2j + 1
            const uint32_t v = b[j / 2] >> (16 * (j % 2));
            const __half2 p = __floats2half2_rn(d * (float)(v & 0xF) - mn, d * (float)((v >> 8) & 0xF) - mn);
            hw[j] = *(const uint32_t *)&p;
        }
        *((uint4 *)out + w) = h;
    }
};

template <class Dq>
static void launch_dequant_words(cudaStream_t s, const Dq &dq, int64_t n_words, __half *out) {
    dequant_words_kernel<<<grid_for((n_words + kDequantPer - 1) / kDequantPer, 256), 256, 0, s>>>(dq, n_words, out);
}

static bool dequant_fast_on() {
    static const bool on = env_switch("DFL_CUDA_DEQUANT_FAST", true);
    return on;
}

// Rows [r0, r0 + rows) of W as f16 into out (rows x n_in).
static void dequant_rows_f16(cudaStream_t s, const Weight &W, int64_t r0, int64_t rows, __half *out) {
    if (dequant_fast_on() && q8p_ok(W)) {
        launch_dequant_words(s, DequantQ8p{q8p_quants(W) + r0 * W.n_in, q8p_scales(W) + r0 * (W.n_in / 32)},
                             rows * W.n_in / 16, out);
    } else if (dequant_fast_on() && q4k_mma_ok(W)) {  // whole 16-byte-aligned super-blocks, as the mma kernel reads
        launch_dequant_words(s, DequantQ4K{W.row(r0)}, rows * W.n_in / 8, out);
    } else {
        dequant_rows_f16_kernel<<<(unsigned)rows, 256, 0, s>>>(W.type, W.data, W.row_bytes, W.n_in, r0, out);
    }
    check_launch("matmul (dequantize)");
}

void check_blas(cublasStatus_t st, const char *op) {
    if (st != CUBLAS_STATUS_SUCCESS) fail(DFL_ERR_INTERNAL, std::string(op) + ": cuBLAS status " + std::to_string((int)st));
}


constexpr size_t kDequantChunkBytes = 64u << 20;  // f16 scratch for dequantized weight rows

// Rows of a weight dequantized per chunk: as many as kDequantChunkBytes holds, a multiple of DFL_CUDA_GEMM_ALIGN rows
// (default 64). An odd row count (64 MB of n_in 5120 is 6,553.6 rows) leaves every chunk after the first, its output
// columns and its f16 rows off cuBLAS's aligned tensor-core kernels: on the H200 the 27B qwen35 shape's 512-row
// verify ran its products at ~90 TFLOPS where qwen3-8b's prefill (n_in 4096: 8,192 rows) ran at ~260.
static int64_t dequant_chunk_rows(int64_t n_in, int64_t n_out) {
    static const int64_t align = std::max<int64_t>(1, env_int("DFL_CUDA_GEMM_ALIGN", 64));
    const int64_t fit = (int64_t)(kDequantChunkBytes / ((size_t)n_in * 2));
    const int64_t rows = std::max<int64_t>(align, fit / align * align);
    return std::max<int64_t>(1, std::min<int64_t>(n_out, rows));
}

// Y rows [0, rows) (ldy apart per token) = the 16-bit weight rows Wh (n_in each, ldw apart) times the T activation rows
// Xh of the same type.
static void gemm_16bit_rows(cublasHandle_t h, const void *Wh, int64_t ldw, cudaDataType dt, const void *Xh, int64_t n_in,
                            int64_t rows, int64_t T, float *Y, int64_t ldy) {
    const float one = 1.0f, zero = 0.0f;
    check_blas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)T, (int)n_in, &one, Wh, dt, (int)ldw, Xh, dt,
                            (int)n_in, &zero, Y, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "matmul (gemm)");
}

// The products of the 16-bit rows [base, base + rows) of W (at Wh, ldw elements apart) with Xh, each row into the
// output that holds it.
static void gemm_into_outs(cublasHandle_t h, const void *Wh, int64_t ldw, cudaDataType dt, int64_t base, int64_t rows,
                           const void *Xh, int64_t n_in, int64_t T, const std::vector<GemmOut> &outs) {
    for (const GemmOut &o : outs) {
        const int64_t lo = std::max(base, o.r0), hi = std::min(base + rows, o.r0 + o.rows);
        if (lo >= hi) continue;
        const void *w = (const uint8_t *)Wh + (size_t)(lo - base) * (size_t)ldw * 2;
        gemm_16bit_rows(h, w, ldw, dt, Xh, n_in, hi - lo, T, o.y + (lo - o.r0), o.ldy);
    }
}

// Column-major view for cuBLAS: Y^T [n_out x T] = W [n_in x n_out]^T * X^T [n_in x T], W's rows into the outputs
// that hold them. X is converted to 16 bits once for all of them; quantized rows are dequantized chunk by chunk, each
// chunk once whatever outputs it spans (q|k|v and gate|up of a prefill: one product each).
void launch_gemm(CudaDevice &dev, const Weight &W, const float *X, int64_t T, const std::vector<GemmOut> &outs) {
    cudaStream_t s = dev.stream();
    cublasHandle_t h = dev.blas();
    const int64_t n_in = W.n_in, n_out = W.n_out;
    if (W.type == DFL_TYPE_F32) {
        const float one = 1.0f, zero = 0.0f;
        for (const GemmOut &o : outs)
            check_blas(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)o.rows, (int)T, (int)n_in, &one,
                                   (const float *)W.row(o.r0), (int)(W.row_bytes / 4), X, (int)n_in, &zero, o.y,
                                   (int)o.ldy),
                       "matmul (sgemm)");
        return;
    }
    const bool bf16 = W.type == DFL_TYPE_BF16;
    const cudaDataType dt = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    const bool direct = W.type == DFL_TYPE_F16 || W.type == DFL_TYPE_BF16;
    const size_t x_bytes = round256((size_t)(T * n_in) * 2);
    const int64_t chunk = direct ? 0 : dequant_chunk_rows(n_in, n_out);
    uint8_t *scr = (uint8_t *)dev.scratch(x_bytes + (size_t)(chunk * n_in) * 2);
    void *Xh = scr;
    __half *Wh = (__half *)(scr + x_bytes);
    const int64_t nx = T * n_in;
    f32_to_16bit_kernel<<<grid_for(nx, 256), 256, 0, s>>>(X, nx, Xh, bf16);
    check_launch("matmul (convert X)");
    if (direct) {
        gemm_into_outs(h, W.data, (int64_t)(W.row_bytes / 2), dt, 0, n_out, Xh, n_in, T, outs);
        return;
    }
    for (int64_t r0 = 0; r0 < n_out; r0 += chunk) {
        const int64_t rows = std::min<int64_t>(chunk, n_out - r0);
        dequant_rows_f16(s, W, r0, rows, Wh);
        gemm_into_outs(h, Wh, n_in, CUDA_R_16F, r0, rows, Xh, n_in, T, outs);
    }
}

}  // namespace cuda
}  // namespace dfl

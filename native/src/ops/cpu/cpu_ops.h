// The CPU kernels behind the CPU device (cpu_device.cpp). Each has a float64 reference test in native/tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "common.h"
#include "ops/cpu/threadpool.h"
#include "ops/device.h"
#include "quant.h"
#include "rope.h"

namespace dfl {

// The k largest values of each of `rows` rows (larger first, lower id on ties, NaN as -inf, padded with id -1 /
// -inf) and each row's log-sum-exp (device.h: Device::topk). A row's result does not depend on the pool's size.
void topk_rows(ThreadPool &pool, const float *x, int64_t rows, int64_t n, int k, int32_t *ids, float *vals, float *lse);

// Free (available) and total bytes of system memory.
void host_memory(uint64_t *free_bytes, uint64_t *total_bytes);

// Per-thread scratch growable buffers, reused across calls.
struct Scratch {
    std::vector<std::vector<float>> per_thread;
    // The int8 activations of the current integer matmul (qgemm.h), shared by its threads.
    std::vector<int8_t> act_q;
    std::vector<float> act_d, act_sum;
    std::vector<int32_t> act_bias, act_bias16;
    explicit Scratch(int n = 1) : per_thread(n) {}
    float *get(int thread, size_t n) {
        auto &v = per_thread[thread];
        if (v.size() < n) v.resize(n);
        return v.data();
    }
};

// Y[t][o] = sum_i W[o][i] * X[t][i] for t < T. X rows have W.n_in elements, Y rows W.n_out. Quantized weights run on
// the integer kernels of qgemm.h (activations rounded to int8 per block of 32); the rest on float kernels.
void matmul(ThreadPool &pool, Scratch &scratch, const Weight &W, const float *X, int64_t T, float *Y);
// parts[i].second = X (T rows) times parts[i].first, for weights of the same n_in: one parallel region and one
// quantization of X where all take the integer tiles, else one matmul each.
using MatmulParts = std::vector<std::pair<const Weight *, float *>>;
void matmul_each(ThreadPool &pool, Scratch &scratch, const MatmulParts &parts, const float *X, int64_t T);

// out[0..n_in) = row `r` of W as f32 (embedding lookup).
void get_row(const Weight &W, int64_t r, float *out);

// sum of x[i]^2 in double, in a fixed order (sum_squares' comment): rms_scale's and l2norm's.
double sum_squares(const float *x, int64_t n);
// rsqrt(mean(x^2) + eps), the sum in double: rmsnorm's scale.
float rms_scale(const float *x, int64_t n, float eps);
// y = x * rsqrt(mean(x^2) + eps) * w (w may be null: no scale). y may alias x.
void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps);

// x = x * rsqrt(sum(x^2) + eps) (the Gated DeltaNet q/k normalisation).
void l2norm(float *x, int64_t n, float eps);

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// PyTorch softplus (beta 1, threshold 20).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// SwiGLU in place: g[i] = silu(g[i]) * u[i].
void swiglu(float *g, const float *u, int64_t n);
// out = silu(g) * u (out may be g or u).
void swiglu_to(float *out, const float *g, const float *u, int64_t n);

// The Gated DeltaNet output norm: x = rmsnorm(x) * w * silu(z) (weight without the +1, as in HF and GGUF).
void gated_rmsnorm(float *x, const float *z, const float *w, int64_t n, float eps);


// NeoX (rotate-half) RoPE on the first rope_dim values of one head: x[i] pairs with x[i + rope_dim/2].
void rope_neox(float *x, int rope_dim, int32_t pos, const float *inv_freq);
// The same in two steps, so the cos/sin of a position are computed once for all its heads: cs gets rope_dim floats.
void rope_cos_sin(int rope_dim, int32_t pos, const float *inv_freq, float *cs);
void rope_neox_with(float *x, int rope_dim, const float *cs);

// A paged KV cache of one attention layer seen through one sequence's block table.
struct PagedKV {
    uint32_t type_k = DFL_TYPE_F32, type_v = DFL_TYPE_F32;
    int n_kv = 0, head_dim = 0, block_size = 0;
    uint8_t *k = nullptr, *v = nullptr;
    uint64_t k_row = 0, v_row = 0;  // bytes of one (token, kv head) row
    const int32_t *blocks = nullptr;

    int64_t slot(int64_t pos) const { return (int64_t)blocks[pos / block_size] * block_size + pos % block_size; }
    uint8_t *k_at(int64_t pos, int h) const { return k_in(slot(pos), h); }
    uint8_t *v_at(int64_t pos, int h) const { return v_in(slot(pos), h); }
    // the rows of cache slot s (slot(pos)), for callers walking positions in order without a division each
    uint8_t *k_in(int64_t s, int h) const { return k + (uint64_t)(s * n_kv + h) * k_row; }
    uint8_t *v_in(int64_t s, int h) const { return v + (uint64_t)(s * n_kv + h) * v_row; }
};

constexpr int kAttnTile = 64;

// Which cache positions a new token sees (device.h attn_range): the default is causal, [0, n_past + i].
// n_new (the entry's token count) bounds a non-causal row.
struct AttnMask {
    bool causal = true;
    int window = 0;
    int64_t n_new = 0;
    const uint64_t *vis = nullptr;  // per new token: tree visibility of the entry's own positions (attn_visible), or null
};

// Attention of new tokens i in [i0, i1) of one sequence against its cache, for the query heads of KV heads [g0, g1)
// (each head's arithmetic as if it ran alone). Token i sits at cache position n_past + i and sees the positions
// attn_range gives for `mask`. q and out are [n_new][n_head][head_dim] with row strides q_stride / out_stride floats
// per token. Scratch must hold attention_scratch(..., g1 - g0) floats.
void attention(const PagedKV &kv, int g0, int g1, int n_head, const float *q, int64_t q_stride, float *out,
               int64_t out_stride, int64_t n_past, int64_t i0, int64_t i1, float scale, float *scratch,
               const AttnMask &mask = AttnMask());
size_t attention_scratch(int head_dim, int group, int64_t n_tok, int heads);

// Depthwise causal conv over C channels with kernel K (at most kConvMaxK, ops/device.h) followed by SiLU, rows
// [t0, t1) of out: row t is silu(sum over taps j of wt[j] * window row t + j), where the window's rows are head's K-1
// (the previous inputs) then x's (the new ones, rows xs apart). wt is [K][C], the file's [C][K] transposed (tap K-1 multiplies the
// current row). Every row's arithmetic is the same whatever t0, t1 and the row's place in x, so tokens give the same
// bits in any batch.
void conv1d_silu(const float *head, const float *x, int64_t xs, int64_t t0, int64_t t1, int64_t C, const float *wt, int K,
                 float *out);

// Gated delta rule for one value head over n tokens; S is the [dk][dv] state (in/out). q (already normalised and
// scaled), k (normalised): [n][dk]; v: [n][dv]; g: log-decay per token; beta: write strength per token. out: [n][dv].
void gdn_recurrent(float *S, int dk, int dv, const float *q, const float *k, const float *v, const float *g,
                   const float *beta, int64_t n, float *out);

// The same result computed chunk-wise (chunk 64, as HF's torch_chunk_gated_delta_rule). scratch: gdn_chunk_scratch().
void gdn_chunked(float *S, int dk, int dv, const float *q, const float *k, const float *v, const float *g,
                 const float *beta, int64_t n, float *out, float *scratch);
size_t gdn_chunk_scratch(int dk, int dv);
constexpr int kGdnChunk = 64;

}  // namespace dfl

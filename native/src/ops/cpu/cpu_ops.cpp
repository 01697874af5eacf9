#include "ops/cpu/cpu_ops.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "ops/cpu/qgemm.h"
#include "ops/cpu/vec16.h"

namespace dfl {

void get_row(const Weight &W, int64_t r, float *out) { dequant_row(W.type, W.row(r), out, W.n_in); }

// Rows of W are split into tasks of rb rows. Few tokens: each dot dequantizes on the fly (the weights stream once).
// More tokens: a task dequantizes its rows once and reuses them for every token, in token blocks of kTokBlock so the
// activations stay in cache. Both paths give bitwise the same result (see dot_row).
static constexpr int64_t kTokBlock = 30;  // a multiple of dot4x6_f32's 6 tokens
static constexpr int64_t kFusedMaxTokens = 3;

// The activations X (T rows of n_in) quantized into scratch for the integer tiles.
static QuantizedActs quantize_acts(ThreadPool &pool, Scratch &scratch, const float *X, int64_t T, int64_t n_in) {
    const int64_t nb = n_in / kActBlock;
    scratch.act_q.resize((size_t)(T * n_in));
    scratch.act_d.resize((size_t)(T * nb));
    scratch.act_sum.resize((size_t)(T * nb));
    QuantizedActs A;
    A.q = scratch.act_q.data();
    A.d = scratch.act_d.data();
    A.dsum = scratch.act_sum.data();
    A.n_in = n_in;
    const bool pairs = int8_wants_pair_layout();
    if (pairs) {
        scratch.act_bias.resize((size_t)(T * nb));
        scratch.act_bias16.resize((size_t)(T * nb * 2));
        A.bias = scratch.act_bias.data();
        A.bias16 = scratch.act_bias16.data();
    }
    const int64_t qchunk = 8;
    auto quantize = [&](int64_t task, int) {
        for (int64_t t = task * qchunk; t < std::min(T, (task + 1) * qchunk); t++) {
            int8_t *q = scratch.act_q.data() + t * n_in;
            float *d = scratch.act_d.data() + t * nb;
            quantize_act_row(X + t * n_in, n_in, q, d, scratch.act_sum.data() + t * nb);
            if (pairs)
                expand_act_row(q, n_in, scratch.act_bias.data() + t * nb, scratch.act_bias16.data() + t * nb * 2);
        }
    };
    if (T <= qchunk) {
        quantize(0, 0);
    } else {
        pool.parallel_for(ceil_div(T, qchunk), quantize);
    }
    return A;
}

// Products of one input with several weights (q, k and v; gate and up), all on the integer path, in one parallel
// region: each output is split into tasks of rb rows x tb tokens. Few tokens split over rows only (the weights stream
// once); many split over rows and token blocks, so every thread has work and a task's weights (rb rows) and
// activations (tb rows) stay in L2 while its tiles reuse each weight block for several tokens. One region for the
// parts, not one each: a decode step's regions cost more than their work at 16 threads on a 0.6B model.
static void matmul_int8(ThreadPool &pool, Scratch &scratch, const MatmulParts &parts, const float *X, int64_t T) {
    const QuantizedActs A = quantize_acts(pool, scratch, X, T, parts[0].first->n_in);
    int64_t rows = 0;
    for (const auto &p : parts) rows += p.first->n_out;
    const int64_t threads = pool.size();
    // token blocks of the kernel set's choice (int8_token_block); DFLASH_CPU_TOK_BLOCK=N (a multiple of 16) sets
    // them, for measuring
    static const int64_t tok_block_env = [] {
        const char *e = std::getenv("DFLASH_CPU_TOK_BLOCK");
        const int64_t n = e ? std::atoll(e) : 0;
        return n >= 16 && n % 16 == 0 ? n : int64_t(0);
    }();
    const int64_t tb = T <= 8 ? T : tok_block_env ? tok_block_env : int8_token_block();
    const int64_t n_tb = ceil_div(T, tb);
    // Enough row tasks that every thread gets ~4 tasks in all (load balance; DFLASH_CPU_TASKS=N: N, for measuring
    // what the claims cost at 16 threads), each a multiple of 16 rows (the AVX-512 tiles' row group; packed groups
    // start at multiples of 16), at most 64 rows so a task's weights stay in L2.
    static const int64_t per_thread = [] {
        const char *e = std::getenv("DFLASH_CPU_TASKS");
        return e && std::atoi(e) > 0 ? (int64_t)std::atoi(e) : int64_t(4);
    }();
    const int64_t want_row_tasks = std::max<int64_t>(1, ceil_div(threads * per_thread, n_tb));
    const int64_t rb = std::min<int64_t>(64, std::max<int64_t>(16, ceil_div(ceil_div(rows, want_row_tasks), 16) * 16));
    std::vector<int64_t> first_task(parts.size() + 1, 0);  // part i's tasks are [first_task[i], first_task[i + 1])
    for (size_t i = 0; i < parts.size(); i++) first_task[i + 1] = first_task[i] + ceil_div(parts[i].first->n_out, rb) * n_tb;
    pool.parallel_for(first_task.back(), [&](int64_t task, int) {
        size_t i = 0;
        while (task >= first_task[i + 1]) i++;
        const Weight &W = *parts[i].first;
        const int64_t k = task - first_task[i], r0 = (k / n_tb) * rb, t0 = (k % n_tb) * tb;
        int8_gemm_block(W, A, r0, std::min(W.n_out, r0 + rb), t0, std::min(T, t0 + tb), parts[i].second);
    });
}

void matmul_each(ThreadPool &pool, Scratch &scratch, const MatmulParts &parts, const float *X, int64_t T) {
    bool joint = T > 0 && !parts.empty();
    for (const auto &p : parts)
        joint = joint && int8_matmul_applies(*p.first) && p.first->n_out > 0 && p.first->n_in == parts[0].first->n_in;
    if (!joint) {
        for (const auto &p : parts) matmul(pool, scratch, *p.first, X, T, p.second);
        return;
    }
    matmul_int8(pool, scratch, parts, X, T);
}

void matmul(ThreadPool &pool, Scratch &scratch, const Weight &W, const float *X, int64_t T, float *Y) {
    const int64_t n_in = W.n_in, n_out = W.n_out;
    if (T <= 0 || n_out <= 0) return;
    if (int8_matmul_applies(W)) return matmul_int8(pool, scratch, {{&W, Y}}, X, T);
    const int64_t per_thread = ceil_div(n_out, (int64_t)pool.size() * 4);
    const int64_t rb = std::min<int64_t>(64, std::max<int64_t>(4, ceil_div(per_thread, 4) * 4));
    const int64_t n_tasks = ceil_div(n_out, rb);
    const bool direct = W.type == DFL_TYPE_F32;
    if (!direct && T <= kFusedMaxTokens) {
        pool.parallel_for(n_tasks, [&](int64_t task, int) {
            const int64_t r0 = task * rb, r1 = std::min(n_out, r0 + rb);
            for (int64_t r = r0; r < r1; r++) {
                const uint8_t *row = W.row(r);
                for (int64_t t = 0; t < T; t++) Y[t * n_out + r] = dot_row(W.type, row, X + t * n_in, n_in);
            }
        });
        return;
    }
    pool.parallel_for(n_tasks, [&](int64_t task, int th) {
        const int64_t r0 = task * rb, r1 = std::min(n_out, r0 + rb);
        const float *rows;
        if (direct) {
            rows = (const float *)W.row(r0);
        } else {
            float *buf = scratch.get(th, (size_t)(r1 - r0) * n_in);
            for (int64_t r = r0; r < r1; r++) dequant_row(W.type, W.row(r), buf + (r - r0) * n_in, n_in);
            rows = buf;
        }
        float tmp[24];
        const bool blocked = dot_blocked_f32_ok();
        for (int64_t t0 = 0; t0 < T; t0 += kTokBlock) {
            const int64_t t1 = std::min(T, t0 + kTokBlock);
            int64_t r = r0;
            for (; r + 4 <= r1; r += 4) {
                const float *w4 = rows + (r - r0) * n_in;
                int64_t t = t0;
                for (; blocked && t + 6 <= t1; t += 6) {
                    dot4x6_f32(w4, n_in, X + t * n_in, n_in, tmp);
                    for (int c = 0; c < 6; c++)
                        for (int k = 0; k < 4; k++) Y[(t + c) * n_out + r + k] = tmp[c * 4 + k];
                }
                for (; t < t1; t++) {
                    dot4_f32(w4, X + t * n_in, n_in, tmp);
                    float *y = Y + t * n_out + r;
                    y[0] = tmp[0];
                    y[1] = tmp[1];
                    y[2] = tmp[2];
                    y[3] = tmp[3];
                }
            }
            for (; r < r1; r++) {
                const float *w = rows + (r - r0) * n_in;
                for (int64_t t = t0; t < t1; t++) Y[t * n_out + r] = dot_f32(w, X + t * n_in, n_in);
            }
        }
    });
}

// Eight interleaved chains (lane l sums the i = l mod 8), then the lanes in a fixed order: as one chain, each add
// waited for the last (a 1,024-wide row ~4,000 cycles), and a one-token step's norms run on the caller alone while
// the other threads wait. The squares are exact in double; only the order of the adds differs from a plain loop.
DFL_MULTIVERSION double sum_squares(const float *x, int64_t n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)x[i + l] * (double)x[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += (double)x[i] * (double)x[i];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

float rms_scale(const float *x, int64_t n, float eps) {
    return (float)(1.0 / std::sqrt(sum_squares(x, n) / (double)n + (double)eps));
}

void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    const float r = rms_scale(x, n, eps);
    if (w) {
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
    } else {
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * r;
    }
}

void l2norm(float *x, int64_t n, float eps) {
    const double ss = sum_squares(x, n);
    const float r = (float)(1.0 / std::sqrt(ss + (double)eps));
    for (int64_t i = 0; i < n; i++) x[i] *= r;
}

void rope_neox(float *x, int rope_dim, int32_t pos, const float *inv_freq) {
    const int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        const float ang = (float)pos * inv_freq[i];
        const float c = (float)std::cos((double)ang), s = (float)std::sin((double)ang);
        const float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c - x1 * s;
        x[i + half] = x1 * c + x0 * s;
    }
}

void rope_cos_sin(int rope_dim, int32_t pos, const float *inv_freq, float *cs) {
    const int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        const float ang = (float)pos * inv_freq[i];
        cs[i] = (float)std::cos((double)ang);
        cs[half + i] = (float)std::sin((double)ang);
    }
}

void rope_neox_with(float *x, int rope_dim, const float *cs) {
    const int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        const float c = cs[i], s = cs[half + i];
        const float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c - x1 * s;
        x[i + half] = x1 * c + x0 * s;
    }
}

DFL_MULTIVERSION static void axpy(float a, const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

// silu(g) for 16 lanes: e = exp(-|g|) keeps the exp's argument <= 0, so silu(g) = g / (1 + e) for g >= 0 and
// g e / (1 + e) below; within a few ulp of the scalar silu. One expf call an element had made swiglu ~6 % of a prefill.
DFL_VEC_INLINE v16f silu16(v16f g) {
    const v16f e = exp16_nonpos(g < 0 ? g : -g);
    return (g < 0 ? g * e : g) / (e + 1.0f);
}

DFL_VEC_INLINE v16f swiglu16(v16f g, v16f u) { return silu16(g) * u; }

// out = silu(g) * u (out may be g or u).
DFL_WIDE_MULTIVERSION static void swiglu_wide(float *out, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const v16f y = swiglu16(load16f(g + i), load16f(u + i));
        std::memcpy(out + i, &y, sizeof y);
    }
    if (i < n) {
        float tg[16] = {}, tu[16] = {};
        std::memcpy(tg, g + i, (size_t)(n - i) * sizeof(float));
        std::memcpy(tu, u + i, (size_t)(n - i) * sizeof(float));
        const v16f y = swiglu16(load16f(tg), load16f(tu));
        std::memcpy(out + i, &y, (size_t)(n - i) * sizeof(float));
    }
}

void swiglu(float *g, const float *u, int64_t n) { swiglu_wide(g, g, u, n); }
void swiglu_to(float *out, const float *g, const float *u, int64_t n) { swiglu_wide(out, g, u, n); }

void gated_rmsnorm(float *x, const float *z, const float *w, int64_t n, float eps) {
    rmsnorm(x, w, x, n, eps);
    swiglu_wide(x, z, x, n);  // x * silu(z), 16 lanes (a scalar expf an element was ~4 % of a Qwen3.5 prefill)
}

// 16 channels of one output row: the taps in order (a multiply, then an add, as the scalar form), then silu16.
DFL_VEC_INLINE v16f conv_taps16(const float *const *rows, const float *wt, int64_t C, int K, int64_t c) {
    v16f acc = {};
    for (int j = 0; j < K; j++) acc += load16f(wt + j * C + c) * load16f(rows[j] + c);
    return silu16(acc);
}

DFL_WIDE_MULTIVERSION void conv1d_silu(const float *head, const float *x, int64_t xs, int64_t t0, int64_t t1, int64_t C,
                                       const float *wt, int K, float *out) {
    const float *rows[kConvMaxK];
    for (int64_t t = t0; t < t1; t++) {
        for (int j = 0; j < K; j++) {
            const int64_t r = t + j;  // window row: the state's rows, then x's
            rows[j] = r < K - 1 ? head + r * C : x + (r - (K - 1)) * xs;
        }
        float *o = out + t * C;
        int64_t c = 0;
        for (; c + 16 <= C; c += 16) {
            const v16f y = conv_taps16(rows, wt, C, K, c);
            std::memcpy(o + c, &y, sizeof y);
        }
        if (c < C) {  // the last channels through the same lanes, from copies padded to 16
            float tr[kConvMaxK][16] = {}, tw[kConvMaxK][16] = {};
            const float *trp[kConvMaxK];
            for (int j = 0; j < K; j++) {
                std::memcpy(tr[j], rows[j] + c, (size_t)(C - c) * sizeof(float));
                std::memcpy(tw[j], wt + j * C + c, (size_t)(C - c) * sizeof(float));
                trp[j] = tr[j];
            }
            const v16f y = conv_taps16(trp, tw[0], 16, K, 0);  // (tw's rows are 16 apart)
            std::memcpy(o + c, &y, (size_t)(C - c) * sizeof(float));
        }
    }
}

// One token of the delta rule on a head of NV * 16 columns, the arithmetic of gdn_recurrent's row loops (each product
// then its add, the rows in order) with u, delta and the output held in registers: two passes over S, where the
// scale, axpy and output loops made four and reloaded u or o at every row.
template <int NV>
DFL_VEC_INLINE void gdn_token16(float *S, int dk, const float *q, const float *k, const float *v, float decay, float beta,
                                float *o) {
    v16f u[NV] = {};
    const v16f dec = v16f{} + decay;
    for (int a = 0; a < dk; a++) {
        float *row = S + (size_t)a * NV * 16;
        const v16f ka = v16f{} + k[a];
        for (int x = 0; x < NV; x++) {
            const v16f r = load16f(row + 16 * x) * dec;
            std::memcpy(row + 16 * x, &r, sizeof r);
            u[x] += ka * r;
        }
    }
    for (int x = 0; x < NV; x++) u[x] = (load16f(v + 16 * x) - u[x]) * beta;  // delta
    v16f acc[NV] = {};
    for (int a = 0; a < dk; a++) {
        float *row = S + (size_t)a * NV * 16;
        const v16f ka = v16f{} + k[a], qa = v16f{} + q[a];
        for (int x = 0; x < NV; x++) {
            const v16f r = load16f(row + 16 * x) + ka * u[x];
            std::memcpy(row + 16 * x, &r, sizeof r);
            acc[x] += qa * r;
        }
    }
    std::memcpy(o, acc, sizeof acc);
}

template <int NV>
DFL_WIDE_MULTIVERSION static void gdn_tokens16(float *S, int dk, const float *q, const float *k, const float *v,
                                               const float *g, const float *beta, int64_t n, float *out) {
    const int dv = NV * 16;
    for (int64_t t = 0; t < n; t++)
        gdn_token16<NV>(S, dk, q + t * dk, k + t * dk, v + t * dv, std::exp(g[t]), beta[t], out + t * dv);
}

void gdn_recurrent(float *S, int dk, int dv, const float *q, const float *k, const float *v, const float *g,
                   const float *beta, int64_t n, float *out) {
    switch (dv) {
    case 128: return gdn_tokens16<8>(S, dk, q, k, v, g, beta, n, out);
    case 64: return gdn_tokens16<4>(S, dk, q, k, v, g, beta, n, out);
    case 32: return gdn_tokens16<2>(S, dk, q, k, v, g, beta, n, out);
    case 16: return gdn_tokens16<1>(S, dk, q, k, v, g, beta, n, out);
    default: break;
    }
    std::vector<float> u((size_t)dv);
    for (int64_t t = 0; t < n; t++) {
        const float decay = std::exp(g[t]);
        const float *kt = k + t * dk, *qt = q + t * dk, *vt = v + t * dv;
        std::fill(u.begin(), u.end(), 0.0f);
        for (int a = 0; a < dk; a++) {
            float *row = S + (size_t)a * dv;
            scale_vec(decay, row, dv);
            axpy(kt[a], row, u.data(), dv);
        }
        for (int b = 0; b < dv; b++) u[(size_t)b] = beta[t] * (vt[b] - u[(size_t)b]);  // delta
        float *o = out + t * dv;
        std::fill(o, o + dv, 0.0f);
        for (int a = 0; a < dk; a++) {
            float *row = S + (size_t)a * dv;
            axpy(kt[a], u.data(), row, dv);
            axpy(qt[a], row, o, dv);
        }
    }
}

size_t gdn_chunk_scratch(int dk, int dv) {
    const size_t C = kGdnChunk;
    // G, A, U, W, Q S (C x dv), the masked Q K^T, K^T (dk x C) and K K^T
    return C + C * C + C * (size_t)dv + C * (size_t)dk + C * (size_t)dv + C * C + (size_t)dk * C + C * C;
}

// Cm[m][n] = alpha * sum_k A[m][k] B[k][n] (+ Cm[m][n] where acc): four rows of A and 16 NV columns of B held in
// registers over the whole k loop (the axpy form read and wrote a row of the output for every k, and was bound by those
// loads and stores).
template <int NV>
DFL_VEC_INLINE void gemm_block(const float *A, int64_t lda, const float *B, int64_t ldb, float *Cm, int64_t ldc,
                               int64_t m0, int mr, int64_t n0, int64_t K, float alpha, bool acc) {
    v16f c[4][NV] = {};
    for (int64_t k = 0; k < K; k++) {
        v16f b[NV];
        for (int v = 0; v < NV; v++) b[v] = load16f(B + k * ldb + n0 + 16 * v);
        for (int r = 0; r < 4; r++) {
            const v16f a = v16f{} + (r < mr ? A[(m0 + r) * lda + k] : 0.0f);
            for (int v = 0; v < NV; v++) c[r][v] = fma16(a, b[v], c[r][v]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < NV; v++) {
            float *o = Cm + (m0 + r) * ldc + n0 + 16 * v;
            v16f y = c[r][v] * alpha;
            if (acc) y += load16f(o);
            std::memcpy(o, &y, sizeof y);
        }
}

// Any N: blocks of 32 and 16 columns, then the last columns one at a time with the same fused steps.
DFL_WIDE_MULTIVERSION static void gemm_f32(const float *A, int64_t lda, const float *B, int64_t ldb, float *Cm,
                                           int64_t ldc, int64_t M, int64_t N, int64_t K, float alpha, bool acc) {
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const int mr = (int)std::min<int64_t>(4, M - m0);
        int64_t n0 = 0;
        for (; n0 + 32 <= N; n0 += 32) gemm_block<2>(A, lda, B, ldb, Cm, ldc, m0, mr, n0, K, alpha, acc);
        for (; n0 + 16 <= N; n0 += 16) gemm_block<1>(A, lda, B, ldb, Cm, ldc, m0, mr, n0, K, alpha, acc);
        for (int r = 0; r < mr; r++)
            for (int64_t col = n0; col < N; col++) {
                float c = 0.0f;
                for (int64_t k = 0; k < K; k++) c = __builtin_fmaf(A[(m0 + r) * lda + k], B[k * ldb + col], c);
                float &o = Cm[(m0 + r) * ldc + col];
                o = acc ? c * alpha + o : c * alpha;
            }
    }
}

void gdn_chunked(float *S, int dk, int dv, const float *q, const float *k, const float *v, const float *g,
                 const float *beta, int64_t n, float *out, float *scratch) {
    const int64_t C = kGdnChunk;
    float *G = scratch;       // [C] cumulative log-decay
    float *A = G + C;         // [C][C] strictly lower: beta_i (k_i . k_j) exp(G_i - G_j)
    float *U = A + C * C;     // [C][dv] becomes V_new
    float *W = U + C * dv;    // [C][dk]
    float *QS = W + C * dk;   // [C][dv]: Q S of the state before the chunk
    float *M = QS + C * dv;   // [C][C]: (q_i . k_j) exp(G_i - G_j) for j <= i, else 0
    float *Kt = M + C * C;    // [dk][C]: k_j transposed, columns past the chunk zero
    float *KK = Kt + dk * C;  // [C][C]: k_i . k_j
    // The products are register-blocked GEMMs (gemm_f32); K K^T and Q K^T run on K transposed, 64 columns wide.
    for (int64_t c0 = 0; c0 < n; c0 += C) {
        const int64_t L = std::min(C, n - c0);
        const float *qc = q + c0 * dk, *kc = k + c0 * dk, *vc = v + c0 * dv;
        const float *gc = g + c0, *bc = beta + c0;
        float acc = 0;
        for (int64_t i = 0; i < L; i++) {
            acc += gc[i];
            G[i] = acc;
        }
        std::fill(Kt, Kt + dk * C, 0.0f);
        for (int64_t j = 0; j < L; j++)
            for (int a = 0; a < dk; a++) Kt[a * C + j] = kc[j * dk + a];
        gemm_f32(kc, dk, Kt, C, KK, C, L, C, dk, 1.0f, false);
        gemm_f32(qc, dk, Kt, C, M, C, L, C, dk, 1.0f, false);
        // the decays exp(G_i - G_j), made once for both
        for (int64_t i = 0; i < L; i++) {
            for (int64_t j = 0; j <= i; j++) {
                const float e = std::exp(G[i] - G[j]);
                if (j < i) A[i * C + j] = bc[i] * KK[i * C + j] * e;
                M[i * C + j] *= e;
            }
            for (int64_t j = i + 1; j < C; j++) M[i * C + j] = 0.0f;
        }
        // forward substitution: (I + A) U = beta V, (I + A) W = beta exp(G) K
        for (int64_t i = 0; i < L; i++) {
            float *ui = U + i * dv, *wi = W + i * dk;
            for (int b = 0; b < dv; b++) ui[b] = bc[i] * vc[i * dv + b];
            const float eg = bc[i] * std::exp(G[i]);
            for (int a = 0; a < dk; a++) wi[a] = eg * kc[i * dk + a];
            for (int64_t j = 0; j < i; j++) {
                axpy(-A[i * C + j], U + j * dv, ui, dv);
                axpy(-A[i * C + j], W + j * dk, wi, dk);
            }
        }
        // V_new = U - W S and Q S, both of the state before the chunk
        gemm_f32(W, dk, S, dv, U, dv, L, dv, dk, -1.0f, true);
        gemm_f32(qc, dk, S, dv, QS, dv, L, dv, dk, 1.0f, false);
        // O = exp(G) (Q S) + M V_new
        for (int64_t i = 0; i < L; i++) {
            const float eg = std::exp(G[i]);
            const float *qs = QS + i * dv;
            float *o = out + (c0 + i) * dv;
            for (int b = 0; b < dv; b++) o[b] = eg * qs[b];
        }
        gemm_f32(M, C, U, dv, out + c0 * dv, dv, L, dv, L, 1.0f, true);
        // S = exp(G_last) S + sum_j k_j (exp(G_last - G_j) V_new_j)^T (V_new is not read again)
        const float gl = G[L - 1], el = std::exp(gl);
        for (int64_t j = 0; j < L; j++) scale_vec(std::exp(gl - G[j]), U + j * dv, dv);
        for (int a = 0; a < dk; a++) scale_vec(el, S + (size_t)a * dv, dv);
        gemm_f32(Kt, C, U, dv, S, dv, dk, dv, L, 1.0f, true);
    }
}

}  // namespace dfl

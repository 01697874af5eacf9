#include "ops/cpu/cpu_ops.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "ops/cpu/qgemm.h"

namespace dfl {

void get_row(const Weight &W, int64_t r, float *out) { dequant_row(W.type, W.row(r), out, W.n_in); }

// Rows of W are split into tasks of rb rows. Few tokens: each dot dequantizes on the fly (the weights stream once).
// More tokens: a task dequantizes its rows once and reuses them for every token, in token blocks of kTokBlock so the
// activations stay in cache. Both paths give bitwise the same result (see dot_row).
static constexpr int64_t kTokBlock = 30;  // a multiple of dot4x6_f32's 6 tokens
static constexpr int64_t kFusedMaxTokens = 3;

// Integer path: the tokens of a task when there are many (matmul_int8). The activations are quantized once, and a row
// is quantized the same whichever batch it is in.
static constexpr int64_t kInt8TokBlock = 64;

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
    const int64_t tb = T <= 8 ? T : kInt8TokBlock;
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

void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float r = (float)(1.0 / std::sqrt(ss / (double)n + (double)eps));
    if (w) {
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
    } else {
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * r;
    }
}

void l2norm(float *x, int64_t n, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float r = (float)(1.0 / std::sqrt(ss + (double)eps));
    for (int64_t i = 0; i < n; i++) x[i] *= r;
}

void gated_rmsnorm(float *x, const float *z, const float *w, int64_t n, float eps) {
    rmsnorm(x, w, x, n, eps);
    for (int64_t i = 0; i < n; i++) x[i] *= silu(z[i]);
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

size_t attention_scratch(int head_dim, int group, int64_t n_tok) {
    // K, V, K transposed, then per query row: the tile's scores (plus kQueryGroup rows of padding), acc, m, l
    return (size_t)(3 * kAttnTile * head_dim) + (size_t)(n_tok * group + 8 /* kQueryGroup */) * kAttnTile +
           (size_t)n_tok * group * (head_dim + 2);
}

DFL_MULTIVERSION static void axpy(float a, const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

// Wide kernels for attention: the same element-wise float operations in the same order on any target, so the
// AVX-512 clone (16 lanes a register, twice the work per instruction of the AVX2 one) gives bitwise the same results.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DFL_WIDE_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DFL_WIDE_MULTIVERSION
#endif

typedef float v16f __attribute__((vector_size(64)));

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

// a[d] = fma(s[j], V[j][d], a[d]) for j in order: each 128-float slice of a (a head of 128: all of it) stays in
// registers across the rows, eight independent chains, so two FMA ports stay busy through the FMA's latency.
template <int kVecs>
DFL_VEC_INLINE void accumulate_slice(const float *s, const float *V, int64_t cnt, int hd, float *a) {
    v16f acc[kVecs];
#pragma GCC unroll 8
    for (int k = 0; k < kVecs; k++) acc[k] = load16f(a + 16 * k);
    for (int64_t j = 0; j < cnt; j++) {
        const float *v = V + j * hd;
        const v16f w = v16f{} + s[j];
#pragma GCC unroll 8
        for (int k = 0; k < kVecs; k++) acc[k] = fma16(w, load16f(v + 16 * k), acc[k]);
    }
#pragma GCC unroll 8
    for (int k = 0; k < kVecs; k++) std::memcpy(a + 16 * k, &acc[k], 64);
}

DFL_WIDE_MULTIVERSION static void accumulate_rows(const float *s, const float *V, int64_t cnt, int hd, float *a) {
    int d = 0;
    for (; d + 128 <= hd; d += 128) accumulate_slice<8>(s, V + d, cnt, hd, a + d);
    for (; d + 64 <= hd; d += 64) accumulate_slice<4>(s, V + d, cnt, hd, a + d);
    for (; d < hd; d++)
        for (int64_t j = 0; j < cnt; j++) a[d] = __builtin_fmaf(s[j], V[j * hd + d], a[d]);
}

typedef int32_t v16i __attribute__((vector_size(64)));

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

// silu(g) * u for 16 lanes: e = exp(-|g|) keeps the exp's argument <= 0, so silu(g) = g / (1 + e) for g >= 0 and
// g e / (1 + e) below; within a few ulp of the scalar silu. One expf call an element had made swiglu ~6 % of a prefill.
DFL_VEC_INLINE v16f swiglu16(v16f g, v16f u) {
    const v16f e = exp16_nonpos(g < 0 ? g : -g);
    return (g < 0 ? g * e : g) / (e + 1.0f) * u;
}

DFL_WIDE_MULTIVERSION static void swiglu_wide(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const v16f y = swiglu16(load16f(g + i), load16f(u + i));
        std::memcpy(g + i, &y, sizeof y);
    }
    if (i < n) {
        float tg[16] = {}, tu[16] = {};
        std::memcpy(tg, g + i, (size_t)(n - i) * sizeof(float));
        std::memcpy(tu, u + i, (size_t)(n - i) * sizeof(float));
        const v16f y = swiglu16(load16f(tg), load16f(tu));
        std::memcpy(g + i, &y, (size_t)(n - i) * sizeof(float));
    }
}

void swiglu(float *g, const float *u, int64_t n) { swiglu_wide(g, u, n); }

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

// One query row's scores of a tile, s[j] for j in [b0, b1) (b0, b1 multiples of 16 within the tile, covering the
// row's own range [j0, j1)): scaled inside [j0, j1), -inf outside; returns their max.
DFL_WIDE_MULTIVERSION static float scale_scores(float *s, int64_t b0, int64_t b1, int64_t j0, int64_t j1, float scale) {
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int64_t j = b0; j < b1; j += 16) {
        const v16f v = load16f(s + j) * scale;
        std::memcpy(s + j, &v, sizeof v);
    }
    // the few positions outside the row's range one at a time: GCC 12 turned a lane-position range test into 32
    // scalar compares a vector
    for (int64_t j = b0; j < j0; j++) s[j] = ninf;
    for (int64_t j = j1; j < b1; j++) s[j] = ninf;
    v16f mx = v16f{} + ninf;
    for (int64_t j = b0; j < b1; j += 16) {
        const v16f y = load16f(s + j);
        mx = y > mx ? y : mx;
    }
    return max_lane(mx);
}

// s[j] = exp(s[j] - mx) for j in [b0, b1) (multiples of 16; s[j] - mx <= 0 or -inf, whose exp is +0).
DFL_WIDE_MULTIVERSION static void exp_sub(float *s, int64_t b0, int64_t b1, float mx) {
    for (int64_t j = b0; j < b1; j += 16) {
        const v16f e = exp16_nonpos(load16f(s + j) - mx);
        std::memcpy(s + j, &e, sizeof e);
    }
}

// A query row that sees some of an attention tile: its scores (softmax numerators once exp_sub ran), its index, its
// part of the tile [j0, j1), its rescale of what it summed before, and the sum of its numerators.
struct LiveRow {
    float *s;
    size_t idx;
    int64_t j0, j1;
    float corr, sum;
};

// rows[r].sum = s[b0] + s[b0 + 1] + ... + s[b1 - 1] of each row, in order of j, one term at a time: a tree verify's
// row sees its ancestors with its masked siblings' exact zeros between them, and the same token decoded sees them
// side by side, so only a sum in order, where adding an exact +0 changes nothing, gives both the same bits (16 lanes
// of partial sums did not: TestDemoPairSpeculative's tree of 22 lost greedy equality). Several rows at once, so their
// dependent adds overlap; the zeros outside a row's own range change nothing either.
static void row_sums(LiveRow *rows, int nr, int64_t b0, int64_t b1) {
    constexpr int kRows = 8;
    for (int r0 = 0; r0 < nr; r0 += kRows) {
        const int n = std::min(kRows, nr - r0);
        float acc[kRows] = {};
        for (int64_t j = b0; j < b1; j++)
#pragma GCC unroll 8
            for (int r = 0; r < kRows; r++)
                if (r < n) acc[r] += rows[r0 + r].s[j];
        for (int r = 0; r < n; r++) rows[r0 + r].sum = acc[r];
    }
}

// Attention's scores, q . key: 16 partial sums (element i goes to partial i % 16, fused multiply-adds in order of i
// from +0), then the fixed reduction t_l = p_l + p_{l+8}, ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)), then any
// elements past the last 16 fused in order. Two kernels give these same bits: score_keys_rows (a prompt's rows, 8
// query rows x 16 keys a call over the tile transposed, so each K register feeds 8 rows) and score_keys (a few rows,
// a decode step's, one key at a time), so a key's score does not depend on which kernel or which other rows scored it.
static constexpr int kQueryGroup = 8;

DFL_VEC_INLINE float reduce_partials(v16f p) {
    const float t0 = p[0] + p[8], t1 = p[1] + p[9], t2 = p[2] + p[10], t3 = p[3] + p[11];
    const float t4 = p[4] + p[12], t5 = p[5] + p[13], t6 = p[6] + p[14], t7 = p[7] + p[15];
    return ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7));
}

// out[c] = score(q, key c) for n keys of K (rows of hd).
DFL_WIDE_MULTIVERSION static void score_keys(const float *K, const float *q, int hd, int64_t n, float *out) {
    const int hd16 = hd / 16 * 16;
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
        const float *k0 = K + c * hd, *k1 = k0 + hd, *k2 = k1 + hd, *k3 = k2 + hd;
        v16f a0{}, a1{}, a2{}, a3{};
        for (int i = 0; i < hd16; i += 16) {
            const v16f x = load16f(q + i);
            a0 = fma16(x, load16f(k0 + i), a0);
            a1 = fma16(x, load16f(k1 + i), a1);
            a2 = fma16(x, load16f(k2 + i), a2);
            a3 = fma16(x, load16f(k3 + i), a3);
        }
        float r0 = reduce_partials(a0), r1 = reduce_partials(a1), r2 = reduce_partials(a2), r3 = reduce_partials(a3);
        for (int i = hd16; i < hd; i++) {
            r0 = __builtin_fmaf(q[i], k0[i], r0);
            r1 = __builtin_fmaf(q[i], k1[i], r1);
            r2 = __builtin_fmaf(q[i], k2[i], r2);
            r3 = __builtin_fmaf(q[i], k3[i], r3);
        }
        out[c] = r0, out[c + 1] = r1, out[c + 2] = r2, out[c + 3] = r3;
    }
    for (; c < n; c++) {
        const float *k = K + c * hd;
        v16f a{};
        for (int i = 0; i < hd16; i += 16) a = fma16(load16f(q + i), load16f(k + i), a);
        float r = reduce_partials(a);
        for (int i = hd16; i < hd; i++) r = __builtin_fmaf(q[i], k[i], r);
        out[c] = r;
    }
}

// S[r * ld_s + c] = score(qs[r], key c) for 16 keys c and kQueryGroup rows r. KT holds the keys transposed (KT[i * ld
// + c] = element i of key c), so partial l of all 16 keys is one register, and the reduction runs lane-wise: a score
// costs 1/16 of a register operation per element instead of a horizontal sum per key. hd % 16 == 0.
DFL_WIDE_MULTIVERSION static void score_keys_rows(const float *const *qs, const float *KT, int64_t ld, int hd,
                                                  float *S, int64_t ld_s) {
    v16f p[16][kQueryGroup];
    for (int l = 0; l < 16; l++) {
        v16f a[kQueryGroup];
#pragma GCC unroll 8
        for (int r = 0; r < kQueryGroup; r++) a[r] = v16f{};
        for (int i = 0; i < hd; i += 16) {
            const v16f k = load16f(KT + (int64_t)(i + l) * ld);
#pragma GCC unroll 8
            for (int r = 0; r < kQueryGroup; r++) a[r] = fma16(v16f{} + qs[r][i + l], k, a[r]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < kQueryGroup; r++) p[l][r] = a[r];
    }
    for (int r = 0; r < kQueryGroup; r++) {
        v16f t[8];
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) t[l] = p[l][r] + p[l + 8][r];
        const v16f v = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
        std::memcpy(S + r * ld_s, &v, 64);
    }
}

DFL_MULTIVERSION static void scale_vec(float a, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] *= a;
}

static void prefetch_kv_row(const PagedKV &kv, int64_t pos, int kvh) {
    prefetch_bytes(kv.k_at(pos, kvh), kv.k_row);
    prefetch_bytes(kv.v_at(pos, kvh), kv.v_row);
}

void attention(const PagedKV &kv, int kvh, int n_head, const float *q, int64_t q_stride, float *out,
               int64_t out_stride, int64_t n_past, int64_t i0, int64_t i1, float scale, float *scratch,
               const AttnMask &mask) {
    const int hd = kv.head_dim;
    const int group = n_head / kv.n_kv;
    const int64_t nt = i1 - i0;
    float *Kt = scratch;
    float *Vt = Kt + (size_t)kAttnTile * hd;
    float *KT = Vt + (size_t)kAttnTile * hd;  // the K tile transposed, for score_keys_rows
    float *S = KT + (size_t)kAttnTile * hd;  // the tile's scores, kAttnTile per query row (i, hh)
    float *acc = S + (size_t)(nt * group + kQueryGroup) * kAttnTile;
    float *m = acc + (size_t)nt * group * hd;
    float *l = m + (size_t)nt * group;
    std::fill(acc, acc + (size_t)nt * group * hd, 0.0f);
    std::fill(m, m + (size_t)nt * group, -std::numeric_limits<float>::infinity());
    std::fill(l, l + (size_t)nt * group, 0.0f);
    // query row r = (i - i0) * group + hh, padded to whole groups of kQueryGroup with copies of the last row
    const int64_t nrow = nt * group;
    std::vector<const float *> qrows((size_t)(nrow + kQueryGroup));
    for (int64_t r = 0; r < nrow; r++)
        qrows[(size_t)r] = q + (i0 + r / group) * q_stride + (int64_t)(kvh * group + r % group) * hd;
    for (int64_t r = nrow; r < nrow + kQueryGroup; r++) qrows[(size_t)r] = qrows[(size_t)nrow - 1];
    std::vector<LiveRow> live((size_t)nrow);

    // the positions any row of [i0, i1) sees: lo and hi grow with i under every mask
    const int64_t n_new = mask.causal ? i1 : mask.n_new;
    int64_t p_start, p_end, unused;
    attn_range(n_past + i0, n_past, n_new, mask.causal, mask.window, &p_start, &unused);
    attn_range(n_past + i1 - 1, n_past, n_new, mask.causal, mask.window, &unused, &p_end);
    // tiles stay aligned to kAttnTile from position 0, so a causal call splits its sums exactly as before
    for (int64_t p0 = p_start / kAttnTile * kAttnTile; p0 < p_end; p0 += kAttnTile) {
        const int64_t pa = std::max(p0, p_start);  // first position of the tile anyone sees
        const int64_t pn = std::min<int64_t>(kAttnTile, p_end - p0);
        // The cache rows are scattered (paged, a head's row among its position's heads) and, in a decode step, not
        // in any cache since the step before: each conversion waited for its row (the conversions were 6 % of a
        // 1-thread Qwen3-0.6B decode step, attention's largest part), so the rows kAttnAhead positions on are asked
        // for while these convert.
        constexpr int64_t kAttnAhead = 8;
        for (int64_t j = pa - p0; j < std::min(pn, pa - p0 + kAttnAhead); j++) prefetch_kv_row(kv, p0 + j, kvh);
        for (int64_t j = pa - p0; j < pn; j++) {
            if (j + kAttnAhead < pn) prefetch_kv_row(kv, p0 + j + kAttnAhead, kvh);
            dequant_row(kv.type_k, kv.k_at(p0 + j, kvh), Kt + j * hd, hd);
            dequant_row(kv.type_v, kv.v_at(p0 + j, kvh), Vt + j * hd, hd);
        }
        // The transposed tile pays off when kQueryGroup real rows share it; fewer rows (a decode step: group rows, 2 for
        // Qwen3-0.6B) would transpose hd x 16 floats per key group and score 8 rows for 2, so they use score_keys.
        const bool wide = hd % 16 == 0 && nrow >= kQueryGroup;
        if (wide)
            for (int d = 0; d < hd; d++)
                for (int64_t j = pa - p0; j < pn; j++) KT[(int64_t)d * kAttnTile + j] = Kt[j * hd + d];
        // Scores first, for every query row that sees the tile and for the union [u0, u1) of their key ranges. A
        // key's score is the same bits by either kernel, so scoring keys a row does not use changes nothing for that
        // row; it lets kQueryGroup rows share each K register load.
        int64_t u0 = pn, u1 = 0;
        for (int64_t i = i0; i < i1; i++) {
            int64_t lo, hi;
            attn_range(n_past + i, n_past, n_new, mask.causal, mask.window, &lo, &hi);
            if (p0 >= hi || p0 + pn <= lo) continue;
            u0 = std::min(u0, std::max<int64_t>(0, lo - p0));
            u1 = std::max(u1, std::min(pn, hi - p0));
        }
        if (u0 >= u1) continue;
        int64_t jw = u0;
        if (wide)
            for (; jw + 16 <= u1; jw += 16)
                for (int64_t r = 0; r < nrow; r += kQueryGroup)
                    score_keys_rows(qrows.data() + r, KT + jw, kAttnTile, hd, S + r * kAttnTile + jw, kAttnTile);
        if (jw < u1)
            for (int64_t r = 0; r < nrow; r++)
                score_keys(Kt + jw * hd, qrows[(size_t)r], hd, u1 - jw, S + r * kAttnTile + jw);
        // Softmax numerators of every row that sees the tile, over the 16-aligned span [b0, b1) of the union (zeros
        // outside a row's own range), then their sums several rows at once, then each row's rescale and V sums.
        const int64_t b0 = u0 / 16 * 16, b1 = std::min<int64_t>(kAttnTile, (u1 + 15) / 16 * 16);
        int nlive = 0;
        for (int64_t i = i0; i < i1; i++) {
            int64_t lo, hi;
            attn_range(n_past + i, n_past, n_new, mask.causal, mask.window, &lo, &hi);
            if (p0 >= hi || p0 + pn <= lo) continue;
            // this row's part of the tile: [j0, j1)
            const int64_t j0 = std::max<int64_t>(0, lo - p0), j1 = std::min(pn, hi - p0);
            for (int hh = 0; hh < group; hh++) {
                const size_t idx = (size_t)(i - i0) * group + hh;
                float *s = S + (int64_t)idx * kAttnTile;
                float mx = scale_scores(s, b0, b1, j0, j1, scale);
                if (mask.vis) {
                    mx = -std::numeric_limits<float>::infinity();
                    for (int64_t j = j0; j < j1; j++) {
                        if (!attn_visible(mask.vis[i], p0 + j, n_past)) s[j] = -std::numeric_limits<float>::infinity();
                        mx = std::max(mx, s[j]);
                    }
                }
                const float mnew = std::max(m[idx], mx);
                if (mnew == -std::numeric_limits<float>::infinity()) continue;  // nothing visible yet
                exp_sub(s, b0, b1, mnew);
                live[nlive] = {s, idx, j0, j1, std::exp(m[idx] - mnew), 0};  // corr: 0 for the first tile (m = -inf)
                m[idx] = mnew;
                nlive++;
            }
        }
        row_sums(live.data(), nlive, b0, b1);
        for (int k = 0; k < nlive; k++) {
            const LiveRow &lr = live[k];
            float *a = acc + lr.idx * hd;
            l[lr.idx] = l[lr.idx] * lr.corr + lr.sum;
            scale_vec(lr.corr, a, hd);
            accumulate_rows(lr.s + lr.j0, Vt + lr.j0 * hd, lr.j1 - lr.j0, hd, a);
        }
    }
    for (int64_t i = i0; i < i1; i++) {
        for (int hh = 0; hh < group; hh++) {
            const int h = kvh * group + hh;
            const size_t idx = (size_t)(i - i0) * group + hh;
            const float inv = 1.0f / l[idx];
            float *o = out + i * out_stride + (int64_t)h * hd;
            const float *a = acc + idx * hd;
            for (int d = 0; d < hd; d++) o[d] = a[d] * inv;
        }
    }
}

void conv1d_silu(const float *window, int64_t n, int64_t channels, const float *w, int K, float *out) {
    for (int64_t t = 0; t < n; t++) {
        float *o = out + t * channels;
        for (int64_t c = 0; c < channels; c++) {
            float acc = 0;
            for (int j = 0; j < K; j++) acc += w[c * K + j] * window[(t + j) * channels + c];
            o[c] = silu(acc);
        }
    }
}

void gdn_recurrent(float *S, int dk, int dv, const float *q, const float *k, const float *v, const float *g,
                   const float *beta, int64_t n, float *out, float *states) {
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
        if (states) std::memcpy(states + t * (int64_t)dk * dv, S, sizeof(float) * (size_t)dk * dv);
    }
}

size_t gdn_chunk_scratch(int dk, int dv) {
    const size_t C = kGdnChunk;
    return C + C * C + C * (size_t)dv + C * (size_t)dk + (size_t)dv;
}

void gdn_chunked(float *S, int dk, int dv, const float *q, const float *k, const float *v, const float *g,
                 const float *beta, int64_t n, float *out, float *scratch) {
    const int64_t C = kGdnChunk;
    float *G = scratch;           // [C] cumulative log-decay
    float *A = G + C;             // [C][C] strictly lower: beta_i (k_i . k_j) exp(G_i - G_j)
    float *U = A + C * C;         // [C][dv] becomes V_new
    float *W = U + C * dv;        // [C][dk]
    float *tmp = W + C * dk;      // [dv]
    for (int64_t c0 = 0; c0 < n; c0 += C) {
        const int64_t L = std::min(C, n - c0);
        const float *qc = q + c0 * dk, *kc = k + c0 * dk, *vc = v + c0 * dv;
        const float *gc = g + c0, *bc = beta + c0;
        float acc = 0;
        for (int64_t i = 0; i < L; i++) {
            acc += gc[i];
            G[i] = acc;
        }
        for (int64_t i = 0; i < L; i++)
            for (int64_t j = 0; j < i; j++)
                A[i * C + j] = bc[i] * dot_f32(kc + i * dk, kc + j * dk, dk) * std::exp(G[i] - G[j]);
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
        // V_new = U - W S
        for (int64_t i = 0; i < L; i++) {
            float *ui = U + i * dv;
            const float *wi = W + i * dk;
            for (int a = 0; a < dk; a++) axpy(-wi[a], S + (size_t)a * dv, ui, dv);
        }
        // O_i = exp(G_i) q_i S + sum_{j<=i} (q_i . k_j) exp(G_i - G_j) V_new_j
        for (int64_t i = 0; i < L; i++) {
            float *o = out + (c0 + i) * dv;
            const float *qi = qc + i * dk;
            std::fill(tmp, tmp + dv, 0.0f);
            for (int a = 0; a < dk; a++) axpy(qi[a], S + (size_t)a * dv, tmp, dv);
            const float eg = std::exp(G[i]);
            for (int b = 0; b < dv; b++) o[b] = eg * tmp[b];
            for (int64_t j = 0; j <= i; j++) {
                const float c = dot_f32(qi, kc + j * dk, dk) * std::exp(G[i] - G[j]);
                axpy(c, U + j * dv, o, dv);
            }
        }
        // S = exp(G_last) S + sum_j exp(G_last - G_j) k_j V_new_j^T
        const float gl = G[L - 1];
        const float el = std::exp(gl);
        for (int a = 0; a < dk; a++) scale_vec(el, S + (size_t)a * dv, dv);
        for (int64_t j = 0; j < L; j++) {
            const float e = std::exp(gl - G[j]);
            const float *kj = kc + j * dk;
            const float *uj = U + j * dv;
            for (int a = 0; a < dk; a++) axpy(e * kj[a], uj, S + (size_t)a * dv, dv);
        }
    }
}

namespace {

using Cand = std::pair<float, int32_t>;  // (value, id)

// Larger value first, lower id on ties.
bool better(const Cand &a, const Cand &b) { return a.first > b.first || (a.first == b.first && a.second < b.second); }

float clean(float v) { return v != v ? -std::numeric_limits<float>::infinity() : v; }

// Elements [i0, i1) of a row: its k best candidates (best first), its largest value and the sum of exp(x - that) (0
// when every value is -inf or NaN).
struct TopkSpan {
    std::vector<Cand> best;
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
};

// The span's max and sum of exp(x - max) 16 lanes at a time: the exps by exp16_nonpos (within 2 ulp), each lane's sum
// in double, the lanes added in a fixed order. One exp in double an element had been ~0.43 ms a 151,936-logit row at
// 2 threads, 5 % of a Qwen3-0.6B decode step at 16.
DFL_WIDE_MULTIVERSION static void span_max_sum(const float *x, int64_t n, float *mx_out, double *sum_out) {
    const float ninf = -std::numeric_limits<float>::infinity();
    const auto block = [&](int64_t i) {  // 16 values from i, NaN and lanes past n as -inf
        v16f v;
        if (i + 16 <= n) {
            v = load16f(x + i);
        } else {
            float t[16];
            for (int l = 0; l < 16; l++) t[l] = i + l < n ? x[i + l] : ninf;
            v = load16f(t);
        }
        return v == v ? v : v16f{} + ninf;
    };
    v16f m = v16f{} + ninf;
    for (int64_t i = 0; i < n; i += 16) {
        const v16f v = block(i);
        m = v > m ? v : m;
    }
    const float mx = max_lane(m);
    *mx_out = mx;
    *sum_out = 0;
    if (mx == ninf) return;
    typedef double v8d __attribute__((vector_size(64)));
    v8d lo{}, hi{};
    for (int64_t i = 0; i < n; i += 16) {
        const v16f e = exp16_nonpos(block(i) - mx);
        lo += __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3, 4, 5, 6, 7), v8d);
        hi += __builtin_convertvector(__builtin_shufflevector(e, e, 8, 9, 10, 11, 12, 13, 14, 15), v8d);
    }
    const v8d t = lo + hi;
    *sum_out = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
}

// The first index in [i, n) at or after i whose value beats thr (NaN never does), or n: 16 at a time.
DFL_WIDE_MULTIVERSION static int64_t next_above(const float *x, int64_t i, int64_t n, float thr) {
    const v16f none = v16f{} - std::numeric_limits<float>::infinity();
    for (; i + 16 <= n; i += 16) {
        const v16f v = load16f(x + i);
        if (max_lane(v == v ? v : none) > thr)
            for (int l = 0; l < 16; l++)
                if (x[i + l] > thr) return i + l;
    }
    for (; i < n; i++)
        if (x[i] > thr) return i;
    return n;
}

void topk_span(const float *x, int64_t i0, int64_t i1, int k, TopkSpan &out) {
    std::vector<Cand> &heap = out.best;  // a heap whose root is the worst of the best k seen so far
    heap.clear();
    heap.reserve((size_t)k);
    float mx;
    span_max_sum(x + i0, i1 - i0, &mx, &out.sum);
    out.mx = mx;
    // Only values above the heap's worst can enter once it is full; ascending ids, so an equal value never does.
    for (int64_t i = i0; i < i1; i++) {
        if ((int)heap.size() == k) {
            i = next_above(x, i, i1, heap.front().first);
            if (i == i1) break;
        }
        const float v = clean(x[i]);
        if (v == -std::numeric_limits<float>::infinity()) continue;
        if ((int)heap.size() < k) {
            heap.emplace_back(v, (int32_t)i);
            std::push_heap(heap.begin(), heap.end(), better);
        } else {
            std::pop_heap(heap.begin(), heap.end(), better);
            heap.back() = {v, (int32_t)i};
            std::push_heap(heap.begin(), heap.end(), better);
        }
    }
    std::sort(heap.begin(), heap.end(), better);
}

// A row's result from its spans, in span order: the best k of their candidates, and the log of the sum of their
// sums rescaled to the largest value.
void topk_merge(const TopkSpan *spans, int64_t n_spans, int k, int32_t *ids, float *vals, float *lse) {
    std::vector<Cand> all;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < n_spans; c++) {
        all.insert(all.end(), spans[c].best.begin(), spans[c].best.end());
        if (spans[c].sum > 0) mx = std::max(mx, spans[c].mx);
    }
    double sum = 0;
    for (int64_t c = 0; c < n_spans; c++)
        if (spans[c].sum > 0) sum += spans[c].sum * std::exp(spans[c].mx - mx);
    const size_t keep = std::min(all.size(), (size_t)k);
    std::partial_sort(all.begin(), all.begin() + (std::ptrdiff_t)keep, all.end(), better);
    for (int j = 0; j < k; j++) {
        ids[j] = j < (int)keep ? all[(size_t)j].second : -1;
        vals[j] = j < (int)keep ? all[(size_t)j].first : -std::numeric_limits<float>::infinity();
    }
    *lse = sum > 0 ? (float)(mx + std::log(sum)) : -std::numeric_limits<float>::infinity();
}

// The spans a row of n is split into: fixed, whatever the thread count, so a row's result is the same on any pool.
// A vocabulary row (151,936 logits, one exp each in double) took 1.3 ms on one thread: the largest serial part of a
// Qwen3-0.6B decode step at 16 threads. Spans only where k is small (their candidates are merged).
constexpr int64_t kTopkSpan = 16384;
int64_t topk_spans(int64_t n, int k) { return k <= 64 ? std::max<int64_t>(1, ceil_div(n, kTopkSpan)) : 1; }

}  // namespace

void topk_rows(ThreadPool &pool, const float *x, int64_t rows, int64_t n, int k, int32_t *ids, float *vals,
               float *lse) {
    const int64_t n_spans = topk_spans(n, k), span = ceil_div(n, n_spans);
    std::vector<TopkSpan> spans((size_t)(rows * n_spans));
    pool.parallel_for(rows * n_spans, [&](int64_t task, int) {
        const int64_t r = task / n_spans, c = task % n_spans;
        topk_span(x + r * n, c * span, std::min(n, (c + 1) * span), k, spans[(size_t)task]);
    });
    for (int64_t r = 0; r < rows; r++)
        topk_merge(spans.data() + r * n_spans, n_spans, k, ids + r * k, vals + r * k, lse + r);
}

}  // namespace dfl

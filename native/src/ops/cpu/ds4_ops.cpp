// The CPU kernels of the DeepSeek V4 ops (device.h, "DeepSeek V4"): hyper-connections, the compressors, the lightning
// indexer, sink attention over the window ring and compressed rows, and the MoE routing and experts. Threaded over
// tokens (or entries, where a sequence's tokens must run in order) like cpu_ops.cpp.
#include "ops/cpu/ds4_ops.h"

#include "quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace dfl {

namespace {

// Cache position of batch token t (device.h: len0 + index within its entry).
inline int64_t cache_pos(const BatchMeta &m, int64_t t) {
    const int32_t e = m.ent[t];
    return (int64_t)m.len0[e] + (t - m.t0[e]);
}

inline const int32_t *blocks_of(const BatchMeta &m, int32_t e) { return m.block_table + (int64_t)e * m.max_blocks; }

// One chain of dependent adds, in order: the indexer's scores, which CUDA's index_scores_kernel sums in the same
// order so both devices pick the same rows at near ties. The attention's scores take dot_f32 (16 lanes).
float dot(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

}  // namespace

void ds4_sinkhorn(float *c, int n, int iters, float eps) {
    // step A: softmax over each row (destinations b of source a), plus eps
    for (int a = 0; a < n; a++) {
        float *r = c + a * n;
        float mx = r[0];
        for (int b = 1; b < n; b++) mx = std::max(mx, r[b]);
        float sum = 0;
        for (int b = 0; b < n; b++) sum += (r[b] = std::exp(r[b] - mx));
        for (int b = 0; b < n; b++) r[b] = r[b] / sum + eps;
    }
    auto cols = [&] {
        for (int b = 0; b < n; b++) {
            float sum = 0;
            for (int a = 0; a < n; a++) sum += c[a * n + b];
            for (int a = 0; a < n; a++) c[a * n + b] /= sum + eps;
        }
    };
    cols();
    for (int it = 1; it < iters; it++) {
        for (int a = 0; a < n; a++) {
            float sum = 0;
            for (int b = 0; b < n; b++) sum += c[a * n + b];
            for (int b = 0; b < n; b++) c[a * n + b] /= sum + eps;
        }
        cols();
    }
}

void ds4_rope_tail_head(float *x, int head_dim, int rope_dim, double pos, const float *inv_freq) {
    float *r = x + head_dim - rope_dim;
    for (int i = 0; i < rope_dim / 2; i++) {
        const float ang = (float)pos * inv_freq[i];
        const float c = (float)std::cos((double)ang), s = (float)std::sin((double)ang);
        const float x0 = r[2 * i], x1 = r[2 * i + 1];
        r[2 * i] = x0 * c - x1 * s;
        r[2 * i + 1] = x1 * c + x0 * s;
    }
}

// One token's N streams X [N][D] weighted into y [D] (stream order, the same rounding for every caller).
static void hc_mix_streams(const float *weight, const float *X, int N, int64_t D, float *y) {
    for (int64_t d = 0; d < D; d++) {
        float s = 0;
        for (int i = 0; i < N; i++) s += weight[i] * X[i * D + d];
        y[d] = s;
    }
}

// Token t's MoE output o [D]: its k pairs' rows of y ([T * k][D], pair t * k + j) weighted and added in choice order
// from 0 (moe_experts' combine).
static void ds4_combine_pairs(const float *y, const float *weights, int k, int64_t t, int64_t D, float *o) {
    std::fill(o, o + D, 0.0f);
    for (int j = 0; j < k; j++) {
        const float w = weights[t * k + j], *yr = y + (t * k + j) * D;
        for (int64_t d = 0; d < D; d++) o[d] += w * yr[d];
    }
}

void ds4_hc_pre(ThreadPool &pool, const HcPreCall &c) {
    const int N = c.N, M = (2 + N) * N;
    pool.parallel_for(c.T, [&](int64_t t, int) {
        const float *mix = c.mix + t * M;
        std::vector<float> scaled;
        if (c.norm) {  // the streams' RMSNorm: rmsnorm's scale of the flattened row
            const float r = rms_scale(c.X + t * N * c.D, N * c.D, c.norm_eps);
            scaled.assign(mix, mix + M);
            for (float &v : scaled) v *= r;
            mix = scaled.data();
        }
        float pre[64];
        for (int i = 0; i < N; i++) pre[i] = sigmoid(mix[i] * c.scale[0] + c.base[i]) + c.eps;
        for (int i = 0; i < N; i++) c.post[t * N + i] = 2.0f * sigmoid(mix[N + i] * c.scale[1] + c.base[N + i]);
        float *comb = c.comb + t * N * N;
        for (int k = 0; k < N * N; k++) comb[k] = mix[2 * N + k] * c.scale[2] + c.base[2 * N + k];
        ds4_sinkhorn(comb, N, c.iters, c.eps);
        hc_mix_streams(pre, c.X + t * N * c.D, N, c.D, c.x + t * c.D);
    });
}

void ds4_hc_post(ThreadPool &pool, const HcPostCall &c) {
    const int N = c.N;
    pool.parallel_for(c.T, [&](int64_t t, int) {
        const float *X = c.X + t * N * c.D, *post = c.post + t * N, *comb = c.comb + t * N * N;
        const float *F = c.F + t * c.D;
        float *out = c.out + t * N * c.D;
        for (int b = 0; b < N; b++)
            for (int64_t d = 0; d < c.D; d++) {
                float s = 0;
                for (int a = 0; a < N; a++) s += comb[a * N + b] * X[a * c.D + d];
                const float f = c.F2 ? F[d] + c.F2[t * c.D + d] : F[d];
                out[b * c.D + d] = post[b] * f + s;
            }
    });
}

void ds4_hc_head(ThreadPool &pool, const HcHeadCall &c) {
    const int N = c.N;
    pool.parallel_for(c.T, [&](int64_t t, int) {
        float a[64];
        for (int i = 0; i < N; i++) a[i] = sigmoid(c.mix[t * N + i] * c.scale[0] + c.base[i]) + c.eps;
        hc_mix_streams(a, c.X + t * N * c.D, N, c.D, c.y + t * c.D);
    });
}

void ds4_norm_rope_tail(ThreadPool &pool, const float *w, float eps, const RopeTailCall &c) {
    pool.parallel_for(c.rows * c.n_head, [&](int64_t i, int) {
        const int64_t r = i / c.n_head;
        float *x = c.x + r * c.row_stride + (i % c.n_head) * c.head_dim;
        rmsnorm(x, w, x, c.head_dim, eps);
        ds4_rope_tail_head(x, c.head_dim, c.rope_dim, c.inverse ? -(double)c.pos[r] : (double)c.pos[r], c.inv_freq);
    });
}

void ds4_rope_tail(ThreadPool &pool, const RopeTailCall &c) {
    pool.parallel_for(c.rows, [&](int64_t r, int) {
        const double pos = c.inverse ? -(double)c.pos[r] : (double)c.pos[r];
        for (int h = 0; h < c.n_head; h++)
            ds4_rope_tail_head(c.x + r * c.row_stride + (int64_t)h * c.head_dim, c.head_dim, c.rope_dim, pos, c.inv_freq);
    });
}

// Pools the closing window w of one compressor slot into `row` (Ds4CompressCall), then norm and RoPE.
static void pool_window(const Ds4CompressCall &c, const float *st, int64_t w, float *row) {
    const int R = c.ratio, hd = c.head_dim, width = hd * (c.overlap ? 2 : 1);
    const float *cur_kv = st, *cur_g = st + (int64_t)R * width;
    const float *prev_kv = st + 2 * (int64_t)R * width, *prev_g = st + 3 * (int64_t)R * width;
    const float ninf = -std::numeric_limits<float>::infinity();
    std::vector<float> z(2 * (size_t)R), v(2 * (size_t)R);
    for (int d = 0; d < hd; d++) {
        int n = 0;
        if (c.overlap) {
            for (int s = 0; s < R; s++, n++) {
                z[n] = w > 0 ? prev_g[(int64_t)s * width + d] : ninf;
                v[n] = w > 0 ? prev_kv[(int64_t)s * width + d] : 0.0f;
            }
            for (int s = 0; s < R; s++, n++) {
                z[n] = cur_g[(int64_t)s * width + hd + d];
                v[n] = cur_kv[(int64_t)s * width + hd + d];
            }
        } else {
            for (int s = 0; s < R; s++, n++) {
                z[n] = cur_g[(int64_t)s * width + d];
                v[n] = cur_kv[(int64_t)s * width + d];
            }
        }
        float mx = ninf;
        for (int s = 0; s < n; s++) mx = std::max(mx, z[s]);
        float sum = 0;
        for (int s = 0; s < n; s++) sum += (z[s] = std::exp(z[s] - mx));
        float acc = 0;
        for (int s = 0; s < n; s++) acc += (z[s] / sum) * v[s];
        row[d] = acc;
    }
    rmsnorm(row, c.norm, row, hd, c.eps);
    ds4_rope_tail_head(row, hd, c.rope_dim, (double)(w * R), c.inv_freq);
}

void ds4_compress(ThreadPool &pool, const BatchMeta &m, const Ds4CompressCall &c) {
    const int R = c.ratio, hd = c.head_dim, width = hd * (c.overlap ? 2 : 1);
    pool.parallel_for(m.n_ent, [&](int64_t e, int) {
        float *st = c.state + (int64_t)m.slot[e] * c.slot_stride;
        float *cur_kv = st, *cur_g = st + (int64_t)R * width;
        const int32_t *blocks = blocks_of(m, (int32_t)e);
        for (int64_t i = 0; i < m.n[e]; i++) {
            const int64_t t = m.t0[e] + i, p = (int64_t)m.len0[e] + i, j = p % R;
            std::memcpy(cur_kv + j * width, c.kv + t * width, sizeof(float) * (size_t)width);
            for (int d = 0; d < width; d++) cur_g[j * width + d] = c.gate[t * width + d] + c.ape[j * width + d];
            if (j != R - 1) continue;
            const int64_t w = p / R;
            pool_window(c, st, w, c.rows + ds4_comp_row(blocks, w, R, c.block_size, c.rows_per_block) * hd);
            if (c.overlap) std::memcpy(st + 2 * (int64_t)R * width, st, sizeof(float) * 2 * (size_t)R * width);
        }
    });
}

// The scores of every visible compressed row in chunks of rows spread over the pool, then each token's top-k: a
// decode step's one token scored its rows on the caller alone (~3 ms a CSA layer at 1,024 tokens of context, growing
// with it). A row's score is the same sum however the rows are split. Tokens go in groups whose scores take at most
// kMaxScores floats (a long prompt's chunk would otherwise hold tokens x rows).
void ds4_indexer_topk(ThreadPool &pool, const BatchMeta &m, const Ds4IndexerCall &c) {
    const int H = c.n_head, hd = c.head_dim, K = c.top_k;
    constexpr int64_t kRowsPerTask = 64, kMaxScores = int64_t(1) << 24;
    auto visible = [&](int64_t t) { return (cache_pos(m, t) + 1) / c.ratio; };
    std::vector<float> scores;
    std::vector<int64_t> off;
    std::vector<std::pair<int64_t, int64_t>> tasks;  // (token, first row)
    for (int64_t t0 = 0, t1; t0 < m.T; t0 = t1) {
        off.assign(1, 0);  // token t0 + i's scores at off[i] (none where every row is taken)
        for (t1 = t0; t1 < m.T && (t1 == t0 || off.back() + visible(t1) <= kMaxScores); t1++)
            off.push_back(off.back() + (visible(t1) > K ? visible(t1) : 0));
        scores.resize((size_t)off.back());
        tasks.clear();
        for (int64_t t = t0; t < t1; t++)
            for (int64_t s = 0; s < off[(size_t)(t - t0) + 1] - off[(size_t)(t - t0)]; s += kRowsPerTask) tasks.push_back({t, s});
        pool.parallel_for((int64_t)tasks.size(), [&](int64_t task, int) {
            const auto [t, s0] = tasks[(size_t)task];
            const int64_t nvis = visible(t);
            const int32_t *blocks = blocks_of(m, m.ent[t]);
            const float *q = c.q + t * H * hd, *w = c.w + t * H;
            float *score = scores.data() + off[(size_t)(t - t0)];
            for (int64_t s = s0; s < std::min(nvis, s0 + kRowsPerTask); s++) {
                const float *k = c.keys + ds4_comp_row(blocks, s, c.ratio, c.block_size, c.rows_per_block) * hd;
                float acc = 0;
                for (int h = 0; h < H; h++) acc += (w[h] * c.head_scale) * (std::max(0.0f, dot(q + h * hd, k, hd)) * c.dot_scale);
                score[s] = acc;
            }
        });
        pool.parallel_for(t1 - t0, [&](int64_t i, int) {
            const int64_t t = t0 + i, nvis = visible(t);
            int32_t *sel = c.sel + t * K;
            if (nvis <= K) {
                for (int j = 0; j < K; j++) sel[j] = j < nvis ? j : -1;
                return;
            }
            const float *score = scores.data() + off[(size_t)i];
            std::vector<int32_t> idx((size_t)nvis);
            std::iota(idx.begin(), idx.end(), 0);
            // NaN scores lose (counted below every number)
            auto better = [&](int32_t a, int32_t b) {
                const float x = std::isnan(score[a]) ? -INFINITY : score[a], y = std::isnan(score[b]) ? -INFINITY : score[b];
                return x > y || (x == y && a < b);
            };
            std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), better);
            std::sort(idx.begin(), idx.begin() + K);
            for (int j = 0; j < K; j++) sel[j] = idx[(size_t)j];
        });
    }
}

// Tasks of a token's heads [h0, h1), about four a thread: a decode step's one token was one task of all 64 heads
// (the caller alone, the other threads waiting; ~20 ms a layer at a few hundred keys). Each head's sums are the same
// however the heads are split.
void ds4_attention(ThreadPool &pool, Scratch &scratch, const BatchMeta &m, const Ds4AttnCall &c) {
    const int H = c.n_head, hd = c.head_dim;
    const int per = (int)std::clamp<int64_t>(m.T * H / (4 * (int64_t)pool.size()), 1, H);
    const int64_t splits = (H + per - 1) / per;
    pool.parallel_for(m.T * splits, [&](int64_t task, int th) {
        const int64_t t = task / splits;
        const int h0 = (int)(task % splits) * per, h1 = std::min(H, h0 + per);
        const int32_t e = m.ent[t];
        const int64_t len0 = m.len0[e], p = cache_pos(m, t), lo = std::max<int64_t>(0, p - c.window + 1);
        const float *ring = c.ring + (int64_t)m.slot[e] * c.slot_stride;
        std::vector<const float *> keys;
        for (int64_t q = lo; q <= p; q++)
            keys.push_back(q < len0 ? ring + (q % c.window) * hd : c.kv + (m.t0[e] + q - len0) * hd);
        if (c.comp) {
            const int32_t *blocks = blocks_of(m, e);
            auto row = [&](int64_t w) { return c.comp + ds4_comp_row(blocks, w, c.ratio, c.block_size, c.rows_per_block) * hd; };
            if (c.sel) {
                for (int j = 0; j < c.top_k; j++)
                    if (c.sel[t * c.top_k + j] >= 0) keys.push_back(row(c.sel[t * c.top_k + j]));
            } else {
                for (int64_t w = 0; w < (p + 1) / c.ratio; w++) keys.push_back(row(w));
            }
        }
        const size_t nk = keys.size();
        float *l = scratch.get(th, nk);
        for (int h = h0; h < h1; h++) {
            const float *q = c.Q + (t * H + h) * hd;
            float *o = c.out + (t * H + h) * hd;
            const float sink = c.sinks[h];
            float mx = sink;
            for (size_t j = 0; j < nk; j++) mx = std::max(mx, l[j] = dot_f32(q, keys[j], hd) * c.scale);
            float den = std::exp(sink - mx);
            for (size_t j = 0; j < nk; j++) den += (l[j] = std::exp(l[j] - mx));
            std::fill(o, o + hd, 0.0f);
            for (size_t j = 0; j < nk; j++) {
                const float pj = l[j] / den;
                const float *k = keys[j];
                for (int d = 0; d < hd; d++) o[d] += pj * k[d];
            }
        }
    });
    if (c.unrotate) ds4_rope_tail(pool, ds4_unrotate_call(m, c));
    if (c.ring_write) ds4_ring_write(m, ds4_ring_write_call(c));
}

void ds4_ring_write(const BatchMeta &m, const Ds4RingWrite &c) {
    for (int32_t e = 0; e < m.n_ent; e++) {
        float *ring = c.ring + (int64_t)m.slot[e] * c.slot_stride;
        for (int64_t i = std::max<int64_t>(0, m.n[e] - c.window); i < m.n[e]; i++)
            std::memcpy(ring + (((int64_t)m.len0[e] + i) % c.window) * c.head_dim, c.kv + (m.t0[e] + i) * c.head_dim,
                        sizeof(float) * (size_t)c.head_dim);
    }
}

void ds4_moe_route(ThreadPool &pool, const MoeRouteCall &c) {
    const int E = c.n_expert, K = c.k;
    pool.parallel_for(c.T, [&](int64_t t, int) {
        std::vector<float> s((size_t)E);
        for (int i = 0; i < E; i++) s[(size_t)i] = std::sqrt(softplus(c.logits[t * E + i]));
        std::vector<int32_t> ids;
        if (c.tid2eid) {
            const int32_t *row = c.tid2eid + (int64_t)c.tokens[t] * c.k_table;
            std::vector<int> slots((size_t)c.k_table);
            std::iota(slots.begin(), slots.end(), 0);
            // keep the k best-scoring of the table's experts, in table order
            std::stable_sort(slots.begin(), slots.end(), [&](int a, int b) { return s[(size_t)row[a]] > s[(size_t)row[b]]; });
            slots.resize((size_t)K);
            std::sort(slots.begin(), slots.end());
            for (int j : slots) ids.push_back(row[j]);
        } else {
            std::vector<float> b((size_t)E);
            for (int i = 0; i < E; i++) b[(size_t)i] = s[(size_t)i] + (c.bias ? c.bias[i] : 0.0f);
            std::vector<int32_t> idx((size_t)E);
            std::iota(idx.begin(), idx.end(), 0);
            std::partial_sort(idx.begin(), idx.begin() + K, idx.end(),
                              [&](int32_t x, int32_t y) { return b[(size_t)x] > b[(size_t)y] || (b[(size_t)x] == b[(size_t)y] && x < y); });
            ids.assign(idx.begin(), idx.begin() + K);
        }
        float sum = 0;
        for (int j = 0; j < K; j++) sum += s[(size_t)ids[(size_t)j]];
        for (int j = 0; j < K; j++) {
            float w = s[(size_t)ids[(size_t)j]];
            if (c.norm) w = w / (sum + 1e-20f);
            c.ids[t * K + j] = ids[(size_t)j];
            c.weights[t * K + j] = w * c.scale;
        }
    });
}

void ds4_swiglu_clamp(float *g, const float *u, int64_t n, float limit) {
    for (int64_t i = 0; i < n; i++) {
        float a = g[i], b = u[i];
        if (limit > 0) {
            a = std::min(a, limit);
            b = std::min(std::max(b, -limit), limit);
        }
        g[i] = silu(a) * b;
    }
}

void ds4_moe_experts(ThreadPool &pool, Scratch &scratch, const MoeExpertsCall &c) {
    const int64_t T = c.T, D = c.n_embd, F = c.n_ff;
    const int K = c.k;
    // (token, choice) pairs by expert, in token order
    std::vector<std::vector<int64_t>> by_expert((size_t)c.n_expert);
    for (int64_t i = 0; i < T * K; i++) {
        const int32_t e = c.ids[i];
        if (e < 0 || e >= c.n_expert) fail(DFL_ERR_INTERNAL, "moe_experts: expert id " + std::to_string(e) + " out of range");
        by_expert[(size_t)e].push_back(i);
    }
    std::vector<float> y((size_t)(T * K * D));
    std::vector<float> xe, g, u, ye;
    for (int e = 0; e < c.n_expert; e++) {
        const std::vector<int64_t> &L = by_expert[(size_t)e];
        const int64_t n = (int64_t)L.size();
        if (n == 0) continue;
        xe.resize((size_t)(n * D));
        g.resize((size_t)(n * F));
        u.resize((size_t)(n * F));
        ye.resize((size_t)(n * D));
        for (int64_t r = 0; r < n; r++)
            std::memcpy(xe.data() + r * D, c.x + (L[(size_t)r] / K) * D, sizeof(float) * (size_t)D);
        // gate and up in one region on one quantization of the input (each part's bits are its own matmul's)
        const Weight gate = c.gate.rows(e * F, F), up = c.up.rows(e * F, F);
        matmul_each(pool, scratch, {{&gate, g.data()}, {&up, u.data()}}, xe.data(), n);
        ds4_swiglu_clamp(g.data(), u.data(), n * F, c.limit);
        matmul(pool, scratch, c.down.rows(e * D, D), g.data(), n, ye.data());
        for (int64_t r = 0; r < n; r++)
            std::memcpy(y.data() + L[(size_t)r] * D, ye.data() + r * D, sizeof(float) * (size_t)D);
    }
    pool.parallel_for(T, [&](int64_t t, int) { ds4_combine_pairs(y.data(), c.weights, K, t, D, c.out + t * D); });
}

}  // namespace dfl

// The DeepSeek V4 CPU ops (ops/cpu/ds4_ops.cpp) against plain float64 references on random inputs.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "ops/cpu/ds4_ops.h"
#include "test.h"

using namespace dfl;
using namespace dfltest;

namespace {

std::vector<float> rnd(Rng &r, size_t n, float a = 1.0f) {
    std::vector<float> v(n);
    for (auto &x : v) x = r.sym(a);
    return v;
}
double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// One sequence slot, one entry covering tokens [0, T) after len0 cached positions, blocks 0..nb-1 in reverse order
// (so the pool addressing is exercised).
struct OneEntry {
    std::vector<int32_t> tokens, pos, ent, t0{0}, n, len0, slot{0}, blocks;
    BatchMeta m;
    OneEntry(int64_t T, int64_t len, int nb) {
        tokens.assign((size_t)T, 0);
        ent.assign((size_t)T, 0);
        for (int64_t t = 0; t < T; t++) pos.push_back((int32_t)(len + t));
        n = {(int32_t)T};
        len0 = {(int32_t)len};
        for (int b = 0; b < nb; b++) blocks.push_back(nb - 1 - b);
        m.T = T;
        m.n_ent = 1;
        m.tokens = tokens.data();
        m.pos = pos.data();
        m.ent = ent.data();
        m.t0 = t0.data();
        m.n = n.data();
        m.len0 = len0.data();
        m.slot = slot.data();
        m.block_table = blocks.data();
        m.max_blocks = nb;
    }
};

void ref_sinkhorn(std::vector<double> &c, int n, int iters, double eps) {
    for (int a = 0; a < n; a++) {
        double mx = -1e300, s = 0;
        for (int b = 0; b < n; b++) mx = std::max(mx, c[a * n + b]);
        for (int b = 0; b < n; b++) s += std::exp(c[a * n + b] - mx);
        for (int b = 0; b < n; b++) c[a * n + b] = std::exp(c[a * n + b] - mx) / s + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int a = 0; a < n; a++) {
                double s = 0;
                for (int b = 0; b < n; b++) s += c[a * n + b];
                for (int b = 0; b < n; b++) c[a * n + b] /= s + eps;
            }
        for (int b = 0; b < n; b++) {
            double s = 0;
            for (int a = 0; a < n; a++) s += c[a * n + b];
            for (int a = 0; a < n; a++) c[a * n + b] /= s + eps;
        }
    }
}

void ref_rope_tail(std::vector<double> &x, int hd, int rd, double pos, const float *inv) {
    for (int i = 0; i < rd / 2; i++) {
        const double a = pos * inv[i], c = std::cos(a), s = std::sin(a);
        const int j = hd - rd + 2 * i;
        const double x0 = x[j], x1 = x[j + 1];
        x[j] = x0 * c - x1 * s;
        x[j + 1] = x1 * c + x0 * s;
    }
}

}  // namespace

TEST(ds4_sinkhorn_doubly_stochastic) {
    Rng r(1);
    for (int n : {2, 4, 5}) {
        std::vector<float> c = rnd(r, (size_t)(n * n), 3.0f);
        std::vector<double> want(c.begin(), c.end());
        ds4_sinkhorn(c.data(), n, 20, 1e-6f);
        ref_sinkhorn(want, n, 20, 1e-6);
        for (int k = 0; k < n * n; k++) CHECK_CLOSE(c[k], want[k], 1e-5);
        for (int a = 0; a < n; a++) {
            double rs = 0, cs = 0;
            for (int b = 0; b < n; b++) rs += c[a * n + b], cs += c[b * n + a];
            CHECK_CLOSE(rs, 1.0, 1e-3);
            CHECK_CLOSE(cs, 1.0, 1e-4);
        }
    }
}

TEST(ds4_hc_pre_post_head) {
    Rng r(2);
    ThreadPool pool(2);
    const int N = 4, M = 24;
    const int64_t T = 3, D = 8;
    std::vector<float> mix = rnd(r, T * M), base = rnd(r, M, 0.5f), scale = {0.7f, 1.3f, 2.0f}, X = rnd(r, T * N * D);
    std::vector<float> x(T * D), post(T * N), comb(T * N * N);
    HcPreCall c;
    c.mix = mix.data(), c.base = base.data(), c.scale = scale.data(), c.X = X.data(), c.T = T, c.D = D, c.N = N;
    c.x = x.data(), c.post = post.data(), c.comb = comb.data();
    ds4_hc_pre(pool, c);
    for (int64_t t = 0; t < T; t++) {
        const float *mm = mix.data() + t * M;
        std::vector<double> cb(N * N);
        for (int k = 0; k < N * N; k++) cb[k] = (double)mm[2 * N + k] * scale[2] + base[2 * N + k];
        ref_sinkhorn(cb, N, 20, 1e-6);
        for (int k = 0; k < N * N; k++) CHECK_CLOSE(comb[t * N * N + k], cb[k], 1e-5);
        for (int i = 0; i < N; i++) CHECK_CLOSE(post[t * N + i], 2 * sig((double)mm[N + i] * scale[1] + base[N + i]), 1e-6);
        for (int64_t d = 0; d < D; d++) {
            double s = 0;
            for (int i = 0; i < N; i++) s += (sig((double)mm[i] * scale[0] + base[i]) + 1e-6) * X[(t * N + i) * D + d];
            CHECK_CLOSE(x[t * D + d], s, 1e-5);
        }
    }
    // the norm folded in (HcPreCall::norm): a product of the raw streams, scaled by their RMSNorm inside, gives what the
    // product of the normed streams gave above
    {
        std::vector<float> raw(mix.size()), x2(x.size()), post2(post.size()), comb2(comb.size());
        for (int64_t t = 0; t < T; t++) {
            double ss = 0;
            for (int64_t i = 0; i < N * D; i++) ss += (double)X[t * N * D + i] * X[t * N * D + i];
            const double rms = std::sqrt(ss / (double)(N * D) + 1e-6);  // 1 / the norm's scale
            for (int k = 0; k < M; k++) raw[t * M + k] = (float)(mix[t * M + k] * rms);
        }
        HcPreCall f = c;
        f.mix = raw.data(), f.norm = true, f.norm_eps = 1e-6f, f.x = x2.data(), f.post = post2.data(), f.comb = comb2.data();
        ds4_hc_pre(pool, f);
        for (size_t i = 0; i < x.size(); i++) CHECK_CLOSE(x2[i], x[i], 1e-5);
        for (size_t i = 0; i < post.size(); i++) CHECK_CLOSE(post2[i], post[i], 1e-5);
        for (size_t i = 0; i < comb.size(); i++) CHECK_CLOSE(comb2[i], comb[i], 1e-5);
    }
    // post: out[b] = post[b] F + sum_a comb[a][b] X[a] (comb is not symmetric: the first index is the source)
    std::vector<float> F = rnd(r, T * D), out(T * N * D);
    HcPostCall p;
    p.F = F.data(), p.X = X.data(), p.post = post.data(), p.comb = comb.data(), p.T = T, p.D = D, p.N = N, p.out = out.data();
    ds4_hc_post(pool, p);
    for (int64_t t = 0; t < T; t++)
        for (int b = 0; b < N; b++)
            for (int64_t d = 0; d < D; d++) {
                double s = (double)post[t * N + b] * F[t * D + d];
                for (int a = 0; a < N; a++) s += (double)comb[t * N * N + a * N + b] * X[(t * N + a) * D + d];
                CHECK_CLOSE(out[(t * N + b) * D + d], s, 1e-5);
            }
    // F2 (the shared expert's output) added inside gives the same floats as added to F before
    {
        std::vector<float> F2 = rnd(r, T * D), sum(T * D), out2(T * N * D), out3(T * N * D);
        for (size_t i = 0; i < sum.size(); i++) sum[i] = F[i] + F2[i];
        HcPostCall q = p;
        q.F2 = F2.data(), q.out = out2.data();
        ds4_hc_post(pool, q);
        HcPostCall u = p;
        u.F = sum.data(), u.out = out3.data();
        ds4_hc_post(pool, u);
        CHECK(out2 == out3);
    }
    // head: y = sum_i (sigmoid(mix_i scale + base_i) + eps) X[i]
    std::vector<float> hm = rnd(r, T * N), hb = rnd(r, N), hs = {1.5f}, y(T * D);
    HcHeadCall h;
    h.mix = hm.data(), h.base = hb.data(), h.scale = hs.data(), h.X = X.data(), h.T = T, h.D = D, h.N = N, h.y = y.data();
    ds4_hc_head(pool, h);
    for (int64_t t = 0; t < T; t++)
        for (int64_t d = 0; d < D; d++) {
            double s = 0;
            for (int i = 0; i < N; i++) s += (sig((double)hm[t * N + i] * 1.5 + hb[i]) + 1e-6) * X[(t * N + i) * D + d];
            CHECK_CLOSE(y[t * D + d], s, 1e-5);
        }
}

TEST(ds4_rope_tail_interleaved_and_inverse) {
    Rng r(3);
    ThreadPool pool(2);
    const int H = 3, hd = 12, rd = 8;
    const int64_t T = 4;
    std::vector<float> inv = {1.0f, 0.3f, 0.05f, 0.001f}, x = rnd(r, T * H * hd), x0 = x;
    std::vector<int32_t> pos = {0, 5, 77, 1000};
    RopeTailCall c;
    c.x = x.data(), c.rows = T, c.row_stride = H * hd, c.n_head = H, c.head_dim = hd, c.rope_dim = rd, c.pos = pos.data();
    c.inv_freq = inv.data();
    ds4_rope_tail(pool, c);
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            std::vector<double> want(x0.begin() + (t * H + h) * hd, x0.begin() + (t * H + h + 1) * hd);
            ref_rope_tail(want, hd, rd, pos[t], inv.data());
            for (int d = 0; d < hd; d++) CHECK_CLOSE(x[(t * H + h) * hd + d], want[d], 2e-5);
        }
    c.inverse = true;
    ds4_rope_tail(pool, c);
    for (size_t i = 0; i < x.size(); i++) CHECK_CLOSE(x[i], x0[i], 1e-5);
    // norm and RoPE as one op: the same floats as rmsnorm of each head row, then rope_tail
    c.inverse = false;
    const std::vector<float> w = rnd(r, hd);
    for (const float *wp : {w.data(), (const float *)nullptr}) {
        std::vector<float> a = x0, b = x0;
        c.x = a.data();
        ds4_norm_rope_tail(pool, wp, 1e-6f, c);
        for (int64_t i = 0; i < T * H; i++) rmsnorm(b.data() + i * hd, wp, b.data() + i * hd, hd, 1e-6f);
        c.x = b.data();
        ds4_rope_tail(pool, c);
        CHECK(a == b);
    }
}

// The compressor over a stream split into two calls equals pooling every window from the whole token list.
TEST(ds4_compress_pools_windows) {
    ThreadPool pool(2);
    for (int overlap = 0; overlap < 2; overlap++) {
        Rng r(4 + overlap);
        const int R = overlap ? 4 : 3, hd = 8, rd = 4, width = hd * (overlap ? 2 : 1), bs = 8, rpb = (bs + R - 1) / R;
        const int64_t T = 23, split = 10;
        const int nb = 4;
        std::vector<float> kv = rnd(r, T * width), gate = rnd(r, T * width, 2.0f), ape = rnd(r, R * width), norm = rnd(r, hd);
        for (auto &v : norm) v += 1.0f;
        std::vector<float> inv = {0.5f, 0.01f};
        std::vector<float> state(4 * R * width, 0.0f), rows(nb * rpb * hd, 0.0f);
        Ds4CompressCall c;
        c.ape = ape.data(), c.norm = norm.data(), c.inv_freq = inv.data(), c.ratio = R, c.head_dim = hd, c.rope_dim = rd;
        c.overlap = overlap, c.state = state.data(), c.slot_stride = 0, c.rows = rows.data(), c.block_size = bs;
        c.rows_per_block = rpb;
        for (int part = 0; part < 2; part++) {
            const int64_t a = part ? split : 0, b = part ? T : split;
            OneEntry e(b - a, a, nb);
            c.kv = kv.data() + a * width;
            c.gate = gate.data() + a * width;
            ds4_compress(pool, e.m, c);
        }
        OneEntry e(1, 0, nb);
        for (int64_t w = 0; w < T / R; w++) {
            std::vector<double> p(hd);
            for (int d = 0; d < hd; d++) {
                std::vector<std::pair<double, double>> slots;  // (score, value)
                if (overlap && w > 0)
                    for (int s = 0; s < R; s++) {
                        const int64_t t = (w - 1) * R + s;
                        slots.push_back({(double)gate[t * width + d] + ape[s * width + d], kv[t * width + d]});
                    }
                for (int s = 0; s < R; s++) {
                    const int64_t t = w * R + s, ch = overlap ? hd + d : d;
                    slots.push_back({(double)gate[t * width + ch] + ape[s * width + ch], kv[t * width + ch]});
                }
                double mx = -1e300, z = 0, acc = 0;
                for (auto &sv : slots) mx = std::max(mx, sv.first);
                for (auto &sv : slots) z += std::exp(sv.first - mx);
                for (auto &sv : slots) acc += std::exp(sv.first - mx) / z * sv.second;
                p[d] = acc;
            }
            double ss = 0;
            for (double v : p) ss += v * v;
            const double rs = 1.0 / std::sqrt(ss / hd + 1e-6);
            for (int d = 0; d < hd; d++) p[d] *= rs * norm[d];
            ref_rope_tail(p, hd, rd, (double)(w * R), inv.data());
            const float *got = rows.data() + ds4_comp_row(e.blocks.data(), w, R, bs, rpb) * hd;
            for (int d = 0; d < hd; d++) CHECK_CLOSE(got[d], p[d], 1e-5);
        }
    }
}

// Top-k by score, ties to the lower row, written in ascending row order; every row while there are at most top_k.
TEST(ds4_indexer_topk_ties_lowest) {
    ThreadPool pool(2);
    Rng r(6);
    const int H = 3, hd = 4, R = 4, K = 3, bs = 16, rpb = 4, nb = 2;
    const int64_t len = 24, T = 2;  // visible rows: (24 + 1) / 4 = 6, (25 + 1) / 4 = 6
    std::vector<float> keys(nb * rpb * hd, 0.0f), q = rnd(r, T * H * hd), w = rnd(r, T * H);
    for (auto &v : w) v = std::fabs(v) + 0.1f;
    OneEntry e(T, len, nb);
    // rows 1, 3, 4 identical (ties), others random
    std::vector<std::vector<float>> kr(6);
    for (int s = 0; s < 6; s++) kr[s] = rnd(r, hd);
    kr[3] = kr[1];
    kr[4] = kr[1];
    for (int s = 0; s < 6; s++)
        std::copy(kr[s].begin(), kr[s].end(), keys.begin() + ds4_comp_row(e.blocks.data(), s, R, bs, rpb) * hd);
    std::vector<int32_t> sel(T * K);
    Ds4IndexerCall c;
    c.q = q.data(), c.w = w.data(), c.keys = keys.data(), c.n_head = H, c.head_dim = hd, c.ratio = R, c.top_k = K;
    c.head_scale = 0.5f, c.dot_scale = 0.25f, c.block_size = bs, c.rows_per_block = rpb, c.sel = sel.data();
    ds4_indexer_topk(pool, e.m, c);
    for (int64_t t = 0; t < T; t++) {
        std::vector<std::pair<double, int>> sc;
        for (int s = 0; s < 6; s++) {
            double a = 0;
            for (int h = 0; h < H; h++) {
                double dt = 0;
                for (int d = 0; d < hd; d++) dt += (double)q[(t * H + h) * hd + d] * kr[s][d];
                a += (double)w[t * H + h] * 0.5 * std::max(0.0, dt) * 0.25;
            }
            sc.push_back({-a, s});  // sorts best first, lower row first on ties
        }
        std::sort(sc.begin(), sc.end());
        std::vector<int32_t> want;
        for (int j = 0; j < K; j++) want.push_back(sc[j].second);
        std::sort(want.begin(), want.end());
        for (int j = 0; j < K; j++) CHECK(sel[t * K + j] == want[j]);
    }
    // an exact tie among identical rows 1, 3, 4 keeps the lowest: zero query weights make every score 0
    std::fill(w.begin(), w.end(), 0.0f);
    ds4_indexer_topk(pool, e.m, c);
    for (int j = 0; j < K; j++) CHECK(sel[j] == j);
    // few rows: all of them, padded
    OneEntry few(1, 6, nb);  // (6 + 1) / 4 = 1 row
    ds4_indexer_topk(pool, few.m, c);
    CHECK(sel[0] == 0 && sel[1] == -1 && sel[2] == -1);
}

TEST(ds4_attention_sink_window_compressed) {
    ThreadPool pool(2);
    Scratch scratch(2);
    Rng r(7);
    const int H = 2, hd = 8, W = 4, R = 4, bs = 8, rpb = 2, nb = 3;
    const int64_t len = 6, T = 5;  // positions 6..10
    std::vector<float> ring = rnd(r, W * hd), kv = rnd(r, T * hd), Q = rnd(r, T * H * hd), comp = rnd(r, nb * rpb * hd);
    std::vector<float> sinks = {0.3f, -1.0f}, out(T * H * hd);
    OneEntry e(T, len, nb);
    for (int sparse = 0; sparse < 2; sparse++) {
        std::vector<int32_t> sel(T * 2, -1);
        for (int64_t t = 0; t < T; t++) sel[t * 2] = 1;  // sparse: only row 1 (visible from position 7)
        Ds4AttnCall c;
        c.Q = Q.data(), c.kv = kv.data(), c.ring = ring.data(), c.window = W, c.comp = comp.data(), c.ratio = R;
        c.block_size = bs, c.rows_per_block = rpb, c.sel = sparse ? sel.data() : nullptr, c.top_k = 2;
        c.sinks = sinks.data(), c.n_head = H, c.head_dim = hd, c.scale = 0.5f, c.out = out.data();
        ds4_attention(pool, scratch, e.m, c);
        for (int64_t t = 0; t < T; t++) {
            const int64_t p = len + t;
            std::vector<const float *> keys;
            for (int64_t qp = std::max<int64_t>(0, p - W + 1); qp <= p; qp++)
                keys.push_back(qp < len ? ring.data() + (qp % W) * hd : kv.data() + (qp - len) * hd);
            if (sparse)
                keys.push_back(comp.data() + ds4_comp_row(e.blocks.data(), 1, R, bs, rpb) * hd);
            else
                for (int64_t w = 0; w < (p + 1) / R; w++) keys.push_back(comp.data() + ds4_comp_row(e.blocks.data(), w, R, bs, rpb) * hd);
            for (int h = 0; h < H; h++) {
                std::vector<double> l;
                double den = std::exp((double)sinks[h]);
                for (const float *k : keys) {
                    double dt = 0;
                    for (int d = 0; d < hd; d++) dt += (double)Q[(t * H + h) * hd + d] * k[d];
                    l.push_back(std::exp(dt * 0.5));
                    den += l.back();
                }
                for (int d = 0; d < hd; d++) {
                    double o = 0;
                    for (size_t j = 0; j < keys.size(); j++) o += l[j] / den * keys[j][d];
                    CHECK_CLOSE(out[(t * H + h) * hd + d], o, 1e-5);
                }
            }
        }
    }
    // ring write keeps the last W positions
    Ds4RingWrite rw;
    rw.kv = kv.data(), rw.ring = ring.data(), rw.window = W, rw.head_dim = hd;
    ds4_ring_write(e.m, rw);
    for (int64_t p = len + T - W; p < len + T; p++)
        for (int d = 0; d < hd; d++) CHECK(ring[(p % W) * hd + d] == kv[(p - len) * hd + d]);
}

TEST(ds4_moe_route_scores_bias_hash) {
    ThreadPool pool(2);
    const int E = 6, K = 2;
    std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 0.1f, -3.0f}, bias = {0, 0, 0, 0, 5.0f, 0};
    std::vector<int32_t> ids(K), tokens = {1}, tid = {0, 1, 2, 3, 5, 4, 2, 0};  // vocab 2, k_table 4
    std::vector<float> wts(K);
    auto s = [&](int e) { return std::sqrt(std::log1p(std::exp((double)logits[e]))); };
    MoeRouteCall c;
    c.logits = logits.data(), c.T = 1, c.n_expert = E, c.k = K, c.norm = true, c.scale = 1.5f, c.ids = ids.data();
    c.weights = wts.data(), c.tokens = tokens.data();
    ds4_moe_route(pool, c);  // no bias: experts 1 and 3 tie, lower id first
    CHECK(ids[0] == 1 && ids[1] == 3);
    CHECK_CLOSE(wts[0], 0.75, 1e-6);
    c.bias = bias.data();  // bias picks expert 4 but its weight uses the unbiased score
    ds4_moe_route(pool, c);
    CHECK(ids[0] == 4 && ids[1] == 1);
    CHECK_CLOSE(wts[0], 1.5 * s(4) / (s(4) + s(1)), 1e-6);
    c.bias = nullptr;
    c.tid2eid = tid.data(), c.k_table = 4;  // token 1: table 5, 4, 2, 0 -> keep the best two (4, 0) in table order
    ds4_moe_route(pool, c);
    CHECK(ids[0] == 4 && ids[1] == 0);
    CHECK_CLOSE(wts[1], 1.5 * s(0) / (s(4) + s(0)), 1e-6);
}

TEST(ds4_swiglu_clamp_and_experts) {
    std::vector<float> g = {20.0f, -20.0f, 0.3f}, u = {50.0f, -50.0f, 0.2f};
    ds4_swiglu_clamp(g.data(), u.data(), 3, 10.0f);
    CHECK_CLOSE(g[0], 10.0 / (1 + std::exp(-10.0)) * 10.0, 1e-4);
    CHECK_CLOSE(g[1], -20.0 / (1 + std::exp(20.0)) * -10.0, 1e-6);
    CHECK_CLOSE(g[2], 0.3 / (1 + std::exp(-0.3)) * 0.2, 1e-6);

    ThreadPool pool(2);
    Scratch scratch(2);
    Rng r(8);
    const int E = 3, D = 8, F = 4, K = 2;
    const int64_t T = 3;
    std::vector<float> wg = rnd(r, E * F * D), wu = rnd(r, E * F * D), wd = rnd(r, E * D * F), x = rnd(r, T * D);
    auto weight = [&](const std::vector<float> &v, int n_in, int n_out) {
        Weight w;
        w.type = DFL_TYPE_F32, w.n_in = n_in, w.n_out = n_out, w.row_bytes = 4 * (uint64_t)n_in;
        w.data = (const uint8_t *)v.data();
        return w;
    };
    std::vector<int32_t> ids = {2, 0, 0, 1, 2, 2};
    std::vector<float> wts = {0.7f, 0.3f, 1.0f, 0.5f, 0.2f, 0.1f}, out(T * D);
    MoeExpertsCall c;
    c.x = x.data(), c.gate = weight(wg, D, E * F), c.up = weight(wu, D, E * F), c.down = weight(wd, F, E * D), c.T = T;
    c.n_expert = E, c.n_ff = F, c.n_embd = D, c.k = K, c.limit = 0.5f, c.ids = ids.data(), c.weights = wts.data();
    c.out = out.data();
    ds4_moe_experts(pool, scratch, c);
    for (int64_t t = 0; t < T; t++)
        for (int d = 0; d < D; d++) {
            double o = 0;
            for (int j = 0; j < K; j++) {
                const int e = ids[t * K + j];
                double y = 0;
                for (int f = 0; f < F; f++) {
                    double a = 0, b = 0;
                    for (int i = 0; i < D; i++) a += (double)wg[(e * F + f) * D + i] * x[t * D + i], b += (double)wu[(e * F + f) * D + i] * x[t * D + i];
                    a = std::min(a, 0.5);
                    b = std::max(-0.5, std::min(b, 0.5));
                    y += (double)wd[(e * D + d) * F + f] * (a / (1 + std::exp(-a)) * b);
                }
                o += wts[t * K + j] * y;
            }
            CHECK_CLOSE(out[t * D + d], o, 1e-5);
        }
}

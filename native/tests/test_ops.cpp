// Operations against straightforward float64 implementations.
#include <algorithm>
#include <map>
#include <numeric>

#include "ops/cpu/cpu_ops.h"
#include "sample.h"
#include "ref.h"
#include "test.h"

using namespace dfl;
using namespace dfltest;

// A zeroed paged cache of `positions` positions of one type, in blocks of bs whose table is scrambled (table entry b
// is pool block (b * mul + add) % n_blocks: a permutation where mul and n_blocks share no factor), for the attention
// tests. Not copyable: kv points into the vectors.
struct TestCache {
    std::vector<uint8_t> k, v;
    std::vector<int32_t> blocks;
    PagedKV kv;
    TestCache(uint32_t type, int n_kv, int hd, int bs, int64_t positions, int64_t mul, int64_t add) {
        const int64_t n_blocks = (positions + bs - 1) / bs;
        blocks.resize((size_t)n_blocks);
        for (int64_t b = 0; b < n_blocks; b++) blocks[(size_t)b] = (int32_t)((b * mul + add) % n_blocks);
        kv.type_k = kv.type_v = type;
        kv.n_kv = n_kv;
        kv.head_dim = hd;
        kv.block_size = bs;
        kv.k_row = kv.v_row = row_bytes(type, hd);
        k.assign((size_t)(n_blocks * bs * n_kv * kv.k_row), 0);
        v.assign(k.size(), 0);
        kv.k = k.data();
        kv.v = v.data();
        kv.blocks = blocks.data();
    }
    TestCache(const TestCache &) = delete;
    TestCache &operator=(const TestCache &) = delete;
};

TEST(rmsnorm_and_l2norm) {
    Rng rng(8);
    for (int n : {16, 128, 1000}) {
        std::vector<float> x((size_t)n), w((size_t)n), y((size_t)n);
        for (auto &v : x) v = rng.sym(4);
        for (auto &v : w) v = rng.sym(2);
        double ss = 0;
        for (float v : x) ss += (double)v * v;
        const double r = 1 / std::sqrt(ss / n + 1e-6);
        rmsnorm(x.data(), w.data(), y.data(), n, 1e-6f);
        for (int i = 0; i < n; i++) CHECK_CLOSE(y[(size_t)i], x[(size_t)i] * r * w[(size_t)i], 1e-6 * 8);
        rmsnorm(x.data(), nullptr, y.data(), n, 1e-6f);
        for (int i = 0; i < n; i++) CHECK_CLOSE(y[(size_t)i], x[(size_t)i] * r, 1e-6 * 4);
        std::vector<float> z = x;
        l2norm(z.data(), n, 1e-6f);
        const double r2 = 1 / std::sqrt(ss + 1e-6);
        for (int i = 0; i < n; i++) CHECK_CLOSE(z[(size_t)i], x[(size_t)i] * r2, 1e-7);
    }
    // the epsilon matters for tiny vectors
    std::vector<float> t = {1e-4f, 0.0f};
    l2norm(t.data(), 2, 1e-6f);
    CHECK_CLOSE(t[0], 1e-4 / std::sqrt(1e-8 + 1e-6), 1e-6);
}

TEST(rope_neox_partial) {
    Rng rng(9);
    for (int head_dim : {32, 64}) {
        for (int rope_dim : {head_dim, head_dim / 4}) {
            for (float theta : {1e6f, 1e7f}) {
                const auto inv = rope_inv_freq(theta, rope_dim);
                for (int32_t pos : {0, 1, 77, 4095}) {
                    std::vector<float> x((size_t)head_dim);
                    for (auto &v : x) v = rng.sym();
                    std::vector<float> y = x;
                    rope_neox(y.data(), rope_dim, pos, inv.data());
                    const int half = rope_dim / 2;
                    for (int i = 0; i < head_dim; i++) {
                        double want;
                        if (i >= rope_dim) {
                            want = x[(size_t)i];
                        } else {
                            const int k = i % half;
                            const double ang = pos * std::pow((double)theta, -2.0 * k / rope_dim);
                            want = i < half ? x[(size_t)i] * std::cos(ang) - x[(size_t)(i + half)] * std::sin(ang)
                                            : x[(size_t)i] * std::cos(ang) + x[(size_t)(i - half)] * std::sin(ang);
                        }
                        // f32 angles (as HF computes them) drift by ~pos * 2^-24
                        CHECK_CLOSE(y[(size_t)i], want, 1e-6 + pos * 2e-7);
                    }
                }
            }
        }
    }
}

TEST(attention_paged_all_cache_types) {
    Rng rng(13);
    const int n_head = 4, n_kv = 2, hd = 32, bs = 16;
    const int64_t n_past = 70, n_new = 20, total = n_past + n_new;
    const std::vector<int32_t> blocks = {5, 2, 7, 0, 6, 3, 1, 4};
    const std::pair<uint32_t, uint32_t> types[] = {{DFL_TYPE_F32, DFL_TYPE_F32},
                                                   {DFL_TYPE_F16, DFL_TYPE_F16},
                                                   {DFL_TYPE_BF16, DFL_TYPE_BF16},
                                                   {DFL_TYPE_Q8_0, DFL_TYPE_Q8_0},
                                                   {DFL_TYPE_Q8_0, DFL_TYPE_F16}};
    for (auto ct : types) {
        PagedKV kv;
        kv.type_k = ct.first;
        kv.type_v = ct.second;
        kv.n_kv = n_kv;
        kv.head_dim = hd;
        kv.block_size = bs;
        kv.k_row = row_bytes(kv.type_k, hd);
        kv.v_row = row_bytes(kv.type_v, hd);
        std::vector<uint8_t> kb(8 * bs * n_kv * kv.k_row), vb(8 * bs * n_kv * kv.v_row);
        kv.k = kb.data();
        kv.v = vb.data();
        kv.blocks = blocks.data();
        std::vector<double> K((size_t)(total * n_kv * hd)), V(K.size());
        std::vector<float> row((size_t)hd);
        for (int64_t p = 0; p < total; p++)
            for (int g = 0; g < n_kv; g++) {
                for (auto &v : row) v = rng.sym(2);
                quantize_row(kv.type_k, row.data(), kv.k_at(p, g), hd);
                for (auto &v : row) v = rng.sym(2);
                quantize_row(kv.type_v, row.data(), kv.v_at(p, g), hd);
                for (int d = 0; d < hd; d++) {
                    K[(size_t)((p * n_kv + g) * hd + d)] = ref_row_elem(kv.type_k, kv.k_at(p, g), d);
                    V[(size_t)((p * n_kv + g) * hd + d)] = ref_row_elem(kv.type_v, kv.v_at(p, g), d);
                }
            }
        std::vector<float> q((size_t)(n_new * n_head * hd)), out(q.size(), NAN);
        for (auto &v : q) v = rng.sym();
        const float scale = 1.0f / std::sqrt((float)hd);
        const int group = n_head / n_kv;
        for (int g = 0; g < n_kv; g++)
            for (int64_t i0 = 0; i0 < n_new; i0 += 7) {  // token chunks like the model's tasks
                const int64_t i1 = std::min(n_new, i0 + 7);
                std::vector<float> scr(attention_scratch(hd, group, i1 - i0, 1));
                attention(kv, g, g + 1, n_head, q.data(), n_head * hd, out.data(), n_head * hd, n_past, i0, i1, scale, scr.data());
            }
        // a call over several KV heads gives each head's bits alone (decode tasks take a run of heads, converted
        // position by position)
        for (const int per : {2, n_kv}) {
            if (n_kv % per) continue;
            std::vector<float> out_run(q.size(), NAN);
            for (int g = 0; g < n_kv; g += per)
                for (int64_t i0 = 0; i0 < n_new; i0 += 7) {
                    const int64_t i1 = std::min(n_new, i0 + 7);
                    std::vector<float> scr(attention_scratch(hd, group, i1 - i0, per));
                    attention(kv, g, g + per, n_head, q.data(), n_head * hd, out_run.data(), n_head * hd, n_past, i0, i1,
                              scale, scr.data());
                }
            CHECK(std::memcmp(out_run.data(), out.data(), sizeof(float) * out.size()) == 0);
        }
        for (int64_t i = 0; i < n_new; i++)
            for (int h = 0; h < n_head; h++) {
                const int g = h / group;
                const int64_t L = n_past + i + 1;
                std::vector<double> s((size_t)L);
                double mx = -1e300;
                for (int64_t p = 0; p < L; p++) {
                    double d = 0;
                    for (int e = 0; e < hd; e++)
                        d += (double)q[(size_t)((i * n_head + h) * hd + e)] * K[(size_t)((p * n_kv + g) * hd + e)];
                    s[(size_t)p] = d / std::sqrt((double)hd);
                    mx = std::max(mx, s[(size_t)p]);
                }
                double z = 0;
                for (auto &v : s) z += (v = std::exp(v - mx));
                for (int e = 0; e < hd; e++) {
                    double o = 0;
                    for (int64_t p = 0; p < L; p++) o += s[(size_t)p] * V[(size_t)((p * n_kv + g) * hd + e)];
                    CHECK_CLOSE(out[(size_t)((i * n_head + h) * hd + e)], o / z, 2e-6);
                }
            }
    }
}

// A token's attention output must not depend on which other tokens share its call: attention scores the tile for
// groups of query rows at once (dot_keys16_rows), so one row alone and the same row among 16 tokens x 4 heads (and
// among 7, which pads the last group) must give bitwise the same output. Head sizes: 128 and 48 (the wide kernels,
// 64-float slices and a tail) and 40 (no 16-key kernel).
TEST(attention_rows_alone_equal_batched_bitwise) {
    Rng rng(29);
    for (int hd : {128, 48, 40})
        for (uint32_t type : {DFL_TYPE_F16, DFL_TYPE_Q8_0, DFL_TYPE_F32}) {
            if (type == DFL_TYPE_Q8_0 && hd % 32 != 0) continue;
            const int n_head = 8, n_kv = 2, bs = 16, group = n_head / n_kv;
            const int64_t n_past = 101, n_new = 37, total = n_past + n_new;
            TestCache cache(type, n_kv, hd, bs, total, 5, 3);
            const PagedKV &kv = cache.kv;
            std::vector<float> row((size_t)hd);
            for (int64_t p = 0; p < total; p++)
                for (int g = 0; g < n_kv; g++) {
                    for (auto &v : row) v = rng.sym(2);
                    quantize_row(type, row.data(), kv.k_at(p, g), hd);
                    for (auto &v : row) v = rng.sym(2);
                    quantize_row(type, row.data(), kv.v_at(p, g), hd);
                }
            std::vector<float> q((size_t)(n_new * n_head * hd));
            for (auto &v : q) v = rng.sym();
            const float scale = 1.0f / std::sqrt((float)hd);
            auto run = [&](int64_t chunk) {
                std::vector<float> out(q.size(), NAN);
                for (int g = 0; g < n_kv; g++)
                    for (int64_t i0 = 0; i0 < n_new; i0 += chunk) {
                        const int64_t i1 = std::min(n_new, i0 + chunk);
                        std::vector<float> scr(attention_scratch(hd, group, i1 - i0, 1));
                        attention(kv, g, g + 1, n_head, q.data(), n_head * hd, out.data(), n_head * hd, n_past, i0, i1, scale,
                                  scr.data());
                    }
                return out;
            };
            const std::vector<float> alone = run(1), by16 = run(16), by7 = run(7);
            CHECK(std::memcmp(alone.data(), by16.data(), alone.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(alone.data(), by7.data(), alone.size() * sizeof(float)) == 0);
        }
}

// A tree verify's row sees its ancestors with its masked siblings between them; the same token decoded after its
// path sees the same keys side by side. Both must give the same bits (greedy speculative == plain greedy): the row's
// sums may not depend on where the masked entries sit. (A softmax summed in 16 lanes by position lost this.)
TEST(attention_tree_row_equals_its_path_decoded) {
    Rng rng(37);
    const int hd = 64, n_head = 4, n_kv = 2, bs = 16;
    const int64_t n_past = 45;
    // tree block: 12 nodes after the context; the row of node 11 sees nodes 0, 3, 4, 8 and itself (its path)
    const std::vector<int64_t> path = {0, 3, 4, 8, 11};
    const int64_t n_tree = 12;
    for (uint32_t type : {DFL_TYPE_F16, DFL_TYPE_F32}) {
        std::vector<std::vector<float>> ctx_k, ctx_v, node_k, node_v;  // per position, per kv head
        auto random_rows = [&](int64_t n, std::vector<std::vector<float>> &dst) {
            for (int64_t i = 0; i < n * n_kv; i++) {
                dst.emplace_back((size_t)hd);
                for (auto &v : dst.back()) v = rng.sym(2);
            }
        };
        random_rows(n_past, ctx_k), random_rows(n_past, ctx_v), random_rows(n_tree, node_k), random_rows(n_tree, node_v);
        // the context, then the given nodes at consecutive positions, written into a cache
        auto fill = [&](const std::vector<int64_t> &nodes, const PagedKV &kv) {
            for (int64_t p = 0; p < n_past + (int64_t)nodes.size(); p++)
                for (int g = 0; g < n_kv; g++) {
                    const size_t at = (size_t)((p < n_past ? p : nodes[(size_t)(p - n_past)]) * n_kv + g);
                    const auto &ks = p < n_past ? ctx_k : node_k, &vs = p < n_past ? ctx_v : node_v;
                    quantize_row(type, ks[at].data(), kv.k_at(p, g), hd);
                    quantize_row(type, vs[at].data(), kv.v_at(p, g), hd);
                }
        };
        std::vector<int64_t> all((size_t)n_tree);
        for (int64_t i = 0; i < n_tree; i++) all[(size_t)i] = i;
        TestCache tree_cache(type, n_kv, hd, bs, n_past + n_tree, 3, 1);
        TestCache line_cache(type, n_kv, hd, bs, n_past + (int64_t)path.size(), 3, 1);
        const PagedKV &tree = tree_cache.kv, &line = line_cache.kv;
        fill(all, tree);
        fill(path, line);
        std::vector<float> q((size_t)(n_tree * n_head * hd));
        for (auto &v : q) v = rng.sym();
        std::vector<uint64_t> vis((size_t)n_tree, 0);
        for (int64_t a : path) vis[(size_t)path.back()] |= 1ull << a;
        for (int64_t i = 0; i < n_tree; i++) vis[(size_t)i] |= 1ull << i;
        const float scale = 1.0f / std::sqrt((float)hd);
        const int64_t row = path.back(), depth = (int64_t)path.size() - 1;
        for (int g = 0; g < n_kv; g++) {
            std::vector<float> out_tree(q.size(), NAN), out_line((size_t)(n_head * hd), NAN);
            AttnMask tm;
            tm.n_new = n_tree;
            tm.vis = vis.data();
            std::vector<float> scr(attention_scratch(hd, n_head / n_kv, n_tree, 1));
            attention(tree, g, g + 1, n_head, q.data(), n_head * hd, out_tree.data(), n_head * hd, n_past, 0, n_tree, scale,
                      scr.data(), tm);
            AttnMask lm;
            lm.n_new = 1;
            attention(line, g, g + 1, n_head, q.data() + row * n_head * hd, n_head * hd, out_line.data(), n_head * hd,
                      n_past + depth, 0, 1, scale, scr.data(), lm);
            const int64_t h0 = (int64_t)g * (n_head / n_kv) * hd, n = (int64_t)(n_head / n_kv) * hd;
            CHECK(std::memcmp(out_tree.data() + row * n_head * hd + h0, out_line.data() + h0, sizeof(float) * n) == 0);
        }
    }
}

// The masks of a DFlash draft block (non-causal, sliding causal, sliding both ways) against a naive reference that
// applies the rule of device.h's AttnCall directly, not through attn_range.
TEST(attention_masks) {
    struct Case {
        const char *name;
        bool causal;
        int window;
        int64_t n_past, n_new;
    };
    const Case cases[] = {
        {"causal", true, 0, 70, 20},           {"non-causal", false, 0, 70, 20},
        {"non-causal, no past", false, 0, 0, 9}, {"sliding causal", true, 24, 70, 20},
        {"sliding causal, window > ctx", true, 500, 30, 10},
        {"sliding non-causal", false, 24, 70, 20}, {"sliding non-causal, window 1", false, 1, 40, 16},
        {"sliding non-causal, tile edge", false, 64, 130, 16},
    };
    Rng rng(29);
    const int n_head = 4, n_kv = 2, hd = 32, bs = 16, group = n_head / n_kv;
    for (const Case &c : cases) {
        const int64_t total = c.n_past + c.n_new;
        TestCache cache(DFL_TYPE_F32, n_kv, hd, bs, total, 5, 3);
        const PagedKV &kv = cache.kv;
        for (int64_t p = 0; p < total; p++)
            for (int g = 0; g < n_kv; g++)
                for (int d = 0; d < hd; d++) {
                    ((float *)kv.k_at(p, g))[d] = rng.sym(2);
                    ((float *)kv.v_at(p, g))[d] = rng.sym(2);
                }
        std::vector<float> q((size_t)(c.n_new * n_head * hd)), out(q.size(), NAN);
        for (auto &v : q) v = rng.sym();
        AttnMask mask;
        mask.causal = c.causal;
        mask.window = c.window;
        mask.n_new = c.n_new;
        for (int g = 0; g < n_kv; g++)
            for (int64_t i0 = 0; i0 < c.n_new; i0 += 7) {
                const int64_t i1 = std::min(c.n_new, i0 + 7);
                std::vector<float> scr(attention_scratch(hd, group, i1 - i0, 1));
                attention(kv, g, g + 1, n_head, q.data(), n_head * hd, out.data(), n_head * hd, c.n_past, i0, i1,
                          1.0f / std::sqrt((float)hd), scr.data(), mask);
            }
        int bad = 0;
        for (int64_t i = 0; i < c.n_new; i++)
            for (int h = 0; h < n_head; h++) {
                const int g = h / group;
                const int64_t p = c.n_past + i;
                std::vector<double> w((size_t)total, 0.0);
                double mx = -1e300;
                for (int64_t k = 0; k < total; k++) {
                    bool sees = c.causal ? k <= p : true;
                    if (c.window > 0) sees = sees && p - k < c.window && (c.causal || k - p < c.window);
                    if (!sees) continue;
                    double d = 0;
                    for (int e = 0; e < hd; e++) d += (double)q[(size_t)((i * n_head + h) * hd + e)] * ((float *)kv.k_at(k, g))[e];
                    w[(size_t)k] = d / std::sqrt((double)hd);
                    mx = std::max(mx, w[(size_t)k]);
                }
                double z = 0;
                for (int64_t k = 0; k < total; k++) {
                    bool sees = c.causal ? k <= p : true;
                    if (c.window > 0) sees = sees && p - k < c.window && (c.causal || k - p < c.window);
                    w[(size_t)k] = sees ? std::exp(w[(size_t)k] - mx) : 0.0;
                    z += w[(size_t)k];
                }
                for (int e = 0; e < hd; e++) {
                    double o = 0;
                    for (int64_t k = 0; k < total; k++) o += w[(size_t)k] * ((float *)kv.v_at(k, g))[e];
                    const float got = out[(size_t)((i * n_head + h) * hd + e)];
                    if (!(std::fabs(got - o / z) <= 2e-6)) bad++;
                }
            }
        if (bad) std::printf("  attention mask %s: %d values off\n", c.name, bad);
        CHECK(bad == 0);
    }
}

// Token trees (forward_tree): each new token sees the past and its own ancestors among the new tokens (AttnMask::vis),
// here with rows that straddle a 64-position tile, in chunks that split the tree.
TEST(attention_tree_mask) {
    Rng rng(31);
    const int n_head = 4, n_kv = 2, hd = 32, bs = 16, group = n_head / n_kv;
    for (int64_t n_past : {0, 57}) {
        const int64_t n_new = 13, total = n_past + n_new;
        std::vector<int32_t> par((size_t)n_new);
        std::vector<uint64_t> vis((size_t)n_new);
        for (int64_t i = 0; i < n_new; i++) {
            par[(size_t)i] = i == 0 ? -1 : (rng.next() % 3 == 0 ? (int32_t)i - 1 : (int32_t)(rng.next() % (uint64_t)i));
            vis[(size_t)i] = (i > 0 ? vis[(size_t)par[(size_t)i]] : 0) | (uint64_t)1 << i;
        }
        TestCache cache(DFL_TYPE_F32, n_kv, hd, bs, total, 3, 1);
        const PagedKV &kv = cache.kv;
        for (int64_t p = 0; p < total; p++)
            for (int g = 0; g < n_kv; g++)
                for (int d = 0; d < hd; d++) {
                    ((float *)kv.k_at(p, g))[d] = rng.sym(2);
                    ((float *)kv.v_at(p, g))[d] = rng.sym(2);
                }
        std::vector<float> q((size_t)(n_new * n_head * hd)), out(q.size(), NAN);
        for (auto &v : q) v = rng.sym();
        AttnMask mask;
        mask.n_new = n_new;
        mask.vis = vis.data();
        for (int g = 0; g < n_kv; g++)
            for (int64_t i0 = 0; i0 < n_new; i0 += 5) {
                const int64_t i1 = std::min(n_new, i0 + 5);
                std::vector<float> scr(attention_scratch(hd, group, i1 - i0, 1));
                attention(kv, g, g + 1, n_head, q.data(), n_head * hd, out.data(), n_head * hd, n_past, i0, i1,
                          1.0f / std::sqrt((float)hd), scr.data(), mask);
            }
        int bad = 0;
        for (int64_t i = 0; i < n_new; i++) {
            std::vector<bool> anc((size_t)n_new, false);
            for (int32_t a = (int32_t)i; a >= 0; a = par[(size_t)a]) anc[(size_t)a] = true;
            for (int h = 0; h < n_head; h++) {
                const int g = h / group;
                auto sees = [&](int64_t k) { return k < n_past || anc[(size_t)(k - n_past)]; };
                std::vector<double> w((size_t)total, 0.0);
                double mx = -1e300, z = 0;
                for (int64_t k = 0; k < total; k++) {
                    if (!sees(k)) continue;
                    double d = 0;
                    for (int e = 0; e < hd; e++) d += (double)q[(size_t)((i * n_head + h) * hd + e)] * ((float *)kv.k_at(k, g))[e];
                    w[(size_t)k] = d / std::sqrt((double)hd);
                    mx = std::max(mx, w[(size_t)k]);
                }
                for (int64_t k = 0; k < total; k++) {
                    w[(size_t)k] = sees(k) ? std::exp(w[(size_t)k] - mx) : 0.0;
                    z += w[(size_t)k];
                }
                for (int e = 0; e < hd; e++) {
                    double o = 0;
                    for (int64_t k = 0; k < total; k++) o += w[(size_t)k] * ((float *)kv.v_at(k, g))[e];
                    if (!(std::fabs(out[(size_t)((i * n_head + h) * hd + e)] - o / z) <= 2e-6)) bad++;
                }
            }
        }
        if (bad) std::printf("  attention tree mask, %lld past: %d values off\n", (long long)n_past, bad);
        CHECK(bad == 0);
    }
}

TEST(threadpool_runs_every_task_once_and_rethrows) {
    ThreadPool pool(4);
    std::vector<int> hits(1000, 0);
    for (int rep = 0; rep < 50; rep++) pool.parallel_for(1000, [&](int64_t t, int) { hits[(size_t)t]++; });
    CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 50; }));
    bool threw = false;
    try {
        pool.parallel_for(100, [&](int64_t t, int) {
            if (t == 42) throw std::runtime_error("boom");
        });
    } catch (const std::runtime_error &) {
        threw = true;
    }
    CHECK(threw);
    int after = 0;
    pool.parallel_for(10, [&](int64_t, int) { __atomic_add_fetch(&after, 1, __ATOMIC_RELAXED); });
    CHECK(after == 10);
}

namespace {

dfl_sampling greedy() {
    dfl_sampling p{};
    p.temperature = 0;
    p.repeat_penalty = 1;
    p.top_p = 1;
    p.penalty_last_n = -1;
    return p;
}

}  // namespace

TEST(sample_greedy_and_penalties) {
    const std::vector<float> l = {1.0f, 3.0f, 3.0f, -2.0f, 2.5f};
    uint64_t rng = 1;
    dfl_sampling p = greedy();
    CHECK(sample_token(l.data(), 5, p, nullptr, 0, &rng) == 1);  // tie -> lower id
    CHECK(rng == 1);                                              // greedy draws nothing
    const int32_t hist[] = {1, 2, 2};
    p.repeat_penalty = 2.0f;  // 3 -> 1.5 for ids 1 and 2
    CHECK(sample_token(l.data(), 5, p, hist, 3, &rng) == 4);
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 0.4f;  // id1: 3-0.4 = 2.6, id2: 3-0.8 = 2.2 -> id1 beats 2.5
    CHECK(sample_token(l.data(), 5, p, hist, 3, &rng) == 1);
    p.presence_penalty = 0.2f;  // id1: 2.4 < 2.5
    CHECK(sample_token(l.data(), 5, p, hist, 3, &rng) == 4);
    p.penalty_last_n = 0;  // penalties off
    CHECK(sample_token(l.data(), 5, p, hist, 3, &rng) == 1);
    p.penalty_last_n = 2;  // only {2, 2}
    CHECK(sample_token(l.data(), 5, p, hist, 3, &rng) == 1);
    const int32_t bad[] = {7};
    p.penalty_last_n = -1;
    bool threw = false;
    try {
        sample_token(l.data(), 5, p, bad, 1, &rng);
    } catch (const Error &) {
        threw = true;
    }
    CHECK(threw);
}

TEST(sample_distribution_and_filters) {
    const std::vector<float> l = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};  // p = 0.1 .. 0.4
    dfl_sampling p = greedy();
    p.temperature = 1;
    const int N = 40000;
    auto freq = [&](const dfl_sampling &sp, uint64_t seed) {
        std::vector<double> f(4, 0);
        uint64_t rng = seed;
        for (int i = 0; i < N; i++) f[(size_t)sample_token(l.data(), 4, sp, nullptr, 0, &rng)] += 1.0 / N;
        return f;
    };
    auto f = freq(p, 99);
    for (int i = 0; i < 4; i++) CHECK_CLOSE(f[(size_t)i], (i + 1) / 10.0, 0.01);
    // same seed, same draws
    CHECK(freq(p, 5) == freq(p, 5));
    // top-k 2 -> ids 3, 2 with 4:3
    dfl_sampling k = p;
    k.top_k = 2;
    f = freq(k, 1);
    CHECK_CLOSE(f[3], 4.0 / 7, 0.01);
    CHECK_CLOSE(f[2], 3.0 / 7, 0.01);
    CHECK(f[0] == 0 && f[1] == 0);
    // top-p 0.65 -> smallest prefix reaching 0.65: {3, 2} (0.7)
    dfl_sampling tp = p;
    tp.top_p = 0.65f;
    f = freq(tp, 2);
    CHECK(f[0] == 0 && f[1] == 0);
    CHECK_CLOSE(f[3], 4.0 / 7, 0.01);
    // min-p 0.45 -> keep p >= 0.18: {3, 2, 1}
    dfl_sampling mp = p;
    mp.min_p = 0.45f;
    f = freq(mp, 3);
    CHECK(f[0] == 0);
    CHECK_CLOSE(f[1], 2.0 / 9, 0.01);
    // temperature sharpens: T = 0.5 squares the odds
    dfl_sampling t = p;
    t.temperature = 0.5f;
    f = freq(t, 4);
    CHECK_CLOSE(f[3], 16.0 / 30, 0.01);
}

TEST(swiglu_gated_norm_and_gates) {
    Rng rng(41);
    const int n = 53;  // three vectors of 16 and a tail
    std::vector<float> g((size_t)n), u((size_t)n), x((size_t)n), z((size_t)n), w((size_t)n);
    for (int i = 0; i < n; i++) {
        g[(size_t)i] = rng.sym(6);
        u[(size_t)i] = rng.sym(2);
        x[(size_t)i] = rng.sym(3);
        z[(size_t)i] = rng.sym(5);
        w[(size_t)i] = 1 + rng.sym(0.2f);
    }
    // the vector swiglu's edges: both zeros, past exp's range both ways, in the tail too
    for (auto [i, v] : {std::pair{3, 0.0f}, {4, -0.0f}, {20, -120.0f}, {21, 95.0f}, {50, -88.0f}, {52, 40.0f}})
        g[(size_t)i] = v;
    auto dsilu = [](double v) { return v / (1 + std::exp(-v)); };
    std::vector<float> s = g;
    swiglu(s.data(), u.data(), n);
    for (int i = 0; i < n; i++)
        CHECK_CLOSE(s[(size_t)i], dsilu(g[(size_t)i]) * u[(size_t)i],
                    1e-6 * std::max(12.0, 2.0 * std::fabs(g[(size_t)i])));
    double ss = 0;
    for (float v : x) ss += (double)v * v;
    const double r = 1 / std::sqrt(ss / n + 1e-6);
    std::vector<float> y = x;
    gated_rmsnorm(y.data(), z.data(), w.data(), n, 1e-6f);
    for (int i = 0; i < n; i++)
        CHECK_CLOSE(y[(size_t)i], x[(size_t)i] * r * w[(size_t)i] * dsilu(z[(size_t)i]), 1e-6 * 20);
    for (double v : {-30.0, -3.0, 0.0, 0.5, 19.0, 25.0}) {
        CHECK_CLOSE(sigmoid((float)v), 1 / (1 + std::exp(-v)), 1e-7);
        CHECK_CLOSE(softplus((float)v), v > 20 ? v : std::log1p(std::exp(v)), 1e-6 * std::max(1.0, std::fabs(v)));
    }
}

// topk_rows against sorting the whole row: ties across spans (lowest id first), NaN and -inf skipped, fewer finite
// values than k padded, the log-sum-exp in long double; and the same bits from a pool of 1 and of 3 threads.
TEST(topk_rows_against_a_full_sort) {
    Rng rng(31);
    ThreadPool one(1), three(3);
    const int64_t rows = 3;
    for (int64_t n : {int64_t(10), int64_t(40000), int64_t(151936)}) {
        for (int k : {1, 5, 64, 100}) {
            std::vector<float> x((size_t)(rows * n));
            for (auto &v : x) v = (float)(int)(rng.sym(50));  // integers: many ties
            x[7] = std::nanf("");
            x[3] = -INFINITY;
            for (int64_t i = 0; i < n; i++) x[(size_t)(2 * n + i)] = i % 3 == 0 ? 1.5f : -INFINITY;  // few finite
            std::vector<int32_t> ids1((size_t)(rows * k)), ids3(ids1.size());
            std::vector<float> vals1((size_t)(rows * k)), vals3(vals1.size()), lse1((size_t)rows), lse3((size_t)rows);
            topk_rows(one, x.data(), rows, n, k, ids1.data(), vals1.data(), lse1.data());
            topk_rows(three, x.data(), rows, n, k, ids3.data(), vals3.data(), lse3.data());
            for (int64_t r = 0; r < rows; r++) {
                const float *row = x.data() + r * n;
                std::vector<int32_t> order;
                long double mx = -INFINITY, sum = 0;
                for (int64_t i = 0; i < n; i++)
                    if (row[i] == row[i] && row[i] != -INFINITY) order.push_back((int32_t)i), mx = std::max(mx, (long double)row[i]);
                for (int32_t i : order) sum += std::exp((long double)row[i] - mx);
                std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
                for (int j = 0; j < k; j++) {
                    const size_t at = (size_t)(r * k + j);
                    const int32_t want = j < (int)order.size() ? order[(size_t)j] : -1;
                    CHECK(ids1[at] == want);
                    CHECK(vals1[at] == (want < 0 ? -INFINITY : row[want]));
                    CHECK(ids3[at] == ids1[at] && vals3[at] == vals1[at]);
                }
                CHECK_CLOSE(lse1[(size_t)r], (double)(mx + std::log(sum)), 1e-6 * std::fabs((double)mx) + 1e-6);
                CHECK(lse3[(size_t)r] == lse1[(size_t)r]);
            }
        }
    }
}

// The Gated DeltaNet layer's ops (Qwen3.5) against straightforward float64 implementations: the causal conv and the
// delta rule, recurrent and chunked.
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "test.h"

using namespace dfl;
using namespace dfltest;

TEST(conv1d_silu_causal) {
    Rng rng(17);
    const int K = 4, n = 6;
    for (int C : {10, 37}) {  // the tail lanes alone, then a full vector and a tail
        std::vector<float> win((size_t)((K - 1 + n) * C)), w((size_t)(C * K)), wt((size_t)(C * K)), out((size_t)(n * C));
        for (auto &v : win) v = rng.sym();
        for (auto &v : w) v = rng.sym();
        for (int c = 0; c < C; c++)
            for (int j = 0; j < K; j++) wt[(size_t)(j * C + c)] = w[(size_t)(c * K + j)];
        const float *head = win.data(), *x = win.data() + (size_t)(K - 1) * C;
        conv1d_silu(head, x, C, 0, n, C, wt.data(), K, out.data());
        for (int t = 0; t < n; t++)
            for (int c = 0; c < C; c++) {
                double a = 0;
                for (int j = 0; j < K; j++) a += (double)w[(size_t)(c * K + j)] * win[(size_t)((t + j) * C + c)];
                CHECK_CLOSE(out[(size_t)(t * C + c)], a / (1 + std::exp(-a)), 1e-6);
            }
        // rows made in other runs (a task's), or one token at a time from its own window, give the same bits
        std::vector<float> parts((size_t)(n * C)), one((size_t)C);
        conv1d_silu(head, x, C, 0, 2, C, wt.data(), K, parts.data());
        conv1d_silu(head, x, C, 2, n, C, wt.data(), K, parts.data());
        CHECK(std::memcmp(parts.data(), out.data(), parts.size() * sizeof(float)) == 0);
        // x's rows inside wider ones (a fused product's part where it lies) give the same bits
        const int xs = C + 5;
        std::vector<float> wide((size_t)(n * xs), 99.0f), strided((size_t)(n * C));
        for (int r = 0; r < n; r++) std::memcpy(wide.data() + (size_t)r * xs, x + (size_t)r * C, sizeof(float) * (size_t)C);
        conv1d_silu(head, wide.data(), xs, 0, n, C, wt.data(), K, strided.data());
        CHECK(std::memcmp(strided.data(), out.data(), out.size() * sizeof(float)) == 0);
        const int t = 4;
        conv1d_silu(win.data() + (size_t)t * C, win.data() + (size_t)(t + K - 1) * C, C, 0, 1, C, wt.data(), K, one.data());
        CHECK(std::memcmp(one.data(), out.data() + (size_t)t * C, one.size() * sizeof(float)) == 0);
    }
}

namespace {

struct GdnCase {
    int dk, dv;
    int64_t n;
    std::vector<float> q, k, v, g, beta, S0;
};

GdnCase gdn_case(int dk, int dv, int64_t n, Rng &rng) {
    GdnCase c{dk, dv, n, {}, {}, {}, {}, {}, {}};
    c.q.resize((size_t)(n * dk));
    c.k.resize((size_t)(n * dk));
    c.v.resize((size_t)(n * dv));
    c.g.resize((size_t)n);
    c.beta.resize((size_t)n);
    c.S0.resize((size_t)(dk * dv));
    for (auto &x : c.v) x = rng.sym();
    for (int64_t t = 0; t < n; t++) {
        // normalised keys, scaled queries, decays in (0.2, 1)
        double sk = 0, sq = 0;
        for (int a = 0; a < dk; a++) {
            c.k[(size_t)(t * dk + a)] = rng.sym();
            c.q[(size_t)(t * dk + a)] = rng.sym();
            sk += c.k[(size_t)(t * dk + a)] * (double)c.k[(size_t)(t * dk + a)];
            sq += c.q[(size_t)(t * dk + a)] * (double)c.q[(size_t)(t * dk + a)];
        }
        for (int a = 0; a < dk; a++) {
            c.k[(size_t)(t * dk + a)] /= (float)std::sqrt(sk);
            c.q[(size_t)(t * dk + a)] /= (float)(std::sqrt(sq) * std::sqrt((double)dk));
        }
        c.g[(size_t)t] = (float)std::log(0.2 + 0.8 * rng.uniform());
        c.beta[(size_t)t] = (float)rng.uniform();
    }
    for (auto &x : c.S0) x = rng.sym(0.5f);
    return c;
}

// S_t = a_t S + k (beta (v - a_t S^T k))^T; o_t = S_t^T q, in float64.
void gdn_ref(const GdnCase &c, std::vector<double> &S, std::vector<double> &out, std::vector<double> *states) {
    const int dk = c.dk, dv = c.dv;
    S.assign(c.S0.begin(), c.S0.end());
    out.assign((size_t)(c.n * dv), 0);
    for (int64_t t = 0; t < c.n; t++) {
        const double a = std::exp((double)c.g[(size_t)t]);
        for (auto &x : S) x *= a;
        for (int j = 0; j < dv; j++) {
            double u = 0;
            for (int i = 0; i < dk; i++) u += S[(size_t)(i * dv + j)] * c.k[(size_t)(t * dk + i)];
            const double delta = c.beta[(size_t)t] * (c.v[(size_t)(t * dv + j)] - u);
            for (int i = 0; i < dk; i++) S[(size_t)(i * dv + j)] += c.k[(size_t)(t * dk + i)] * delta;
        }
        for (int j = 0; j < dv; j++) {
            double o = 0;
            for (int i = 0; i < dk; i++) o += S[(size_t)(i * dv + j)] * c.q[(size_t)(t * dk + i)];
            out[(size_t)(t * dv + j)] = o;
        }
        if (states) states->insert(states->end(), S.begin(), S.end());
    }
}

}  // namespace

TEST(gdn_recurrent_and_chunked_match_reference) {
    Rng rng(23);
    for (auto dims : {std::pair<int, int>{16, 16}, {16, 32}, {32, 16}, {24, 40}}) {  // 40: a 32-column block and 8 more
        for (int64_t n : {1, 2, 63, 64, 65, 150}) {
            const GdnCase c = gdn_case(dims.first, dims.second, n, rng);
            std::vector<double> Sref, oref, stref;
            gdn_ref(c, Sref, oref, &stref);
            const int dk = c.dk, dv = c.dv;
            // recurrent, all at once and token by token (the state after each)
            std::vector<float> S(c.S0), out((size_t)(n * dv)), S1(c.S0), out1((size_t)(n * dv));
            gdn_recurrent(S.data(), dk, dv, c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), n, out.data());
            for (size_t i = 0; i < out.size(); i++) CHECK_CLOSE(out[i], oref[i], 2e-5);
            for (size_t i = 0; i < S.size(); i++) CHECK_CLOSE(S[i], Sref[i], 2e-5);
            for (int64_t t = 0; t < n; t++) {
                gdn_recurrent(S1.data(), dk, dv, c.q.data() + t * dk, c.k.data() + t * dk, c.v.data() + t * dv,
                              c.g.data() + t, c.beta.data() + t, 1, out1.data() + t * dv);
                for (size_t i = 0; i < S1.size(); i++) CHECK_CLOSE(S1[i], stref[(size_t)t * S1.size() + i], 2e-5);
            }
            // chunked
            std::vector<float> S2(c.S0), out2((size_t)(n * dv)), scr(gdn_chunk_scratch(dk, dv));
            gdn_chunked(S2.data(), dk, dv, c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), n, out2.data(),
                        scr.data());
            for (size_t i = 0; i < out2.size(); i++) CHECK_CLOSE(out2[i], oref[i], 2e-5);
            for (size_t i = 0; i < S2.size(); i++) CHECK_CLOSE(S2[i], Sref[i], 2e-5);
        }
    }
}

// gdn_recurrent's register form gives the bits of the plain row loops (float, each product then its add, rows in
// order), which the recording and replaying paths rely on matching token for token.
TEST(gdn_recurrent_equals_row_loops_bitwise) {
    Rng rng(29);
    for (int dv : {16, 32, 64, 128}) {
        const int dk = 128;
        const int64_t n = 3;
        const GdnCase c = gdn_case(dk, dv, n, rng);
        std::vector<float> S(c.S0), out((size_t)(n * dv));
        gdn_recurrent(S.data(), dk, dv, c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), n, out.data());
        std::vector<float> R(c.S0), ro((size_t)(n * dv)), u((size_t)dv);
        bool same = true;
        for (int64_t t = 0; t < n; t++) {
            const float decay = std::exp(c.g[(size_t)t]);
            const float *kt = c.k.data() + t * dk, *qt = c.q.data() + t * dk, *vt = c.v.data() + t * dv;
            std::fill(u.begin(), u.end(), 0.0f);
            for (int a = 0; a < dk; a++)
                for (int b = 0; b < dv; b++) {
                    float &r = R[(size_t)(a * dv + b)];
                    r = r * decay;
                    u[(size_t)b] = u[(size_t)b] + kt[a] * r;
                }
            for (int b = 0; b < dv; b++) u[(size_t)b] = c.beta[(size_t)t] * (vt[b] - u[(size_t)b]);
            float *o = ro.data() + t * dv;
            std::fill(o, o + dv, 0.0f);
            for (int a = 0; a < dk; a++)
                for (int b = 0; b < dv; b++) {
                    float &r = R[(size_t)(a * dv + b)];
                    r = r + kt[a] * u[(size_t)b];
                    o[b] = o[b] + qt[a] * r;
                }
        }
        same &= std::memcmp(R.data(), S.data(), R.size() * sizeof(float)) == 0;
        same &= std::memcmp(ro.data(), out.data(), ro.size() * sizeof(float)) == 0;
        if (!same) std::printf("  dv %d: bits differ\n", dv);
        CHECK(same);
    }
}

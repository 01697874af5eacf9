// The Gated DeltaNet layer's ops, CUDA against the CPU device (test_cuda_ops' gdn group): the conv, the gates and the
// delta rule over chains, recorded entries and token trees; odd batches read x, b and a as rows of a fused product's
// buffer. Bounds as test_cuda_ops.cpp's header says (conv and gates 1e-5, the delta rule 1e-4).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test.h"
#include "ops/device.h"
#include "test.h"
#include "test_batch.h"

namespace dfltest {
namespace {

using namespace dfl;

struct GdnShape {
    int n_k, n_v, dk, dv, K;
};

// Where the ops keep a recording entry's records: a buffer of floats(entry) floats on both devices for each recording
// entry (none for the others, nor for any when `on` is false), and each device's array of their addresses
// (BatchMeta::rec_window, rec_state, rec_in).
struct RecordBuffers {
    std::vector<std::unique_ptr<Dual>> bufs;
    std::unique_ptr<Dual> addr_c, addr_g;
    template <class Floats>
    RecordBuffers(const Batch &b, bool on, Floats floats) {
        std::vector<float *> c, g;
        for (const auto &e : b.ents) {
            bufs.emplace_back(on && e.record ? new Dual((size_t)floats(e) * 4) : nullptr);
            c.push_back(bufs.back() ? bufs.back()->cp() : nullptr);
            g.push_back(bufs.back() ? bufs.back()->gp() : nullptr);
        }
        addr_c.reset(new Dual(c));
        addr_g.reset(new Dual(g));
    }
    float **at(bool gpu) const { return gpu ? addr_g->gp<float *>() : addr_c->cp<float *>(); }
    void compare_all(const std::string &what, double bound) const {
        for (const auto &p : bufs)
            if (p) compare(what, *p, bound);
    }
};

// A gdn call of shape s on inputs cv (rows of C), g and beta.
GdnCall gdn_call(const GdnShape &s, int C, const float *cv, const float *g, const float *beta) {
    return dfl::gdn_call(cv, C, s.n_k, s.n_v, s.dk, s.dv, g, beta);
}

// The tests' layer: recurrent layer 1 of 2 (records), 4 slots.
constexpr int kRecLayers = 2, kRecLayer = 1, kSlots = 4;

// A conv call of shape s: input rows xs apart (0: C), the slots' conv states conv_stride apart.
ConvCall conv_call(const GdnShape &s, int C, const float *x, int64_t xs, float *out, const float *w, float *conv,
                   int64_t conv_stride) {
    ConvCall c;
    c.x = x;
    c.x_stride = xs;
    c.out = out;
    c.w = w;
    c.C = C;
    c.K = s.K;
    c.conv = conv;
    c.slot_stride = conv_stride;
    c.rec_layer = kRecLayer;
    c.n_rec = kRecLayers;
    return c;
}

// The gates of shape s on cv, b and a rows `pitch` apart (0: n_v), into beta and g.
GdnGates gates_call(const GdnShape &s, int C, float *cv, const float *b, const float *a, int64_t pitch,
                    const float *ssm_a, const float *dt_bias, float *beta, float *g) {
    GdnGates q;
    q.cv = cv;
    q.C = C;
    q.n_k = s.n_k;
    q.dk = s.dk;
    q.n_v = s.n_v;
    q.b = b;
    q.a = a;
    q.b_stride = q.a_stride = pitch;
    q.ssm_a = ssm_a;
    q.dt_bias = dt_bias;
    q.beta = beta;
    q.g = g;
    return q;
}

// The tests' layer's gdn call: outputs into out, the slots' states state_stride apart, the recording entries' inputs
// copied into their records.
GdnCall layer_gdn_call(const GdnShape &s, int C, const float *cv, const float *g, const float *beta, float *out,
                       float *state, int64_t state_stride) {
    GdnCall c = gdn_call(s, C, cv, g, beta);
    c.out = out;
    c.state = state;
    c.slot_stride = state_stride;
    c.rec_layer = kRecLayer;
    c.n_rec = kRecLayers;
    c.rec_inputs = true;
    return c;
}

// The entries be in blocks of 16 tokens, with token trees where trees has them.
Batch gdn_batch(const std::vector<Batch::Ent> &be, Rng &r, const std::vector<std::vector<int32_t>> &trees) {
    Batch b(be, 16, r);
    if (!trees.empty()) b.set_trees(trees);
    return b;
}

// A conv row's channels: the q and k heads, then the v heads.
int channels(const GdnShape &s) { return 2 * s.n_k * s.dk + s.n_v * s.dv; }

// The batch's recording entries (BatchMeta::n_record).
int32_t recording(const std::vector<Batch::Ent> &be) {
    return (int32_t)std::count_if(be.begin(), be.end(), [](const Batch::Ent &e) { return e.record; });
}

// The recording entries' slots keep the state before; their records get their inputs (GdnCall::rec_inputs: cv rows,
// g, beta into BatchMeta::rec_in, compared exactly). A tree's rec_state holds what its schedule sets aside, on the GPU
// in shared memory unless DFL_CUDA_GDN_TREE_SMEM=0: not compared.
void run_gdn_case(const GdnShape &s, const std::vector<Batch::Ent> &be, Rng &r,
                  const std::vector<std::vector<int32_t>> &trees = {}) {
    const Batch b = gdn_batch(be, r, trees);
    const int64_t T = b.T;
    const int C = channels(s), n_rec = kRecLayers, n_slots = kSlots;
    char nm[160];
    std::snprintf(nm, sizeof nm, "nk=%d nv=%d dk=%d dv=%d T=%lld ents=%zu%s", s.n_k, s.n_v, s.dk, s.dv, (long long)T,
                  b.ents.size(), std::any_of(be.begin(), be.end(), [](const Batch::Ent &e) { return e.record; }) ? " rec" : "");
    const std::string tag = std::string(nm) + (T % 2 == 1 ? " fused" : "");

    // conv
    const int64_t conv_stride = (int64_t)(s.K - 1) * C + 5;  // slots need not be packed
    // odd batches read x, b and a where a fused product leaves them: rows of a wider buffer (ConvCall::x_stride,
    // GdnGates::b_stride / a_stride)
    const bool fused = T % 2 == 1;
    const int64_t xs = fused ? C + 2 * s.n_v + 7 : C;
    Dual x(rand_vec(r, (size_t)(T * xs))), w(rand_vec(r, (size_t)C * s.K, 0.5f)), conv(rand_vec(r, (size_t)(n_slots * conv_stride)));
    Dual cv((size_t)(T * C) * 4);
    const RecordBuffers recw(b, true, [&](const Batch::Ent &e) { return (int64_t)n_rec * (s.K - 1 + e.n) * C; });
    for (int dev = 0; dev < 2; dev++) {
        const bool g = dev == 1;
        const ConvCall c = conv_call(s, C, x.p(g), fused ? xs : 0, cv.p(g), w.p(g), conv.p(g), conv_stride);
        BatchMeta m = b.meta(g);
        m.rec_window = recw.at(g);
        (g ? g_gpu : g_cpu)->conv1d_silu(m, c);
    }
    compare("conv1d_silu out " + tag, cv, 1e-5);
    compare("conv1d_silu state " + tag, conv, 0);
    recw.compare_all("conv1d_silu rec_window " + tag, 0);

    // gates (on the CPU's conv output, so each op is judged alone)
    cv.set(cv.read<uint8_t>(false).data());
    Dual bb(rand_vec(r, (size_t)(T * s.n_v), 3.0f)), aa(rand_vec(r, (size_t)(T * s.n_v), 30.0f));
    if (fused) {  // b and a after each row's C floats of x
        std::vector<float> f = x.read(false), bv = bb.read(false), av = aa.read(false);
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < s.n_v; j++) {
                f[(size_t)(t * xs + C + j)] = bv[(size_t)(t * s.n_v + j)];
                f[(size_t)(t * xs + C + s.n_v + j)] = av[(size_t)(t * s.n_v + j)];
            }
        x.set(f.data());
    }
    Dual ssm_a(rand_vec(r, (size_t)s.n_v, 1.0f)), dt(rand_vec(r, (size_t)s.n_v, 1.0f));
    Dual beta((size_t)(T * s.n_v) * 4), gl((size_t)(T * s.n_v) * 4);
    for (int dev = 0; dev < 2; dev++) {
        const bool g = dev == 1;
        const GdnGates q = gates_call(s, C, cv.p(g), fused ? x.p(g) + C : bb.p(g), fused ? x.p(g) + C + s.n_v : aa.p(g),
                                      fused ? xs : 0, ssm_a.p(g), dt.p(g), beta.p(g), gl.p(g));
        (g ? g_gpu : g_cpu)->gdn_gates(T, q);
    }
    compare("gdn_gates cv " + tag, cv, 1e-5);
    compare("gdn_gates beta " + tag, beta, 1e-5);
    compare("gdn_gates g " + tag, gl, 1e-5);

    // the delta rule, with decays kept in (0, 1] as the model's are
    cv.set(cv.read<uint8_t>(false).data());
    std::vector<float> gv((size_t)(T * s.n_v)), bv((size_t)(T * s.n_v));
    for (auto &v : gv) v = -0.3f * (float)r.uniform();
    for (auto &v : bv) v = (float)r.uniform();
    Dual gd(gv), bd(bv);
    const int64_t head = (int64_t)s.dk * s.dv, sf = (int64_t)s.n_v * head, state_stride = sf + 3;
    Dual state(rand_vec(r, (size_t)(n_slots * state_stride), 0.1f));
    Dual out((size_t)(T * s.n_v * s.dv) * 4);
    const RecordBuffers recs(b, true, [&](const Batch::Ent &) { return (int64_t)kTreeSlots * n_rec * sf; });
    const RecordBuffers ins(b, true, [&](const Batch::Ent &e) { return (int64_t)n_rec * e.n * (C + 2 * s.n_v); });
    for (int dev = 0; dev < 2; dev++) {
        const bool g = dev == 1;
        const GdnCall c = layer_gdn_call(s, C, cv.p(g), gd.p(g), bd.p(g), out.p(g), state.p(g), state_stride);
        BatchMeta m = b.meta(g);
        m.rec_state = recs.at(g);
        m.rec_in = ins.at(g);
        m.n_record = recording(be);
        (g ? g_gpu : g_cpu)->gdn(m, c);
    }
    compare("gdn out " + tag, out, 1e-4);
    compare("gdn state " + tag, state, 1e-4);
    ins.compare_all("gdn rec_in " + tag, 0);
}

// The layer's conv, gates and delta rule in turn, as QwenModel::gdn_layer calls them: x, b and a where a fused product
// leaves them (odd batches), decays from a negative ssm_a as the model's; the outputs, states, window records and input
// records compared. A tree's entries run the parallel form on the GPU (launch_gdn).
void run_gdn_layer_case(const GdnShape &s, const std::vector<Batch::Ent> &be, Rng &r,
                             const std::vector<std::vector<int32_t>> &trees = {}) {
    const Batch b = gdn_batch(be, r, trees);
    const int64_t T = b.T;
    const int C = channels(s), n_rec = kRecLayers, n_slots = kSlots;
    const int32_t n_record = recording(be);
    char nm[160];
    std::snprintf(nm, sizeof nm, "gdn layer nk=%d nv=%d dk=%d dv=%d K=%d T=%lld ents=%zu recording=%d%s", s.n_k,
                  s.n_v, s.dk, s.dv, s.K, (long long)T, be.size(), (int)n_record, trees.empty() ? "" : " trees");
    const std::string tag(nm);

    const bool fused = T % 2 == 1;
    const int64_t xs = fused ? C + 2 * s.n_v + 7 : C;
    std::vector<float> xv = rand_vec(r, (size_t)(T * xs)), av = rand_vec(r, (size_t)(T * s.n_v)),
                       bv = rand_vec(r, (size_t)(T * s.n_v), 3.0f);
    if (fused)  // b and a after each row's C floats of x
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < s.n_v; j++) {
                xv[(size_t)(t * xs + C + j)] = bv[(size_t)(t * s.n_v + j)];
                xv[(size_t)(t * xs + C + s.n_v + j)] = av[(size_t)(t * s.n_v + j)];
            }
    std::vector<float> ssm(rand_vec(r, (size_t)s.n_v));
    for (auto &v : ssm) v = -0.05f - 0.25f * std::fabs(v);
    const int64_t conv_stride = (int64_t)(s.K - 1) * C + 5;
    const int64_t head = (int64_t)s.dk * s.dv, sf = (int64_t)s.n_v * head, state_stride = sf + 3;
    Dual x(xv), bb(bv), aa(av), w(rand_vec(r, (size_t)C * s.K, 0.5f));
    Dual conv(rand_vec(r, (size_t)(n_slots * conv_stride)));
    Dual ssm_a(ssm), dt(rand_vec(r, (size_t)s.n_v, 0.5f)), state(rand_vec(r, (size_t)(n_slots * state_stride), 0.1f));
    Dual cv((size_t)(T * C) * 4), beta((size_t)(T * s.n_v) * 4), gl((size_t)(T * s.n_v) * 4);
    Dual out((size_t)(T * s.n_v * s.dv) * 4);
    const RecordBuffers recw(b, true, [&](const Batch::Ent &e) { return (int64_t)n_rec * (s.K - 1 + e.n) * C; });
    const RecordBuffers recs(b, true, [&](const Batch::Ent &) { return (int64_t)kTreeSlots * n_rec * sf; });
    const RecordBuffers ins(b, true, [&](const Batch::Ent &e) { return (int64_t)n_rec * e.n * (C + 2 * s.n_v); });
    for (int dev = 0; dev < 2; dev++) {
        const bool g = dev == 1;
        const ConvCall c = conv_call(s, C, x.p(g), fused ? xs : 0, cv.p(g), w.p(g), conv.p(g), conv_stride);
        const GdnGates q = gates_call(s, C, cv.p(g), fused ? x.p(g) + C : bb.p(g), fused ? x.p(g) + C + s.n_v : aa.p(g),
                                      fused ? xs : 0, ssm_a.p(g), dt.p(g), beta.p(g), gl.p(g));
        const GdnCall d = layer_gdn_call(s, C, cv.p(g), gl.p(g), beta.p(g), out.p(g), state.p(g), state_stride);
        BatchMeta m = b.meta(g);
        m.rec_window = recw.at(g);
        m.rec_state = recs.at(g);
        m.rec_in = ins.at(g);
        m.n_record = n_record;
        Device *const on = g ? g_gpu : g_cpu;
        on->conv1d_silu(m, c);
        on->gdn_gates(T, q);
        on->gdn(m, d);
    }
    compare(tag + " out", out, 1e-4);
    compare(tag + " state", state, 1e-4);
    compare(tag + " conv state", conv, 0);
    recw.compare_all(tag + " rec_window", 0);
    ins.compare_all(tag + " rec_in", 1e-5);
}

// A replay of records (QwenModel::replay_records): one gdn call over `layers` layers of one entry of k tokens, each
// layer's inputs (rows [kin][C], g [kin][n_v], beta [kin][n_v]: the recorded forward's kin tokens) and states at a
// fixed stride, from the slot's states, no outputs; the first k rows, or (path) rows along a tree path
// (GdnCall::in_rows); the slot's states compared (and the other slots, untouched).
void run_gdn_replay_case(const GdnShape &s, int k, int layers, bool path, Rng &r) {
    Batch b({{k, 0, 2, false}}, 16, r);
    const int C = 2 * s.n_k * s.dk + s.n_v * s.dv, kin = k + 5;
    const int64_t rw = C + 2 * s.n_v, sf = (int64_t)s.n_v * s.dk * s.dv, slot_stride = layers * sf + 8;
    std::vector<float> in((size_t)(layers * kin * rw));
    for (int l = 0; l < layers; l++) {
        float *p = in.data() + (size_t)(l * kin * rw);
        for (int64_t i = 0; i < kin * C; i++) p[i] = 0.1f * (float)(2 * r.uniform() - 1);
        for (int64_t i = 0; i < kin * s.n_v; i++) {
            p[kin * C + i] = -0.3f * (float)r.uniform();
            p[kin * (C + s.n_v) + i] = (float)r.uniform();
        }
    }
    std::vector<int32_t> rows((size_t)k);
    for (int t = 0; t < k; t++) rows[(size_t)t] = (t * 3 + 1) % kin;  // (a path's nodes, ascending or not)
    Dual ind(in), state(rand_vec(r, (size_t)(4 * slot_stride), 0.1f));
    Dual rowd(rows);
    for (int dev = 0; dev < 2; dev++) {
        const bool g = dev == 1;
        GdnCall c = gdn_call(s, C, ind.p(g), ind.p(g) + kin * C, ind.p(g) + kin * (C + s.n_v));
        c.state = state.p(g);
        c.slot_stride = slot_stride;
        c.exact = true;
        c.layers = layers;
        c.layer_in = kin * rw;
        c.layer_state = sf;
        if (path) c.in_rows = rowd.p<int32_t>(g);
        (g ? g_gpu : g_cpu)->gdn(b.meta(g), c);
    }
    char nm[120];
    std::snprintf(nm, sizeof nm, "gdn replay nk=%d nv=%d dk=%d dv=%d k=%d layers=%d%s", s.n_k, s.n_v, s.dk, s.dv, k,
                  layers, path ? " path" : "");
    compare(std::string(nm) + " state", state, 1e-4);
}

// The DeltaNet's fused input projection and its conv (Device::matmul_conv1d_silu) for one decode token: on the GPU
// (with DFL_CUDA_CONV_FOLD=1 the conv runs in the q8_0 product's kernel) against the CPU closely, and bit for bit
// against the GPU's two ops apart: the product's rows, the conv's outputs and the slot's stored inputs after.
// n_out: 4480 rows take two rows a warp, 1600 one; C below or at n_out.
void run_conv_fold_case(int64_t n_out, int C, int K, Rng &r) {
    const int64_t n_in = 4096;
    DualWeight W(DFL_TYPE_Q8_0, n_out, n_in, r);
    Weight wg = W.wg;
    g_gpu->prepare_weight(wg);
    const Batch b({{1, 9, 2, false}}, 16, r);
    const int64_t conv_stride = (int64_t)(K - 1) * C + 5;
    const std::vector<float> conv0 = rand_vec(r, (size_t)(kSlots * conv_stride));
    Dual X(rand_vec(r, (size_t)n_in)), w(rand_vec(r, (size_t)C * K, 0.5f)), conv(conv0), conv2(conv0);
    Dual Y((size_t)n_out * 4), Y2((size_t)n_out * 4), cv((size_t)C * 4), cv2((size_t)C * 4);
    const GdnShape s{1, 1, 1, 1, K};
    // (the conv reads each entry's window record, none here)
    const RecordBuffers recw(b, false, [](const Batch::Ent &) { return int64_t(0); });
    auto meta = [&](bool g) {
        BatchMeta m = b.meta(g);
        m.rec_window = recw.at(g);
        return m;
    };
    for (bool g : {false, true})
        (g ? g_gpu : g_cpu)->matmul_conv1d_silu(g ? wg : W.wc, X.p(g), 1, Y.p(g), meta(g),
                                                conv_call(s, C, nullptr, 0, cv.p(g), w.p(g), conv.p(g), conv_stride));
    // the GPU's ops apart
    g_gpu->matmul(wg, X.gp(), 1, Y2.gp());
    g_gpu->conv1d_silu(meta(true), conv_call(s, C, Y2.gp(), n_out, cv2.gp(), w.gp(), conv2.gp(), conv_stride));
    const std::string tag = std::to_string(n_out) + "x" + std::to_string(n_in) + " C=" + std::to_string(C) +
                            " K=" + std::to_string(K);
    compare("matmul_conv1d_silu product " + tag, Y, 1.5e-2);
    compare("matmul_conv1d_silu out " + tag, cv, 1.5e-2);
    same_bits("matmul_conv1d_silu product = the ops apart (GPU) " + tag, Y.read(true), Y2.read(true));
    same_bits("matmul_conv1d_silu out = the ops apart (GPU) " + tag, cv.read(true), cv2.read(true));
    same_bits("matmul_conv1d_silu state = the ops apart (GPU) " + tag, conv.read(true), conv2.read(true));
}

}  // namespace

void test_gdn() {
    Rng r(4);
    const GdnShape shapes[] = {{2, 4, 128, 128, 4}, {2, 6, 64, 64, 4}, {1, 3, 32, 48, 3}};
    const std::vector<std::vector<Batch::Ent>> batches = {
        {{1, 10, 2, false}},
        {{3, 4, 1, true}},
        {{5, 0, 0, false}, {1, 7, 3, true}, {11, 2, 2, false}},
        {{120, 0, 0, false}, {10, 0, 1, true}},
    };
    for (const GdnShape &s : shapes)
        for (const auto &be : batches) run_gdn_case(s, be, r);
    // token trees (recorded entries, each token continuing from its parent) beside ordinary entries; a full binary
    // tree of 63 tokens sets five states aside at once, more than the staged kernel's shared memory keeps
    std::vector<int32_t> binary63(63);
    for (int i = 0; i < 63; i++) binary63[(size_t)i] = i == 0 ? -1 : (i - 1) / 2;
    for (const GdnShape &s : shapes) {
        run_gdn_case(s, {{5, 0, 0, false}, {12, 7, 1, true}, {3, 2, 2, true}, {20, 0, 3, true}}, r,
                     {{}, random_tree(r, 12), {}, random_tree(r, 20)});
        run_gdn_case(s, {{63, 4, 1, true}, {40, 0, 2, true}}, r, {binary63, random_tree(r, 40)});
    }
    // a verify's records of 20 tokens (two chunks of the staged kernel's 16)
    for (const GdnShape &s : shapes)
        run_gdn_case(s, {{5, 0, 0, false}, {1, 7, 3, true}, {11, 2, 2, false}, {20, 0, 1, true}}, r);
    // the layer's three ops in turn: batches whose entries all record (chains and trees of up to 32 tokens: the
    // parallel form's by default, only the trees' with DFL_CUDA_GDN_PARALLEL=2), and batches with longer or unrecorded entries
    for (const GdnShape &s : shapes) {
        run_gdn_layer_case(s, {{3, 4, 1, true}}, r);
        run_gdn_layer_case(s, {{16, 0, 0, true}, {5, 7, 2, true}}, r);
        run_gdn_layer_case(s, {{32, 3, 3, true}}, r);
        run_gdn_layer_case(s, {{12, 7, 1, true}, {23, 0, 3, true}, {4, 2, 2, true}}, r,
                           {random_tree(r, 12), random_tree(r, 23), {}});
        run_gdn_layer_case(s, {{5, 0, 0, false}, {16, 2, 2, true}}, r);
        run_gdn_layer_case(s, {{40, 0, 1, true}, {1, 5, 2, true}}, r);
    }
    // replays of records: the first k rows, and rows along a tree path
    for (const GdnShape &s : shapes)
        for (int k : {1, 7, 17})
            for (bool path : {false, true}) run_gdn_replay_case(s, k, 3, path, r);
    // a decode token's projection and conv in one call
    run_conv_fold_case(4480, 2560, 4, r);
    run_conv_fold_case(1600, 1600, 3, r);
}

}  // namespace dfltest

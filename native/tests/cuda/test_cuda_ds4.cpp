// The DeepSeek V4 ops of the CUDA device against the CPU device (ops/cpu/ds4_ops.cpp), op by op, on random inputs of
// several sizes: decode (one token per entry) and multi-token chunks, several sequences in shuffled slots and KV
// blocks, window rings that wrap, compressor windows that close inside a batch. Outputs are poisoned (0xFF bytes, a
// NaN) before each run so an unwritten output fails; in-place state (rings, compressor buffers, row pools) starts from
// the same random bytes on both devices and is compared whole afterwards. Without a GPU it says so and exits 0.
//
// Bounds: relative L2 error 1e-5 for the f32 ops (summation order and exp / cos ulps differ); the indexer's selection
// and the router's ids must be identical (their kernels round as the CPU does); the routed experts inherit the matmul
// bounds of test_cuda_ops (1e-5 one row per expert or f32 weights, 3e-3 for several rows of a quantized expert).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "arch/deepseek4.h"
#include "common.h"
#include "ops/device.h"
#include "cuda_test.h"
#include "rand_rows.h"
#include "test.h"
#include "test_batch.h"

namespace {

using namespace dfl;
using dfltest::Rng;
using dfltest::type_row_bytes;

using dfltest::compare;
using dfltest::compare_ids;
using dfltest::same_bits;
using dfltest::Dual;
using dfltest::g_cases;
using dfltest::g_cpu;
using dfltest::g_gpu;
using dfltest::rand_vec;

// The shared batch with two spare KV blocks and token ids below 97 (the random streams these cases were written with).
struct Batch : dfltest::Batch {
    Batch(std::vector<Ent> e, int bs, Rng &r) : dfltest::Batch(std::move(e), bs, r, 2, 97) {}
};

// Exact equality of int32 outputs.
Device *dev(bool gpu) { return gpu ? g_gpu : g_cpu; }

std::vector<float> inv_freq(int rope_dim, float base) {
    std::vector<float> f((size_t)rope_dim / 2);
    for (int i = 0; i < rope_dim / 2; i++) f[(size_t)i] = 1.0f / std::pow(base, (float)(2 * i) / (float)rope_dim);
    return f;
}

// Decode steps, multi-token chunks and mixed batches over the given window / ratio structure.
std::vector<std::vector<Batch::Ent>> batch_shapes(int ratio) {
    const int R = ratio > 0 ? ratio : 4;
    return {
        {{1, 0, 0}},                                            // first token
        {{1, R - 1, 2}},                                        // decode closing a window
        {{1, 5 * R + 2, 1}, {1, 3 * R - 1, 3}, {1, 7, 0}},      // decode, several sequences
        {{13, 3, 1}},                                           // chunk closing windows inside it
        {{2 * R + 3, 0, 0}, {5, R * 9 + 1, 2}, {1, 40, 3}},     // mixed
        {{3 * R + 1, 4 * R - 1, 4}, {R, 2 * R, 1}},             // windows aligned and not
        {{150, 37, 1}},                                         // long chunk: rings wrap inside it
    };
}


// ---- hyper-connections and RoPE ----

// hc_pre of T tokens of N = 4 streams of D channels (20 Sinkhorn iterations) on device g's copies of the buffers.
HcPreCall hc_pre_call(bool g, const Dual &mix, const Dual &base, const Dual &scale, const Dual &X, int64_t T, int64_t D,
                      const Dual &x, const Dual &post, const Dual &comb) {
    HcPreCall c;
    c.mix = mix.p(g);
    c.base = base.p(g);
    c.scale = scale.p(g);
    c.X = X.p(g);
    c.T = T;
    c.D = D;
    c.N = 4;
    c.iters = 20;
    c.x = x.p(g);
    c.post = post.p(g);
    c.comb = comb.p(g);
    return c;
}

void test_hc() {
    for (int64_t T : {1, 5, 33})
        for (int64_t D : {64, 200}) {
            Rng r((uint64_t)(T * 131 + D));
            const int N = 4, M = (2 + N) * N;
            Dual mix(rand_vec(r, (size_t)(T * M), 2.0f)), base(rand_vec(r, (size_t)M)), scale(rand_vec(r, 3, 1.5f));
            Dual X(rand_vec(r, (size_t)(T * N * D))), F(rand_vec(r, (size_t)(T * D))), F2(rand_vec(r, (size_t)(T * D)));
            Dual x((size_t)(T * D) * 4), post((size_t)(T * N) * 4), comb((size_t)(T * N * N) * 4), out((size_t)(T * N * D) * 4);
            Dual out2((size_t)(T * N * D) * 4);
            Dual hmix(rand_vec(r, (size_t)(T * N), 2.0f)), hbase(rand_vec(r, (size_t)N)), hscale(rand_vec(r, 1)), y((size_t)(T * D) * 4);
            for (bool g : {false, true}) {
                dev(g)->hc_pre(hc_pre_call(g, mix, base, scale, X, T, D, x, post, comb));
                HcPostCall p;
                p.F = F.p(g);
                p.X = X.p(g);
                p.post = post.p(g);
                p.comb = comb.p(g);
                p.T = T;
                p.D = D;
                p.N = N;
                p.out = out.p(g);
                dev(g)->hc_post(p);
                p.F2 = F2.p(g);  // the shared expert's output added inside
                p.out = out2.p(g);
                dev(g)->hc_post(p);
                HcHeadCall h;
                h.mix = hmix.p(g);
                h.base = hbase.p(g);
                h.scale = hscale.p(g);
                h.X = X.p(g);
                h.T = T;
                h.D = D;
                h.N = N;
                h.y = y.p(g);
                dev(g)->hc_head(h);
            }
            const std::string sh = " T=" + std::to_string(T) + " D=" + std::to_string(D);
            compare("hc_pre x" + sh, x, 1e-5);
            compare("hc_pre post" + sh, post, 1e-5);
            compare("hc_pre comb" + sh, comb, 1e-5);
            compare("hc_post" + sh, out, 1e-5);
            compare("hc_post with F2" + sh, out2, 1e-5);
            compare("hc_head" + sh, y, 1e-5);
        }
    // An HC site with its norm folded (Device::hc_fold, HcPreCall::norm): hc_pre scales the raw streams' mixing
    // product by their RMSNorm. Both devices get the same product (the CPU's), so the comparison is hc_pre's own: the
    // random mixing rows give products of ~100, whose exponents in Sinkhorn turn the two matmuls' last-bit
    // differences into ~1e-4 (12-05 call). That folded equals normed-then-multiplied is the CPU unit test's.
    for (int64_t T : {1, 3})
        for (int64_t D : {64, 4096}) {  // 4096: V4's width, 16,384 stream values a token
            Rng r((uint64_t)(T * 7 + D));
            const int N = 4, M = (2 + N) * N;
            const int64_t ND = N * D;
            dfltest::DualWeight fn(DFL_TYPE_F16, M, ND, r);
            Dual base(rand_vec(r, (size_t)M)), scale(rand_vec(r, 3, 1.5f)), X(rand_vec(r, (size_t)(T * ND), 3.0f));
            Dual mix((size_t)(T * M) * 4);
            Dual x((size_t)(T * D) * 4), post((size_t)(T * N) * 4), comb((size_t)(T * N * N) * 4);
            dev(false)->matmul(fn.wc, X.cp(), T, mix.cp());
            mix.set(mix.read(false).data());
            for (bool g : {false, true}) {
                HcPreCall c = hc_pre_call(g, mix, base, scale, X, T, D, x, post, comb);
                c.norm = true;
                c.norm_eps = 1e-6f;
                dev(g)->hc_pre(c);
            }
            const std::string sh = " (norm folded) T=" + std::to_string(T) + " D=" + std::to_string(D);
            compare("hc_pre x" + sh, x, 1e-5);
            compare("hc_pre post" + sh, post, 1e-5);
            compare("hc_pre comb" + sh, comb, 1e-5);
        }
}

void test_rope() {
    struct S {
        int64_t rows;
        int n_head, head_dim, rope_dim;
    };
    for (const S &s : {S{1, 64, 512, 64}, S{7, 3, 96, 32}, S{40, 1, 512, 64}})
        for (bool inverse : {false, true}) {
            Rng r((uint64_t)(s.rows * 7 + s.n_head + inverse));
            const int64_t stride = (int64_t)s.n_head * s.head_dim + 3;  // rows not packed
            std::vector<int32_t> pos((size_t)s.rows);
            for (auto &p : pos) p = (int32_t)(r.next() % 200000);
            Dual x(rand_vec(r, (size_t)(s.rows * stride))), dpos(pos), inv(inv_freq(s.rope_dim, 160000.0f));
            for (bool g : {false, true}) {
                RopeTailCall c;
                c.x = x.p(g);
                c.rows = s.rows;
                c.row_stride = stride;
                c.n_head = s.n_head;
                c.head_dim = s.head_dim;
                c.rope_dim = s.rope_dim;
                c.pos = dpos.p<int32_t>(g);
                c.inv_freq = inv.p(g);
                c.inverse = inverse;
                dev(g)->rope_tail(c);
            }
            compare("rope_tail rows=" + std::to_string(s.rows) + " h=" + std::to_string(s.n_head) + " hd=" +
                        std::to_string(s.head_dim) + (inverse ? " inverse" : ""),
                    x, 1e-5);
        }
    // the head rows' norm and RoPE as one op (Device::norm_rope_tail; the fused kernel unless DFL_CUDA_NORM_ROPE=0):
    // DeepSeek V4's query heads (64 x 512) and K = V row (1 x 512), weighted and not, packed rows
    for (const S &s : {S{1, 64, 512, 64}, S{3, 64, 512, 64}, S{40, 1, 512, 64}, S{2, 5, 96, 32}})
        for (bool weighted : {false, true}) {
            Rng r((uint64_t)(s.rows * 11 + s.n_head + weighted));
            std::vector<int32_t> pos((size_t)s.rows);
            for (auto &p : pos) p = (int32_t)(r.next() % 200000);
            Dual x(rand_vec(r, (size_t)(s.rows * s.n_head * s.head_dim), 3.0f)), dpos(pos),
                inv(inv_freq(s.rope_dim, 160000.0f)), w(rand_vec(r, (size_t)s.head_dim));
            for (bool g : {false, true}) {
                RopeTailCall c;
                c.x = x.p(g);
                c.rows = s.rows;
                c.row_stride = (int64_t)s.n_head * s.head_dim;
                c.n_head = s.n_head;
                c.head_dim = s.head_dim;
                c.rope_dim = s.rope_dim;
                c.pos = dpos.p<int32_t>(g);
                c.inv_freq = inv.p(g);
                dev(g)->norm_rope_tail(weighted ? w.p(g) : nullptr, 1e-6f, c);
            }
            compare("norm_rope_tail rows=" + std::to_string(s.rows) + " h=" + std::to_string(s.n_head) + " hd=" +
                        std::to_string(s.head_dim) + (weighted ? " weighted" : ""),
                    x, 1e-5);
        }
}

// ---- compressor ----

void run_compress(int ratio, bool overlap, int hd, const Batch &b, Rng &r, const std::string &what) {
    const int width = hd * (overlap ? 2 : 1), rope_dim = std::min(hd, 16);
    const int64_t stride = (int64_t)(overlap ? 4 : 2) * ratio * width + 5;
    const int rpb = ds4_rows_per_block(b.block_size, ratio);
    const int64_t pool = (int64_t)b.n_blocks * rpb;
    Dual kv(rand_vec(r, (size_t)(b.T * width))), gate(rand_vec(r, (size_t)(b.T * width), 3.0f)),
        ape(rand_vec(r, (size_t)ratio * width)), norm(rand_vec(r, (size_t)hd)), inv(inv_freq(rope_dim, 160000.0f));
    Dual state(rand_vec(r, (size_t)(b.n_slots * stride), 2.0f)), rows(rand_vec(r, (size_t)(pool * hd)));
    for (bool g : {false, true}) {
        Ds4CompressCall c;
        c.kv = kv.p(g);
        c.gate = gate.p(g);
        c.ape = ape.p(g);
        c.norm = norm.p(g);
        c.inv_freq = inv.p(g);
        c.ratio = ratio;
        c.head_dim = hd;
        c.rope_dim = rope_dim;
        c.overlap = overlap;
        c.state = state.p(g);
        c.slot_stride = stride;
        c.rows = rows.p(g);
        c.block_size = b.block_size;
        c.rows_per_block = rpb;
        dev(g)->ds4_compress(b.meta(g), c);
    }
    const std::string name = what + " ratio=" + std::to_string(ratio) + " hd=" + std::to_string(hd) + " " + b.str();
    compare("ds4_compress rows " + name, rows, 1e-5);
    compare("ds4_compress state " + name, state, 1e-6);
}

void test_compress() {
    Rng r(11);
    for (const auto &shape : batch_shapes(4)) {
        run_compress(4, true, 64, Batch(shape, 16, r), r, "csa");
        run_compress(4, true, 32, Batch(shape, 16, r), r, "indexer");
    }
    for (const auto &shape : batch_shapes(8)) run_compress(8, false, 64, Batch(shape, 16, r), r, "hca");
    run_compress(128, false, 128, Batch({{300, 100, 1}, {1, 255, 0}}, 16, r), r, "hca");
    run_compress(128, false, 128, Batch({{1, 127, 0}, {129, 0, 2}}, 64, r), r, "hca");
}

// ---- indexer ----

void run_indexer(int H, int hd, int top_k, const Batch &b, Rng &r, bool ties) {
    const int ratio = 4, rpb = ds4_rows_per_block(b.block_size, ratio);
    const int64_t pool = (int64_t)b.n_blocks * rpb;
    std::vector<float> keys = rand_vec(r, (size_t)(pool * hd));
    if (ties)  // duplicate rows score equal: the lower row must win
        for (int64_t i = 1; i < pool; i += 3) std::copy(keys.begin(), keys.begin() + hd, keys.begin() + i * hd);
    Dual q(rand_vec(r, (size_t)(b.T * H * hd))), w(rand_vec(r, (size_t)(b.T * H))), dkeys(keys);
    Dual sel((size_t)(b.T * top_k) * 4);
    for (bool g : {false, true}) {
        Ds4IndexerCall c;
        c.q = q.p(g);
        c.w = w.p(g);
        c.keys = dkeys.p(g);
        c.n_head = H;
        c.head_dim = hd;
        c.ratio = ratio;
        c.top_k = top_k;
        c.head_scale = 1.0f / std::sqrt((float)H);
        c.dot_scale = 1.0f / std::sqrt((float)hd);
        c.block_size = b.block_size;
        c.rows_per_block = rpb;
        c.sel = sel.p<int32_t>(g);
        dev(g)->ds4_indexer_topk(b.meta(g), c);
    }
    compare_ids("ds4_indexer_topk h=" + std::to_string(H) + " hd=" + std::to_string(hd) + " k=" + std::to_string(top_k) +
                    (ties ? " ties " : " ") + b.str(),
                sel);
}

void test_indexer() {
    Rng r(23);
    for (const auto &shape : batch_shapes(4)) {
        run_indexer(4, 32, 8, Batch(shape, 16, r), r, false);
        run_indexer(8, 64, 16, Batch(shape, 16, r), r, true);
    }
    run_indexer(64, 128, 512, Batch({{1, 5000, 0}, {3, 2047, 1}, {1, 100, 2}}, 64, r), r, false);
    run_indexer(64, 128, 64, Batch({{64, 3000, 1}}, 16, r), r, true);
}

// ---- attention and ring ----

// with_fold: the call's unrotate and ring_write set (ring_write where every entry runs one token, as the plan does;
// the kernel folds them in unless DFL_CUDA_DS4_ATTN_FOLD=0), else the two ops after it.
void run_attention(int H, int hd, int window, int ratio, bool with_sel, const Batch &b, Rng &r, bool with_fold = false) {
    const int rpb = ratio ? ds4_rows_per_block(b.block_size, ratio) : 1, top_k = 12;
    const int64_t stride = (int64_t)window * hd + 7, pool = (int64_t)b.n_blocks * rpb;
    std::vector<int32_t> sel;
    for (int64_t t = 0; t < b.T; t++) {  // a valid selection: distinct visible rows ascending, padded with -1
        const int e = b.ent[(size_t)t];
        const int64_t nvis = ratio ? ((int64_t)b.len0[(size_t)e] + (t - b.t0[(size_t)e]) + 1) / ratio : 0;
        std::vector<int32_t> s;
        for (int64_t w = 0; w < nvis; w++)
            if (nvis <= top_k || r.next() % (uint64_t)nvis < (uint64_t)top_k) s.push_back((int32_t)w);
        s.resize(std::min<size_t>(s.size(), (size_t)top_k));
        s.resize((size_t)top_k, -1);
        sel.insert(sel.end(), s.begin(), s.end());
    }
    Dual Q(rand_vec(r, (size_t)(b.T * H * hd))), kv(rand_vec(r, (size_t)(b.T * hd))),
        ring(rand_vec(r, (size_t)(b.n_slots * stride))), comp(rand_vec(r, (size_t)std::max<int64_t>(1, pool * hd))),
        dsel(sel), sinks(rand_vec(r, (size_t)H, 2.0f)), out((size_t)(b.T * H * hd) * 4);
    const int rope_dim = std::min(hd, 64);
    Dual inv(inv_freq(rope_dim, 10000.0f));
    const bool one_each = b.T == (int64_t)b.t0.size();
    // one token's output through the grouped product right after (a decode step's wo_a): on the GPU it takes the
    // attention's staged quantization with DFL_CUDA_DS4_ATTN_QUANT=1, which must give its own quantizer's bits
    const bool grouped = with_fold && b.T == 1;
    const int groups = 2;
    std::unique_ptr<dfltest::DualWeight> wo;
    Dual y1((size_t)(groups * 64) * 4), y2((size_t)(groups * 64) * 4);
    if (grouped) {
        wo = std::make_unique<dfltest::DualWeight>(DFL_TYPE_Q8_0, groups * 64, (int64_t)H * hd / groups, r);
        g_gpu->prepare_weight(wo->wg);
    }
    for (bool g : {false, true}) {
        Ds4AttnCall c;
        c.Q = Q.p(g);
        c.kv = kv.p(g);
        c.ring = ring.p(g);
        c.slot_stride = stride;
        c.window = window;
        c.comp = ratio ? comp.p(g) : nullptr;
        c.ratio = ratio;
        c.block_size = b.block_size;
        c.rows_per_block = rpb;
        c.sel = with_sel ? dsel.p<int32_t>(g) : nullptr;
        c.top_k = top_k;
        c.sinks = sinks.p(g);
        c.n_head = H;
        c.head_dim = hd;
        c.scale = 1.0f / std::sqrt((float)hd);
        c.out = out.p(g);
        if (with_fold) {
            c.unrotate = inv.p(g);
            c.rope_dim = rope_dim;
            c.ring_write = one_each;
        }
        dev(g)->ds4_attention(b.meta(g), c);
        if (grouped) dev(g)->matmul_grouped(g ? wo->wg : wo->wc, groups, out.p(g), y1.p(g));
        if (!c.ring_write) dev(g)->ds4_ring_write(b.meta(g), ds4_ring_write_call(c));
    }
    if (grouped) {
        g_gpu->matmul_grouped(wo->wg, groups, out.gp(), y2.gp());  // nothing staged now: its own quantizer
        compare("ds4_attention then matmul_grouped h=" + std::to_string(H) + " hd=" + std::to_string(hd), y1, 1.5e-2);
        same_bits("matmul_grouped on the attention's staging = on its own quantizer (GPU) h=" + std::to_string(H), y1.read(true),
                  y2.read(true));
    }
    const std::string name = "h=" + std::to_string(H) + " hd=" + std::to_string(hd) + " win=" + std::to_string(window) +
                             " ratio=" + std::to_string(ratio) + (with_sel ? " sel " : " ") +
                             (with_fold ? (one_each ? "unrotate+ring " : "unrotate ") : "") + b.str();
    compare("ds4_attention " + name, out, 1e-5);
    compare("ds4_ring_write " + name, ring, 0.0);
}

void test_attention() {
    Rng r(37);
    for (const auto &shape : batch_shapes(4)) {
        run_attention(4, 64, 8, 0, false, Batch(shape, 16, r), r);
        run_attention(4, 64, 16, 4, true, Batch(shape, 16, r), r);
        run_attention(3, 96, 8, 8, false, Batch(shape, 16, r), r);
        run_attention(4, 64, 8, 4, true, Batch(shape, 16, r), r, true);
    }
    run_attention(64, 512, 128, 4, true, Batch({{1, 700, 0}, {1, 129, 1}, {1, 50, 2}}, 64, r), r, true);
    run_attention(64, 512, 128, 4, true, Batch({{1, 700, 0}, {1, 129, 1}, {2, 50, 2}}, 64, r), r);
    run_attention(64, 512, 128, 128, false, Batch({{1, 1000, 1}, {20, 300, 0}}, 64, r), r);
}

// ---- MoE ----

// hc_pre with the sub-block's RMSNorm (Device::hc_pre_norm; on the GPU one kernel with DFL_CUDA_HC_PRE_NORM=1)
// against the CPU's two ops, and on the GPU bit for bit against its own two ops, the q8_0 product after it included
// (it takes the staged int8 rows either way).
void test_hc_pre_norm() {
    for (int64_t T : {1, 5})
        for (int64_t D : {64, 4096}) {
            Rng r((uint64_t)(T * 11 + D));
            const int N = 4, M = (2 + N) * N;
            Dual mix(rand_vec(r, (size_t)(T * M), 2.0f)), base(rand_vec(r, (size_t)M)), scale(rand_vec(r, 3, 0.2f));
            Dual X(rand_vec(r, (size_t)(T * N * D), 3.0f)), w(rand_vec(r, (size_t)D, 1.5f));
            Dual x((size_t)(T * D) * 4), post((size_t)(T * N) * 4), comb((size_t)(T * N * N) * 4), y((size_t)(T * D) * 4);
            Dual x2((size_t)(T * D) * 4), y2((size_t)(T * D) * 4), p1((size_t)(T * 64) * 4), p2((size_t)(T * 64) * 4);
            Dual post2((size_t)(T * N) * 4), comb2((size_t)(T * N * N) * 4);  // the two ops' own (not the fused kernel's)
            dfltest::DualWeight W(DFL_TYPE_Q8_0, 64, D, r);
            g_gpu->prepare_weight(W.wg);  // repacked: its product takes int8 activations (a staged quantization)
            const std::string sh = " T=" + std::to_string(T) + " D=" + std::to_string(D);
            for (bool norm : {false, true}) {
                for (bool g : {false, true}) {
                    HcPreCall c = hc_pre_call(g, mix, base, scale, X, T, D, x, post, comb);
                    c.norm = norm;
                    c.norm_eps = 1e-6f;
                    dev(g)->hc_pre_norm(c, w.p(g), 1e-6f, y.p(g));
                    dev(g)->matmul(g ? W.wg : W.wc, y.p(g), T, p1.p(g));
                }
                HcPreCall c = hc_pre_call(true, mix, base, scale, X, T, D, x2, post2, comb2);
                c.norm = norm;
                c.norm_eps = 1e-6f;
                g_gpu->hc_pre(c);
                g_gpu->rmsnorm(x2.gp(), w.gp(), y2.gp(), T, D, 1e-6f);
                g_gpu->matmul(W.wg, y2.gp(), T, p2.gp());
                const std::string n = sh + (norm ? " norm folded" : "");
                compare("hc_pre_norm x" + n, x, 1e-5);
                compare("hc_pre_norm post" + n, post, 1e-5);
                compare("hc_pre_norm comb" + n, comb, 1e-5);
                compare("hc_pre_norm y" + n, y, 1e-5);
                same_bits("hc_pre_norm x = hc_pre's (GPU)" + n, x.read(true), x2.read(true));
                same_bits("hc_pre_norm post = hc_pre's (GPU)" + n, post.read(true), post2.read(true));
                same_bits("hc_pre_norm comb = hc_pre's (GPU)" + n, comb.read(true), comb2.read(true));
                same_bits("hc_pre_norm y = rmsnorm's (GPU)" + n, y.read(true), y2.read(true));
                same_bits("hc_pre_norm's product = rmsnorm's (GPU)" + n, p1.read(true), p2.read(true));
            }
        }
}

// hc_post with the next site's mixing product left as parts (Device::hc_post_mix; on the GPU with
// DFL_CUDA_HC_POST_MIX=1): the merged streams against the CPU's hc_post, the parts' sums against the CPU's product
// of those streams and their sums of squares; then hc_pre on the parts (both devices given the GPU's) against each
// other. Without the switch the GPU makes no parts and only the streams are compared.
void test_hc_post_mix() {
    for (uint32_t type : {DFL_TYPE_F16, DFL_TYPE_F32})
        for (int64_t T : {1, 3})
            for (int64_t D : {64, 4096})
                for (int variant = 0; variant < 3; variant++) {  // F, F + F2, the routed pairs + F2
                    Rng r((uint64_t)(T * 17 + D + variant * 5 + type));
                    const int N = 4, M = (2 + N) * N, K = 3;
                    const int64_t ND = N * D;
                    dfltest::DualWeight fn(type, M, ND, r);
                    Dual X(rand_vec(r, (size_t)(T * ND))), F(rand_vec(r, (size_t)(T * D))), F2(rand_vec(r, (size_t)(T * D)));
                    Dual pairs(rand_vec(r, (size_t)(T * K * D))), pw(rand_vec(r, (size_t)(T * K)));
                    Dual post(rand_vec(r, (size_t)(T * N), 2.0f)), comb(rand_vec(r, (size_t)(T * N * N)));
                    Dual out((size_t)(T * ND) * 4), parts((size_t)(T * ND) * 4), mix((size_t)(T * M) * 4);
                    HcPostCall c;
                    c.T = T;
                    c.D = D;
                    c.N = N;
                    c.k = K;
                    int n_parts = 0;
                    for (bool g : {false, true}) {
                        c.F = variant == 2 ? nullptr : F.p(g);
                        c.F2 = variant > 0 ? F2.p(g) : nullptr;
                        c.pairs = variant == 2 ? pairs.p(g) : nullptr;
                        c.pair_w = pw.p(g);
                        c.X = X.p(g);
                        c.post = post.p(g);
                        c.comb = comb.p(g);
                        c.out = out.p(g);
                        if (g)
                            n_parts = g_gpu->hc_post_mix(c, fn.wg, parts.gp());
                        else
                            g_cpu->hc_post(c);
                    }
                    const std::string sh = std::string(type == DFL_TYPE_F16 ? " f16" : " f32") + " T=" + std::to_string(T) +
                                           " D=" + std::to_string(D) + (variant == 1 ? " F2" : variant == 2 ? " pairs+F2" : "");
                    compare("hc_post_mix streams" + sh, out, 1e-5);
                    if (n_parts == 0) continue;
                    // the parts summed here in part order, against the CPU's product and sum of squares
                    g_cpu->matmul(fn.wc, out.cp(), T, mix.cp());
                    const std::vector<float> pg = parts.read(true), ref = mix.read(false), streams = out.read(false);
                    std::vector<float> got((size_t)(T * M)), ss((size_t)T), ss_ref((size_t)T, 0.0f);
                    for (int64_t t = 0; t < T; t++) {
                        for (int i = 0; i <= M; i++) {
                            float s = 0.0f;
                            for (int p = 0; p < n_parts; p++) s += pg[(size_t)((t * n_parts + p) * (M + 1) + i)];
                            (i < M ? got[(size_t)(t * M + i)] : ss[(size_t)t]) = s;
                        }
                        for (int64_t i = 0; i < ND; i++) ss_ref[(size_t)t] += streams[(size_t)(t * ND + i)] * streams[(size_t)(t * ND + i)];
                    }
                    compare("hc_post_mix product" + sh, got, ref, 1e-5);
                    compare("hc_post_mix sum of squares" + sh, ss, ss_ref, 1e-5);
                    // hc_pre on the GPU's parts, on both devices
                    std::vector<float> pv = parts.read(true);
                    g_cpu->to_device(parts.cp(), pv.data(), pv.size() * sizeof(float));
                    Dual base(rand_vec(r, (size_t)M)), scale(rand_vec(r, 3, 0.2f));
                    Dual x((size_t)(T * D) * 4), post2((size_t)(T * N) * 4), comb2((size_t)(T * N * N) * 4);
                    for (bool g : {false, true}) {
                        HcPreCall h = hc_pre_call(g, mix, base, scale, out, T, D, x, post2, comb2);
                        h.mix = nullptr;
                        h.parts = parts.p(g);
                        h.n_parts = n_parts;
                        h.norm = true;
                        h.norm_eps = 1e-6f;
                        dev(g)->hc_pre(h);
                    }
                    compare("hc_pre on parts x" + sh, x, 1e-5);
                    compare("hc_pre on parts post" + sh, post2, 1e-5);
                    compare("hc_pre on parts comb" + sh, comb2, 1e-5);
                    // hc_pre_norm on the parts (one kernel with DFL_CUDA_HC_PRE_NORM=1) against hc_pre, then rmsnorm, on the GPU
                    Dual w(rand_vec(r, (size_t)D, 1.5f)), y((size_t)(T * D) * 4), y2((size_t)(T * D) * 4);
                    Dual x3((size_t)(T * D) * 4), post3((size_t)(T * N) * 4), comb3((size_t)(T * N * N) * 4);
                    HcPreCall h = hc_pre_call(true, mix, base, scale, out, T, D, x3, post3, comb3);
                    h.mix = nullptr;
                    h.parts = parts.gp();
                    h.n_parts = n_parts;
                    h.norm = true;
                    h.norm_eps = 1e-6f;
                    g_gpu->hc_pre_norm(h, w.gp(), 1e-6f, y.gp());
                    g_gpu->rmsnorm(x.gp(), w.gp(), y2.gp(), T, D, 1e-6f);
                    g_cpu->rmsnorm(x.cp(), w.cp(), y.cp(), T, D, 1e-6f);
                    compare("hc_pre_norm on parts y" + sh, y, 1e-5);
                    same_bits("hc_pre_norm on parts x = hc_pre's (GPU)" + sh, x3.read(true), x.read(true));
                    same_bits("hc_pre_norm on parts post = hc_pre's (GPU)" + sh, post3.read(true), post2.read(true));
                    same_bits("hc_pre_norm on parts comb = hc_pre's (GPU)" + sh, comb3.read(true), comb2.read(true));
                    same_bits("hc_pre_norm on parts y = rmsnorm's (GPU)" + sh, y.read(true), y2.read(true));
                }
}

void run_route(int E, int k, bool bias, bool norm, int k_table, int64_t T, Rng &r) {
    const int vocab = 97;
    std::vector<int32_t> table;
    if (k_table)  // each token's row: k_table distinct experts
        for (int v = 0; v < vocab; v++) {
            std::vector<int32_t> ex((size_t)E);
            for (int i = 0; i < E; i++) ex[(size_t)i] = i;
            for (int i = 0; i < k_table; i++) std::swap(ex[(size_t)i], ex[(size_t)i + (size_t)(r.next() % (uint64_t)(E - i))]);
            table.insert(table.end(), ex.begin(), ex.begin() + k_table);
        }
    else
        table.push_back(0);
    std::vector<int32_t> toks((size_t)T);
    for (auto &t : toks) t = (int32_t)(r.next() % vocab);
    Dual logits(rand_vec(r, (size_t)(T * E), 4.0f)), b(rand_vec(r, (size_t)E, 0.5f)), dtable(table), dtoks(toks);
    Dual ids((size_t)(T * k) * 4), wts((size_t)(T * k) * 4);
    for (bool g : {false, true}) {
        MoeRouteCall c;
        c.logits = logits.p(g);
        c.bias = bias ? b.p(g) : nullptr;
        c.tid2eid = k_table ? dtable.p<int32_t>(g) : nullptr;
        c.tokens = dtoks.p<int32_t>(g);
        c.T = T;
        c.n_expert = E;
        c.k = k;
        c.k_table = k_table;
        c.norm = norm;
        c.scale = 1.5f;
        c.ids = ids.p<int32_t>(g);
        c.weights = wts.p(g);
        dev(g)->moe_route(c);
    }
    const std::string name = "E=" + std::to_string(E) + " k=" + std::to_string(k) + (bias ? " bias" : "") +
                             (norm ? " norm" : "") + (k_table ? " hash" + std::to_string(k_table) : "") + " T=" + std::to_string(T);
    compare_ids("moe_route ids " + name, ids);
    compare("moe_route weights " + name, wts, 1e-6);
}

// A 3-D expert stack with the same bytes on both devices.
struct Stack {
    std::vector<uint8_t> host;
    Weight c, g;
    Stack(uint32_t type, int n_expert, int64_t n_out, int64_t n_in, Rng &r)
        : host(dfltest::rand_rows(type, n_expert * n_out, n_in, r, 0.1f)) {
        c.type = g.type = type;
        c.n_in = g.n_in = n_in;
        c.n_out = g.n_out = n_out * n_expert;
        c.row_bytes = g.row_bytes = type_row_bytes(type, n_in);
        c.data = g_cpu->upload_weight(host.data(), host.size(), true);
        g.data = g_gpu->upload_weight(host.data(), host.size(), true);
    }
    const Weight &w(bool gpu) const { return gpu ? g : c; }
};

void run_experts(uint32_t type, int E, int k, int64_t T, float limit, Rng &r) {
    const int64_t D = 256, F = 256;
    Stack gate(type, E, F, D, r), up(type, E, F, D, r), down(type, E, D, F, r);
    std::vector<int32_t> ids;
    std::vector<int> per((size_t)E, 0);
    for (int64_t t = 0; t < T; t++) {
        std::vector<int32_t> ex((size_t)E);
        for (int i = 0; i < E; i++) ex[(size_t)i] = i;
        for (int j = 0; j < k; j++) std::swap(ex[(size_t)j], ex[(size_t)j + (size_t)(r.next() % (uint64_t)(E - j))]);
        for (int j = 0; j < k; j++) ids.push_back(ex[(size_t)j]), per[(size_t)ex[(size_t)j]]++;
    }
    Dual x(rand_vec(r, (size_t)(T * D), 3.0f)), dids(ids), wts(rand_vec(r, (size_t)(T * k))), out((size_t)(T * D) * 4);
    for (bool g : {false, true}) {
        MoeExpertsCall c;
        c.x = x.p(g);
        c.gate = gate.w(g);
        c.up = up.w(g);
        c.down = down.w(g);
        c.T = T;
        c.n_expert = E;
        c.n_ff = (int)F;
        c.n_embd = (int)D;
        c.k = k;
        c.limit = limit;
        c.ids = dids.p<int32_t>(g);
        c.weights = wts.p(g);
        c.out = out.p(g);
        c.leave_pairs = g;  // the GPU may leave its pairs (DFL_CUDA_MOE_COMBINE_POST=1): combined here as it would
        const float *pairs = dev(g)->moe_experts(c);
        if (pairs) {
            std::vector<float> y((size_t)(T * k * D)), o((size_t)(T * D), 0.0f);
            g_gpu->to_host(y.data(), pairs, y.size() * sizeof(float));
            const std::vector<float> w = wts.read(true);
            for (int64_t t = 0; t < T; t++)
                for (int j = 0; j < k; j++)
                    for (int64_t d = 0; d < D; d++) o[(size_t)(t * D + d)] += w[(size_t)(t * k + j)] * y[(size_t)((t * k + j) * D + d)];
            g_gpu->to_device(out.gp(), o.data(), o.size() * sizeof(float));
        }
    }
    // Up to 64 (token, choice) pairs every pair is its own GEMV (experts picked on the device), as on the CPU; past
    // that, several rows of one expert take the tensor-core path (operands rounded to f16) for quantized weights.
    const int most = *std::max_element(per.begin(), per.end());
    // q4_K on int8 activations: pairs unless DFL_CUDA_Q4K_I8=0 (launch_gemv_q4k_i8), an expert's 2..64 rows on int8
    // tensor cores unless DFL_CUDA_I8_MMA=0
    const char *i8 = std::getenv("DFL_CUDA_Q4K_I8"), *mma = std::getenv("DFL_CUDA_I8_MMA");
    const bool pairs_i8 = T * k <= 64 && !(i8 && std::strcmp(i8, "0") == 0);
    const bool rows_i8 = T * k > 64 && most >= 2 && !(mma && std::strcmp(mma, "0") == 0);
    // two products in a chain (gate and up, then down on their rounded product): twice the one product's 1.5e-2, and
    // a little more for the SwiGLU between them (seen: 3.7e-2 for one token of three pairs on the H200)
    const double bound = type == DFL_TYPE_Q4_K && (pairs_i8 || rows_i8)            ? 5e-2
                         : type == DFL_TYPE_F32 || most <= 1 || T * k <= 64 ? 1e-5
                                                                             : 3e-3;
    const char *tn = type == DFL_TYPE_F32 ? "f32" : type == DFL_TYPE_Q8_0 ? "q8_0" : "q4_K";
    compare(std::string("moe_experts ") + tn + " E=" + std::to_string(E) + " k=" + std::to_string(k) + " T=" +
                std::to_string(T) + " limit=" + std::to_string((int)limit),
            out, bound);
}

// The grouped output projection of one token: every group in one pass on the GPU against the CPU's group-by-group
// products. A q8_0 weight the GPU has repacked, and q4_K unless DFL_CUDA_Q4K_I8=0, multiply int8-rounded activations (1.5e-2 of the output's norm, as
// test_cuda_ops bounds it); the rest are the plain GEMV's.
void test_grouped() {
    Rng r(61);
    const char *i8 = std::getenv("DFL_CUDA_Q4K_I8");  // q4_K on int8 activations unless 0
    const bool q4k_i8 = !(i8 && std::strcmp(i8, "0") == 0);
    struct S {
        uint32_t type;
        int groups;
        int64_t rows, n_in;
        bool packed;
    };
    for (const S &sh : {S{DFL_TYPE_F32, 8, 16, 64, false}, S{DFL_TYPE_Q8_0, 2, 16, 64, false},
                        S{DFL_TYPE_Q8_0, 8, 1024, 4096, false}, S{DFL_TYPE_Q8_0, 8, 1024, 4096, true},
                        S{DFL_TYPE_Q8_0, 3, 40, 96, true}, S{DFL_TYPE_Q4_K, 4, 128, 512, false}}) {
        Stack W(sh.type, sh.groups, sh.rows, sh.n_in, r);
        Weight wg = W.g;
        if (sh.packed) {
            g_gpu->prepare_weight(wg);
            CHECK(wg.packed != nullptr);
        }
        Dual x(rand_vec(r, (size_t)(sh.groups * sh.n_in))), y((size_t)(sh.groups * sh.rows) * 4);
        g_cpu->matmul_grouped(W.c, sh.groups, x.p(false), y.p(false));
        g_gpu->matmul_grouped(wg, sh.groups, x.p(true), y.p(true));
        const char *tn = sh.type == DFL_TYPE_F32 ? "f32" : sh.type == DFL_TYPE_Q8_0 ? "q8_0" : "q4_K";
        compare(std::string("matmul_grouped ") + tn + (sh.packed ? " repacked " : " ") + std::to_string(sh.groups) + "x" +
                    std::to_string(sh.rows) + "x" + std::to_string(sh.n_in),
                y, sh.packed || (sh.type == DFL_TYPE_Q4_K && q4k_i8) ? 1.5e-2 : 1e-5);
    }
}

void test_moe() {
    Rng r(51);
    for (int64_t T : {1, 4, 37}) {
        run_route(16, 6, true, true, 0, T, r);
        run_route(256, 6, true, true, 0, T, r);
        run_route(64, 4, false, false, 0, T, r);
        run_route(32, 6, false, true, 6, T, r);
        run_route(32, 4, false, true, 8, T, r);
    }
    for (float limit : {0.0f, 1.0f}) {
        const int64_t n = 3000;
        Dual g(rand_vec(r, (size_t)n, 4.0f)), u(rand_vec(r, (size_t)n, 4.0f));
        for (bool gp : {false, true}) dev(gp)->swiglu_clamp(g.p(gp), u.p(gp), n, limit);
        compare("swiglu_clamp limit=" + std::to_string(limit), g, 1e-6);
    }
    for (uint32_t type : {DFL_TYPE_F32, DFL_TYPE_Q8_0, DFL_TYPE_Q4_K}) {
        run_experts(type, 8, 3, 1, 10.0f, r);
        run_experts(type, 8, 3, 5, 10.0f, r);
        run_experts(type, 16, 6, 40, 0.0f, r);
    }
}

}  // namespace

int main(int argc, char **argv) {
    const dfltest::Group groups[] = {{"hc", test_hc},           {"hc_pre_norm", test_hc_pre_norm}, {"hc_post_mix", test_hc_post_mix},
                                     {"rope", test_rope},           {"compress", test_compress},
                                     {"indexer", test_indexer}, {"attention", test_attention}, {"moe", test_moe},
                                     {"grouped", test_grouped}};
    return dfltest::run_cuda_tests(argc, argv, "the CUDA ds4 op tests", "deepseek4 ops", groups);
}

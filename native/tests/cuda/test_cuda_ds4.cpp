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

using dfltest::dev;

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


// ---- RoPE (the hyper-connections: test_cuda_ds4_hc.cpp) ----

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
// the kernel folds them in unless DFL_CUDA_DS4_ATTN_FOLD=0), else the two ops after it. pad: floats after each slot's
// ring (7: rows off 16-byte boundaries, the register copy of the key tiles; 8: on them, where the tiles may be copied
// by cp.async unless DFL_CUDA_DS4_ATTN_ASYNC=0).
void run_attention(int H, int hd, int window, int ratio, bool with_sel, const Batch &b, Rng &r, bool with_fold = false,
                   int pad = 7, int top_k = 12) {
    const int rpb = ratio ? ds4_rows_per_block(b.block_size, ratio) : 1;
    const int64_t stride = (int64_t)window * hd + pad, pool = (int64_t)b.n_blocks * rpb;
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
        if (!c.ring_write) dev(g)->ds4_ring_write(b.meta(g), ds4_ring_write_call(c));
    }
    const std::string name = "h=" + std::to_string(H) + " hd=" + std::to_string(hd) + " win=" + std::to_string(window) +
                             " ratio=" + std::to_string(ratio) + (with_sel ? " sel " : " ") +
                             (with_fold ? (one_each ? "unrotate+ring " : "unrotate ") : "") + "pad=" + std::to_string(pad) +
                             " top_k=" + std::to_string(top_k) + " " + b.str();
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
        run_attention(4, 64, 16, 4, true, Batch(shape, 16, r), r, true, 8);
        run_attention(4, 64, 8, 0, false, Batch(shape, 16, r), r, false, 8);
    }
    run_attention(64, 512, 128, 4, true, Batch({{1, 700, 0}, {1, 129, 1}, {1, 50, 2}}, 64, r), r, true, 8);
    run_attention(64, 512, 128, 0, false, Batch({{1, 40, 0}}, 64, r), r, true, 8);  // a V4 decode step's window
    run_attention(64, 512, 128, 4, true, Batch({{1, 700, 0}, {1, 129, 1}, {1, 50, 2}}, 64, r), r, true);
    run_attention(64, 512, 128, 4, true, Batch({{1, 700, 0}, {1, 129, 1}, {2, 50, 2}}, 64, r), r);
    run_attention(64, 512, 128, 128, false, Batch({{1, 1000, 1}, {20, 300, 0}}, 64, r), r);
    // a V4 decode step of 8 sequences: 512 (token, head) blocks, unsplit
    const Batch b8({{1, 700, 0}, {1, 129, 1}, {1, 50, 2}, {1, 300, 3}, {1, 5, 4}, {1, 1000, 5}, {1, 64, 6}, {1, 200, 7}},
                   64, r);
    run_attention(64, 512, 128, 4, true, b8, r, true, 8);
    run_attention(64, 512, 128, 0, false, b8, r, false, 8);
    // 96 selection slots: short contexts leave whole tiles of padded slots (skipped by ds4_attention_kernel unless
    // DFL_CUDA_DS4_ATTN_SKIP=0)
    run_attention(64, 512, 128, 4, true, b8, r, true, 8, 96);
    run_attention(64, 512, 128, 4, true, Batch({{1, 700, 0}, {1, 9, 1}, {1, 50, 2}}, 64, r), r, true, 8, 96);
}

// ---- MoE ----

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

void run_experts(uint32_t type, int E, int k, int64_t T, float limit, Rng &r, int64_t D = 256, int64_t F = 256) {
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
        dev(g)->moe_experts(c);
    }
    // Up to 64 (token, choice) pairs every pair is its own GEMV (experts picked on the device), as on the CPU; past
    // that, several rows of one expert take the tensor-core path (operands rounded to f16) for quantized weights.
    const int most = *std::max_element(per.begin(), per.end());
    // q4_K on int8 activations: pairs unless DFL_CUDA_Q4K_I8=0 (launch_gemv_q4k_i8), an expert's 2..64 rows on int8
    // tensor cores unless DFL_CUDA_I8_MMA=0
    const char *i8 = std::getenv("DFL_CUDA_Q4K_I8"), *mma = std::getenv("DFL_CUDA_I8_MMA");
    // the direct path's most pairs: 256 unless DFL_CUDA_MOE_DIRECT_PAIRS sets it
    const char *dp = std::getenv("DFL_CUDA_MOE_DIRECT_PAIRS");
    const int64_t direct_most = dp && *dp ? std::max<int64_t>(1, std::min<int64_t>(1024, std::atoll(dp))) : 256;
    const bool direct = T * k <= direct_most;
    const bool pairs_i8 = direct && !(i8 && std::strcmp(i8, "0") == 0);
    const bool rows_i8 = !direct && most >= 2 && !(mma && std::strcmp(mma, "0") == 0);
    // two products in a chain (gate and up, then down on their rounded product): twice the one product's 1.5e-2, and
    // a little more for the SwiGLU between them (seen: 3.7e-2 for one token of three pairs on the H200)
    const double bound = type == DFL_TYPE_Q4_K && (pairs_i8 || rows_i8)            ? 5e-2
                         : type == DFL_TYPE_F32 || most <= 1 || direct ? 1e-5
                                                                             : 3e-3;
    const char *tn = type == DFL_TYPE_F32 ? "f32" : type == DFL_TYPE_Q8_0 ? "q8_0" : "q4_K";
    compare(std::string("moe_experts ") + tn + " E=" + std::to_string(E) + " k=" + std::to_string(k) + " T=" +
                std::to_string(T) + " limit=" + std::to_string((int)limit) + " D=" + std::to_string(D) +
                " F=" + std::to_string(F),
            out, bound);
}

// The grouped output projection of 1, 3, 8 and 20 tokens: every group in one pass on the GPU against the CPU's
// group-by-group products of each token. A q8_0 weight the GPU has repacked, and q4_K unless DFL_CUDA_Q4K_I8=0,
// multiply int8-rounded activations (1.5e-2 of the output's norm, as test_cuda_ops bounds it); the rest are the plain
// GEMV's. Beyond one token the GPU takes a repacked stack at once up to DFL_CUDA_GROUPED_ROWS tokens (16 unless set
// lower), else it declines (20 tokens), as the CPU does, and each token runs alone.
void test_grouped() {
    Rng r(61);
    const char *i8 = std::getenv("DFL_CUDA_Q4K_I8");  // q4_K on int8 activations unless 0
    const bool q4k_i8 = !(i8 && std::strcmp(i8, "0") == 0);
    const char *rows_env = std::getenv("DFL_CUDA_GROUPED_ROWS");
    const int64_t rows_most = std::min<int64_t>(16, rows_env && *rows_env ? std::atoll(rows_env) : 16);
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
        for (int64_t T : {1, 3, 8, 20}) {
            const int64_t xw = sh.groups * sh.n_in, yw = sh.groups * sh.rows;
            Dual x(rand_vec(r, (size_t)(T * xw))), y((size_t)(T * yw) * 4);
            CHECK(!g_cpu->matmul_grouped(W.c, sh.groups, x.p(false), T, y.p(false)) || T == 1);
            for (int64_t t = 0; t < T; t++)
                CHECK(g_cpu->matmul_grouped(W.c, sh.groups, x.p(false) + t * xw, 1, y.p(false) + t * yw));
            const bool took = g_gpu->matmul_grouped(wg, sh.groups, x.p(true), T, y.p(true));
            CHECK(took == (T == 1 || (T <= rows_most && sh.packed)));
            for (int64_t t = 0; !took && t < T; t++)
                CHECK(g_gpu->matmul_grouped(wg, sh.groups, x.p(true) + t * xw, 1, y.p(true) + t * yw));
            const char *tn = sh.type == DFL_TYPE_F32 ? "f32" : sh.type == DFL_TYPE_Q8_0 ? "q8_0" : "q4_K";
            compare(std::string("matmul_grouped ") + tn + (sh.packed ? " repacked " : " ") + std::to_string(sh.groups) +
                        "x" + std::to_string(sh.rows) + "x" + std::to_string(sh.n_in) + " T=" + std::to_string(T),
                    y, sh.packed || (sh.type == DFL_TYPE_Q4_K && q4k_i8) ? 1.5e-2 : 1e-5);
        }
        if (!sh.packed) continue;
        // each group's rows as a matrix of their own (Weight::rows: both regions of the repacked layout), T tokens of
        // one group's input, against the CPU's slice: the path of a group the plan gathers (more tokens than the group
        // launch takes)
        for (int64_t T : {1, 3, 20}) {
            Dual x(rand_vec(r, (size_t)(T * sh.n_in))), y((size_t)(T * sh.rows * sh.groups) * 4);
            for (int g = 0; g < sh.groups; g++) {
                const Weight gw = wg.rows(g * sh.rows, sh.rows);
                CHECK(gw.packed != nullptr && gw.packed_aux != nullptr);
                g_cpu->matmul(W.c.rows(g * sh.rows, sh.rows), x.p(false), T, y.p(false) + g * T * sh.rows);
                g_gpu->matmul(gw, x.p(true), T, y.p(true) + g * T * sh.rows);
            }
            compare("matmul of repacked q8_0 row slices " + std::to_string(sh.groups) + "x" + std::to_string(sh.rows) +
                        "x" + std::to_string(sh.n_in) + " T=" + std::to_string(T),
                    y, 1.5e-2);
        }
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
        run_experts(type, 32, 6, 10, 10.0f, r);  // V4's six choices, 60 pairs: still the direct path
        run_experts(type, 16, 6, 40, 0.0f, r);  // 240 pairs: direct, sorted by expert
        run_experts(type, 16, 6, 48, 0.0f, r);  // 288 pairs: grouped by expert on the host
    }
    // rows of several q4_K super-blocks (a warp's lanes step through them, four rows a warp unless DFL_CUDA_MOE_ROWS)
    run_experts(DFL_TYPE_Q4_K, 16, 6, 3, 10.0f, r, 512, 1024);
}

}  // namespace

int main(int argc, char **argv) {
    using dfltest::test_hc, dfltest::test_hc_pre_norm, dfltest::test_hc_site, dfltest::test_hc_post_site,
        dfltest::test_keep_quant;
    const dfltest::Group groups[] = {{"hc", test_hc},           {"hc_pre_norm", test_hc_pre_norm}, {"hc_site", test_hc_site},
                                     {"hc_post_site", test_hc_post_site}, {"keep_quant", test_keep_quant},
                                     {"rope", test_rope},           {"compress", test_compress},
                                     {"indexer", test_indexer}, {"attention", test_attention}, {"moe", test_moe},
                                     {"grouped", test_grouped}};
    return dfltest::run_cuda_tests(argc, argv, "the CUDA ds4 op tests", "deepseek4 ops", groups);
}

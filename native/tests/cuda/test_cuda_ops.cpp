// The CUDA device against the CPU device, op by op: random inputs, the same bytes on both, outputs compared by
// ||gpu - cpu|| / ||cpu||. Outputs are poisoned (all bytes 0xFF, a NaN in f32 and f16) before each run, so an output
// the GPU does not write fails. Also times the decode GEMV. Without a GPU it says so and exits 0.
//
// Bounds, per path:
//  - f32 element-wise ops, norms, attention, embed, the decode GEMV of every type, conv: 1e-5. Only the summation order
//    and f32-vs-double reductions differ, so errors are a few ulps relative to the output norm.
//  - the delta rule: 1e-4, because the CPU computes multi-token non-recording entries chunk-wise (a different but
//    equivalent formula) while the GPU runs the recurrence.
//  - matmul with T >= 2 (the tensor-core kernel on packed weights for T <= 64, cuBLAS beyond) on f16, bf16 and
//    quantized weights: f32 weights stay exact (GEMV, SGEMM: 1e-5). f16 and quantized weights run with X rounded to
//    f16 and the dequantized weight rounded to f16 (each a relative error of at most 2^-11 per operand, products summed
//    in f32, so the error of a dot product is at most about 2^-10 of the sum of |w x|, a few times less than that
//    relative to ||y|| for random signs): 3e-3; bf16 weights are exact and X is rounded to bf16 (2^-8 per element):
//    1.5e-2. Inputs here are |x| <= 1 and small weights, far inside f16 range.
//  - attention of entries with 64+ query rows (tensor cores, Q/K/V/P rounded to f16): 2e-3, see run_attention_case.
//  - KV cache writes: an input an ulp away from a rounding boundary of the cache type can round the other way, one step
//    of that type: f16 1e-4, bf16 5e-4, q8_0 (a step is 1/127 of the block max) 2e-2.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "ops/cuda/cuda_device.h"
#include "ops/device.h"
#include "cuda_test.h"
#include "rand_rows.h"
#include "test.h"
#include "test_batch.h"

namespace {

using namespace dfl;
using dfltest::Batch;
using dfltest::random_tree;
using dfltest::put_u16;
using dfltest::rand_rows;
using dfltest::Rng;
using dfltest::type_row_bytes;

// GGUF block layouts (as quant.h).
constexpr int QK8_0 = 32, QK_K = 256;
constexpr size_t kQ8_0Bytes = 34, kQ4_KBytes = 144, kQ6_KBytes = 210;

using dfltest::compare;
using dfltest::compare_ids;
using dfltest::same_bits;
using dfltest::Dual;
using dfltest::DualWeight;
using dfltest::g_cases;
using dfltest::g_cpu;
using dfltest::g_gpu;
using dfltest::rand_vec;
using dfltest::tname;

// ---- norms and element-wise ----

void test_norms_elementwise() {
    Rng r(2);
    const int64_t rows_list[] = {1, 3, 17};
    // 8192 and 8224: either side of the register kernel's narrow variant (8 a thread); 16384 (DeepSeek V4's HC streams
    // flattened) and 16416: either side of its wide one (off with DFL_CUDA_NORM_WIDE=0)
    const int64_t ns[] = {1, 7, 128, 1000, 4096, 8192, 8224, 16384, 16416};
    for (int64_t rows : rows_list) {
        for (int64_t n : ns) {
            const std::string sz = " " + std::to_string(rows) + "x" + std::to_string(n);
            const auto xv = rand_vec(r, (size_t)(rows * n), 3.0f), wv = rand_vec(r, (size_t)n), dv = rand_vec(r, (size_t)(rows * n));
            Dual w(wv), d(dv);
            for (int with_w = 0; with_w < 2; with_w++) {
                Dual x(xv), y((size_t)(rows * n) * 4);
                g_cpu->rmsnorm(x.cp(), with_w ? w.cp() : nullptr, y.cp(), rows, n, 1e-6f);
                g_gpu->rmsnorm(x.gp(), with_w ? w.gp() : nullptr, y.gp(), rows, n, 1e-6f);
                compare(std::string("rmsnorm") + (with_w ? "" : " (no w)") + sz, y, 1e-5);
            }
            {
                Dual x(xv);  // in place
                g_cpu->rmsnorm(x.cp(), w.cp(), x.cp(), rows, n, 1e-6f);
                g_gpu->rmsnorm(x.gp(), w.gp(), x.gp(), rows, n, 1e-6f);
                compare("rmsnorm in place" + sz, x, 1e-5);
            }
            {
                Dual x(xv), y((size_t)(rows * n) * 4);
                g_cpu->add_rmsnorm(x.cp(), d.cp(), w.cp(), y.cp(), rows, n, 1e-6f);
                g_gpu->add_rmsnorm(x.gp(), d.gp(), w.gp(), y.gp(), rows, n, 1e-6f);
                compare("add_rmsnorm x" + sz, x, 1e-6);
                compare("add_rmsnorm y" + sz, y, 1e-5);
            }
            {
                Dual x(xv), z(dv);
                g_cpu->gated_rmsnorm(x.cp(), z.cp(), n, w.cp(), rows, 1, n, 1e-6f);
                g_gpu->gated_rmsnorm(x.gp(), z.gp(), n, w.gp(), rows, 1, n, 1e-6f);
                compare("gated_rmsnorm" + sz, x, 1e-5);
            }
        }
    }
    {  // heads of a token's row, its z a fused product's part: rows 40 floats wider than the heads'
        const int64_t T = 3, heads = 4, n = 128, zs = heads * n + 40;
        Dual x(rand_vec(r, (size_t)(T * heads * n), 4.0f)), z(rand_vec(r, (size_t)(T * zs), 4.0f)),
            w(rand_vec(r, (size_t)n));
        g_cpu->gated_rmsnorm(x.cp(), z.cp() + 8, zs, w.cp(), T, heads, n, 1e-6f);
        g_gpu->gated_rmsnorm(x.gp(), z.gp() + 8, zs, w.gp(), T, heads, n, 1e-6f);
        compare("gated_rmsnorm 3 tokens x 4 heads, z rows 552 apart", x, 1e-5);
    }
    // swiglu of a fused gate|up product's rows into rows of their own (and rows of their own in place)
    for (const int64_t n : {int64_t(96), int64_t(1000)}) {
        const int64_t rows = 5, stride = 2 * n + 32;
        Dual f(rand_vec(r, (size_t)(rows * stride), 8.0f)), out((size_t)(rows * n) * 4);
        g_cpu->swiglu_rows(out.cp(), f.cp(), f.cp() + n, rows, n, stride);
        g_gpu->swiglu_rows(out.gp(), f.gp(), f.gp() + n, rows, n, stride);
        compare("swiglu_rows 5 x " + std::to_string(n) + " of rows " + std::to_string(stride) + " apart", out, 1e-5);
        Dual gv(rand_vec(r, (size_t)(rows * n), 8.0f)), uv(rand_vec(r, (size_t)(rows * n), 8.0f));
        g_cpu->swiglu_rows(gv.cp(), gv.cp(), uv.cp(), rows, n, n);
        g_gpu->swiglu_rows(gv.gp(), gv.gp(), uv.gp(), rows, n, n);
        compare("swiglu_rows 5 x " + std::to_string(n) + " in place", gv, 1e-5);
    }
    for (int64_t count : {int64_t(1), int64_t(1000), int64_t(12345)}) {
        const auto av = rand_vec(r, (size_t)count, 8.0f), bv = rand_vec(r, (size_t)count, 8.0f);
        const std::string sz = " n=" + std::to_string(count);
        {
            Dual a(av), b(bv);
            g_cpu->add(a.cp(), b.cp(), count);
            g_gpu->add(a.gp(), b.gp(), count);
            compare("add" + sz, a, 1e-6);
        }
        {
            Dual a(av), b(bv);
            g_cpu->swiglu(a.cp(), b.cp(), count);
            g_gpu->swiglu(a.gp(), b.gp(), count);
            compare("swiglu" + sz, a, 1e-5);
        }
        {
            Dual a(av), b(bv);
            g_cpu->sigmoid_mul(a.cp(), b.cp(), count);
            g_gpu->sigmoid_mul(a.gp(), b.gp(), count);
            compare("sigmoid_mul" + sz, a, 1e-5);
        }
        for (float cap : {0.0f, 3.0f}) {  // a draft's logit scale, with and without soft-capping
            Dual a(av);
            g_cpu->scale_softcap(a.cp(), count, 1.5f, cap);
            g_gpu->scale_softcap(a.gp(), count, 1.5f, cap);
            compare("scale_softcap cap=" + std::to_string((int)cap) + sz, a, 1e-5);
        }
    }
    for (int64_t n : {77, 16384}) {  // (a row of 16,384: DeepSeek V4's four HC streams, many blocks a row)
        const int64_t X = 50;
        std::vector<int32_t> rows = {3, 49, 0, 3, 17, 22, 8};
        Dual x(rand_vec(r, (size_t)(X * n))), ri(rows), out(rows.size() * n * 4);
        g_cpu->gather_rows(x.cp(), ri.cp<int32_t>(), (int64_t)rows.size(), n, out.cp());
        g_gpu->gather_rows(x.gp(), ri.gp<int32_t>(), (int64_t)rows.size(), n, out.gp());
        compare("gather_rows 7 of 50 x " + std::to_string(n), out, 0);
    }
    {
        const int64_t rows = 13, n = 30, ss = 41, ds = 35;
        Dual src(rand_vec(r, (size_t)(rows * ss))), dst((size_t)(rows * ds) * 4);
        g_cpu->copy_rows(dst.cp(), ds, src.cp(), ss, rows, n);
        g_gpu->copy_rows(dst.gp(), ds, src.gp(), ss, rows, n);
        compare("copy_rows 13 x 30 (strides 41 -> 35)", dst, 0);  // the gaps stay poisoned on both
    }
    // one decode row's norm at the widths of the served models (DFL_CUDA_NORM_REGS=0: the two-pass loops;
    // DFL_CUDA_NORM_WIDE=0: 16384 on the loops too)
    for (const int64_t n : {4096, 5120, 16384}) {
        Dual x(rand_vec(r, (size_t)n)), y((size_t)n * 4);
        const double us = dfltest::time_gpu_us([&] { g_gpu->rmsnorm(x.gp(), nullptr, y.gp(), 1, n, 1e-6f); }, 200);
        std::printf("time rmsnorm 1x%lld: %.2f us a call\n", (long long)n, us);
    }
}

// ---- attention ----

std::vector<float> dequant_cache(uint32_t type, const std::vector<uint8_t> &b, int64_t n_rows, int hd) {
    const uint64_t rb = type_row_bytes(type, hd);
    std::vector<float> f((size_t)(n_rows * hd));
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *p = b.data() + r * rb;
        float *o = f.data() + r * hd;
        for (int i = 0; i < hd; i++) {
            uint16_t h;
            switch (type) {
            case DFL_TYPE_F32: std::memcpy(&o[i], p + 4 * i, 4); break;
            case DFL_TYPE_F16: std::memcpy(&h, p + 2 * i, 2); o[i] = f16_to_f32(h); break;
            case DFL_TYPE_BF16: std::memcpy(&h, p + 2 * i, 2); o[i] = bf16_to_f32(h); break;
            case DFL_TYPE_Q8_0: {
                const uint8_t *blk = p + (i / QK8_0) * kQ8_0Bytes;
                std::memcpy(&h, blk, 2);
                o[i] = f16_to_f32(h) * (float)(int8_t)blk[2 + i % QK8_0];
                break;
            }
            }
        }
    }
    return f;
}

// K rows come from f32 values that differ by an ulp or so (FMA contraction, f32 vs double norm): now and then one
// lands on the other side of a rounding boundary of the cache type, an error of one step of that type.
double cache_bound(uint32_t type) {
    switch (type) {
    case DFL_TYPE_F32: return 1e-5;
    case DFL_TYPE_F16: return 1e-4;
    case DFL_TYPE_BF16: return 5e-4;
    default: return 2e-2;
    }
}

struct AttnShape {
    int n_head, n_kv, hd, rope_dim;
    bool gated;
};

std::string attn_name(const char *op, const AttnShape &s, uint32_t tk, uint32_t tv, const Batch &b) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s h=%d kv=%d hd=%d%s k=%s v=%s T=%lld ents=%zu", op, s.n_head, s.n_kv, s.hd,
                  s.gated ? " gated" : "", tname(tk), tname(tv), (long long)b.T, b.ents.size());
    return buf;
}

// The mask of an attention call (AttnCall::causal, window) and whether attn_prep runs without Q (K/V only, as for a
// DFlash draft's context rows).
struct AttnMaskCase {
    bool causal = true;
    int window = 0;
    bool kv_only = false;
    bool fused = false;  // qf, kf, vf side by side in one buffer's rows (a fused q|k|v product's, AttnPrep's strides)
};

std::vector<float> rope_inv_freq(const AttnShape &s) {
    std::vector<float> inv((size_t)s.rope_dim / 2);
    for (int i = 0; i < s.rope_dim / 2; i++) inv[(size_t)i] = 1.0f / std::pow(1e6f, (float)(2 * i) / (float)s.rope_dim);
    return inv;
}

// attn_prep's call of shape s apart from its q, k and v rows: the norms, RoPE frequencies, outputs and cache.
AttnPrep prep_call(const AttnShape &s, const float *qn, const float *kn, const float *invf, float *Q, float *gate,
                   const KVLayer &kv) {
    AttnPrep a;
    a.q_norm = qn;
    a.k_norm = kn;
    a.inv_freq = invf;
    a.n_head = s.n_head;
    a.rope_dim = s.rope_dim;
    a.gated = s.gated;
    a.Q = Q;
    a.gate = s.gated ? gate : nullptr;
    a.kv = kv;
    return a;
}

// A cache layer of shape s (types tk, tv) at k and v.
KVLayer cache_layer(const AttnShape &s, uint32_t tk, uint32_t tv, uint8_t *k, uint8_t *v, int block_size) {
    KVLayer l;
    l.k = k;
    l.v = v;
    l.type_k = tk;
    l.type_v = tv;
    l.k_row = type_row_bytes(tk, s.hd);
    l.v_row = type_row_bytes(tv, s.hd);
    l.n_kv = s.n_kv;
    l.head_dim = s.hd;
    l.block_size = block_size;
    return l;
}

// One attention case's data on both devices: random q / k / v rows (qf, kf, vf each in rows of its own), norms and
// RoPE frequencies, attn_prep's outputs, and a cache of random earlier tokens (attn_prep overwrites the batch's rows).
struct AttnData {
    const AttnShape &s;
    const uint32_t tk, tv;
    const Batch &b;
    const int64_t T, qd, kvd, q_out, rows;
    Dual qf, kf, vf, qn, kn, invf, Q, gate, kc, vc;
    AttnData(const AttnShape &s_, uint32_t tk_, uint32_t tv_, const Batch &b_, Rng &r)
        : s(s_), tk(tk_), tv(tv_), b(b_), T(b_.T), qd((int64_t)s_.n_head * s_.hd), kvd((int64_t)s_.n_kv * s_.hd),
          q_out(qd * (s_.gated ? 2 : 1)), rows(b_.pool_rows() * s_.n_kv), qf(rand_vec(r, (size_t)(T * q_out), 2.0f)),
          kf(rand_vec(r, (size_t)(T * kvd), 2.0f)), vf(rand_vec(r, (size_t)(T * kvd))), qn(rand_vec(r, (size_t)s_.hd)),
          kn(rand_vec(r, (size_t)s_.hd)), invf(rope_inv_freq(s_)), Q((size_t)(T * qd) * 4), gate((size_t)(T * qd) * 4),
          kc(rand_rows(tk_, rows, s_.hd, r)), vc(rand_rows(tv_, rows, s_.hd, r)) {}
    // the cache as a layer of device g sees it
    KVLayer kv(bool g) const { return cache_layer(s, tk, tv, kc.p<uint8_t>(g), vc.p<uint8_t>(g), b.block_size); }
    // attn_prep's call on device g's buffers
    AttnPrep prep(bool g) const {
        AttnPrep a = prep_call(s, qn.p(g), kn.p(g), invf.p(g), Q.p(g), gate.p(g), kv(g));
        a.qf = qf.p(g);
        a.kf = kf.p(g);
        a.vf = vf.p(g);
        return a;
    }
    // attention's call on device g's cache, query rows q, into out
    AttnCall call(bool g, const Dual &q, const Dual &out) const {
        AttnCall c;
        c.Q = q.p(g);
        c.out = out.p(g);
        c.n_head = s.n_head;
        c.scale = 1.0f / std::sqrt((float)s.hd);
        c.kv = kv(g);
        return c;
    }
};

void run_attention_case(const AttnShape &s, uint32_t tk, uint32_t tv, const Batch &b, Rng &r,
                        const AttnMaskCase &mc = AttnMaskCase()) {
    AttnData d(s, tk, tv, b, r);
    const int64_t T = d.T, qd = d.qd, kvd = d.kvd, q_out = d.q_out, rows = d.rows;
    Dual &qf = d.qf, &kf = d.kf, &vf = d.vf, &Q = d.Q, &gate = d.gate, &kc = d.kc, &vc = d.vc;
    // the fused layout: row t is q_out floats of qf, then kvd of kf, then kvd of vf
    const int64_t fw = q_out + 2 * kvd;
    std::unique_ptr<Dual> fz;
    if (mc.fused) {
        const std::vector<float> q = qf.read(false), k = kf.read(false), v = vf.read(false);
        std::vector<float> f((size_t)(T * fw));
        for (int64_t t = 0; t < T; t++) {
            std::copy(q.begin() + t * q_out, q.begin() + (t + 1) * q_out, f.begin() + t * fw);
            std::copy(k.begin() + t * kvd, k.begin() + (t + 1) * kvd, f.begin() + t * fw + q_out);
            std::copy(v.begin() + t * kvd, v.begin() + (t + 1) * kvd, f.begin() + t * fw + q_out + kvd);
        }
        fz.reset(new Dual(f));
    }
    for (int dev = 0; dev < 2; dev++) {
        const bool g = dev == 1;
        AttnPrep a = d.prep(g);
        if (mc.kv_only) a.qf = nullptr;
        if (mc.fused) {
            float *f = fz->p(g);
            a.qf = mc.kv_only ? nullptr : f;
            a.kf = f + q_out;
            a.vf = f + q_out + kvd;
            a.q_stride = a.k_stride = a.v_stride = fw;
        }
        (g ? g_gpu : g_cpu)->attn_prep(b.meta(g), a);
    }
    if (!mc.kv_only) compare(attn_name("attn_prep Q", s, tk, tv, b), Q, 1e-5);
    compare(attn_name(mc.fused ? "attn_prep fused rows" : "attn_prep kf", s, tk, tv, b), mc.fused ? *fz : kf, 1e-5);
    if (s.gated) compare(attn_name("attn_prep gate", s, tk, tv, b), gate, 0);
    compare(attn_name("attn_prep K cache", s, tk, tv, b), dequant_cache(tk, kc.read<uint8_t>(true), rows, s.hd),
            dequant_cache(tk, kc.read<uint8_t>(false), rows, s.hd), cache_bound(tk));
    compare(attn_name("attn_prep V cache", s, tk, tv, b), dequant_cache(tv, vc.read<uint8_t>(true), rows, s.hd),
            dequant_cache(tv, vc.read<uint8_t>(false), rows, s.hd), cache_bound(tv));

    // attention over identical caches (the CPU's, so a q8_0 rounding tie above does not count twice)
    kc.set(kc.read<uint8_t>(false).data());
    vc.set(vc.read<uint8_t>(false).data());
    Dual Qin(rand_vec(r, (size_t)(T * qd), 2.0f)), out((size_t)(T * qd) * 4);
    // A q8_0 product of the output at once after: decode-sized attention writes the output's int8 quantization
    // (CudaDevice::stage_rows, AttnArgs::q) and the product takes it instead of quantizing.
    const bool then_product = T <= 64 && qd % 32 == 0;
    std::unique_ptr<DualWeight> Wo;
    Weight wo;
    if (then_product) {
        Wo.reset(new DualWeight(DFL_TYPE_Q8_0, 48, qd, r));
        wo = Wo->wg;
        g_gpu->prepare_weight(wo);
    }
    Dual Yo((size_t)(T * 48) * 4);
    bool gemm_path = false;
    for (int dev = 0; dev < 2; dev++) {
        const bool g = dev == 1;
        AttnCall a = d.call(g, Qin, out);
        a.causal = mc.causal;
        a.window = mc.window;
        if (g) gemm_path = cuda::attention_gemm_path(b.meta(g), a);
        (g ? g_gpu : g_cpu)->attention(b.meta(g), a);
        if (then_product) (g ? g_gpu : g_cpu)->matmul(g ? wo : Wo->wc, a.out, T, g ? Yo.gp() : Yo.cp());
    }
    // The tensor-core path rounds Q, K, V and the softmax weights P to f16 (2^-12 relative rms each): a score moves by
    // about 3e-4 absolute, and an output, a weighted mean of V rows, by a few 1e-4 of its norm per rounded operand;
    // together under 1e-3 in these cases, bound 2e-3. The CUDA-core path computes in f32 like the CPU: 1e-5.
    char what[64];
    std::snprintf(what, sizeof what, "%s%s window=%d", gemm_path ? "attention (tensor cores)" : "attention",
                  mc.causal ? "" : " non-causal", mc.window);
    compare(attn_name(what, s, tk, tv, b), out, gemm_path ? 2e-3 : 1e-5);
    // int8 activations against the CPU's float product, as the norm-then-product cases
    if (then_product) {
        compare(attn_name("attention then matmul q8_0", s, tk, tv, b), Yo, 1.5e-2);
        // bit for bit against the product quantizing (and at 2..64 tokens copying into fragment order) for itself: what
        // the attention staged (CudaDevice::stage_rows) are that quantizer's bytes in the same places
        Dual other(64), Yself((size_t)(T * 48) * 4);
        g_gpu->zero(other.gp(), 64);
        g_gpu->matmul(wo, out.gp(), T, Yself.gp());
        same_bits(attn_name("attention's staging then matmul = its own quantizer's (GPU)", s, tk, tv, b), Yo.read(true),
                  Yself.read(true));
    }
}

// The masks of a DFlash draft block: non-causal (full layers), sliding causal and sliding both ways, over blocks after
// a context, several entries, a context long enough for split-K, and an entry of 64+ rows (which must not take the
// causal-only tensor-core path). Also attn_prep without Q (the draft's context rows).
void test_attention_masks(Rng &r) {
    const AttnShape shapes[] = {{32, 8, 128, 128, false}, {4, 2, 64, 64, false}};
    const AttnMaskCase masks[] = {{false, 0, false}, {true, 7, false}, {false, 7, false}, {false, 300, true},
                                  {true, 0, true},   {true, 0, false, true}, {true, 0, true, true}};
    const std::vector<std::vector<Batch::Ent>> batches = {
        {{16, 100, 0, false}},                                        // one draft block after its context
        {{16, 0, 0, false}, {8, 33, 1, false}, {1, 5, 2, false}},     // blocks of several sequences
        {{16, 3000, 0, false}, {4, 10, 1, false}},                    // long context: split-K
        {{80, 20, 0, false}},                                         // 64+ rows: the paged kernel all the same
    };
    for (const AttnShape &s : shapes)
        for (const AttnMaskCase &mc : masks)
            for (const auto &be : batches)
                for (uint32_t ct : {DFL_TYPE_F32, DFL_TYPE_F16}) {
                    Batch b(be, 16, r);
                    run_attention_case(s, ct, ct, b, r, mc);
                }
}

// Every shape, cache type (K and V alike), batch and block size, in that nesting.
template <size_t NS, size_t NC>
void run_attention_grid(const AttnShape (&shapes)[NS], const uint32_t (&ctypes)[NC],
                        const std::vector<std::vector<Batch::Ent>> &batches, std::initializer_list<int> block_sizes,
                        Rng &r) {
    for (const AttnShape &s : shapes)
        for (uint32_t ct : ctypes)
            for (const auto &be : batches)
                for (int bs : block_sizes) {
                    Batch b(be, bs, r);
                    run_attention_case(s, ct, ct, b, r);
                }
}

// Cases for the tensor-core path (entries of 64 or more query rows): GQA groups 1, 4 and 6 (qwen3-8b's 32/8 heads of
// 128, qwen3.5-27b's 24/4 heads of 256), chunks after cached tokens, several entries of different lengths, block sizes
// 16 and 5.
void test_attention_gemm_path(Rng &r) {
    const AttnShape shapes[] = {{32, 8, 128, 128, false}, {4, 4, 64, 64, false}, {24, 4, 256, 64, true}};
    const uint32_t ctypes[] = {DFL_TYPE_F16, DFL_TYPE_BF16, DFL_TYPE_Q8_0};
    const std::vector<std::vector<Batch::Ent>> batches = {
        {{64, 0, 0, false}},                                      // T = 64, a first chunk
        {{130, 70, 0, false}},                                    // T = 130 after 70 cached tokens
        {{200, 0, 0, false}, {3, 20, 1, false}, {97, 150, 2, false}},  // T = 300, three entries
    };
    run_attention_grid(shapes, ctypes, batches, {16, 5}, r);
    Batch mixed({{100, 33, 0, false}, {1, 40, 1, false}}, 5, r);  // mixed cache types, a one-token entry beside
    run_attention_case(shapes[0], DFL_TYPE_Q8_0, DFL_TYPE_F16, mixed, r);
    run_attention_case(shapes[1], DFL_TYPE_F32, DFL_TYPE_BF16, mixed, r);
    // long enough that the scores of all rows pass the 256 MB budget (32 heads x 1320 x 1312 x 6 bytes): two chunks
    // of query rows, the second with the causal column limit of a single entry
    Batch chunked({{1300, 20, 0, false}}, 16, r);
    run_attention_case({32, 8, 64, 64, false}, DFL_TYPE_F16, DFL_TYPE_F16, chunked, r);
    // 700 columns: the softmax's warp kernel at its widest (up to 1024 columns a row in registers)
    Batch wide({{700, 0, 0, false}}, 16, r);
    run_attention_case({32, 8, 64, 64, false}, DFL_TYPE_F16, DFL_TYPE_F16, wide, r);
}

void test_attention() {
    Rng r(3);
    // GQA groups 4, 1, 3, 6, 8, 2 (the kernel takes 1, 2, 3, 4, 6 or 8 heads per block); rope_dim below head_dim in
    // the last four
    const AttnShape shapes[] = {{8, 2, 128, 128, true},  {4, 4, 64, 64, false}, {6, 2, 256, 64, true},
                                {12, 2, 128, 64, false}, {16, 2, 64, 32, true}, {4, 2, 96, 32, false}};
    const uint32_t ctypes[] = {DFL_TYPE_F32, DFL_TYPE_F16, DFL_TYPE_BF16, DFL_TYPE_Q8_0};
    std::vector<std::vector<Batch::Ent>> batches = {
        {{1, 100, 0, false}},                                        // decode, T = 1
        {{3, 40, 1, false}},                                         // verify, T = 3
        {{5, 0, 0, false}, {1, 77, 1, false}, {11, 200, 2, false}},  // mixed, T = 17
        {{120, 0, 0, false}, {10, 33, 1, false}},                    // prefill, T = 130
        {{1, 3000, 0, false}},                                       // long decode: split-K attention
        {{1, 2500, 0, false}, {2, 10, 1, false}},                    // splits past a short entry's end stay empty
    };
    run_attention_grid(shapes, ctypes, batches, {16}, r);
    Batch odd({{3, 9, 0, false}, {14, 2, 1, false}}, 5, r);  // block size not a power of two, mixed cache types
    run_attention_case(shapes[0], DFL_TYPE_Q8_0, DFL_TYPE_F16, odd, r);
    test_attention_gemm_path(r);
    test_attention_masks(r);
    // decode batches: one entry, several (32 tokens: a decode step of 32 sequences), a long context (split-K),
    // positions across cache blocks of 5
    const std::vector<std::vector<Batch::Ent>> decode = {
        {{1, 100, 0, false}},
        {{1, 0, 0, false}, {1, 77, 1, false}, {1, 16, 2, false}},
        {{1, 3000, 0, false}, {1, 10, 1, false}},
    };
    run_attention_grid(shapes, ctypes, decode, {16, 5}, r);
    {
        std::vector<Batch::Ent> many;
        for (int32_t i = 0; i < 32; i++) many.push_back({1, 16 + 7 * i, i, false});
        Batch b(many, 16, r);
        run_attention_case(shapes[0], DFL_TYPE_F16, DFL_TYPE_F16, b, r);
        run_attention_case({32, 8, 128, 128, false}, DFL_TYPE_BF16, DFL_TYPE_BF16, b, r);
    }
    // token trees: per-token ancestor masks, rows straddling tiles and splits, a 64-token tree (it must not take the
    // tensor-core path) beside an ordinary prefill entry
    {
        Batch tb({{13, 60, 0, false}, {5, 20, 1, false}, {9, 0, 2, false}}, 16, r);
        tb.set_trees({random_tree(r, 13), {}, random_tree(r, 9)});
        for (uint32_t ct : {DFL_TYPE_F32, DFL_TYPE_F16, DFL_TYPE_Q8_0}) run_attention_case(shapes[0], ct, ct, tb, r);
        Batch big({{64, 300, 0, false}, {70, 10, 1, false}}, 16, r);
        big.set_trees({random_tree(r, 64), {}});
        run_attention_case(shapes[0], DFL_TYPE_F16, DFL_TYPE_F16, big, r);
    }
}

// ---- DFlash2 ----

// The dynamic convolution over draft blocks of several entries (one of a single token), both sides of the kernels,
// and the selector's transition scores with codebooks of each weight type (padded candidates and root rows included).
void test_dflash2() {
    Rng r(6);
    struct ConvShape {
        int C, K, group;
    };
    for (const ConvShape &cs : {ConvShape{64, 2, 16}, ConvShape{96, 3, 8}, ConvShape{5120, 2, 16}}) {
        Batch b({{8, 12, 0, false}, {1, 3, 1, false}, {5, 0, 2, false}, {8, 40, 3, false}}, 16, r);
        const int ng = cs.C / cs.group;
        const int64_t stride = 2ll * cs.K * ng, T = b.T;
        Dual x(rand_vec(r, (size_t)(T * cs.C))), dyn(rand_vec(r, (size_t)(T * stride), 0.5f)),
            base(rand_vec(r, (size_t)2 * cs.K * cs.C, 0.5f)), out((size_t)(T * cs.C) * 4);
        for (int side = 0; side < 2; side++) {
            for (int dev = 0; dev < 2; dev++) {
                const bool g = dev == 1;
                DynConvCall c;
                c.x = g ? x.gp() : x.cp();
                c.out = g ? out.gp() : out.cp();
                c.dyn = (g ? dyn.gp() : dyn.cp()) + side * (int64_t)cs.K * ng;
                c.dyn_stride = stride;
                c.base = (g ? base.gp() : base.cp()) + (int64_t)side * cs.K * cs.C;
                c.C = cs.C;
                c.K = cs.K;
                c.group = cs.group;
                (g ? g_gpu : g_cpu)->dyn_conv(b.meta(g), c);
            }
            compare("dyn_conv C=" + std::to_string(cs.C) + " K=" + std::to_string(cs.K) + " group=" +
                            std::to_string(cs.group) + " side " + std::to_string(side),
                        out, 1e-5);
        }
    }
    const uint32_t types[] = {DFL_TYPE_F32, DFL_TYPE_F16, DFL_TYPE_BF16, DFL_TYPE_Q8_0};
    struct SelShape {
        int K, rank, vocab;
    };
    for (const SelShape &ss : {SelShape{4, 32, 50}, SelShape{16, 256, 1000}, SelShape{5, 64, 300}}) {
        for (uint32_t type : types) {
            // two entries of 7 and 3 rows: each first row follows its root token
            const int64_t R = 10;
            std::vector<int32_t> ids((size_t)(R * ss.K)), prev((size_t)R), root((size_t)R);
            for (auto &v : ids) v = (int32_t)(r.next() % (uint64_t)ss.vocab);
            ids[(size_t)(3 * ss.K + ss.K - 1)] = -1;  // a padded candidate
            for (int64_t i = 0; i < R; i++) {
                const bool first = i == 0 || i == 7;
                prev[(size_t)i] = first ? -1 : (int32_t)(i - 1);
                root[(size_t)i] = i < 7 ? 17 : 3;
            }
            DualWeight pred(type, ss.vocab, ss.rank, r), succ(type, ss.vocab, ss.rank, r);
            Dual did(ids), dprev(prev), droot(root), dg(rand_vec(r, (size_t)(R * ss.rank))),
                trans((size_t)(R * ss.K * ss.K) * 4);
            for (int dev = 0; dev < 2; dev++) {
                const bool g = dev == 1;
                SelectorCall s;
                s.ids = g ? did.gp<int32_t>() : did.cp<int32_t>();
                s.prev = g ? dprev.gp<int32_t>() : dprev.cp<int32_t>();
                s.root = g ? droot.gp<int32_t>() : droot.cp<int32_t>();
                s.g = g ? dg.gp() : dg.cp();
                s.pred = g ? pred.wg : pred.wc;
                s.succ = g ? succ.wg : succ.wc;
                s.R = R;
                s.K = ss.K;
                s.rank = ss.rank;
                s.trans = g ? trans.gp() : trans.cp();
                (g ? g_gpu : g_cpu)->selector_trans(s);
            }
            compare(std::string("selector_trans ") + tname(type) + " K=" + std::to_string(ss.K) + " rank=" +
                            std::to_string(ss.rank),
                        trans, 1e-5);
        }
    }
}

// ---- misc ----

void test_errors() {
    g_cases++;
    bool ok = false;
    try {
        make_cuda_device(999);
    } catch (const Error &e) {
        ok = e.code == DFL_ERR_INVALID && std::string(e.what()).find("cuda:999") != std::string::npos;
    }
    std::printf("%s make_cuda_device(999) throws DFL_ERR_INVALID naming cuda:999\n", ok ? "ok  " : "FAIL");
    if (!ok) dfltest::g_failures++;
    g_cases++;
    ok = false;
    try {
        g_gpu->alloc((size_t)1 << 50, "a petabyte");
    } catch (const Error &e) {
        ok = e.code == DFL_ERR_NO_MEMORY && std::string(e.what()).find("a petabyte") != std::string::npos;
    }
    std::printf("%s alloc of 2^50 bytes throws DFL_ERR_NO_MEMORY naming what\n", ok ? "ok  " : "FAIL");
    if (!ok) dfltest::g_failures++;
}

}  // namespace

int main(int argc, char **argv) {
    using dfltest::bench_attention;
    using dfltest::test_matmul_embed;
    using dfltest::bench_gemv;
    using dfltest::profile_gemv;
    const dfltest::Group groups[] = {{"errors", test_errors},       {"matmul", test_matmul_embed}, {"norms", test_norms_elementwise},
                                     {"attention", test_attention}, {"gdn", dfltest::test_gdn},             {"dflash2", test_dflash2},
                                     {"topk", dfltest::test_topk},
                                     {"bench", bench_gemv},         {"bench", bench_attention},
                                     {"bench", dfltest::bench_sync},
                                     {"profile", profile_gemv}};
    return dfltest::run_cuda_tests(argc, argv, "the CUDA op tests", "ops", groups);
}

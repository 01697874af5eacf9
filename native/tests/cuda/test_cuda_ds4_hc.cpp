// The hyper-connection ops of the CUDA device against the CPU device (test_cuda_ds4's groups hc, hc_pre_norm,
// hc_post_mix): hc_pre, hc_post and hc_head on random streams, the folded norm, hc_pre_norm bit for bit against the
// GPU's own two ops, and hc_post_mix's parts. Bounds as in test_cuda_ds4.cpp.
#include <string>
#include <vector>

#include "cuda_test.h"

namespace dfltest {

using namespace dfl;

namespace {

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

}  // namespace

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

}  // namespace dfltest

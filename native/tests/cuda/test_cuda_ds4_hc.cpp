// The hyper-connection ops of the CUDA device against the CPU device (test_cuda_ds4's groups hc, hc_pre_norm and
// hc_site): hc_pre, hc_post and hc_head on random streams, the folded norm, hc_pre_norm bit for bit against the GPU's
// own two ops, and a whole site (the mixing product, hc_pre and the norm; one cluster kernel on sm_90+ unless
// DFL_CUDA_HC_SITE=0); keep_quant's codes of an input for several products. Bounds as in test_cuda_ds4.cpp.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_test.h"
#include "ops/cuda/cuda_device.h"

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

// hc_post of T tokens of N = 4 streams of D channels on device g's copies of the buffers.
HcPostCall hc_post_call(bool g, const Dual &F, const Dual &X, const Dual &post, const Dual &comb, int64_t T, int64_t D,
                        const Dual &out) {
    HcPostCall p;
    p.F = F.p(g);
    p.X = X.p(g);
    p.post = post.p(g);
    p.comb = comb.p(g);
    p.T = T;
    p.D = D;
    p.N = 4;
    p.out = out.p(g);
    return p;
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
                HcPostCall p = hc_post_call(g, F, X, post, comb, T, D, out);
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

// hc_pre with the sub-block's RMSNorm (Device::hc_pre_norm: the two ops, the HC site's fallback's second half)
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

// A whole HC site with its norm folded (Device::hc_site: the raw streams' mixing product, hc_pre and the sub-block's
// RMSNorm; on the GPU one cluster kernel a token unless DFL_CUDA_HC_SITE=0) against the CPU's ops, f16 and f32 mixing
// matrices; and the q8_0 product after it, which takes the staged int8 rows, bit for bit against the same product of
// the y the site wrote, quantized by the product itself. The mixing scales are small (0.05) so that Sinkhorn's
// exponents do not magnify the products' last-bit differences (their sums run in another order on the GPU).
void test_hc_site() {
    const char *env = std::getenv("DFL_CUDA_HC_SITE");
    int gpu = 0, major = 0;
    cudaGetDevice(&gpu);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu);
    const bool fused = !(env && std::string(env) == "0") && major >= 9;  // (thread-block clusters)
    for (uint32_t type : {DFL_TYPE_F16, DFL_TYPE_F32})
        for (int64_t T : {1, 3, 9})
            for (int64_t D : {1024, 4096}) {
                Rng r((uint64_t)(T * 13 + D + type));
                const int N = 4, M = (2 + N) * N;
                dfltest::DualWeight fn(type, M, N * D, r);
                Dual base(rand_vec(r, (size_t)M)), scale(rand_vec(r, 3, 0.05f)), X(rand_vec(r, (size_t)(T * N * D), 3.0f));
                Dual w(rand_vec(r, (size_t)D, 1.5f)), mix((size_t)(T * M) * 4);
                Dual x((size_t)(T * D) * 4), post((size_t)(T * N) * 4), comb((size_t)(T * N * N) * 4), y((size_t)(T * D) * 4);
                Dual p1((size_t)(T * 64) * 4), p2((size_t)(T * 64) * 4);
                dfltest::DualWeight W(DFL_TYPE_Q8_0, 64, D, r);
                g_gpu->prepare_weight(W.wg);  // repacked: its product takes int8 activations (a staged quantization)
                auto *cd = dynamic_cast<dfl::cuda::CudaDevice *>(g_gpu);
                const uint64_t combs = cd ? cd->hc_side_combs() : 0;
                uint64_t taken = 0;
                for (bool g : {false, true}) {
                    HcPreCall c = hc_pre_call(g, mix, base, scale, X, T, D, x, post, comb);
                    c.norm = true;
                    c.norm_eps = 1e-6f;
                    dev(g)->hc_site(g ? fn.wg : fn.wc, c, mix.p(g), w.p(g), 1e-6f, y.p(g));
                    if (g && cd) taken = cd->staged_taken();
                    dev(g)->matmul(g ? W.wg : W.wc, y.p(g), T, p1.p(g));
                }
                g_gpu->matmul(W.wg, y.gp(), T, p2.gp());
                const std::string sh = std::string(" ") + tname(type) + " T=" + std::to_string(T) + " D=" + std::to_string(D);
                if (fused && cd && cd->hc_side_combs() > combs) {
                    // the cluster kernel ran, not the ops: it left each token's mixing row scaled by the streams' norm
                    // scale r for the side lane's Sinkhorn, where the ops leave the CPU's row, fn · X
                    std::vector<float> want = mix.read<float>(false);
                    const std::vector<float> xs = X.read<float>(false);
                    for (int64_t t = 0; t < T; t++) {
                        double ss = 0;
                        for (int64_t i = 0; i < N * D; i++) ss += (double)xs[t * N * D + i] * xs[t * N * D + i];
                        const double rt = 1.0 / std::sqrt(ss / (double)(N * D) + 1e-6);
                        for (int m = 0; m < M; m++) want[t * M + m] = (float)(want[t * M + m] * rt);
                    }
                    compare("hc_site's cluster kernel ran (mix scaled by the norm)" + sh, mix.read<float>(true), want, 1e-4);
                    // and the product after the site took the site's int8 rows (the side lane's launch left them open)
                    const char *fq = std::getenv("DFL_CUDA_FUSE_QUANT");
                    if (!(fq && std::string(fq) == "0")) CHECK(cd->staged_taken() == taken + 1);
                } else if (fused) {  // the cluster kernel ran (without the side lane it never writes mix: its poison)
                    const std::vector<uint32_t> m = mix.read<uint32_t>(true);
                    same_bits("hc_site's cluster kernel ran (mix untouched)" + sh, m, std::vector<uint32_t>(m.size(), 0xFFFFFFFFu));
                }
                // the three ops' f16 mixing product of 2+ tokens runs on 16-bit tensor-core operands (its own bound is
                // 3e-3): x, post and comb came within 2.3e-4 of the CPU's on an H100 (12-07 09:2x); the kernel's f32
                // sums within 1e-4
                const double bound = !fused && type == DFL_TYPE_F16 && T > 1 ? 1e-3 : 1e-4;
                compare("hc_site x" + sh, x, bound);
                compare("hc_site post" + sh, post, bound);
                compare("hc_site comb" + sh, comb, bound);
                compare("hc_site y" + sh, y, bound);
                same_bits("hc_site's product = the product of its y (GPU)" + sh, p1.read(true), p2.read(true));
            }
}

// keep_quant (DeepSeek V4's FFN input: its HC site's codes for the shared and the routed experts): the codes a norm
// staged for y serve the products of y that come after other calls, a q8_0 and a q4_K one, bit for bit what each gives
// quantizing y itself after keep_quant(nullptr); both took the kept codes unless DFL_CUDA_KEEP_QUANT=0 (then neither).
void test_keep_quant() {
    auto *cd = dynamic_cast<dfl::cuda::CudaDevice *>(g_gpu);
    if (!cd) return;
    const char *env = std::getenv("DFL_CUDA_KEEP_QUANT"), *fq = std::getenv("DFL_CUDA_FUSE_QUANT");
    const bool on = !(env && std::string(env) == "0") && !(fq && std::string(fq) == "0");
    for (int64_t T : {1, 3, 9}) {
        const int64_t D = 4096;
        Rng r((uint64_t)(T * 7 + 3));
        Dual X(rand_vec(r, (size_t)(T * D), 2.0f)), w(rand_vec(r, (size_t)D, 1.5f)), y((size_t)(T * D) * 4);
        dfltest::DualWeight A(DFL_TYPE_Q8_0, 64, D, r), B(DFL_TYPE_Q4_K, 256, D, r), F(DFL_TYPE_F32, 16, D, r);
        g_gpu->prepare_weight(A.wg);
        g_gpu->prepare_weight(B.wg);
        Dual pa((size_t)(T * 64) * 4), pb((size_t)(T * 256) * 4), pf((size_t)(T * 16) * 4);
        Dual qa((size_t)(T * 64) * 4), qb((size_t)(T * 256) * 4);
        const uint64_t taken = cd->kept_taken();
        g_gpu->keep_quant(y.gp());
        g_gpu->rmsnorm(X.gp(), w.gp(), y.gp(), T, D, 1e-6f);
        g_gpu->matmul(F.wg, y.gp(), T, pf.gp());  // a call between: a staging alone would be spent by it
        g_gpu->matmul(A.wg, y.gp(), T, pa.gp());
        g_gpu->matmul(B.wg, y.gp(), T, pb.gp());
        g_gpu->keep_quant(nullptr);
        const uint64_t took = cd->kept_taken() - taken;
        g_gpu->matmul(A.wg, y.gp(), T, qa.gp());
        g_gpu->matmul(B.wg, y.gp(), T, qb.gp());
        const std::string sh = " T=" + std::to_string(T);
        CHECK(took == (on ? 2u : 0u));
        same_bits("kept codes' q8_0 product = its own quantization's" + sh, pa.read(true), qa.read(true));
        same_bits("kept codes' q4_K product = its own quantization's" + sh, pb.read(true), qb.read(true));
    }
}

// hc_post then the next HC site (HcPostCall::next_fn; on the GPU, unless DFL_CUDA_HC_PARTS=0, hc_post leaves the site's
// mixing product in partial sums, which the site's cluster kernel takes instead of the weights) against the CPU's two
// ops; and the GPU's hc_post output bit for bit with and without next_fn (the same arithmetic an output).
void test_hc_post_site() {
    const char *site_env = std::getenv("DFL_CUDA_HC_SITE"), *parts_env = std::getenv("DFL_CUDA_HC_PARTS");
    const bool ops = site_env && std::string(site_env) == "0";
    auto *cd = dynamic_cast<dfl::cuda::CudaDevice *>(g_gpu);
    // the partial sums are taken (hc_post_parts_kernel, then a site kernel that reads them) unless switched off, sm_90+
    const bool want_parts = !ops && !(parts_env && std::string(parts_env) == "0") && cd && cd->cc_major() >= 9;
    for (uint32_t type : {DFL_TYPE_F16, DFL_TYPE_F32})
        for (int64_t T : {1, 3})
            for (int64_t D : {1024, 4096}) {
                Rng r((uint64_t)(T * 17 + D + type));
                const int N = 4, M = (2 + N) * N;
                dfltest::DualWeight fn(type, M, N * D, r);
                Dual base(rand_vec(r, (size_t)M)), scale(rand_vec(r, 3, 0.05f)), X(rand_vec(r, (size_t)(T * N * D), 3.0f));
                Dual F(rand_vec(r, (size_t)(T * D))), ppost(rand_vec(r, (size_t)(T * N), 1.5f)), pcomb(rand_vec(r, (size_t)(T * N * N)));
                Dual F2(rand_vec(r, (size_t)(T * D))), w(rand_vec(r, (size_t)D, 1.5f)), mix((size_t)(T * M) * 4);
                Dual out((size_t)(T * N * D) * 4), out0((size_t)(T * N * D) * 4);
                Dual x((size_t)(T * D) * 4), post((size_t)(T * N) * 4), comb((size_t)(T * N * N) * 4), y((size_t)(T * D) * 4);
                Dual p1((size_t)(T * 64) * 4), p2((size_t)(T * 64) * 4);
                dfltest::DualWeight W(DFL_TYPE_Q8_0, 64, D, r);
                g_gpu->prepare_weight(W.wg);  // repacked: its product takes int8 activations (a staged quantization)
                const uint64_t taken = cd ? cd->hc_parts_taken() : 0;
                for (bool g : {false, true}) {
                    HcPostCall p = hc_post_call(g, F, X, ppost, pcomb, T, D, out0);
                    if (T > 1) p.F2 = F2.p(g);  // (the FFN's merge: the shared expert's output added)
                    if (g) dev(g)->hc_post(p);  // the GPU's plain hc_post first, for the bit comparison
                    p.out = out.p(g);
                    p.next_fn = g ? &fn.wg : &fn.wc;
                    dev(g)->hc_post(p);
                    HcPreCall c = hc_pre_call(g, mix, base, scale, out, T, D, x, post, comb);
                    c.norm = true;
                    c.norm_eps = 1e-6f;
                    dev(g)->hc_site(g ? fn.wg : fn.wc, c, mix.p(g), w.p(g), 1e-6f, y.p(g));
                    dev(g)->matmul(g ? W.wg : W.wc, y.p(g), T, p1.p(g));
                }
                g_gpu->matmul(W.wg, y.gp(), T, p2.gp());
                const std::string sh = std::string(" ") + tname(type) + " T=" + std::to_string(T) + " D=" + std::to_string(D);
                if (want_parts) CHECK(cd->hc_parts_taken() == taken + 1);
                compare("hc_post (next site's product begun)" + sh, out, 1e-5);
                same_bits("hc_post with next_fn = without (GPU)" + sh, out.read(true), out0.read(true));
                // (the three ops' f16 mixing product of 2+ tokens: 16-bit tensor-core operands, as test_hc_site bounds it)
                const double bound = ops && type == DFL_TYPE_F16 && T > 1 ? 1e-3 : 1e-4;
                compare("hc_site after hc_post x" + sh, x, bound);
                compare("hc_site after hc_post post" + sh, post, bound);
                compare("hc_site after hc_post comb" + sh, comb, bound);
                compare("hc_site after hc_post y" + sh, y, bound);
                same_bits("hc_site after hc_post: its product = the product of its y (GPU)" + sh, p1.read(true), p2.read(true));
            }
}

}  // namespace dfltest

// The CUDA device against the CPU device on products and embedding lookups: every weight type, the token counts of
// each kernel's paths (the GEMV, the int8 and f16 tensor-core kernels, cuBLAS), the repacked q8_0 copy, matrices of
// parts (matmul_parts), and the products that take the op before's int8 activations. Bounds as test_cuda_ops.cpp's
// header says.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "cuda_test.h"
#include "ops/device.h"
#include "rand_rows.h"
#include "test.h"

namespace dfltest {

using namespace dfl;

namespace {

double matmul_bound(uint32_t type, int64_t T) {
    // q4_K products that round the activations to int8 per block of 32 (as the repacked q8_0 path does: 1.5e-2 of the
    // output's norm): 2..64 tokens on int8 tensor cores (unless DFL_CUDA_I8_MMA=0), and up to 8 with the int8 GEMV
    // (unless DFL_CUDA_Q4K_I8=0)
    const char *i8 = std::getenv("DFL_CUDA_Q4K_I8"), *mma = std::getenv("DFL_CUDA_I8_MMA");
    const bool mma_on = !(mma && std::strcmp(mma, "0") == 0), i8_on = !(i8 && std::strcmp(i8, "0") == 0);
    if (type == DFL_TYPE_Q4_K && T >= 2 && T <= 64 && mma_on) return 1.5e-2;
    if (type == DFL_TYPE_Q4_K && T <= 8 && i8_on) return 1.5e-2;
    // q6_K products of up to 8 tokens on int8 activations too (unless DFL_CUDA_Q6K_I8=0)
    const char *q6 = std::getenv("DFL_CUDA_Q6K_I8");
    if (type == DFL_TYPE_Q6_K && T <= 8 && !(q6 && std::strcmp(q6, "0") == 0)) return 1.5e-2;
    // and 2..64 on int8 tensor cores (unless DFL_CUDA_Q6K_MMA=0)
    const char *q6m = std::getenv("DFL_CUDA_Q6K_MMA");
    if (type == DFL_TYPE_Q6_K && T >= 2 && T <= 64 && mma_on && !(q6m && std::strcmp(q6m, "0") == 0)) return 1.5e-2;
    if (T == 1 || type == DFL_TYPE_F32) return 1e-5;  // f32 GEMV or SGEMM
    // 16-bit weights of up to DFL_CUDA_GEMV16_TOKENS (8) tokens on the GEMV: float activations (split into 16-bit parts
    // of ~22 bits on the tensor cores unless DFL_CUDA_GEMV16_MMA=0: one part alone would miss this bound)
    const char *g16 = std::getenv("DFL_CUDA_GEMV16_TOKENS");
    const bool w16 = type == DFL_TYPE_F16 || type == DFL_TYPE_BF16;
    if (w16 && T <= std::min<int64_t>(8, std::max<int64_t>(1, g16 ? std::atoll(g16) : 8))) return 1e-5;
    return type == DFL_TYPE_BF16 ? 1.5e-2 : 3e-3;     // 16-bit operands on tensor cores
}

// One product of wg (W's GPU weight, prepared or not: prepare_weight's copy takes int8 activations) against the CPU's W;
// twice: run again and compared bit for bit with the first (the stream-K products add a tile's pieces in a fixed order).
void check_product(const DualWeight &W, const Weight &wg, const std::string &label, int64_t T, double bound, Rng &r,
                   bool twice) {
    Dual X(rand_vec(r, (size_t)(T * W.wc.n_in)));
    Dual Y((size_t)(T * W.wc.n_out) * 4);
    g_cpu->matmul(W.wc, X.cp(), T, Y.cp());
    g_gpu->matmul(wg, X.gp(), T, Y.gp());
    const std::string name = "matmul " + label + " " + std::to_string(W.wc.n_out) + "x" + std::to_string(W.wc.n_in) +
                             " T=" + std::to_string(T);
    compare(name, Y, bound);
    if (!twice) return;
    Dual Y2((size_t)(T * W.wc.n_out) * 4);
    g_gpu->matmul(wg, X.gp(), T, Y2.gp());
    if (Y.read<uint32_t>(true) != Y2.read<uint32_t>(true)) {
        std::printf("  %s: a repeated product gave other bits\n", name.c_str());
        g_failures++;
    }
}

void check_prepared(const DualWeight &W, const Weight &wp, const char *label, int64_t T, Rng &r) {
    check_product(W, wp, label, T, 1.5e-2, r, false);
}

void check_twice(const DualWeight &W, const Weight &wg, const std::string &label, int64_t T, double bound, Rng &r) {
    check_product(W, wg, label, T, bound, r, true);
}

// One product of W (as in the file, of type `type`) on T random rows, the GPU against the CPU.
void check_matmul(const DualWeight &W, uint32_t type, int64_t T, Rng &r) {
    check_product(W, W.wg, tname(type), T, matmul_bound(type, T), r, false);
}

// Embedding rows of W's file layout (W.wg as uploaded, before any prepare_weight), the GPU against the CPU.
void check_embed(const DualWeight &W, const std::vector<int32_t> &tok) {
    Dual tk(tok);
    Dual E(tok.size() * (size_t)W.wc.n_in * 4);
    g_cpu->embed(W.wc, tk.cp<int32_t>(), (int64_t)tok.size(), E.cp());
    g_gpu->embed(W.wg, tk.gp<int32_t>(), (int64_t)tok.size(), E.gp());
    compare(std::string("embed ") + tname(W.wc.type) + " n=" + std::to_string(W.wc.n_in), E, 1e-6);
}

}  // namespace

void test_matmul_embed() {
    const uint32_t types[] = {DFL_TYPE_F32, DFL_TYPE_F16, DFL_TYPE_BF16, DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_Q6_K};
    // 2..64: the tensor-core kernel with 1..4 token fragments of 16 (5, 17, 33: partial fragments); 65, 130: cuBLAS
    const int64_t Ts[] = {1, 2, 3, 5, 8, 16, 17, 33, 64, 65, 130};
    struct Shape {
        int64_t n_in, n_out;
    };
    // n_out below 1024, 2048 and above: 4, 2 and 1 warps per output row in the GEMV; n_out not a multiple of the
    // tensor-core kernel's 64-row tile; n_in 2048 / 4096 with few row tiles: K split over 2 / 4 blocks (and at T = 1
    // the q8_0 GEMV's two 64-block chunks of a row go to two of its four warps)
    const Shape shapes[] = {{256, 33}, {512, 7}, {1024, 300}, {256, 1500}, {512, 2100}, {2048, 300}, {4096, 700}};
    Rng r(1);
    for (uint32_t type : types) {
        for (const Shape &s : shapes) {
            DualWeight W(type, s.n_out, s.n_in, r);
            for (int64_t T : Ts) check_matmul(W, type, T, r);
            check_embed(W, {0, (int32_t)(s.n_out - 1), 3, 5, 0});
        }
    }
    // a large shape: 65 row tiles, the last of one row, and K split 4 ways; enough rows for the tensor-core kernels'
    // 32-row tiles (q4_K at 32 tokens with DFL_CUDA_Q4K_MT2_32=1)
    for (uint32_t type : types) {
        DualWeight W(type, 4097, 4096, r);
        for (int64_t T : {int64_t(1), int64_t(2), int64_t(17), int64_t(32), int64_t(64)})
            check_matmul(W, type, T, r);
    }
    // few long 16-bit rows (DeepSeek V4's HC mixing products; up to 8 tokens: a block a row and token unless
    // DFL_CUDA_GEMV_ROW_BLOCK=0; 9 tokens: past the GEMV)
    for (uint32_t type : {DFL_TYPE_F16, DFL_TYPE_BF16})
        for (const Shape &s : {Shape{16384, 24}, Shape{16384, 4}, Shape{4096, 64}, Shape{4104, 65}}) {
            DualWeight W(type, s.n_out, s.n_in, r);
            for (int64_t T : {int64_t(1), int64_t(2), int64_t(8), int64_t(9)}) check_matmul(W, type, T, r);
        }
    {  // f32 rows of inputs not a multiple of 32 (the GEMV's last step of a row partly past it)
        DualWeight W(DFL_TYPE_F32, 65, 4104, r);
        for (int64_t T : {int64_t(1), int64_t(2), int64_t(8)}) check_matmul(W, DFL_TYPE_F32, T, r);
    }
    // long q4_K and q6_K rows (the down projections of the 8B and 27B shapes; q6_K rows of 17408 inputs not a multiple
    // of 16 bytes)
    for (uint32_t type : {DFL_TYPE_Q4_K, DFL_TYPE_Q6_K})
        for (const Shape &s : {Shape{12288, 300}, Shape{17408, 70}}) {
            DualWeight W(type, s.n_out, s.n_in, r);
            for (int64_t T : {int64_t(1), int64_t(2)}) check_matmul(W, type, T, r);
        }
    // q8_0 repacked by prepare_weight, on int8 activations: T = 1 the dp4a GEMV, 2..7 the dp4a rows kernel; 8..64
    // tokens int8 tensor cores (with DFL_CUDA_I8_MMA=0 the dp4a kernels, up to 32), 16 rows per warp, or 32 where n_out
    // / 32 reaches the SM count (4500 rows: a partial last pair of tiles): 8, 9, 16, 17, 32 the staged kernel's 1..4
    // tiles of 8 tokens (inputs a multiple of 256; 288 inputs the register kernel), 33 and 64 the register kernel's 5
    // and 8 tiles (the staged kernel's with DFL_CUDA_Q8P_PIPE64=1); 130 and 200: cuBLAS on the repacked rows
    // dequantized. Activations rounded to int8 per block of 32 (relative 1/254 of the block's largest value per element,
    // random signs): 1.5e-2 of the output's norm. 12288 and 17408 inputs: the long rows of the down projections. Grids
    // of at most one block an SM with 2048 inputs or more (700, 300 and 70 rows here) split their inputs in two halves
    // added onto a zeroed output at 8..64 tokens (DFL_CUDA_Q8P_SPLITK), rows of 16,384 inputs or more (17408 here) in
    // four parts stored apart and added in order (DFL_CUDA_Q8P_SPLITK_N=4: every split product in four).
    for (const Shape &s : {Shape{256, 33}, Shape{1024, 300}, Shape{4096, 700}, Shape{288, 70}, Shape{512, 4500},
                           Shape{12288, 300}, Shape{17408, 70}}) {
        DualWeight W(DFL_TYPE_Q8_0, s.n_out, s.n_in, r);
        Weight wp = W.wg;
        g_gpu->prepare_weight(wp);
        CHECK(wp.packed != nullptr);
        for (int64_t T : {int64_t(1), int64_t(3), int64_t(8), int64_t(9), int64_t(16), int64_t(17), int64_t(32),
                          int64_t(33), int64_t(64), int64_t(130), int64_t(200)})
            check_prepared(W, wp, "q8_0 repacked", T, r);
    }
    // one token of wide matrices (4224 rows or more): two rows a warp, staged ahead (DFL_CUDA_GEMV_AHEAD=A, 8 by
    // default, 4) where the rows have 512 A inputs or more (every shape here at 4; at 8 the 2048-input one falls back to
    // the rows kernel), else and with DFL_CUDA_GEMV_AHEAD=0 the rows kernel; 4500 and 4225 rows: a partial last pair.
    // (The narrower one-token shapes above take the staged-ahead kernel one row a warp.)
    for (const Shape &s : {Shape{4096, 6144}, Shape{5120, 4500}, Shape{12288, 4225}, Shape{2048, 4224}}) {
        DualWeight W(DFL_TYPE_Q8_0, s.n_out, s.n_in, r);
        Weight wp = W.wg;
        g_gpu->prepare_weight(wp);
        CHECK(wp.packed != nullptr);
        check_prepared(W, wp, "q8_0 repacked", 1, r);
    }
    // a matrix of many waves of row tiles (17,000 rows: a partial last tile) at 8..24 tokens
    {
        DualWeight W(DFL_TYPE_Q8_0, 17000, 1024, r);
        Weight wp = W.wg;
        g_gpu->prepare_weight(wp);
        CHECK(wp.packed != nullptr);
        for (int64_t T : {int64_t(8), int64_t(9), int64_t(16), int64_t(17), int64_t(23), int64_t(24)})
            check_twice(W, wp, "q8_0 repacked", T, 1.5e-2, r);
    }
    // stream-K at 8..32 tokens: rows of 16,384 inputs on fewer tiles than blocks (1000 rows: 32 tiles, a partial last
    // one) by default, each tile cut in pieces added in order; with DFL_CUDA_Q8P_STREAM=1 also the 27B's o shape (5120
    // x 6144, 160 tiles; 4500 rows: a partial last tile) and the 17,000-row matrix above (at most two pieces a tile,
    // added onto a zeroed output). Either way a product repeated gives the same bits.
    for (const Shape &s : {Shape{16384, 1000}, Shape{6144, 5120}, Shape{6144, 4500}}) {
        DualWeight W(DFL_TYPE_Q8_0, s.n_out, s.n_in, r);
        Weight wp = W.wg;
        g_gpu->prepare_weight(wp);
        CHECK(wp.packed != nullptr);
        for (int64_t T : {int64_t(8), int64_t(16), int64_t(17), int64_t(32)})
            check_twice(W, wp, "q8_0 repacked", T, 1.5e-2, r);
    }
    // q4_K at 2..32 tokens on grids that stream (unless DFL_CUDA_Q4K_STREAM=0): 66 tiles (a partial last one) of 8 stages
    // (pieces in slots) and 532 tiles of 2 (pieces added onto a zeroed output); a repeated product gives the same bits
    for (const Shape &s : {Shape{4096, 2100}, Shape{1024, 17000}}) {
        DualWeight W(DFL_TYPE_Q4_K, s.n_out, s.n_in, r);
        for (int64_t T : {int64_t(2), int64_t(8), int64_t(16), int64_t(17), int64_t(32)})
            check_twice(W, W.wg, "q4_K", T, matmul_bound(DFL_TYPE_Q4_K, T), r);
    }
    // one token of a wide matrix of long rows (the 27B's down projection: the rows kernel, split in parts)
    {
        DualWeight W(DFL_TYPE_Q8_0, 4224, 17408, r);
        Weight wp = W.wg;
        g_gpu->prepare_weight(wp);
        CHECK(wp.packed != nullptr);
        for (int64_t T : {int64_t(1), int64_t(2)}) check_prepared(W, wp, "q8_0 repacked", T, r);
    }
    // q4_0: prepare_weight turns it into the q8_0 blocks of the same values (and repacks those), so every q8_0 path
    // multiplies it, at the repacked q8_0 bound; the embedding reads the q4_0 rows themselves.
    for (const Shape &s : {Shape{256, 33}, Shape{1024, 300}, Shape{4096, 700}}) {
        DualWeight W(DFL_TYPE_Q4_0, s.n_out, s.n_in, r);
        Weight wp = W.wg;
        g_gpu->prepare_weight(wp);
        CHECK(wp.type == DFL_TYPE_Q8_0 && wp.packed != nullptr);
        for (int64_t T : {int64_t(1), int64_t(3), int64_t(16), int64_t(64), int64_t(130)})
            check_prepared(W, wp, "q4_0 as q8_0", T, r);
        check_embed(W, {0, (int32_t)(s.n_out - 1), 3});
    }
    // Matrices of parts laid side by side (q|k|v, gate|up), each part's rows into its own output (matmul_parts): T =
    // 17 the parts one by one, 65 and 130 one cuBLAS product; 10000 x 4096 rows dequantize in two chunks, the first
    // ending inside the second part. q8_0 with and without its repacked copy (a part of a repacked matrix is a repacked
    // matrix of its own, Weight::rows: at 17 tokens on the int8 kernels, the repacked path's bound).
    struct PartsCase {
        uint32_t type;
        bool repack;
    };
    for (const PartsCase &pcase : {PartsCase{DFL_TYPE_F32, false}, PartsCase{DFL_TYPE_F16, false},
                                   PartsCase{DFL_TYPE_Q8_0, false}, PartsCase{DFL_TYPE_Q8_0, true},
                                   PartsCase{DFL_TYPE_Q4_K, false}, PartsCase{DFL_TYPE_Q6_K, false}}) {
        const uint32_t type = pcase.type;
        const bool repack = pcase.repack, big = repack;
        const int64_t n_in = big ? 4096 : 512;
        const std::vector<int64_t> rows = big ? std::vector<int64_t>{5000, 5000} : std::vector<int64_t>{300, 64, 70};
        int64_t n_out = 0;
        for (int64_t n : rows) n_out += n;
        DualWeight W(type, n_out, n_in, r);
        Weight wg = W.wg;
        if (repack) g_gpu->prepare_weight(wg);
        for (int64_t T : {int64_t(17), int64_t(65), int64_t(130)}) {
            Dual X(rand_vec(r, (size_t)(T * n_in)));
            std::vector<Weight> pc, pg;
            std::vector<std::unique_ptr<Dual>> Y;
            int64_t r0 = 0;
            for (int64_t n : rows) {
                pc.push_back(W.wc.rows(r0, n));
                pg.push_back(wg.rows(r0, n));
                Y.push_back(std::make_unique<Dual>((size_t)(T * n) * 4));
                r0 += n;
            }
            std::vector<std::pair<const Weight *, float *>> parts;
            for (size_t i = 0; i < rows.size(); i++) {
                g_cpu->matmul(pc[i], X.cp(), T, Y[i]->cp());
                parts.emplace_back(&pg[i], Y[i]->gp());
            }
            g_gpu->matmul_parts(wg, parts, X.gp(), T);
            const double bound = repack && T <= 64 ? 1.5e-2 : matmul_bound(type, T);
            for (size_t i = 0; i < rows.size(); i++)
                compare(std::string("matmul_parts ") + tname(type) + (repack ? " repacked " : " ") +
                            std::to_string(n_out) + "x" + std::to_string(n_in) + " part " + std::to_string(i) +
                            " T=" + std::to_string(T),
                        *Y[i], bound);
        }
    }
    // A norm, an add+norm or a SwiGLU followed at once by a product of its output. Unless DFL_CUDA_FUSE_QUANT=0 the
    // product takes the int8 activations the op before it wrote (CudaDevice::stage_quant), the bytes its own
    // quantizer would write; an op in between (here a zero of another buffer) makes it quantize for itself.
    {
        DualWeight W8(DFL_TYPE_Q8_0, 700, 4096, r), W4(DFL_TYPE_Q4_K, 300, 4096, r);
        Weight w8 = W8.wg;
        g_gpu->prepare_weight(w8);
        Dual other(64);
        for (int64_t T : {int64_t(1), int64_t(3), int64_t(17)}) {
            for (int kind = 0; kind < 5; kind++) {
                const bool q4 = kind == 2;
                const DualWeight &W = q4 ? W4 : W8;
                const Weight &wg = q4 ? W4.wg : w8;
                Dual x(rand_vec(r, (size_t)(T * 4096))), d(rand_vec(r, (size_t)(T * 4096))), w(rand_vec(r, 4096));
                Dual xn((size_t)(T * 4096) * 4), Y((size_t)(T * W.wc.n_out) * 4);
                const int64_t fs = 2 * 4096 + 64;  // kind 4: gate|up rows where a fused product leaves them
                Dual f(rand_vec(r, (size_t)(T * (kind == 4 ? fs : 1))));
                for (bool gpu : {false, true}) {
                    Device *dev = gpu ? g_gpu : g_cpu;
                    float *in = xn.p(gpu);
                    switch (kind) {
                    case 0: dev->rmsnorm(x.p(gpu), w.p(gpu), xn.p(gpu), T, 4096, 1e-6f); break;
                    case 1: dev->add_rmsnorm(x.p(gpu), d.p(gpu), w.p(gpu), xn.p(gpu), T, 4096, 1e-6f); break;
                    case 2: dev->swiglu(x.p(gpu), d.p(gpu), T * 4096), in = x.p(gpu); break;
                    case 4: dev->swiglu_rows(xn.p(gpu), f.p(gpu), f.p(gpu) + 4096, T, 4096, fs); break;
                    default:
                        dev->rmsnorm(x.p(gpu), w.p(gpu), xn.p(gpu), T, 4096, 1e-6f);
                        dev->zero(other.p(gpu), 64);
                    }
                    dev->matmul(gpu ? wg : W.wc, in, T, Y.p(gpu));
                }
                static const char *names[] = {"rmsnorm", "add_rmsnorm", "swiglu", "rmsnorm, zero,", "swiglu_rows"};
                compare(std::string(names[kind]) + " then matmul " + (q4 ? "q4_K" : "q8_0 repacked") + " T=" +
                            std::to_string(T),
                        Y, 1.5e-2);
            }
        }
    }
    // At 2..64 tokens, bit for bit on the GPU against the same product quantizing and copying for itself (an op in
    // between): the norm's staged codes, and from 8 tokens (unless DFL_CUDA_STAGE_FRAG=0) their copy in the tensor-core
    // products' fragment order (CudaDevice::stage_rows, QuantX::fq), which a repacked q8_0 product then takes with no
    // copy launch. 700 rows: a split-K product (halves added onto its zeroed output); 6144 rows: one part a tile.
    {
        for (int64_t n_out : {int64_t(700), int64_t(6144)}) {
            DualWeight W(DFL_TYPE_Q8_0, n_out, 4096, r);
            Weight wg = W.wg;
            g_gpu->prepare_weight(wg);
            Dual other(64);
            for (int64_t T : {2, 5, 8, 9, 16, 17, 32, 40, 64}) {
                Dual x(rand_vec(r, (size_t)(T * 4096))), w(rand_vec(r, 4096)), xn((size_t)(T * 4096) * 4);
                Dual y1((size_t)(T * n_out) * 4), y2((size_t)(T * n_out) * 4);
                g_gpu->rmsnorm(x.gp(), w.gp(), xn.gp(), T, 4096, 1e-6f);
                g_gpu->matmul(wg, xn.gp(), T, y1.gp());
                g_gpu->rmsnorm(x.gp(), w.gp(), xn.gp(), T, 4096, 1e-6f);
                g_gpu->zero(other.gp(), 64);
                g_gpu->matmul(wg, xn.gp(), T, y2.gp());
                same_bits("rmsnorm then matmul q8_0 repacked " + std::to_string(n_out) + "x4096 T=" + std::to_string(T) +
                              " = its own quantizer's (GPU)",
                          y1.read(true), y2.read(true));
            }
        }
    }
    // An output projection with the residual add and the next norm (Device::matmul_add_rmsnorm), then the one product
    // that reads the norm's output. Unless DFL_CUDA_RESID_NORM=0 one token folds the norm into the first product (its
    // codes staged without the norm's scale, which the second applies): the second's output against the CPU's ops and
    // closely against the GPU's ops apart, the residual bit for bit (the same product sums, the same add). 4096 rows:
    // the qwen3-8b o and down projections (a block of 32 rows each 32 of them); 5120: the 27B's out, o and down (two
    // rows a warp, groups of four blocks; not with DFL_CUDA_RESID_NORM=1); the products after on two rows a warp
    // (6144) and one (700). q4_K (not with DFL_CUDA_RESID_NORM=1): qwen3-8b q4_K's o before its q|k|v or gate|up (groups of
    // eight blocks of the int8 GEMV), and q8_0 and q4_K each before the other. 8..32 tokens: the ops apart, as a verify
    // block's, both products on the tensor-core kernels, the one after taking the norm's rows in fragment order
    // (stage_rows; 12 tokens: its padding tokens).
    struct FoldCase {
        uint32_t type, next_type;
        int64_t n, n_in;
    };
    // A folded norm never writes its output (xn, poisoned to NaN by Dual): counting the cases that leave it so says
    // the fold ran, so that the cases do not silently check the ops apart where the fold is on.
    int folded = 0;
    for (const FoldCase &fc : std::vector<FoldCase>{{DFL_TYPE_Q8_0, DFL_TYPE_Q8_0, 4096, 4096},
                                                    {DFL_TYPE_Q8_0, DFL_TYPE_Q8_0, 4096, 12288},
                                                    {DFL_TYPE_Q8_0, DFL_TYPE_Q8_0, 5120, 6144},
                                                    {DFL_TYPE_Q4_K, DFL_TYPE_Q4_K, 4096, 4096},
                                                    {DFL_TYPE_Q4_K, DFL_TYPE_Q8_0, 4096, 4096},
                                                    {DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, 4096, 4096}}) {
        const int64_t n = fc.n, n_in = fc.n_in;
        DualWeight W(fc.type, n, n_in, r), Wn0(fc.next_type, 6144, n, r), Wn1(fc.next_type, 700, n, r);
        Weight wg = W.wg;
        g_gpu->prepare_weight(wg);
        for (const DualWeight *N : {&Wn0, &Wn1}) {
            Weight ng = N->wg;
            g_gpu->prepare_weight(ng);
            for (int64_t T : {1, 2, 8, 12, 16, 32}) {
                const std::vector<float> x0 = rand_vec(r, (size_t)(T * n));
                Dual X(rand_vec(r, (size_t)(T * n_in))), x(x0), w(rand_vec(r, (size_t)n)), d((size_t)(T * n) * 4),
                    xn((size_t)(T * n) * 4), Y((size_t)(T * N->wc.n_out) * 4), x2(x0), Y2((size_t)(T * N->wc.n_out) * 4);
                for (bool gpu : {false, true}) {
                    Device *dev = gpu ? g_gpu : g_cpu;
                    dev->matmul_add_rmsnorm(gpu ? wg : W.wc, X.p(gpu), T, d.p(gpu), x.p(gpu), w.p(gpu), xn.p(gpu), 1e-6f,
                                            gpu ? &ng : &N->wc);
                    dev->matmul(gpu ? ng : N->wc, xn.p(gpu), T, Y.p(gpu));
                }
                const std::vector<uint32_t> xn_bits = xn.read<uint32_t>(true);
                if (std::all_of(xn_bits.begin(), xn_bits.end(), [](uint32_t b) { return b == 0xFFFFFFFFu; }))
                    folded++;
                // the GPU's two ops apart (an op between: nothing staged for the product)
                g_gpu->matmul(wg, X.gp(), T, d.gp());
                g_gpu->add_rmsnorm(x2.gp(), d.gp(), w.gp(), xn.gp(), T, n, 1e-6f);
                g_gpu->matmul(ng, xn.gp(), T, Y2.gp());
                const std::string what = std::string("matmul_add_rmsnorm ") + tname(fc.type) + " " + std::to_string(n) +
                                         "x" + std::to_string(n_in) + " then " + tname(fc.next_type) + " " +
                                         std::to_string(N->wc.n_out) + "x" + std::to_string(n) + " T=" + std::to_string(T);
                compare(what, Y, 1.5e-2);
                compare(what + " x", x, 1.5e-2);
                same_bits(what + " x = the ops apart (GPU)", x.read(true), x2.read(true));
                compare(what + " = the ops apart (GPU)", Y.read(true), Y2.read(true), 2e-3);
            }
        }
    }
    {
        // DFL_CUDA_RESID_NORM=0: no fold
        const char *m = std::getenv("DFL_CUDA_RESID_NORM");
        const bool off = m && std::strcmp(m, "0") == 0;
        const bool ok = off ? folded == 0 : folded > 0;
        g_cases++;
        std::printf("%s the fold ran in %d cases (fold %s)\n", ok ? "ok  " : "FAIL", folded, off ? "off" : "on");
        if (!ok) g_failures++;
    }
    // A device call between a folded norm and its product (a capture's copy, say) would leave the product to read the
    // norm's output, which the fold never writes: it fails loudly, and the device works after (the staging spent).
    if (std::getenv("DFL_CUDA_RESID_NORM") == nullptr || std::strcmp(std::getenv("DFL_CUDA_RESID_NORM"), "0") != 0) {
        DualWeight W(DFL_TYPE_Q8_0, 4096, 4096, r), N(DFL_TYPE_Q8_0, 6144, 4096, r);
        Weight wg = W.wg, ng = N.wg;
        g_gpu->prepare_weight(wg);
        g_gpu->prepare_weight(ng);
        Dual X(rand_vec(r, 4096)), x(rand_vec(r, 4096)), w(rand_vec(r, 4096)), d(4096 * 4), xn(4096 * 4), other(64),
            Y(6144 * 4);
        g_gpu->matmul_add_rmsnorm(wg, X.gp(), 1, d.gp(), x.gp(), w.gp(), xn.gp(), 1e-6f, &ng);
        bool ok = false;
        try {
            g_gpu->zero(other.gp(), 64);
        } catch (const Error &e) {
            ok = e.code == DFL_ERR_INTERNAL && std::string(e.what()).find("folded norm") != std::string::npos;
        }
        g_cases++;
        std::printf("%s a call between a folded norm and its product throws DFL_ERR_INTERNAL\n", ok ? "ok  " : "FAIL");
        if (!ok) g_failures++;
        g_gpu->zero(other.gp(), 64);  // (the staging is spent: the device goes on)
        g_gpu->rmsnorm(x.gp(), w.gp(), xn.gp(), 1, 4096, 1e-6f);
        g_gpu->matmul(ng, xn.gp(), 1, Y.gp());
        g_gpu->sync();
    }
    // Two chains on two lanes (Device::side_begin / side_end / join_side, run side by side on the GPU unless
    // DFL_CUDA_LANES=0): a norm staged on the main lane, a norm and two products on the side lane, then
    // the main lane's product, which still takes its norm's int8 rows: each lane's products quantize into that lane's
    // scratch (mma and split-K buffers too), so neither overwrites what the other reads.
    {
        DualWeight Wm(DFL_TYPE_Q8_0, 4096, 4096, r), Ws(DFL_TYPE_Q8_0, 2048, 4096, r), Ws2(DFL_TYPE_Q4_K, 700, 2048, r);
        Weight wm = Wm.wg, ws = Ws.wg;
        g_gpu->prepare_weight(wm);
        g_gpu->prepare_weight(ws);
        for (int64_t T : {int64_t(1), int64_t(16)}) {
            Dual xm(rand_vec(r, (size_t)(T * 4096))), xs(rand_vec(r, (size_t)(T * 4096))), w(rand_vec(r, 4096));
            Dual nm((size_t)(T * 4096) * 4), ns((size_t)(T * 4096) * 4), ym((size_t)(T * 4096) * 4),
                ys((size_t)(T * 2048) * 4), zs((size_t)(T * 700) * 4);
            for (bool gpu : {false, true}) {
                Device *dev = gpu ? g_gpu : g_cpu;
                dev->rmsnorm(xm.p(gpu), w.p(gpu), nm.p(gpu), T, 4096, 1e-6f);
                dev->side_begin();
                dev->rmsnorm(xs.p(gpu), w.p(gpu), ns.p(gpu), T, 4096, 1e-6f);
                dev->matmul(gpu ? ws : Ws.wc, ns.p(gpu), T, ys.p(gpu));
                dev->matmul(gpu ? Ws2.wg : Ws2.wc, ys.p(gpu), T, zs.p(gpu));
                dev->side_end();
                dev->matmul(gpu ? wm : Wm.wc, nm.p(gpu), T, ym.p(gpu));
                dev->join_side();
            }
            const std::string t = " T=" + std::to_string(T);
            compare("lanes: main rmsnorm then matmul q8_0" + t, ym, 1.5e-2);
            compare("lanes: side rmsnorm then matmul q8_0" + t, ys, 1.5e-2);
            compare("lanes: side matmul q4_K after it" + t, zs, 3e-2);
        }
    }
    // n_in not a multiple of the 256-wide K tile (q8_0 9 blocks, f16/bf16 264): the last tile is partial, and q8_0
    // rows of 306 bytes start at every even offset mod 16
    for (uint32_t type : {DFL_TYPE_Q8_0, DFL_TYPE_F16, DFL_TYPE_BF16}) {
        const int64_t n_in = type == DFL_TYPE_Q8_0 ? 288 : 264;
        DualWeight W(type, 70, n_in, r);
        for (int64_t T : {int64_t(2), int64_t(16), int64_t(40)}) {
            Dual X(rand_vec(r, (size_t)(T * n_in)));
            Dual Y((size_t)(T * 70) * 4);
            g_cpu->matmul(W.wc, X.cp(), T, Y.cp());
            g_gpu->matmul(W.wg, X.gp(), T, Y.gp());
            compare(std::string("matmul ") + tname(type) + " 70x" + std::to_string(n_in) + " T=" + std::to_string(T),
                        Y, matmul_bound(type, T));
        }
    }
    // a tensor that starts 2 bytes past a 16-byte boundary (and so ends off one): the tensor-core kernel's first and
    // last words of the tensor are read byte by byte, never outside it
    for (uint32_t type : {DFL_TYPE_Q8_0, DFL_TYPE_Q6_K, DFL_TYPE_F16}) {
        const int64_t n_in = 512, n_out = 37;
        DualWeight W(type, n_out, n_in, r);
        std::vector<uint8_t> shifted(W.host.size() + 2, 0);
        std::memcpy(shifted.data() + 2, W.host.data(), W.host.size());
        Weight wg = W.wg;
        wg.data = g_gpu->upload_weight(shifted.data(), shifted.size(), true) + 2;
        for (int64_t T : {int64_t(1), int64_t(5), int64_t(17)}) {
            Dual X(rand_vec(r, (size_t)(T * n_in)));
            Dual Y((size_t)(T * n_out) * 4);
            g_cpu->matmul(W.wc, X.cp(), T, Y.cp());
            g_gpu->matmul(wg, X.gp(), T, Y.gp());
            compare(std::string("matmul ") + tname(type) + " 37x512 at +2 bytes T=" + std::to_string(T), Y,
                        matmul_bound(type, T));
        }
    }
    // shapes the vector kernels refuse (n_in not a multiple of 8): the generic gemv, and SGEMM
    for (int64_t T : {int64_t(1), int64_t(3), int64_t(17)}) {
        DualWeight W(DFL_TYPE_F32, 19, 37, r);
        Dual X(rand_vec(r, (size_t)(T * 37)));
        Dual Y((size_t)(T * 19) * 4);
        g_cpu->matmul(W.wc, X.cp(), T, Y.cp());
        g_gpu->matmul(W.wg, X.gp(), T, Y.gp());
        compare("matmul f32 19x37 (unaligned) T=" + std::to_string(T), Y, 1e-5);
    }
}

}  // namespace dfltest

// The matmul paths against float64: the float path for every weight type, and the integer kernels (every kernel set
// this CPU supports, AMX's stand-in among them) within their quantization error and bitwise batch-independent.
#include <algorithm>
#include <cstring>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/qgemm.h"
#include "ref.h"
#include "test.h"
#include "weights.h"

using namespace dfl;
using namespace dfltest;

namespace {

double max_abs(const std::vector<double> &v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    return m;
}

}  // namespace

// The float path (the reference for the integer kernels below), for every weight type.
TEST(matmul_all_weight_types) {
    set_int8_kernels("off");
    Rng rng(21);
    ThreadPool pool(3);
    Scratch scratch(3);
    const int64_t n_out = 13;
    for (uint32_t type : {DFL_TYPE_F32, DFL_TYPE_F16, DFL_TYPE_BF16, DFL_TYPE_Q4_0, DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_Q6_K})
      for (int64_t n_in : {512, 520}) {  // 520: a tail past the last 16 elements (the float types only)
        if (n_in % type_block(type) != 0) continue;
        const auto raw = random_weight(type, n_in, n_out, rng);
        const Weight W = make_weight(type, n_in, n_out, raw);
        for (int64_t T : {1, 3, 37}) {
            std::vector<float> X((size_t)(T * n_in)), Y((size_t)(T * n_out));
            for (auto &x : X) x = rng.sym();
            matmul(pool, scratch, W, X.data(), T, Y.data());
            for (int64_t t = 0; t < T; t++) {
                std::vector<double> ref((size_t)n_out);
                for (int64_t o = 0; o < n_out; o++) {
                    double s = 0;
                    for (int64_t i = 0; i < n_in; i++) s += ref_row_elem(type, W.row(o), i) * X[(size_t)(t * n_in + i)];
                    ref[(size_t)o] = s;
                }
                const double scale = std::max(1.0, max_abs(ref));
                for (int64_t o = 0; o < n_out; o++) CHECK_CLOSE(Y[(size_t)(t * n_out + o)], ref[(size_t)o], 2e-6 * scale);
                // a row computed alone is bitwise the row computed in a batch
                std::vector<float> y1((size_t)n_out);
                matmul(pool, scratch, W, X.data() + t * n_in, 1, y1.data());
                for (int64_t o = 0; o < n_out; o++) CHECK(y1[(size_t)o] == Y[(size_t)(t * n_out + o)]);
            }
        }
      }
    set_int8_kernels("auto");
}

// The integer kernels against float64, in two steps:
//  1. kernel arithmetic: against the exact product of the weights with the activations as quantized (x' = d * q,
//     recomputed here from the kernel's own codes), within float rounding: 2e-6 of the output scale, as the float path;
//  2. the quantization: with d = max|x_b| / 127 per block b and q = round(x / d), |x - x'| <= d / 2 = max|x_b| / 254,
//     so |y - y'| <= sum_b max|x_b| / 254 * sum_{i in b} |w_i|: that bound (+ step 1's tolerance) must hold against
//     the float reference.
// Each kernel set this CPU supports runs; tile edges (rows and tokens not multiples of 4, more tokens than one token
// block) are covered, and a token's output must be bitwise the same alone as in a batch.
TEST(matmul_int8_kernels_within_quantization_error) {
    Rng rng(77);
    ThreadPool pool(3);
    Scratch scratch(3);
    for (const char *set : {"generic", "avx2", "avxvnni", "avx512vnni", "avx512amx-emu", "avx512amx"}) {
        set_int8_kernels(set);
        if (std::strcmp(int8_kernels(), set) != 0) continue;  // not supported on this CPU
        for (uint32_t type : {DFL_TYPE_Q4_0, DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_Q6_K}) {
          for (int64_t n_in : {512, 480}) {  // 480: an odd number of q8_0 blocks (a half-empty last pair)
            if (n_in % type_block(type) != 0) continue;
            for (int64_t n_out : {13, 70}) {
                const auto raw = random_weight(type, n_in, n_out, rng);
                const Weight W = make_weight(type, n_in, n_out, raw);
                CHECK(int8_matmul_applies(W));
                for (int64_t T : {1, 3, 6, 70}) {
                    std::vector<float> X((size_t)(T * n_in)), Y((size_t)(T * n_out));
                    for (auto &x : X) x = rng.sym() * (float)(1 + 4 * rng.uniform());  // varied block ranges
                    if (T > 1) X[7] = -X[7] * 50;  // an outlier block
                    matmul(pool, scratch, W, X.data(), T, Y.data());
                    std::vector<int8_t> q((size_t)n_in);
                    std::vector<float> d((size_t)n_in / kActBlock), ds((size_t)n_in / kActBlock);
                    for (int64_t t = 0; t < T; t++) {
                        const float *x = X.data() + t * n_in;
                        quantize_act_row(x, n_in, q.data(), d.data(), ds.data());
                        std::vector<double> exact((size_t)n_out), quantized((size_t)n_out), bound((size_t)n_out);
                        for (int64_t o = 0; o < n_out; o++) {
                            double s = 0, sq = 0, b = 0;
                            for (int64_t blk = 0; blk < n_in / kActBlock; blk++) {
                                double amax = 0, wabs = 0;
                                for (int64_t i = blk * kActBlock; i < (blk + 1) * kActBlock; i++) {
                                    const double w = ref_row_elem(type, W.row(o), i);
                                    s += w * x[i];
                                    sq += w * ((double)d[(size_t)blk] * q[(size_t)i]);
                                    amax = std::max(amax, std::fabs((double)x[i]));
                                    wabs += std::fabs(w);
                                }
                                b += amax / 254 * wabs;
                            }
                            exact[(size_t)o] = s;
                            quantized[(size_t)o] = sq;
                            bound[(size_t)o] = b;
                        }
                        const double tol = 2e-6 * std::max(1.0, max_abs(exact));
                        for (int64_t o = 0; o < n_out; o++) {
                            const float got = Y[(size_t)(t * n_out + o)];
                            CHECK_CLOSE(got, quantized[(size_t)o], tol);
                            CHECK_CLOSE(got, exact[(size_t)o], bound[(size_t)o] * (1 + 1e-6) + tol);
                        }
                        std::vector<float> y1((size_t)n_out);
                        matmul(pool, scratch, W, x, 1, y1.data());
                        for (int64_t o = 0; o < n_out; o++) CHECK(y1[(size_t)o] == Y[(size_t)(t * n_out + o)]);
                    }
                }
            }
          }
        }
    }
    set_int8_kernels("auto");
}

// A matrix packed at load (Weight::packed, the AVX-512 kernels' layout) gives bitwise the products of the same
// matrix repacked per task, for row counts that leave a partial group and odd numbers of q8_0 blocks.
TEST(matmul_int8_packed_weight_is_bitwise_the_unpacked) {
    Rng rng(79);
    ThreadPool pool(3);
    Scratch scratch(3);
    set_int8_kernels("auto");
    for (uint32_t type : {DFL_TYPE_Q4_0, DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_Q6_K}) {
        for (int64_t n_in : {512, 480}) {
            if (n_in % type_block(type) != 0) continue;
            const int64_t n_out = 70;
            const auto raw = random_weight(type, n_in, n_out, rng);
            Weight W = make_weight(type, n_in, n_out, raw);
            const uint64_t bytes = int8_packed_bytes(W);
            if (bytes == 0) continue;  // these kernels keep no layout of their own for this type
            // the original's size, + 32 bytes a group (an odd last q4_0/q8_0 block) or a q6_K super-block at most
            const uint64_t groups = (uint64_t)(n_out + 15) / 16;
            CHECK(bytes <= groups * (16 * row_bytes(type, n_in) + 32 * (uint64_t)std::max<int64_t>(1, n_in / 256)));
            std::vector<uint8_t> packed(bytes);
            int8_pack_groups(W, 0, int8_pack_group_count(W), packed.data());
            for (int64_t T : {1, 5, 70}) {
                std::vector<float> X((size_t)(T * n_in)), Y0((size_t)(T * n_out)), Y1((size_t)(T * n_out));
                for (auto &x : X) x = rng.sym();
                W.packed = nullptr;
                matmul(pool, scratch, W, X.data(), T, Y0.data());
                W.packed = packed.data();
                matmul(pool, scratch, W, X.data(), T, Y1.data());
                for (size_t i = 0; i < Y0.size(); i++) CHECK(Y0[i] == Y1[i]);
            }
        }
    }
}

// Row slices of a packed matrix (Weight::rows: an expert of a packed stack, a group of a grouped projection) read
// their part of the packed copy where they start on a group of 16 rows, and give bitwise the products of the same
// rows repacked per task; a slice starting inside a group has no packed rows and repacks.
TEST(matmul_int8_packed_row_slices) {
    Rng rng(97);
    ThreadPool pool(2);
    Scratch scratch(2);
    set_int8_kernels("auto");
    for (uint32_t type : {DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_Q6_K}) {
        const int64_t n_in = 512, n_out = 96;  // a stack of 3 experts of 32 rows
        const auto raw = random_weight(type, n_in, n_out, rng);
        Weight W = make_weight(type, n_in, n_out, raw);
        const uint64_t bytes = int8_packed_bytes(W);
        if (bytes == 0) continue;
        std::vector<uint8_t> packed(bytes);
        int8_pack_groups(W, 0, int8_pack_group_count(W), packed.data());
        W.packed = packed.data();
        W.packed_group = kInt8GroupRows;
        W.packed_group_bytes = int8_pack_group_bytes(W);
        CHECK(W.packed_group_bytes * (uint64_t)int8_pack_group_count(W) == bytes);
        for (const auto &[r0, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 32}, {32, 32}, {64, 32}, {48, 20}, {40, 16}}) {
            const Weight S = W.rows(r0, n);
            CHECK((S.packed != nullptr) == (r0 % 16 == 0));
            Weight U = S;
            U.packed = nullptr;
            for (int64_t T : {1, 9}) {
                std::vector<float> X((size_t)(T * n_in)), Y0((size_t)(T * n)), Y1((size_t)(T * n));
                for (auto &x : X) x = rng.sym();
                matmul(pool, scratch, U, X.data(), T, Y0.data());
                matmul(pool, scratch, S, X.data(), T, Y1.data());
                for (size_t i = 0; i < Y0.size(); i++) CHECK(Y0[i] == Y1[i]);
            }
        }
    }
}

// matmul_each (q, k and v in one parallel region, the input quantized once) gives each part bitwise what its own
// matmul gives, on the integer tiles and where a part's type sends all of them back to one product each.
TEST(matmul_each_is_bitwise_each_matmul) {
    Rng rng(83);
    ThreadPool pool(3);
    Scratch scratch(3);
    set_int8_kernels("auto");
    const int64_t n_in = 512;
    for (uint32_t odd : {DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_F16}) {
        const std::vector<std::pair<uint32_t, int64_t>> shapes = {{DFL_TYPE_Q8_0, 96}, {odd, 48}, {DFL_TYPE_Q8_0, 40}};
        std::vector<std::vector<uint8_t>> raws;
        std::vector<Weight> ws;
        for (const auto &sh : shapes) raws.push_back(random_weight(sh.first, n_in, sh.second, rng));
        for (size_t i = 0; i < shapes.size(); i++) ws.push_back(make_weight(shapes[i].first, n_in, shapes[i].second, raws[i]));
        for (int64_t T : {1, 7, 70}) {
            std::vector<float> X((size_t)(T * n_in));
            for (auto &x : X) x = rng.sym();
            std::vector<std::vector<float>> each, joint;
            MatmulParts parts;
            for (const Weight &W : ws) {
                each.emplace_back((size_t)(T * W.n_out));
                joint.emplace_back((size_t)(T * W.n_out), -1.0f);
                matmul(pool, scratch, W, X.data(), T, each.back().data());
            }
            for (size_t i = 0; i < ws.size(); i++) parts.push_back({&ws[i], joint[i].data()});
            matmul_each(pool, scratch, parts, X.data(), T);
            for (size_t i = 0; i < ws.size(); i++)
                for (size_t j = 0; j < each[i].size(); j++) CHECK(each[i][j] == joint[i][j]);
        }
    }
}

// The quantization error bound is not vacuous: on random data the integer result is much closer than the bound
// (errors of independent roundings mostly cancel), yet not equal to the float path (the integer path did run).
TEST(matmul_int8_typical_error) {
    Rng rng(78);
    ThreadPool pool(2);
    Scratch scratch(2);
    const int64_t n_in = 1024, n_out = 64, T = 9;
    const auto raw = random_weight(DFL_TYPE_Q8_0, n_in, n_out, rng);
    const Weight W = make_weight(DFL_TYPE_Q8_0, n_in, n_out, raw);
    std::vector<float> X((size_t)(T * n_in)), Yi((size_t)(T * n_out)), Yf((size_t)(T * n_out));
    for (auto &x : X) x = rng.sym();
    set_int8_kernels("auto");
    matmul(pool, scratch, W, X.data(), T, Yi.data());
    set_int8_kernels("off");
    matmul(pool, scratch, W, X.data(), T, Yf.data());
    set_int8_kernels("auto");
    double num = 0, den = 0;
    bool differs = false;
    for (size_t i = 0; i < Yi.size(); i++) {
        num += ((double)Yi[i] - Yf[i]) * ((double)Yi[i] - Yf[i]);
        den += (double)Yf[i] * Yf[i];
        differs |= Yi[i] != Yf[i];
    }
    CHECK(differs);
    CHECK(std::sqrt(num / den) < 1e-2);  // ~0.3% relative rms for uniform activations
}

TEST(get_row_dequantizes) {
    Rng rng(5);
    for (uint32_t type : {DFL_TYPE_F32, DFL_TYPE_F16, DFL_TYPE_BF16, DFL_TYPE_Q4_0, DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_Q6_K}) {
        const auto raw = random_weight(type, 256, 3, rng);
        const Weight W = make_weight(type, 256, 3, raw);
        std::vector<float> y(256);
        get_row(W, 2, y.data());
        for (int i = 0; i < 256; i++) CHECK_CLOSE(y[(size_t)i], ref_row_elem(type, W.row(2), i), 1e-6);
    }
}

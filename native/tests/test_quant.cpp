// Element types: half conversions, block dequantization (ggml test vectors and a per-element float64 reference),
// KV quantization.
#include <cstring>

#include "blockconv.h"
#include "quant.h"
#include "ref.h"
#include "test.h"

using namespace dfl;
using dfltest::Rng;
using namespace dfltest;

namespace {

std::vector<uint8_t> pattern_block(uint32_t type) {
    std::vector<uint8_t> b((size_t)type_block_bytes(type));
    for (size_t k = 0; k < b.size(); k++) b[k] = (uint8_t)((29 * k + 7) % 256);
    auto put = [&](size_t off, uint16_t v) { std::memcpy(b.data() + off, &v, 2); };
    if (type == DFL_TYPE_Q8_0) put(0, 0x3800);
    if (type == DFL_TYPE_Q4_K) {
        put(0, 0x3800);
        put(2, 0x3400);
    }
    if (type == DFL_TYPE_Q6_K) put(208, 0x3800);
    return b;
}

}  // namespace

TEST(f16_values) {
    CHECK(f16_to_f32(0x3C00) == 1.0f);
    CHECK(f16_to_f32(0xC000) == -2.0f);
    CHECK(f16_to_f32(0x7BFF) == 65504.0f);
    CHECK(f16_to_f32(0x0001) == 5.960464478e-08f);
    CHECK(bf16_to_f32(0x3F80) == 1.0f);
    CHECK(bf16_to_f32(0xC049) == -3.140625f);
    CHECK(std::isinf(bf16_to_f32(0x7F80)));
    // every finite half converts exactly and back
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const double r = ref_f16((uint16_t)h);
        if (std::isnan(r)) continue;
        if ((double)f16_to_f32((uint16_t)h) != r) bad++;
        if (f32_to_f16(f16_to_f32((uint16_t)h)) != (uint16_t)h && !(r == 0)) bad++;
    }
    CHECK(bad == 0);
}

TEST(f16_rounding_is_nearest) {
    Rng rng(1);
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        const float f = (float)(rng.normal() * std::ldexp(1.0, (int)(rng.uniform() * 40) - 26));
        const uint16_t h = f32_to_f16(f);
        const double got = ref_f16(h);
        // neighbours of h must not be strictly closer
        const double e = std::fabs(got - f);
        for (int d = -1; d <= 1; d += 2) {
            const uint16_t n = (uint16_t)(h + d);
            if (((n ^ h) & 0x8000) != 0 || ((n >> 10) & 31) == 31) continue;
            if (std::fabs(ref_f16(n) - f) < e) bad++;
        }
    }
    CHECK(bad == 0);
    CHECK(f32_to_f16(70000.0f) == 0x7C00);
    CHECK(f32_to_f16(-1e-9f) == 0x8000);
}

TEST(bf16_rounding) {
    CHECK(f32_to_bf16(1.0f) == 0x3F80);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0)
    CHECK(f32_to_bf16(1.00390625f) == 0x3F80);
    CHECK(f32_to_bf16(1.01171875f) == 0x3F82);  // 1 + 3*2^-8 ties up to even
    CHECK((f32_to_bf16(NAN) & 0x7FC0) == 0x7FC0);
}

// ggml reference to_float values (gguf-and-quant §3.11).
TEST(dequant_test_vectors) {
    struct V {
        uint32_t type;
        std::vector<double> head;
        std::vector<std::pair<int, double>> sel;
        double sum, wsum;
    };
    const V vs[] = {
        {DFL_TYPE_Q8_0, {32.5, 47, 61.5, -52, -37.5, -23, -8.5, 6}, {{15, -6}, {16, 8.5}, {31, -30}}, -88, -3176},
        {DFL_TYPE_Q4_K,
         {194.75, 106.25, 17.75, 401.25, 312.75, 224.25, 135.75, 47.25},
         {{32, 153}, {63, 57}, {64, 175.25}, {127, 133.5}, {128, 53}, {200, 335.25}, {255, 80.25}},
         35348,
         4626732},
        {DFL_TYPE_Q6_K,
         {-655.5, 798, 427.5, -399, -769.5, 684, 313.5, -57},
         {{32, -4.5}, {63, 150}, {64, -944}, {127, 1650}, {128, -931.5}, {200, -525}, {255, 366}},
         -742,
         -147362},
    };
    for (const V &v : vs) {
        const auto blk = pattern_block(v.type);
        const int n = type_block(v.type);
        std::vector<float> y((size_t)n);
        dequant_row(v.type, blk.data(), y.data(), n);
        for (size_t i = 0; i < v.head.size(); i++) CHECK_CLOSE(y[i], v.head[i], 0);
        for (auto &s : v.sel) CHECK_CLOSE(y[(size_t)s.first], s.second, 0);
        double sum = 0, wsum = 0;
        for (int e = 0; e < n; e++) {
            sum += y[(size_t)e];
            wsum += y[(size_t)e] * (e + 1);
        }
        CHECK_CLOSE(sum, v.sum, 0);
        CHECK_CLOSE(wsum, v.wsum, 0);
    }
}

// q4_0 (ggml type 2): an f16 scale, then 16 bytes whose low nibbles are elements 0-15 and high nibbles 16-31, each
// nibble 8 above its code. A hand-made block: d = 0.5, byte j = j | (15 - j) << 4, so element j is (j - 8) / 2 and
// element 16 + j is (7 - j) / 2.
TEST(q4_0_dequant_hand_made_block) {
    CHECK(type_block(DFL_TYPE_Q4_0) == 32 && type_block_bytes(DFL_TYPE_Q4_0) == 18);
    CHECK(row_bytes(DFL_TYPE_Q4_0, 1024) == 32 * 18);
    CHECK(std::strcmp(type_name(DFL_TYPE_Q4_0), "q4_0") == 0 && weight_type_ok(DFL_TYPE_Q4_0));
    uint8_t blk[18] = {0x00, 0x38};  // 0x3800 little-endian: 0.5
    for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    dequant_row(DFL_TYPE_Q4_0, blk, y, 32);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == (float)(j - 8) * 0.5f);
        CHECK(y[16 + j] == (float)(7 - j) * 0.5f);
    }
    CHECK(y[0] == -4.0f && y[15] == 3.5f && y[16] == 3.5f && y[31] == -4.0f);
}

// The CUDA engine multiplies q4_0 weights as q8_0 blocks (blockconv.h, run there at load): every element keeps its
// value exactly, for every code and random scales.
TEST(q4_0_blocks_as_q8_0_keep_every_value) {
    Rng rng(11);
    for (int rep = 0; rep < 64; rep++) {
        uint8_t q4[18], q8[34];
        for (auto &b : q4) b = (uint8_t)rng.next();
        const uint16_t d = f32_to_f16((float)(rng.sym(2)));
        std::memcpy(q4, &d, 2);
        if (rep == 0)
            for (int j = 0; j < 16; j++) q4[2 + j] = (uint8_t)(j | (15 - j) << 4);  // every code, both nibbles
        q4_0_block_to_q8_0(q4, q8);
        float y4[32], y8[32];
        dequant_row(DFL_TYPE_Q4_0, q4, y4, 32);
        dequant_row(DFL_TYPE_Q8_0, q8, y8, 32);
        for (int e = 0; e < 32; e++) CHECK(y4[e] == y8[e]);
    }
}

TEST(dequant_random_blocks_match_reference) {
    Rng rng(7);
    for (uint32_t type : {DFL_TYPE_Q4_0, DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_Q6_K}) {
        const int n = 4 * type_block(type);
        std::vector<uint8_t> raw(row_bytes(type, n));
        for (auto &b : raw) b = (uint8_t)rng.next();
        // sane scales: small positive halves at the scale fields of each block
        const int bb = type_block_bytes(type);
        for (int blk = 0; blk < 4; blk++) {
            uint8_t *p = raw.data() + blk * bb;
            const uint16_t d = f32_to_f16((float)(0.001 + rng.uniform() * 0.01));
            const uint16_t dm = f32_to_f16((float)(0.001 + rng.uniform() * 0.01));
            if (type == DFL_TYPE_Q6_K) {
                std::memcpy(p + 208, &d, 2);
            } else {
                std::memcpy(p, &d, 2);
                if (type == DFL_TYPE_Q4_K) std::memcpy(p + 2, &dm, 2);
            }
        }
        std::vector<float> y((size_t)n);
        dequant_row(type, raw.data(), y.data(), n);
        for (int e = 0; e < n; e++) {
            const double want = ref_elem(type, raw.data() + (e / type_block(type)) * bb, e % type_block(type));
            CHECK_CLOSE(y[(size_t)e], want, 1e-6 * std::max(1.0, std::fabs(want)));
        }
    }
}

TEST(float_rows_roundtrip) {
    Rng rng(3);
    const int n = 96;
    std::vector<float> x((size_t)n), y((size_t)n);
    for (auto &v : x) v = rng.sym(3);
    for (uint32_t type : {DFL_TYPE_F32, DFL_TYPE_F16, DFL_TYPE_BF16, DFL_TYPE_Q8_0}) {
        std::vector<uint8_t> buf(row_bytes(type, n));
        quantize_row(type, x.data(), buf.data(), n);
        dequant_row(type, buf.data(), y.data(), n);
        const double tol = type == DFL_TYPE_F32 ? 0 : type == DFL_TYPE_F16 ? 3 * 0.5 / 1024 : type == DFL_TYPE_BF16 ? 3 * 0.5 / 128 : 3.0 / 127;
        for (int i = 0; i < n; i++) CHECK_CLOSE(y[(size_t)i], x[(size_t)i], tol);
    }
}

TEST(q8_0_quantize_matches_reference_rule) {
    // amax/127 scale, round half away from zero
    float x[32];
    for (int i = 0; i < 32; i++) x[i] = (float)(i - 16) * 0.25f;
    BlockQ8_0 b;
    quantize_row(DFL_TYPE_Q8_0, x, &b, 32);
    const double d = 4.0 / 127;
    CHECK_CLOSE(f16_to_f32(b.d), d, 1e-3 * d);
    for (int i = 0; i < 32; i++) CHECK((int)b.qs[i] == (int)std::lround(x[i] / (4.0f / 127.0f)));
}

TEST(dot_kernels) {
    Rng rng(11);
    for (int n : {1, 7, 16, 33, 256, 1000}) {
        std::vector<float> w((size_t)(4 * n)), x((size_t)n);
        for (auto &v : w) v = rng.sym();
        for (auto &v : x) v = rng.sym();
        float o4[4];
        dot4_f32(w.data(), x.data(), n, o4);
        for (int r = 0; r < 4; r++) {
            double ref = 0;
            for (int i = 0; i < n; i++) ref += (double)w[(size_t)(r * n + i)] * x[(size_t)i];
            const float d1 = dot_f32(w.data() + r * n, x.data(), n);
            CHECK_CLOSE(d1, ref, 1e-5 * std::sqrt((double)n));
            CHECK(d1 == o4[r]);  // identical arithmetic in both kernels
        }
    }
}

TEST(dot_row_is_dequant_then_dot_bitwise) {
    for (bool generic : {false, true}) {
    force_generic_kernels(generic);
    Rng rng(12);
    for (uint32_t type : {DFL_TYPE_F32, DFL_TYPE_F16, DFL_TYPE_BF16, DFL_TYPE_Q4_0, DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_Q6_K}) {
        const int qb = type_block(type);
        for (int64_t n : {256, 512, 1024 + 256}) {
            const int64_t m = qb == 1 ? n + 7 : n;  // float rows may end mid-vector
            std::vector<uint8_t> raw(row_bytes(type, m));
            for (auto &b : raw) b = (uint8_t)rng.next();
            if (type == DFL_TYPE_F16 || type == DFL_TYPE_BF16 || type == DFL_TYPE_F32) {
                std::vector<float> f((size_t)m);
                for (auto &v : f) v = rng.sym();
                quantize_row(type, f.data(), raw.data(), m);
            } else {
                const int bb = type_block_bytes(type);
                for (size_t off = 0; off < raw.size(); off += (size_t)bb) {
                    const uint16_t d = f32_to_f16((float)(0.001 + rng.uniform() * 0.01));
                    std::memcpy(raw.data() + off + (type == DFL_TYPE_Q6_K ? 208 : 0), &d, 2);
                    if (type == DFL_TYPE_Q4_K) std::memcpy(raw.data() + off + 2, &d, 2);
                }
            }
            std::vector<float> x((size_t)m), w((size_t)m);
            for (auto &v : x) v = rng.sym();
            dequant_row(type, raw.data(), w.data(), m);
            const float want = dot_f32(w.data(), x.data(), m);
            const float got = dot_row(type, raw.data(), x.data(), m);
            if (got != want) std::printf("  %s n=%lld: %.9g vs %.9g\n", type_name(type), (long long)m, got, want);
            CHECK(got == want);
        }
    }
    }
    force_generic_kernels(false);
}

TEST(dequant_paths_agree_bitwise) {
    Rng rng(31);
    for (uint32_t type : {DFL_TYPE_F16, DFL_TYPE_Q4_0, DFL_TYPE_Q8_0, DFL_TYPE_Q4_K, DFL_TYPE_Q6_K}) {
        const int64_t n = 1024;
        std::vector<uint8_t> raw(row_bytes(type, n));
        for (auto &b : raw) b = (uint8_t)rng.next();
        if (type == DFL_TYPE_F16)
            for (size_t i = 0; i < raw.size(); i += 2) raw[i + 1] &= 0x3F;  // finite halves
        std::vector<float> a((size_t)n), b((size_t)n);
        force_generic_kernels(true);
        dequant_row(type, raw.data(), a.data(), n);
        force_generic_kernels(false);
        dequant_row(type, raw.data(), b.data(), n);
        CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    }
}

// The F16C KV-cache write rounds exactly like f32_to_f16 for every non-NaN float (halfway cases, subnormals, overflow).
TEST(f16_quantize_paths_agree_bitwise) {
    Rng rng(41);
    std::vector<float> x(4096 + 5);
    for (size_t i = 0; i < x.size(); i++) {
        uint32_t bits = (uint32_t)rng.next();
        if (i % 3 == 0) bits = (bits & 0x8000FFFFu) | ((uint32_t)(100 + rng.next() % 60) << 23);  // near half range
        if (i % 7 == 0) bits = (bits & ~0x0FFFu) | 0x1000u;  // exact halfway between two halves
        x[i] = fp32_from_bits(bits);
        if (std::isnan(x[i])) x[i] = 1.0f;
    }
    std::vector<uint16_t> a(x.size()), b(x.size());
    force_generic_kernels(true);
    quantize_row(DFL_TYPE_F16, x.data(), a.data(), (int64_t)x.size());
    force_generic_kernels(false);
    quantize_row(DFL_TYPE_F16, x.data(), b.data(), (int64_t)x.size());
    CHECK(a == b);
}

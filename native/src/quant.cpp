#include "quant.h"

#include <cmath>
#include <vector>

#include "f32_vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dfl {

int type_block(uint32_t type) {
    switch (type) {
    case DFL_TYPE_F32:
    case DFL_TYPE_F16:
    case DFL_TYPE_BF16:
        return 1;
    case DFL_TYPE_Q4_0:
        return QK4_0;
    case DFL_TYPE_Q8_0:
        return QK8_0;
    case DFL_TYPE_Q4_K:
    case DFL_TYPE_Q6_K:
        return QK_K;
    default:
        return 0;
    }
}

int type_block_bytes(uint32_t type) {
    switch (type) {
    case DFL_TYPE_F32:
        return 4;
    case DFL_TYPE_F16:
    case DFL_TYPE_BF16:
        return 2;
    case DFL_TYPE_Q4_0:
        return sizeof(BlockQ4_0);
    case DFL_TYPE_Q8_0:
        return sizeof(BlockQ8_0);
    case DFL_TYPE_Q4_K:
        return sizeof(BlockQ4_K);
    case DFL_TYPE_Q6_K:
        return sizeof(BlockQ6_K);
    default:
        return 0;
    }
}

const char *type_name(uint32_t type) {
    switch (type) {
    case DFL_TYPE_F32:
        return "f32";
    case DFL_TYPE_F16:
        return "f16";
    case DFL_TYPE_BF16:
        return "bf16";
    case DFL_TYPE_Q4_0:
        return "q4_0";
    case DFL_TYPE_Q8_0:
        return "q8_0";
    case DFL_TYPE_Q4_K:
        return "q4_K";
    case DFL_TYPE_Q6_K:
        return "q6_K";
    default:
        return "unsupported";
    }
}

bool weight_type_ok(uint32_t type) { return type_block(type) != 0; }

bool cache_type_ok(uint32_t type) {
    return type == DFL_TYPE_F32 || type == DFL_TYPE_F16 || type == DFL_TYPE_BF16 || type == DFL_TYPE_Q8_0;
}

static inline uint16_t load_u16(const void *p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

static void dequant_q4_0(const BlockQ4_0 *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float d = f16_to_f32(load_u16(&b[i].d));
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[i * QK4_0 + j] = d * (float)((b[i].qs[j] & 0x0F) - 8);
            y[i * QK4_0 + QK4_0 / 2 + j] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}

static void dequant_q8_0(const BlockQ8_0 *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float d = f16_to_f32(load_u16(&b[i].d));
        for (int j = 0; j < QK8_0; j++) y[i * QK8_0 + j] = d * (float)b[i].qs[j];
    }
}

static void dequant_q4_K(const BlockQ4_K *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(load_u16(&b[i].d));
        const float dmin = f16_to_f32(load_u16(&b[i].dmin));
        const uint8_t *q = b[i].qs;
        float *out = y + i * QK_K;
        for (int c = 0; c < 4; c++) {  // 4 chunks of 64: low nibbles then high nibbles of 32 bytes
            uint8_t sc, m;
            q4k_scale_min(2 * c, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            q4k_scale_min(2 * c + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) out[64 * c + l] = d1 * (float)(q[32 * c + l] & 0x0F) - m1;
            for (int l = 0; l < 32; l++) out[64 * c + 32 + l] = d2 * (float)(q[32 * c + l] >> 4) - m2;
        }
    }
}

static void dequant_q6_K(const BlockQ6_K *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(load_u16(&b[i].d));
        float *out = y + i * QK_K;
        for (int h = 0; h < 2; h++) {  // two halves of 128
            const uint8_t *ql = b[i].ql + 64 * h;
            const uint8_t *qh = b[i].qh + 32 * h;
            const int8_t *sc = b[i].scales + 8 * h;
            float *o = out + 128 * h;
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = (int)((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = (int)((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                o[l] = d * (float)sc[is + 0] * (float)q1;
                o[l + 32] = d * (float)sc[is + 2] * (float)q2;
                o[l + 64] = d * (float)sc[is + 4] * (float)q3;
                o[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

DFL_MULTIVERSION static void dequant_bf16(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fp32_from_bits((uint32_t)x[i] << 16);
}

// f16 -> f32 through a table on CPUs without F16C (exact either way).
static const float *f16_table() {
    static const std::vector<float> t = [] {
        std::vector<float> v(65536);
        for (uint32_t h = 0; h < 65536; h++) v[h] = f16_to_f32((uint16_t)h);
        return v;
    }();
    return t.data();
}

static bool g_force_generic = false;

void force_generic_kernels(bool on) { g_force_generic = on; }

static bool cpu_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
    static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    return ok && !g_force_generic;
#else
    return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,f16c"))) static void dequant_f16_f16c(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = f16_to_f32(x[i]);
}

// Round to nearest even like f32_to_f16, bit for bit (NaN payloads aside): the KV cache write of every token.
__attribute__((target("avx2,f16c"))) static void quantize_f16_f16c(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = f32_to_f16(x[i]);
}
#endif

static void dequant_f16(const uint16_t *x, float *y, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_avx2()) return dequant_f16_f16c(x, y, n);
#endif
    const float *t = f16_table();
    for (int64_t i = 0; i < n; i++) y[i] = t[x[i]];
}

#if defined(__x86_64__) && defined(__GNUC__)
static void dequant_q8_0_avx2(const BlockQ8_0 *b, float *y, int64_t n);
static void dequant_q4_K_avx2(const BlockQ4_K *b, float *y, int64_t n);
static void dequant_q6_K_avx2(const BlockQ6_K *b, float *y, int64_t n);
#endif

void dequant_row(uint32_t type, const void *src, float *dst, int64_t n) {
    switch (type) {
    case DFL_TYPE_F32:
        std::memcpy(dst, src, (size_t)n * 4);
        return;
    case DFL_TYPE_F16:
        dequant_f16((const uint16_t *)src, dst, n);
        return;
    case DFL_TYPE_BF16:
        dequant_bf16((const uint16_t *)src, dst, n);
        return;
    case DFL_TYPE_Q4_0:
        dequant_q4_0((const BlockQ4_0 *)src, dst, n);
        return;
    case DFL_TYPE_Q8_0:
#if defined(__x86_64__) && defined(__GNUC__)
        if (cpu_avx2()) return dequant_q8_0_avx2((const BlockQ8_0 *)src, dst, n);
#endif
        dequant_q8_0((const BlockQ8_0 *)src, dst, n);
        return;
    case DFL_TYPE_Q4_K:
#if defined(__x86_64__) && defined(__GNUC__)
        if (cpu_avx2()) return dequant_q4_K_avx2((const BlockQ4_K *)src, dst, n);
#endif
        dequant_q4_K((const BlockQ4_K *)src, dst, n);
        return;
    case DFL_TYPE_Q6_K:
#if defined(__x86_64__) && defined(__GNUC__)
        if (cpu_avx2()) return dequant_q6_K_avx2((const BlockQ6_K *)src, dst, n);
#endif
        dequant_q6_K((const BlockQ6_K *)src, dst, n);
        return;
    default:
        fail(DFL_ERR_UNSUPPORTED, std::string("dequantize: unsupported type ") + std::to_string(type));
    }
}

void quantize_row(uint32_t type, const float *src, void *dst, int64_t n) {
    switch (type) {
    case DFL_TYPE_F32:
        std::memcpy(dst, src, (size_t)n * 4);
        return;
    case DFL_TYPE_F16: {
        uint16_t *y = (uint16_t *)dst;
#if defined(__x86_64__) && defined(__GNUC__)
        if (cpu_avx2()) return quantize_f16_f16c(src, y, n);
#endif
        for (int64_t i = 0; i < n; i++) y[i] = f32_to_f16(src[i]);
        return;
    }
    case DFL_TYPE_BF16: {
        uint16_t *y = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) y[i] = f32_to_bf16(src[i]);
        return;
    }
    case DFL_TYPE_Q8_0: {
        BlockQ8_0 *b = (BlockQ8_0 *)dst;
        for (int64_t i = 0; i < n / QK8_0; i++) {
            const float *x = src + i * QK8_0;
            float amax = 0;
            for (int j = 0; j < QK8_0; j++) amax = std::fmax(amax, std::fabs(x[j]));
            const float d = amax / 127.0f;
            const float id = d != 0 ? 1.0f / d : 0.0f;
            const uint16_t dh = f32_to_f16(d);
            std::memcpy(&b[i].d, &dh, 2);
            for (int j = 0; j < QK8_0; j++) b[i].qs[j] = (int8_t)std::lround(x[j] * id);
        }
        return;
    }
    default:
        fail(DFL_ERR_UNSUPPORTED, std::string("quantize: unsupported type ") + type_name(type));
    }
}

bool dot_blocked_f32_ok() {
#if defined(__x86_64__) && defined(__GNUC__)
    static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                           __builtin_cpu_supports("avx512cd");
    return ok && !g_force_generic;
#else
    return false;
#endif
}

// Fused dequantize-and-dot kernels. Each walks the row in steps of 16 elements into two 8-lane accumulators and
// reduces with hsum8, exactly like dot_f32, and forms every weight with the same float operations as dequant_row;
// so dot_row(type, row, x) == dot_f32(dequant_row(row), x) bit for bit, which keeps batched and single-sequence
// results identical whichever path a matmul takes.

typedef int8_t v8qi __attribute__((vector_size(8)));
typedef uint8_t v8qu __attribute__((vector_size(8)));
typedef int32_t v8si __attribute__((vector_size(32)));
typedef uint16_t v8hu __attribute__((vector_size(16)));
typedef uint32_t v8su __attribute__((vector_size(32)));

static inline v8qu load8u(const uint8_t *p) {
    v8qu v;
    std::memcpy(&v, p, 8);
    return v;
}

static float dot_q8_0_generic(const BlockQ8_0 *b, const float *x, int64_t n) {
    v8sf s0 = {0, 0, 0, 0, 0, 0, 0, 0}, s1 = s0;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        const float d = f16_to_f32(load_u16(&b[i].d));
        for (int h = 0; h < 2; h++) {
            v8qi q0, q1;
            std::memcpy(&q0, b[i].qs + 16 * h, 8);
            std::memcpy(&q1, b[i].qs + 16 * h + 8, 8);
            const v8sf w0 = d * __builtin_convertvector(q0, v8sf);
            const v8sf w1 = d * __builtin_convertvector(q1, v8sf);
            s0 += w0 * load8(x + 16 * h);
            s1 += w1 * load8(x + 16 * h + 8);
        }
    }
    return hsum8(s0 + s1);
}

// Elements 0-15 of a block are the low nibbles, 16-31 the high ones: each half is one step of 16, as in dot_f32.
static float dot_q4_0_generic(const BlockQ4_0 *b, const float *x, int64_t n) {
    v8sf s0 = {0, 0, 0, 0, 0, 0, 0, 0}, s1 = s0;
    for (int64_t i = 0; i < n / QK4_0; i++, x += QK4_0) {
        const float d = f16_to_f32(load_u16(&b[i].d));
        const v8qu a = load8u(b[i].qs), bb = load8u(b[i].qs + 8);
        const v8qi lo0 = __builtin_convertvector(a & 0x0F, v8qi) - 8, lo1 = __builtin_convertvector(bb & 0x0F, v8qi) - 8;
        const v8qi hi0 = __builtin_convertvector(a >> 4, v8qi) - 8, hi1 = __builtin_convertvector(bb >> 4, v8qi) - 8;
        s0 += (d * __builtin_convertvector(lo0, v8sf)) * load8(x);
        s1 += (d * __builtin_convertvector(lo1, v8sf)) * load8(x + 8);
        s0 += (d * __builtin_convertvector(hi0, v8sf)) * load8(x + 16);
        s1 += (d * __builtin_convertvector(hi1, v8sf)) * load8(x + 24);
    }
    return hsum8(s0 + s1);
}

static float dot_q4_K_generic(const BlockQ4_K *b, const float *x, int64_t n) {
    v8sf s0 = {0, 0, 0, 0, 0, 0, 0, 0}, s1 = s0;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float d = f16_to_f32(load_u16(&b[i].d));
        const float dmin = f16_to_f32(load_u16(&b[i].dmin));
        for (int c = 0; c < 4; c++) {
            uint8_t sc, m;
            q4k_scale_min(2 * c, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            q4k_scale_min(2 * c + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            const uint8_t *q = b[i].qs + 32 * c;
            for (int h = 0; h < 2; h++) {
                const v8qu a = load8u(q + 16 * h), bb = load8u(q + 16 * h + 8);
                const v8sf w0 = d1 * __builtin_convertvector(a & 0x0F, v8sf) - m1;
                const v8sf w1 = d1 * __builtin_convertvector(bb & 0x0F, v8sf) - m1;
                s0 += w0 * load8(x + 64 * c + 16 * h);
                s1 += w1 * load8(x + 64 * c + 16 * h + 8);
            }
            for (int h = 0; h < 2; h++) {
                const v8qu a = load8u(q + 16 * h), bb = load8u(q + 16 * h + 8);
                const v8sf w0 = d2 * __builtin_convertvector(a >> 4, v8sf) - m2;
                const v8sf w1 = d2 * __builtin_convertvector(bb >> 4, v8sf) - m2;
                s0 += w0 * load8(x + 64 * c + 32 + 16 * h);
                s1 += w1 * load8(x + 64 * c + 32 + 16 * h + 8);
            }
        }
    }
    return hsum8(s0 + s1);
}

// 8 signed 6-bit codes of a q6_K half-block: k selects the nibble and the qh bit pair (see dequant_q6_K).
static inline v8sf q6k_codes(const uint8_t *ql, const uint8_t *qh, int k) {
    const v8qu lb = load8u(ql + 32 * (k & 1));
    const v8qu lo = k < 2 ? (v8qu)(lb & 0x0F) : (v8qu)(lb >> 4);
    const v8qu hi = (load8u(qh) >> (2 * k)) & 3;
    const v8si q = __builtin_convertvector(lo, v8si) | (__builtin_convertvector(hi, v8si) << 4);
    return __builtin_convertvector(q - 32, v8sf);
}

static float dot_q6_K_generic(const BlockQ6_K *b, const float *x, int64_t n) {
    v8sf s0 = {0, 0, 0, 0, 0, 0, 0, 0}, s1 = s0;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float d = f16_to_f32(load_u16(&b[i].d));
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b[i].ql + 64 * h;
            const uint8_t *qh = b[i].qh + 32 * h;
            const int8_t *sc = b[i].scales + 8 * h;
            for (int k = 0; k < 4; k++) {
                for (int lh = 0; lh < 2; lh++) {
                    const float ds = d * (float)sc[lh + 2 * k];
                    const int l = 16 * lh;
                    const v8sf w0 = ds * q6k_codes(ql + l, qh + l, k);
                    const v8sf w1 = ds * q6k_codes(ql + l + 8, qh + l + 8, k);
                    const float *xx = x + 128 * h + 32 * k + l;
                    s0 += w0 * load8(xx);
                    s1 += w1 * load8(xx + 8);
                }
            }
        }
    }
    return hsum8(s0 + s1);
}

DFL_MULTIVERSION static float dot_bf16(const uint16_t *w, const float *x, int64_t n) {
    v8sf s0 = {0, 0, 0, 0, 0, 0, 0, 0}, s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v8hu a, b;
        std::memcpy(&a, w + i, 16);
        std::memcpy(&b, w + i + 8, 16);
        const v8su ua = __builtin_convertvector(a, v8su) << 16, ub = __builtin_convertvector(b, v8su) << 16;
        v8sf fa, fb;
        std::memcpy(&fa, &ua, 32);
        std::memcpy(&fb, &ub, 32);
        s0 += fa * load8(x + i);
        s1 += fb * load8(x + i + 8);
    }
    float r = hsum8(s0 + s1);
    for (; i < n; i++) r += bf16_to_f32(w[i]) * x[i];
    return r;
}

DFL_MULTIVERSION static float dot_f16_table(const uint16_t *w, const float *x, int64_t n) {
    const float *t = f16_table();
    v8sf s0 = {0, 0, 0, 0, 0, 0, 0, 0}, s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v8sf a, b;
        for (int j = 0; j < 8; j++) {
            a[j] = t[w[i + j]];
            b[j] = t[w[i + 8 + j]];
        }
        s0 += a * load8(x + i);
        s1 += b * load8(x + i + 8);
    }
    float r = hsum8(s0 + s1);
    for (; i < n; i++) r += t[w[i]] * x[i];
    return r;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,f16c"))) static float dot_f16_f16c(const uint16_t *w, const float *x, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i)));
        const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 8)));
        s0 = _mm256_add_ps(s0, _mm256_mul_ps(a, _mm256_loadu_ps(x + i)));
        s1 = _mm256_add_ps(s1, _mm256_mul_ps(b, _mm256_loadu_ps(x + i + 8)));
    }
    const __m256 s = _mm256_add_ps(s0, s1);
    float v[8];
    _mm256_storeu_ps(v, s);
    float r = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    for (; i < n; i++) r += f16_to_f32(w[i]) * x[i];
    return r;
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
// AVX2 versions of the quantized kernels: the same float operations in the same order (no FMA), so their results are
// bitwise those of the generic kernels.
#define DFL_AVX2 __attribute__((target("avx2,f16c")))

DFL_AVX2 static inline float hsum_m256(__m256 s) {
    float v[8];
    _mm256_storeu_ps(v, s);
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

DFL_AVX2 static inline __m256 u8_to_ps(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); }

DFL_AVX2 static float dot_q8_0_avx2(const BlockQ8_0 *b, const float *x, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        const __m256 d = _mm256_set1_ps(f16_to_f32(load_u16(&b[i].d)));
        for (int h = 0; h < 2; h++) {
            const __m128i q = _mm_loadu_si128((const __m128i *)(b[i].qs + 16 * h));
            const __m256 w0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
            const __m256 w1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))));
            s0 = _mm256_add_ps(s0, _mm256_mul_ps(w0, _mm256_loadu_ps(x + 16 * h)));
            s1 = _mm256_add_ps(s1, _mm256_mul_ps(w1, _mm256_loadu_ps(x + 16 * h + 8)));
        }
    }
    return hsum_m256(_mm256_add_ps(s0, s1));
}

DFL_AVX2 static float dot_q4_K_avx2(const BlockQ4_K *b, const float *x, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float d = f16_to_f32(load_u16(&b[i].d));
        const float dmin = f16_to_f32(load_u16(&b[i].dmin));
        for (int c = 0; c < 4; c++) {
            uint8_t sc, m;
            q4k_scale_min(2 * c, b[i].scales, &sc, &m);
            const __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(dmin * m);
            q4k_scale_min(2 * c + 1, b[i].scales, &sc, &m);
            const __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(dmin * m);
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * c));
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            for (int part = 0; part < 2; part++) {
                const __m256i nib = part == 0 ? lo : hi;
                const __m256 dd = part == 0 ? d1 : d2, mm = part == 0 ? m1 : m2;
                const float *xx = x + 64 * c + 32 * part;
                for (int h = 0; h < 2; h++) {
                    const __m128i v = h == 0 ? _mm256_castsi256_si128(nib) : _mm256_extracti128_si256(nib, 1);
                    const __m256 w0 = _mm256_sub_ps(_mm256_mul_ps(dd, u8_to_ps(v)), mm);
                    const __m256 w1 = _mm256_sub_ps(_mm256_mul_ps(dd, u8_to_ps(_mm_srli_si128(v, 8))), mm);
                    s0 = _mm256_add_ps(s0, _mm256_mul_ps(w0, _mm256_loadu_ps(xx + 16 * h)));
                    s1 = _mm256_add_ps(s1, _mm256_mul_ps(w1, _mm256_loadu_ps(xx + 16 * h + 8)));
                }
            }
        }
    }
    return hsum_m256(_mm256_add_ps(s0, s1));
}

DFL_AVX2 static float dot_q6_K_avx2(const BlockQ6_K *b, const float *x, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    const __m128i m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(3);
    const __m256i k32 = _mm256_set1_epi32(32);
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float d = f16_to_f32(load_u16(&b[i].d));
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b[i].ql + 64 * h;
            const uint8_t *qh = b[i].qh + 32 * h;
            const int8_t *sc = b[i].scales + 8 * h;
            for (int k = 0; k < 4; k++) {
                for (int lh = 0; lh < 2; lh++) {
                    const __m256 ds = _mm256_set1_ps(d * (float)sc[lh + 2 * k]);
                    const int l = 16 * lh;
                    const __m128i lb = _mm_loadu_si128((const __m128i *)(ql + 32 * (k & 1) + l));
                    const __m128i lo = k < 2 ? _mm_and_si128(lb, m4) : _mm_and_si128(_mm_srli_epi16(lb, 4), m4);
                    const __m128i hb = _mm_loadu_si128((const __m128i *)(qh + l));
                    const __m128i hi = _mm_and_si128(_mm_srl_epi16(hb, _mm_cvtsi32_si128(2 * k)), m2);
                    const __m128i q = _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
                    const __m256 q0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(q), k32));
                    const __m256 q1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)), k32));
                    const float *xx = x + 128 * h + 32 * k + l;
                    s0 = _mm256_add_ps(s0, _mm256_mul_ps(_mm256_mul_ps(ds, q0), _mm256_loadu_ps(xx)));
                    s1 = _mm256_add_ps(s1, _mm256_mul_ps(_mm256_mul_ps(ds, q1), _mm256_loadu_ps(xx + 8)));
                }
            }
        }
    }
    return hsum_m256(_mm256_add_ps(s0, s1));
}

// AVX2 dequantization for the prefill path: the same per-element operations as the scalar dequant_* functions.
DFL_AVX2 static void dequant_q8_0_avx2(const BlockQ8_0 *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n / QK8_0; i++, y += QK8_0) {
        const __m256 d = _mm256_set1_ps(f16_to_f32(load_u16(&b[i].d)));
        for (int j = 0; j < 4; j++) {
            const __m128i q = _mm_loadl_epi64((const __m128i *)(b[i].qs + 8 * j));
            _mm256_storeu_ps(y + 8 * j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
        }
    }
}

DFL_AVX2 static void dequant_q4_K_avx2(const BlockQ4_K *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        const float d = f16_to_f32(load_u16(&b[i].d));
        const float dmin = f16_to_f32(load_u16(&b[i].dmin));
        for (int c = 0; c < 4; c++) {
            uint8_t sc, m;
            q4k_scale_min(2 * c, b[i].scales, &sc, &m);
            const __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(dmin * m);
            q4k_scale_min(2 * c + 1, b[i].scales, &sc, &m);
            const __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(dmin * m);
            for (int j = 0; j < 4; j++) {
                const __m128i q = _mm_loadl_epi64((const __m128i *)(b[i].qs + 32 * c + 8 * j));
                const __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0F));
                const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F));
                _mm256_storeu_ps(y + 64 * c + 8 * j, _mm256_sub_ps(_mm256_mul_ps(d1, u8_to_ps(lo)), m1));
                _mm256_storeu_ps(y + 64 * c + 32 + 8 * j, _mm256_sub_ps(_mm256_mul_ps(d2, u8_to_ps(hi)), m2));
            }
        }
    }
}

DFL_AVX2 static void dequant_q6_K_avx2(const BlockQ6_K *b, float *y, int64_t n) {
    const __m128i m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(3);
    const __m256i k32 = _mm256_set1_epi32(32);
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        const float d = f16_to_f32(load_u16(&b[i].d));
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b[i].ql + 64 * h;
            const uint8_t *qh = b[i].qh + 32 * h;
            const int8_t *sc = b[i].scales + 8 * h;
            for (int k = 0; k < 4; k++) {
                for (int l = 0; l < 32; l += 8) {
                    const __m256 ds = _mm256_set1_ps(d * (float)sc[l / 16 + 2 * k]);
                    const __m128i lb = _mm_loadl_epi64((const __m128i *)(ql + 32 * (k & 1) + l));
                    const __m128i lo = k < 2 ? _mm_and_si128(lb, m4) : _mm_and_si128(_mm_srli_epi16(lb, 4), m4);
                    const __m128i hb = _mm_loadl_epi64((const __m128i *)(qh + l));
                    const __m128i hi = _mm_and_si128(_mm_srl_epi16(hb, _mm_cvtsi32_si128(2 * k)), m2);
                    const __m128i q = _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
                    const __m256 qf = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(q), k32));
                    _mm256_storeu_ps(y + 128 * h + 32 * k + l, _mm256_mul_ps(ds, qf));
                }
            }
        }
    }
}
#endif

float dot_row(uint32_t type, const void *row, const float *x, int64_t n) {
    switch (type) {
    case DFL_TYPE_F32:
        return dot_f32((const float *)row, x, n);
    case DFL_TYPE_F16:
#if defined(__x86_64__) && defined(__GNUC__)
        if (cpu_avx2()) return dot_f16_f16c((const uint16_t *)row, x, n);
#endif
        return dot_f16_table((const uint16_t *)row, x, n);
    case DFL_TYPE_BF16:
        return dot_bf16((const uint16_t *)row, x, n);
    case DFL_TYPE_Q4_0:
        return dot_q4_0_generic((const BlockQ4_0 *)row, x, n);
    case DFL_TYPE_Q8_0:
#if defined(__x86_64__) && defined(__GNUC__)
        if (cpu_avx2()) return dot_q8_0_avx2((const BlockQ8_0 *)row, x, n);
#endif
        return dot_q8_0_generic((const BlockQ8_0 *)row, x, n);
    case DFL_TYPE_Q4_K:
#if defined(__x86_64__) && defined(__GNUC__)
        if (cpu_avx2()) return dot_q4_K_avx2((const BlockQ4_K *)row, x, n);
#endif
        return dot_q4_K_generic((const BlockQ4_K *)row, x, n);
    case DFL_TYPE_Q6_K:
#if defined(__x86_64__) && defined(__GNUC__)
        if (cpu_avx2()) return dot_q6_K_avx2((const BlockQ6_K *)row, x, n);
#endif
        return dot_q6_K_generic((const BlockQ6_K *)row, x, n);
    default:
        fail(DFL_ERR_UNSUPPORTED, std::string("dot: unsupported type ") + std::to_string(type));
    }
}

}  // namespace dfl

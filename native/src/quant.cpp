#include "quant.h"

#include <cmath>

namespace dfl {

int type_block(uint32_t type) {
    switch (type) {
    case DFL_TYPE_F32:
    case DFL_TYPE_F16:
    case DFL_TYPE_BF16:
        return 1;
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

// 6-bit scale and min of sub-block j of a q4_K super-block (gguf-and-quant §3.5).
static inline void q4k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
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

static void dequant_f16(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = f16_to_f32(x[i]);
}

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
    case DFL_TYPE_Q8_0:
        dequant_q8_0((const BlockQ8_0 *)src, dst, n);
        return;
    case DFL_TYPE_Q4_K:
        dequant_q4_K((const BlockQ4_K *)src, dst, n);
        return;
    case DFL_TYPE_Q6_K:
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

typedef float v8sf __attribute__((vector_size(32)));

static inline v8sf load8(const float *p) {
    v8sf v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum8(v8sf v) {
    // fixed pairwise order so every caller reduces identically
    const float a = (v[0] + v[4]) + (v[2] + v[6]);
    const float b = (v[1] + v[5]) + (v[3] + v[7]);
    return a + b;
}

DFL_MULTIVERSION float dot_f32(const float *a, const float *b, int64_t n) {
    v8sf s0 = {0, 0, 0, 0, 0, 0, 0, 0}, s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 += load8(a + i) * load8(b + i);
        s1 += load8(a + i + 8) * load8(b + i + 8);
    }
    float r = hsum8(s0 + s1);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

DFL_MULTIVERSION void dot4_f32(const float *w, const float *x, int64_t n, float *out) {
    const float *w0 = w, *w1 = w + n, *w2 = w + 2 * n, *w3 = w + 3 * n;
    v8sf z = {0, 0, 0, 0, 0, 0, 0, 0};
    v8sf a0 = z, a1 = z, b0 = z, b1 = z, c0 = z, c1 = z, d0 = z, d1 = z;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const v8sf x0 = load8(x + i), x1 = load8(x + i + 8);
        a0 += load8(w0 + i) * x0;
        a1 += load8(w0 + i + 8) * x1;
        b0 += load8(w1 + i) * x0;
        b1 += load8(w1 + i + 8) * x1;
        c0 += load8(w2 + i) * x0;
        c1 += load8(w2 + i + 8) * x1;
        d0 += load8(w3 + i) * x0;
        d1 += load8(w3 + i + 8) * x1;
    }
    float r0 = hsum8(a0 + a1), r1 = hsum8(b0 + b1), r2 = hsum8(c0 + c1), r3 = hsum8(d0 + d1);
    for (; i < n; i++) {
        r0 += w0[i] * x[i];
        r1 += w1[i] * x[i];
        r2 += w2[i] * x[i];
        r3 += w3[i] * x[i];
    }
    out[0] = r0;
    out[1] = r1;
    out[2] = r2;
    out[3] = r3;
}

}  // namespace dfl

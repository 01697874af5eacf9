// Float64 reference helpers shared by the tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant.h"

namespace dfltest {
using namespace dfl;

inline double ref_f16(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = std::ldexp((double)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = std::ldexp(1.0 + m / 1024.0, e - 15);
    return s ? -v : v;
}

// Per-element dequantization straight from the layout tables (gguf-and-quant §3.3, §3.6, §3.8), in float64.
inline double ref_elem(uint32_t type, const uint8_t *blk, int e) {
    auto h16 = [&](int off) {
        uint16_t v;
        std::memcpy(&v, blk + off, 2);
        return ref_f16(v);
    };
    switch (type) {
    case DFL_TYPE_Q4_0:
        return h16(0) * (double)((e < 16 ? (blk[2 + e] & 15) : (blk[2 + e - 16] >> 4)) - 8);
    case DFL_TYPE_Q8_0:
        return h16(0) * (double)(int8_t)blk[2 + e];
    case DFL_TYPE_Q4_K: {
        const double d = h16(0), dmin = h16(2);
        const uint8_t *s = blk + 4, *qs = blk + 16;
        const int c = e / 64, hh = (e % 64) / 32, l = e % 32, j = e / 32;
        const int q = hh == 0 ? (qs[32 * c + l] & 15) : (qs[32 * c + l] >> 4);
        int sc, m;
        if (j < 4) {
            sc = s[j] & 63;
            m = s[j + 4] & 63;
        } else {
            sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
            m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
        return d * sc * q - dmin * m;
    }
    case DFL_TYPE_Q6_K: {
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        const double d = h16(208);
        const int n = e / 128, r = e % 128, k = r / 32, l = r % 32;
        const uint8_t lb = ql[64 * n + 32 * (k & 1) + l];
        const int lo = k < 2 ? (lb & 15) : (lb >> 4);
        const int hi = (qh[32 * n + l] >> (2 * k)) & 3;
        return d * sc[e / 16] * ((lo | (hi << 4)) - 32);
    }
    default:
        return NAN;
    }
}


// Element e of a row of any supported weight type, in float64.
inline double ref_row_elem(uint32_t type, const uint8_t *row, int64_t e) {
    switch (type) {
    case DFL_TYPE_F32: {
        float f;
        std::memcpy(&f, row + 4 * e, 4);
        return f;
    }
    case DFL_TYPE_F16: {
        uint16_t h;
        std::memcpy(&h, row + 2 * e, 2);
        return ref_f16(h);
    }
    case DFL_TYPE_BF16: {
        uint16_t h;
        std::memcpy(&h, row + 2 * e, 2);
        uint32_t w = (uint32_t)h << 16;
        float f;
        std::memcpy(&f, &w, 4);
        return f;
    }
    default: {
        const int qb = type_block(type);
        return ref_elem(type, row + (e / qb) * type_block_bytes(type), (int)(e % qb));
    }
    }
}

}  // namespace dfltest

// Random quantized weights for the matmul tests and native/bench/gemvbench: the bytes of a type's blocks, and a
// Weight over them.
#pragma once

#include <cstring>
#include <vector>

#include "ops/device.h"
#include "quant.h"
#include "test.h"

namespace dfltest {
using namespace dfl;

// Random weight bytes of any type, with block scales small enough that values stay O(0.1..1).
inline std::vector<uint8_t> random_weight(uint32_t type, int64_t n_in, int64_t n_out, Rng &rng) {
    std::vector<uint8_t> raw(row_bytes(type, n_in) * (uint64_t)n_out);
    const int64_t n = n_in * n_out;
    switch (type) {
    case DFL_TYPE_F32:
        for (int64_t i = 0; i < n; i++) {
            const float f = rng.sym();
            std::memcpy(raw.data() + 4 * i, &f, 4);
        }
        break;
    case DFL_TYPE_F16:
    case DFL_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = type == DFL_TYPE_F16 ? f32_to_f16(rng.sym()) : f32_to_bf16(rng.sym());
            std::memcpy(raw.data() + 2 * i, &h, 2);
        }
        break;
    default: {
        for (auto &b : raw) b = (uint8_t)rng.next();
        const int bb = type_block_bytes(type);
        for (size_t off = 0; off < raw.size(); off += (size_t)bb) {
            const uint16_t d = f32_to_f16((float)(0.002 + rng.uniform() * 0.02));
            const uint16_t dm = f32_to_f16((float)(0.002 + rng.uniform() * 0.02));
            if (type == DFL_TYPE_Q6_K) {
                std::memcpy(raw.data() + off + 208, &d, 2);
            } else {
                std::memcpy(raw.data() + off, &d, 2);
                if (type == DFL_TYPE_Q4_K) std::memcpy(raw.data() + off + 2, &dm, 2);
            }
        }
    }
    }
    return raw;
}

inline Weight make_weight(uint32_t type, int64_t n_in, int64_t n_out, const std::vector<uint8_t> &raw) {
    Weight w;
    w.type = type;
    w.n_in = n_in;
    w.n_out = n_out;
    w.row_bytes = row_bytes(type, n_in);
    w.data = raw.data();
    return w;
}

}  // namespace dfltest

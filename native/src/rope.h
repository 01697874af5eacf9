// RoPE frequencies, computed once per model on the host for every device.
#pragma once

#include <cmath>
#include <vector>

namespace dfl {

// inv_freq[i] = theta^(-2i/rope_dim), i < rope_dim/2, rounded to f32 as HF does.
inline std::vector<float> rope_inv_freq(float theta, int rope_dim) {
    std::vector<float> f((size_t)rope_dim / 2);
    for (int i = 0; i < rope_dim / 2; i++) {
        const float e = (float)(2 * i) / (float)rope_dim;
        const float p = (float)std::pow((double)theta, (double)e);
        f[(size_t)i] = 1.0f / p;
    }
    return f;
}

}  // namespace dfl

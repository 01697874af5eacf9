// Block conversions shared by the host and the CUDA device (the CUDA engine has no q4_0 kernels: it multiplies q4_0
// weights as the q8_0 blocks of the same values).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DFL_HD __host__ __device__
#else
#define DFL_HD
#endif

namespace dfl {

// One q4_0 block (f16 d, 16 bytes: element j the low nibble of byte j, element 16 + j its high nibble, each code + 8)
// as the q8_0 block of the same values (f16 d, 32 int8 codes): d * (nibble - 8) is exactly d * code.
DFL_HD inline void q4_0_block_to_q8_0(const uint8_t *src18, uint8_t *dst34) {
    dst34[0] = src18[0];
    dst34[1] = src18[1];
    for (int j = 0; j < 16; j++) {
        dst34[2 + j] = (uint8_t)(int8_t)((src18[2 + j] & 0x0F) - 8);
        dst34[18 + j] = (uint8_t)(int8_t)((src18[2 + j] >> 4) - 8);
    }
}

}  // namespace dfl

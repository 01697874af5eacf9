// What makes libdflash_cpu.so a CPU library: its device and the device queries of the C ABI.
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/qgemm.h"

namespace dfl {

std::unique_ptr<Device> make_device(const dfl_model_params &p) { return make_cpu_device((int)p.n_threads); }

const char *device_kind() { return "cpu"; }

int32_t device_count() { return 1; }

void device_memory(int32_t, uint64_t *free_bytes, uint64_t *total_bytes) { host_memory(free_bytes, total_bytes); }

// CpuDevice::prepare_weight packs q4_0 / q8_0 / q4_K / q6_K matrices for the AVX-512 kernels: about the original's
// size again (q6_K: 64-byte aligned super-blocks, 3392 bytes for 16 rows' 3360).
uint64_t device_weight_copy_bytes(uint32_t type, uint64_t bytes) {
    if (!int8_packs_type(type)) return 0;
    return type == DFL_TYPE_Q6_K ? bytes / 105 * 106 + 64 : bytes;
}

// Expert stacks are packed like matrices (CpuDevice::prepare_weight): decode had repacked each token's experts'
// groups product by product (the q4_K packer was a third of a V4-Flash-shaped CPU decode step).
bool device_packs_stacks() { return true; }

}  // namespace dfl

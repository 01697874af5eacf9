// The CUDA library's device entry points (the CPU library defines the same names in ops/cpu/lib_cpu.cpp).

#include "ops/cuda/cuda_common.cuh"
#include "ops/device.h"

namespace dfl {

std::unique_ptr<Device> make_device(const dfl_model_params &p) { return make_cuda_device(p.device); }

const char *device_kind() { return "cuda"; }

int32_t device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

void device_memory(int32_t index, uint64_t *free_bytes, uint64_t *total_bytes) {
    if (index < 0 || index >= device_count())
        fail(DFL_ERR_INVALID, "no such GPU cuda:" + std::to_string(index));
    // The calling thread's current device is left at `index`: switching back would initialise a context on the
    // previous device (cudaSetDevice does since CUDA 12), and every CudaDevice op selects its own device anyway.
    cuda::check(cudaSetDevice(index), "cudaSetDevice");
    size_t fr = 0, tot = 0;
    cuda::check(cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo");
    if (free_bytes) *free_bytes = fr;
    if (total_bytes) *total_bytes = tot;
}

// prepare_weight keeps a repacked copy of q8_0 matrices (same size: 32 quants and a 2-byte scale per block).
uint64_t device_weight_copy_bytes(uint32_t type, uint64_t bytes) {
    const bool repack = env_switch("DFL_CUDA_REPACK", true);
    if (type == DFL_TYPE_Q4_0)  // the q8_0 copy (prepare_weight), and its repacked one
        return bytes / cuda::kQ4_0Bytes * cuda::kQ8_0Bytes * (repack ? 2 : 1);
    return repack && type == DFL_TYPE_Q8_0 ? bytes : 0;
}

// Expert stacks stay as loaded: the z-batched GEMVs read any expert's rows from them.
bool device_packs_stacks() { return false; }

}  // namespace dfl

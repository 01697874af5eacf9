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

// Light records (a verify keeps the state before it and its rows' inputs, and a rollback replays the kept rows), on
// unless DFL_CUDA_LIGHT_RECORDS=0: every state after every verified row otherwise (151 MB a row a sequence on the 27B
// qwen3.5 shape, so a batch of 32 verifying 8 rows could not allocate them). The kernels do the same arithmetic with
// or without recording, so a replay is bitwise the forward's state. H200, 12-04 05:2x, 27B q8_0 verify of 16 rows:
// batch 1 17.53 -> 17.21 ms, batch 8 107.8 -> 105.7 ms, batch 32 fits (327 ms, 119.5 since the aligned prefill GEMM).
bool device_light_records() {
    static const bool on = env_switch("DFL_CUDA_LIGHT_RECORDS", true);
    return on;
}

// Expert stacks stay as loaded: the z-batched GEMVs read any expert's rows from them.
bool device_packs_stacks() { return false; }

}  // namespace dfl

// The driver both CUDA op test programs share (test_cuda_ops.cpp, test_cuda_ds4.cpp): the GPU check and the loop over
// their groups of cases.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>

#include "test.h"

namespace dfltest {

// Whether there is a CUDA device; without one, says the program skips (CI machines have no GPU: it then exits 0).
inline bool cuda_present(const char *suite) {
    int n_gpus = 0;
    const cudaError_t ce = cudaGetDeviceCount(&n_gpus);
    if (ce != cudaSuccess || n_gpus == 0) {
        std::printf("skip: no CUDA device (%s); %s need a GPU\n", ce != cudaSuccess ? cudaGetErrorString(ce) : "none found",
                    suite);
        return false;
    }
    return true;
}

struct Group {
    const char *name;
    void (*fn)();
};

// Runs every group, or those named `only`; a group that throws fails and the next still runs.
template <size_t N>
void run_groups(const Group (&groups)[N], const char *only) {
    for (const Group &g : groups) {
        if (only && std::strcmp(only, g.name) != 0) continue;
        try {
            g.fn();
        } catch (const std::exception &e) {
            std::printf("FAIL %s: exception: %s\n", g.name, e.what());
            g_failures++;
        }
    }
}

}  // namespace dfltest

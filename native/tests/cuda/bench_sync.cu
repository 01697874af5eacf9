// What a boundary between two dependent phases of a decode step costs on this GPU, the number the choice between a
// chain of kernels and one persistent kernel a layer turns on (docs/perf/cuda-notes.md): kPhases phases, each every
// block of a grid of two blocks an SM adding one float into a slot the next phase reads, timed as graph replays, as
//  - chained kernels, programmatic dependent launches (how the engine's kernels follow each other today);
//  - the same kernels launched plainly;
//  - one kernel whose phases meet at a grid-wide barrier (an arrival counter in global memory; every block resident,
//    which the occupancy query checks first, and a spin bounded by the clock so that a GPU where they are not resident
//    reports a failure instead of hanging);
//  - on sm_90, a phase the shape of DeepSeek V4's HC site kernel (hc_site_kernel): 8 blocks of 512 threads chained
//    with PDL, plainly, as one thread-block cluster with two cluster barriers a phase, and as a cluster of 16 blocks of
//    256: what a cluster's launch and barriers add to a small kernel (the site took 17-18 us under Nsight Compute with
//    its SMs busy half of it, 12-07 10:0x).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda_test.h"
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfltest {

namespace {

constexpr int kPhases = 64;
constexpr int kThreads = 256;

// Phase p of the chain: waits for phase p - 1 (PDL), reads its sum, adds this block's share of the next.
__global__ void phase_kernel(float *slots, int p) {
    dfl::cuda::pdl_trigger();
    dfl::cuda::pdl_wait();
    const float prev = slots[p];
    if (threadIdx.x == 0) atomicAdd(slots + p + 1, prev >= 0.0f ? 1.0f : 0.0f);  // (a read of the phase before)
}

// Phase p as a thread-block cluster: the blocks' shares meet at two cluster barriers, as hc_site_kernel's do.
__global__ void cluster_phase_kernel(float *slots, int p) {
    namespace cg = cooperative_groups;
    dfl::cuda::pdl_trigger();
    dfl::cuda::pdl_wait();
    cg::cluster_group cl = cg::this_cluster();
    const float prev = slots[p];
    cl.sync();
    if (threadIdx.x == 0) atomicAdd(slots + p + 1, prev >= 0.0f ? 1.0f : 0.0f);
    cl.sync();
}

// All phases in one kernel: after its share of phase p, a block waits until every block has added its share (the
// counter reaches (p + 1) x blocks). *failed set: some block waited ~0.1 s (not every block was resident).
__global__ void persistent_kernel(float *slots, unsigned *arrived, int *failed) {
    for (int p = 0; p < kPhases; p++) {
        if (threadIdx.x == 0) {
            const float prev = *(volatile float *)(slots + p);
            atomicAdd(slots + p + 1, prev >= 0.0f ? 1.0f : 0.0f);
            __threadfence();
            atomicAdd(arrived, 1u);
            const unsigned target = (unsigned)(p + 1) * gridDim.x;
            const long long t0 = clock64();
            while (*(volatile unsigned *)arrived < target) {
                if (clock64() - t0 > 200000000ll) {
                    *failed = 1;
                    break;
                }
            }
            __threadfence();
        }
        __syncthreads();
    }
}

}  // namespace

void bench_sync() {
    auto *cd = dynamic_cast<dfl::cuda::CudaDevice *>(g_gpu);
    if (!cd) return;
    cudaStream_t s = cd->stream();
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, kThreads, 0);
    const int blocks = cd->sm_count() * std::min(per_sm, 2);
    float *slots = nullptr;
    unsigned *arrived = nullptr;
    int *failed = nullptr;
    cudaMalloc(&slots, (kPhases + 1) * sizeof(float));
    cudaMalloc(&arrived, sizeof(unsigned));
    cudaMalloc(&failed, sizeof(int));
    cudaMemsetAsync(failed, 0, sizeof(int), s);
    auto reset = [&] {
        cudaMemsetAsync(slots, 0, (kPhases + 1) * sizeof(float), s);
        cudaMemsetAsync(arrived, 0, sizeof(unsigned), s);
    };
    // median microseconds a phase boundary of 5 graph replays; want: the blocks a phase (its last sum)
    auto time = [&](const char *what, int want, int threads, auto phases) {
        g_gpu->graph_begin();  // (the device's own capture, as the engine's steps and bench_gemv use it)
        reset();
        phases();
        const uintptr_t g = g_gpu->graph_end();
        if (!g) {
            std::printf("bench sync %-28s capture failed\n", what);
            return;
        }
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        std::vector<float> us;
        for (int rep = 0; rep < 6; rep++) {
            cudaEventRecord(e0, s);
            g_gpu->graph_launch(g);
            cudaEventRecord(e1, s);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (rep) us.push_back(ms * 1e3f / kPhases);  // the first replay warms up
        }
        std::sort(us.begin(), us.end());
        float last = 0;
        cudaMemcpy(&last, slots + kPhases, sizeof last, cudaMemcpyDeviceToHost);
        std::printf("bench sync %-28s %6.2f us a phase (%d blocks of %d threads, %d phases; the last phase's sum %.0f, "
                    "want %d)\n", what, us[us.size() / 2], want, threads, kPhases, last, want);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        g_gpu->graph_free(g);
    };
    time("chained kernels (PDL)", blocks, kThreads, [&] {
        for (int p = 0; p < kPhases; p++)
            dfl::cuda::launch_maybe_pdl(true, phase_kernel, dim3(blocks), dim3(kThreads), 0, s, slots, p);
    });
    time("plain kernels", blocks, kThreads, [&] {
        for (int p = 0; p < kPhases; p++) phase_kernel<<<blocks, kThreads, 0, s>>>(slots, p);
    });
    if (cd->cc_major() >= 9) {  // the HC site's shape (thread-block clusters: sm_90)
        time("8 x 512 chained (PDL)", 8, 512, [&] {
            for (int p = 0; p < kPhases; p++)
                dfl::cuda::launch_maybe_pdl(true, phase_kernel, dim3(8), dim3(512), 0, s, slots, p);
        });
        time("8 x 512 plain", 8, 512, [&] {
            for (int p = 0; p < kPhases; p++) phase_kernel<<<8, 512, 0, s>>>(slots, p);
        });
        time("cluster 8 x 512 (PDL)", 8, 512, [&] {
            for (int p = 0; p < kPhases; p++)
                dfl::cuda::launch_maybe_pdl(true, 8u, cluster_phase_kernel, dim3(8), dim3(512), 0, s, slots, p);
        });
        cudaFuncSetAttribute(cluster_phase_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        time("cluster 16 x 256 (PDL)", 16, 256, [&] {
            for (int p = 0; p < kPhases; p++)
                dfl::cuda::launch_maybe_pdl(true, 16u, cluster_phase_kernel, dim3(16), dim3(256), 0, s, slots, p);
        });
    }
    if (per_sm < 1) {
        std::printf("bench sync persistent: no block fits an SM\n");
    } else {
        time("one kernel, grid barriers", blocks, kThreads,
             [&] { persistent_kernel<<<blocks, kThreads, 0, s>>>(slots, arrived, failed); });
        int f = 0;
        cudaMemcpy(&f, failed, sizeof f, cudaMemcpyDeviceToHost);
        if (f) std::printf("bench sync persistent: a barrier timed out (blocks not all resident?)\n");
    }
    cudaFree(slots);
    cudaFree(arrived);
    cudaFree(failed);
}

}  // namespace dfltest

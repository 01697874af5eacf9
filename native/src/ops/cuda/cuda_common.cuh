// Helpers shared by the CUDA kernels: error checks, launch shapes, reductions and the per-element decoding of every
// weight and cache type (the same arithmetic as quant.cpp's dequant_* functions).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "common.h"

namespace dfl {
namespace cuda {

// GGUF block layouts (see quant.h): elements per block and bytes per block. Kept here so the CUDA code depends only on
// the byte layout, not on the CPU kernels' headers.
constexpr int QK8_0 = 32;
constexpr int QK_K = 256;
constexpr int kQ8_0Bytes = 34;   // f16 d, 32 x int8
constexpr int kQ4_0Bytes = 18;   // f16 d, 16 bytes of nibbles (low: elements 0-15, high: 16-31, each code + 8)
constexpr int kQ4_KBytes = 144;  // f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
constexpr int kQ6_KBytes = 210;  // 128 bytes low nibbles, 64 bytes high bit pairs, 16 int8 scales, f16 d

[[noreturn]] inline void fail_cuda(const char *op, cudaError_t e) {
    fail(DFL_ERR_INTERNAL, std::string(op) + ": " + cudaGetErrorString(e));
}

inline void check(cudaError_t e, const char *op) {
    if (e != cudaSuccess) fail_cuda(op, e);
}

// After every launch: a bad configuration shows up here, a fault in the kernel at the next synchronising call.
inline void check_launch(const char *op) { check(cudaGetLastError(), op); }

// A count knob's value for kernels instantiated at powers of two: the largest power of two at most v and cap (a power
// of two), at least 1.
inline int pow2_knob(int64_t v, int cap) {
    int r = 1;
    while (r * 2 <= cap && r * 2 <= v) r *= 2;
    return r;
}

// Sets Kernel's attribute Attr to value on device `device`, once per device (a launch after costs an atomic load):
// function attributes are per kernel and device, and the value a caller asks is the same every launch.
template <auto Kernel, cudaFuncAttribute Attr>
void set_func_attribute_once(int device, int value, const char *op) {
    constexpr int kDevices = 64;
    static std::atomic<bool> set[kDevices];
    const bool cached = device >= 0 && device < kDevices;
    if (cached && set[device].load(std::memory_order_acquire)) return;
    check(cudaFuncSetAttribute(Kernel, Attr, value), op);
    if (cached) set[device].store(true, std::memory_order_release);
}

// Lets Kernel take up to bytes of dynamic shared memory on device `device` (the opt-in above 48 KB).
template <auto Kernel>
void allow_dynamic_smem(int device, size_t bytes, const char *op) {
    set_func_attribute_once<Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize>(device, (int)bytes, op);
}

// Asks the largest shared-memory carveout for Kernel on device `device`: a kernel whose blocks each take tens of KB
// reaches its register-bound blocks an SM only with most of the L1 given to shared memory.
template <auto Kernel>
void prefer_shared_carveout(int device, const char *op) {
    set_func_attribute_once<Kernel, cudaFuncAttributePreferredSharedMemoryCarveout>(device, cudaSharedmemCarveoutMaxShared,
                                                                                  op);
}

// Programmatic dependent launch (sm_90): a kernel launched by launch_pdl may start while the kernel before it on the
// stream still runs. It must call pdl_wait() before it reads anything that kernel writes (the wait returns once that
// kernel has finished and its writes are visible; at once where there is no such kernel), and may do independent work,
// such as loading its weights, before. pdl_trigger() lets the next PDL kernel start before this one ends.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A load of what the kernel before wrote, in a PDL kernel after its pdl_wait(): ld.global.ca, never __ldg's
// ld.global.nc. .nc promises the bytes stay the same for the kernel's whole life, which a PDL launch breaks, and ptxas
// may then hoist it above griddepcontrol.wait: nvcc 11.8 put three of gemv_q8p_ahead_kernel<1, 8>'s activation loads
// before the wait (its SASS, 12-06), so a product could read the codes of the op before the one it follows (a ds4 op
// test's product differed once, H100 12-06 15:5x). scripts/gpu/sass-hoist.py lists kernels that still do.
template <class T>
__device__ __forceinline__ T ld_act(const T *p) {
    return __ldca(p);
}

// Asynchronous 16-byte copies from global to shared memory (sm_80): the bytes in flight hold no registers. A thread
// waits for its own groups (cp_async_wait<N>: all but the N newest); other threads' copies need a barrier after.
__device__ __forceinline__ void cp_async16(void *smem_dst, const void *gmem_src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async8(void *smem_dst, const void *gmem_src) {  // (.cg takes 16 bytes only)
    const unsigned d = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(gmem_src) : "memory");
}
// cp_async16 to a shared-memory address already converted (__cvta_generic_to_shared): for loops that add offsets to it
__device__ __forceinline__ void cp_async16_at(unsigned smem_addr, const void *gmem_src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async4(void *smem_dst, const void *gmem_src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Whether PDL launches are used: on sm_90 and later unless DFL_CUDA_PDL=0 (defined in device.cu).
bool pdl_on();

// Whether the norms, element-wise kernels and attention are programmatic dependent launches too (launch_chain):
// on unless DFL_CUDA_PDL_CHAIN=0 (defined in device.cu; H200, qwen3-8b decode at batch 1: q8_0 273 -> 278 tok/s, q4_K
// 352 -> 359). Each then starts while the kernel before it ends (its launch hidden) and waits at its top.
bool pdl_chain_on();

// Whether a staged or streamed tensor-core product of `blocks` lets the next PDL launch start as soon as every one of
// its blocks has begun (pdl_trigger at its top, pdl_early) instead of after its main loop: grids of more than one wave
// at two blocks an SM, or more than N waves with DFL_CUDA_PDL_EARLY=N (a knob, for comparisons in one run; 0: none)
// (defined in device.cu). Why: a product's last wave leaves most SMs
// idle (the 27B's gate|up at 16 tokens is 4.1 waves of its 32-row tiles), and the kernels after it (a norm, a copy,
// the next product loading its first weights before its wait) can already sit there. H100 12-06 12:5x, alternated:
// 27B verify 8 / 16 / 23 rows / tree 13.37-13.39 / 14.40-14.41 / 15.71-15.78 / 15.84-15.85 -> 13.18-13.19 / 14.23-14.25
// / 15.55 / 15.66-15.67 ms, decode even; qwen3-8b q8_0 tg b8 4.19-4.21 -> 4.08-4.10 ms, b1, b32 and q4_K even. A grid
// of one wave triggers at once and lets a chain of launches run ahead, their weight loads crowding the latency-bound
// kernels between: every staged and streamed grid early took qwen3-8b q8_0 b8 to 4.40 ms (12:5x), every product
// (the one-token GEMVs too) b1 / b8 / b32 3.89 / 4.10 / 5.02 -> 3.97 / 4.34 / 5.16 (11:4x). Safe for any kernel that
// reads what the one before wrote only after pdl_wait (every launch_pdl and launch_chain kernel): the wait still
// returns only once the kernel before has finished and its writes are visible.
class CudaDevice;
bool pdl_early_for(const CudaDevice &dev, int64_t blocks);

// In a product kernel's first lines: pdl_early_for's trigger (early, the kernel's argument).
__device__ __forceinline__ void pdl_early(bool early) {
    if (early) pdl_trigger();
}

// kernel<<<grid, block, shm, s>>>(args...) as a programmatic dependent launch where pdl (and pdl_on()), a plain launch
// otherwise; with cluster > 1, in thread-block clusters of that many blocks along x (sm_90).
template <typename... Params, typename... Args>
inline void launch_maybe_pdl(bool pdl, unsigned cluster, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shm,
                             cudaStream_t s, Args &&...args) {
    pdl = pdl && pdl_on();
    if (!pdl && cluster <= 1) {
        kernel<<<grid, block, shm, s>>>(std::forward<Args>(args)...);
        return;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = shm;
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster;
        attr[n].val.clusterDim.y = 1;
        attr[n++].val.clusterDim.z = 1;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
inline void launch_maybe_pdl(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shm, cudaStream_t s,
                             Args &&...args) {
    launch_maybe_pdl(pdl, 1u, kernel, grid, block, shm, s, std::forward<Args>(args)...);
}

// A product's kernels (the quantizer, the one-token GEMVs): PDL wherever pdl_on().
template <typename... Params, typename... Args>
inline void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t s, Args &&...args) {
    launch_maybe_pdl(true, kernel, grid, block, 0, s, std::forward<Args>(args)...);
}

// The kernels between products (norms, element-wise, attention), which call pdl_wait() first: PDL unless
// DFL_CUDA_PDL_CHAIN=0.
template <typename... Params, typename... Args>
inline void launch_chain(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shm, cudaStream_t s, Args &&...args) {
    launch_maybe_pdl(pdl_chain_on(), kernel, grid, block, shm, s, std::forward<Args>(args)...);
}

inline unsigned grid_for(int64_t n, int block) {
    const int64_t g = (n + block - 1) / block;
    return (unsigned)(g < 1 ? 1 : (g > 65535 * 16 ? 65535 * 16 : g));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The 32 lanes of a warp hold one block of 32 activations in order, v this lane's. Writes v's int8 code (v / d rounded
// to nearest, d = amax / 127) to *q and, from lane 0, d to *d_out and, where sum_out is not null, d times the sum of
// the block's codes (the q4_K kernels' sub-block minimums). Every quantizer of int8 products goes through here, so a
// norm that quantizes its output writes the same bytes as the quantizer launched by a product. Returns this lane's code
// and the block's d, for the callers that store them elsewhere too (quant_q8_store).
struct Q8Code {
    int8_t q;
    float d;
};
__device__ __forceinline__ Q8Code quant_q8_warp(float v, int8_t *q, float *d_out, float *sum_out) {
    const int lane = threadIdx.x & 31;
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    const int qi = __float2int_rn(v * inv);
    *q = (int8_t)qi;
    if (sum_out) {
        const int qsum = __reduce_add_sync(0xffffffffu, qi);
        if (lane == 0) *sum_out = d * (float)qsum;
    }
    if (lane == 0) *d_out = d;
    return Q8Code{(int8_t)qi, d};
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result. `red` is 32
// floats of shared memory; the trailing barrier lets the caller reuse it at once.
__device__ __forceinline__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[w] = v;
    __syncthreads();
    float s = lane < nw ? red[lane] : 0.0f;
    s = warp_sum(s);
    __syncthreads();
    return s;
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

__host__ __device__ __forceinline__ uint16_t ld_u16(const uint8_t *p) { return *(const uint16_t *)p; }

// Scratch sub-buffers start on 256-byte boundaries.
inline size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }

// Host-callable too, so the host-side checks can run the same decoding.
__host__ __device__ __forceinline__ float half_bits_to_f32(uint16_t h) {
    __half_raw r;
    r.x = h;
    return __half2float(__half(r));
}
__host__ __device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
#ifdef __CUDA_ARCH__
    return __uint_as_float((uint32_t)b << 16);
#else
    return fp32_from_bits((uint32_t)b << 16);
#endif
}

// binary32 -> bfloat16 bits exactly as common.h's f32_to_bf16 (round to nearest even, quiet NaN).
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
    const uint32_t x = __float_as_uint(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x0040);
    return (uint16_t)((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

__device__ __forceinline__ uint16_t f32_to_half_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }

// 6-bit scale and min of sub-block j of a q4_K super-block (see quant.cpp).
__host__ __device__ __forceinline__ void q4k_scale_min_dev(int j, const uint8_t *s, int &sc, int &m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// What lane p (0..7) of the eight that share a q4_K super-block reads of it (the GEMV layout: 16 bytes of quants,
// the 16 low nibbles of sub-block 2c and the 16 high nibbles of sub-block 2c + 1, c = p / 2), with the block's scales
// and minimums of those two sub-blocks.
struct Q4KLane {
    uint4 q;
    float d, dmin;
    int sc1, m1, sc2, m2;
};
// q4k_scale_min_dev on a super-block's first 16 bytes held in registers (d and dmin, then the 12 scale bytes: words
// y, z, w), without indexing a local array.
__device__ __forceinline__ void q4k_scale_min_hdr(const uint4 &hdr, int j, int &sc, int &m) {
    const int k = 8 * (j & 3);
    const int lo = (int)((hdr.y >> k) & 0xFF), mid = (int)((hdr.z >> k) & 0xFF);
    if (j < 4) {
        sc = lo & 63;
        m = mid & 63;
    } else {
        const int hi = (int)((hdr.w >> k) & 0xFF);
        sc = (hi & 0x0F) | ((lo >> 6) << 4);
        m = (hi >> 4) | ((mid >> 6) << 4);
    }
}

// Lane p's share of a super-block from its quants word and the block's 16-byte header.
__device__ __forceinline__ Q4KLane q4k_decode(const uint4 &q, const uint4 &hdr, int p) {
    Q4KLane l;
    l.q = q;
    l.d = half_bits_to_f32((uint16_t)(hdr.x & 0xFFFF));
    l.dmin = half_bits_to_f32((uint16_t)(hdr.x >> 16));
    q4k_scale_min_hdr(hdr, 2 * (p >> 1), l.sc1, l.m1);
    q4k_scale_min_hdr(hdr, 2 * (p >> 1) + 1, l.sc2, l.m2);
    return l;
}

// blk 16-byte aligned in global memory: one load of the header, one of the lane's quants.
__device__ __forceinline__ Q4KLane q4k_lane(const uint8_t *blk, int p) {
    return q4k_decode(__ldg((const uint4 *)(blk + 16 + 16 * p)), __ldg((const uint4 *)blk), p);
}

// What lane p (0..7) of the eight that share a q6_K super-block reads of it (the GEMV layout: half h = p / 4,
// positions l0 = 8 (p % 4) .. l0 + 7 of each of the half's four 32-wide quarters): 8 bytes of ql for quarters 0 and 2
// (low and high nibbles: la), 8 for quarters 1 and 3 (lb), 8 of qh with the two high bits of all four (hb), each as
// two little-endian words, and the four quarters' scales times d. Blocks are 2-byte aligned: 16-bit loads.
struct Q6KLane {
    uint32_t la[2], lb[2], hb[2];
    float ds[4];
};

__device__ __forceinline__ void load8_u16(const uint8_t *p, uint32_t (&w)[2]) {
    const unsigned short *h = (const unsigned short *)p;
    w[0] = (uint32_t)__ldg(h) | ((uint32_t)__ldg(h + 1) << 16);
    w[1] = (uint32_t)__ldg(h + 2) | ((uint32_t)__ldg(h + 3) << 16);
}

__device__ __forceinline__ Q6KLane q6k_lane(const uint8_t *blk, int p) {
    const int h = p >> 2, l0 = 8 * (p & 3);
    Q6KLane l;
    load8_u16(blk + 64 * h + l0, l.la);
    load8_u16(blk + 64 * h + 32 + l0, l.lb);
    load8_u16(blk + 128 + 32 * h + l0, l.hb);
    const float d = half_bits_to_f32(__ldg((const unsigned short *)(blk + 208)));
    const int8_t *sc = (const int8_t *)(blk + 192 + 8 * h + l0 / 16);
#pragma unroll
    for (int k = 0; k < 4; k++) l.ds[k] = d * (float)__ldg(sc + 2 * k);
    return l;
}

// Element i of a row of `type`. Slow per element but simple: used where the row is read once (embedding, the
// dequantize-to-f16 prefill path, KV cache rows) and the memory traffic, not the arithmetic, sets the speed.
__host__ __device__ __forceinline__ float load_elem(uint32_t type, const uint8_t *row, int64_t i) {
    switch (type) {
    case DFL_TYPE_F32:
        return ((const float *)row)[i];
    case DFL_TYPE_F16:
        return half_bits_to_f32(((const uint16_t *)row)[i]);
    case DFL_TYPE_BF16:
        return bf16_bits_to_f32(((const uint16_t *)row)[i]);
    case DFL_TYPE_Q8_0: {
        const uint8_t *b = row + (i / QK8_0) * kQ8_0Bytes;
        return half_bits_to_f32(ld_u16(b)) * (float)(int8_t)b[2 + i % QK8_0];
    }
    case DFL_TYPE_Q4_0: {
        const uint8_t *b = row + (i / 32) * kQ4_0Bytes;
        const int j = (int)(i % 32);
        const int nib = j < 16 ? (b[2 + j] & 0x0F) : (b[2 + j - 16] >> 4);
        return half_bits_to_f32(ld_u16(b)) * (float)(nib - 8);
    }
    case DFL_TYPE_Q4_K: {
        const uint8_t *b = row + (i / QK_K) * kQ4_KBytes;
        const int j = (int)(i % QK_K), c = j / 64, l = j % 64;
        const float d = half_bits_to_f32(ld_u16(b)), dmin = half_bits_to_f32(ld_u16(b + 2));
        int sc, m;
        q4k_scale_min_dev(2 * c + (l >= 32), b + 4, sc, m);
        const uint8_t q = b[16 + 32 * c + (l & 31)];
        const int nib = l < 32 ? (q & 0x0F) : (q >> 4);
        return (d * (float)sc) * (float)nib - dmin * (float)m;
    }
    case DFL_TYPE_Q6_K: {
        const uint8_t *b = row + (i / QK_K) * kQ6_KBytes;
        const int j = (int)(i % QK_K), h = j / 128, r = j % 128, k = r / 32, l = r % 32;
        const uint8_t lb = b[64 * h + l + 32 * (k & 1)];
        const int lo = k < 2 ? (lb & 0x0F) : (lb >> 4);
        const int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
        const int q = (lo | (hi << 4)) - 32;
        const float d = half_bits_to_f32(ld_u16(b + 208));
        const int8_t sc = (int8_t)b[192 + 8 * h + l / 16 + 2 * k];
        return d * (float)sc * (float)q;
    }
    default:
        return 0.0f;
    }
}

}  // namespace cuda
}  // namespace dfl

// What the Gated DeltaNet's delta-rule kernels share (gdn.cu: the staged and global-memory kernels; gdn_parallel.cu:
// the parallel form of recording entries): their arguments and a block's view of its value head.
#pragma once

#include <cstdint>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

constexpr int kGdnThreads = 128;  // threads per block: 128 / P columns (staged kernel) or 128 (global and parallel)

struct GdnArgs {
    GdnCall g;
    int n_ent;  // blockIdx.y is entry + n_ent * layer (GdnCall::layers)
    const int32_t *t0, *n, *slot;
    float *const *rec_state;    // BatchMeta::rec_state: a tree's set-aside states
    float *const *recording;    // BatchMeta::rec_in: non-null for an entry that records
    float *const *rec_in;       // GdnCall::rec_inputs in the staged and parallel kernels: BatchMeta::rec_in, else null
    float *work;                // the global-memory kernel's working copies of recording entries' states
    const int32_t *tree_steps;  // BatchMeta::tree_steps (token trees), or null
    bool smem_stack;            // the staged kernel sets a tree's states aside in shared memory where they fit
    const int32_t *parent;      // BatchMeta::parent (token trees), or null
    int parallel_max;           // recording entries of at most this many tokens are gdn_parallel_kernel's (0: none)
};

// Value head j of the block's entry e and layer (blockIdx.y): its state S in the entry's slot, whether the entry
// records (its slot then keeps the state before), a tree's set-aside states (rec, per floats apart), the layer's
// inputs (cv, gl, beta), the entry's tokens, and where its q and k heads and its v columns from column v0 lie in a
// cv row.
struct GdnHead {
    float *S, *rec;
    bool recording;
    const float *cv, *gl, *beta;
    const int32_t *in_rows;
    int e;
    int64_t per, n, t0, q_off, k_off, v_off;
    // a tree entry's schedule (GdnArgs::tree_steps: step i runs token TreeStep::unpack(steps[i]).token), else null
    const int32_t *steps;
    __device__ GdnHead(const GdnArgs &a, int dk, int j, int64_t v0) {
        const GdnCall &g = a.g;
        e = (int)blockIdx.y % a.n_ent;
        const int64_t layer = (int64_t)blockIdx.y / a.n_ent, li = layer * g.layer_in, ls = layer * g.layer_state;
        cv = g.cv + li;
        gl = g.g + li;
        beta = g.beta + li;
        const int kh = j % g.n_k;
        const int64_t head = (int64_t)dk * g.dv;
        S = g.state + ls + (int64_t)a.slot[e] * g.slot_stride + j * head;
        recording = a.recording && a.recording[e];
        rec = a.rec_state ? a.rec_state[e] : nullptr;
        per = (int64_t)g.n_rec * g.n_v * head;
        if (rec) rec += (int64_t)g.rec_layer * g.n_v * head + j * head;
        n = a.n[e];
        t0 = a.t0[e];
        in_rows = g.in_rows;
        steps = a.tree_steps && a.tree_steps[t0] >= 0 ? a.tree_steps + t0 : nullptr;
        q_off = (int64_t)kh * dk;
        k_off = (int64_t)(g.n_k + kh) * dk;
        v_off = (int64_t)2 * g.n_k * dk + (int64_t)j * g.dv + v0;
    }
    // the row of cv, g and beta that token tok reads
    __device__ int64_t row(int64_t tok) const { return in_rows ? in_rows[tok] : tok; }
    // the step of the entry's it-th: its tree schedule's, else the next token's
    __device__ TreeStep step(int64_t it) const {
        if (steps) return TreeStep::unpack(steps[it]);
        TreeStep s;
        s.token = (int)it;
        return s;
    }
    // set-aside state k of a tree
    __device__ float *aside(int k) const { return rec + (int64_t)k * per; }
};

// A thread's R rows a0.. of state column b, from or to a [dk][dv] head (dst may be a recorded state).
template <int R>
__device__ __forceinline__ void load_column(float (&s)[R], const float *src, int a0, int dv, int b, bool active) {
#pragma unroll
    for (int i = 0; i < R; i++) s[i] = active ? src[(int64_t)(a0 + i) * dv + b] : 0.0f;
}
template <int R>
__device__ __forceinline__ void store_column(float *dst, const float (&s)[R], int a0, int dv, int b) {
#pragma unroll
    for (int i = 0; i < R; i++) dst[(int64_t)(a0 + i) * dv + b] = s[i];
}

// The kernels' arguments for call g on batch m: nothing recorded by the kernels themselves (rec_in), no parallel form,
// tree states in the records.
GdnArgs gdn_args(const BatchMeta &m, const GdnCall &g);

// Recording entries of at most this many tokens may run in parallel form (gdn_parallel_kernel; launch_gdn says when).
constexpr int kGdnParMax = 32;  // (its ancestor masks are 32 bits)

// gdn_parallel_kernel on a's grid for the recording entries of up to kGdnParMax tokens of m (heads 128 or 64 rows
// wide); sets a.parallel_max so that the staged kernel launched after it skips them.
void launch_gdn_parallel(cudaStream_t s, GdnArgs &a, const BatchMeta &m, const GdnCall &g);

}  // namespace cuda
}  // namespace dfl

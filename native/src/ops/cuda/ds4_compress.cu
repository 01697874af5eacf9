// DeepSeek V4 compressors and lightning indexer on the GPU (device.h: Ds4CompressCall, Ds4IndexerCall).
//
// The CPU compressor walks each entry's tokens in order through the slot's window buffers. Here the windows that close
// inside the batch are pooled in parallel (one block each), reading every slot value where it is at the start of the
// forward: in the batch (positions >= len0), in the slot's current-window buffer (earlier positions of the window
// current at len0), or in its previous-window buffer (the window before that, overlap only). A second kernel then
// leaves the buffers as the CPU's walk leaves them. Pooling, norm and RoPE round as the CPU's (same operation order).
//
// The indexer scores every visible index key per token (a warp per key, each lane a set of heads, the per-head terms
// summed in head order as on the CPU, so scores are bitwise the CPU's for the same inputs) into scratch, then a block
// per token finds the top_k by a radix select on the order-preserving integer image of the scores and writes the
// chosen rows in ascending order (ties: lower row), as the CPU's partial_sort picks them.
#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/ds4_common.cuh"

namespace dfl {
namespace cuda {

constexpr int kCompThreads = 128;

// ---- compressor -----------------------------------------------------------------------------------------------------

// Where the values of one cache position q of an entry (len0, t0) are at the start of the forward.
struct CompSource {
    const Ds4CompressCall *c;
    const float *st;  // the entry's slot buffers
    int64_t len0, t0;
    int width;

    // Channel `dim` of position q: kv (c) into *v and the score with ape (z) into *z.
    __device__ void get(int64_t q, int dim, float *z, float *v) const {
        const int R = c->ratio;
        const int64_t s = q % R;
        if (q >= len0) {
            const int64_t t = t0 + q - len0;
            *v = c->kv[t * width + dim];
            *z = c->gate[t * width + dim] + c->ape[s * width + dim];
            return;
        }
        // before the batch: the window current at len0 is in cur_*, the one before it in prev_*
        const float *kv = q / R == len0 / R ? st : st + 2 * (int64_t)R * width;
        *v = kv[s * width + dim];
        *z = kv[(int64_t)R * width + s * width + dim];
    }
};

// Block (entry, k): the k-th window closing in this batch, w = len0 / R + k (it closes when its last position
// w * R + R - 1 is in the batch). Pools it (per-channel softmax of z over the window's slots weighting c), RMSNorms,
// rotates at position w * R and stores it at its pool row.
__global__ void __launch_bounds__(kCompThreads) compress_pool_kernel(BatchMeta m, Ds4CompressCall c) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    extern __shared__ float row[];  // [head_dim]
    __shared__ double red[32];
    const int32_t e = blockIdx.x;
    const int R = c.ratio, hd = c.head_dim, width = hd * (c.overlap ? 2 : 1);
    const int64_t len0 = m.len0[e], end = len0 + m.n[e];
    const int64_t w = len0 / R + blockIdx.y;
    if (w >= end / R) return;  // block-uniform, before any barrier
    CompSource src{&c, c.state + (int64_t)m.slot[e] * c.slot_stride, len0, (int64_t)m.t0[e], width};
    // slots in the CPU's order: overlap: the previous window's dims [0, hd) (score -inf for w = 0), then this
    // window's dims [hd, 2 hd); else this window's dims [0, hd)
    const int n_slots = c.overlap ? 2 * R : R;
    auto slot = [&](int i, int d, float *z, float *v) {
        if (c.overlap && i < R) {
            if (w == 0) {
                *z = -INFINITY;
                *v = 0.0f;
            } else {
                src.get((w - 1) * R + i, d, z, v);
            }
        } else {
            const int s = c.overlap ? i - R : i;
            src.get(w * R + s, c.overlap ? hd + d : d, z, v);
        }
    };
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float z, v, mx = -INFINITY;
        for (int i = 0; i < n_slots; i++) {
            slot(i, d, &z, &v);
            mx = fmaxf(mx, z);
        }
        float sum = 0.0f;
        for (int i = 0; i < n_slots; i++) {
            slot(i, d, &z, &v);
            sum += expf(z - mx);
        }
        float acc = 0.0f;
        for (int i = 0; i < n_slots; i++) {
            slot(i, d, &z, &v);
            acc += (expf(z - mx) / sum) * v;
        }
        row[d] = acc;
    }
    __syncthreads();
    double ss = 0.0;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) ss += (double)row[d] * row[d];
    ss = block_sum_double(ss, red);
    const float r = (float)(1.0 / sqrt(ss / (double)hd + (double)c.eps));
    for (int d = threadIdx.x; d < hd; d += blockDim.x) row[d] = (row[d] * r) * c.norm[d];
    __syncthreads();
    const int32_t *blocks = m.block_table + (int64_t)e * m.max_blocks;
    float *out = c.rows + ds4_comp_row(blocks, w, R, c.block_size, c.rows_per_block) * hd;
    const int nope = hd - c.rope_dim;
    for (int d = threadIdx.x; d < nope; d += blockDim.x) out[d] = row[d];
    for (int i = threadIdx.x; i < c.rope_dim / 2; i += blockDim.x) {
        float pr[2] = {row[nope + 2 * i], row[nope + 2 * i + 1]};
        rotate_pair(pr, (double)(w * R), c.inv_freq[i]);
        out[nope + 2 * i] = pr[0];
        out[nope + 2 * i + 1] = pr[1];
    }
}

// Thread per (entry, slot s, channel d): leaves the buffers as the CPU's token walk does. cur slot s holds the last
// position q = s (mod R) of the batch, when there is one; with overlap, prev holds the last window closed in the batch
// (when one closed), read before cur is overwritten (the same thread owns both).
__global__ void compress_state_kernel(BatchMeta m, Ds4CompressCall c) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    const int32_t e = blockIdx.y;
    const int R = c.ratio, width = c.head_dim * (c.overlap ? 2 : 1);
    const int64_t len0 = m.len0[e], end = len0 + m.n[e], t0 = m.t0[e];
    float *st = c.state + (int64_t)m.slot[e] * c.slot_stride;
    float *cur_kv = st, *cur_g = st + (int64_t)R * width;
    float *prev_kv = st + 2 * (int64_t)R * width, *prev_g = st + 3 * (int64_t)R * width;
    const bool closed = end / R > len0 / R;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)R * width;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t s = i / width, d = i % width;
        const float old_kv = cur_kv[i], old_g = cur_g[i];
        if (c.overlap && closed) {
            const int64_t q = (end / R - 1) * R + s;
            if (q >= len0) {
                const int64_t t = t0 + q - len0;
                prev_kv[i] = c.kv[t * width + d];
                prev_g[i] = c.gate[t * width + d] + c.ape[i];
            } else {  // the window current at len0: its early positions are in cur
                prev_kv[i] = old_kv;
                prev_g[i] = old_g;
            }
        }
        if (end - 1 < s) continue;
        const int64_t q = (end - 1) - ((end - 1 - s) % R);  // the last position of slot s before end
        if (q < len0) continue;
        const int64_t t = t0 + q - len0;
        cur_kv[i] = c.kv[t * width + d];
        cur_g[i] = c.gate[t * width + d] + c.ape[i];
    }
}

void CudaDevice::ds4_compress(const BatchMeta &m, const Ds4CompressCall &c) {
    if (c.ratio < 1 || c.head_dim < 2 || c.rope_dim > c.head_dim || c.rope_dim % 2 != 0)
        fail(DFL_ERR_INVALID, "ds4_compress: bad shape (ratio " + std::to_string(c.ratio) + ", head_dim " +
                                  std::to_string(c.head_dim) + ", rope_dim " + std::to_string(c.rope_dim) + ")");
    op("ds4_compress", [&] {
        if (m.T <= 0 || m.n_ent <= 0) return;
        // windows closing in an entry of n tokens: at most n / R + 1
        const int64_t max_windows = m.max_n / c.ratio + 1;
        launch_ds4(compress_pool_kernel, dim3((unsigned)m.n_ent, (unsigned)max_windows), kCompThreads, (size_t)c.head_dim * sizeof(float), stream_, m, c);
        check_launch("ds4_compress (pool)");
        const int64_t per_ent = (int64_t)c.ratio * c.head_dim * (c.overlap ? 2 : 1);
        launch_ds4(compress_state_kernel, dim3(grid_for(per_ent, 256), (unsigned)m.n_ent), 256, 0, stream_, m, c);
        check_launch("ds4_compress (state)");
    });
}

// ---- lightning indexer ----------------------------------------------------------------------------------------------

constexpr int kIdxWarps = 4;
constexpr int kIdxKeysPerBlock = 64;  // index keys one scoring block walks (16 per warp)
constexpr int kSelThreads = 512;

// Visible index keys of batch token t: rows s < (p + 1) / ratio.
__device__ __forceinline__ int64_t index_visible(const BatchMeta &m, int64_t t, int ratio) {
    const int32_t e = m.ent[t];
    return ((int64_t)m.len0[e] + (t - m.t0[e]) + 1) / ratio;
}

// Block (token t0 + x, key group y): score(s) for the group's visible keys into scores[x][s]. The queries sit in
// shared memory with a padded stride (lane h reads head h's row without bank conflicts); each lane owns heads
// lane, lane + 32, ... and the per-head terms are added in head order by lane 0, as the CPU adds them.
__global__ void __launch_bounds__(kIdxWarps * 32) index_scores_kernel(BatchMeta m, Ds4IndexerCall c, int64_t tok0,
                                                                      int64_t stride, float *scores) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    extern __shared__ float sh[];
    const int H = c.n_head, hd = c.head_dim, qs = hd + 1;
    float *q_sh = sh, *w_sh = q_sh + (int64_t)H * qs, *k_sh = w_sh + H, *term = k_sh + kIdxWarps * hd;
    const int64_t t = tok0 + blockIdx.x;
    const int64_t nvis = index_visible(m, t, c.ratio);
    const int64_t s0 = (int64_t)blockIdx.y * kIdxKeysPerBlock;
    if (s0 >= nvis || nvis <= c.top_k) return;  // block-uniform; nothing to choose when every row is taken
    for (int i = threadIdx.x; i < H * hd; i += blockDim.x) q_sh[(i / hd) * qs + i % hd] = c.q[t * H * hd + i];
    for (int h = threadIdx.x; h < H; h += blockDim.x) w_sh[h] = c.w[t * H + h] * c.head_scale;
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *kw = k_sh + warp * hd, *tw = term + warp * H;
    const int32_t *blocks = m.block_table + (int64_t)m.ent[t] * m.max_blocks;
    const int64_t s1 = s0 + kIdxKeysPerBlock < nvis ? s0 + kIdxKeysPerBlock : nvis;
    for (int64_t s = s0 + warp; s < s1; s += kIdxWarps) {
        const float *k = c.keys + ds4_comp_row(blocks, s, c.ratio, c.block_size, c.rows_per_block) * hd;
        for (int d = lane; d < hd; d += 32) kw[d] = k[d];
        __syncwarp();
        for (int h = lane; h < H; h += 32) {
            const float *qh = q_sh + h * qs;
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot += qh[d] * kw[d];
            tw[h] = w_sh[h] * (fmaxf(0.0f, dot) * c.dot_scale);
        }
        __syncwarp();
        if (lane == 0) {
            float acc = 0.0f;
            for (int h = 0; h < H; h++) acc += tw[h];
            scores[(int64_t)blockIdx.x * stride + s] = acc;
        }
        __syncwarp();  // kw / tw are refilled for the next key
    }
}

// Order-preserving image of a score: larger float, larger key; NaN counts as -inf and -0 as +0 (the CPU compares
// floats, so they tie).
__device__ __forceinline__ uint32_t score_key(float f) {
    if (f != f) f = -INFINITY;
    if (f == 0.0f) f = 0.0f;
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix count of `flag` over the block in thread order; *total gets the block's count. `warp_n` is 32
// ints of shared memory.
__device__ int block_scan_flag(bool flag, int *warp_n, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const unsigned bal = __ballot_sync(0xffffffffu, flag);
    if (lane == 0) warp_n[warp] = __popc(bal);
    __syncthreads();
    int before = 0, all = 0;
    for (int i = 0; i < nw; i++) {
        if (i < warp) before += warp_n[i];
        all += warp_n[i];
    }
    __syncthreads();
    *total = all;
    return before + __popc(bal & ((1u << lane) - 1u));
}

// Block per token: sel = the top_k rows by score (ties: lower row) in ascending row order, or all visible rows padded
// with -1 when there are at most top_k.
__global__ void __launch_bounds__(kSelThreads) index_select_kernel(BatchMeta m, Ds4IndexerCall c, int64_t tok0,
                                                                   int64_t stride, const float *scores) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    __shared__ unsigned hist[256];
    __shared__ uint32_t sh_prefix;
    __shared__ int sh_need;
    __shared__ int warp_n[32];
    const int64_t t = tok0 + blockIdx.x;
    const int K = c.top_k;
    const int64_t nvis = index_visible(m, t, c.ratio);
    int32_t *sel = c.sel + t * K;
    if (nvis <= K) {
        for (int j = threadIdx.x; j < K; j += blockDim.x) sel[j] = j < nvis ? j : -1;
        return;
    }
    const float *sc = scores + (int64_t)blockIdx.x * stride;
    // radix select, 8 bits a pass from the top: the key of the K-th best and how many keys equal to it are taken
    uint32_t prefix = 0, mask = 0;
    int need = K;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < nvis; i += blockDim.x) {
            const uint32_t k = score_key(sc[i]);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int above = 0, digit = 0;
            for (int d = 255; d >= 0; d--) {
                if (above + (int)hist[d] >= need) {
                    digit = d;
                    break;
                }
                above += (int)hist[d];
            }
            sh_prefix = prefix | ((uint32_t)digit << shift);
            sh_need = need - above;
        }
        __syncthreads();
        prefix = sh_prefix;
        need = sh_need;
        mask |= 255u << shift;
    }
    // emit in row order: every key above the threshold, and the first `need` equal to it
    int taken = 0, equal = 0;
    for (int64_t base = 0; base < nvis; base += blockDim.x) {
        const int64_t i = base + threadIdx.x;
        const uint32_t k = i < nvis ? score_key(sc[i]) : 0u;
        const bool gt = i < nvis && k > prefix, eq = i < nvis && k == prefix;
        int n_eq, n_take;
        const int eq_rank = equal + block_scan_flag(eq, warp_n, &n_eq);
        const bool take = gt || (eq && eq_rank < need);
        const int at = taken + block_scan_flag(take, warp_n, &n_take);
        if (take && at < K) sel[at] = (int32_t)i;
        taken += n_take;
        equal += n_eq;
    }
}

void CudaDevice::ds4_indexer_topk(const BatchMeta &m, const Ds4IndexerCall &c) {
    if (c.ratio < 1 || c.top_k < 1 || c.n_head < 1 || c.head_dim < 1)
        fail(DFL_ERR_INVALID, "ds4_indexer_topk: bad shape");
    const size_t smem = ((size_t)c.n_head * (c.head_dim + 1) + c.n_head + (size_t)kIdxWarps * c.head_dim +
                         (size_t)kIdxWarps * c.n_head) * sizeof(float);
    if (smem > 200 * 1024) fail(DFL_ERR_UNSUPPORTED, "ds4_indexer_topk: indexer queries too large for shared memory");
    op("ds4_indexer_topk", [&] {
        if (m.T <= 0) return;
        if (smem > 48 * 1024)
            check(cudaFuncSetAttribute(index_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                  "ds4_indexer_topk (shared memory)");
        // scores of a chunk of tokens at a time, [chunk][max visible] floats of scratch (at most 256 MB)
        const int64_t stride = std::max<int64_t>(1, m.max_ctx / c.ratio);
        const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(m.T, (int64_t)(64u << 20) / stride));
        float *scores = (float *)scratch((size_t)(chunk * stride) * sizeof(float));
        for (int64_t t0 = 0; t0 < m.T; t0 += chunk) {
            const int64_t n = std::min(chunk, m.T - t0);
            const unsigned groups = (unsigned)((stride + kIdxKeysPerBlock - 1) / kIdxKeysPerBlock);
            launch_ds4(index_scores_kernel, dim3((unsigned)n, groups), kIdxWarps * 32, smem, stream_, m, c, t0, stride, scores);
            check_launch("ds4_indexer_topk (scores)");
            launch_ds4(index_select_kernel, (unsigned)n, kSelThreads, 0, stream_, m, c, t0, stride, scores);
            check_launch("ds4_indexer_topk (select)");
        }
    });
}

}  // namespace cuda
}  // namespace dfl

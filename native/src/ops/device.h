// The op table: everything a layer plan asks of a device. The CPU build (ops/cpu) is the reference; the CUDA build
// (ops/cuda) implements the same functions on the GPU and is tested against the CPU one op by op.
//
// Conventions shared by every implementation:
//  - Pointers passed to ops are device pointers (host pointers on the CPU device). Activations are f32, row-major,
//    rows contiguous unless a stride is given.
//  - Weights keep their GGUF bytes (f32, f16, bf16, q8_0, q4_K, q6_K blocks), one row per output, see quant.h.
//  - The KV cache of one attention layer is a pool of rows [n_blocks * block_size][n_kv] in the cache type; token t of
//    a batch writes its K/V at pool row kv_slot[t].
//  - Recurrent state of one Gated DeltaNet layer for sequence slot s starts at state + s * slot_stride floats
//    ([n_v][dk][dv]); its conv state at conv + s * slot_stride ([K-1][C]).
//  - Ops are ordered: an op sees the results of every op issued before it on the same device. Only to_host (and sync)
//    wait for the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

// What host and CUDA code share of this header (the call structs' row pitches, the attention mask) is compiled for both.
#if defined(__CUDACC__)
#define DFL_HOST_DEVICE __host__ __device__
#else
#define DFL_HOST_DEVICE
#endif

namespace dfl {

// Where an entry's light records of its Gated DeltaNet inputs lie (BatchMeta::rec_in): for n tokens of rows of C
// conv channels and n_v value heads, recurrent layer r's block of n (C + 2 n_v) floats at layer(r), and in a block the
// gated conv rows [n][C], then g [n][n_v], then beta [n][n_v]. Offsets in floats; every device's writers (the
// record_gdn_inputs op, CUDA's delta-rule kernels) and the rollback's replay read it from here.
struct GdnRecordLayout {
    int64_t n, C, n_v;
    DFL_HOST_DEVICE int64_t layer(int64_t r) const { return r * n * (C + 2 * n_v); }
    DFL_HOST_DEVICE int64_t row(int64_t t) const { return t * C; }
    DFL_HOST_DEVICE int64_t g(int64_t t) const { return n * C + t * n_v; }
    DFL_HOST_DEVICE int64_t beta(int64_t t) const { return n * (C + n_v) + t * n_v; }
};

// A 2-D weight on the device: n_out rows of n_in elements of `type`.
struct Weight {
    uint32_t type = DFL_TYPE_F32;
    int64_t n_in = 0, n_out = 0;
    const uint8_t *data = nullptr;
    uint64_t row_bytes = 0;
    // A second copy in a layout of the device's own for its decode kernels (Device::prepare_weight), or null.
    const uint8_t *packed = nullptr;
    // Where the packed layout keeps groups of packed_group rows apart (the CPU's 16-row groups, packed_group_bytes
    // each), a row range starting on a group is a packed matrix of its own; 0: the layout cannot be sliced.
    int32_t packed_group = 0;
    uint64_t packed_group_bytes = 0;
    // Where the packed layout keeps its rows in order, packed_row_bytes each, and (packed_aux) a second region of
    // packed_aux_row_bytes a row (CUDA's repacked q8_0: every row's quants, then every row's block scales), any row
    // range is a packed matrix of its own.
    const uint8_t *packed_aux = nullptr;
    uint64_t packed_row_bytes = 0, packed_aux_row_bytes = 0;

    bool empty() const { return data == nullptr; }
    const uint8_t *row(int64_t r) const { return data + (uint64_t)r * row_bytes; }
    // Rows [r0, r0 + n) as a matrix of their own (an expert of a 3-D stack, a group of a grouped projection), with
    // the packed layout's rows where it can be sliced there.
    Weight rows(int64_t r0, int64_t n) const {
        Weight w = *this;
        w.n_out = n;
        w.data = row(r0);
        if (packed != nullptr && packed_row_bytes > 0) {
            w.packed = packed + (uint64_t)r0 * packed_row_bytes;
            w.packed_aux = packed_aux ? packed_aux + (uint64_t)r0 * packed_aux_row_bytes : nullptr;
            return w;
        }
        const bool sliced = packed != nullptr && packed_group > 0 && r0 % packed_group == 0;
        w.packed = sliced ? packed + (uint64_t)(r0 / packed_group) * packed_group_bytes : nullptr;
        w.packed_aux = nullptr;
        return w;
    }
};

// The batch of one forward, as the ops see it. Arrays are device pointers; scalars are host values.
struct BatchMeta {
    int64_t T = 0;     // tokens in the batch
    int32_t n_ent = 0; // entries (one per sequence)
    int64_t max_n = 0; // most tokens of one entry
    int64_t max_ctx = 0; // largest len0 + n of an entry (positions an attention row may see)
    // per token [T]
    const int32_t *tokens = nullptr;
    const int32_t *pos = nullptr;      // RoPE position
    const int32_t *ent = nullptr;      // entry of the token
    const int32_t *kv_slot = nullptr;  // KV pool row the token's K/V are written to (null without attention layers)
    // per entry [n_ent]
    const int32_t *t0 = nullptr;       // first token of the entry in the batch
    const int32_t *n = nullptr;        // tokens of the entry
    const int32_t *len0 = nullptr;     // sequence length before this forward (cache positions already there)
    const int32_t *slot = nullptr;     // sequence slot (recurrent state index)
    const int32_t *block_table = nullptr;  // [n_ent][max_blocks] KV block ids of the entry's sequence
    int32_t max_blocks = 0;
    // recording (speculative rollback), per entry; null pointer = the entry does not record (rec_in says which do).
    // A recording entry's slot keeps its recurrent state from before the forward (GdnCall); a rollback replays the
    // kept tokens' inputs. rec_state: a tree's [kTreeSlots][n_rec][n_v * dk * dv], slot k its schedule's set-aside
    // state k (the state after a branch point, waiting for its later subtrees: tree_steps); null for a chain
    float *const *rec_state = nullptr;
    float *const *rec_window = nullptr; // [n_rec][K - 1 + n][C]: the conv window (old inputs, then the new ones)
    // the Gated DeltaNet inputs of the entry's tokens, laid out as GdnRecordLayout says (record_gdn_inputs writes them)
    float *const *rec_in = nullptr;
    int32_t n_record = 0;  // entries that record (a host scalar: which ones, only rec_in on the device says)
    // Token trees (forward_tree); parent, vis and tree_steps are null when the batch has none. Per token [T]:
    //  - parent: index within its entry of the token's parent, -1 for an entry's first token; an ordinary (chain)
    //    entry's token i has i - 1. The conv op builds a token's window along its ancestors, falling into the old conv
    //    state past the first token; the recurrent op walks a tree by its schedule (tree_steps; an entry with a tree
    //    always records).
    //  - vis: the entry's own tokens j < 64 the token sees (bit j; cache position len0 + j); see attn_visible. An
    //    ordinary token has ~0 (its causal range decides). Tree entries have at most 64 tokens.
    const int32_t *parent = nullptr;
    const uint64_t *vis = nullptr;
    // per entry at its t0: the steps of its tree's depth-first schedule (core/tree_order.h, TreeStep packed), -1 at
    // a chain's t0; the recurrent op runs a tree's tokens in that order, each from the state after its parent: the
    // step before's, or the set-aside state it restores (rec_state slot `restore`, or where the device keeps them)
    const int32_t *tree_steps = nullptr;
};

// One attention layer's paged KV pool.
struct KVLayer {
    uint8_t *k = nullptr, *v = nullptr;
    uint32_t type_k = DFL_TYPE_F32, type_v = DFL_TYPE_F32;
    uint64_t k_row = 0, v_row = 0;  // bytes of one (pool row, kv head) row of head_dim elements
    int n_kv = 0, head_dim = 0, block_size = 0;
};

// q/k RMSNorm + NeoX RoPE on the projections, K/V written into the cache.
// qf = nullptr: K/V only (rows that are keys but never queries, e.g. a DFlash draft's context); Q is not written.
struct AttnPrep {
    const float *qf = nullptr;  // [T][n_head * head_dim * (gated ? 2 : 1)]; gated: per head head_dim q, then head_dim gate
    float *kf = nullptr;        // [T][n_kv * head_dim] (normalised and rotated in place)
    const float *vf = nullptr;  // [T][n_kv * head_dim]
    // floats from one token's row of qf, kf, vf to the next (0: the row's width): a fused q|k|v product's rows where
    // they lie in its buffer (project_views); the pitches below are what the ops step by
    int64_t q_stride = 0, k_stride = 0, v_stride = 0;
    const float *q_norm = nullptr, *k_norm = nullptr;  // [head_dim]
    const float *inv_freq = nullptr;                   // [rope_dim / 2]
    int n_head = 0, rope_dim = 0;
    bool gated = false;
    float eps = 1e-6f;
    float *Q = nullptr;     // out [T][n_head * head_dim]
    float *gate = nullptr;  // out [T][n_head * head_dim] when gated
    KVLayer kv;
    DFL_HOST_DEVICE int64_t q_pitch() const {
        return q_stride ? q_stride : (int64_t)n_head * kv.head_dim * (gated ? 2 : 1);
    }
    DFL_HOST_DEVICE int64_t k_pitch() const { return k_stride ? k_stride : (int64_t)kv.n_kv * kv.head_dim; }
    DFL_HOST_DEVICE int64_t v_pitch() const { return v_stride ? v_stride : (int64_t)kv.n_kv * kv.head_dim; }
};

// Attention of every batch token against its sequence's cache. Token i of an entry sits at cache position
// p = len0 + i and sees positions [lo, hi): causal (the default): hi = p + 1, else hi = len0 + n (the whole entry, as
// a DFlash draft block needs); window W > 0: lo = max(0, p - W + 1), and when not causal also hi = min(hi, p + W)
// (a sliding window in both directions); W = 0: lo = 0. Q, out: [T][n_head * head_dim].
struct AttnCall {
    const float *Q = nullptr;
    float *out = nullptr;
    int n_head = 0;
    float scale = 1.0f;
    bool causal = true;
    int window = 0;
    KVLayer kv;
};

// The cache positions [lo, hi) a token at position p of an entry of n tokens after len0 sees (see AttnCall). Host and
// device code share it so every implementation applies the same mask.
DFL_HOST_DEVICE inline void attn_range(int64_t p, int64_t len0, int64_t n, bool causal, int window, int64_t *lo, int64_t *hi) {
    int64_t h = causal ? p + 1 : len0 + n;
    int64_t l = 0;
    if (window > 0) {
        l = p - window + 1 > 0 ? p - window + 1 : 0;
        if (!causal && p + window < h) h = p + window;
    }
    *lo = l;
    *hi = h;
}

// Whether a token whose tree visibility mask is `vis` sees cache position q of its entry (len0 = the entry's first
// position), on top of attn_range: positions before len0 or len0 + 64 and later are decided by the range alone.
DFL_HOST_DEVICE inline bool attn_visible(uint64_t vis, int64_t q, int64_t len0) {
    const int64_t j = q - len0;
    return j < 0 || j >= 64 || ((vis >> j) & 1u) != 0;
}

// Set-aside states a tree schedule (core/tree_order.h, BatchMeta::tree_steps) keeps at once, at most: 5 for any tree
// of at most 64 tokens.
constexpr int kTreeSlots = 5;

// One step of a tree schedule packed in an int32: the token (its index in the entry), then the slot its state is
// first restored from, then the slot the state after it is saved to (slot + 1, 0 for none); the first step also
// carries the most slots the schedule keeps at once (a device may keep few slots closer: the CUDA kernel's shared
// memory).
struct TreeStep {
    int token = 0, restore = -1, save = -1, slots = 0;
    DFL_HOST_DEVICE int32_t pack() const { return token | (restore + 1) << 8 | (save + 1) << 12 | slots << 16; }
    DFL_HOST_DEVICE static TreeStep unpack(int32_t v) {
        TreeStep s;
        s.token = v & 0xFF;
        s.restore = ((v >> 8) & 0xF) - 1;
        s.save = ((v >> 12) & 0xF) - 1;
        s.slots = (v >> 16) & 0xF;
        return s;
    }
};

// Depthwise causal conv (kernel K) + SiLU of each entry's tokens, continuing from the slot's conv state, which is
// updated to the last K-1 inputs. Recording entries instead get their whole window in rec_window and leave the slot's
// conv state as it was (as gdn leaves their recurrent state): a rollback takes the kept rows from the window.
// Taps of a conv1d_silu kernel at most (the CPU holds a row pointer a tap; loaders refuse more; released models: 4).
constexpr int kConvMaxK = 8;

struct ConvCall {
    const float *x = nullptr;  // [T][C], rows x_stride apart (0: C)
    int64_t x_stride = 0;
    float *out = nullptr;      // [T][C]
    const float *w = nullptr;  // [K][C]: tap j of channel c at j C + c (the file's [C][K], WeightStore::vec_transposed)
    int C = 0, K = 0;
    float *conv = nullptr;     // conv state of this layer for slot 0
    int64_t slot_stride = 0;   // floats between slots
    int rec_layer = 0, n_rec = 0;
    DFL_HOST_DEVICE int64_t x_pitch() const { return x_stride ? x_stride : C; }
};

// Per token: L2-normalise the q and k heads of the conv output (q also scaled by 1/sqrt(dk)), and the gates
// beta = sigmoid(b), g = a_log_scale * softplus(a + dt_bias).
struct GdnGates {
    float *cv = nullptr;  // [T][C], q heads then k heads then v
    int C = 0, n_k = 0, dk = 0, n_v = 0;
    const float *b = nullptr, *a = nullptr;            // [T][n_v] projections, rows b_stride / a_stride apart (0: n_v)
    int64_t b_stride = 0, a_stride = 0;
    const float *ssm_a = nullptr, *dt_bias = nullptr;  // [n_v]
    float *beta = nullptr, *g = nullptr;               // out [T][n_v]
    DFL_HOST_DEVICE int64_t b_pitch() const { return b_stride ? b_stride : n_v; }
    DFL_HOST_DEVICE int64_t a_pitch() const { return a_stride ? a_stride : n_v; }
};

// The gated delta rule of every entry and value head, continuing from the slot's state. Value head j reads key head
// j % n_k (GGUF order). A recording entry (BatchMeta::rec_in set) leaves its slot's state as it was before the forward
// (a device works on a copy of its own), and of a tree walks the tokens in the schedule's order (tree_steps), setting
// states aside in rec_state; a rollback replays the kept tokens' recorded inputs onto the slot.
// Recording and exact calls take the state token by token, the same arithmetic for every token count, so that a
// replay of k recorded tokens gives the state the recording forward had after them, bit for bit.
struct GdnCall {
    const float *cv = nullptr;  // [T][C] after GdnGates
    int C = 0, n_k = 0, n_v = 0, dk = 0, dv = 0;
    const float *g = nullptr, *beta = nullptr;  // [T][n_v]
    float *out = nullptr;                       // [T][n_v * dv]
    float *state = nullptr;                     // recurrent state of this layer for slot 0
    int64_t slot_stride = 0;
    int rec_layer = 0, n_rec = 0;
    bool exact = false;  // token by token even without recording (a replay of records)
    // first copy the recording entries' inputs (cv rows, g, beta) into their records (BatchMeta::rec_in), as
    // record_gdn_inputs with gdn_inputs(*this) would: the CUDA device's staged kernel does it from the copies it makes
    bool rec_inputs = false;
    // A replay of records (one entry, not recording, from the slot's state): `layers` consecutive layers in one call,
    // layer l's cv, g and beta at + l * layer_in floats, its state at + l * layer_state. out may be null (no outputs
    // written), and must be with several layers.
    int layers = 1;
    int64_t layer_in = 0, layer_state = 0;
    // A replay along a tree's path: token t reads its inputs (cv, g and beta rows) at row in_rows[t] (a device array),
    // not at row t.
    const int32_t *in_rows = nullptr;
};

// What every device's gdn refuses of a call's replay fields: several layers with more than one entry or with outputs.
inline void check_gdn_replay(int64_t n_ent, const GdnCall &g) {
    if (g.layers < 1 || (g.layers > 1 && (g.out || n_ent != 1)))
        fail(DFL_ERR_INVALID, "gdn: a replay over several layers takes one entry and no outputs");
}

// A GdnCall of heads n_k / n_v of dk / dv on inputs cv (rows of C), g and beta; the rest as the defaults.
inline GdnCall gdn_call(const float *cv, int C, int n_k, int n_v, int dk, int dv, const float *g, const float *beta) {
    GdnCall c;
    c.cv = cv;
    c.C = C;
    c.n_k = n_k;
    c.n_v = n_v;
    c.dk = dk;
    c.dv = dv;
    c.g = g;
    c.beta = beta;
    return c;
}

// A recording forward's Gated DeltaNet inputs copied to its light records (BatchMeta::rec_in) for layer rec_layer.
struct GdnInputs {
    const float *cv = nullptr;                  // [T][C] after GdnGates
    const float *g = nullptr, *beta = nullptr;  // [T][n_v]
    int C = 0, n_v = 0, rec_layer = 0;
};

// The record_gdn_inputs call of a GdnCall's inputs (GdnCall::rec_inputs).
inline GdnInputs gdn_inputs(const GdnCall &c) {
    GdnInputs r;
    r.cv = c.cv;
    r.g = c.g;
    r.beta = c.beta;
    r.C = c.C;
    r.n_v = c.n_v;
    r.rec_layer = c.rec_layer;
    return r;
}

// DFlash2's grouped dynamic causal convolution (spec §5.1 (a)) over each entry's tokens, which are the positions of
// one draft block: token i of an entry (i = t - t0[ent[t]]) gets
//   out[t][c] = sum_{tap < K, tap <= i} (base[tap][c] + dyn[t][tap][c / group]) * x[t - tap][c]
// (positions before the entry's first token count as zero). dyn rows hold K * (C / group) floats at a stride of
// dyn_stride floats (the caller points dyn and base at one side, "prepare" or "finish", of the layer's kernels).
// out must not alias x.
struct DynConvCall {
    const float *x = nullptr;     // [T][C]
    float *out = nullptr;         // [T][C]
    const float *dyn = nullptr;   // [T][dyn_stride], [K][C / group] used
    int64_t dyn_stride = 0;
    const float *base = nullptr;  // [K][C]
    int C = 0, K = 0, group = 0;
};

// DFlash2's candidate-selector transition scores (spec §5.1 (b)): for each of R rows with K candidate ids,
//   trans[r][i][j] = sum_q pred[a_i][q] * g[r][q] * succ[ids[r][j]][q]
// where the predecessors a_i are the candidates of row prev[r] (ids[prev[r]][i]) or, when prev[r] < 0, the single
// token root[r] for every i. A candidate or predecessor id < 0 (top-k padding) scores 0. pred and succ are codebooks
// of one row of `rank` elements per token (any weight type); g is f32.
struct SelectorCall {
    const int32_t *ids = nullptr;   // [R][K]
    const int32_t *prev = nullptr;  // [R]
    const int32_t *root = nullptr;  // [R]
    const float *g = nullptr;       // [R][rank]
    Weight pred, succ;
    int64_t R = 0;
    int K = 0, rank = 0;
    float *trans = nullptr;         // out [R][K][K]
};

// ---------------------------------------------------------------------------------------------------------------------
// DeepSeek V4 (arch "deepseek4"; spec deepseek4.md §2). All math in f32. Conventions of these ops:
//  - The hyper-connection (HC) state of a token is N streams of D floats, [T][N][D] row-major.
//  - "Cache position" of token t = len0[e] + (t - t0[e]) (e = ent[t]); ring slots, compressor windows and row
//    visibility use it. RoPE of queries / window keys uses BatchMeta::pos (equal to it unless the caller passed
//    positions); compressed rows are rotated at their window start ratio * w.
//  - RoPE here is the interleaved ("NORMAL") kind on the trailing rope_dim dims of each head: pair i rotates
//    (head_dim - rope_dim + 2i, head_dim - rope_dim + 2i + 1) by pos * inv_freq[i]. inv_freq already holds any YaRN
//    ramp (no magnitude scaling).
//  - Per-sequence state lives in slots: a layer's part of slot s starts at base + s * slot_stride floats (BatchMeta
//    slot[e] names the entry's slot).
//  - Compressed rows (attention rows of a compressing layer, indexer keys of a CSA layer) live in a paged pool of
//    rows_per_block rows per KV block; row w of an entry is at ds4_comp_row(block_table of the entry, w, ...).

// Pool row of compressed row w of a sequence whose KV block table is `blocks` (ratio tokens per row, KV blocks of
// block_size tokens, rows_per_block = ceil(block_size / ratio) rows per block): row w belongs to the block holding its
// window start ratio * w. Host and device code share it.
DFL_HOST_DEVICE inline int64_t ds4_comp_row(const int32_t *blocks, int64_t w, int ratio, int block_size, int rows_per_block) {
    const int64_t p = w * (int64_t)ratio;
    return (int64_t)blocks[p / block_size] * rows_per_block + (p % block_size) / ratio;
}

// mHC "pre" of one site (spec §2.3) for T tokens, from mix = fn · rmsnorm_unweighted(flat X) ([T][(2+N)*N], computed
// by the caller with rmsnorm + matmul): pre[i] = sigmoid(mix[i] * scale[0] + base[i]) + eps,
// post[i] = 2 sigmoid(mix[N+i] * scale[1] + base[N+i]), comb[a][b] = Sinkhorn(mix[2N + N*a + b] * scale[2] +
// base[2N + N*a + b]) (row softmax + eps, column normalisation, then iters - 1 row / column normalisations, each sum
// + eps), and x = sum_i pre[i] * X[i].
struct HcPreCall {
    const float *mix = nullptr;    // [T][(2+N)*N]
    const float *base = nullptr;   // [(2+N)*N]
    const float *scale = nullptr;  // [3]
    const float *X = nullptr;      // [T][N][D]
    int64_t T = 0, D = 0;
    int N = 4, iters = 20;
    float eps = 1e-6f;             // hyper_connection.epsilon
    // norm: mix holds fn · X of the raw streams, and each token's is first scaled by rsqrt(mean(X^2) + norm_eps) over
    // its N * D values: the unweighted RMSNorm, linear in X, folded into the mixing (Device::hc_fold)
    bool norm = false;
    float norm_eps = 0.0f;
    float *x = nullptr;            // out [T][D]: the sub-block input
    float *post = nullptr;         // out [T][N]
    float *comb = nullptr;         // out [T][N][N], comb[a][b]: from stream a to stream b
};

// mHC "post" (spec §2.4): out[b] = post[b] * F + sum_a comb[a][b] * X[a] (F: F + F2 where F2 is set, the same float
// as adding them apart). out must not alias X.
struct HcPostCall {
    const float *F = nullptr;     // [T][D] sub-block output
    const float *F2 = nullptr;    // [T][D] added to F first where set (the shared expert's part of the MoE output)
    const float *X = nullptr;     // [T][N][D]
    const float *post = nullptr;  // [T][N]
    const float *comb = nullptr;  // [T][N][N]
    int64_t T = 0, D = 0;
    int N = 4;
    float *out = nullptr;         // [T][N][D]
    // optional: the mixing matrix of the HC site right after this call (the next Device::hc_site on out, norm folded),
    // whose product with out a device may start here (CUDA, by default: per-block partial sums that site takes)
    const Weight *next_fn = nullptr;
};

// The HC output head (spec §2.7) from mix = hc_head_fn · rmsnorm_unweighted(flat X) ([T][N]):
// y = sum_i (sigmoid(mix[i] * scale[0] + base[i]) + eps) * X[i].
struct HcHeadCall {
    const float *mix = nullptr;    // [T][N]
    const float *base = nullptr;   // [N]
    const float *scale = nullptr;  // [1]
    const float *X = nullptr;      // [T][N][D]
    int64_t T = 0, D = 0;
    int N = 4;
    float eps = 1e-6f;
    float *y = nullptr;            // out [T][D]
};

// Interleaved RoPE on the trailing rope_dim dims of n_head heads of head_dim per row, in place; row r is at
// x + r * row_stride and rotates by pos[r] (inverse: by -pos[r], the attention output's un-rotation, spec §2.5.5).
struct RopeTailCall {
    float *x = nullptr;
    int64_t rows = 0, row_stride = 0;
    int n_head = 1, head_dim = 0, rope_dim = 0;
    const int32_t *pos = nullptr;       // [rows]
    const float *inv_freq = nullptr;    // [rope_dim / 2]
    bool inverse = false;
};

// A compressor (spec §2.5.2-2.5.4) over the batch's tokens, entry by entry in token order. Token at cache position p:
// z += ape[p % ratio]; (c, z) go to the slot's current-window buffer at p % ratio. When p % ratio == ratio - 1 the
// window w = p / ratio closes: per channel d < head_dim, softmax over the window's slots of z and weighted sum of c
// (overlap: 2 * ratio slots: dims [0, head_dim) of the previous window's tokens (score -inf for w = 0), then dims
// [head_dim, 2 head_dim) of this window's; else ratio slots of dims [0, head_dim)), then RMSNorm with `norm`, RoPE at
// position ratio * w, and the row is written to pool row ds4_comp_row(..., w, ...). Overlap: then the current buffer
// becomes the previous one. Rows of windows closing inside the batch are written before the op returns, so later
// ops of the same forward see them.
// Slot buffer layout (floats, at state + slot * slot_stride): cur_kv [ratio][width], cur_gate [ratio][width], and
// with overlap prev_kv [ratio][width], prev_gate [ratio][width]; width = head_dim * (overlap ? 2 : 1).
struct Ds4CompressCall {
    const float *kv = nullptr;      // [T][width] c = wkv · h
    const float *gate = nullptr;    // [T][width] z = wgate · h (without ape)
    const float *ape = nullptr;     // [ratio][width]
    const float *norm = nullptr;    // [head_dim]
    const float *inv_freq = nullptr;  // [rope_dim / 2] (the compress rope)
    int ratio = 4, head_dim = 0, rope_dim = 0;
    bool overlap = false;
    float eps = 1e-6f;
    float *state = nullptr;         // slot 0's buffers of this compressor
    int64_t slot_stride = 0;        // floats
    float *rows = nullptr;          // [pool rows][head_dim]
    int block_size = 16, rows_per_block = 1;
};

// The lightning indexer's choice (spec §2.5.4): for each token at cache position p, over the visible index keys
// s < (p + 1) / ratio, score(s) = sum_h (w[h] * head_scale) * (ReLU(q_h · k_s) * dot_scale); keeps the top_k best
// (ties: lower s) and writes them in ascending row order to sel [T][top_k], padded with -1; all visible rows when
// there are at most top_k.
struct Ds4IndexerCall {
    const float *q = nullptr;       // [T][n_head][head_dim] (rotated)
    const float *w = nullptr;       // [T][n_head] weights_proj · h
    const float *keys = nullptr;    // index key pool [pool rows][head_dim]
    int n_head = 0, head_dim = 0, ratio = 4, top_k = 0;
    float head_scale = 1.0f, dot_scale = 1.0f;
    int block_size = 16, rows_per_block = 1;
    int32_t *sel = nullptr;         // out [T][top_k]
};

// Shared-KV attention with a sink (spec §2.5.5) of every token t at cache position p over the window rows
// [max(0, p - window + 1), p] and its compressed rows. Window rows of positions < len0 come from the slot's ring
// (position q at ring row q % window), the others from this batch's kv rows (token t0 + q - len0). Compressed rows
// (comp != null): sel == null: every row w < (p + 1) / ratio; else the rows sel[t][0..top_k) that are >= 0. Keys and
// values are the same vectors; logits (q · k) * scale; p_j = exp(l_j) / (exp(sink_h) + sum exp(l)). The output is
// not un-rotated (see RopeTailCall::inverse).
struct Ds4AttnCall {
    const float *Q = nullptr;       // [T][n_head][head_dim]
    const float *kv = nullptr;      // [T][head_dim] this batch's window rows (normed, rotated)
    float *ring = nullptr;          // slot 0's ring [window][head_dim] of this layer (written only with ring_write)
    int64_t slot_stride = 0;        // floats between slots' rings
    int window = 0;
    const float *comp = nullptr;    // compressed row pool [pool rows][head_dim], or null (window-only layer)
    int ratio = 0, block_size = 16, rows_per_block = 1;
    const int32_t *sel = nullptr;   // [T][top_k] indexer selection, or null
    int top_k = 0;
    const float *sinks = nullptr;   // [n_head]
    int n_head = 0, head_dim = 0;
    float scale = 1.0f;
    float *out = nullptr;           // [T][n_head][head_dim]
    // Work after the attention that it may fold in (a plan sets them; every device gives the same floats as the
    // separate ops): the output's RoPE tail rotated back by the token's position (rope_tail inverse with these
    // frequencies and BatchMeta::pos), where unrotate is set; the batch's kv rows written to the ring
    // (ds4_ring_write), where ring_write is set, which the plan does only when every entry runs one token: its ring
    // row is then the one of position p - window, which no query of the step reads.
    const float *unrotate = nullptr;  // [rope_dim / 2] inverse frequencies, or null
    int rope_dim = 0;
    bool ring_write = false;
};

// Writes each entry's window rows into its slot's ring after the layer's attention: the kv row of the token at cache
// position p goes to ring row p % window (only the entry's last `window` tokens matter).
struct Ds4RingWrite {
    const float *kv = nullptr;      // [T][head_dim]
    float *ring = nullptr;          // slot 0's ring of this layer
    int64_t slot_stride = 0;
    int window = 0, head_dim = 0;
};

// The separate ops that a Ds4AttnCall's unrotate and ring_write stand for.
inline RopeTailCall ds4_unrotate_call(const BatchMeta &m, const Ds4AttnCall &c) {
    RopeTailCall r;
    r.x = c.out;
    r.rows = m.T;
    r.row_stride = (int64_t)c.n_head * c.head_dim;
    r.n_head = c.n_head;
    r.head_dim = c.head_dim;
    r.rope_dim = c.rope_dim;
    r.pos = m.pos;
    r.inv_freq = c.unrotate;
    r.inverse = true;
    return r;
}

inline Ds4RingWrite ds4_ring_write_call(const Ds4AttnCall &c) {
    Ds4RingWrite w;
    w.kv = c.kv;
    w.ring = c.ring;
    w.slot_stride = c.slot_stride;
    w.window = c.window;
    w.head_dim = c.head_dim;
    return w;
}

// MoE routing (spec §2.6): s = sqrt(softplus(logits)); candidates: hash layers (tid2eid != null) the k_table experts
// tid2eid[token] (keeping the k highest-scoring when k < k_table, ties: earlier), else the top k of s + bias (bias
// may be null; ties: lower id). weights: s[id] (unbiased), divided by (sum + 1e-20) when norm, times scale.
struct MoeRouteCall {
    const float *logits = nullptr;   // [T][n_expert] gate_inp · h
    const float *bias = nullptr;     // [n_expert] selection bias, or null
    const int32_t *tid2eid = nullptr;  // [vocab][k_table], or null
    const int32_t *tokens = nullptr;   // [T] (hash layers)
    int64_t T = 0;
    int n_expert = 0, k = 0, k_table = 0;
    bool norm = true;
    float scale = 1.0f;
    int32_t *ids = nullptr;          // out [T][k]
    float *weights = nullptr;        // out [T][k]
};

// Routed experts (spec §2.6 step 5): out[t] = sum_j weights[t][j] * down_e(silu(min(gate_e x, limit)) *
// clamp(up_e x, -limit, limit)), e = ids[t][j], summed in j order. gate / up / down are 3-D stacks: expert e owns rows
// [e * n_out_e, (e + 1) * n_out_e) (gate, up: n_out_e = n_ff; down: n_embd).
struct MoeExpertsCall {
    const float *x = nullptr;        // [T][n_embd]
    Weight gate, up, down;
    int64_t T = 0;
    int n_expert = 0, n_ff = 0, n_embd = 0, k = 0;
    float limit = 0;                 // swiglu_clamp_exp (<= 0: no clamp)
    const int32_t *ids = nullptr;    // [T][k]
    const float *weights = nullptr;  // [T][k]
    float *out = nullptr;            // [T][n_embd]
};

// Whether expert stacks get Device::prepare_weight's copy too: only where their row slices can use it
// (Weight::packed_group: the CPU's 16-row groups); a GPU's copy of every expert would double the model's largest part.
// The loader and the load's memory estimate ask it.
bool device_packs_stacks();

class Device {
public:
    virtual ~Device() = default;
    virtual std::string name() const = 0;

    // Memory. alloc throws Error(DFL_ERR_NO_MEMORY) naming `what`, the bytes asked and the bytes free.
    virtual void *alloc(size_t bytes, const char *what) = 0;
    virtual void release(void *p) = 0;
    virtual void to_device(void *dst, const void *src, size_t bytes) = 0;
    virtual void to_host(void *dst, const void *src, size_t bytes) = 0;  // waits for the device
    virtual void copy(void *dst, const void *src, size_t bytes) = 0;     // device to device
    virtual void zero(void *dst, size_t bytes) = 0;
    virtual void sync() = 0;
    virtual uint64_t free_bytes() = 0;
    // Weights: the device's copy of GGUF tensor bytes (the CPU device may keep the caller's mapping).
    virtual const uint8_t *upload_weight(const void *host, size_t bytes, bool must_copy) = 0;
    // True when upload_weight always copies: the layer plans then lay matrices that read the same input side by side
    // (q|k|v, gate|up) so one product reads them all. The CPU keeps the caller's mapping instead.
    virtual bool copies_weights() const { return true; }
    // Gives a device the chance to add its own layout of an uploaded matrix (Weight::packed), kept until the device
    // is destroyed. The CPU keeps none.
    virtual void prepare_weight(Weight &) {}
    // A stack of matrices multiplied by row slices (MoE experts), which gets a layout of its own only where
    // device_packs_stacks: DFL_ERR_UNSUPPORTED at load where the device cannot multiply its type (CUDA: q4_0, whose
    // matrices prepare_weight converts).
    virtual void check_stack(const Weight &, const std::string &name) const {}

    // Ops. Every pointer is a device pointer; `rows` x `n` shapes are row-major.
    virtual void embed(const Weight &W, const int32_t *tokens, int64_t T, float *out) = 0;
    // Y[t][o] = sum_i W[o][i] X[t][i], t < T.
    virtual void matmul(const Weight &W, const float *X, int64_t T, float *Y) = 0;
    // W's rows are parts laid side by side (q|k|v, gate|up: see copies_weights), each part's rows (parts[i].first,
    // in order) multiplied into its own output (parts[i].second). The default multiplies each part alone; a device may
    // read X and W once for all of them.
    virtual void matmul_parts(const Weight &W, const std::vector<std::pair<const Weight *, float *>> &parts,
                              const float *X, int64_t T) {
        (void)W;
        for (const auto &p : parts) matmul(*p.first, X, T, p.second);
    }
    // Several weights of the same n_in, each multiplied with X into its own output (q, k and v; gate and up) where no
    // fused weight joins them (a device that does not copy its weights). The default multiplies each alone; the CPU
    // runs them as one parallel region with X quantized once.
    virtual void matmul_each(const std::vector<std::pair<const Weight *, float *>> &parts, const float *X, int64_t T) {
        for (const auto &p : parts) matmul(*p.first, X, T, p.second);
    }
    // y = x * rsqrt(mean(x^2) + eps) * w per row (w may be null); y may alias x.
    virtual void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps) = 0;
    // x += d; y = rmsnorm(x) * w, per row.
    virtual void add_rmsnorm(float *x, const float *d, const float *w, float *y, int64_t rows, int64_t n, float eps) = 0;
    virtual void add(float *x, const float *d, int64_t count) = 0;
    // d = W X (T rows), then add_rmsnorm(x, d, w, y, T, W.n_out, eps): a layer's output projection, its residual and
    // the norm before `next`, the one product that reads y (null: unknown). A device may fold the norm into the
    // product where it knows how `next` reads y (the CUDA one for one token; DFL_CUDA_RESID_NORM=0: never): then y
    // and d are left unwritten and `next`, the very next call, multiplies what the fold staged for it.
    virtual void matmul_add_rmsnorm(const Weight &W, const float *X, int64_t T, float *d, float *x, const float *w,
                                    float *y, float eps, const Weight *next) {
        (void)next;
        matmul(W, X, T, d);
        add_rmsnorm(x, d, w, y, T, W.n_out, eps);
    }
    // g = silu(g) * u
    virtual void swiglu(float *g, const float *u, int64_t count) = 0;
    // out[t][i] = silu(g[t stride + i]) * u[t stride + i], i < n, t < rows: a fused gate|up product's rows where they lie
    // in its buffer (project_views), into rows of their own (out may be g where stride is n).
    virtual void swiglu_rows(float *out, const float *g, const float *u, int64_t rows, int64_t n, int64_t stride) = 0;
    // a = a * sigmoid(g)
    virtual void sigmoid_mul(float *a, const float *g, int64_t count) = 0;
    // x = x * scale, then, when cap > 0, x = cap * tanh(x / cap) (logit scaling and soft-capping of some heads).
    virtual void scale_softcap(float *x, int64_t count, float scale, float cap) = 0;
    // out[r] = x[rows[r]] (rows of n floats); rows is a device array of R indices.
    virtual void gather_rows(const float *x, const int32_t *rows, int64_t R, int64_t n, float *out) = 0;
    // dst[r * dst_stride + i] = src[r * src_stride + i], i < n, r < rows (floats).
    virtual void copy_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                           int64_t n) = 0;
    virtual void attn_prep(const BatchMeta &m, const AttnPrep &a) = 0;
    virtual void attention(const BatchMeta &m, const AttnCall &a) = 0;
    virtual void conv1d_silu(const BatchMeta &m, const ConvCall &c) = 0;
    // Y = W X (T rows), then conv1d_silu(m, c) on each row's first c.C floats (c.x = Y, rows W.n_out apart): a DeltaNet
    // layer's fused input projection and its conv. A device may run the conv in the product (the CUDA one for a decode
    // step's token, DFL_CUDA_CONV_FOLD=1).
    virtual void matmul_conv1d_silu(const Weight &W, const float *X, int64_t T, float *Y, const BatchMeta &m, ConvCall c) {
        c.x = Y;
        c.x_stride = W.n_out;
        matmul(W, X, T, Y);
        conv1d_silu(m, c);
    }
    virtual void gdn_gates(int64_t T, const GdnGates &g) = 0;
    virtual void gdn(const BatchMeta &m, const GdnCall &g) = 0;
    virtual void record_gdn_inputs(const BatchMeta &m, const GdnInputs &r) = 0;
    // x = rmsnorm(x) * w * silu(z) per row of n; x is [T][heads][n], token t's z rows start at z + t z_stride (a fused
    // product's part where it lies; heads n when apart).
    virtual void gated_rmsnorm(float *x, const float *z, int64_t z_stride, const float *w, int64_t T, int64_t heads,
                               int64_t n, float eps) = 0;
    // The k (1..64) largest values of each row of n logits, larger first and lower id on ties (NaN counts as -inf;
    // rows with fewer than k finite values are padded with id -1, value -inf), and each row's log-sum-exp.
    // ids, vals: [rows][k]; lse: [rows].
    virtual void topk(const float *logits, int64_t rows, int64_t n, int k, int32_t *ids, float *vals, float *lse) = 0;
    // DFlash2: the dynamic convolution and the selector's transition scores (DynConvCall, SelectorCall).
    virtual void dyn_conv(const BatchMeta &m, const DynConvCall &c) = 0;
    virtual void selector_trans(const SelectorCall &s) = 0;

    // DeepSeek V4 ops (structs above). The defaults refuse, so a device without them still builds and loads other
    // architectures.
    virtual void hc_pre(const HcPreCall &) { ds4_missing("hc_pre"); }
    // Whether a layer plan should multiply the raw streams by an HC site's mixing matrix and let hc_pre apply their
    // RMSNorm (HcPreCall::norm): one op fewer a site. The CPU, the reference, norms first.
    virtual bool hc_fold() const { return false; }
    virtual void hc_post(const HcPostCall &) { ds4_missing("hc_post"); }
    // hc_pre, then y = rmsnorm(x) * w (eps) for the sub-block: a device may do both in one pass (CUDA did with
    // DFL_CUDA_HC_PRE_NORM=1 until 12-07: within 1 % on an H100, 12-05, and superseded by Device::hc_site). The default
    // runs the two ops.
    virtual void hc_pre_norm(const HcPreCall &c, const float *w, float eps, float *y) {
        hc_pre(c);
        rmsnorm(c.x, w, y, c.T, c.D, eps);
    }
    // A whole HC site with its norm folded (c.norm): the mixing product fn · X of the raw streams into mix (c.mix is
    // set to it), then hc_pre_norm. A device may do it in one pass (mix then unwritten, or holding what it likes), and
    // may finish post and comb on its side lane (side_begin), reading mix there: the caller reads post and comb, and
    // rewrites mix, post or comb, only after a join_side. The default runs the ops.
    virtual void hc_site(const Weight &fn, HcPreCall c, float *mix, const float *w, float eps, float *y) {
        matmul(fn, c.X, c.T, mix);
        c.mix = mix;
        hc_pre_norm(c, w, eps, y);
    }
    virtual void hc_head(const HcHeadCall &) { ds4_missing("hc_head"); }
    virtual void rope_tail(const RopeTailCall &) { ds4_missing("rope_tail"); }
    // Each head row of r (r.rows x r.n_head rows of r.head_dim at r.x; rows r.row_stride = n_head * head_dim apart)
    // normed in place (RMSNorm with w, or unweighted), then its tail rotated as rope_tail does: the query heads' and
    // the shared K = V row's two steps as one op. The default runs the two ops.
    virtual void norm_rope_tail(const float *w, float eps, const RopeTailCall &r) {
        if (r.row_stride != (int64_t)r.n_head * r.head_dim) fail(DFL_ERR_INTERNAL, "norm_rope_tail: head rows apart");
        rmsnorm(r.x, w, r.x, r.rows * r.n_head, r.head_dim, eps);
        rope_tail(r);
    }
    virtual void ds4_compress(const BatchMeta &, const Ds4CompressCall &) { ds4_missing("ds4_compress"); }
    virtual void ds4_indexer_topk(const BatchMeta &, const Ds4IndexerCall &) { ds4_missing("ds4_indexer_topk"); }
    virtual void ds4_attention(const BatchMeta &, const Ds4AttnCall &) { ds4_missing("ds4_attention"); }
    virtual void ds4_ring_write(const BatchMeta &, const Ds4RingWrite &) { ds4_missing("ds4_ring_write"); }
    virtual void moe_route(const MoeRouteCall &) { ds4_missing("moe_route"); }
    // g = silu(min(g, limit)) * clamp(u, -limit, limit) (limit <= 0: plain swiglu).
    virtual void swiglu_clamp(float *g, const float *u, int64_t count, float limit) { ds4_missing("swiglu_clamp"); }
    // The routed experts' weighted sum into c.out. (A device could leave the weighting and adding of its pairs' rows
    // to hc_post until 12-07: CUDA's DFL_CUDA_MOE_COMBINE_POST=1, one launch fewer a layer, measured even at batch 1
    // and +0.5-1 % at batch 8 on an H100, 12-05 and 12-07 09:4x.)
    virtual void moe_experts(const MoeExpertsCall &) { ds4_missing("moe_experts"); }
    // T tokens through a grouped projection (DeepSeek V4's attention output): W's n_out rows are `groups` groups;
    // group g multiplies its rows by columns [g * W.n_in, (g + 1) * W.n_in) of each of x's T rows (of groups * W.n_in)
    // into columns [g * rows, (g + 1) * rows) of y's T rows (of W.n_out), rows = W.n_out / groups. False, with nothing
    // run, where the device does not take T tokens at once (the caller then gathers each group's columns): the default
    // takes one token, running matmul on each group's rows (W.rows: with the packed layout's rows where it can be
    // sliced there); a device may do all groups in one pass.
    virtual bool matmul_grouped(const Weight &W, int groups, const float *x, int64_t T, float *y) {
        if (T != 1) return false;
        const int64_t rows = W.n_out / groups;
        for (int g = 0; g < groups; g++) matmul(W.rows(g * rows, rows), x + (int64_t)g * W.n_in, 1, y + (int64_t)g * rows);
        return true;
    }

    // Recorded op sequences (CUDA graphs): a device that supports them captures the ops issued between graph_begin
    // and graph_end instead of running them, and graph_end returns a handle that graph_launch replays (the same ops
    // on the same pointers; the host scalars of the captured calls are frozen). graph_end returns 0 when the capture
    // failed; the ops were not run then. Devices without graphs keep these defaults.
    virtual bool has_graphs() const { return false; }
    virtual void graph_begin() {}
    virtual uintptr_t graph_end() { return 0; }
    virtual void graph_launch(uintptr_t) {}
    virtual void graph_free(uintptr_t) {}
    // Changes whenever the device reallocates memory its ops use internally (scratch): graphs captured before then
    // point at freed memory and must not be replayed.
    virtual uint64_t scratch_epoch() const { return 0; }
    // A second lane of ops: those issued between side_begin and side_end may run alongside the main lane's ops issued
    // after side_begin, up to join_side, after which the main lane's ops follow them. The side ops start after every op
    // issued before side_begin; they must not read what the main lane writes in that span, nor write what it reads or
    // writes. Not nested. A device that runs its ops one after another (the CPU) keeps these defaults.
    virtual void side_begin() {}
    virtual void side_end() {}
    virtual void join_side() {}
    // The int8 codes a device makes of x for its products (where it makes any) serve every product of x from the next
    // op that writes x until keep_quant is called again (null: none kept): several products of one input quantize it
    // once. The caller promises x is not written otherwise in that span. A hint: the CPU keeps this default.
    virtual void keep_quant(const float *) {}
    // Host memory of the device's own, of at least `bytes`, that to_host_async can copy into (null: the device has
    // none, use to_host). Valid until a call asks for more; growing it moves scratch_epoch (a graph may copy into it).
    virtual void *host_landing(size_t) { return nullptr; }
    // Queues a copy of device memory into host_landing's memory, complete after the next to_host or sync.
    virtual void to_host_async(void *dst, const void *src, size_t bytes) { to_host(dst, src, bytes); }

protected:
    [[noreturn]] void ds4_missing(const char *op) const {
        fail(DFL_ERR_UNSUPPORTED, "deepseek4 op " + std::string(op) + " is not implemented on this device (" + name() + ")");
    }
};

// The devices. Each library defines make_device (ops/cpu/lib_cpu.cpp, ops/cuda/lib_cuda.cu) on top of these, so a test
// program can link the CPU and the CUDA implementation together.
std::unique_ptr<Device> make_cpu_device(int n_threads);  // n_threads 0 = hardware concurrency
std::unique_ptr<Device> make_cuda_device(int index);     // throws Error naming the index when there is no such GPU

// The device this library drives, for one model.
std::unique_ptr<Device> make_device(const dfl_model_params &p);
// Library-wide queries of the device kind (defined likewise).
const char *device_kind();
int32_t device_count();
// Free and total bytes of device `index` (the CPU device reports system memory).
void device_memory(int32_t index, uint64_t *free_bytes, uint64_t *total_bytes);
// Bytes prepare_weight adds for a matrix of this type and size (its device layout copy), for model_estimate.
uint64_t device_weight_copy_bytes(uint32_t type, uint64_t bytes);

// Frees a device allocation when it goes out of scope.
class DevBuf {
public:
    DevBuf() = default;
    DevBuf(Device *d, size_t bytes, const char *what) : dev_(d), p_(bytes ? d->alloc(bytes, what) : nullptr), n_(bytes) {}
    ~DevBuf() { reset(); }
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
    DevBuf(DevBuf &&o) noexcept : dev_(o.dev_), p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
    DevBuf &operator=(DevBuf &&o) noexcept {
        if (this != &o) {
            reset();
            dev_ = o.dev_;
            p_ = o.p_;
            n_ = o.n_;
            o.p_ = nullptr;
            o.n_ = 0;
        }
        return *this;
    }
    void reset() {
        if (p_ && dev_) dev_->release(p_);
        p_ = nullptr;
        n_ = 0;
    }
    template <class T = void>
    T *get() const { return (T *)p_; }
    float *f() const { return (float *)p_; }
    size_t bytes() const { return n_; }

private:
    Device *dev_ = nullptr;
    void *p_ = nullptr;
    size_t n_ = 0;
};

}  // namespace dfl

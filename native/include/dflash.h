/*
 * dflash.h — C ABI of the dflash native engine libraries.
 *
 * Every engine library (libdflash_cpu.so, later libdflash_cuda.so, libdflash_hip.so) exports exactly one symbol,
 * dfl_get_api, which returns a table of function pointers for the ABI version the caller was built against (or NULL
 * when the library cannot serve that version). Callers load the library with dlopen, so nothing that uses the engine
 * links a device runtime.
 *
 * Conventions
 *  - Functions return a dfl_status (0 = DFL_OK, negative = error). The message of the last error raised on the calling
 *    OS thread is returned by last_error(); callers that may migrate between threads (Go) must pin the thread across
 *    the failing call and the last_error() call.
 *  - A model is not thread-safe: one caller at a time per dfl_model. sample() is pure and may be called concurrently.
 *  - Tensor data handed to model_load is referenced, not copied (unless DFL_LOAD_COPY_WEIGHTS): it must stay mapped
 *    and unchanged until model_free.
 *  - Shapes use ggml order: dims[0] is the innermost (contiguous) dimension. A weight of a linear layer y = W x with
 *    W of PyTorch shape [out, in] has dims {in, out}; its rows (one per output) are contiguous runs of quant blocks.
 *  - Structs that may grow carry struct_size as their first field; set it to sizeof(struct) of the header you compiled
 *    against. Version 1 fields never move.
 */
#ifndef DFLASH_H
#define DFLASH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DFL_API_VERSION 1u

typedef int32_t dfl_status;

enum {
    DFL_OK = 0,
    DFL_ERR_INVALID = -1,     /* bad argument or model file; the message names the culprit */
    DFL_ERR_UNSUPPORTED = -2, /* architecture, tensor type or cache type this library does not implement */
    DFL_ERR_NO_MEMORY = -3,   /* an allocation failed */
    DFL_ERR_NO_KV = -4,       /* the KV pool has too few free blocks; the call changed nothing */
    DFL_ERR_NO_SEQ = -5,      /* every sequence slot is in use */
    DFL_ERR_STATE = -6,       /* the request does not fit the sequence's state (e.g. rollback without snapshot) */
    DFL_ERR_INTERNAL = -7
};

/* ggml tensor type ids (the subset the engine understands; ids are ggml's). */
enum {
    DFL_TYPE_F32 = 0,
    DFL_TYPE_F16 = 1,
    DFL_TYPE_Q4_0 = 2,
    DFL_TYPE_Q8_0 = 8,
    DFL_TYPE_Q4_K = 12,
    DFL_TYPE_Q6_K = 14,
    DFL_TYPE_BF16 = 30
};

typedef struct dfl_model dfl_model;

/* One tensor of the model file. */
typedef struct {
    const char *name;  /* GGUF tensor name, e.g. "blk.0.attn_q.weight" */
    uint32_t type;     /* ggml type id */
    uint32_t n_dims;   /* 1..4 */
    uint64_t dims[4];  /* ggml order; unused entries 1 */
    const void *data;  /* first byte of the tensor's data */
    uint64_t size;     /* bytes at data */
} dfl_tensor;

/* One metadata value of the model file (GGUF key/value), as handed over by the loader. Only the fields of its kind are
 * read. Integer and boolean GGUF values are passed as DFL_META_INT, float32/float64 as DFL_META_FLOAT. */
enum { DFL_META_INT = 0, DFL_META_FLOAT = 1, DFL_META_STRING = 2, DFL_META_INT_ARRAY = 3, DFL_META_FLOAT_ARRAY = 4 };

typedef struct {
    const char *key;    /* e.g. "qwen3.attention.head_count" */
    uint32_t kind;      /* DFL_META_* */
    uint32_t n;         /* element count of an array */
    int64_t i;          /* DFL_META_INT */
    double f;           /* DFL_META_FLOAT */
    const char *s;      /* DFL_META_STRING, NUL-terminated */
    const int64_t *ia;  /* DFL_META_INT_ARRAY */
    const double *fa;   /* DFL_META_FLOAT_ARRAY */
} dfl_meta;

enum {
    DFL_LOAD_COPY_WEIGHTS = 1u /* copy tensor data during model_load; the caller may release it afterwards */
};

typedef struct {
    uint32_t struct_size;
    const char *arch;           /* general.architecture: "qwen3", "qwen35", "deepseek4", "dflash" (a DFlash draft) */
    const dfl_meta *meta;       /* the architecture's hyperparameters ("<arch>.*" keys; others are ignored) */
    uint32_t n_meta;
    const dfl_tensor *tensors;
    uint32_t n_tensors;
    uint32_t kv_pool_tokens;    /* KV capacity shared by all sequences, in tokens (rounded up to whole blocks) */
    uint32_t kv_block_size;     /* tokens per KV block (0 = 16) */
    uint32_t max_seqs;          /* sequence slots (each owns a recurrent-state slot where the model has one) */
    uint32_t cache_type_k;      /* DFL_TYPE_F32 / F16 / BF16 / Q8_0 */
    uint32_t cache_type_v;
    uint32_t n_threads;         /* CPU worker threads (0 = hardware concurrency) */
    int32_t device;             /* device index for GPU libraries; the CPU library ignores it */
    uint32_t flags;             /* DFL_LOAD_* */
} dfl_model_params;

typedef struct {
    uint32_t struct_size;
    char arch[32];
    uint32_t n_layer;           /* decoder layers run by the engine (trunk, without MTP blocks) */
    uint32_t n_embd;
    uint32_t n_vocab;
    uint32_t n_ctx_train;       /* <arch>.context_length, 0 if absent */
    uint32_t n_head, n_head_kv, head_dim, n_ff;
    uint32_t n_attn_layers;     /* layers with a KV cache */
    uint32_t n_recurrent_layers;/* Gated DeltaNet layers */
    uint32_t kv_block_size;
    uint32_t kv_blocks_total;
    uint32_t max_seqs;
    uint32_t cache_type_k, cache_type_v;
    uint32_t n_threads;
    uint64_t kv_bytes_per_token;   /* K+V bytes of one token over all attention layers */
    uint64_t state_bytes_per_seq;  /* recurrent + conv state of one sequence slot */
    uint64_t weight_bytes;         /* bytes of all weight tensors the model uses */
    float rms_eps;
    float rope_theta;
    uint32_t rope_dim;
    uint32_t n_feat;            /* dflash: floats of one context row of draft_forward (fc.weight dims[0]); else 0 */
    /* Appended: */
    uint32_t selector_top_k;    /* a DFlash2 draft (dynamic convolutions and a candidate selector, see draft_forward2):
                                   dflash.selector_top_k, the candidates per block row its selector is trained on;
                                   0 for other models */
} dfl_model_info;

/* What a model would take on its device, computed from the load parameters without loading (model_estimate). */
typedef struct {
    uint32_t struct_size;
    uint64_t weight_bytes;         /* weights the model uploads (0 extra on the CPU when it maps the caller's data) */
    uint64_t kv_bytes_per_token;   /* K+V of one token over all attention layers, in the params' cache types */
    uint64_t state_bytes_per_seq;  /* recurrent + conv state of one sequence slot */
    uint64_t scratch_bytes;        /* activations of a forward of 512 tokens (they grow with larger batches) */
    /* Appended: what a sequence's records take once it verifies with DFL_SEQ_RECORD (speculative rollback), for
     * qwen35 targets (0 elsewhere): record_bytes_fixed, then per row of its widest verify (at least 16 rows)
     * record_bytes_per_row for a chain (its rows' inputs) or tree_record_bytes_per_row for a tree; a tree also
     * tree_record_bytes_fixed (the states its schedule sets aside, whatever its size). */
    uint64_t record_bytes_fixed;
    uint64_t record_bytes_per_row;
    uint64_t tree_record_bytes_per_row;
    /* Appended: */
    uint64_t tree_record_bytes_fixed;
} dfl_model_estimate;

typedef struct {
    uint32_t block_size;
    uint32_t blocks_total;
    uint32_t blocks_free;       /* not held by any sequence (neither used nor reserved) */
    uint32_t seqs_total;
    uint32_t seqs_free;
} dfl_kv_stats;

enum { DFL_LOGITS_NONE = 0, DFL_LOGITS_LAST = 1, DFL_LOGITS_ALL = 2 };

enum {
    /* Keep the recurrent state after every token of this entry, so that seq_truncate can later cut the sequence to any
     * length reached inside this forward (speculative-decoding fast rollback). Costs one state copy per token. */
    DFL_SEQ_RECORD = 1u
};

/* The tokens one sequence contributes to a forward. They are appended after the sequence's current length. */
typedef struct {
    int32_t seq;
    uint32_t n_tokens;
    const int32_t *tokens;
    const int32_t *positions;   /* RoPE positions, NULL = seq_len + i */
    uint32_t logits;            /* DFL_LOGITS_* */
    uint32_t flags;             /* DFL_SEQ_* */
} dfl_seq_batch;

typedef struct {
    uint32_t n_seqs;                /* entries; a sequence appears at most once */
    const dfl_seq_batch *seqs;
    float *logits;                  /* out: [rows, n_vocab] f32, rows in entry order (1 per LAST entry, n_tokens per ALL) */
    uint32_t n_capture;             /* hidden-state capture: number of layers */
    const int32_t *capture_layers;  /* layer ids; the output of the whole decoder layer (after the FFN residual) */
    float *capture;                 /* out: [total tokens, n_capture * n_embd] f32, tokens in entry order; NULL: they
                                     * stay in the library, read with captures() until the next forward */
} dfl_batch;

/* One sequence's part of a DFlash draft step (draft_forward). */
typedef struct {
    int32_t seq;
    uint32_t n_ctx;          /* context rows appended to the draft's cache at positions seq_length.. and kept */
    const float *features;   /* [n_ctx][n_feat]: target hidden states of those positions (layer outputs concatenated) */
    uint32_t n_block;        /* block tokens (root, then mask tokens) at the positions after the context; not kept */
    const int32_t *block;
} dfl_draft_entry;

/* Sampler settings. Order: penalties, temperature, top-k, top-p, min-p, then a draw. temperature <= 0 is greedy
 * (argmax after penalties, lowest id on ties). */
typedef struct {
    float temperature;
    int32_t top_k;              /* <= 0: off */
    float top_p;                /* >= 1: off */
    float min_p;                /* <= 0: off */
    float repeat_penalty;       /* 1: off; > 0 divides positive / multiplies negative logits of seen tokens */
    float presence_penalty;     /* subtracted once from each seen token */
    float frequency_penalty;    /* subtracted per occurrence */
    int32_t penalty_last_n;     /* history tokens the penalties look at: -1 all, 0 none */
} dfl_sampling;

typedef struct dfl_api {
    uint32_t version;       /* DFL_API_VERSION of the table */
    uint32_t struct_size;   /* sizeof(dfl_api) in the library */
    const char *device_kind;/* "cpu", "cuda", "hip" */

    const char *(*last_error)(void);
    int32_t (*device_count)(void);

    dfl_status (*model_load)(const dfl_model_params *params, dfl_model **out);
    void (*model_free)(dfl_model *m);
    dfl_status (*model_info)(const dfl_model *m, dfl_model_info *out);
    dfl_status (*kv_stats)(const dfl_model *m, dfl_kv_stats *out);

    /* Sequences. A new sequence is empty (length 0, zero recurrent state). */
    dfl_status (*seq_alloc)(dfl_model *m, int32_t *seq_out);
    dfl_status (*seq_free)(dfl_model *m, int32_t seq);
    /* Hold blocks for n_tokens total tokens (not only new ones) so that forwards up to that length cannot fail with
     * DFL_ERR_NO_KV; n_tokens below the current holding releases nothing. */
    dfl_status (*seq_reserve)(dfl_model *m, int32_t seq, uint32_t n_tokens);
    dfl_status (*seq_length)(const dfl_model *m, int32_t seq, uint32_t *len_out);
    /* Cut the sequence to n_tokens. Models with recurrent state allow it only to a length reached inside the last
     * forward of this sequence made with DFL_SEQ_RECORD (or the length before it); otherwise DFL_ERR_STATE. */
    dfl_status (*seq_truncate)(dfl_model *m, int32_t seq, uint32_t n_tokens);
    /* Save the sequence's length and recurrent state (one snapshot per sequence, replacing the previous one); rollback
     * restores it. A truncate below the snapshot's length drops the snapshot. */
    dfl_status (*seq_snapshot)(dfl_model *m, int32_t seq);
    dfl_status (*seq_rollback)(dfl_model *m, int32_t seq);

    /* Run the model on a batch. On error no sequence changed length (KV rows past a sequence's length may have been
     * written). */
    dfl_status (*forward)(dfl_model *m, const dfl_batch *batch);

    /* Pick one token from logits. rng_state is the caller's per-sequence generator state (seed it once, e.g. with the
     * request seed); it advances only when a random draw is made. */
    dfl_status (*sample)(const float *logits, uint32_t n_vocab, const dfl_sampling *params, const int32_t *history,
                         uint32_t n_history, uint64_t *rng_state, int32_t *token_out);

    /* Appended in the same version: present when struct_size covers them. */
    /* Free and total bytes of device `index` (system memory for the CPU library). */
    dfl_status (*device_memory)(int32_t index, uint64_t *free_bytes, uint64_t *total_bytes);
    /* The memory a model of these params needs, so a caller can size kv_pool_tokens from free device memory. Reads
     * params->arch, meta and tensors (kv_pool_tokens and max_seqs are ignored). */
    dfl_status (*model_estimate)(const dfl_model_params *params, dfl_model_estimate *out);
    /* forward, except that each logits row comes back as its k best candidates (1 <= k <= 64): ids and logits
     * [rows][k], larger logit first and lower id on ties (rows with fewer than k finite logits padded with id -1 and
     * -inf), and the row's log-sum-exp [rows]; batch->logits is not used. Greedy decoding, sampling with top_k <= k
     * and top logprobs <= k need nothing else, and a decode step moves k candidates per sequence instead of the
     * vocabulary. */
    dfl_status (*forward_topk)(dfl_model *m, const dfl_batch *batch, uint32_t k, int32_t *ids, float *logits, float *lse);
    /* A DFlash draft step (arch "dflash"): k best candidates (1..64, as forward_topk) of every block row but the first,
     * rows = sum(max(n_block,1) - 1) in entry order; the caller must have reserved len + n_ctx + n_block tokens. On
     * error no sequence changed length. Each entry first appends its n_ctx context rows to the draft's cache (kept),
     * then runs its block after them (not kept: the sequence's length becomes len + n_ctx). Other architectures return
     * DFL_ERR_UNSUPPORTED, and a dflash model refuses forward and forward_topk. */
    dfl_status (*draft_forward)(dfl_model *m, uint32_t n_entries, const dfl_draft_entry *entries, uint32_t k,
                                int32_t *ids, float *logits, float *lse);
    /* draft_forward, and for a DFlash2 draft (model_info selector_top_k > 0) the candidate selector's transition
     * scores between the k candidates of consecutive block rows: trans [rows][k][k] (trans may be NULL: exactly
     * draft_forward). For the row of block position p >= 2 of an entry,
     *   trans[row][i][j] = < pred[c_{p-1,i}] * g_p , succ[c_{p,j}] >
     * with c the candidate ids (ids above; c_{p-1,i} those of the entry's previous row), g_p = selector_hidden · h_p
     * (h_p the draft's final normed hidden state of the row) and pred / succ the selector's codebooks; for block
     * position 1 the predecessor is the root token (block[0]) and trans[row][i][j] is the same for every i. A padded
     * candidate (id -1) scores 0. The selector's path (spec §5.1 (b)) then picks, left to right from i = 0 at
     * position 1, j = argmax_j logits[row][j] + trans[row][i][j] and continues from i = j. Pass k = selector_top_k to
     * walk the candidates the selector was trained on. A non-DFlash2 model with trans != NULL: DFL_ERR_UNSUPPORTED. */
    dfl_status (*draft_forward2)(dfl_model *m, uint32_t n_entries, const dfl_draft_entry *entries, uint32_t k,
                                 int32_t *ids, float *logits, float *lse, float *trans);
    /* Tree verification (DDTree). forward (k == 0: batch->logits) or forward_topk (k > 0: ids / logits / lse) in which
     * the tokens of an entry e with parents != NULL and parents[e] != NULL form a tree: parents[e][i] is the index
     * within the entry of token i's parent (-1 for token 0, the root, and only for it; 0 <= parents[e][i] < i
     * otherwise), at most 64 tokens per tree entry. Token i sits at RoPE position seq_len + depth(i) (depth(root) = 0;
     * the entry's positions, when not NULL, are used instead), sees the sequence's cache and its own ancestors (itself
     * included) in the entry, and the recurrent layers continue from its parent's state (the root from the
     * sequence's). Every token's K/V go to cache row seq_len + i (flat order) and every token's recurrent state and
     * conv window are recorded (DFL_SEQ_RECORD is implied), so that seq_accept_path can keep any root-to-node path.
     * Entries with parents[e] == NULL are ordinary (causal chain / prefill); parents == NULL is exactly forward /
     * forward_topk. Logits rows and capture as in forward, in flat order (a tree entry normally asks DFL_LOGITS_ALL).
     * After it the sequence is seq_len + n_tokens long but holds an unresolved tree: the next forward of it fails with
     * DFL_ERR_STATE until seq_accept_path, seq_truncate (to the length before the tree, or to one whose tokens
     * 0..k-1 are a chain: parents[e][i] == i - 1) or seq_rollback resolves it. */
    dfl_status (*forward_tree)(dfl_model *m, const dfl_batch *batch, const int32_t *const *parents, uint32_t k,
                               int32_t *ids, float *logits, float *lse);
    /* After a forward_tree of seq: keep the root-to-node path path[0..n-1] (flat indices: path[0] = 0, each the child
     * of the one before; n = 0 keeps nothing): the sequence becomes (length before the forward) + n tokens long, the
     * path's K/V rows moved to consecutive cache rows, its recurrent state and conv window those after node
     * path[n-1]. DFL_ERR_STATE if the last forward of seq was not a tree forward (or was resolved already) or the path
     * is not a path of its tree. */
    dfl_status (*seq_accept_path)(dfl_model *m, int32_t seq, const int32_t *path, uint32_t n);
    /* The state of a sequence at its current length n as one byte string: for every attention layer its K and V rows
     * of positions 0..n-1 in the cache types, and the recurrent and conv state of its slot. buf == NULL (or size too
     * small) only reports the size in *needed (needed may be NULL when buf is large enough). The format is the
     * library's own (a small header naming the layer count, cache types, dims and n, with checksums of itself and of
     * the rows, so that seq_import can refuse a blob made by another model shape or damaged); callers store it as is.
     * The snapshot and recorded states are not part of it. DFL_ERR_STATE while the sequence holds an unresolved tree
     * forward; DFL_ERR_UNSUPPORTED for a DFlash draft. */
    dfl_status (*seq_export)(const dfl_model *m, int32_t seq, void *buf, uint64_t size, uint64_t *needed);
    /* Load a blob from seq_export into an empty sequence (length 0, else DFL_ERR_STATE): it becomes that long with
     * that state. Needs KV for the blob's length: blocks held by seq_reserve, then free blocks of the pool
     * (DFL_ERR_NO_KV otherwise, nothing changed); DFL_ERR_INVALID when the blob does not fit this model (shape, cache
     * types, truncated, corrupt header or rows) naming what differs, nothing changed. The sequence has no recorded
     * forward afterwards (seq_truncate of a recurrent model needs a new DFL_SEQ_RECORD forward). */
    dfl_status (*seq_import)(dfl_model *m, int32_t seq, const void *buf, uint64_t size);
    /* The distribution sample() draws from for these arguments (the same penalties, temperature, top-k, top-p and
     * min-p): the tokens it can return, in no particular order, in ids_out and their probabilities (summing to 1) in
     * probs_out, both with room for n_vocab entries, and how many in *n_out. A temperature <= 0 gives the argmax alone
     * with probability 1. Speculative sampling needs it: a draft's proposal is accepted or replaced by comparing the
     * draft's probability of it with the target's. Pure, like sample(). */
    dfl_status (*sample_dist)(const float *logits, uint32_t n_vocab, const dfl_sampling *params, const int32_t *history,
                              uint32_t n_history, int32_t *ids_out, double *probs_out, uint32_t *n_out);
    /* sample() without history on a row given as forward_topk's k candidates (ids, logits; suppressed[i] nonzero:
     * candidate i is -inf in the row sample() would see, e.g. end of generation not yet allowed; suppressed may be
     * NULL) and its log-sum-exp, where they decide it: a temperature in (0, 1], no top-k, no min-p. Then
     * *token_out is the token sample() draws from the whole row with this rng_state, and the state advances as it
     * would; otherwise (the token may lie outside the candidates, or rounding leaves it open) *token_out is -1 and
     * rng_state is untouched, and the caller samples the whole row (logits_row). Sampling without top-k then moves
     * k candidates a token instead of the vocabulary in nearly every step. Pure, like sample(). */
    dfl_status (*sample_candidates)(const int32_t *ids, const float *logits, const uint8_t *suppressed, uint32_t k,
                                    float lse, uint32_t n_vocab, const dfl_sampling *params, uint64_t *rng_state,
                                    int32_t *token_out);
    /* Row `row` of the last forward_topk's logits (forward's too, except after DeepSeek V4's token-by-token prefill,
     * whose rows the caller already has), the whole row (n_vocab floats) into out, until the next forward of any
     * kind. DFL_ERR_STATE when that forward kept no such row. */
    dfl_status (*logits_row)(dfl_model *m, uint32_t row, float *out);
    /* The hidden-state captures of the last forward (of any kind) when its batch asked for them with capture == NULL:
     * [total tokens][n_capture * n_embd] f32 as batch->capture would hold them, in the library's memory (pinned host
     * memory on a GPU, where the forward downloads them while its last layers run), valid until the model's next
     * forward or model_free; *n_floats is their count. It spares the caller a copy of them: a 16-token verify of a
     * 27B target with five captured layers moves 1.6 MB. DFL_ERR_STATE when the last forward left none there. */
    dfl_status (*captures)(const dfl_model *m, const float **out, uint64_t *n_floats);
} dfl_api;

/* Returns the function table for `version`, or NULL if this library does not implement it. */
const dfl_api *dfl_get_api(uint32_t version);

typedef const dfl_api *(*dfl_get_api_fn)(uint32_t version);

#ifdef __cplusplus
}
#endif

#endif /* DFLASH_H */

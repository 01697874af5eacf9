// The CUDA device: one stream and one cuBLAS handle per device object; every op is a launch on that stream.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/device.h"

namespace dfl {
namespace cuda {

// Whether DFL_CUDA_SKIP_OPS names this op (device.cu): a profiling aid, the op then launches nothing.
bool skip_op(const char *name);

class CudaDevice final : public Device {
public:
    explicit CudaDevice(int index);
    ~CudaDevice() override;

    std::string name() const override;
    void *alloc(size_t bytes, const char *what) override;
    void release(void *p) override;
    void to_device(void *dst, const void *src, size_t bytes) override;
    void to_host(void *dst, const void *src, size_t bytes) override;
    void copy(void *dst, const void *src, size_t bytes) override;
    void zero(void *dst, size_t bytes) override;
    void sync() override;
    uint64_t free_bytes() override;
    const uint8_t *upload_weight(const void *host, size_t bytes, bool must_copy) override;
    void prepare_weight(Weight &w) override;
    void check_stack(const Weight &w, const std::string &name) const override;
    void *alloc_weight(size_t bytes, const char *what);  // freed with the device

    void embed(const Weight &W, const int32_t *tokens, int64_t T, float *out) override;
    void matmul(const Weight &W, const float *X, int64_t T, float *Y) override;
    void matmul_parts(const Weight &W, const std::vector<std::pair<const Weight *, float *>> &parts, const float *X,
                      int64_t T) override;
    void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps) override;
    void add_rmsnorm(float *x, const float *d, const float *w, float *y, int64_t rows, int64_t n, float eps) override;
    void matmul_add_rmsnorm(const Weight &W, const float *X, int64_t T, float *d, float *x, const float *w, float *y,
                            float eps, const Weight *next) override;
    void add(float *x, const float *d, int64_t count) override;
    void swiglu(float *g, const float *u, int64_t count) override;
    void swiglu_rows(float *out, const float *g, const float *u, int64_t rows, int64_t n, int64_t stride) override;
    void sigmoid_mul(float *a, const float *g, int64_t count) override;
    void scale_softcap(float *x, int64_t count, float scale, float cap) override;
    void gather_rows(const float *x, const int32_t *rows, int64_t R, int64_t n, float *out) override;
    void copy_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                   int64_t n) override;
    void attn_prep(const BatchMeta &m, const AttnPrep &a) override;
    void attention(const BatchMeta &m, const AttnCall &a) override;
    void conv1d_silu(const BatchMeta &m, const ConvCall &c) override;
    void matmul_conv1d_silu(const Weight &W, const float *X, int64_t T, float *Y, const BatchMeta &m,
                            ConvCall c) override;
    void gdn_gates(int64_t T, const GdnGates &g) override;
    void gdn(const BatchMeta &m, const GdnCall &g) override;
    void record_gdn_inputs(const BatchMeta &m, const GdnInputs &r) override;
    void gated_rmsnorm(float *x, const float *z, int64_t z_stride, const float *w, int64_t T, int64_t heads, int64_t n,
                       float eps) override;

    void topk(const float *logits, int64_t rows, int64_t n, int k, int32_t *ids, float *vals, float *lse) override;
    void dyn_conv(const BatchMeta &m, const DynConvCall &c) override;
    void selector_trans(const SelectorCall &s) override;

    // DeepSeek V4 (ds4.cu, ds4_compress.cu, ds4_moe.cu)
    void hc_pre(const HcPreCall &c) override;
    void hc_site(const Weight &fn, HcPreCall c, float *mix, const float *w, float eps, float *y) override;
    bool hc_fold() const override;
    void norm_rope_tail(const float *w, float eps, const RopeTailCall &c) override;
    void hc_post(const HcPostCall &c) override;
    void hc_head(const HcHeadCall &c) override;
    void rope_tail(const RopeTailCall &c) override;
    void ds4_compress(const BatchMeta &m, const Ds4CompressCall &c) override;
    void ds4_indexer_topk(const BatchMeta &m, const Ds4IndexerCall &c) override;
    void ds4_attention(const BatchMeta &m, const Ds4AttnCall &c) override;
    // the grouped-heads kernel of ds4_attention (DFL_CUDA_DS4_ATTN_GROUP), G heads a block
    void ds4_attention_grouped(const BatchMeta &m, const Ds4AttnCall &c, int G, int64_t min_splits, bool skip_empty,
                               bool fold);
    void ds4_ring_write(const BatchMeta &m, const Ds4RingWrite &c) override;
    void moe_route(const MoeRouteCall &c) override;
    void swiglu_clamp(float *g, const float *u, int64_t count, float limit) override;
    void moe_experts(const MoeExpertsCall &c) override;
    bool matmul_grouped(const Weight &W, int groups, const float *x, int64_t T, float *y) override;

    bool has_graphs() const override { return graphs_enabled_; }
    uint64_t scratch_epoch() const override { return scratch_epoch_; }
    void graph_begin() override;
    uintptr_t graph_end() override;
    void graph_launch(uintptr_t g) override;
    void graph_free(uintptr_t g) override;
    void side_begin() override;
    void side_end() override;
    void join_side() override;
    void keep_quant(const float *x) override;
    void *host_landing(size_t bytes) override;
    void to_host_async(void *dst, const void *src, size_t bytes) override;

    // Scratch of at least `bytes` for the current op; grown (never shrunk) when too small. Ops on the one stream run
    // in order, so one buffer serves them all.
    void *scratch(size_t bytes);
    // A second buffer of at least `bytes` for an op that calls other ops (matmul uses scratch): moe_experts' grouped
    // rows. Grown like scratch, and likewise moves scratch_epoch when it does.
    void *ds4_buffer(size_t bytes);
    // A third, for an int8 tensor-core product's activations in fragment order (mma_int8.cu), which it writes from
    // the quantized ones in the scratch.
    void *mma_buffer(size_t bytes);
    // A fourth, for a split-K product's partial sums (launch_q8p_mma with more than two input parts).
    void *splitk_buffer(size_t bytes);
    // A fifth, for the working copies of recording entries' recurrent states in gdn_global_kernel (the staged kernel
    // keeps them in registers).
    void *gdn_buffer(size_t bytes);
    // A sixth, for the codes a residual-norm fold stages for the product after it (launch_resid_norm): the
    // scratch holds that fold's own input codes meanwhile.
    void *fold_buffer(size_t bytes);
    // A seventh, the group fold's arrival counts (one a group of 32 rows, whatever the row count): zeroed when it
    // grows, left zero by every launch.
    unsigned *fold_counts(int64_t groups);
    cudaStream_t stream() const { return stream_; }
    cublasHandle_t blas() const { return blas_; }

    // Activations rounded to int8 per block of 32 for a product on int8 weights (gemv_int8.cu), in the scratch: the
    // quants, their scales and each block's sum of rounded values times its scale.
    struct QuantX {
        int8_t *xq = nullptr;
        float *xs = nullptr, *xsum = nullptr;
        // Where fq is set (stage_rows of 8..64 rows; DFL_CUDA_STAGE_FRAG=0: never): the same codes also in the order
        // the int8 tensor-core products on repacked q8_0 read them (mma_acts_kernel's flat copy: [block][T8][32] codes,
        // then [block][T8] scales at fs; tokens rows..T8-1 repeat the last), so such a product takes them with no copy
        // launch. n: the row length; tok: the row element index 0 is in (row_quant moves xq, xs and xsum to a row).
        int8_t *fq = nullptr;
        float *fs = nullptr;
        int32_t rows = 0, T8 = 0, n = 0, tok = 0;
        // Where rms_parts is set (one row a residual-norm fold staged, launch_resid_norm): the codes are of x w
        // before the norm's scale rsqrt(sum / rms_n + rms_eps), which the product multiplies its sums by; sum: the
        // rms_n_parts partial sums of x^2 at rms_parts, added in order.
        const float *rms_parts = nullptr;
        int32_t rms_n_parts = 0;
        float rms_n = 0.0f, rms_eps = 0.0f;
    };
    // A norm or SwiGLU whose output may feed a product quantizes it as it writes it (unless DFL_CUDA_FUSE_QUANT=0)
    // (stage_quant gives it the buffers); the product that is the very next device call takes them (take_staged)
    // instead of launching the quantizer. Any other call in between, or another input, and the product quantizes.
    // count int8 activations with their per-block scales (and sums) laid out in the scratch
    QuantX quant_scratch(int64_t count, bool sums);
    static size_t quant_scratch_bytes(int64_t count, bool sums);  // what quant_scratch takes of the scratch
    bool fuse_quant() const;
    QuantX stage_quant(const float *x, int64_t count);
    // stage_quant for an op's output rows of n (which it writes through quant_q8_store)
    QuantX stage_rows(const float *y, int64_t rows, int64_t n);
    bool take_staged(const float *x, int64_t count, QuantX *q);
    // For its life, the staging is open to take_staged if no device call came after the op that staged it; at its
    // end, taken or not, the staging is spent. Every product holds one (product()), and so does a launch of a product
    // inside an op (moe_experts' down projection after its swiglu_clamp, matmul_grouped after the attention).
    struct StagedScope {
        CudaDevice &d;
        explicit StagedScope(CudaDevice &dev) : d(dev) {
            d.staged_open_ = d.staged_.x != nullptr && d.staged_.call == d.calls_;
        }
        ~StagedScope() {
            d.staged_open_ = false;
            d.staged_ = Staged{};
        }
    };
    int sm_count() const { return sm_count_; }
    // the most dynamic shared memory a block may be given (cudaFuncAttributeMaxDynamicSharedMemorySize's bound)
    size_t shared_optin() const { return shared_optin_; }
    int index() const { return index_; }
    int cc_major() const { return cc_major_; }  // compute capability
    uint64_t hc_parts_taken() const { return hc_parts_taken_; }  // (HcParts)
    uint64_t hc_side_combs() const { return hc_side_combs_; }    // HC sites whose Sinkhorn ran on the side lane
    uint64_t staged_taken() const { return staged_taken_; }      // products that took an op's staged int8 codes
    uint64_t kept_taken() const { return kept_taken_; }          // products that took keep_quant's codes

    // Per-op GPU time (DFL_CUDA_PROFILE=1): events around each op, summed by op name and printed to stderr when the
    // device is destroyed. Off, an op pays one branch.
    class OpTimer {
    public:
        OpTimer(CudaDevice &d, const char *op, const Weight *w = nullptr, int64_t T = 0);
        ~OpTimer();

    private:
        CudaDevice *d_ = nullptr;
        int slot_ = -1;
    };

private:
    // A product op: the staging spent with it, the op timed.
    template <class Launch>
    void product(const Weight &W, int64_t T, Launch launch);
    void use();  // makes this device current for the calling thread; counts device calls (calls_)
    void staged_done();  // after the op that staged: only the next call may take it
    // Runs one op's launches on this device, timed under `name` when profiling.
    template <class F>
    void op(const char *name, F &&launch) {
        if (skip_op(name)) return;
        use();
        OpTimer t(*this, name);
        launch();
    }
    void settle_profile();  // after a sync: add the finished ops' times to the totals
    void print_profile();
    void *stage(const void *src, size_t bytes);  // pinned copy of a small host buffer, valid until the next sync

    bool profiling_ = false;
    bool capturing_ = false;
    struct Pending {
        std::string op;
        cudaEvent_t start, stop;
    };
    std::vector<Pending> pending_;
    std::vector<cudaEvent_t> spare_events_;
    std::map<std::string, std::pair<double, long>> op_ms_;  // op -> (total ms, calls)

    bool graphs_enabled_ = true;
    // DFL_CUDA_STEP_GAP=1 (a measurement aid, as DFL_CUDA_SKIP_OPS): events around each graph replay, so that a
    // replay's span and the period from one replay's start to the next (the span plus the uploads, top-k, download and
    // host work between them) are timed on the GPU's clock, without a tracer's own cost (CUPTI adds ~2 us a kernel and
    // ~0.4 ms between a V4 step's replays, H100 12-08 01:3x). Printed to stderr every StepGap::kWindow periods.
    struct StepGap {
        static constexpr int kWindow = 64;
        cudaEvent_t start[3] = {}, stop[3] = {};
        int64_t n = 0;                   // replays timed
        std::vector<float> span, period; // ms, this window's
    };
    std::unique_ptr<StepGap> step_gap_;
    void time_replay(bool before);
    // pinned staging for batch metadata uploads: appended to during a forward, reset when the stream is idle
    uint8_t *staging_ = nullptr;
    size_t staging_bytes_ = 0, staging_used_ = 0;
    // pinned landing for downloads (to_host): grown as needed, up to kDownloadMax
    uint8_t *download_ = nullptr;
    size_t download_bytes_ = 0;
    // pinned landing of to_host_async (host_landing): grown as needed
    uint8_t *landing_ = nullptr;
    size_t landing_bytes_ = 0;
    void regrow_pinned(uint8_t *&buf, size_t &have, size_t bytes);

    int index_;
    std::string name_;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t blas_ = nullptr;
    // A device buffer that only grows; growing waits for the stream, frees the old one and moves scratch_epoch (the
    // captured graphs hold its address).
    struct GrowBuf {
        void *p = nullptr;
        size_t bytes = 0;
    };
    void *grow(GrowBuf &b, size_t bytes, const char *what);
    GrowBuf scratch_, ds4_buf_, mma_buf_, splitk_buf_, gdn_buf_, fold_buf_, fold_counts_;
    uint64_t scratch_epoch_ = 0;
    // The side lane (side_begin; DFL_CUDA_LANES=0: none): a stream, a cuBLAS handle, grow buffers and a staging of its
    // own, so that its ops share nothing with the main lane's. The lane not current keeps them in other_; switching
    // lanes swaps them with the members above and below (stream_, blas_, the buffers, calls_, staged_).
    struct Lane {
        cudaStream_t stream = nullptr;
        cublasHandle_t blas = nullptr;
        GrowBuf scratch, ds4_buf, mma_buf, splitk_buf, gdn_buf, fold_buf, fold_counts;
        uint64_t calls = 0;
    };
    void swap_lanes();
    bool lanes_ = false;         // side_begin switches lanes (DFL_CUDA_LANES=0: the side ops run in order)
    bool on_side_ = false;       // the side lane is current
    bool side_pending_ = false;  // the side lane has ops the main lane has not joined
    Lane other_;
    cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
    int sm_count_ = 1;
    int cc_major_ = 0;
    size_t shared_optin_ = 48 * 1024;
    std::vector<void *> weights_;  // upload_weight copies, freed with the device

    mutable uint64_t calls_ = 0;  // device calls so far (use())
    struct Staged {
        const float *x = nullptr;
        int64_t count = 0;
        uint64_t call = 0;  // calls_ after the staging op
        QuantX q;
    } staged_;
    bool staged_open_ = false;  // the current call is a product that may take staged_
    // keep_quant's input and, once an op staged its codes (in keep_buf_, which no lane's scratch overwrites), the
    // codes every product of it takes (take_staged) until the next keep_quant
    Staged kept_;
    GrowBuf keep_buf_;
    // hc_post's partial sums of the next HC site's mixing product (the default; DFL_CUDA_HC_PARTS=0 leaves none): for
    // that site's hc_site call on X with fn, if no call came between
    struct HcParts {
        const float *X = nullptr;
        const void *fn = nullptr;
        int64_t T = 0;
        uint64_t call = 0;  // calls_ after hc_post
        float *p = nullptr;
    } hc_parts_;
    GrowBuf hc_parts_buf_;
    uint64_t hc_parts_taken_ = 0;  // HC sites that took hc_post's partial sums (the op tests read it)
    uint64_t hc_side_combs_ = 0;   // HC sites that left post and comb to hc_comb_kernel on the side lane (likewise)
    uint64_t staged_taken_ = 0;    // take_staged's successes (likewise)
    uint64_t kept_taken_ = 0;      // take_staged's takes of keep_quant's codes (likewise)
    Staged other_staged_;       // the lane not current's (see Lane)
};

// Kernel launchers, one per op, defined in the op-family files (matmul.cu, norm.cu, misc.cu, attention.cu, gdn.cu).
void launch_embed(cudaStream_t s, const Weight &W, const int32_t *tokens, int64_t T, float *out);
void launch_matmul(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y);
// Where rows of a product go: rows [r0, r0 + rows) of W into y, T rows ldy apart.
struct GemmOut {
    int64_t r0, rows;
    float *y;
    int64_t ldy;
};
// Whether launch_matmul takes cuBLAS (launch_gemm) for T tokens of a matrix without a packed layout: then a matrix of
// parts laid side by side (q|k|v, gate|up) can be one cuBLAS product, each part's rows into its own output.
bool gemm_takes_parts(int64_t T);
// The cuBLAS product of T tokens (gemm.cu), W's rows into the outputs that hold them (one GemmOut covering all rows for
// a plain product, one per part for matmul_parts).
void launch_gemm(CudaDevice &dev, const Weight &W, const float *X, int64_t T, const std::vector<GemmOut> &outs);
// A cuBLAS call's status as the op's error (gemm.cu).
void check_blas(cublasStatus_t st, const char *op);
void launch_rmsnorm(cudaStream_t s, const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps,
                    const CudaDevice::QuantX &q = {});
void launch_add_rmsnorm(cudaStream_t s, float *x, const float *d, const float *w, float *y, int64_t rows, int64_t n,
                        float eps, const CudaDevice::QuantX &q = {});
void launch_gated_rmsnorm(cudaStream_t s, float *x, const float *z, int64_t z_stride, const float *w, int64_t T,
                          int64_t heads, int64_t n, float eps, const CudaDevice::QuantX &q = {});
// The threads of a row norm's block for rows of n (norm.cu): about four elements a thread, up to 1024.
int norm_threads(int64_t n);
void launch_add(cudaStream_t s, float *x, const float *d, int64_t count);
void launch_swiglu(cudaStream_t s, float *g, const float *u, int64_t count, const CudaDevice::QuantX &q = {});
void launch_swiglu_rows(cudaStream_t s, float *out, const float *g, const float *u, int64_t rows, int64_t n,
                        int64_t stride, const CudaDevice::QuantX &q = {});
void launch_sigmoid_mul(cudaStream_t s, float *a, const float *g, int64_t count, const CudaDevice::QuantX &q = {});
void launch_scale_softcap(cudaStream_t s, float *x, int64_t count, float scale, float cap);
void launch_gather_rows(cudaStream_t s, const float *x, const int32_t *rows, int64_t R, int64_t n, float *out);
void launch_dyn_conv(cudaStream_t s, const BatchMeta &m, const DynConvCall &c);
void launch_selector_trans(cudaStream_t st, const SelectorCall &s);
void launch_attn_prep(CudaDevice &dev, const BatchMeta &m, const AttnPrep &a);
void launch_attention(CudaDevice &dev, const BatchMeta &m, const AttnCall &a);
// The tensor-core (cuBLAS) attention of attention_gemm.cu: whether a call takes it (launch_attention asks), and the
// launcher. Exposed so the op test can tell which path, and so which error bound, a case gets.
bool attention_gemm_path(const BatchMeta &m, const AttnCall &a);
void launch_attention_gemm(CudaDevice &dev, const BatchMeta &m, const AttnCall &a);
void launch_conv1d_silu(cudaStream_t s, const BatchMeta &m, const ConvCall &c);
void launch_gdn_gates(cudaStream_t s, int64_t T, const GdnGates &g);
void launch_gdn(CudaDevice &dev, const BatchMeta &m, const GdnCall &g);
void launch_record_gdn_inputs(cudaStream_t s, const BatchMeta &m, const GdnInputs &r);
void repack_q8_0(CudaDevice &dev, Weight &W);
bool q8p_ok(const Weight &W);
// A repacked q8_0 weight (repack_q8_0): its n_out rows of n_in quants, then (packed_aux) all of its f16 block scales;
// a row range of it (Weight::rows) points into both regions.
inline const int8_t *q8p_quants(const Weight &W) { return (const int8_t *)W.packed; }
inline const uint16_t *q8p_scales(const Weight &W) { return (const uint16_t *)W.packed_aux; }
void launch_gemv_q8p(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y);
// The activations of a product on int8 weights (gemv_int8.cu): rows of n_in quantized per block of 32 into the scratch,
// with each block's sum where sums (q4_K), or what the op before staged (CudaDevice::take_staged).
// folded_ok: the caller scales its sums by QuantX::rms_parts' norm scale (else staged codes of a residual-norm fold are
// an internal error).
CudaDevice::QuantX quantize_x(CudaDevice &dev, const float *X, int64_t n_in, int64_t rows, bool sums,
                              bool folded_ok = false);
// The residual-norm fold of CudaDevice::matmul_add_rmsnorm (gemv_int8.cu): whether it takes W's product of T rows with
// `next` reading the norm's output, and the launch (x += W X; the codes of x w for `next`, returned to stage).
// (y: the norm's output, which `next` would read: its alignment decides the q4_K path as launch_matmul's does.)
bool resid_norm_takes(const CudaDevice &dev, const Weight &W, int64_t T, const Weight *next, const float *y);
// Whether launch_matmul gives T rows of W to launch_gemv_q8p (repacked q8_0 on int8 activations).
bool q8p_takes(const Weight &W, int64_t T);
CudaDevice::QuantX launch_resid_norm(CudaDevice &dev, const Weight &W, const float *X, float *x, const float *w,
                                     float eps);
// The DeltaNet conv in its input projection's product (CudaDevice::matmul_conv1d_silu, gemv_int8.cu): whether it takes
// W's product of T rows with the conv c (c.x: the product's output), and the launch.
bool conv_fold_takes(const Weight &W, int64_t T, const BatchMeta &m, const ConvCall &c);
void launch_conv_fold(CudaDevice &dev, const Weight &W, const float *X, float *Y, const BatchMeta &m, const ConvCall &c);
// Most tokens the int8 tensor-core kernels (repacked q8_0, q4_K; mma_q8p.cu, mma_q4k.cu) take (0 when DFL_CUDA_I8_MMA=0 turns
// them off).
int64_t i8_mma_max_tokens();
// Fewest tokens of a repacked q8_0 product on the tensor-core kernel; fewer take the dp4a kernels (gemv_int8.cu).
int64_t q8p_mma_min_tokens();
void launch_q8p_mma(CudaDevice &dev, const Weight &W, const CudaDevice::QuantX &qx, int64_t T, float *Y);
bool q4k_mma_ok(const Weight &W);
// Fewest tokens of a q4_K product on the tensor-core kernel; fewer (from 2) take the dp4a kernel (gemv_q4k_i8_kernel).
int64_t q4k_mma_min_tokens();
bool q6k_i8_on();
bool q6k_i8_ok(const Weight &W);
void launch_gemv_q6k_i8(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y);
void launch_gemv_q4k_mma(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y);
// q6_K products of 2..64 tokens on int8 tensor cores (mma_q6k.cu; DFL_CUDA_Q6K_MMA=0 off), for rows of an even
// number of super-blocks in a tensor that starts on a 4-byte boundary (q6k_mma_ok).
bool q6k_mma_on();
bool q6k_mma_ok(const Weight &W);
void launch_gemv_q6k_mma(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y);
// The tensor-core kernel on packed f16, bf16 and quantized weights (mmq.cu), for kMmqMinTokens..kMmqMaxTokens tokens of
// the weights it takes (mmq_ok).
constexpr int64_t kMmqMinTokens = 2, kMmqMaxTokens = 64;
bool mmq_ok(const Weight &W);
void launch_mmq(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y);

// A z batch of one-token products in one launch (blockIdx.y = z): member z multiplies rows [e * w_rows, e * w_rows +
// rows) of the weight `stack`, e = ids[z] (or z when ids is null), by input X + (z / x_div) * x_stride into
// Y + z * y_stride. Each member's arithmetic is that of matmul on its rows alone with T = 1. Used where a member's
// matrix is known only on the device (MoE experts: no host round trip, so the step can be a graph) and where a
// weight's row groups read different slices of the input (DeepSeek V4's grouped output projection).
struct GemvZ {
    const int32_t *ids = nullptr;
    int64_t w_rows = 0;
    int64_t x_stride = 0;
    int x_div = 1;
    int64_t y_stride = 0;
    // A second stack of the same shape and type in the same launch (q4_K int8 path only, launch_gemv_q4k_i8_pair):
    // members from `second` on are members 0.. of w2's stack, written from y2.
    const uint8_t *w2 = nullptr;
    float *y2 = nullptr;
    int second = 0;
};
void launch_gemv_z(CudaDevice &dev, const Weight &stack, int64_t rows, const GemvZ &z, int nz, const float *X, float *Y);
// The warp GEMV on float activations (gemv_float.cu) for 1..kGemvMaxTokens tokens (launch_matmul's fallback), or a z
// batch of nz one-token members.
constexpr int64_t kGemvMaxTokens = 8;
void launch_gemv(cudaStream_t s, const Weight &W, const float *X, int64_t T, float *Y, const GemvZ &z = {}, int nz = 1);
// f16 / bf16 products of 2..kGemvMaxTokens tokens on the tensor cores (gemv_mma_float.cu), for launch_gemv:
// whether weights of a type take them (unless DFL_CUDA_GEMV16_MMA=0), and the launch, given
// launch_gemv's checks (X and the rows 16-byte aligned, n_in a multiple of 8; launch_gemv checks the launch too).
bool gemv_mma_float_takes(uint32_t type);
void launch_gemv_mma_float(cudaStream_t s, const Weight &W, const float *X, int64_t T, float *Y);
// q4_K on int8 activations (dp4a), for up to 8 tokens or a z batch of one-token members; DFL_CUDA_Q4K_I8=1 turns it on.
bool q4k_i8_on();
bool q4k_i8_ok(const Weight &W, const GemvZ &z);
void launch_gemv_q4k_i8(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y, const GemvZ &z, int nz);
// The z batch of two stacks of one shape and type (MoE gate and up) on one input in one launch, the input quantized
// once: nz members of A into Ya, then of B into Yb. False (nothing launched) where the int8 q4_K path does not take
// them, or with DFL_CUDA_MOE_PAIR=0.
bool launch_gemv_q4k_i8_pair(CudaDevice &dev, const Weight &A, const Weight &B, const float *X, float *Ya, float *Yb,
                             const GemvZ &z, int nz);
// The repacked-q8_0 form, for a packed stack whose groups read consecutive inputs (x_stride == n_in, no ids).
void launch_gemv_q8p_z(CudaDevice &dev, const Weight &stack, int64_t rows, const GemvZ &z, int nz, const float *X,
                       float *Y);
// Whether T tokens of a repacked q8_0 stack of `groups` row groups (CudaDevice::matmul_grouped) take
// launch_gemv_q8p_grouped: 2..16 tokens (DFL_CUDA_GROUPED_ROWS=N: up to N; 0: none).
bool q8p_grouped_takes(const Weight &W, int groups, int64_t T);
// T tokens of matmul_grouped's product on the rows kernel, every group in one launch (q8p_grouped_takes said so).
void launch_gemv_q8p_grouped(CudaDevice &dev, const Weight &W, int groups, const float *X, int64_t T, float *Y);
void launch_topk(CudaDevice &dev, const float *logits, int64_t rows, int64_t n, int k, int32_t *ids, float *vals,
                 float *lse);

}  // namespace cuda
}  // namespace dfl

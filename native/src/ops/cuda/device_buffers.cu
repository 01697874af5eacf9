// CudaDevice's lanes (its stream and the side lane's: side_begin, join_side) and what each lane owns: its grow
// buffers (the scratch and the ops' own) and the int8 codes an op stages in them for the product after it
// (stage_quant, take_staged). The rest of the device (memory, copies, graphs, the profile, the ops) is device.cu.
#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

// --- lanes ---------------------------------------------------------------------------------------------------------

void CudaDevice::swap_lanes() {
    std::swap(stream_, other_.stream);
    std::swap(blas_, other_.blas);
    std::swap(scratch_, other_.scratch);
    std::swap(ds4_buf_, other_.ds4_buf);
    std::swap(mma_buf_, other_.mma_buf);
    std::swap(splitk_buf_, other_.splitk_buf);
    std::swap(gdn_buf_, other_.gdn_buf);
    std::swap(fold_buf_, other_.fold_buf);
    std::swap(fold_counts_, other_.fold_counts);
    std::swap(calls_, other_.calls);
    std::swap(staged_, other_staged_);
    on_side_ = !on_side_;
}

// The side lane is a second stream unless DFL_CUDA_LANES=0 (then its ops run in order on the one). Why: a DeepSeek V4
// batch-1 step is ~25 dependent, mostly latency-bound kernels a layer, and its side chains (the K = V row and the
// compressors, the shared expert) fill time the other lane's small kernels leave idle. Measured (H100 12-05 22:4x, the
// 2-layer V4-Flash file, graphs, two runs each): batch 1 0.685 / 0.686 -> 0.668 / 0.662 ms a step (-3 %), batch 8
// 1.926 / 1.930 -> 1.913 / 1.916; the 27B qwen35 verify (the captures' copy on the side lane) unchanged.
void CudaDevice::side_begin() {
    if (!lanes_ || on_side_) return;
    use();
    check(cudaEventRecord(fork_ev_, stream_), "side_begin");  // (everything issued so far)
    swap_lanes();
    check(cudaStreamWaitEvent(stream_, fork_ev_, 0), "side_begin");
    side_pending_ = true;
}

void CudaDevice::side_end() {
    if (on_side_) swap_lanes();
}

void CudaDevice::join_side() {
    side_end();
    if (!side_pending_) return;
    use();
    check(cudaEventRecord(join_ev_, other_.stream), "join_side");
    check(cudaStreamWaitEvent(stream_, join_ev_, 0), "join_side");
    side_pending_ = false;
}

// --- grow buffers ------------------------------------------------------------------------------------------------

void *CudaDevice::grow(GrowBuf &b, size_t bytes, const char *what) {
    if (bytes <= b.bytes) return b.p;
    if (b.p) {
        check(cudaStreamSynchronize(stream_), what);
        check(cudaFree(b.p), what);
        b = GrowBuf{};
    }
    // round up so a slowly growing batch does not reallocate every forward
    const size_t want = (bytes + (8u << 20) - 1) & ~(size_t)((8u << 20) - 1);
    b.p = alloc(want, what);
    b.bytes = want;
    scratch_epoch_++;
    return b.p;
}

void *CudaDevice::scratch(size_t bytes) { return grow(scratch_, bytes, "matmul scratch"); }
void *CudaDevice::ds4_buffer(size_t bytes) { return grow(ds4_buf_, bytes, "deepseek4 expert rows"); }
void *CudaDevice::mma_buffer(size_t bytes) { return grow(mma_buf_, bytes, "int8 mma activations"); }
void *CudaDevice::splitk_buffer(size_t bytes) { return grow(splitk_buf_, bytes, "split-K partial sums"); }
void *CudaDevice::gdn_buffer(size_t bytes) { return grow(gdn_buf_, bytes, "gdn working states"); }
void *CudaDevice::fold_buffer(size_t bytes) { return grow(fold_buf_, bytes, "residual-norm fold codes"); }

unsigned *CudaDevice::fold_counts(int64_t groups) {
    const size_t had = fold_counts_.bytes;
    void *p = grow(fold_counts_, (size_t)groups * sizeof(unsigned), "residual-norm fold counts");
    if (fold_counts_.bytes != had) check(cudaMemsetAsync(p, 0, fold_counts_.bytes, stream_), "residual-norm fold counts");
    return (unsigned *)p;
}

// --- staged int8 codes -------------------------------------------------------------------------------------------

bool CudaDevice::fuse_quant() const {
    static const bool on = env_switch("DFL_CUDA_FUSE_QUANT", true);
    return on;
}

// Most elements a norm or SwiGLU quantizes for the next product: the int8 products take up to 64 tokens, and beyond
// that (a prefill) the work would be wasted.
constexpr int64_t kStageQuantMax = (int64_t)1 << 20;

size_t CudaDevice::quant_scratch_bytes(int64_t count, bool sums) {
    return round256(round256((size_t)count) + (size_t)(count / 32) * (sums ? 8 : 4));
}

// count codes with their scales (and sums) laid out from p (quant_scratch_bytes of it)
static CudaDevice::QuantX quant_at(void *at, int64_t count, bool sums) {
    const int64_t nb = count / 32;
    const size_t xq_bytes = round256((size_t)count);
    uint8_t *p = (uint8_t *)at;
    CudaDevice::QuantX q;
    q.xq = (int8_t *)p;
    q.xs = (float *)(p + xq_bytes);
    if (sums) q.xsum = q.xs + nb;
    return q;
}

CudaDevice::QuantX CudaDevice::quant_scratch(int64_t count, bool sums) {
    return quant_at(scratch(quant_scratch_bytes(count, sums)), count, sums);
}

CudaDevice::QuantX CudaDevice::stage_quant(const float *x, int64_t count) {
    staged_ = Staged{};  // whatever an earlier op staged is stale now
    const bool keep = x && x == kept_.x;
    if (keep) kept_ = Staged{x};  // (so are kept codes of x, if this op makes none)
    if (!fuse_quant() || count <= 0 || count % 32 != 0 || count > kStageQuantMax) return QuantX{};
    // with sums: any int8 product may take it; keep_quant's input in a buffer of its own (the lanes' products of it
    // may run while either lane's ops quantize into their scratch)
    const size_t bytes = quant_scratch_bytes(count, true);
    const QuantX q = keep ? quant_at(grow(keep_buf_, bytes, "kept int8 codes"), count, true) : quant_scratch(count, true);
    staged_.x = x;
    staged_.count = count;
    staged_.q = q;
    if (keep) kept_ = staged_;  // (without stage_rows' fragment-ordered copy: that is in a lane's mma buffer)
    return q;
}

// Whether keep_quant keeps anything: on unless DFL_CUDA_KEEP_QUANT=0 (DeepSeek V4's FFN input: its HC site's codes
// for the shared and the routed experts, each of which quantized it again, one of them on the main lane between the
// routing and the experts: two quantizer launches a layer). The 10-layer V4-Flash file on an H100, alternated twice
// (12-08 00:1x): b8 4.543 / 4.557 -> 4.485 / 4.492 ms a step, but b1 2.045 / 2.049 -> 2.080 / 2.077, so the model
// keeps them for batched steps only (deepseek4_forward.cpp).
void CudaDevice::keep_quant(const float *x) {
    static const bool on = env_switch("DFL_CUDA_KEEP_QUANT", true);
    kept_ = Staged{};
    if (on) kept_.x = x;
}

// Whether stage_rows also writes the codes of rows in the int8 tensor-core products' fragment order (QuantX::fq): on
// unless DFL_CUDA_STAGE_FRAG=0. A product of such a batch on repacked q8_0 otherwise launches mma_acts_kernel to copy
// them there (~4 us a call alone, H100 ncu 12-06 11:3x); after a norm (q|k|v, gate|up: products that need no zeroed
// output) it launches nothing before itself. H100 12-06 18:5x, one machine, alternated: the 27B verify of 8 / 16 rows
// and the 23-node tree 12.97 / 12.95, 13.99 / 14.01, 15.43 / 15.46 -> 12.71 / 12.77, 13.82 / 13.79, 15.27 / 15.31 ms,
// its tg b8 / b32 13.71 / 19.71 -> 13.54 / 19.48 ms; qwen3-8b q8_0 tg b32 5.11-5.15 -> 4.97-5.02 ms but b8 4.00-4.05 ->
// 4.05-4.09 (+1 %); tg b1 even (one row stages no copy). The 12-05 form (DFL_CUDA_STAGE_FRAGS) lost with slower
// producers: it read its own stores back and divided in 64 bits an element; quant_frag_store does neither.
static bool stage_frag_on() {
    static const bool on = env_switch("DFL_CUDA_STAGE_FRAG", true);
    return on;
}

CudaDevice::QuantX CudaDevice::stage_rows(const float *y, int64_t rows, int64_t n) {
    // a warp's lanes must hold one block of 32 of a row: n a multiple of 32 (count 0 stages nothing, and clears what
    // an earlier op staged)
    QuantX q = stage_quant(y, rows <= 64 && n % 32 == 0 ? rows * n : 0);
    // (only rows a repacked q8_0 product takes on the tensor cores: the dp4a kernels below read the plain codes)
    if (!q.xq || rows < std::max<int64_t>(2, q8p_mma_min_tokens()) || !stage_frag_on()) return q;
    // (the layout and padding of mma_acts' flat copy, in the same buffer: a product that takes them copies nothing)
    const int T8 = (int)((rows + 7) / 8 * 8);
    const int64_t nb = n / 32;
    const size_t q_bytes = round256((size_t)(nb * T8 * 32));
    uint8_t *p = (uint8_t *)mma_buffer(q_bytes + (size_t)(nb * T8) * 4);
    q.fq = (int8_t *)p;
    q.fs = (float *)(p + q_bytes);
    q.rows = (int32_t)rows;
    q.T8 = T8;
    q.n = (int32_t)n;
    staged_.q = q;
    return q;
}

void CudaDevice::staged_done() {
    if (staged_.x) staged_.call = calls_;
}

bool CudaDevice::take_staged(const float *x, int64_t count, QuantX *q) {
    const bool ok = staged_open_ && staged_.x == x && staged_.count == count;
    if (!ok && staged_open_ && staged_.q.rms_parts) {
        staged_ = Staged{};
        staged_open_ = false;
        fail(DFL_ERR_INTERNAL, "the product after a folded norm does not read the norm's output");
    }
    if (ok) {
        *q = staged_.q;
        staged_taken_++;
    }
    staged_ = Staged{};
    staged_open_ = false;
    if (ok) return true;
    if (!kept_.q.xq || kept_.x != x || kept_.count != count) return false;
    *q = kept_.q;
    kept_taken_++;
    return true;
}

}  // namespace cuda
}  // namespace dfl

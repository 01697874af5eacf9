// CudaDevice: memory, copies and the dispatch of every op to its launcher on the device's stream (its lanes, grow
// buffers and staged int8 codes: device_buffers.cu).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "blockconv.h"
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

static const char *blas_status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
    }
}

bool pdl_on() {
    static const bool on = [] {
        if (!env_switch("DFL_CUDA_PDL", true)) return false;
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess) return false;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
        return major >= 9;
    }();
    return on;
}

bool pdl_chain_on() {
    static const bool on = env_switch("DFL_CUDA_PDL_CHAIN", true);
    return on;
}

bool pdl_early_for(const CudaDevice &dev, int64_t blocks) {
    static const int64_t waves = env_int("DFL_CUDA_PDL_EARLY", 1);
    return waves > 0 && blocks > waves * 2 * (int64_t)dev.sm_count();
}

CudaDevice::CudaDevice(int index) : index_(index) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || index < 0 || index >= count)
        fail(DFL_ERR_INVALID, "no such GPU cuda:" + std::to_string(index) + " (" + std::to_string(e == cudaSuccess ? count : 0) +
                                  " CUDA devices" + (e != cudaSuccess ? std::string(": ") + cudaGetErrorString(e) : "") + ")");
    use();
    cudaDeviceProp prop;
    check(cudaGetDeviceProperties(&prop, index), "cuda device properties");
    name_ = "cuda:" + std::to_string(index) + " (" + prop.name + ")";
    sm_count_ = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    cc_major_ = prop.major;
    shared_optin_ = prop.sharedMemPerBlockOptin;
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cuda stream create");
    const cublasStatus_t bs = cublasCreate(&blas_);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        cudaStreamDestroy(stream_);
        fail(DFL_ERR_INTERNAL, std::string("cublasCreate: ") + blas_status_name(bs));
    }
    cublasSetStream(blas_, stream_);
    const char *prof = std::getenv("DFL_CUDA_PROFILE");
    profiling_ = prof && *prof && std::strcmp(prof, "0") != 0;
    graphs_enabled_ = env_switch("DFL_CUDA_GRAPHS", true);
    if (env_switch("DFL_CUDA_STEP_GAP", false)) step_gap_ = std::make_unique<StepGap>();
    // The side lane's stream, handle and events, made here: never inside a capture (see side_begin).
    lanes_ = env_switch("DFL_CUDA_LANES", true);
    if (lanes_) {
        check(cudaStreamCreateWithFlags(&other_.stream, cudaStreamNonBlocking), "cuda stream create");
        if (cublasCreate(&other_.blas) != CUBLAS_STATUS_SUCCESS) fail(DFL_ERR_INTERNAL, "cublasCreate (side lane)");
        cublasSetStream(other_.blas, other_.stream);
        check(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming), "cudaEventCreate");
        check(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming), "cudaEventCreate");
    }
}

CudaDevice::~CudaDevice() {
    cudaSetDevice(index_);
    if (on_side_) swap_lanes();
    if (stream_) cudaStreamSynchronize(stream_);
    if (other_.stream) cudaStreamSynchronize(other_.stream);
    if (profiling_) {
        settle_profile();
        print_profile();
    }
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
    if (step_gap_)
        for (int i = 0; i < 3; i++)
            for (cudaEvent_t e : {step_gap_->start[i], step_gap_->stop[i]})
                if (e) cudaEventDestroy(e);
    if (staging_) cudaFreeHost(staging_);
    if (download_) cudaFreeHost(download_);
    if (landing_) cudaFreeHost(landing_);
    for (void *p : weights_) cudaFree(p);
    for (const GrowBuf &b : {scratch_, ds4_buf_, mma_buf_, splitk_buf_, gdn_buf_, fold_buf_, fold_counts_, hc_parts_buf_,
                             keep_buf_, other_.scratch, other_.ds4_buf, other_.mma_buf, other_.splitk_buf,
                             other_.gdn_buf, other_.fold_buf, other_.fold_counts})
        if (b.p) cudaFree(b.p);
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
    if (other_.blas) cublasDestroy(other_.blas);
    if (other_.stream) cudaStreamDestroy(other_.stream);
    for (cudaEvent_t e : {fork_ev_, join_ev_})
        if (e) cudaEventDestroy(e);
}

// Whether DFL_CUDA_SKIP_OPS (op names as DFL_CUDA_PROFILE prints them, separated by ',' or '+': run.sh's variants
// split settings at commas) names this op: a
// profiling aid only. A skipped op launches nothing, so its outputs are whatever its buffers held: the difference in
// a step's time with and without it is what the op costs inside a replayed graph, where per-kernel timers cannot
// see (ncu times each kernel alone, cold, without the programmatic overlap). Never set outside such a measurement.
bool skip_op(const char *name) {
    static const std::string list = [] {
        const char *e = std::getenv("DFL_CUDA_SKIP_OPS");
        std::string names = e && *e ? "," + std::string(e) + "," : std::string();
        std::replace(names.begin(), names.end(), '+', ',');
        return names;
    }();
    return !list.empty() && list.find("," + std::string(name) + ",") != std::string::npos;
}

// The device current on this thread, as last set through use(): cudaSetDevice per op is measurable in decode.
static thread_local int t_current_device = -1;

void CudaDevice::use() {
    // a residual-norm fold's staging is the only copy of the norm's output (y is never written): any call but the
    // product it was staged for (which opens it first) would leave that product to read a stale y (spent here, so
    // that the device goes on after the error)
    if (staged_.q.rms_parts && staged_.call == calls_ && !staged_open_) {
        staged_ = Staged{};
        fail(DFL_ERR_INTERNAL, "a device call came between a folded norm and the product of its output");
    }
    ++calls_;
    if (t_current_device == index_) return;
    check(cudaSetDevice(index_), "cudaSetDevice");
    t_current_device = index_;
}

std::string CudaDevice::name() const { return name_; }

void *CudaDevice::alloc(size_t bytes, const char *what) {
    if (bytes == 0) return nullptr;
    use();
    void *p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();  // clear the sticky-free allocation error so later calls do not report it
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        fail(DFL_ERR_NO_MEMORY, std::string("cuda:") + std::to_string(index_) + ": cannot allocate " +
                                    std::to_string(bytes) + " bytes for " + (what ? what : "?") + " (" +
                                    std::to_string(fr) + " bytes free): " + cudaGetErrorString(e));
    }
    return p;
}

void CudaDevice::release(void *p) {
    if (!p) return;
    use();
    // cudaFree waits for the device, so a buffer still read by queued work is never reused under it.
    check(cudaFree(p), "cudaFree");
}

// Small uploads (batch metadata, every forward) go through pinned staging so they neither wait for the device nor
// make it wait; the staging is reused once the stream is idle (after to_host or sync).
constexpr size_t kStageMax = 4u << 20;

// A pinned host buffer replaced by one of `bytes`, once the stream is idle (queued copies may still use the old one).
void CudaDevice::regrow_pinned(uint8_t *&buf, size_t &have, size_t bytes) {
    check(cudaStreamSynchronize(stream_), "pinned host buffer");
    if (buf) check(cudaFreeHost(buf), "cudaFreeHost");
    buf = nullptr;
    have = 0;
    check(cudaHostAlloc((void **)&buf, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    have = bytes;
}

void *CudaDevice::stage(const void *src, size_t bytes) {
    const size_t need = staging_used_ + ((bytes + 255) & ~(size_t)255);
    if (need > staging_bytes_) {
        regrow_pinned(staging_, staging_bytes_, std::max<size_t>(2 * kStageMax, bytes));
        staging_used_ = 0;
    }
    uint8_t *p = staging_ + staging_used_;
    std::memcpy(p, src, bytes);
    staging_used_ += (bytes + 255) & ~(size_t)255;
    return p;
}

void CudaDevice::to_device(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    use();
    if (bytes <= kStageMax && !capturing_) {
        check(cudaMemcpyAsync(dst, stage(src, bytes), bytes, cudaMemcpyHostToDevice, stream_), "to_device");
        return;
    }
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "to_device");
    // the source is pageable host memory the caller may reuse at once
    check(cudaStreamSynchronize(stream_), "to_device");
}

// Downloads up to kDownloadMax land in pinned memory first and are copied on the host after the stream is idle
// (DFL_CUDA_PINNED_D2H=0: straight into the caller's pageable memory, which the driver stages in pieces). Why: a
// verify's hidden-state captures (1.6 MB for a 16-row 27B verify) and top-k crossed at pageable speed: with every
// layer op skipped the 16-row verify still took 0.68 ms against a decode step's 0.05 (H100 12-05 19:2x).
constexpr size_t kDownloadMax = 64u << 20;

static bool pinned_d2h_on() {
    static const bool on = env_switch("DFL_CUDA_PINNED_D2H", true);
    return on;
}

void CudaDevice::to_host(void *dst, const void *src, size_t bytes) {
    use();
    join_side();  // (what the host reads may be the side lane's)
    const bool pinned = bytes > 0 && bytes <= kDownloadMax && pinned_d2h_on();
    if (pinned && bytes > download_bytes_)
        regrow_pinned(download_, download_bytes_, std::min(kDownloadMax, std::max<size_t>(bytes, 4u << 20)));
    if (bytes) check(cudaMemcpyAsync(pinned ? download_ : dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "to_host");
    check(cudaStreamSynchronize(stream_), "to_host");
    if (pinned) std::memcpy(dst, download_, bytes);
    staging_used_ = 0;
    if (profiling_) settle_profile();
}

// DFL_CUDA_HOST_LANDING=0: none (the plans download after the forward, as before; for comparisons in one run).
void *CudaDevice::host_landing(size_t bytes) {
    static const bool on = env_switch("DFL_CUDA_HOST_LANDING", true);
    if (!on) return nullptr;
    use();
    if (bytes > landing_bytes_) {
        join_side();  // (queued copies may still land in the old one)
        regrow_pinned(landing_, landing_bytes_, bytes);
        scratch_epoch_++;  // graphs that copy into it point at freed memory
    }
    return landing_;
}

void CudaDevice::to_host_async(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    use();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "to_host_async");
}

void CudaDevice::copy(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    use();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
}

void CudaDevice::zero(void *dst, size_t bytes) {
    if (!bytes) return;
    use();
    check(cudaMemsetAsync(dst, 0, bytes, stream_), "zero");
}

void CudaDevice::sync() {
    use();
    join_side();
    check(cudaStreamSynchronize(stream_), "sync");
    staging_used_ = 0;
    if (profiling_) settle_profile();
}

void CudaDevice::topk(const float *logits, int64_t rows, int64_t n, int k, int32_t *ids, float *vals, float *lse) {
    op("topk", [&] { launch_topk(*this, logits, rows, n, k, ids, vals, lse); });
}

// --- graphs ------------------------------------------------------------------------------------------------------

void CudaDevice::graph_begin() {
    use();
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    capturing_ = true;
}

uintptr_t CudaDevice::graph_end() {
    use();
    join_side();  // (a capture ends with its forked lanes joined)
    capturing_ = false;
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(stream_, &g) != cudaSuccess || !g) {
        cudaGetLastError();
        if (g) cudaGraphDestroy(g);
        return 0;
    }
    cudaGraphExec_t ex = nullptr;
    const cudaError_t e = cudaGraphInstantiateWithFlags(&ex, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (uintptr_t)ex;
}

void CudaDevice::graph_launch(uintptr_t g) {
    use();
    OpTimer t(*this, "graph replay");
    if (step_gap_) time_replay(true);
    check(cudaGraphLaunch((cudaGraphExec_t)g, stream_), "cudaGraphLaunch");
    if (step_gap_) time_replay(false);
}

// StepGap: replay n's events in slot n % 3. Before replay n, replay n - 1 has finished (its step's download waited for
// it), so its span and the period from replay n - 2's start to its own are read without waiting. Steps that ran op by
// op between two replays (a capture, another shape) show as a long period: the window's median and minimum are printed.
void CudaDevice::time_replay(bool before) {
    StepGap &s = *step_gap_;
    const int cur = (int)(s.n % 3), prev = (int)((s.n + 2) % 3), prev2 = (int)((s.n + 1) % 3);
    if (!before) {
        check(cudaEventRecord(s.stop[cur], stream_), "cudaEventRecord");
        s.n++;
        return;
    }
    if (!s.start[0])  // (first use: the events)
        for (int i = 0; i < 3; i++) {
            check(cudaEventCreate(&s.start[i]), "cudaEventCreate");
            check(cudaEventCreate(&s.stop[i]), "cudaEventCreate");
        }
    float span = 0, period = 0;
    if (s.n >= 1 && cudaEventElapsedTime(&span, s.start[prev], s.stop[prev]) == cudaSuccess) s.span.push_back(span);
    if (s.n >= 2 && cudaEventElapsedTime(&period, s.start[prev2], s.start[prev]) == cudaSuccess) s.period.push_back(period);
    cudaGetLastError();  // (not ready: not counted)
    check(cudaEventRecord(s.start[cur], stream_), "cudaEventRecord");
    if ((int)s.period.size() < StepGap::kWindow) return;
    auto median = [](std::vector<float> v) {
        std::sort(v.begin(), v.end());
        return 1000.0 * v[v.size() / 2];
    };
    const double sp = median(s.span), pe = median(s.period);
    const double pmin = 1000.0 * *std::min_element(s.period.begin(), s.period.end());
    std::fprintf(stderr, "cuda step gap %s: %zu replays: graph span %.1f us, period %.1f us (min %.1f), between %.1f us "
                 "(median)\n", name_.c_str(), s.period.size(), sp, pe, pmin, pe - sp);
    s.span.clear();
    s.period.clear();
}

void CudaDevice::graph_free(uintptr_t g) {
    if (!g) return;
    use();
    cudaGraphExecDestroy((cudaGraphExec_t)g);
}

// --- profile -----------------------------------------------------------------------------------------------------

static const char *type_label(uint32_t t) {
    switch (t) {
    case DFL_TYPE_F32: return "f32";
    case DFL_TYPE_F16: return "f16";
    case DFL_TYPE_BF16: return "bf16";
    case DFL_TYPE_Q8_0: return "q8_0";
    case DFL_TYPE_Q4_0: return "q4_0";
    case DFL_TYPE_Q4_K: return "q4_K";
    case DFL_TYPE_Q6_K: return "q6_K";
    default: return "?";
    }
}

CudaDevice::OpTimer::OpTimer(CudaDevice &d, const char *op, const Weight *w, int64_t T) {
    if (!d.profiling_ || d.capturing_) return;
    d_ = &d;
    Pending p;
    p.op = op;
    if (w) {
        const int64_t tb = T <= 1 ? 1 : T <= 8 ? 8 : T <= 64 ? 64 : 512;
        p.op += std::string(" ") + type_label(w->type) + " " + std::to_string(w->n_out) + "x" + std::to_string(w->n_in) +
                " T<=" + std::to_string(tb);
    }
    for (cudaEvent_t *e : {&p.start, &p.stop}) {
        if (!d.spare_events_.empty()) {
            *e = d.spare_events_.back();
            d.spare_events_.pop_back();
        } else {
            check(cudaEventCreate(e), "cudaEventCreate");
        }
    }
    check(cudaEventRecord(p.start, d.stream_), "cudaEventRecord");
    d.pending_.push_back(std::move(p));
    slot_ = (int)d.pending_.size() - 1;
}

CudaDevice::OpTimer::~OpTimer() {
    if (d_ && slot_ >= 0) cudaEventRecord(d_->pending_[(size_t)slot_].stop, d_->stream_);
}

void CudaDevice::settle_profile() {
    for (Pending &p : pending_) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p.start, p.stop) == cudaSuccess) {
            auto &acc = op_ms_[p.op];
            acc.first += ms;
            acc.second++;
        }
        spare_events_.push_back(p.start);
        spare_events_.push_back(p.stop);
    }
    pending_.clear();
    cudaGetLastError();
}

void CudaDevice::print_profile() {
    std::vector<std::pair<std::string, std::pair<double, long>>> v(op_ms_.begin(), op_ms_.end());
    std::sort(v.begin(), v.end(), [](const auto &a, const auto &b) { return a.second.first > b.second.first; });
    double total = 0;
    for (const auto &x : v) total += x.second.first;
    std::fprintf(stderr, "cuda profile %s: %.1f ms of GPU time in ops\n", name_.c_str(), total);
    for (const auto &x : v)
        std::fprintf(stderr, "  %9.2f ms %5.1f%% %8ld calls %8.1f us/call  %s\n", x.second.first,
                     total > 0 ? 100 * x.second.first / total : 0, x.second.second,
                     1000 * x.second.first / (double)std::max<long>(1, x.second.second), x.first.c_str());
}

uint64_t CudaDevice::free_bytes() {
    use();
    size_t fr = 0, tot = 0;
    check(cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo");
    return fr;
}

const uint8_t *CudaDevice::upload_weight(const void *host, size_t bytes, bool must_copy) {
    void *p = alloc(bytes ? bytes : 1, "weight");
    weights_.push_back(p);
    if (bytes) {
        check(cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, stream_), "upload_weight");
        check(cudaStreamSynchronize(stream_), "upload_weight");
    }
    return (const uint8_t *)p;
}

void *CudaDevice::alloc_weight(size_t bytes, const char *what) {
    void *p = alloc(bytes ? bytes : 1, what);
    weights_.push_back(p);
    return p;
}

__global__ void q4_0_to_q8_0_kernel(const uint8_t *src, uint8_t *dst, int64_t n_blocks) {
    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < n_blocks; b += (int64_t)gridDim.x * blockDim.x)
        q4_0_block_to_q8_0(src + b * kQ4_0Bytes, dst + b * kQ8_0Bytes);
}

// The matrix's q4_0 blocks as q8_0 blocks of the same values, in a device copy of its own (the q4_0 upload stays: a
// tied embedding may read it). No kernel multiplies q4_0: as q8_0 every product path takes it, at q8_0's bytes.
static void q4_0_as_q8_0(CudaDevice &dev, Weight &w) {
    const int64_t nb = w.n_in / QK8_0, n_blocks = w.n_out * nb;
    uint8_t *q8 = (uint8_t *)dev.alloc_weight((size_t)n_blocks * kQ8_0Bytes, "q4_0 weights as q8_0");
    q4_0_to_q8_0_kernel<<<grid_for(n_blocks, 256), 256, 0, dev.stream()>>>(w.data, q8, n_blocks);
    check_launch("q4_0 weights as q8_0");
    w.data = q8;
    w.type = DFL_TYPE_Q8_0;
    w.row_bytes = (uint64_t)nb * kQ8_0Bytes;
}

void CudaDevice::check_stack(const Weight &w, const std::string &name) const {
    if (w.type == DFL_TYPE_Q4_0)
        fail(DFL_ERR_UNSUPPORTED, "tensor " + name + ": q4_0 expert stacks are not supported by the CUDA engine (the "
                                  "CPU engine runs them); convert the experts to q8_0, q4_K or q6_K");
}

// q4_0 matrices become q8_0 (q4_0_as_q8_0); q8_0 matrices get a second copy for the dp4a decode kernel (gemv_int8.cu);
// DFL_CUDA_REPACK=0 turns it off (the copy costs the q8_0 weights' size again in device memory).
void CudaDevice::prepare_weight(Weight &w) {
    if (w.type == DFL_TYPE_Q4_0) {
        use();
        q4_0_as_q8_0(*this, w);
    }
    static const bool on = env_switch("DFL_CUDA_REPACK", true);
    if (!on) return;
    use();
    repack_q8_0(*this, w);
}

void CudaDevice::embed(const Weight &W, const int32_t *tokens, int64_t T, float *out) {
    op("embed", [&] { launch_embed(stream_, W, tokens, T, out); });
}

template <class Launch>
void CudaDevice::product(const Weight &W, int64_t T, Launch launch) {
    // open if no device call came since the op that staged; whatever happens in the product, spent with it
    const StagedScope staged(*this);
    if (skip_op("matmul")) return;
    use();
    OpTimer t(*this, "matmul", &W, T);
    launch();
}

void CudaDevice::matmul(const Weight &W, const float *X, int64_t T, float *Y) {
    product(W, T, [&] { launch_matmul(*this, W, X, T, Y); });
}

void CudaDevice::matmul_parts(const Weight &W, const std::vector<std::pair<const Weight *, float *>> &parts,
                              const float *X, int64_t T) {
    // DFL_CUDA_GEMM_PARTS=0: each part multiplied alone, as before matmul_parts (for comparisons in one run)
    static const bool on = env_switch("DFL_CUDA_GEMM_PARTS", true);
    if (!on || !gemm_takes_parts(T)) {
        Device::matmul_parts(W, parts, X, T);
        return;
    }
    std::vector<GemmOut> outs;
    int64_t r0 = 0;
    for (const auto &p : parts) {
        outs.push_back(GemmOut{r0, p.first->n_out, p.second, p.first->n_out});
        r0 += p.first->n_out;
    }
    if (r0 != W.n_out) fail(DFL_ERR_INTERNAL, "matmul_parts: the parts' rows do not add up to the matrix's");
    product(W, T, [&] { launch_gemm(*this, W, X, T, outs); });
}

void CudaDevice::rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps) {
    op("rmsnorm", [&] {
        const QuantX q = stage_rows(y, rows, n);
        launch_rmsnorm(stream_, x, w, y, rows, n, eps, q);
    });
    staged_done();
}

void CudaDevice::add_rmsnorm(float *x, const float *d, const float *w, float *y, int64_t rows, int64_t n, float eps) {
    op("add_rmsnorm", [&] {
        const QuantX q = stage_rows(y, rows, n);
        launch_add_rmsnorm(stream_, x, d, w, y, rows, n, eps, q);
    });
    staged_done();
}

void CudaDevice::matmul_add_rmsnorm(const Weight &W, const float *X, int64_t T, float *d, float *x, const float *w,
                                    float *y, float eps, const Weight *next) {
    if (!resid_norm_takes(*this, W, T, next, y)) return Device::matmul_add_rmsnorm(W, X, T, d, x, w, y, eps, next);
    QuantX q;
    product(W, T, [&] { q = launch_resid_norm(*this, W, X, x, w, eps); });
    if (!q.xq) return;  // (DFL_CUDA_SKIP_OPS=matmul: nothing ran, y unwritten: garbage out, as skipped ops give)
    // staged for `next`, the very next call (its input y is never written): as a norm's staging, after the product's
    // own was spent
    staged_ = Staged{};
    staged_.x = y;
    staged_.count = W.n_out;
    staged_.q = q;
    staged_done();
}

void CudaDevice::add(float *x, const float *d, int64_t count) {
    op("add", [&] { launch_add(stream_, x, d, count); });
}

void CudaDevice::swiglu(float *g, const float *u, int64_t count) {
    op("swiglu", [&] { launch_swiglu(stream_, g, u, count, stage_quant(g, count)); });
    staged_done();
}

void CudaDevice::swiglu_rows(float *out, const float *g, const float *u, int64_t rows, int64_t n, int64_t stride) {
    op("swiglu", [&] { launch_swiglu_rows(stream_, out, g, u, rows, n, stride, stage_rows(out, rows, n)); });
    staged_done();
}

// Whether gated_rmsnorm and sigmoid_mul quantize their outputs for the product after them (the 27B's DeltaNet output
// and gated attention's o), as the norms and SwiGLU do (on unless DFL_CUDA_GATE_QUANT=0: a quantize_x launch before
// each of those products, for comparisons in one run). The same bytes either way (quant_q8_warp on the same floats).
static bool gate_quant_on() {
    static const bool on = env_switch("DFL_CUDA_GATE_QUANT", true);
    return on;
}

void CudaDevice::sigmoid_mul(float *a, const float *g, int64_t count) {
    op("sigmoid_mul",
       [&] { launch_sigmoid_mul(stream_, a, g, count, gate_quant_on() ? stage_quant(a, count) : stage_quant(nullptr, 0)); });
    staged_done();
}

void CudaDevice::scale_softcap(float *x, int64_t count, float scale, float cap) {
    op("scale_softcap", [&] { launch_scale_softcap(stream_, x, count, scale, cap); });
}

void CudaDevice::dyn_conv(const BatchMeta &m, const DynConvCall &c) {
    op("dyn_conv", [&] { launch_dyn_conv(stream_, m, c); });
}

void CudaDevice::selector_trans(const SelectorCall &s) {
    op("selector_trans", [&] { launch_selector_trans(stream_, s); });
}

void CudaDevice::gather_rows(const float *x, const int32_t *rows, int64_t R, int64_t n, float *out) {
    op("gather_rows", [&] { launch_gather_rows(stream_, x, rows, R, n, out); });
}

void CudaDevice::copy_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                           int64_t n) {
    if (rows <= 0 || n <= 0) return;
    use();
    OpTimer t(*this, "copy_rows");
    if (rows == 1) {  // any stride is valid for one row; cudaMemcpy2D would reject a stride below the width
        check(cudaMemcpyAsync(dst, src, (size_t)n * 4, cudaMemcpyDeviceToDevice, stream_), "copy_rows");
        return;
    }
    check(cudaMemcpy2DAsync(dst, (size_t)dst_stride * 4, src, (size_t)src_stride * 4, (size_t)n * 4, (size_t)rows,
                            cudaMemcpyDeviceToDevice, stream_),
          "copy_rows");
}

void CudaDevice::attn_prep(const BatchMeta &m, const AttnPrep &a) {
    op("attn_prep", [&] { launch_attn_prep(*this, m, a); });
}

void CudaDevice::attention(const BatchMeta &m, const AttnCall &a) {
    op("attention", [&] { launch_attention(*this, m, a); });
    staged_done();  // launch_attention may have staged its output's quantization
}

void CudaDevice::conv1d_silu(const BatchMeta &m, const ConvCall &c) {
    op("conv1d_silu", [&] { launch_conv1d_silu(stream_, m, c); });
}

void CudaDevice::matmul_conv1d_silu(const Weight &W, const float *X, int64_t T, float *Y, const BatchMeta &m,
                                    ConvCall c) {
    c.x = Y;
    c.x_stride = W.n_out;
    if (!conv_fold_takes(W, T, m, c)) return Device::matmul_conv1d_silu(W, X, T, Y, m, c);
    product(W, T, [&] { launch_conv_fold(*this, W, X, Y, m, c); });
}

void CudaDevice::gdn_gates(int64_t T, const GdnGates &g) {
    op("gdn_gates", [&] { launch_gdn_gates(stream_, T, g); });
}

void CudaDevice::gdn(const BatchMeta &m, const GdnCall &g) {
    op("gdn", [&] { launch_gdn(*this, m, g); });
}

void CudaDevice::record_gdn_inputs(const BatchMeta &m, const GdnInputs &r) {
    op("record_gdn_inputs", [&] { launch_record_gdn_inputs(stream_, m, r); });
}

void CudaDevice::gated_rmsnorm(float *x, const float *z, int64_t z_stride, const float *w, int64_t T, int64_t heads,
                               int64_t n, float eps) {
    op("gated_rmsnorm", [&] {
        // (a warp of the kernel holds one block of 32 of a head's row: n a multiple of 32)
        const QuantX q = gate_quant_on() && n % 32 == 0 ? stage_rows(x, T, heads * n) : stage_quant(nullptr, 0);
        launch_gated_rmsnorm(stream_, x, z, z_stride, w, T, heads, n, eps, q);
    });
    staged_done();
}

}  // namespace cuda

std::unique_ptr<Device> make_cuda_device(int index) { return std::make_unique<cuda::CudaDevice>(index); }

}  // namespace dfl

// CudaDevice: memory, copies and the dispatch of every op to its launcher on the device's stream.
#include <cstdio>

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
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cuda stream create");
    const cublasStatus_t bs = cublasCreate(&blas_);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        cudaStreamDestroy(stream_);
        fail(DFL_ERR_INTERNAL, std::string("cublasCreate: ") + blas_status_name(bs));
    }
    cublasSetStream(blas_, stream_);
}

CudaDevice::~CudaDevice() {
    cudaSetDevice(index_);
    if (stream_) cudaStreamSynchronize(stream_);
    for (void *p : weights_) cudaFree(p);
    if (scratch_) cudaFree(scratch_);
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
}

void CudaDevice::use() const { check(cudaSetDevice(index_), "cudaSetDevice"); }

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

void CudaDevice::to_device(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    use();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "to_device");
    // The source is host memory the caller may reuse at once; pageable copies are staged, but wait to be safe for
    // pinned memory too.
    check(cudaStreamSynchronize(stream_), "to_device");
}

void CudaDevice::to_host(void *dst, const void *src, size_t bytes) {
    use();
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "to_host");
    check(cudaStreamSynchronize(stream_), "to_host");
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
    check(cudaStreamSynchronize(stream_), "sync");
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

void *CudaDevice::scratch(size_t bytes) {
    if (bytes <= scratch_bytes_) return scratch_;
    if (scratch_) {
        check(cudaStreamSynchronize(stream_), "scratch");
        check(cudaFree(scratch_), "scratch");
        scratch_ = nullptr;
        scratch_bytes_ = 0;
    }
    // round up so a slowly growing batch does not reallocate every forward
    const size_t want = (bytes + (8u << 20) - 1) & ~(size_t)((8u << 20) - 1);
    scratch_ = alloc(want, "matmul scratch");
    scratch_bytes_ = want;
    return scratch_;
}

void CudaDevice::embed(const Weight &W, const int32_t *tokens, int64_t T, float *out) {
    use();
    launch_embed(stream_, W, tokens, T, out);
}

void CudaDevice::matmul(const Weight &W, const float *X, int64_t T, float *Y) {
    use();
    launch_matmul(*this, W, X, T, Y);
}

void CudaDevice::rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps) {
    use();
    launch_rmsnorm(stream_, x, w, y, rows, n, eps);
}

void CudaDevice::add_rmsnorm(float *x, const float *d, const float *w, float *y, int64_t rows, int64_t n, float eps) {
    use();
    launch_add_rmsnorm(stream_, x, d, w, y, rows, n, eps);
}

void CudaDevice::add(float *x, const float *d, int64_t count) {
    use();
    launch_add(stream_, x, d, count);
}

void CudaDevice::swiglu(float *g, const float *u, int64_t count) {
    use();
    launch_swiglu(stream_, g, u, count);
}

void CudaDevice::sigmoid_mul(float *a, const float *g, int64_t count) {
    use();
    launch_sigmoid_mul(stream_, a, g, count);
}

void CudaDevice::gather_rows(const float *x, const int32_t *rows, int64_t R, int64_t n, float *out) {
    use();
    launch_gather_rows(stream_, x, rows, R, n, out);
}

void CudaDevice::copy_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                           int64_t n) {
    if (rows <= 0 || n <= 0) return;
    use();
    if (rows == 1) {  // any stride is valid for one row; cudaMemcpy2D would reject a stride below the width
        check(cudaMemcpyAsync(dst, src, (size_t)n * 4, cudaMemcpyDeviceToDevice, stream_), "copy_rows");
        return;
    }
    check(cudaMemcpy2DAsync(dst, (size_t)dst_stride * 4, src, (size_t)src_stride * 4, (size_t)n * 4, (size_t)rows,
                            cudaMemcpyDeviceToDevice, stream_),
          "copy_rows");
}

void CudaDevice::attn_prep(const BatchMeta &m, const AttnPrep &a) {
    use();
    launch_attn_prep(stream_, m, a);
}

void CudaDevice::attention(const BatchMeta &m, const AttnCall &a) {
    use();
    launch_attention(*this, m, a);
}

void CudaDevice::conv1d_silu(const BatchMeta &m, const ConvCall &c) {
    use();
    launch_conv1d_silu(stream_, m, c);
}

void CudaDevice::gdn_gates(int64_t T, const GdnGates &g) {
    use();
    launch_gdn_gates(stream_, T, g);
}

void CudaDevice::gdn(const BatchMeta &m, const GdnCall &g) {
    use();
    launch_gdn(stream_, m, g);
}

void CudaDevice::gated_rmsnorm(float *x, const float *z, const float *w, int64_t rows, int64_t n, float eps) {
    use();
    launch_gated_rmsnorm(stream_, x, z, w, rows, n, eps);
}

}  // namespace cuda

std::unique_ptr<Device> make_cuda_device(int index) { return std::make_unique<cuda::CudaDevice>(index); }

}  // namespace dfl

// The weights of one model as its layer plan binds them: the caller's tensor table while loading, validated
// matrices and norm vectors, every host tensor uploaded once (a head tied to the embedding table, or a draft's
// borrowed head, shares one copy), and the device bytes they take. Every architecture binds its weights through it.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common.h"
#include "ops/device.h"

namespace dfl {

// "[d0, d1, ...]" of a tensor, for messages.
std::string dims_str(const dfl_tensor &t);
// "blk.<il>.<name>": a layer's tensor name.
inline std::string blk(int il, const char *name) { return "blk." + std::to_string(il) + "." + name; }
// The CPU worker threads a model's params ask for (0: every core), at most 256.
int threads_of(const dfl_model_params &p);
// The KV block size a model's params ask for (0: 16), after checking it and max_seqs (DFL_ERR_INVALID).
uint32_t kv_block_size_of(const dfl_model_params &p);
// DFL_ERR_UNSUPPORTED unless both are KV cache element types.
void check_cache_types(uint32_t type_k, uint32_t type_v);
// model_estimate's weight bytes: every tensor but those of blocks past n_layer (MTP blocks are not loaded), plus the
// device's own copy (prepare_weight) of each 2-D matrix that `copied` accepts.
// Batches of up to this many tokens multiply a fused matrix into one buffer (decode, verify blocks); larger ones
// (prefill) have each part's rows written to its own output (Device::matmul_parts).
constexpr int64_t kFusedMaxTokens = 64;
// Where a part of a product left its rows: row t at p + t * stride.
struct RowsView {
    float *p = nullptr;
    int64_t stride = 0;
};
// The products of x (T rows) with each part of outs (weight, its output), through `fused` (WeightStore::fuse) when
// it is not empty, into `scratch` (min(T, kFusedMaxTokens) x fused.n_out floats); returns where each part's rows are:
// in outs (stride the part's width), or inside scratch, fused.n_out apart, for batches of up to kFusedMaxTokens. The
// ops that read them take the stride, so no copy splits the parts out. fused_product (where set) runs the fused
// product in place of dev.matmul(fused, x, T, scratch), for an op that continues it (the DeltaNet's conv).
std::vector<RowsView> project_views(Device &dev, const Weight &fused,
                                    const std::vector<std::pair<const Weight *, float *>> &outs, const float *x, int64_t T,
                                    float *scratch,
                                    const std::function<void(const float *x, float *scratch)> &fused_product = {});
// project_views for readers of whole rows: the parts of 2..kFusedMaxTokens rows copied out of scratch into outs.
std::vector<float *> project(Device &dev, const Weight &fused, const std::vector<std::pair<const Weight *, float *>> &outs,
                             const float *x, int64_t T, float *scratch);
uint64_t estimate_weight_bytes(const dfl_model_params &p, int n_layer,
                               const std::function<bool(const dfl_tensor &)> &copied);

class WeightStore {
public:
    // Indexes the caller's tensors (each must have a name, data and 1..4 dims); dev must outlive the store.
    void init(Device *dev, const dfl_model_params &p);
    // Forgets the caller's table once the plan is bound (its data need not stay valid where the device copies).
    void done();

    const dfl_tensor *find(const std::string &name) const;
    // The tensor, or a DFL_ERR_INVALID naming it.
    const dfl_tensor &need(const std::string &name) const;
    // A 2-D weight [n_in, n_out] checked for type, shape, block alignment and size; a view of the caller's bytes
    // (upload it). A missing optional one is an empty Weight.
    Weight matrix(const std::string &name, int64_t n_in, int64_t n_out, bool optional = false) const;
    // A 3-D stack of n 2-D weights [n_in, n_out, n] (ggml order; MoE experts) as one Weight of n * n_out rows:
    // matrix e is rows [e * n_out, (e + 1) * n_out).
    Weight stack(const std::string &name, int64_t n_in, int64_t n_out, int64_t n) const;
    // Puts w's bytes on the device (once per host tensor) and points w at them.
    void upload(Weight &w);
    // A device copy of host bytes that are the model's own (e.g. matrices laid side by side).
    const uint8_t *upload_copy(const void *host, size_t bytes);
    // Matrices that read the same input (validated, still pointing at the caller's tensors) laid side by side in one
    // device matrix, so that one product reads them all, each part pointing at its rows there; the parts uploaded
    // one by one and an empty Weight where they differ in type or inputs, or the device keeps the caller's bytes
    // (Device::copies_weights) or DFL_FUSE_WEIGHTS=0. Either way what is multiplied (the result, or the parts) gets
    // the device's own layout (Device::prepare_weight).
    Weight fuse(const std::vector<Weight *> &parts);
    // A norm-like f32/f16/bf16 tensor of n0 x n1 elements (dims[0] = n0), converted to f32 on the device.
    const float *vec(const std::string &name, int64_t n0, int64_t n1 = 1);
    // vec's n1 rows of n0 as n0 rows of n1 (element (i, j) of the file at j n1 + i): e.g. conv taps tap by tap, so
    // that the devices' kernels read a tap's channels side by side.
    const float *vec_transposed(const std::string &name, int64_t n0, int64_t n1);
    // f32 values of the model's own (or a tensor's, counted as bytes_counted weight bytes) on the device.
    const float *floats(const std::vector<float> &v, const char *what, uint64_t bytes_counted = 0);

    uint64_t bytes() const { return bytes_; }

private:
    // vec's checks and its f32 values on the host
    std::vector<float> host_vec(const std::string &name, int64_t n0, int64_t n1) const;

    Device *dev_ = nullptr;
    std::map<std::string, const dfl_tensor *> tensors_;
    std::map<const void *, const uint8_t *> uploaded_;  // host tensor data -> device copy
    std::vector<DevBuf> owned_;                         // vectors the store allocated on the device
    bool copy_ = false;
    uint64_t bytes_ = 0;
};

}  // namespace dfl

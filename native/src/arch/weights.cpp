#include "arch/weights.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "quant.h"

namespace dfl {

std::string dims_str(const dfl_tensor &t) {
    std::string s = "[";
    for (uint32_t i = 0; i < t.n_dims; i++) s += (i ? ", " : "") + std::to_string(t.dims[i]);
    return s + "]";
}

int threads_of(const dfl_model_params &p) {
    if (p.n_threads > 0) return (int)std::min<uint32_t>(p.n_threads, 256);
    const unsigned hc = std::thread::hardware_concurrency();
    return hc == 0 ? 1 : (int)hc;
}

uint32_t kv_block_size_of(const dfl_model_params &p) {
    if (p.max_seqs == 0) fail(DFL_ERR_INVALID, "max_seqs must be at least 1");
    const uint32_t block_size = p.kv_block_size ? p.kv_block_size : 16;
    if (block_size > 4096) fail(DFL_ERR_INVALID, "kv_block_size " + std::to_string(block_size) + " is too large");
    return block_size;
}

void check_cache_types(uint32_t type_k, uint32_t type_v) {
    for (const auto &[which, type] : {std::pair<const char *, uint32_t>{"k", type_k}, {"v", type_v}})
        if (!cache_type_ok(type))
            fail(DFL_ERR_UNSUPPORTED, std::string("cache type ") + which + " " + type_name(type) + " is not supported");
}

uint64_t estimate_weight_bytes(const dfl_model_params &p, int n_layer,
                               const std::function<bool(const dfl_tensor &)> &copied) {
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < p.n_tensors; i++) {
        const dfl_tensor &t = p.tensors[i];
        if (!t.name) continue;
        int layer = -1;
        if (std::sscanf(t.name, "blk.%d.", &layer) == 1 && layer >= n_layer) continue;
        bytes += t.size;
        if (t.n_dims >= 2 && t.dims[1] > 1 && copied(t)) bytes += device_weight_copy_bytes(t.type, t.size);
    }
    return bytes;
}

void WeightStore::init(Device *dev, const dfl_model_params &p) {
    dev_ = dev;
    copy_ = (p.flags & DFL_LOAD_COPY_WEIGHTS) != 0;
    for (uint32_t i = 0; i < p.n_tensors; i++) {
        const dfl_tensor &t = p.tensors[i];
        if (!t.name) fail(DFL_ERR_INVALID, "tensor entry " + std::to_string(i) + " has no name");
        if (!t.data && t.size > 0) fail(DFL_ERR_INVALID, std::string("tensor ") + t.name + " has no data");
        if (t.n_dims < 1 || t.n_dims > 4) fail(DFL_ERR_INVALID, std::string("tensor ") + t.name + " has a bad dimension count");
        tensors_[t.name] = &t;
    }
}

void WeightStore::done() {
    tensors_.clear();
    uploaded_.clear();
}

const dfl_tensor *WeightStore::find(const std::string &name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : it->second;
}

const dfl_tensor &WeightStore::need(const std::string &name) const {
    const dfl_tensor *t = find(name);
    if (!t) fail(DFL_ERR_INVALID, "tensor " + name + " is missing");
    return *t;
}

Weight WeightStore::matrix(const std::string &name, int64_t n_in, int64_t n_out, bool optional) const {
    const dfl_tensor *t = find(name);
    if (!t) {
        if (optional) return Weight{};
        fail(DFL_ERR_INVALID, "tensor " + name + " is missing");
    }
    if (!weight_type_ok(t->type))
        fail(DFL_ERR_UNSUPPORTED, "tensor " + name + " has type " + std::to_string(t->type) + ", which this engine does not support");
    const bool shape_ok = t->dims[0] == (uint64_t)n_in && t->dims[1] == (uint64_t)n_out && t->dims[2] == 1 && t->dims[3] == 1;
    if (!shape_ok)
        fail(DFL_ERR_INVALID, "tensor " + name + " has shape " + dims_str(*t) + ", want [" + std::to_string(n_in) + ", " +
                                  std::to_string(n_out) + "]");
    if (n_in % type_block(t->type) != 0)
        fail(DFL_ERR_INVALID, "tensor " + name + ": row length " + std::to_string(n_in) + " is not a multiple of the " +
                                  type_name(t->type) + " block");
    Weight w;
    w.type = t->type;
    w.n_in = n_in;
    w.n_out = n_out;
    w.row_bytes = row_bytes(t->type, n_in);
    if (t->size < w.row_bytes * (uint64_t)n_out) fail(DFL_ERR_INVALID, "tensor " + name + " has too few bytes");
    w.data = (const uint8_t *)t->data;
    return w;
}

Weight WeightStore::stack(const std::string &name, int64_t n_in, int64_t n_out, int64_t n) const {
    const dfl_tensor &t = need(name);
    if (t.dims[0] != (uint64_t)n_in || t.dims[1] != (uint64_t)n_out || t.dims[2] != (uint64_t)n || t.dims[3] != 1)
        fail(DFL_ERR_INVALID, "tensor " + name + " has shape " + dims_str(t) + ", want [" + std::to_string(n_in) + ", " +
                                  std::to_string(n_out) + ", " + std::to_string(n) + "]");
    dfl_tensor flat = t;  // the same bytes seen as one matrix of n * n_out rows
    flat.n_dims = 2;
    flat.dims[1] = (uint64_t)(n_out * n);
    flat.dims[2] = 1;
    WeightStore one;
    one.tensors_[name] = &flat;
    return one.matrix(name, n_in, n_out * n);
}

void WeightStore::upload(Weight &w) {
    if (w.empty()) return;
    auto it = uploaded_.find(w.data);
    if (it != uploaded_.end()) {
        w.data = it->second;
        return;
    }
    const uint64_t bytes = w.row_bytes * (uint64_t)w.n_out;
    const uint8_t *host = w.data;
    w.data = dev_->upload_weight(host, bytes, copy_);
    uploaded_[host] = w.data;
    bytes_ += bytes;
}

Weight WeightStore::fuse(const std::vector<Weight *> &parts) {
    // DFL_FUSE_WEIGHTS=0 keeps every part apart: the products one by one, for comparisons in one run
    static const bool on = env_switch("DFL_FUSE_WEIGHTS", true);
    bool same = on && dev_->copies_weights();
    for (const Weight *p : parts) same = same && p->type == parts[0]->type && p->n_in == parts[0]->n_in;
    if (!same || parts.size() < 2) {
        for (Weight *p : parts) {
            upload(*p);
            dev_->prepare_weight(*p);
        }
        return Weight{};
    }
    Weight f = *parts[0];
    f.n_out = 0;
    for (const Weight *p : parts) f.n_out += p->n_out;
    std::vector<uint8_t> host((size_t)(f.row_bytes * (uint64_t)f.n_out));
    uint64_t off = 0;
    for (const Weight *p : parts) {
        const uint64_t n = p->row_bytes * (uint64_t)p->n_out;
        std::memcpy(host.data() + off, p->data, (size_t)n);
        off += n;
    }
    f.data = upload_copy(host.data(), host.size());
    off = 0;
    for (Weight *p : parts) {
        p->data = f.data + off;
        off += p->row_bytes * (uint64_t)p->n_out;
    }
    dev_->prepare_weight(f);
    return f;
}

// The parts whose rows are not their own (views of T > 1 rows inside a wider buffer) copied into their outputs.
static std::vector<RowsView> own_rows(Device &dev, const std::vector<std::pair<const Weight *, float *>> &outs,
                                      std::vector<RowsView> views, int64_t T) {
    for (size_t i = 0; i < outs.size(); i++) {
        const int64_t n = outs[i].first->n_out;
        if (T == 1 || views[i].stride == n) continue;  // one row, or rows of their own: already contiguous
        dev.copy_rows(outs[i].second, n, views[i].p, views[i].stride, T, n);
        views[i] = RowsView{outs[i].second, n};
    }
    return views;
}

std::vector<RowsView> project_views(Device &dev, const Weight &fused,
                                    const std::vector<std::pair<const Weight *, float *>> &outs, const float *x, int64_t T,
                                    float *scratch, const std::function<void(const float *x, float *scratch)> &fused_product) {
    std::vector<RowsView> where;
    if (fused.empty() || T > kFusedMaxTokens) {  // each part's rows written to its own output
        if (fused.empty())
            dev.matmul_each(outs, x, T);
        else
            dev.matmul_parts(fused, outs, x, T);
        for (const auto &o : outs) where.push_back(RowsView{o.second, o.first->n_out});
        return where;
    }
    if (fused_product)
        fused_product(x, scratch);
    else
        dev.matmul(fused, x, T, scratch);
    // DFL_FUSED_VIEWS=0: each part's rows copied out of scratch into its output (as before 12-05), for comparisons in
    // one run
    static const bool views = env_switch("DFL_FUSED_VIEWS", true);
    int64_t off = 0;
    for (const auto &o : outs) {
        where.push_back(RowsView{scratch + off, fused.n_out});
        off += o.first->n_out;
    }
    return views ? where : own_rows(dev, outs, where, T);
}

std::vector<float *> project(Device &dev, const Weight &fused, const std::vector<std::pair<const Weight *, float *>> &outs,
                             const float *x, int64_t T, float *scratch) {
    std::vector<float *> where;
    for (const RowsView &v : own_rows(dev, outs, project_views(dev, fused, outs, x, T, scratch), T)) where.push_back(v.p);
    return where;
}

const uint8_t *WeightStore::upload_copy(const void *host, size_t bytes) {
    bytes_ += bytes;
    return dev_->upload_weight(host, bytes, true);
}

const float *WeightStore::vec(const std::string &name, int64_t n0, int64_t n1) {
    const std::vector<float> v = host_vec(name, n0, n1);
    return floats(v, name.c_str(), v.size() * (uint64_t)type_block_bytes(need(name).type));
}

const float *WeightStore::vec_transposed(const std::string &name, int64_t n0, int64_t n1) {
    const std::vector<float> v = host_vec(name, n0, n1);
    std::vector<float> t(v.size());
    for (int64_t i = 0; i < n1; i++)
        for (int64_t j = 0; j < n0; j++) t[(size_t)(j * n1 + i)] = v[(size_t)(i * n0 + j)];
    return floats(t, name.c_str(), v.size() * (uint64_t)type_block_bytes(need(name).type));
}

std::vector<float> WeightStore::host_vec(const std::string &name, int64_t n0, int64_t n1) const {
    const dfl_tensor &t = need(name);
    uint64_t n = 1;
    for (uint32_t i = 0; i < t.n_dims; i++) n *= t.dims[i];
    if (n != (uint64_t)(n0 * n1) || t.dims[0] != (uint64_t)n0)
        fail(DFL_ERR_INVALID, "tensor " + name + " has shape " + dims_str(t) + ", want [" + std::to_string(n0) +
                                  (n1 > 1 ? ", " + std::to_string(n1) : "") + "]");
    if (t.type != DFL_TYPE_F32 && t.type != DFL_TYPE_F16 && t.type != DFL_TYPE_BF16)
        fail(DFL_ERR_UNSUPPORTED, "tensor " + name + " must be f32, f16 or bf16");
    if (t.size < n * (uint64_t)type_block_bytes(t.type)) fail(DFL_ERR_INVALID, "tensor " + name + " has too few bytes");
    std::vector<float> v((size_t)n);
    dequant_row(t.type, t.data, v.data(), (int64_t)n);
    return v;
}

const float *WeightStore::floats(const std::vector<float> &v, const char *what, uint64_t bytes_counted) {
    bytes_ += bytes_counted;
    owned_.emplace_back(dev_, v.size() * sizeof(float), what);
    dev_->to_device(owned_.back().get(), v.data(), v.size() * sizeof(float));
    return owned_.back().f();
}

}  // namespace dfl

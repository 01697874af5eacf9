#include "arch/kvpool.h"

#include <string>

#include "quant.h"

namespace dfl {

void KVPool::init(Device *dev, uint32_t type_k, uint32_t type_v, int n_layers, uint64_t pool_rows, int n_kv,
                  int head_dim, int block_size, const char *what) {
    if (n_layers > 0 && (head_dim % type_block(type_k) != 0 || head_dim % type_block(type_v) != 0))
        fail(DFL_ERR_INVALID, "head_dim " + std::to_string(head_dim) + " is not a multiple of the cache type's block");
    type_k_ = type_k;
    type_v_ = type_v;
    n_kv_ = n_kv;
    head_dim_ = head_dim;
    block_size_ = block_size;
    k_row_ = row_bytes(type_k, head_dim);
    v_row_ = row_bytes(type_v, head_dim);
    const std::string wk = std::string(what) + " (K)", wv = std::string(what) + " (V)";
    for (int i = 0; i < n_layers; i++) {
        k_.emplace_back(dev, pool_rows * (uint64_t)n_kv * k_row_, wk.c_str());
        v_.emplace_back(dev, pool_rows * (uint64_t)n_kv * v_row_, wv.c_str());
    }
}

KVLayer KVPool::layer(int il) const {
    KVLayer kv;
    kv.k = k(il);
    kv.v = v(il);
    kv.type_k = type_k_;
    kv.type_v = type_v_;
    kv.k_row = k_row_;
    kv.v_row = v_row_;
    kv.n_kv = n_kv_;
    kv.head_dim = head_dim_;
    kv.block_size = block_size_;
    return kv;
}

}  // namespace dfl

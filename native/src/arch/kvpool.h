// The paged KV cache of a layer plan's attention layers, shared by the Qwen and DFlash plans.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/device.h"

namespace dfl {

// A K and a V pool per attention layer, each row one (pool row, KV head) of head_dim elements of the cache types.
class KVPool {
public:
    // Pools of pool_rows x n_kv rows for n_layers layers (not zero-filled: rows are written before they are read);
    // DFL_ERR_INVALID where n_layers > 0 and head_dim is not a multiple of both cache types' blocks. what: "KV pool"
    // or the like, for out-of-memory messages.
    void init(Device *dev, uint32_t type_k, uint32_t type_v, int n_layers, uint64_t pool_rows, int n_kv, int head_dim,
              int block_size, const char *what);

    // Layer il's pools as the attention ops take them.
    KVLayer layer(int il) const;
    uint8_t *k(int il) const { return k_[(size_t)il].get<uint8_t>(); }
    uint8_t *v(int il) const { return v_[(size_t)il].get<uint8_t>(); }
    // Bytes of one pool row's K (and V) over all KV heads, and of one token over all layers.
    uint64_t k_bytes() const { return k_row_ * (uint64_t)n_kv_; }
    uint64_t v_bytes() const { return v_row_ * (uint64_t)n_kv_; }
    uint64_t bytes_per_token() const { return (uint64_t)k_.size() * (k_bytes() + v_bytes()); }
    uint32_t type_k() const { return type_k_; }
    uint32_t type_v() const { return type_v_; }

private:
    uint32_t type_k_ = DFL_TYPE_F32, type_v_ = DFL_TYPE_F32;
    uint64_t k_row_ = 0, v_row_ = 0;
    int n_kv_ = 0, head_dim_ = 0, block_size_ = 0;
    std::vector<DevBuf> k_, v_;
};

}  // namespace dfl

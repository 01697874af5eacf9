// seq_export / seq_import of the Qwen models: a sequence's K/V rows and recurrent slot as one self-describing blob
// (a disk prefix cache stores it as is).
//
// Blob layout (host byte order; little-endian on every platform the engine builds for):
//   SeqBlobHeader (144 bytes)
//   for each attention layer l (in layer order): K rows of positions 0..n-1 ([n][n_kv] rows in cache type k), then
//     V rows of positions 0..n-1 (cache type v)
//   the recurrent slot: slot_bytes of f32 (every Gated DeltaNet layer's [n_v][dk][dv] state, then every layer's
//     [K-1][C] conv window; the layout of states_)
// The header carries a checksum of itself and of the payload, so a truncated or damaged blob is refused.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "arch/qwen.h"
#include "quant.h"

namespace dfl {

namespace {

constexpr char kMagic[8] = {'D', 'F', 'L', 'S', 'E', 'Q', '\0', '\0'};
constexpr uint32_t kFormat = 1;

struct SeqBlobHeader {
    char magic[8];
    uint32_t format;
    uint32_t header_bytes;
    char arch[16];
    uint32_t n_layer, n_embd, n_vocab, n_attn, n_rec, n_kv, head_dim, type_k, type_v;
    uint32_t n_v, dk, dv, conv_k, conv_channels;
    uint32_t n_tokens, reserved;
    uint64_t k_bytes, v_bytes;  // K (V) bytes of one token of one attention layer, all KV heads
    uint64_t slot_bytes;        // recurrent + conv state
    uint64_t payload_bytes;     // bytes after the header
    uint64_t payload_hash;
    uint64_t header_hash;  // of the header bytes before this field
};
static_assert(sizeof(SeqBlobHeader) == 144, "SeqBlobHeader layout");

// A 64-bit checksum (four interleaved multiply-xorshift lanes): not cryptographic, catches damaged bytes.
uint64_t checksum(const void *data, uint64_t n) {
    const uint8_t *p = (const uint8_t *)data;
    const uint64_t k = 0x9E3779B97F4A7C15ull;
    uint64_t h[4] = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull, 0x082EFA98EC4E6C89ull};
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int j = 0; j < 4; j++) {
            uint64_t w;
            std::memcpy(&w, p + i + 8 * j, 8);
            h[j] = (h[j] ^ w) * k;
            h[j] ^= h[j] >> 29;
        }
    }
    uint64_t r = n * k;
    for (int j = 0; j < 4; j++) r = (r ^ h[j]) * k, r ^= r >> 31;
    for (; i < n; i++) r = (r ^ p[i]) * 0x100000001B3ull;
    r ^= r >> 33;
    r *= 0xFF51AFD7ED558CCDull;
    r ^= r >> 33;
    return r;
}

std::string type_str(uint32_t t) {
    const char *n = type_name(t);
    return n ? std::string(n) : "type " + std::to_string(t);
}

}  // namespace

// The header of a blob of sequence length n of this model (hashes not yet set).
static SeqBlobHeader header_of(const HParams &hp, int n_attn, int n_rec, uint32_t type_k, uint32_t type_v,
                               uint64_t k_bytes, uint64_t v_bytes, uint64_t slot_bytes, uint32_t n) {
    SeqBlobHeader h;
    std::memset(&h, 0, sizeof h);
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.format = kFormat;
    h.header_bytes = sizeof h;
    std::strncpy(h.arch, hp.arch.c_str(), sizeof h.arch - 1);
    h.n_layer = (uint32_t)hp.n_layer;
    h.n_embd = (uint32_t)hp.n_embd;
    h.n_vocab = (uint32_t)hp.n_vocab;
    h.n_attn = (uint32_t)n_attn;
    h.n_rec = (uint32_t)n_rec;
    h.n_kv = n_attn > 0 ? (uint32_t)hp.n_kv : 0;
    h.head_dim = n_attn > 0 ? (uint32_t)hp.head_dim : 0;
    h.type_k = n_attn > 0 ? type_k : 0;
    h.type_v = n_attn > 0 ? type_v : 0;
    if (n_rec > 0) {
        h.n_v = (uint32_t)hp.n_v;
        h.dk = (uint32_t)hp.dk;
        h.dv = (uint32_t)hp.dv;
        h.conv_k = (uint32_t)hp.conv_k;
        h.conv_channels = (uint32_t)hp.conv_channels();
    }
    h.n_tokens = n;
    h.k_bytes = n_attn > 0 ? k_bytes : 0;
    h.v_bytes = n_attn > 0 ? v_bytes : 0;
    h.slot_bytes = slot_bytes;
    h.payload_bytes = (uint64_t)n_attn * (uint64_t)n * (h.k_bytes + h.v_bytes) + slot_bytes;
    return h;
}

uint64_t QwenModel::seq_export(int32_t s, void *buf, uint64_t size) {
    const Seq &q = table_.get(s);
    const std::string who = "sequence " + std::to_string(s);
    if (q.tree) fail(DFL_ERR_STATE, who + " holds an unresolved tree forward (seq_accept_path, seq_truncate or seq_rollback first)");
    const uint64_t kb = kv_.k_bytes(), vb = kv_.v_bytes();
    const uint64_t slot_bytes = (uint64_t)slot_floats() * sizeof(float);
    SeqBlobHeader h = header_of(hp_, n_attn_, n_rec_, kv_.type_k(), kv_.type_v(), kb, vb, slot_bytes, q.len);
    const uint64_t needed = sizeof h + h.payload_bytes;
    if (!buf || size < needed) return needed;

    uint8_t *out = (uint8_t *)buf + sizeof h;
    const uint32_t bs = table_.block_size(), n = q.len;
    const uint32_t nb = table_.blocks_for(n);
    for (int l = 0; l < n_attn_; l++) {
        for (int kv = 0; kv < 2; kv++) {
            const uint8_t *pool = (kv == 0 ? kv_.k(l) : kv_.v(l));
            const uint64_t rb = kv == 0 ? kb : vb;
            // one copy per run of consecutive pool blocks (usually the whole sequence)
            for (uint32_t i = 0; i < nb;) {
                uint32_t j = i + 1;
                while (j < nb && q.blocks[j] == q.blocks[j - 1] + 1) j++;
                const uint64_t rows = std::min<uint64_t>((uint64_t)(j - i) * bs, (uint64_t)n - (uint64_t)i * bs);
                dev_->to_host(out, pool + (uint64_t)q.blocks[i] * bs * rb, rows * rb);
                out += rows * rb;
                i = j;
            }
        }
    }
    if (slot_bytes > 0) {
        settle(s);  // (the slot as the sequence's length says)
        dev_->to_host(out, slot_ptr(s), slot_bytes);
        out += slot_bytes;
    }
    h.payload_hash = checksum((const uint8_t *)buf + sizeof h, h.payload_bytes);
    h.header_hash = checksum(&h, offsetof(SeqBlobHeader, header_hash));
    std::memcpy(buf, &h, sizeof h);
    return needed;
}

void QwenModel::seq_import(int32_t s, const void *buf, uint64_t size) {
    Seq &q = table_.get(s);
    const std::string who = "sequence " + std::to_string(s);
    if (q.len != 0) fail(DFL_ERR_STATE, who + " is not empty (" + std::to_string(q.len) + " tokens); import needs a new sequence");
    SeqBlobHeader h;
    if (size < sizeof h)
        fail(DFL_ERR_INVALID, "blob truncated: " + std::to_string(size) + " bytes, its header alone takes " +
                                  std::to_string(sizeof h));
    if (!buf) fail(DFL_ERR_INVALID, "blob is null");
    std::memcpy(&h, buf, sizeof h);
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) fail(DFL_ERR_INVALID, "not a sequence blob (bad magic)");
    if (h.format != kFormat)
        fail(DFL_ERR_INVALID, "blob format " + std::to_string(h.format) + ", this library reads format " + std::to_string(kFormat) +
                                  " (a blob of another library version, or a corrupt blob header)");
    if (h.header_bytes != sizeof h)
        fail(DFL_ERR_INVALID, "corrupt blob header: header size " + std::to_string(h.header_bytes) + ", expected " +
                                  std::to_string(sizeof h));
    if (checksum(&h, offsetof(SeqBlobHeader, header_hash)) != h.header_hash)
        fail(DFL_ERR_INVALID, "corrupt blob header: checksum mismatch");

    const uint64_t kb = kv_.k_bytes(), vb = kv_.v_bytes();
    const uint64_t slot_bytes = (uint64_t)slot_floats() * sizeof(float);
    const SeqBlobHeader want = header_of(hp_, n_attn_, n_rec_, kv_.type_k(), kv_.type_v(), kb, vb, slot_bytes, h.n_tokens);
    std::string diff;
    auto cmp = [&](const char *what, uint64_t got, uint64_t mine) {
        if (got != mine) diff += std::string(diff.empty() ? "" : ", ") + what + " " + std::to_string(got) + " (model " + std::to_string(mine) + ")";
    };
    auto cmp_type = [&](const char *what, uint32_t got, uint32_t mine) {
        if (got != mine) diff += std::string(diff.empty() ? "" : ", ") + what + " " + type_str(got) + " (model " + type_str(mine) + ")";
    };
    char arch[sizeof h.arch + 1] = {0};
    std::memcpy(arch, h.arch, sizeof h.arch);
    if (std::strncmp(h.arch, want.arch, sizeof h.arch) != 0)
        diff += std::string("arch ") + arch + " (model " + hp_.arch + ")";
    cmp("n_layer", h.n_layer, want.n_layer);
    cmp("n_embd", h.n_embd, want.n_embd);
    cmp("n_vocab", h.n_vocab, want.n_vocab);
    cmp("attention layers", h.n_attn, want.n_attn);
    cmp("recurrent layers", h.n_rec, want.n_rec);
    cmp("n_head_kv", h.n_kv, want.n_kv);
    cmp("head_dim", h.head_dim, want.head_dim);
    cmp_type("cache type k", h.type_k, want.type_k);
    cmp_type("cache type v", h.type_v, want.type_v);
    cmp("ssm n_v", h.n_v, want.n_v);
    cmp("ssm dk", h.dk, want.dk);
    cmp("ssm dv", h.dv, want.dv);
    cmp("conv kernel", h.conv_k, want.conv_k);
    cmp("conv channels", h.conv_channels, want.conv_channels);
    if (diff.empty()) {  // derived sizes (they follow from the above unless the header is inconsistent)
        cmp("K bytes per token", h.k_bytes, want.k_bytes);
        cmp("V bytes per token", h.v_bytes, want.v_bytes);
        cmp("state bytes", h.slot_bytes, want.slot_bytes);
        cmp("payload bytes", h.payload_bytes, want.payload_bytes);
    }
    if (!diff.empty()) fail(DFL_ERR_INVALID, "blob does not fit this model: " + diff);
    if (size - sizeof h != h.payload_bytes)
        fail(DFL_ERR_INVALID, std::string(size - sizeof h < h.payload_bytes ? "blob truncated" : "blob too long") + ": " +
                                  std::to_string(size - sizeof h) + " payload bytes, its header says " +
                                  std::to_string(h.payload_bytes) + " (" + std::to_string(h.n_tokens) + " tokens)");
    const uint8_t *in = (const uint8_t *)buf + sizeof h;
    if (checksum(in, h.payload_bytes) != h.payload_hash) fail(DFL_ERR_INVALID, "corrupt blob: payload checksum mismatch");

    const uint32_t n = h.n_tokens;
    table_.grow(q, n);  // DFL_ERR_NO_KV, changing nothing, when the pool is short
    const uint32_t bs = table_.block_size(), nb = table_.blocks_for(n);
    try {
        for (int l = 0; l < n_attn_; l++) {
            for (int kv = 0; kv < 2; kv++) {
                uint8_t *pool = (kv == 0 ? kv_.k(l) : kv_.v(l));
                const uint64_t rb = kv == 0 ? kb : vb;
                for (uint32_t i = 0; i < nb;) {
                    uint32_t j = i + 1;
                    while (j < nb && q.blocks[j] == q.blocks[j - 1] + 1) j++;
                    const uint64_t rows = std::min<uint64_t>((uint64_t)(j - i) * bs, (uint64_t)n - (uint64_t)i * bs);
                    dev_->to_device(pool + (uint64_t)q.blocks[i] * bs * rb, in, rows * rb);
                    in += rows * rb;
                    i = j;
                }
            }
        }
        if (slot_bytes > 0) dev_->to_device(slot_ptr(s), in, slot_bytes);
        dev_->sync();
    } catch (...) {
        table_.trim(q);  // give back what grow took (the sequence is still empty)
        throw;
    }
    q.len = n;
    q.rec = false;
    q.rec_pending = false;
    q.tree = false;
    if (q.snap && q.snap_len > 0) q.snap = false;
}

}  // namespace dfl

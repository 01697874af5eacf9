// The CPU device: the op table on host memory, run by a thread pool. The reference every other device is tested
// against; the layer plans drive it exactly as they drive the GPU.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include <sys/mman.h>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/ds4_ops.h"
#include "ops/cpu/qgemm.h"

namespace dfl {

namespace {

// Wall time of each op, summed by op (and product shape) and printed to stderr when the device is freed, with
// DFLASH_CPU_PROFILE=1: where a step's time goes at a thread count perf cannot be run at (the GPU host's 16 cores).
class OpClock {
public:
    OpClock() {
        const char *e = std::getenv("DFLASH_CPU_PROFILE");
        on_ = e && *e && std::strcmp(e, "0") != 0;
    }
    ~OpClock() {
        if (!on_ || ops_.empty()) return;
        std::vector<std::pair<std::string, Entry>> rows(ops_.begin(), ops_.end());
        double total = 0;
        for (const auto &r : rows) total += r.second.seconds;
        std::sort(rows.begin(), rows.end(), [](const auto &a, const auto &b) { return a.second.seconds > b.second.seconds; });
        std::fprintf(stderr, "cpu profile (DFLASH_CPU_PROFILE): %.1f ms in ops\n%-28s %9s %11s %9s %6s\n", total * 1e3, "op",
                     "calls", "total ms", "us/call", "share");
        for (const auto &r : rows)
            std::fprintf(stderr, "%-28s %9lld %11.2f %9.2f %5.1f%%\n", r.first.c_str(), (long long)r.second.calls,
                         r.second.seconds * 1e3, r.second.seconds * 1e6 / (double)r.second.calls,
                         100 * r.second.seconds / total);
    }
    bool on() const { return on_; }
    void add(const char *op, int64_t rows, int64_t cols, double seconds) {
        std::string key = op;
        if (rows > 0) key += " " + std::to_string(rows) + "x" + std::to_string(cols);
        Entry &e = ops_[key];
        e.calls++;
        e.seconds += seconds;
    }

private:
    struct Entry {
        int64_t calls = 0;
        double seconds = 0;
    };
    bool on_ = false;
    std::map<std::string, Entry> ops_;
};

// One op's time on an OpClock (nothing when profiling is off).
class OpScope {
public:
    OpScope(OpClock &clock, const char *op, int64_t rows = 0, int64_t cols = 0)
        : clock_(clock), op_(op), rows_(rows), cols_(cols) {
        if (clock_.on()) t0_ = std::chrono::steady_clock::now();
    }
    ~OpScope() {
        if (clock_.on())
            clock_.add(op_, rows_, cols_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
    }
    OpScope(const OpScope &) = delete;
    OpScope &operator=(const OpScope &) = delete;

private:
    OpClock &clock_;
    const char *op_;
    int64_t rows_, cols_;
    std::chrono::steady_clock::time_point t0_;
};

class CpuDevice final : public Device {
public:
    explicit CpuDevice(int n_threads) : fuse_(env_is("DFLASH_CPU_FUSE", "1")), pool_(n_threads), scratch_(n_threads) {}

    std::string name() const override { return "cpu"; }

    // Buffers of 2 MB and more (the KV pool, the recurrent states, activations) are touched here, at load, in
    // transparent huge pages where the kernel's THP setting is "madvise". The KV pool is written a row at a time as
    // sequences grow: untouched, each fresh page cost a fault inside a decode step (perf stat: 28 a Qwen3-0.6B step,
    // one a layer; attn_prep took 34 us a call on the 2-core VM, where its work is ~2 us, and 65 us with huge pages
    // faulted in one at a time). Zeroed here, the memory is committed up front, as llama.cpp commits its KV cache.
    void *alloc(size_t bytes, const char *what) override {
        constexpr size_t kHuge = 2u << 20;
        void *p = nullptr;
        if (bytes >= kHuge) {
            const size_t size = (bytes + kHuge - 1) / kHuge * kHuge;
            p = std::aligned_alloc(kHuge, size);
            if (p) {
                madvise(p, size, MADV_HUGEPAGE);  // advice: refused or ignored, the pages stay 4 KB
                const int64_t pages = (int64_t)(size / kHuge);
                pool_.parallel_for(pages, [&](int64_t i, int) { std::memset((uint8_t *)p + i * kHuge, 0, kHuge); });
            }
        } else {
            p = std::malloc(bytes ? bytes : 1);
        }
        if (!p) {
            uint64_t free = 0, total = 0;
            host_memory(&free, &total);
            fail(DFL_ERR_NO_MEMORY, std::string("cannot allocate ") + what + ": " + std::to_string(bytes) +
                                        " bytes asked, " + std::to_string(free) + " bytes free");
        }
        return p;
    }
    void release(void *p) override { std::free(p); }
    void to_device(void *dst, const void *src, size_t n) override { std::memcpy(dst, src, n); }
    void to_host(void *dst, const void *src, size_t n) override { std::memcpy(dst, src, n); }
    void copy(void *dst, const void *src, size_t n) override { std::memmove(dst, src, n); }
    void zero(void *dst, size_t n) override { std::memset(dst, 0, n); }
    void sync() override {}
    uint64_t free_bytes() override {
        uint64_t free = 0, total = 0;
        host_memory(&free, &total);
        return free;
    }
    const uint8_t *upload_weight(const void *host, size_t bytes, bool must_copy) override {
        if (!must_copy) return (const uint8_t *)host;  // the caller's mapping stays valid until model_free
        copies_.emplace_back(new (std::nothrow) uint8_t[bytes]);
        if (!copies_.back()) fail(DFL_ERR_NO_MEMORY, "cannot copy a weight of " + std::to_string(bytes) + " bytes");
        std::memcpy(copies_.back().get(), host, bytes);
        return copies_.back().get();
    }

    // The CPU reads a product's parts where they lie (q, k and v: three matrices, one region). DFLASH_CPU_FUSE=1 (read
    // when the device is made, at load) copies them into one matrix as the GPU does, so a test can run the plans'
    // fused paths here; the answer stays the model's, as the plans ask again when their activations grow.
    bool copies_weights() const override { return fuse_; }

    // The AVX-512 integer kernels read q8_0 / q4_K matrices in their own layout (16 rows interleaved, qgemm.h), the
    // same size as the original. Packing at load saves repacking every group in every product (decode would repack
    // each weight once per token). The original stays mapped for embedding lookups and the other kernel sets.
    // The groups of 16 rows are packed apart (int8_pack_group_bytes each), so a row range starting on a group reads
    // its slice of the packed copy (Weight::rows): a grouped projection's groups, an expert of a stack.
    void prepare_weight(Weight &W) override {
        const uint64_t bytes = int8_packed_bytes(W);
        if (bytes == 0 || W.packed != nullptr) return;
        uint8_t *dst = pack_buffer(bytes);
        if (dst == nullptr) fail(DFL_ERR_NO_MEMORY, "cannot pack a weight of " + std::to_string(bytes) + " bytes");
        const int64_t groups = int8_pack_group_count(W), per_task = 64;
        pool_.parallel_for(ceil_div(groups, per_task), [&](int64_t task, int) {
            int8_pack_groups(W, task * per_task, std::min(groups, (task + 1) * per_task), dst);
        });
        W.packed = dst;
        W.packed_group = kInt8GroupRows;
        W.packed_group_bytes = int8_pack_group_bytes(W);
    }

    void embed(const Weight &W, const int32_t *tokens, int64_t T, float *out) override {
        const OpScope timed(clock_, "embed");
        pool_.parallel_for(T, [&](int64_t t, int) { get_row(W, tokens[t], out + t * W.n_in); });
    }
    void matmul(const Weight &W, const float *X, int64_t T, float *Y) override {
        const OpScope timed(clock_, "matmul", W.n_out, W.n_in);
        dfl::matmul(pool_, scratch_, W, X, T, Y);
    }
    void matmul_each(const MatmulParts &parts, const float *X, int64_t T) override {
        int64_t rows = 0;
        for (const auto &p : parts) rows += p.first->n_out;
        const OpScope timed(clock_, "matmul_each", rows, parts.empty() ? 0 : parts[0].first->n_in);
        dfl::matmul_each(pool_, scratch_, parts, X, T);
    }
    void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps) override {
        const OpScope timed(clock_, "rmsnorm");
        pool_.parallel_for(rows, [&](int64_t r, int) { dfl::rmsnorm(x + r * n, w, y + r * n, n, eps); });
    }
    void add_rmsnorm(float *x, const float *d, const float *w, float *y, int64_t rows, int64_t n, float eps) override {
        const OpScope timed(clock_, "add_rmsnorm");
        pool_.parallel_for(rows, [&](int64_t r, int) {
            float *xr = x + r * n;
            const float *dr = d + r * n;
            for (int64_t i = 0; i < n; i++) xr[i] += dr[i];
            dfl::rmsnorm(xr, w, y + r * n, n, eps);
        });
    }
    void add(float *x, const float *d, int64_t count) override {
        const OpScope timed(clock_, "add");
        for_chunks(count, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; i++) x[i] += d[i];
        });
    }
    void swiglu(float *g, const float *u, int64_t count) override {
        const OpScope timed(clock_, "swiglu");
        for_chunks(count, [&](int64_t i0, int64_t i1) { dfl::swiglu(g + i0, u + i0, i1 - i0); }, kExpChunk);
    }
    void swiglu_rows(float *out, const float *g, const float *u, int64_t rows, int64_t n, int64_t stride) override {
        const OpScope timed(clock_, "swiglu");
        for_chunks(rows * n, [&](int64_t i0, int64_t i1) {
            while (i0 < i1) {  // the chunk's part of each row it crosses
                const int64_t t = i0 / n, c = i0 % n, e = std::min(i1 - i0, n - c);
                dfl::swiglu_to(out + t * n + c, g + t * stride + c, u + t * stride + c, e);
                i0 += e;
            }
        }, kExpChunk);
    }
    void sigmoid_mul(float *a, const float *g, int64_t count) override {
        const OpScope timed(clock_, "sigmoid_mul");
        for_chunks(count, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; i++) a[i] *= sigmoid(g[i]);
        }, kExpChunk);
    }
    void scale_softcap(float *x, int64_t count, float scale, float cap) override {
        for_chunks(count, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; i++) {
                const float v = x[i] * scale;
                x[i] = cap > 0 ? cap * std::tanh(v / cap) : v;
            }
        });
    }
    void gather_rows(const float *x, const int32_t *rows, int64_t R, int64_t n, float *out) override {
        const OpScope timed(clock_, "gather_rows");
        for (int64_t r = 0; r < R; r++) std::memcpy(out + r * n, x + (int64_t)rows[r] * n, sizeof(float) * (size_t)n);
    }
    void copy_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                   int64_t n) override {
        const OpScope timed(clock_, "copy_rows");
        for (int64_t r = 0; r < rows; r++)
            std::memcpy(dst + r * dst_stride, src + r * src_stride, sizeof(float) * (size_t)n);
    }

    void attn_prep(const BatchMeta &m, const AttnPrep &a) override {
        const OpScope timed(clock_, "attn_prep");
        const int hd = a.kv.head_dim, nh = a.n_head, nkv = a.kv.n_kv;
        const int64_t qd = (int64_t)nh * hd;
        const int64_t qs = a.q_pitch(), ks = a.k_pitch(), vs = a.v_pitch();
        const float *table = rope_table(m, a.rope_dim, a.inv_freq);
        pool_.parallel_for(m.T, [&](int64_t t, int) {
            const float *cs = table + t * a.rope_dim;  // the position's cos/sin, shared by its heads
            for (int hh = 0; hh < (a.qf ? nh : 0); hh++) {
                const float *src = a.qf + t * qs + (int64_t)hh * hd * (a.gated ? 2 : 1);
                float *dst = a.Q + t * qd + (int64_t)hh * hd;
                dfl::rmsnorm(src, a.q_norm, dst, hd, a.eps);
                rope_neox_with(dst, a.rope_dim, cs);
                if (a.gated) std::memcpy(a.gate + t * qd + (int64_t)hh * hd, src + hd, sizeof(float) * (size_t)hd);
            }
            const uint64_t row = (uint64_t)m.kv_slot[t] * (uint64_t)nkv;
            for (int g = 0; g < nkv; g++) {
                float *kr = a.kf + t * ks + (int64_t)g * hd;
                dfl::rmsnorm(kr, a.k_norm, kr, hd, a.eps);
                rope_neox_with(kr, a.rope_dim, cs);
                quantize_row(a.kv.type_k, kr, a.kv.k + (row + (uint64_t)g) * a.kv.k_row, hd);
                quantize_row(a.kv.type_v, a.vf + t * vs + (int64_t)g * hd, a.kv.v + (row + (uint64_t)g) * a.kv.v_row, hd);
            }
        });
    }

    void attention(const BatchMeta &m, const AttnCall &a) override {
        const OpScope timed(clock_, "attention");
        // tasks = (entry, kv head, chunk of tokens). Each task converts and transposes every key tile its rows see, so
        // a prompt's chunks are as long as keep ~4 tasks a thread (up to 64 tokens; 16 converted each tile 32 times
        // in a 512-token prompt), the ones that see the most positions first, so no long one starts last.
        const int nkv = a.kv.n_kv, hd = a.kv.head_dim, nh = a.n_head, group = nh / nkv;
        const auto count_tasks = [&](int64_t chunk) {
            int64_t n = 0;
            for (int32_t e = 0; e < m.n_ent; e++) n += nkv * ceil_div(m.n[e], chunk);
            return n;
        };
        int64_t chunk = 64;
        while (chunk > 16 && count_tasks(chunk) < 4 * (int64_t)pool_.size()) chunk /= 2;
        // Decode steps (an entry's rows fit one chunk) read the cache once per query row group: a task takes a run of
        // KV heads, as many as leave a task a thread, and converts them position by position (a position's heads are
        // one run of bytes). Qwen3-0.6B q4_K at 2,000 positions, 2 threads: 8 tasks of one head each read the cache
        // a 256-byte row every 2 KB.
        int per = 1;
        if (std::all_of(m.n, m.n + m.n_ent, [&](int32_t n) { return n <= chunk; }))
            while (per < nkv && nkv % (2 * per) == 0 && (int64_t)m.n_ent * (nkv / (2 * per)) >= (int64_t)pool_.size()) per *= 2;
        struct Task {
            int32_t e, g;
            int64_t i0, i1;
        };
        std::vector<Task> tasks;
        for (int32_t e = 0; e < m.n_ent; e++)
            for (int g = 0; g < nkv; g += per)
                for (int64_t i0 = 0; i0 < m.n[e]; i0 += chunk) tasks.push_back({e, g, i0, std::min<int64_t>(m.n[e], i0 + chunk)});
        std::stable_sort(tasks.begin(), tasks.end(), [&](const Task &x, const Task &y) {
            return m.len0[x.e] + x.i1 > m.len0[y.e] + y.i1;
        });
        const int64_t qd = (int64_t)nh * hd;
        pool_.parallel_for((int64_t)tasks.size(), [&](int64_t ti, int th) {
            const Task &tk = tasks[(size_t)ti];
            PagedKV kv;
            kv.type_k = a.kv.type_k;
            kv.type_v = a.kv.type_v;
            kv.n_kv = nkv;
            kv.head_dim = hd;
            kv.block_size = a.kv.block_size;
            kv.k = a.kv.k;
            kv.v = a.kv.v;
            kv.k_row = a.kv.k_row;
            kv.v_row = a.kv.v_row;
            kv.blocks = m.block_table + (int64_t)tk.e * m.max_blocks;
            float *scr = scratch_.get(th, attention_scratch(hd, group, tk.i1 - tk.i0, per));
            const int64_t t0 = m.t0[tk.e];
            AttnMask mask;
            mask.causal = a.causal;
            mask.window = a.window;
            mask.n_new = m.n[tk.e];
            mask.vis = m.vis ? m.vis + t0 : nullptr;
            dfl::attention(kv, tk.g, tk.g + per, nh, a.Q + t0 * qd, qd, a.out + t0 * qd, qd, m.len0[tk.e], tk.i0, tk.i1,
                           a.scale, scr, mask);
        });
    }

    // Tasks of up to kConvRun tokens of a chain entry (a prefill's 512 tokens were one task: ~19 % of a Qwen3.5-0.8B
    // prefill on 2 threads, on one of them); a tree entry is one task, token by token along its paths. The conv states
    // and recorded windows change only after every task has read them.
    void conv1d_silu(const BatchMeta &m, const ConvCall &c) override {
        const OpScope timed(clock_, "conv1d_silu");
        const int C = c.C, K = c.K;
        const int64_t xs = c.x_pitch();
        const float *wt = c.w;  // tap-major, as the 16-lane kernel reads it
        struct Task {
            int64_t e, a, b;
            bool chain;
        };
        std::vector<Task> tasks;
        for (int64_t e = 0; e < m.n_ent; e++) {
            const int64_t n = m.n[e], t0 = m.t0[e];
            bool chain = true;
            for (int64_t i = 0; m.parent && i < n; i++) chain &= m.parent[t0 + i] == i - 1;
            for (int64_t a = 0; a < n; a += chain ? kConvRun : n) tasks.push_back({e, a, chain ? std::min(n, a + kConvRun) : n, chain});
        }
        pool_.parallel_for((int64_t)tasks.size(), [&](int64_t i, int th) {
            const Task &k = tasks[(size_t)i];
            const int64_t t0 = m.t0[k.e];
            const float *cs = c.conv + (int64_t)m.slot[k.e] * c.slot_stride, *x = c.x + t0 * xs;
            if (k.chain) {
                dfl::conv1d_silu(cs, x, xs, k.a, k.b, C, wt, K, c.out + t0 * C);
                return;
            }
            // each token's K rows along its ancestors (window row K-1+a for token a), then the old state's
            const int32_t *par = m.parent + t0;
            float *tw = scratch_.get(th, (size_t)K * C);
            for (int64_t t = k.a; t < k.b; t++) {
                int64_t a = t, old = K - 2;
                for (int r = K - 1; r >= 0; r--) {
                    const float *src = a >= 0 ? x + a * xs : cs + (old--) * C;
                    std::memcpy(tw + (size_t)r * C, src, sizeof(float) * (size_t)C);
                    if (a >= 0) a = par[a];
                }
                dfl::conv1d_silu(tw, tw + (size_t)(K - 1) * C, C, 0, 1, C, wt, K, c.out + (t0 + t) * C);
            }
        });
        pool_.parallel_for(m.n_ent, [&](int64_t e, int) {
            const int64_t n = m.n[e], keep = K - 1;
            float *cs = c.conv + (int64_t)m.slot[e] * c.slot_stride;
            const float *x = c.x + m.t0[e] * xs;
            // x's rows r0 .. r0 + rows - 1 into dst, rows of C
            auto rows_of_x = [&](float *dst, int64_t r0, int64_t rows) {
                for (int64_t r = 0; r < rows; r++)
                    std::memcpy(dst + r * C, x + (r0 + r) * xs, sizeof(float) * (size_t)C);
            };
            if (m.rec_window[e]) {  // the window as it was: the old state's rows, then x's (the state stays)
                float *rw = m.rec_window[e] + (size_t)c.rec_layer * (size_t)((keep + n) * C);
                std::memcpy(rw, cs, sizeof(float) * (size_t)(keep * C));
                rows_of_x(rw + keep * C, 0, n);
                return;
            }
            // the new state: the window's last K-1 rows
            if (n >= keep) {
                rows_of_x(cs, n - keep, keep);
            } else {
                std::memmove(cs, cs + n * C, sizeof(float) * (size_t)((keep - n) * C));
                rows_of_x(cs + (keep - n) * C, 0, n);
            }
        });
    }

    void gdn_gates(int64_t T, const GdnGates &g) override {
        const OpScope timed(clock_, "gdn_gates");
        const float qscale = 1.0f / std::sqrt((float)g.dk);
        pool_.parallel_for(T, [&](int64_t t, int) {
            float *row = g.cv + t * g.C;
            for (int i = 0; i < g.n_k; i++) {
                float *qh = row + (int64_t)i * g.dk;
                l2norm(qh, g.dk, 1e-6f);
                for (int d = 0; d < g.dk; d++) qh[d] *= qscale;
                l2norm(row + (int64_t)(g.n_k + i) * g.dk, g.dk, 1e-6f);
            }
            const float *b = g.b + t * g.b_pitch(), *ar = g.a + t * g.a_pitch();
            for (int j = 0; j < g.n_v; j++) {
                const int64_t k = t * g.n_v + j;
                g.beta[k] = sigmoid(b[j]);
                g.g[k] = g.ssm_a[j] * softplus(ar[j] + g.dt_bias[j]);
            }
        });
    }

    void gdn(const BatchMeta &m, const GdnCall &call) override {
        check_gdn_replay(m.n_ent, call);
        for (int l = 0; l < call.layers; l++) {  // (a replay's layers one after another)
            GdnCall c = call;
            c.cv += l * call.layer_in;
            c.g += l * call.layer_in;
            c.beta += l * call.layer_in;
            c.state += l * call.layer_state;
            gdn_layer(m, c);
        }
    }

    void gdn_layer(const BatchMeta &m, const GdnCall &c) {
        if (c.rec_inputs) record_gdn_inputs(m, gdn_inputs(c));
        const OpScope timed(clock_, "gdn");
        const int dk = c.dk, dv = c.dv, nk = c.n_k, nv = c.n_v, C = c.C;
        const int64_t vd = (int64_t)nv * dv, sf = (int64_t)nv * dk * dv;
        pool_.parallel_for((int64_t)m.n_ent * nv, [&](int64_t task, int th) {
            const int32_t e = (int32_t)(task / nv);
            const int j = (int)(task % nv);
            const int kh = j % nk;  // GGUF order: value heads tiled over the key heads
            const int64_t n = m.n[e], t0 = m.t0[e];
            const size_t hs = (size_t)dk * dv;
            // a recording entry leaves the slot's state as it was: it works on a copy (`work`, the thread's)
            const bool recording = m.rec_in && m.rec_in[e];
            const size_t need = (size_t)(n * (2 * dk + 2 * dv + 2)) + gdn_chunk_scratch(dk, dv) + (recording ? hs : 0);
            float *buf = scratch_.get(th, need);
            float *qj = buf, *kj = qj + n * dk, *vj = kj + n * dk, *gj = vj + n * dv, *bj = gj + n, *oj = bj + n;
            float *cs = oj + n * dv, *work = cs + gdn_chunk_scratch(dk, dv);
            for (int64_t i = 0; i < n; i++) {
                const int64_t src = c.in_rows ? c.in_rows[t0 + i] : t0 + i;
                const float *row = c.cv + src * C;
                std::memcpy(qj + i * dk, row + (int64_t)kh * dk, sizeof(float) * (size_t)dk);
                std::memcpy(kj + i * dk, row + (int64_t)(nk + kh) * dk, sizeof(float) * (size_t)dk);
                std::memcpy(vj + i * dv, row + (int64_t)2 * nk * dk + (int64_t)j * dv, sizeof(float) * (size_t)dv);
                gj[i] = c.g[src * nv + j];
                bj[i] = c.beta[src * nv + j];
            }
            float *S = c.state + (int64_t)m.slot[e] * c.slot_stride + (int64_t)j * dk * dv;
            const int32_t *steps = m.tree_steps && m.tree_steps[t0] >= 0 ? m.tree_steps + t0 : nullptr;
            float *W = S;
            if (recording) {
                std::memcpy(work, S, sizeof(float) * hs);
                W = work;
            }
            if (steps) {
                // a tree (always recorded), walked by its schedule: each token from the state after its parent, the
                // states set aside in its records (BatchMeta::rec_state)
                const size_t per = (size_t)c.n_rec * (size_t)sf;
                float *aside = m.rec_state[e] + (size_t)c.rec_layer * (size_t)sf + (size_t)j * hs;
                for (int64_t i = 0; i < n; i++) {
                    const TreeStep st = TreeStep::unpack(steps[i]);
                    const int64_t k = st.token;
                    if (st.restore >= 0) std::memcpy(W, aside + (size_t)st.restore * per, sizeof(float) * hs);
                    gdn_recurrent(W, dk, dv, qj + k * dk, kj + k * dk, vj + k * dv, gj + k, bj + k, 1, oj + k * dv);
                    if (st.save >= 0) std::memcpy(aside + (size_t)st.save * per, W, sizeof(float) * hs);
                }
            } else if (!recording && !c.exact && n > 1) {
                gdn_chunked(S, dk, dv, qj, kj, vj, gj, bj, n, oj, cs);
            } else {  // one token, a recording entry, or a replay: token by token
                gdn_recurrent(W, dk, dv, qj, kj, vj, gj, bj, n, oj);
            }
            for (int64_t i = 0; c.out && i < n; i++)
                std::memcpy(c.out + (t0 + i) * vd + (int64_t)j * dv, oj + i * dv, sizeof(float) * (size_t)dv);
        });
    }

    void record_gdn_inputs(const BatchMeta &m, const GdnInputs &r) override {
        const int64_t C = r.C, nv = r.n_v;
        pool_.parallel_for(m.n_ent, [&](int64_t e, int) {
            float *dst = m.rec_in[e];
            if (!dst) return;
            const int64_t n = m.n[e], t0 = m.t0[e];
            const GdnRecordLayout rl{n, C, nv};
            float *base = dst + rl.layer(r.rec_layer);
            std::memcpy(base + rl.row(0), r.cv + t0 * C, sizeof(float) * (size_t)(n * C));
            std::memcpy(base + rl.g(0), r.g + t0 * nv, sizeof(float) * (size_t)(n * nv));
            std::memcpy(base + rl.beta(0), r.beta + t0 * nv, sizeof(float) * (size_t)(n * nv));
        });
    }

    void gated_rmsnorm(float *x, const float *z, int64_t z_stride, const float *w, int64_t T, int64_t heads, int64_t n,
                       float eps) override {
        const OpScope timed(clock_, "gated_rmsnorm");
        pool_.parallel_for(T * heads, [&](int64_t r, int) {
            dfl::gated_rmsnorm(x + r * n, z + (r / heads) * z_stride + (r % heads) * n, w, n, eps);
        });
    }

    void topk(const float *logits, int64_t rows, int64_t n, int k, int32_t *ids, float *vals, float *lse) override {
        const OpScope timed(clock_, "topk");
        topk_rows(pool_, logits, rows, n, k, ids, vals, lse);
    }

    void dyn_conv(const BatchMeta &m, const DynConvCall &c) override {
        const int64_t C = c.C;
        const int ng = c.C / c.group;
        pool_.parallel_for(m.T, [&](int64_t t, int) {
            const int64_t i = t - m.t0[m.ent[t]];  // position inside the entry's block
            float *o = c.out + t * C;
            std::fill(o, o + C, 0.0f);
            for (int tap = 0; tap < c.K && tap <= i; tap++) {
                const float *x = c.x + (t - tap) * C, *b = c.base + (int64_t)tap * C;
                const float *d = c.dyn + t * c.dyn_stride + (int64_t)tap * ng;
                for (int64_t ch = 0; ch < C; ch++) o[ch] += (b[ch] + d[ch / c.group]) * x[ch];
            }
        });
    }

    void selector_trans(const SelectorCall &s) override {
        const int K = s.K, rank = s.rank;
        pool_.parallel_for(s.R, [&](int64_t r, int th) {
            // cond[i] = pred[a_i] * g[r] (K rows of rank), then succ[j] for each candidate j
            float *buf = scratch_.get(th, (size_t)(K + 1) * (size_t)rank);
            float *cond = buf, *row = buf + (int64_t)K * rank;
            const float *g = s.g + r * rank;
            const int32_t *ids = s.ids + r * K;
            const int np = s.prev[r] < 0 ? 1 : K;
            bool ok[64];
            for (int i = 0; i < np; i++) {
                const int32_t a = s.prev[r] < 0 ? s.root[r] : s.ids[(int64_t)s.prev[r] * K + i];
                ok[i] = a >= 0 && a < s.pred.n_out;
                if (!ok[i]) continue;
                get_row(s.pred, a, cond + (int64_t)i * rank);
                for (int q = 0; q < rank; q++) cond[(int64_t)i * rank + q] *= g[q];
            }
            float *out = s.trans + r * K * K;
            for (int j = 0; j < K; j++) {
                const bool okj = ids[j] >= 0 && ids[j] < s.succ.n_out;
                if (okj) get_row(s.succ, ids[j], row);
                for (int i = 0; i < np; i++) {
                    float acc = 0.0f;
                    if (okj && ok[i]) {
                        const float *ci = cond + (int64_t)i * rank;
                        for (int q = 0; q < rank; q++) acc += ci[q] * row[q];
                    }
                    out[i * K + j] = acc;
                }
            }
            for (int i = np; i < K; i++) std::memcpy(out + i * K, out, sizeof(float) * (size_t)K);  // root row: same for all i
        });
    }

    // DeepSeek V4 (ds4_ops.cpp)
    void hc_pre(const HcPreCall &c) override {
        const OpScope timed(clock_, "hc_pre");
        ds4_hc_pre(pool_, c);
    }
    void hc_post(const HcPostCall &c) override {
        const OpScope timed(clock_, "hc_post");
        ds4_hc_post(pool_, c);
    }
    void hc_head(const HcHeadCall &c) override { ds4_hc_head(pool_, c); }
    void rope_tail(const RopeTailCall &c) override {
        const OpScope timed(clock_, "rope_tail");
        ds4_rope_tail(pool_, c);
    }
    void norm_rope_tail(const float *w, float eps, const RopeTailCall &c) override {
        const OpScope timed(clock_, "norm_rope_tail");
        ds4_norm_rope_tail(pool_, w, eps, c);
    }
    void ds4_compress(const BatchMeta &m, const Ds4CompressCall &c) override {
        const OpScope timed(clock_, "ds4_compress");
        dfl::ds4_compress(pool_, m, c);
    }
    void ds4_indexer_topk(const BatchMeta &m, const Ds4IndexerCall &c) override {
        const OpScope timed(clock_, "ds4_indexer_topk");
        dfl::ds4_indexer_topk(pool_, m, c);
    }
    void ds4_attention(const BatchMeta &m, const Ds4AttnCall &c) override {
        const OpScope timed(clock_, "ds4_attention");
        dfl::ds4_attention(pool_, scratch_, m, c);
    }
    void ds4_ring_write(const BatchMeta &m, const Ds4RingWrite &c) override { dfl::ds4_ring_write(m, c); }
    void moe_route(const MoeRouteCall &c) override {
        const OpScope timed(clock_, "moe_route");
        ds4_moe_route(pool_, c);
    }
    void swiglu_clamp(float *g, const float *u, int64_t count, float limit) override {
        const OpScope timed(clock_, "swiglu_clamp");
        for_chunks(count, [&](int64_t i0, int64_t i1) { ds4_swiglu_clamp(g + i0, u + i0, i1 - i0, limit); });
    }
    void moe_experts(const MoeExpertsCall &c) override {
        const OpScope timed(clock_, "moe_experts");
        ds4_moe_experts(pool_, scratch_, c);
    }

private:
    // cos and sin of each token's position (rope_cos_sin), [T][rope_dim]. Every attention layer of a forward asks for
    // the same ones, so the table is made by the first and kept while the positions and the frequencies stay: a
    // one-token step's attn_prep runs on the caller alone, and 64 sincos in double a layer were a fifth of it.
    const float *rope_table(const BatchMeta &m, int rope_dim, const float *inv_freq) {
        const size_t T = (size_t)m.T, half = (size_t)rope_dim / 2;
        const bool same = rope_.dim == rope_dim && rope_.pos.size() == T && std::equal(m.pos, m.pos + T, rope_.pos.begin()) &&
                          rope_.freq.size() == half && std::equal(inv_freq, inv_freq + half, rope_.freq.begin());
        if (!same) {
            rope_.dim = rope_dim;
            rope_.pos.assign(m.pos, m.pos + T);
            rope_.freq.assign(inv_freq, inv_freq + half);
            rope_.cs.resize(T * (size_t)rope_dim);
            float *cs = rope_.cs.data();
            pool_.parallel_for(ceil_div((int64_t)T, int64_t(16)), [&](int64_t c, int) {
                for (int64_t t = c * 16; t < std::min<int64_t>((int64_t)T, (c + 1) * 16); t++)
                    rope_cos_sin(rope_dim, m.pos[t], inv_freq, cs + t * rope_dim);
            });
        }
        return rope_.cs.data();
    }
    static constexpr int64_t kConvRun = 16;  // tokens of a conv1d_silu task

    static bool env_is(const char *name, const char *value) {
        const char *e = std::getenv(name);
        return e && std::strcmp(e, value) == 0;
    }
    struct RopeTable {
        int dim = -1;
        std::vector<int32_t> pos;
        std::vector<float> freq, cs;
    } rope_;

    // Elementwise work split into a few large chunks per thread, of at least min_chunk elements. An exp per element
    // (swiglu, sigmoid_mul) takes the smaller chunks: a decode step's 3072-element swiglu was one task of 18 us at 16
    // threads (Qwen3-0.6B; 6.5 % of the step).
    template <class F>
    void for_chunks(int64_t count, F &&f, int64_t min_chunk = 4096) {
        const int64_t chunk = std::max<int64_t>(min_chunk, ceil_div(count, (int64_t)pool_.size() * 4));
        pool_.parallel_for(ceil_div(count, chunk), [&](int64_t c, int) { f(c * chunk, std::min(count, (c + 1) * chunk)); });
    }

    OpClock clock_;  // first: its summary prints after the pool has stopped
    const bool fuse_;  // copies_weights
    static constexpr int64_t kExpChunk = 512;  // for_chunks' smallest chunk for work with an exp per element
    ThreadPool pool_;
    Scratch scratch_;
    std::vector<std::unique_ptr<uint8_t[]>> copies_;
    struct FreeAligned {
        void operator()(uint8_t *p) const { std::free(p); }
    };
    std::vector<std::unique_ptr<uint8_t, FreeAligned>> packs_;  // chunks of packed weights
    uint8_t *pack_next_ = nullptr;
    uint64_t pack_left_ = 0;

    // Room for a packed weight, 64-byte aligned. Decode streams every packed weight once a token, so they share
    // chunks of at least 128 MB, 2 MB-aligned and marked for transparent huge pages: a TLB miss every 2 MB instead of
    // every 4 KB where the kernel's THP setting is "madvise" (common; "never" leaves 4 KB pages). Chunks, not one
    // buffer a matrix, so that each matrix does not round up to a whole huge page (a chunk's untouched tail takes no
    // memory). 2-core VM, Qwen3-0.6B q8_0 decode at 2 threads, alternating runs, medians: 39.3 -> 46.9 and 33.5 ->
    // 41.3 tok/s with a buffer a matrix; q4_K, bound by its tile, unchanged.
    uint8_t *pack_buffer(uint64_t bytes) {
        constexpr uint64_t kHuge = 2ull << 20, kChunk = 128ull << 20;
        bytes = (bytes + 63) / 64 * 64;
        if (bytes > pack_left_) {
            const uint64_t size = std::max(kChunk, (bytes + kHuge - 1) / kHuge * kHuge);
            auto *p = (uint8_t *)std::aligned_alloc(kHuge, size);
            if (p == nullptr) return nullptr;
            madvise(p, size, MADV_HUGEPAGE);  // advice: refused or ignored, the pages stay 4 KB
            packs_.emplace_back(p);
            pack_next_ = p;
            pack_left_ = size;
        }
        uint8_t *p = pack_next_;
        pack_next_ += bytes;
        pack_left_ -= bytes;
        return p;
    }
};

int threads_or_hw(int n) {
    if (n > 0) return std::min(n, 256);
    const unsigned hc = std::thread::hardware_concurrency();
    return hc == 0 ? 1 : (int)hc;
}

}  // namespace

std::unique_ptr<Device> make_cpu_device(int n_threads) {
    return std::unique_ptr<Device>(new CpuDevice(threads_or_hw(n_threads)));
}

}  // namespace dfl

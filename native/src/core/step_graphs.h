// One-token steps replayed as device graphs (Device::graph_begin .. graph_launch), by step shape, for the layer plans
// that have them. A shape runs op by op the first time it is seen (that run sizes every buffer and the device's
// scratch, which a capture must not do), is captured the second time and replayed after.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>

#include "common.h"
#include "ops/device.h"

namespace dfl {

class StepGraphs {
public:
    // The host scalars a graph freezes: a step of another shape needs its own graph.
    struct Key {
        int64_t entries = 0;      // sequences in the step
        int64_t table_width = 0;  // block-table width, rounded up by the plan so few widths occur
        int64_t rows = 0;         // logits rows
        int64_t tokens = 0;       // tokens in the step and the most of one sequence: 0 for a decode step (one each)
        int64_t max_tokens = 0;
        uint64_t shape = 0;       // anything else the plan's ops branch on (its own encoding)
        bool operator<(const Key &o) const {
            return std::tie(entries, table_width, rows, tokens, max_tokens, shape) <
                   std::tie(o.entries, o.table_width, o.rows, o.tokens, o.max_tokens, o.shape);
        }
    };
    // What a shape whose capture failed does on its later steps, until the next drop.
    enum class OnFailure {
        Retry,   // captures again on its next step
        GiveUp,  // runs op by op: its capture is not expected to succeed (an op that waits for the host)
    };

    // The block-table width a replayed step is captured for (the kernels take it and max_ctx as upper bounds): a power of
    // two from 8 blocks up to 64, then multiples of 64, so that few widths occur. Short contexts keep a short bound: the
    // decode attention splits its positions by max_ctx, and a flat 64-block bucket (1,024 positions at 16 a block) had
    // every step of a short context split four ways and pay a combine kernel a layer (12-04 skip-ops on the H200:
    // attention and its combine 0.31 ms of a 3.45 ms qwen3-8b step at 16..144 positions).
    static size_t table_width(size_t blocks) {
        if (blocks > 64) return (blocks + 63) / 64 * 64;
        size_t w = 8;
        while (w < blocks) w *= 2;
        return w;
    }

    explicit StepGraphs(OnFailure on_failure) : on_failure_(on_failure) {}
    StepGraphs(const StepGraphs &) = delete;
    StepGraphs &operator=(const StepGraphs &) = delete;

    // Runs body (the step's device ops, the same for every step of one key) as a replay of key's graph, capturing
    // it first when this is the key's turn, or op by op. The owner calls it only for steps a graph can stand for,
    // on a device that has graphs.
    template <class Body>
    void run(Device &dev, const Key &key, Body &&body) {
        if (dev.scratch_epoch() != epoch_) {
            drop(dev);  // the device moved its scratch since they were captured
            epoch_ = dev.scratch_epoch();
        }
        auto it = graphs_.find(key);
        if (it == graphs_.end()) {
            const auto seen = seen_.emplace(key, Seen::Once);
            const bool turn = !seen.second && seen.first->second == Seen::Once;  // seen before, not given up on
            if (turn) {
                const uintptr_t g = capture(dev, body);
                if (g && dev.scratch_epoch() == epoch_) {
                    it = graphs_.emplace(key, g).first;
                } else {
                    dev.graph_free(g);  // (one captured while the device moved its scratch points at freed memory)
                    if (on_failure_ == OnFailure::GiveUp) seen.first->second = Seen::Failed;
                }
            }
        }
        if (it != graphs_.end())
            dev.graph_launch(it->second);
        else
            body();
    }

    // Frees every graph and forgets which keys were seen. The owner calls it when it reallocates a buffer a graph
    // may point at, and before its device goes away (the graphs are the device's).
    void drop(Device &dev) {
        for (auto &g : graphs_) dev.graph_free(g.second);
        graphs_.clear();
        seen_.clear();
    }

    // b holding at least bytes: reallocated where it is smaller (its contents dropped), and every graph with it, since
    // a graph may point at the old buffer. The owner's step buffers grow this way.
    void grow(Device &dev, DevBuf &b, size_t bytes, const char *what) {
        if (b.bytes() >= bytes) return;
        drop(dev);
        b.reset();  // (the old one first: peak memory is one buffer)
        b = DevBuf(&dev, bytes, what);
    }

private:
    enum class Seen { Once, Failed };

    // The graph of body's ops, or 0 when the capture failed. A failed capture ran nothing (the caller then runs body
    // op by op); an exception other than Error passes through.
    template <class Body>
    static uintptr_t capture(Device &dev, Body &body) {
        try {
            dev.graph_begin();
            body();
            return dev.graph_end();
        } catch (const Error &) {
            dev.graph_free(dev.graph_end());
            return 0;
        }
    }

    OnFailure on_failure_;
    std::map<Key, uintptr_t> graphs_;
    std::map<Key, Seen> seen_;  // keys that ran since the last drop
    uint64_t epoch_ = 0;        // the device's scratch epoch the graphs were captured in
};

}  // namespace dfl

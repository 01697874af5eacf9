// StepGraphs (core/step_graphs.h) on a device that only records its graph calls: when a step shape is run op by op,
// captured or replayed under each failure policy, and that no graph outlives a drop. The CUDA device runs the same
// class for real (native/engine TestDevice*), but only on a GPU.
#include <set>
#include <stdexcept>
#include <vector>

#include "core/step_graphs.h"
#include "test.h"

using namespace dfl;

namespace {

class GraphDevice final : public Device {
public:
    // the next capture's outcome
    bool end_fails = false;  // graph_end returns 0
    bool moves_scratch = false;  // the captured ops reallocate the scratch
    uint64_t epoch = 0;
    bool capturing = false;
    int begins = 0, launches = 0;
    uintptr_t last_launched = 0;
    std::set<uintptr_t> live;

    uint64_t scratch_epoch() const override { return epoch; }
    bool has_graphs() const override { return true; }
    void graph_begin() override {
        CHECK(!capturing);
        capturing = true;
        begins++;
    }
    uintptr_t graph_end() override {
        CHECK(capturing);
        capturing = false;
        if (moves_scratch) epoch++;
        if (end_fails) return 0;
        live.insert(++next_);
        return next_;
    }
    void graph_launch(uintptr_t g) override {
        CHECK(live.count(g) == 1);
        launches++;
        last_launched = g;
    }
    void graph_free(uintptr_t g) override {
        if (g) CHECK(live.erase(g) == 1);
    }

    std::string name() const override { return "graphs"; }
    void *alloc(size_t, const char *) override { return nullptr; }
    void release(void *) override {}
    void to_device(void *, const void *, size_t) override {}
    void to_host(void *, const void *, size_t) override {}
    void copy(void *, const void *, size_t) override {}
    void zero(void *, size_t) override {}
    void sync() override {}
    uint64_t free_bytes() override { return 0; }
    const uint8_t *upload_weight(const void *, size_t, bool) override { return nullptr; }
    void embed(const Weight &, const int32_t *, int64_t, float *) override {}
    void matmul(const Weight &, const float *, int64_t, float *) override {}
    void rmsnorm(const float *, const float *, float *, int64_t, int64_t, float) override {}
    void add_rmsnorm(float *, const float *, const float *, float *, int64_t, int64_t, float) override {}
    void add(float *, const float *, int64_t) override {}
    void swiglu(float *, const float *, int64_t) override {}
    void swiglu_rows(float *, const float *, const float *, int64_t, int64_t, int64_t) override {}
    void sigmoid_mul(float *, const float *, int64_t) override {}
    void scale_softcap(float *, int64_t, float, float) override {}
    void gather_rows(const float *, const int32_t *, int64_t, int64_t, float *) override {}
    void copy_rows(float *, int64_t, const float *, int64_t, int64_t, int64_t) override {}
    void attn_prep(const BatchMeta &, const AttnPrep &) override {}
    void attention(const BatchMeta &, const AttnCall &) override {}
    void conv1d_silu(const BatchMeta &, const ConvCall &) override {}
    void gdn_gates(int64_t, const GdnGates &) override {}
    void gdn(const BatchMeta &, const GdnCall &) override {}
    void record_gdn_inputs(const BatchMeta &, const GdnInputs &) override {}
    void gated_rmsnorm(float *, const float *, int64_t, const float *, int64_t, int64_t, int64_t, float) override {}
    void topk(const float *, int64_t, int64_t, int, int32_t *, float *, float *) override {}
    void dyn_conv(const BatchMeta &, const DynConvCall &) override {}
    void selector_trans(const SelectorCall &) override {}

private:
    uintptr_t next_ = 0;
};

// One step of `key`; tells how it ran.
enum class Ran { Eager, Captured, Replayed, CapturedThenEager };

struct Steps {
    GraphDevice dev;
    StepGraphs graphs;
    bool body_throws = false;  // the ops of the next capture throw Error
    explicit Steps(StepGraphs::OnFailure f) : graphs(f) {}

    Ran step(const StepGraphs::Key &key) {
        int captured = 0, eager = 0;
        const int launches = dev.launches;
        graphs.run(dev, key, [&] {
            if (!dev.capturing) {
                eager++;
                return;
            }
            captured++;
            if (body_throws) fail(DFL_ERR_INTERNAL, "a host wait");
        });
        CHECK(!dev.capturing);
        CHECK(captured + eager <= 2 && (dev.launches - launches) + eager == 1);
        if (captured) return eager ? Ran::CapturedThenEager : Ran::Captured;
        return eager ? Ran::Eager : Ran::Replayed;
    }
    ~Steps() {
        graphs.drop(dev);
        CHECK(dev.live.empty());
    }
};

const StepGraphs::Key k1{1, 64, 1}, k2{2, 64, 2};

}  // namespace

TEST(step_graphs_capture_on_second_sight_per_key) {
    for (auto f : {StepGraphs::OnFailure::Retry, StepGraphs::OnFailure::GiveUp}) {
        Steps s(f);
        CHECK(s.step(k1) == Ran::Eager);
        CHECK(s.step(k2) == Ran::Eager);
        CHECK(s.step(k1) == Ran::Captured);
        const uintptr_t g1 = s.dev.last_launched;
        CHECK(s.step(k1) == Ran::Replayed);
        CHECK(s.dev.last_launched == g1);
        CHECK(s.step(k2) == Ran::Captured);
        CHECK(s.dev.last_launched != g1);
        CHECK(s.step(k1) == Ran::Replayed && s.dev.last_launched == g1);
        CHECK(s.dev.begins == 2 && s.dev.live.size() == 2);
    }
}

// Verify steps: keys that differ only in the step's tokens, its longest entry or the shape word (trees, recording,
// captured layers) are different graphs; a decode key (tokens 0) is not a verify key.
TEST(step_graphs_verify_keys_are_distinct) {
    StepGraphs::Key decode{2, 64, 2};
    StepGraphs::Key v16 = decode, v8 = decode, tree = decode;
    v16.tokens = 32, v16.max_tokens = 16;
    v8.tokens = 16, v8.max_tokens = 8;
    tree.tokens = 32, tree.max_tokens = 16, tree.shape = 1;
    Steps s(StepGraphs::OnFailure::Retry);
    for (const auto *k : {&decode, &v16, &v8, &tree}) CHECK(s.step(*k) == Ran::Eager);
    std::vector<uintptr_t> g;
    for (const auto *k : {&decode, &v16, &v8, &tree}) {
        CHECK(s.step(*k) == Ran::Captured);
        g.push_back(s.dev.last_launched);
    }
    for (size_t i = 0; i < g.size(); i++)
        for (size_t j = i + 1; j < g.size(); j++) CHECK(g[i] != g[j]);
    CHECK(s.step(v16) == Ran::Replayed && s.dev.last_launched == g[1]);
    CHECK(s.step(tree) == Ran::Replayed && s.dev.last_launched == g[3]);
}

TEST(step_graphs_failed_capture_retries_or_gives_up) {
    for (int how = 0; how < 3; how++) {  // graph_end fails, the ops throw Error, the scratch moves mid-capture
        Steps retry(StepGraphs::OnFailure::Retry), give_up(StepGraphs::OnFailure::GiveUp);
        for (Steps *s : {&retry, &give_up}) {
            CHECK(s->step(k1) == Ran::Eager);
            s->dev.end_fails = how == 0;
            s->body_throws = how == 1;
            s->dev.moves_scratch = how == 2;
            CHECK(s->step(k1) == Ran::CapturedThenEager);
            CHECK(s->dev.live.empty());
            s->dev.end_fails = s->body_throws = s->dev.moves_scratch = false;
        }
        // a moved scratch drops every key's history, so the shape starts over
        CHECK(retry.step(k1) == (how == 2 ? Ran::Eager : Ran::Captured));
        CHECK(give_up.step(k1) == Ran::Eager);
        CHECK(give_up.step(k1) == (how == 2 ? Ran::Captured : Ran::Eager));
        CHECK(give_up.step(k2) == Ran::Eager);
        CHECK(give_up.step(k2) == Ran::Captured);  // other keys still capture
        give_up.graphs.drop(give_up.dev);
        CHECK(give_up.step(k1) == Ran::Eager);  // a drop forgets the failure
        CHECK(give_up.step(k1) == Ran::Captured);
    }
}

TEST(step_graphs_other_exceptions_pass_through) {
    Steps s(StepGraphs::OnFailure::Retry);
    s.step(k1);
    bool thrown = false;
    try {
        s.graphs.run(s.dev, k1, [] { throw std::logic_error("not the device's"); });
    } catch (const std::logic_error &) {
        thrown = true;
    }
    CHECK(thrown);
    s.dev.capturing = false;  // (only the device's own errors end the capture)
    CHECK(s.dev.live.empty());
}

TEST(step_graphs_dropped_on_epoch_change_and_drop) {
    Steps s(StepGraphs::OnFailure::GiveUp);
    s.step(k1);
    s.step(k1);
    s.step(k2);
    s.step(k2);
    CHECK(s.dev.live.size() == 2);
    s.dev.epoch++;
    CHECK(s.step(k1) == Ran::Eager);  // both graphs freed before the step, the key seen afresh
    CHECK(s.dev.live.empty());
    CHECK(s.step(k1) == Ran::Captured);
    s.graphs.drop(s.dev);
    CHECK(s.dev.live.empty());
    CHECK(s.step(k1) == Ran::Eager);
}

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "sample.h"

namespace dfl {

// splitmix64: tiny, seedable with any value, and good enough for token draws.
uint64_t rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}


namespace {

// Penalised logits, as (token, value) overrides of the caller's row: greedy decoding then scans the row once without
// copying it (a 150k vocabulary is 600 KB per sampled token).
using Overrides = std::unordered_map<int32_t, float>;

Overrides penalties(const float *logits, uint32_t n_vocab, const dfl_sampling &p, const int32_t *history,
                    uint32_t n_history) {
    Overrides over;
    const bool penalise = p.penalty_last_n != 0 && n_history > 0 &&
                          (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
    if (!penalise) return over;
    if (p.repeat_penalty <= 0.0f) fail(DFL_ERR_INVALID, "sample: repeat_penalty must be > 0");
    const uint32_t start =
        p.penalty_last_n < 0 || (uint32_t)p.penalty_last_n >= n_history ? 0 : n_history - (uint32_t)p.penalty_last_n;
    std::unordered_map<int32_t, int> count;
    for (uint32_t i = start; i < n_history; i++) {
        const int32_t t = history[i];
        if (t < 0 || (uint32_t)t >= n_vocab)
            fail(DFL_ERR_INVALID, "sample: history token " + std::to_string(t) + " outside the vocabulary");
        count[t]++;
    }
    for (const auto &kv : count) {
        float x = logits[kv.first];
        if (p.repeat_penalty != 1.0f) x = x > 0 ? x / p.repeat_penalty : x * p.repeat_penalty;
        x -= (float)kv.second * p.frequency_penalty + p.presence_penalty;
        over[kv.first] = x;
    }
    return over;
}

// argmax, lowest id on ties; overridden tokens are compared with their penalised values
int32_t argmax_token(const float *logits, uint32_t n_vocab, const Overrides &over) {
    int32_t best = -1;
    float bv = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        const float x = logits[i];
        if (best < 0 || x > bv) {
            if (!over.empty() && over.count((int32_t)i)) continue;
            best = (int32_t)i;
            bv = x;
        }
    }
    for (const auto &kv : over)
        if (best < 0 || kv.second > bv || (kv.second == bv && kv.first < best)) {
            best = kv.first;
            bv = kv.second;
        }
    return best;
}

// The tokens a positive temperature samples from, ranked best first (ties by the lower id, so the order is
// deterministic), with their softmax probabilities over the candidates (the top k, or every token). The order is
// sorted only as far as it is read: sampling nearly always reads a short head of it, and a sort of a 150k-token
// vocabulary cost ~30 ms a token.
class Ranked {
    struct Entry {
        float l;  // logit / temperature
        int32_t id;
    };
    // better-ranked first: the larger logit, the lower id on ties
    static bool better(const Entry &a, const Entry &b) { return a.l > b.l || (a.l == b.l && a.id < b.id); }

public:
    Ranked(const float *logits, uint32_t n_vocab, const dfl_sampling &p, const Overrides &over) : e_(n_vocab) {
        for (uint32_t i = 0; i < n_vocab; i++) e_[i] = Entry{logits[i] / p.temperature, (int32_t)i};
        for (const auto &kv : over) e_[(size_t)kv.first].l = kv.second / p.temperature;
        if (p.top_k > 0 && (uint32_t)p.top_k < n_vocab) {
            sorted_ = (size_t)p.top_k;
            std::partial_sort(e_.begin(), e_.begin() + p.top_k, e_.end(), better);
            e_.resize(sorted_);
        }
        mx_ = -INFINITY;
        for (const Entry &x : e_) mx_ = std::max(mx_, (double)x.l);
        for (const Entry &x : e_) z_ += std::exp((double)x.l - mx_);
    }

    size_t size() const { return e_.size(); }
    int32_t id(size_t rank) {
        sort_to(rank, 2 * sorted_);
        return e_[rank].id;
    }
    double prob(size_t rank) {
        sort_to(rank, 2 * sorted_);
        return weight(e_[rank]);
    }
    // The candidates in no particular order (as they stand: ranks not yet read are unsorted).
    int32_t unranked_id(size_t i) const { return e_[i].id; }
    double unranked_prob(size_t i) const { return weight(e_[i]); }

private:
    double weight(const Entry &x) const { return std::exp((double)x.l - mx_) / z_; }
    // Makes ranks [0, rank] sorted, at least to ranks [0, grow) (the head grows geometrically), by a heap selection
    // over the rest: the tokens past the sorted head are never better than it.
    void sort_to(size_t rank, size_t grow) {
        if (rank < sorted_) return;
        const size_t to = std::min(e_.size(), std::max({rank + 1, grow, (size_t)64}));
        std::partial_sort(e_.begin() + (ptrdiff_t)sorted_, e_.begin() + (ptrdiff_t)to, e_.end(), better);
        sorted_ = to;
    }

    std::vector<Entry> e_;
    size_t sorted_ = 0;
    double mx_ = 0, z_ = 0;
};

// How many ranks top-p and min-p keep.
size_t kept(Ranked &r, const dfl_sampling &p) {
    size_t n = r.size();
    if (p.top_p < 1.0f) {
        double cum = 0;
        for (size_t i = 0; i < n; i++) {
            cum += r.prob(i);
            if (cum >= (double)p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p.min_p > 0.0f) {
        const double floor = (double)p.min_p * r.prob(0);
        size_t keep = 1;
        while (keep < n && r.prob(keep) >= floor) keep++;
        n = keep;
    }
    return n;
}

}  // namespace

int32_t sample_token(const float *logits, uint32_t n_vocab, const dfl_sampling &p, const int32_t *history,
                     uint32_t n_history, uint64_t *rng_state) {
    if (n_vocab == 0) fail(DFL_ERR_INVALID, "sample: empty vocabulary");
    const Overrides over = penalties(logits, n_vocab, p, history, n_history);
    if (!(p.temperature > 0.0f)) return argmax_token(logits, n_vocab, over);

    Ranked r(logits, n_vocab, p, over);
    const size_t n = kept(r, p);
    // the kept ranks' mass: all of it (1) unless top-p or min-p cut the order, whose head is then sorted already
    double mass = 1;
    if (n < r.size()) {
        mass = 0;
        for (size_t i = 0; i < n; i++) mass += r.prob(i);
    }
    double u = (double)(rng_next(rng_state) >> 11) * (1.0 / 9007199254740992.0) * mass;
    for (size_t i = 0; i < n; i++) {
        u -= r.prob(i);
        if (u < 0) return r.id(i);
    }
    // rounding left u past the end: the last kept rank, or without a cut the best one (the last of every token may
    // be one of probability 0)
    return r.id(n < r.size() ? n - 1 : 0);
}

uint32_t sample_distribution(const float *logits, uint32_t n_vocab, const dfl_sampling &p, const int32_t *history,
                             uint32_t n_history, int32_t *ids, double *probs) {
    if (n_vocab == 0) fail(DFL_ERR_INVALID, "sample: empty vocabulary");
    const Overrides over = penalties(logits, n_vocab, p, history, n_history);
    if (!(p.temperature > 0.0f)) {
        ids[0] = argmax_token(logits, n_vocab, over);
        probs[0] = 1;
        return 1;
    }
    Ranked r(logits, n_vocab, p, over);
    const size_t n = kept(r, p);
    if (n < r.size()) {  // a sorted head
        double mass = 0;
        for (size_t i = 0; i < n; i++) mass += r.prob(i);
        for (size_t i = 0; i < n; i++) {
            ids[i] = r.id(i);
            probs[i] = r.prob(i) / mass;
        }
        return (uint32_t)n;
    }
    // every candidate, unsorted: reading them in rank order would sort them all
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const double pr = r.unranked_prob(i);
        if (pr > 0) {
            ids[m] = r.unranked_id(i);
            probs[m++] = pr;
        }
    }
    return m;
}

}  // namespace dfl

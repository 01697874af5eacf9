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

static bool before(const std::vector<float> &l, int32_t a, int32_t b) {
    return l[(size_t)a] > l[(size_t)b] || (l[(size_t)a] == l[(size_t)b] && a < b);
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

// What a positive temperature samples from: idx[0..n) best first with weights pr (of total mass; pr past n are
// dropped by top-p / min-p).
struct Weights {
    std::vector<int32_t> idx;
    std::vector<double> pr;
    size_t n = 0;
    double mass = 0;
};

Weights weights(const float *logits, uint32_t n_vocab, const dfl_sampling &p, const Overrides &over) {
    std::vector<float> l(logits, logits + n_vocab);
    for (const auto &kv : over) l[(size_t)kv.first] = kv.second;
    for (auto &x : l) x /= p.temperature;

    // candidates, best first (ties by lower id, so the order is deterministic)
    Weights w;
    w.idx.resize(n_vocab);
    std::iota(w.idx.begin(), w.idx.end(), 0);
    const auto cmp = [&](int32_t a, int32_t b) { return before(l, a, b); };
    size_t n = n_vocab;
    if (p.top_k > 0 && (uint32_t)p.top_k < n_vocab) {
        n = (size_t)p.top_k;
        std::partial_sort(w.idx.begin(), w.idx.begin() + (ptrdiff_t)n, w.idx.end(), cmp);
    } else {
        std::sort(w.idx.begin(), w.idx.end(), cmp);
    }
    w.idx.resize(n);

    w.pr.resize(n);
    const double mx = l[(size_t)w.idx[0]];
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        w.pr[i] = std::exp((double)l[(size_t)w.idx[i]] - mx);
        sum += w.pr[i];
    }
    for (auto &x : w.pr) x /= sum;

    if (p.top_p < 1.0f) {
        double cum = 0;
        size_t keep = n;
        for (size_t i = 0; i < n; i++) {
            cum += w.pr[i];
            if (cum >= (double)p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = std::max<size_t>(1, keep);
    }
    if (p.min_p > 0.0f) {
        const double floor = (double)p.min_p * w.pr[0];
        size_t keep = 1;
        while (keep < n && w.pr[keep] >= floor) keep++;
        n = keep;
    }
    w.n = n;
    for (size_t i = 0; i < n; i++) w.mass += w.pr[i];
    return w;
}

}  // namespace

int32_t sample_token(const float *logits, uint32_t n_vocab, const dfl_sampling &p, const int32_t *history,
                     uint32_t n_history, uint64_t *rng_state) {
    if (n_vocab == 0) fail(DFL_ERR_INVALID, "sample: empty vocabulary");
    const Overrides over = penalties(logits, n_vocab, p, history, n_history);
    if (!(p.temperature > 0.0f)) return argmax_token(logits, n_vocab, over);

    const Weights w = weights(logits, n_vocab, p, over);
    const double u = (double)(rng_next(rng_state) >> 11) * (1.0 / 9007199254740992.0) * w.mass;
    double cum = 0;
    for (size_t i = 0; i < w.n; i++) {
        cum += w.pr[i];
        if (u < cum) return w.idx[i];
    }
    return w.idx[w.n - 1];
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
    const Weights w = weights(logits, n_vocab, p, over);
    size_t n = w.n;
    while (n > 1 && w.pr[n - 1] == 0) n--;  // tokens of -inf logits (best first: they come last), never drawn
    for (size_t i = 0; i < n; i++) {
        ids[i] = w.idx[i];
        probs[i] = w.pr[i] / w.mass;
    }
    return (uint32_t)n;
}

}  // namespace dfl

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <vector>

#include "ops/cpu/vec16.h"
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

// w[i] = exp(l[i] - mx) for l[i] <= mx, 16 at a time (exp16_nonpos: within 2 ulp of expf, 0 below -87.3): one call of
// the C library's exp a token was most of a sampled token's time. w may be l.
DFL_WIDE_MULTIVERSION void exp_shifted(const float *l, float mx, float *w, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const v16f y = exp16_nonpos(load16f(l + i) - mx);
        std::memcpy(w + i, &y, sizeof y);
    }
    if (i < n) {
        float buf[16];
        std::fill(buf, buf + 16, mx);
        std::copy(l + i, l + n, buf);
        const v16f y = exp16_nonpos(load16f(buf) - mx);
        std::memcpy(w + i, &y, (n - i) * sizeof(float));
    }
}

// The tokens a positive temperature samples from (the top k, or every token) with their softmax weights, cut by
// top-p and min-p without sorting them: a sort of a 150k-token vocabulary cost ~25 ms a token. Their order is of no
// meaning but fixed by the input, so that a seed draws the same token every time; drawing in it draws from the same
// distribution as drawing in rank order (the larger logit first, the lower id on ties), by which the cuts are made.
class Candidates {
    struct Entry {
        double w;  // exp(l - max l)
        float l;   // logit / temperature
        int32_t id;
    };
    static bool better(const Entry &a, const Entry &b) { return a.l > b.l || (a.l == b.l && a.id < b.id); }

public:
    Candidates(const float *logits, uint32_t n_vocab, const dfl_sampling &p, const Overrides &over) : e_(n_vocab) {
        std::vector<float> l(logits, logits + n_vocab);  // logits / temperature by token, then their weights
        for (const auto &kv : over) l[(size_t)kv.first] = kv.second;
        for (float &x : l) x /= p.temperature;
        for (uint32_t i = 0; i < n_vocab; i++) e_[i] = Entry{0, l[i], (int32_t)i};
        // a ranked head (heap selection): the top k, else the best 64, which nearly always hold what top-p keeps
        const bool top_k = p.top_k > 0 && (uint32_t)p.top_k < n_vocab;
        const size_t head = std::min<size_t>(n_vocab, top_k ? (size_t)p.top_k : 64);
        std::partial_sort(e_.begin(), e_.begin() + (ptrdiff_t)head, e_.end(), better);
        if (top_k) {
            e_.resize(head);
            for (Entry &x : e_) x.w = std::exp((double)x.l - e_[0].l);
        } else {
            exp_shifted(l.data(), e_[0].l, l.data(), n_vocab);  // every weight at once, 16 at a time
            for (Entry &x : e_) x.w = l[(size_t)x.id];
        }
        const double z = weight_of(e_.size());
        if (p.top_p < 1.0f) cut_top_p((double)p.top_p * z, head);
        if (p.min_p > 0.0f) {
            // min_p times the best token's weight, which is 1
            const auto keeps = [floor = (double)p.min_p](const Entry &x) { return x.w >= floor; };
            e_.erase(std::partition(e_.begin(), e_.end(), keeps), e_.end());
        }
        mass_ = e_.size() < n_vocab ? weight_of(e_.size()) : z;
    }

    size_t size() const { return e_.size(); }
    int32_t id(size_t i) const { return e_[i].id; }
    // weight of candidate i; the kept candidates' weights sum to mass()
    double weight(size_t i) const { return e_[i].w; }
    double mass() const { return mass_; }

private:
    // The weight of the first n candidates, summed in four chains (not one add after another) in a fixed order.
    double weight_of(size_t n) const {
        double z[4] = {0, 0, 0, 0};
        size_t i = 0;
        for (; i + 4 <= n; i += 4)
            for (int k = 0; k < 4; k++) z[k] += e_[i + k].w;
        for (; i < n; i++) z[0] += e_[i].w;
        return (z[0] + z[1]) + (z[2] + z[3]);
    }

    // Keeps the smallest set of best-ranked candidates whose weight reaches need: within the ranked head [0, head)
    // if it holds that much, else past it by partitioning around pivots (quickselect on the accumulated weight; the
    // last few sorted).
    void cut_top_p(double need, size_t head) {
        double cum = 0;  // weight of [0, lo)
        for (size_t i = 0; i < head; i++) {
            cum += e_[i].w;
            if (cum >= need) {
                e_.resize(i + 1);
                return;
            }
        }
        size_t lo = head, hi = e_.size();  // [0, lo) kept, the cut lies in (lo, hi]
        while (hi - lo > 64) {
            const Entry pivot = median3(e_[lo], e_[lo + (hi - lo) / 2], e_[hi - 1]);
            const auto mid = std::partition(e_.begin() + (ptrdiff_t)lo, e_.begin() + (ptrdiff_t)hi,
                                            [&](const Entry &x) { return better(x, pivot); });
            const size_t m = (size_t)(mid - e_.begin());
            double left = 0;
            for (size_t i = lo; i < m; i++) left += e_[i].w;
            if (cum + left >= need) {  // the cut is among the better ones
                hi = m;
                continue;
            }
            // all of them are kept, and the pivot too (the best of the rest: every round makes progress)
            cum += left;
            std::iter_swap(e_.begin() + (ptrdiff_t)m, std::find_if(mid, e_.begin() + (ptrdiff_t)hi, [&](const Entry &x) {
                               return x.id == pivot.id;
                           }));
            cum += e_[m].w;
            lo = m + 1;
            if (cum >= need) {
                e_.resize(lo);
                return;
            }
        }
        std::sort(e_.begin() + (ptrdiff_t)lo, e_.begin() + (ptrdiff_t)hi, better);
        for (size_t i = lo; i < hi; i++) {
            cum += e_[i].w;
            if (cum >= need) {
                e_.resize(i + 1);
                return;
            }
        }
        e_.resize(hi);  // rounding: the whole range
    }

    static Entry median3(const Entry &a, const Entry &b, const Entry &c) {
        if (better(a, b)) return better(b, c) ? b : (better(a, c) ? c : a);
        return better(a, c) ? a : (better(b, c) ? c : b);
    }

    std::vector<Entry> e_;
    double mass_ = 0;
};

}  // namespace

int32_t sample_token(const float *logits, uint32_t n_vocab, const dfl_sampling &p, const int32_t *history,
                     uint32_t n_history, uint64_t *rng_state) {
    if (n_vocab == 0) fail(DFL_ERR_INVALID, "sample: empty vocabulary");
    const Overrides over = penalties(logits, n_vocab, p, history, n_history);
    if (!(p.temperature > 0.0f)) return argmax_token(logits, n_vocab, over);

    Candidates c(logits, n_vocab, p, over);
    double u = (double)(rng_next(rng_state) >> 11) * (1.0 / 9007199254740992.0) * c.mass();
    for (size_t i = 0; i < c.size(); i++) {
        u -= c.weight(i);
        if (u < 0) return c.id(i);
    }
    // rounding left u past the end: the heaviest candidate (the last may have weight 0)
    size_t best = 0;
    for (size_t i = 1; i < c.size(); i++)
        if (c.weight(i) > c.weight(best)) best = i;
    return c.id(best);
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
    Candidates c(logits, n_vocab, p, over);
    uint32_t n = 0;
    for (size_t i = 0; i < c.size(); i++) {
        if (const double pr = c.weight(i) / c.mass(); pr > 0) {
            ids[n] = c.id(i);
            probs[n++] = pr;
        }
    }
    return n;
}

}  // namespace dfl

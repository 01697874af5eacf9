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

// The sum of w(0..n-1) in four chains (not one add after another) in a fixed order: the mass a draw scales by.
template <typename W>
double chain_sum(size_t n, W w) {
    double z[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) z[k] += w(i + k);
    for (; i < n; i++) z[0] += w(i);
    return (z[0] + z[1]) + (z[2] + z[3]);
}

// A generator output as a draw in [0, 1) (53 bits).
double unit_draw(uint64_t r) { return (double)(r >> 11) * (1.0 / 9007199254740992.0); }

// The first index at which x minus the weights w(0..i), taken in order, falls below zero; n when it never does.
template <typename W>
size_t first_below(size_t n, W w, double x) {
    for (size_t i = 0; i < n; i++) {
        x -= w(i);
        if (x < 0) return i;
    }
    return n;
}

// The index a draw x in [0, the weights' mass) picks: first_below, or where rounding left x past the end, the
// heaviest (the last may have weight 0).
template <typename W>
size_t draw_index(size_t n, W w, double x) {
    const size_t i = first_below(n, w, x);
    if (i < n) return i;
    size_t best = 0;
    for (size_t j = 1; j < n; j++)
        if (w(j) > w(best)) best = j;
    return best;
}

// Tokens a draw without top-k ranks first (the head), the rest in an order fixed by the input.
constexpr size_t kRankedHead = 64;

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
        const size_t head = std::min<size_t>(n_vocab, top_k ? (size_t)p.top_k : kRankedHead);
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
    double weight_of(size_t n) const {
        return chain_sum(n, [this](size_t i) { return e_[i].w; });
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
    return c.id(draw_index(c.size(), [&c](size_t i) { return c.weight(i); }, unit_draw(rng_next(rng_state)) * c.mass()));
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

// The draw from candidates. Why it is sample_token's draw: with no top-k, sample_token ranks the best kRankedHead
// tokens (logit / temperature, larger first, lower id on ties) and walks them first, each weighted exp16(l - max)
// exactly as here, and scales its draw by the mass z of every kept weight. The candidates are forward_topk's best k
// by raw logit; those strictly above the last finite candidate's level after the division (the trusted prefix) are
// the head's first tokens in the same order, because no other token reaches that level. z is not known, but it lies
// between the candidates' weights and those plus a bound on the rest: the row's log-sum-exp at temperature 1 less the
// candidates' terms, each remaining term at most the last candidate's (raw_b) term, so at a temperature T <= 1 the
// rest weighs at most exp((raw_b - raw_max)(1/T - 1)) times that (slack added for rounding). A draw or a top-p cut
// that lands on the same trusted token at both ends of that range is the one sample_token makes (both walks are
// monotone in their start); anything else is -1.
int32_t sample_candidates(const int32_t *ids, const float *logits, const uint8_t *suppressed, uint32_t k, float lse,
                          uint32_t n_vocab, const dfl_sampling &p, uint64_t *rng_state) {
    const bool top_k = p.top_k > 0 && (uint32_t)p.top_k < n_vocab;
    if (!(p.temperature > 0.0f) || p.temperature > 1.0f || top_k || p.min_p > 0.0f || k == 0 || !std::isfinite(lse))
        return -1;
    // the finite candidates in rank order; a pad (id -1) means the row had fewer finite logits: nothing lies outside.
    // Suppressed ones weigh 0 in the draw, as in sample_token's row, but their terms leave the log-sum-exp's rest.
    std::vector<float> raw, l, gone;
    std::vector<int32_t> id;
    bool padded = false;
    for (uint32_t i = 0; i < k; i++) {
        if (ids[i] < 0) {
            padded = true;
            continue;
        }
        if (std::isnan(logits[i])) return -1;
        if (std::isinf(logits[i])) continue;  // weight 0 either way
        if (suppressed && suppressed[i]) {
            gone.push_back(logits[i]);
            continue;
        }
        raw.push_back(logits[i]);
        l.push_back(logits[i] / p.temperature);
        id.push_back(ids[i]);
    }
    const size_t n = l.size();
    if (n == 0) return -1;
    for (size_t i = 1; i < n; i++)
        if (!(l[i - 1] > l[i] || (l[i - 1] == l[i] && id[i - 1] < id[i]))) return -1;  // not sample_token's rank order
    const bool whole = padded || n == n_vocab;
    size_t trusted = n;
    if (!whole)
        while (trusted > 0 && l[trusted - 1] == l[n - 1]) trusted--;
    trusted = std::min(trusted, kRankedHead);  // past the head sample_token's order is not the rank
    if (trusted == 0) return -1;

    std::vector<float> wf(n);
    exp_shifted(l.data(), l[0], wf.data(), n);
    const auto w = [&wf](size_t i) { return (double)wf[i]; };
    const double known = chain_sum(n, w);
    double rest = 0;  // bound on the weight of the tokens that are not candidates
    if (!whole) {
        const double raw_max = raw[0], raw_b = raw[n - 1];
        const double e = std::exp((double)lse - raw_max);
        double c1 = 0;
        for (size_t i = 0; i < n; i++) c1 += std::exp((double)raw[i] - raw_max);
        for (const float g : gone) c1 += std::exp((double)g - raw_max);
        const double r1 = std::max(0.0, e - c1) + 1e-4 * e;
        const double slack = 1 + 1e-5 + 5e-7 * (std::fabs(l[0]) + std::fabs(l[n - 1]) + 1);
        rest = r1 * std::exp((raw_b - raw_max) * (1.0 / (double)p.temperature - 1.0)) * slack;
    }
    const double z_lo = known * (1 - 1e-9), z_hi = (known + rest) * (1 + 1e-9);  // sample_token's z lies between

    uint64_t next = *rng_state;
    const double v = unit_draw(rng_next(&next));
    size_t pick;
    if (p.top_p < 1.0f) {
        // the cut: the first rank whose running weight reaches top_p z, the same at both ends
        const auto cut = [&](double need) {
            double cum = 0;
            for (size_t i = 0; i < trusted; i++) {
                cum += w(i);
                if (cum >= need) return i;
            }
            return trusted;
        };
        const size_t c = cut((double)p.top_p * z_lo);
        if (c >= trusted || cut((double)p.top_p * z_hi) != c) return -1;
        const size_t kept = c + 1;
        pick = draw_index(kept, w, v * chain_sum(kept, w));
    } else {
        pick = first_below(trusted, w, v * z_lo);
        if (pick >= trusted || first_below(trusted, w, v * z_hi) != pick) return -1;
    }
    *rng_state = next;
    return id[pick];
}

}  // namespace dfl

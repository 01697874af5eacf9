// CPU top-k of logits rows with their log-sum-exp (cpu_ops.h: topk_rows), in fixed spans merged in order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vec16.h"

namespace dfl {

namespace {

using Cand = std::pair<float, int32_t>;  // (value, id)

// Larger value first, lower id on ties.
bool better(const Cand &a, const Cand &b) { return a.first > b.first || (a.first == b.first && a.second < b.second); }

float clean(float v) { return v != v ? -std::numeric_limits<float>::infinity() : v; }

// Elements [i0, i1) of a row: its k best candidates (best first), its largest value and the sum of exp(x - that) (0
// when every value is -inf or NaN).
struct TopkSpan {
    std::vector<Cand> best;
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
};

// The span's max and sum of exp(x - max) 16 lanes at a time: the exps by exp16_nonpos (within 2 ulp), each lane's sum
// in double, the lanes added in a fixed order. One exp in double an element had been ~0.43 ms a 151,936-logit row at
// 2 threads, 5 % of a Qwen3-0.6B decode step at 16.
DFL_WIDE_MULTIVERSION static void span_max_sum(const float *x, int64_t n, float *mx_out, double *sum_out) {
    const float ninf = -std::numeric_limits<float>::infinity();
    const auto block = [&](int64_t i) {  // 16 values from i, NaN and lanes past n as -inf
        v16f v;
        if (i + 16 <= n) {
            v = load16f(x + i);
        } else {
            float t[16];
            for (int l = 0; l < 16; l++) t[l] = i + l < n ? x[i + l] : ninf;
            v = load16f(t);
        }
        return v == v ? v : v16f{} + ninf;
    };
    v16f m = v16f{} + ninf;
    for (int64_t i = 0; i < n; i += 16) {
        const v16f v = block(i);
        m = v > m ? v : m;
    }
    const float mx = max_lane(m);
    *mx_out = mx;
    *sum_out = 0;
    if (mx == ninf) return;
    typedef double v8d __attribute__((vector_size(64)));
    v8d lo{}, hi{};
    for (int64_t i = 0; i < n; i += 16) {
        const v16f e = exp16_nonpos(block(i) - mx);
        lo += __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3, 4, 5, 6, 7), v8d);
        hi += __builtin_convertvector(__builtin_shufflevector(e, e, 8, 9, 10, 11, 12, 13, 14, 15), v8d);
    }
    const v8d t = lo + hi;
    *sum_out = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
}

// The first index in [i, n) at or after i whose value beats thr (NaN never does), or n: 16 at a time.
DFL_WIDE_MULTIVERSION static int64_t next_above(const float *x, int64_t i, int64_t n, float thr) {
    const v16f none = v16f{} - std::numeric_limits<float>::infinity();
    for (; i + 16 <= n; i += 16) {
        const v16f v = load16f(x + i);
        if (max_lane(v == v ? v : none) > thr)
            for (int l = 0; l < 16; l++)
                if (x[i + l] > thr) return i + l;
    }
    for (; i < n; i++)
        if (x[i] > thr) return i;
    return n;
}

void topk_span(const float *x, int64_t i0, int64_t i1, int k, TopkSpan &out) {
    std::vector<Cand> &heap = out.best;  // a heap whose root is the worst of the best k seen so far
    heap.clear();
    heap.reserve((size_t)k);
    float mx;
    span_max_sum(x + i0, i1 - i0, &mx, &out.sum);
    out.mx = mx;
    // Only values above the heap's worst can enter once it is full; ascending ids, so an equal value never does.
    for (int64_t i = i0; i < i1; i++) {
        if ((int)heap.size() == k) {
            i = next_above(x, i, i1, heap.front().first);
            if (i == i1) break;
        }
        const float v = clean(x[i]);
        if (v == -std::numeric_limits<float>::infinity()) continue;
        if ((int)heap.size() < k) {
            heap.emplace_back(v, (int32_t)i);
            std::push_heap(heap.begin(), heap.end(), better);
        } else {
            std::pop_heap(heap.begin(), heap.end(), better);
            heap.back() = {v, (int32_t)i};
            std::push_heap(heap.begin(), heap.end(), better);
        }
    }
    std::sort(heap.begin(), heap.end(), better);
}

// A row's result from its spans, in span order: the best k of their candidates, and the log of the sum of their
// sums rescaled to the largest value.
void topk_merge(const TopkSpan *spans, int64_t n_spans, int k, int32_t *ids, float *vals, float *lse) {
    std::vector<Cand> all;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < n_spans; c++) {
        all.insert(all.end(), spans[c].best.begin(), spans[c].best.end());
        if (spans[c].sum > 0) mx = std::max(mx, spans[c].mx);
    }
    double sum = 0;
    for (int64_t c = 0; c < n_spans; c++)
        if (spans[c].sum > 0) sum += spans[c].sum * std::exp(spans[c].mx - mx);
    const size_t keep = std::min(all.size(), (size_t)k);
    std::partial_sort(all.begin(), all.begin() + (std::ptrdiff_t)keep, all.end(), better);
    for (int j = 0; j < k; j++) {
        ids[j] = j < (int)keep ? all[(size_t)j].second : -1;
        vals[j] = j < (int)keep ? all[(size_t)j].first : -std::numeric_limits<float>::infinity();
    }
    *lse = sum > 0 ? (float)(mx + std::log(sum)) : -std::numeric_limits<float>::infinity();
}

// The spans a row of n is split into: fixed, whatever the thread count, so a row's result is the same on any pool.
// A vocabulary row (151,936 logits, one exp each in double) took 1.3 ms on one thread: the largest serial part of a
// Qwen3-0.6B decode step at 16 threads. Spans only where k is small (their candidates are merged).
constexpr int64_t kTopkSpan = 16384;
int64_t topk_spans(int64_t n, int k) { return k <= 64 ? std::max<int64_t>(1, ceil_div(n, kTopkSpan)) : 1; }

}  // namespace

void topk_rows(ThreadPool &pool, const float *x, int64_t rows, int64_t n, int k, int32_t *ids, float *vals,
               float *lse) {
    const int64_t n_spans = topk_spans(n, k), span = ceil_div(n, n_spans);
    std::vector<TopkSpan> spans((size_t)(rows * n_spans));
    pool.parallel_for(rows * n_spans, [&](int64_t task, int) {
        const int64_t r = task / n_spans, c = task % n_spans;
        topk_span(x + r * n, c * span, std::min(n, (c + 1) * span), k, spans[(size_t)task]);
    });
    for (int64_t r = 0; r < rows; r++)
        topk_merge(spans.data() + r * n_spans, n_spans, k, ids + r * k, vals + r * k, lse + r);
}

}  // namespace dfl

// CPU attention over the paged KV cache (cpu_ops.h: attention): tiles of kAttnTile positions, online softmax, the
// same bits for a row whichever other rows share its call.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vec16.h"
#include "quant.h"

namespace dfl {

// a[d] = fma(s[j], V[j][d], a[d]) for j in order: each 128-float slice of a (a head of 128: all of it) stays in
// registers across the rows, eight independent chains, so two FMA ports stay busy through the FMA's latency.
template <int kVecs>
DFL_VEC_INLINE void accumulate_slice(const float *s, const float *V, int64_t cnt, int hd, float *a) {
    v16f acc[kVecs];
#pragma GCC unroll 8
    for (int k = 0; k < kVecs; k++) acc[k] = load16f(a + 16 * k);
    for (int64_t j = 0; j < cnt; j++) {
        const float *v = V + j * hd;
        const v16f w = v16f{} + s[j];
#pragma GCC unroll 8
        for (int k = 0; k < kVecs; k++) acc[k] = fma16(w, load16f(v + 16 * k), acc[k]);
    }
#pragma GCC unroll 8
    for (int k = 0; k < kVecs; k++) std::memcpy(a + 16 * k, &acc[k], 64);
}

DFL_WIDE_MULTIVERSION static void accumulate_rows(const float *s, const float *V, int64_t cnt, int hd, float *a) {
    int d = 0;
    for (; d + 128 <= hd; d += 128) accumulate_slice<8>(s, V + d, cnt, hd, a + d);
    for (; d + 64 <= hd; d += 64) accumulate_slice<4>(s, V + d, cnt, hd, a + d);
    for (; d < hd; d++)
        for (int64_t j = 0; j < cnt; j++) a[d] = __builtin_fmaf(s[j], V[j * hd + d], a[d]);
}

// One query row's scores of a tile, s[j] for j in [b0, b1) (b0, b1 multiples of 16 within the tile, covering the
// row's own range [j0, j1)): scaled inside [j0, j1), -inf outside; returns their max.
DFL_WIDE_MULTIVERSION static float scale_scores(float *s, int64_t b0, int64_t b1, int64_t j0, int64_t j1, float scale) {
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int64_t j = b0; j < b1; j += 16) {
        const v16f v = load16f(s + j) * scale;
        std::memcpy(s + j, &v, sizeof v);
    }
    // the few positions outside the row's range one at a time: GCC 12 turned a lane-position range test into 32
    // scalar compares a vector
    for (int64_t j = b0; j < j0; j++) s[j] = ninf;
    for (int64_t j = j1; j < b1; j++) s[j] = ninf;
    v16f mx = v16f{} + ninf;
    for (int64_t j = b0; j < b1; j += 16) {
        const v16f y = load16f(s + j);
        mx = y > mx ? y : mx;
    }
    return max_lane(mx);
}

// s[j] = exp(s[j] - mx) for j in [b0, b1) (multiples of 16; s[j] - mx <= 0 or -inf, whose exp is +0).
DFL_WIDE_MULTIVERSION static void exp_sub(float *s, int64_t b0, int64_t b1, float mx) {
    for (int64_t j = b0; j < b1; j += 16) {
        const v16f e = exp16_nonpos(load16f(s + j) - mx);
        std::memcpy(s + j, &e, sizeof e);
    }
}

// A query row that sees some of an attention tile: its scores (softmax numerators once exp_sub ran), its index, its
// part of the tile [j0, j1), its rescale of what it summed before, and the sum of its numerators.
struct LiveRow {
    float *s;
    size_t idx;
    int64_t j0, j1;
    float corr, sum;
};

// rows[r].sum = s[b0] + s[b0 + 1] + ... + s[b1 - 1] of each row, in order of j, one term at a time: a tree verify's
// row sees its ancestors with its masked siblings' exact zeros between them, and the same token decoded sees them
// side by side, so only a sum in order, where adding an exact +0 changes nothing, gives both the same bits (16 lanes
// of partial sums did not: TestDemoPairSpeculative's tree of 22 lost greedy equality). Several rows at once, so their
// dependent adds overlap; the zeros outside a row's own range change nothing either.
static void row_sums(LiveRow *rows, int nr, int64_t b0, int64_t b1) {
    constexpr int kRows = 8;
    for (int r0 = 0; r0 < nr; r0 += kRows) {
        const int n = std::min(kRows, nr - r0);
        float acc[kRows] = {};
        for (int64_t j = b0; j < b1; j++)
#pragma GCC unroll 8
            for (int r = 0; r < kRows; r++)
                if (r < n) acc[r] += rows[r0 + r].s[j];
        for (int r = 0; r < n; r++) rows[r0 + r].sum = acc[r];
    }
}

// Attention's scores, q . key: 16 partial sums (element i goes to partial i % 16, fused multiply-adds in order of i
// from +0), then the fixed reduction t_l = p_l + p_{l+8}, ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)), then any
// elements past the last 16 fused in order. Two kernels give these same bits: score_keys_rows (a prompt's rows, 8
// query rows x 16 keys a call over the tile transposed, so each K register feeds 8 rows) and score_keys (a few rows,
// a decode step's, one key at a time), so a key's score does not depend on which kernel or which other rows scored it.
static constexpr int kQueryGroup = 8;

DFL_VEC_INLINE float reduce_partials(v16f p) {
    const float t0 = p[0] + p[8], t1 = p[1] + p[9], t2 = p[2] + p[10], t3 = p[3] + p[11];
    const float t4 = p[4] + p[12], t5 = p[5] + p[13], t6 = p[6] + p[14], t7 = p[7] + p[15];
    return ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7));
}

// reduce_partials of four keys' partials at once, lanes 0..3 of the result: the same adds of the same pairs (lane l
// with l + 8, then l + 4, l + 2, l + 1), done for four keys by each vector add instead of one scalar add a pair.
DFL_VEC_INLINE v16f reduce_partials4(v16f a0, v16f a1, v16f a2, v16f a3) {
    // t_l = p_l + p_{l+8}: keys 0 and 1 (2 and 3) side by side, 8 lanes each
    const v16f t01 = __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                     __builtin_shufflevector(a0, a1, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const v16f t23 = __builtin_shufflevector(a2, a3, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                     __builtin_shufflevector(a2, a3, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    // u_l = t_l + t_{l+4}: four lanes a key
    const v16f u = __builtin_shufflevector(t01, t23, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                   __builtin_shufflevector(t01, t23, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    // v0 = u0 + u2, v1 = u1 + u3: two lanes a key
    const v16f v = __builtin_shufflevector(u, u, 0, 1, 4, 5, 8, 9, 12, 13, 0, 1, 4, 5, 8, 9, 12, 13) +
                   __builtin_shufflevector(u, u, 2, 3, 6, 7, 10, 11, 14, 15, 2, 3, 6, 7, 10, 11, 14, 15);
    // v0 + v1: a lane a key
    return __builtin_shufflevector(v, v, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6) +
           __builtin_shufflevector(v, v, 1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7);
}

// out[c] = score(q, key c) for n keys of K (rows of hd).
DFL_WIDE_MULTIVERSION static void score_keys(const float *K, const float *q, int hd, int64_t n, float *out) {
    const int hd16 = hd / 16 * 16;
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
        const float *k0 = K + c * hd, *k1 = k0 + hd, *k2 = k1 + hd, *k3 = k2 + hd;
        v16f a0{}, a1{}, a2{}, a3{};
        for (int i = 0; i < hd16; i += 16) {
            const v16f x = load16f(q + i);
            a0 = fma16(x, load16f(k0 + i), a0);
            a1 = fma16(x, load16f(k1 + i), a1);
            a2 = fma16(x, load16f(k2 + i), a2);
            a3 = fma16(x, load16f(k3 + i), a3);
        }
        const v16f r = reduce_partials4(a0, a1, a2, a3);
        float r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
        for (int i = hd16; i < hd; i++) {
            r0 = __builtin_fmaf(q[i], k0[i], r0);
            r1 = __builtin_fmaf(q[i], k1[i], r1);
            r2 = __builtin_fmaf(q[i], k2[i], r2);
            r3 = __builtin_fmaf(q[i], k3[i], r3);
        }
        out[c] = r0, out[c + 1] = r1, out[c + 2] = r2, out[c + 3] = r3;
    }
    for (; c < n; c++) {
        const float *k = K + c * hd;
        v16f a{};
        for (int i = 0; i < hd16; i += 16) a = fma16(load16f(q + i), load16f(k + i), a);
        float r = reduce_partials(a);
        for (int i = hd16; i < hd; i++) r = __builtin_fmaf(q[i], k[i], r);
        out[c] = r;
    }
}

// S[r * ld_s + c] = score(qs[r], key c) for 16 keys c and kQueryGroup rows r. KT holds the keys transposed (KT[i * ld
// + c] = element i of key c), so partial l of all 16 keys is one register, and the reduction runs lane-wise: a score
// costs 1/16 of a register operation per element instead of a horizontal sum per key. hd % 16 == 0.
DFL_WIDE_MULTIVERSION static void score_keys_rows(const float *const *qs, const float *KT, int64_t ld, int hd,
                                                  float *S, int64_t ld_s) {
    v16f p[16][kQueryGroup];
    for (int l = 0; l < 16; l++) {
        v16f a[kQueryGroup];
#pragma GCC unroll 8
        for (int r = 0; r < kQueryGroup; r++) a[r] = v16f{};
        for (int i = 0; i < hd; i += 16) {
            const v16f k = load16f(KT + (int64_t)(i + l) * ld);
#pragma GCC unroll 8
            for (int r = 0; r < kQueryGroup; r++) a[r] = fma16(v16f{} + qs[r][i + l], k, a[r]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < kQueryGroup; r++) p[l][r] = a[r];
    }
    for (int r = 0; r < kQueryGroup; r++) {
        v16f t[8];
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) t[l] = p[l][r] + p[l + 8][r];
        const v16f v = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
        std::memcpy(S + r * ld_s, &v, 64);
    }
}

size_t attention_scratch(int head_dim, int group, int64_t n_tok, int heads) {
    // per KV head: K and V tiles, acc, m, l of its query rows; shared: K transposed and the scores of one head's rows
    // (plus kQueryGroup rows of padding)
    return (size_t)heads * (2 * kAttnTile * head_dim + (size_t)n_tok * group * (head_dim + 2)) +
           (size_t)(kAttnTile * head_dim) + (size_t)(n_tok * group + kQueryGroup) * kAttnTile;
}

static void prefetch_kv_row(const PagedKV &kv, int64_t slot, int kvh) {
    prefetch_bytes(kv.k_in(slot, kvh), kv.k_row);
    prefetch_bytes(kv.v_in(slot, kvh), kv.v_row);
}

// slots[j] = kv.slot(p0 + j) for j in [0, n): one division a tile instead of one a row (four a position, with the
// prefetches, were a tenth of a small model's decode attention).
static void tile_slots(const PagedKV &kv, int64_t p0, int64_t n, int64_t *slots) {
    int64_t blk = p0 / kv.block_size, off = p0 % kv.block_size;
    for (int64_t j = 0; j < n; j++) {
        slots[j] = (int64_t)kv.blocks[blk] * kv.block_size + off;
        if (++off == kv.block_size) off = 0, blk++;
    }
}

// One KV head's part of a tile: its rows' scores against the converted K tile, their softmax numerators and sums,
// and the V sums into acc (online softmax: m and l are its rows' running max and sum).
struct HeadTile {
    const float *Kt, *Vt;
    float *acc, *m, *l;
    const float *const *qrows;
};

void attention(const PagedKV &kv, int g0, int g1, int n_head, const float *q, int64_t q_stride, float *out,
               int64_t out_stride, int64_t n_past, int64_t i0, int64_t i1, float scale, float *scratch,
               const AttnMask &mask) {
    const int hd = kv.head_dim;
    const int group = n_head / kv.n_kv;
    const int nheads = g1 - g0;
    const int64_t nt = i1 - i0;
    const int64_t nrow = nt * group;
    // per head h (of g0 + h): K and V tiles, then acc, m, l; then the shared K transposed and scores
    float *Kt0 = scratch;
    float *Vt0 = Kt0 + (size_t)nheads * kAttnTile * hd;
    float *acc0 = Vt0 + (size_t)nheads * kAttnTile * hd;
    float *m0 = acc0 + (size_t)nheads * nrow * hd;
    float *l0 = m0 + (size_t)nheads * nrow;
    float *KT = l0 + (size_t)nheads * nrow;  // the K tile transposed, for score_keys_rows
    float *S = KT + (size_t)kAttnTile * hd;  // the tile's scores, kAttnTile per query row (i, hh)
    std::fill(acc0, acc0 + (size_t)nheads * nrow * hd, 0.0f);
    std::fill(m0, m0 + (size_t)nheads * nrow, -std::numeric_limits<float>::infinity());
    std::fill(l0, l0 + (size_t)nheads * nrow, 0.0f);
    // head h's query row r = (i - i0) * group + hh, padded to whole groups of kQueryGroup with copies of the last row
    const int64_t qn = nrow + kQueryGroup;
    std::vector<const float *> qrows((size_t)(nheads * qn));
    for (int h = 0; h < nheads; h++) {
        const float **qr = qrows.data() + (size_t)h * qn;
        for (int64_t r = 0; r < nrow; r++)
            qr[r] = q + (i0 + r / group) * q_stride + (int64_t)((g0 + h) * group + r % group) * hd;
        for (int64_t r = nrow; r < qn; r++) qr[r] = qr[nrow - 1];
    }
    std::vector<LiveRow> live((size_t)nrow);

    // the positions any row of [i0, i1) sees: lo and hi grow with i under every mask
    const int64_t n_new = mask.causal ? i1 : mask.n_new;
    int64_t p_start, p_end, unused;
    attn_range(n_past + i0, n_past, n_new, mask.causal, mask.window, &p_start, &unused);
    attn_range(n_past + i1 - 1, n_past, n_new, mask.causal, mask.window, &unused, &p_end);
    // The transposed tile pays off when kQueryGroup real rows share it; fewer rows (a decode step: group rows, 2 for
    // Qwen3-0.6B) would transpose hd x 16 floats per key group and score 8 rows for 2, so they use score_keys.
    const bool wide = hd % 16 == 0 && nrow >= kQueryGroup;
    // tiles stay aligned to kAttnTile from position 0, so a causal call splits its sums exactly as before
    for (int64_t p0 = p_start / kAttnTile * kAttnTile; p0 < p_end; p0 += kAttnTile) {
        const int64_t pa = std::max(p0, p_start);  // first position of the tile anyone sees
        const int64_t pn = std::min<int64_t>(kAttnTile, p_end - p0);
        // The union [u0, u1) of the tile's key ranges of the rows that see it (the same for every head). A key's
        // score is the same bits by either kernel, so scoring keys a row does not use changes nothing for that row;
        // it lets kQueryGroup rows share each K register load.
        int64_t u0 = pn, u1 = 0;
        for (int64_t i = i0; i < i1; i++) {
            int64_t lo, hi;
            attn_range(n_past + i, n_past, n_new, mask.causal, mask.window, &lo, &hi);
            if (p0 >= hi || p0 + pn <= lo) continue;
            u0 = std::min(u0, std::max<int64_t>(0, lo - p0));
            u1 = std::max(u1, std::min(pn, hi - p0));
        }
        if (u0 >= u1) continue;
        // The cache rows are scattered (paged), and in a decode step not in any cache since the step before: each
        // conversion waited for its row (6 % of a 1-thread Qwen3-0.6B decode step, attention's largest part), so the
        // rows kAttnAhead positions on are asked for while these convert. A position's heads are side by side in the
        // cache, so the task's heads are converted position by position: one run of bytes a position instead of a
        // row a head two kilobytes apart (Qwen3-0.6B: 8 KV heads of 256 bytes), which the hardware prefetchers follow.
        constexpr int64_t kAttnAhead = 8;
        int64_t slots[kAttnTile];
        tile_slots(kv, pa, pn - (pa - p0), slots + (pa - p0));
        for (int64_t j = pa - p0; j < std::min(pn, pa - p0 + kAttnAhead); j++)
            for (int h = g0; h < g1; h++) prefetch_kv_row(kv, slots[j], h);
        for (int64_t j = pa - p0; j < pn; j++) {
            if (j + kAttnAhead < pn)
                for (int h = g0; h < g1; h++) prefetch_kv_row(kv, slots[j + kAttnAhead], h);
            for (int h = 0; h < nheads; h++) {
                dequant_row(kv.type_k, kv.k_in(slots[j], g0 + h), Kt0 + ((size_t)h * kAttnTile + j) * hd, hd);
                dequant_row(kv.type_v, kv.v_in(slots[j], g0 + h), Vt0 + ((size_t)h * kAttnTile + j) * hd, hd);
            }
        }
        for (int h = 0; h < nheads; h++) {
            HeadTile ht;
            ht.Kt = Kt0 + (size_t)h * kAttnTile * hd;
            ht.Vt = Vt0 + (size_t)h * kAttnTile * hd;
            ht.acc = acc0 + (size_t)h * nrow * hd;
            ht.m = m0 + (size_t)h * nrow;
            ht.l = l0 + (size_t)h * nrow;
            ht.qrows = qrows.data() + (size_t)h * qn;
            if (wide)
                for (int d = 0; d < hd; d++)
                    for (int64_t j = pa - p0; j < pn; j++) KT[(int64_t)d * kAttnTile + j] = ht.Kt[j * hd + d];
            // scores first, for every query row that sees the tile and the union of their key ranges
            int64_t jw = u0;
            if (wide)
                for (; jw + 16 <= u1; jw += 16)
                    for (int64_t r = 0; r < nrow; r += kQueryGroup)
                        score_keys_rows(ht.qrows + r, KT + jw, kAttnTile, hd, S + r * kAttnTile + jw, kAttnTile);
            if (jw < u1)
                for (int64_t r = 0; r < nrow; r++)
                    score_keys(ht.Kt + jw * hd, ht.qrows[(size_t)r], hd, u1 - jw, S + r * kAttnTile + jw);
            // Softmax numerators of every row that sees the tile, over the 16-aligned span [b0, b1) of the union (zeros
            // outside a row's own range), then their sums several rows at once, then each row's rescale and V sums.
            const int64_t b0 = u0 / 16 * 16, b1 = std::min<int64_t>(kAttnTile, (u1 + 15) / 16 * 16);
            int nlive = 0;
            for (int64_t i = i0; i < i1; i++) {
                int64_t lo, hi;
                attn_range(n_past + i, n_past, n_new, mask.causal, mask.window, &lo, &hi);
                if (p0 >= hi || p0 + pn <= lo) continue;
                // this row's part of the tile: [j0, j1)
                const int64_t j0 = std::max<int64_t>(0, lo - p0), j1 = std::min(pn, hi - p0);
                for (int hh = 0; hh < group; hh++) {
                    const size_t idx = (size_t)(i - i0) * group + hh;
                    float *sr = S + (int64_t)idx * kAttnTile;
                    float mx = scale_scores(sr, b0, b1, j0, j1, scale);
                    if (mask.vis) {
                        mx = -std::numeric_limits<float>::infinity();
                        for (int64_t j = j0; j < j1; j++) {
                            if (!attn_visible(mask.vis[i], p0 + j, n_past)) sr[j] = -std::numeric_limits<float>::infinity();
                            mx = std::max(mx, sr[j]);
                        }
                    }
                    const float mnew = std::max(ht.m[idx], mx);
                    if (mnew == -std::numeric_limits<float>::infinity()) continue;  // nothing visible yet
                    exp_sub(sr, b0, b1, mnew);
                    live[nlive] = {sr, idx, j0, j1, std::exp(ht.m[idx] - mnew), 0};  // corr: 0 for the first tile (m = -inf)
                    ht.m[idx] = mnew;
                    nlive++;
                }
            }
            row_sums(live.data(), nlive, b0, b1);
            for (int k = 0; k < nlive; k++) {
                const LiveRow &lr = live[k];
                float *a = ht.acc + lr.idx * hd;
                ht.l[lr.idx] = ht.l[lr.idx] * lr.corr + lr.sum;
                scale_vec(lr.corr, a, hd);
                accumulate_rows(lr.s + lr.j0, ht.Vt + lr.j0 * hd, lr.j1 - lr.j0, hd, a);
            }
        }
    }
    for (int h = 0; h < nheads; h++)
        for (int64_t i = i0; i < i1; i++) {
            for (int hh = 0; hh < group; hh++) {
                const int qh = (g0 + h) * group + hh;
                const size_t idx = (size_t)(i - i0) * group + hh;
                const float inv = 1.0f / l0[(size_t)h * nrow + idx];
                float *o = out + i * out_stride + (int64_t)qh * hd;
                const float *a = acc0 + ((size_t)h * nrow + idx) * hd;
                for (int d = 0; d < hd; d++) o[d] = a[d] * inv;
            }
        }
}

}  // namespace dfl

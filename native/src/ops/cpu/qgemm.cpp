#include "ops/cpu/qgemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "quant.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define DFL_QGEMM_X86 1
#endif

namespace dfl {

DFL_MULTIVERSION void quantize_act_row(const float *x, int64_t n, int8_t *q, float *d, float *dsum) {
    for (int64_t b = 0; b < n / kActBlock; b++) {
        const float *xb = x + b * kActBlock;
        int8_t *qb = q + b * kActBlock;
        float amax = 0;
        for (int i = 0; i < kActBlock; i++) amax = std::max(amax, std::fabs(xb[i]));
        const float scale = amax / 127.0f;
        const float inv = amax > 0 ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < kActBlock; i++) {
            // |x * inv| <= 127 up to rounding; the clamp keeps -128 out (the AVX2 kernels rely on |a| <= 127)
            const float v = std::min(127.0f, std::max(-127.0f, std::nearbyint(xb[i] * inv)));
            qb[i] = (int8_t)v;
            sum += (int)v;
        }
        d[b] = scale;
        dsum[b] = scale * (float)sum;
    }
}

// Two plain 16-element sums a block, so that the compiler vectorizes them (one loop indexing sum[i / 16] stayed
// scalar: 6 % of a 2-thread pp512 profile, more than the quantizer itself).
DFL_MULTIVERSION void expand_act_row(const int8_t *q, int64_t n, int32_t *bias, int32_t *bias16) {
    const int64_t nb = n / kActBlock;
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *qb = q + b * kActBlock;
        int32_t lo = 0, hi = 0;
        for (int i = 0; i < 16; i++) lo += qb[i];
        for (int i = 16; i < 32; i++) hi += qb[i];
        bias[b] = -128 * (lo + hi);
        bias16[2 * b] = -32 * lo;
        bias16[2 * b + 1] = -32 * hi;
    }
}

// ---- portable kernels: one (row, token) dot at a time, integer sums per block, then float. ----

static float generic_dot_q8_0(const uint8_t *row, const QuantizedActs &A, int64_t t) {
    const BlockQ8_0 *w = (const BlockQ8_0 *)row;
    const int8_t *a = A.codes(t);
    const float *ad = A.scales(t);
    float acc = 0;
    for (int64_t b = 0; b < A.n_blocks(); b++) {
        int32_t s = 0;
        for (int i = 0; i < QK8_0; i++) s += (int32_t)w[b].qs[i] * a[b * QK8_0 + i];
        acc += (float)s * (f16_to_f32(w[b].d) * ad[b]);
    }
    return acc;
}

static float generic_dot_q4_0(const uint8_t *row, const QuantizedActs &A, int64_t t) {
    const BlockQ4_0 *w = (const BlockQ4_0 *)row;
    const int8_t *a = A.codes(t);
    const float *ad = A.scales(t);
    float acc = 0;
    for (int64_t b = 0; b < A.n_blocks(); b++) {
        const int8_t *ab = a + b * QK4_0;
        int32_t s = 0;
        for (int i = 0; i < QK4_0 / 2; i++)
            s += ((w[b].qs[i] & 0x0F) - 8) * ab[i] + ((w[b].qs[i] >> 4) - 8) * ab[i + QK4_0 / 2];
        acc += (float)s * (f16_to_f32(w[b].d) * ad[b]);
    }
    return acc;
}

static float generic_dot_q4_K(const uint8_t *row, const QuantizedActs &A, int64_t t) {
    const BlockQ4_K *w = (const BlockQ4_K *)row;
    const int8_t *a = A.codes(t);
    const float *ad = A.scales(t), *as = A.sums(t);
    float acc = 0;
    for (int64_t sb = 0; sb < A.n_in / QK_K; sb++) {
        const float d = f16_to_f32(w[sb].d), dmin = f16_to_f32(w[sb].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            q4k_scale_min(j, w[sb].scales, &sc, &m);
            const uint8_t *qs = w[sb].qs + 32 * (j / 2);
            const int8_t *aj = a + sb * QK_K + 32 * j;
            int32_t s = 0;
            for (int i = 0; i < 32; i++) s += (int32_t)(j % 2 ? qs[i] >> 4 : qs[i] & 0x0F) * aj[i];
            acc += (float)s * (d * (float)sc * ad[sb * 8 + j]) - dmin * (float)m * as[sb * 8 + j];
        }
    }
    return acc;
}

static float generic_dot_q6_K(const uint8_t *row, const QuantizedActs &A, int64_t t) {
    const BlockQ6_K *w = (const BlockQ6_K *)row;
    const int8_t *a = A.codes(t);
    const float *ad = A.scales(t);
    float acc = 0;
    for (int64_t sb = 0; sb < A.n_in / QK_K; sb++) {
        const float d = f16_to_f32(w[sb].d);
        for (int j = 0; j < 8; j++) {
            const int h = j / 4, k = j % 4;
            const uint8_t *ql = w[sb].ql + 64 * h + 32 * (k & 1), *qh = w[sb].qh + 32 * h;
            const int8_t *aj = a + sb * QK_K + 32 * j;
            for (int half = 0; half < 2; half++) {
                int32_t s = 0;
                for (int i = 16 * half; i < 16 * half + 16; i++) {
                    const int lo = k < 2 ? ql[i] & 0x0F : ql[i] >> 4;
                    const int q = (lo | (((qh[i] >> (2 * k)) & 3) << 4)) - 32;
                    s += q * aj[i];
                }
                acc += (float)s * (d * (float)w[sb].scales[2 * j + half] * ad[sb * 8 + j]);
            }
        }
    }
    return acc;
}

static void generic_gemm_block(const Weight &W, const QuantizedActs &A, int64_t r0, int64_t r1, int64_t t0,
                               int64_t t1, float *Y) {
    float (*dot)(const uint8_t *, const QuantizedActs &, int64_t) = W.type == DFL_TYPE_Q8_0   ? generic_dot_q8_0
                                                                    : W.type == DFL_TYPE_Q4_0 ? generic_dot_q4_0
                                                                    : W.type == DFL_TYPE_Q4_K ? generic_dot_q4_K
                                                                                              : generic_dot_q6_K;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t r = r0; r < r1; r++) Y[t * W.n_out + r] = dot(W.row(r), A, t);
}

// ---- SIMD kernels: qgemm_kernels.inc once per instruction set. ----

#ifdef DFL_QGEMM_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace qk_avx2 {
#define QK_DPBUSD 0
// 16 vector registers: 2 rows x 4 tokens keeps the 8 accumulators and the operands in registers.
constexpr int kShapeQ8_0[2] = {2, 4}, kShapeK[2] = {2, 4};
#include "ops/cpu/qgemm_kernels.inc"
#undef QK_DPBUSD
}  // namespace qk_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
namespace qk_avxvnni {
#define QK_DPBUSD 256
constexpr int kShapeQ8_0[2] = {2, 4}, kShapeK[2] = {2, 4};
#include "ops/cpu/qgemm_kernels.inc"
#undef QK_DPBUSD
}  // namespace qk_avxvnni
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")
// GCC 12's 512-bit intrinsics pass _mm512_undefined_*() as the unused merge source, which -Wuninitialized reports.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace qk_avx512vnni {
#define QK_DPBUSD 512
// 32 vector registers: 4 x 4 accumulators plus operands (2 x 8 and 4 x 6 measured no faster for q8_0).
constexpr int kShapeQ8_0[2] = {4, 4}, kShapeK[2] = {4, 4};
#include "ops/cpu/qgemm_kernels.inc"
#include "ops/cpu/qgemm_rows16.inc"
#undef QK_DPBUSD

// The AMX tiles' four operations in scalar code, with the instructions' semantics (tiles of this thread), so the
// AMX kernel's layout and arithmetic run in the tests on any AVX-512 VNNI machine.
namespace amx_emu {
struct Tiles {
    struct State {  // two slots: the kernels multiply one block while they finish the one before
        int32_t c[2][16][16];
        int8_t a[2][16][32];
        uint8_t b[2][8][64];
    };
    static State &st() {
        thread_local State s;
        return s;
    }
    static bool prepare() { return true; }
    template <int S>
    static void zero_c() {
        std::memset(st().c[S], 0, sizeof st().c[S]);
    }
    template <int S>
    static void load_a(const int8_t *p, int64_t stride) {
        for (int m = 0; m < 16; m++) std::memcpy(st().a[S][m], p + m * stride, 32);
    }
    template <int S>
    static void load_b(const uint8_t *p) {
        std::memcpy(st().b[S], p, sizeof st().b[S]);
    }
    template <int S>
    static void dot() {  // TDPBSUD: C[m][n] += sum over k, i of signed A[m][4k + i] * unsigned B[k][4n + i]
        State &s = st();
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 16; n++)
                for (int k = 0; k < 8; k++)
                    for (int i = 0; i < 4; i++)
                        s.c[S][m][n] += (int32_t)s.a[S][m][4 * k + i] * (int32_t)s.b[S][k][4 * n + i];
    }
    template <int S>
    static void store_c(int32_t *p) {
        std::memcpy(p, st().c[S], sizeof st().c[S]);
    }
};
#include "ops/cpu/qgemm_amx.inc"
}  // namespace amx_emu

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,amx-tile,amx-int8")
namespace amx {
// Linux hands out the AMX tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA), once a
// process; the tile configuration is a thread's own.
static bool amx_permitted() {
    static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    return ok;
}
struct Tiles {
    // slot S: tmm(S) C, 16 tokens x 16 int32; tmm(2 + S) A, 16 tokens x 32 codes; tmm(4 + S) B, 8 groups of 4 codes x
    // 16 rows. Two slots, so a block's tile product runs while the vector units finish the block before.
    static bool prepare() {
        thread_local bool configured = false;
        if (configured) return true;
        if (!amx_permitted()) return false;
        alignas(64) uint8_t cfg[64] = {};
        cfg[0] = 1;  // palette 1; then colsb (uint16) at byte 16 + 2i and rows at byte 48 + i of tile i
        const int colsb[6] = {64, 64, 32, 32, 64, 64}, rows[6] = {16, 16, 16, 16, 8, 8};
        for (int i = 0; i < 6; i++) {
            cfg[16 + 2 * i] = (uint8_t)colsb[i];
            cfg[48 + i] = (uint8_t)rows[i];
        }
        _tile_loadconfig(cfg);
        configured = true;
        return true;
    }
    // the intrinsics take the tile number as text (an immediate in the instruction): one branch a slot
    template <int S>
    static void zero_c() {
        if constexpr (S == 0) _tile_zero(0); else _tile_zero(1);
    }
    template <int S>
    static void load_a(const int8_t *p, int64_t stride) {
        if constexpr (S == 0) _tile_loadd(2, p, stride); else _tile_loadd(3, p, stride);
    }
    template <int S>
    static void load_b(const uint8_t *p) {
        if constexpr (S == 0) _tile_loadd(4, p, 64); else _tile_loadd(5, p, 64);
    }
    template <int S>
    static void dot() {
        if constexpr (S == 0) _tile_dpbsud(0, 2, 4); else _tile_dpbsud(1, 3, 5);
    }
    template <int S>
    static void store_c(int32_t *p) {
        if constexpr (S == 0) _tile_stored(0, p, 64); else _tile_stored(1, p, 64);
    }
};
#include "ops/cpu/qgemm_amx.inc"
}  // namespace amx
#pragma GCC pop_options
}  // namespace qk_avx512vnni
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

// ---- run-time choice ----

using GemmFn = void (*)(const Weight &, const QuantizedActs &, int64_t, int64_t, int64_t, int64_t, float *);

struct KernelSet {
    const char *name;
    GemmFn gemm;  // null: the float path
    bool (*supported)();
    bool pair_layout;  // reads QuantizedActs::bias and bias16
    uint64_t (*packed_bytes)(const Weight &);  // null: no packed layout (Weight::packed is ignored)
    void (*pack_groups)(const Weight &, int64_t, int64_t, uint8_t *);
    bool automatic = true;  // "auto" may pick it (false: only by name)
    int64_t token_block = 64;  // tokens a task of a prompt product takes (int8_token_block)
};

static bool always() { return true; }
#ifdef DFL_QGEMM_X86
static bool has_avx2() {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
static bool has_avxvnni() { return has_avx2() && __builtin_cpu_supports("avxvnni"); }
static bool has_avx512vnni() {
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
}
static bool has_amx() {
    unsigned a, b, c, d;
    const bool tiles = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1);  // AMX-TILE, -INT8
    return tiles && has_avx512vnni() && qk_avx512vnni::amx::amx_permitted();
}
#endif

// Best first.
static const KernelSet kSets[] = {
#ifdef DFL_QGEMM_X86
    // AMX for q8_0 and q4_K prompts: on the GPU host's Xeon (2026-12-04) pp512 of Qwen3-0.6B at 16 threads 647 -> 838
    // tok/s (q8_0) and 1132 -> 1327 (q4_K) against avx512vnni, equal at 8 threads, never slower. Tasks of 128 tokens:
    // its q4_K kernel unpacks a group's codes once a task, so longer tasks share that over more tokens (same host, 16
    // threads, Qwen3-0.6B q4_K pp512, one run each, 12-05: 1,870 / 1,928 -> 2,039 tok/s)
    {"avx512amx", qk_avx512vnni::amx::gemm_block_amx, has_amx, true, qk_avx512vnni::packed_bytes,
     qk_avx512vnni::pack_groups, true, 128},
    {"avx512vnni", qk_avx512vnni::gemm_block_rows16, has_avx512vnni, true, qk_avx512vnni::packed_bytes,
     qk_avx512vnni::pack_groups},
    {"avxvnni", qk_avxvnni::gemm_block, has_avxvnni, false, nullptr, nullptr},
    {"avx2", qk_avx2::gemm_block, has_avx2, false, nullptr, nullptr},
    // the AMX kernel with its tile operations in scalar code: for the tests, by name only
    {"avx512amx-emu", qk_avx512vnni::amx_emu::gemm_block_amx, has_avx512vnni, true, qk_avx512vnni::packed_bytes,
     qk_avx512vnni::pack_groups, false},
#endif
    {"generic", generic_gemm_block, always, false, nullptr, nullptr},
    {"off", nullptr, always, false, nullptr, nullptr},
};

static const KernelSet *choose(const char *name) {
    const bool any = name == nullptr || *name == 0 || std::strcmp(name, "auto") == 0;
    bool reached = any;
    for (const KernelSet &k : kSets) {
        if (!reached && std::strcmp(k.name, name) == 0) reached = true;
        if (reached && (k.automatic || !any) && k.supported()) return &k;
    }
    return &kSets[0] + (sizeof kSets / sizeof kSets[0]) - 2;  // unknown name: generic
}

static const KernelSet *g_set = choose(std::getenv("DFLASH_CPU_INT8"));

void set_int8_kernels(const char *name) { g_set = choose(name); }

const char *int8_kernels() { return g_set->name; }

int64_t int8_token_block() { return g_set->token_block; }

bool int8_wants_pair_layout() { return g_set->pair_layout; }

bool int8_matmul_applies(const Weight &W) {
    if (g_set->gemm == nullptr) return false;
    switch (W.type) {
    case DFL_TYPE_Q4_0:
    case DFL_TYPE_Q8_0:
        return W.n_in % kActBlock == 0;
    case DFL_TYPE_Q4_K:
    case DFL_TYPE_Q6_K:
        return W.n_in % QK_K == 0;
    default:
        return false;
    }
}

uint64_t int8_packed_bytes(const Weight &W) {
    return g_set->packed_bytes != nullptr && int8_matmul_applies(W) ? g_set->packed_bytes(W) : 0;
}

bool int8_packs_type(uint32_t type) {
    return g_set->packed_bytes != nullptr && (type == DFL_TYPE_Q4_0 || type == DFL_TYPE_Q8_0 || type == DFL_TYPE_Q4_K ||
                                              type == DFL_TYPE_Q6_K);
}

int64_t int8_pack_group_count(const Weight &W) { return (W.n_out + kInt8GroupRows - 1) / kInt8GroupRows; }

uint64_t int8_pack_group_bytes(const Weight &W) {
    Weight g = W;
    g.n_out = kInt8GroupRows;
    return int8_packed_bytes(g);
}

void int8_pack_groups(const Weight &W, int64_t g0, int64_t g1, uint8_t *dst) { g_set->pack_groups(W, g0, g1, dst); }

void int8_gemm_block(const Weight &W, const QuantizedActs &A, int64_t r0, int64_t r1, int64_t t0, int64_t t1,
                     float *Y) {
    g_set->gemm(W, A, r0, r1, t0, t1, Y);
}

}  // namespace dfl

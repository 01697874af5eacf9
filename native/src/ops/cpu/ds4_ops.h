// The CPU kernels of the DeepSeek V4 ops (device.h: HcPreCall ... MoeExpertsCall), called by the CPU device. Each
// has a float64 reference test in native/tests/test_ds4_ops.cpp.
#pragma once

#include "ops/cpu/cpu_ops.h"

namespace dfl {

// Sinkhorn projection of one n x n comb matrix in place (spec §2.3 step 5): row softmax + eps, column
// normalisation, then iters - 1 rounds of row and column normalisation (each divides by sum + eps).
void ds4_sinkhorn(float *c, int n, int iters, float eps);
// Interleaved RoPE on the trailing rope_dim dims of one head (sign -1: the inverse rotation).
void ds4_rope_tail_head(float *x, int head_dim, int rope_dim, double pos, const float *inv_freq);

void ds4_hc_pre(ThreadPool &pool, const HcPreCall &c);
void ds4_hc_post(ThreadPool &pool, const HcPostCall &c);
void ds4_hc_head(ThreadPool &pool, const HcHeadCall &c);
void ds4_rope_tail(ThreadPool &pool, const RopeTailCall &c);
// Device::norm_rope_tail: each head row normed, then rotated, in one parallel region.
void ds4_norm_rope_tail(ThreadPool &pool, const float *w, float eps, const RopeTailCall &c);
void ds4_compress(ThreadPool &pool, const BatchMeta &m, const Ds4CompressCall &c);
void ds4_indexer_topk(ThreadPool &pool, const BatchMeta &m, const Ds4IndexerCall &c);
void ds4_attention(ThreadPool &pool, Scratch &scratch, const BatchMeta &m, const Ds4AttnCall &c);
void ds4_ring_write(const BatchMeta &m, const Ds4RingWrite &c);
void ds4_moe_route(ThreadPool &pool, const MoeRouteCall &c);
void ds4_swiglu_clamp(float *g, const float *u, int64_t n, float limit);
void ds4_moe_experts(ThreadPool &pool, Scratch &scratch, const MoeExpertsCall &c);

}  // namespace dfl

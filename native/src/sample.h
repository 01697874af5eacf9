// Host-side token sampling from f32 logits (the ABI's sample()).
#pragma once

#include <cstdint>

#include "common.h"

namespace dfl {

int32_t sample_token(const float *logits, uint32_t n_vocab, const dfl_sampling &p, const int32_t *history,
                     uint32_t n_history, uint64_t *rng_state);
// The distribution sample_token draws from (the same penalties, temperature, top-k, top-p and min-p): the tokens it
// can return (none of probability 0), in no particular order, in ids and their probabilities (summing to 1) in
// probs, both with room for n_vocab; returns how many. A temperature <= 0 gives the argmax alone.
uint32_t sample_distribution(const float *logits, uint32_t n_vocab, const dfl_sampling &p, const int32_t *history,
                             uint32_t n_history, int32_t *ids, double *probs);
// sample_token's draw (no history) from a row given as its k best candidates (ids, logits: forward_topk's order, id -1
// padding; suppressed[i] nonzero: candidate i is -inf in sample_token's row, suppressed may be null) and the whole
// row's log-sum-exp, where they decide it: a temperature in (0, 1], no top-k and no min-p. Returns -1 (rng_state
// untouched) where the token may lie outside the candidates or rounding leaves it open; the caller then samples the
// whole row with the same state.
int32_t sample_candidates(const int32_t *ids, const float *logits, const uint8_t *suppressed, uint32_t k, float lse,
                          uint32_t n_vocab, const dfl_sampling &p, uint64_t *rng_state);
uint64_t rng_next(uint64_t *state);

}  // namespace dfl

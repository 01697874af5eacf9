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
uint64_t rng_next(uint64_t *state);

}  // namespace dfl

// Host-side token sampling from f32 logits (the ABI's sample()).
#pragma once

#include <cstdint>

#include "common.h"

namespace dfl {

int32_t sample_token(const float *logits, uint32_t n_vocab, const dfl_sampling &p, const int32_t *history,
                     uint32_t n_history, uint64_t *rng_state);
uint64_t rng_next(uint64_t *state);

}  // namespace dfl

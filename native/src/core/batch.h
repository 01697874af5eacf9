// Checks of a forward batch that hold for every architecture.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "core/seqtable.h"

namespace dfl {

// Fails (DFL_ERR_INVALID) unless entry i names an allocated sequence not already in `seen`, carries tokens that are
// all inside the vocabulary, and asks for a known logits mode; adds the sequence to `seen`. Returns the entry's name
// ("batch entry i (sequence s)") for the caller's own checks to start their errors with.
std::string check_batch_entry(const SeqTable &table, std::set<int32_t> &seen, uint32_t i, const dfl_seq_batch &sb,
                              int n_vocab);
// Fails (DFL_ERR_NO_KV) unless the pool holds the blocks all entries' new tokens need together: a batch gets its
// blocks all or nothing.
void check_batch_blocks(const SeqTable &table, const dfl_batch &b);

}  // namespace dfl

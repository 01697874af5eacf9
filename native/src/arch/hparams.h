// Reading hyperparameters from a model's metadata: the pieces every architecture's reader shares. Keys are full
// ("qwen3.block_count"); each reader adds its own prefix and its own rules for integers.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common.h"

namespace dfl {

using MetaMap = std::map<std::string, const dfl_meta *>;

// The metadata entries by key (DFL_ERR_INVALID for an entry without one).
MetaMap meta_map(const dfl_model_params &p);
// The entry of key, or null.
const dfl_meta *meta_find(const MetaMap &m, const std::string &key);
// A float (an integer converts); def where m is null.
double meta_number(const dfl_meta *m, const std::string &key, double def);
// v as an int when in (0, 2^30], the range every size and count of a model is held to.
int positive_hparam(int64_t v, const std::string &name);

}  // namespace dfl

// Results the library writes into caller structs that open with struct_size.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace dfl {

// A caller built against an older, shorter struct sets struct_size to what it has room for (0: the whole struct);
// only that much is written, and struct_size tells it how much it got.
template <class T>
void write_sized(T *out, const T &v) {
    const uint32_t size = out->struct_size ? out->struct_size : (uint32_t)sizeof v;
    std::memcpy(out, &v, std::min<size_t>(size, sizeof v));
    out->struct_size = std::min<uint32_t>(size, (uint32_t)sizeof v);
}

}  // namespace dfl

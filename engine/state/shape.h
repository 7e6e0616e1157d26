#pragma once
// Small vocabulary types shared by the whole engine, named as in DeepSpeed ZeRO-3. The
// ids, enums and their names live in the leaf library base (base/types.h, base/names.h),
// included here; this adds what the engine computes on shapes.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/names.h"
#include "base/types.h"

namespace shardscope::state {

std::int64_t shapeNumel(const Shape &s);
std::string shapeString(const Shape &s); // "[4, 8]"

} // namespace shardscope::state

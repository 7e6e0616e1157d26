#pragma once
// Small vocabulary types shared by the whole engine, named as in DeepSpeed ZeRO-3. The
// ids and enums live in the leaf base/types.h; this adds what the engine computes on them.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/types.h"

namespace shardscope {

std::string_view dtypeName(DType t);             // "float32", "bfloat16"
std::string_view statusName(ParamStatus s);      // "NOT_AVAILABLE", "INFLIGHT", "AVAILABLE"
std::string_view phaseName(Phase p);             // "forward", "backward"
std::string_view guardPolicyName(GuardPolicy p); // "error", "warn", "auto"
bool parseGuardPolicy(std::string_view s, GuardPolicy &out);
std::string_view
guardActionName(GuardAction a); // "error", "gathered", "auto_registered", "recorded"
std::string_view
fetchReasonName(FetchReason r); // "forward", "backward", "prefetch", "gathered_parameters", "guard"

std::int64_t shapeNumel(const Shape &s);
std::string shapeString(const Shape &s); // "[4, 8]"

} // namespace shardscope

#pragma once
// Small vocabulary types shared by the whole engine, named as in DeepSpeed ZeRO-3.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardscope {

using ModuleId = std::uint32_t;
using ParamId = std::uint32_t;
inline constexpr ModuleId kNoModule = 0xFFFFFFFFu;
inline constexpr ParamId kNoParam = 0xFFFFFFFFu;

using Shape = std::vector<std::int64_t>;

enum class DType : std::uint8_t { F32 = 0, BF16 = 1 };
inline constexpr std::size_t dtypeSize(DType t) { return t == DType::BF16 ? 2 : 4; }
std::string_view dtypeName(DType t); // "float32", "bfloat16"

// ZeRO-3 per-rank partition state of a parameter (DeepSpeed's ZeroParamStatus).
enum class ParamStatus : std::uint8_t { NotAvailable = 0, Inflight = 1, Available = 2 };
std::string_view statusName(ParamStatus s); // "NOT_AVAILABLE", "INFLIGHT", "AVAILABLE"

enum class Phase : std::uint8_t { Forward = 0, Backward = 1 };
std::string_view phaseName(Phase p); // "forward", "backward"

// What the access guard does about an unregistered access.
enum class GuardPolicy : std::uint8_t { Error = 0, Warn = 1, Auto = 2 };
std::string_view guardPolicyName(GuardPolicy p); // "error", "warn", "auto"
bool parseGuardPolicy(std::string_view s, GuardPolicy &out);

// The action the guard took for one unregistered access.
enum class GuardAction : std::uint8_t { Raised = 0, Gathered = 1, AutoRegistered = 2, Recorded = 3 };
std::string_view guardActionName(GuardAction a); // "error", "gathered", "auto_registered", "recorded"

enum class FetchReason : std::uint8_t {
    Forward = 0,
    Backward = 1,
    Prefetch = 2,
    GatheredParameters = 3,
    Guard = 4,
};
std::string_view fetchReasonName(FetchReason r); // "forward", "backward", "prefetch", "gathered_parameters", "guard"

std::int64_t shapeNumel(const Shape &s);
std::string shapeString(const Shape &s); // "[4, 8]"

} // namespace shardscope

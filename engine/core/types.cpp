#include "core/types.h"
#include "core/state.h"

namespace shardscope {

std::string_view dtypeName(DType t)
{
    return t == DType::BF16 ? "bfloat16" : "float32";
}

std::string_view statusName(ParamStatus s)
{
    switch (s) {
    case ParamStatus::NotAvailable: return "NOT_AVAILABLE";
    case ParamStatus::Inflight: return "INFLIGHT";
    case ParamStatus::Available: return "AVAILABLE";
    }
    return "UNKNOWN";
}

std::string_view phaseName(Phase p)
{
    return p == Phase::Backward ? "backward" : "forward";
}

std::string_view guardPolicyName(GuardPolicy p)
{
    switch (p) {
    case GuardPolicy::Error: return "error";
    case GuardPolicy::Warn: return "warn";
    case GuardPolicy::Auto: return "auto";
    }
    return "unknown";
}

bool parseGuardPolicy(std::string_view s, GuardPolicy &out)
{
    if (s == "error")
        out = GuardPolicy::Error;
    else if (s == "warn")
        out = GuardPolicy::Warn;
    else if (s == "auto")
        out = GuardPolicy::Auto;
    else
        return false;
    return true;
}

std::string_view guardActionName(GuardAction a)
{
    switch (a) {
    case GuardAction::Raised: return "error";
    case GuardAction::Gathered: return "gathered";
    case GuardAction::AutoRegistered: return "auto_registered";
    case GuardAction::Recorded: return "recorded";
    }
    return "unknown";
}

std::string_view fetchReasonName(FetchReason r)
{
    switch (r) {
    case FetchReason::Forward: return "forward";
    case FetchReason::Backward: return "backward";
    case FetchReason::Prefetch: return "prefetch";
    case FetchReason::GatheredParameters: return "gathered_parameters";
    case FetchReason::Guard: return "guard";
    }
    return "unknown";
}

std::string_view violationKindName(ViolationKind k)
{
    switch (k) {
    case ViolationKind::UnregisteredAccess: return "unregistered_access";
    case ViolationKind::LateParameter: return "late_parameter";
    case ViolationKind::TraceInvalidated: return "trace_invalidated";
    case ViolationKind::GatheredWriteWithoutModifier: return "gathered_write_without_modifier";
    }
    return "unknown";
}

std::int64_t shapeNumel(const Shape &s)
{
    std::int64_t n = 1;
    for (std::int64_t d : s)
        n *= d;
    return n;
}

std::string shapeString(const Shape &s)
{
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (i)
            out += ", ";
        out += std::to_string(s[i]);
    }
    return out + "]";
}

} // namespace shardscope

#include "base/names.h"

#include <cstddef>

namespace shardscope {

namespace {

template <typename E, std::size_t N>
std::string_view nameIn(const std::array<std::string_view, N> &table, E value,
                        std::string_view unknown = "unknown")
{
    const auto i = static_cast<std::size_t>(value);
    return i < N ? table[i] : unknown;
}

template <typename E, std::size_t N>
std::optional<E> valueIn(const std::array<std::string_view, N> &table, std::string_view name,
                         std::size_t first = 0)
{
    for (std::size_t i = first; i < N; ++i)
        if (table[i] == name) return static_cast<E>(i);
    return std::nullopt;
}

} // namespace

std::string_view dtypeName(DType t)
{
    return nameIn(kDTypeNames, t);
}
std::string_view statusName(ParamStatus s)
{
    return nameIn(kStatusNames, s, "UNKNOWN");
}
std::string_view phaseName(Phase p)
{
    return nameIn(kPhaseNames, p);
}
std::string_view guardPolicyName(GuardPolicy p)
{
    return nameIn(kGuardPolicyNames, p);
}
std::string_view guardActionName(GuardAction a)
{
    return nameIn(kGuardActionNames, a);
}
std::string_view fetchReasonName(FetchReason r)
{
    return nameIn(kFetchReasonNames, r);
}
std::string_view violationKindName(ViolationKind k)
{
    return nameIn(kViolationKindNames, k);
}
std::string_view collectiveKindName(CollectiveKind k)
{
    return nameIn(kCollectiveKindNames, k);
}
std::string_view collectivePositionName(CollectivePosition p)
{
    return nameIn(kCollectivePositionNames, p);
}
std::string_view severityName(Severity s)
{
    return nameIn(kSeverityNames, s);
}
std::string_view violationReadName(ViolationRead r)
{
    return nameIn(kViolationReadNames, r);
}

bool isKnownEventType(std::uint8_t type)
{
    return type >= 1 && type < kEventTypeNames.size();
}

std::string_view eventTypeName(EventType type)
{
    const auto t = static_cast<std::uint8_t>(type);
    return isKnownEventType(t) ? kEventTypeNames[t] : kEventTypeNames[0];
}

std::optional<DType> dtypeFromName(std::string_view n)
{
    return valueIn<DType>(kDTypeNames, n);
}
std::optional<ParamStatus> statusFromName(std::string_view n)
{
    return valueIn<ParamStatus>(kStatusNames, n);
}
std::optional<Phase> phaseFromName(std::string_view n)
{
    return valueIn<Phase>(kPhaseNames, n);
}
std::optional<GuardPolicy> guardPolicyFromName(std::string_view n)
{
    return valueIn<GuardPolicy>(kGuardPolicyNames, n);
}
std::optional<GuardAction> guardActionFromName(std::string_view n)
{
    return valueIn<GuardAction>(kGuardActionNames, n);
}
std::optional<FetchReason> fetchReasonFromName(std::string_view n)
{
    return valueIn<FetchReason>(kFetchReasonNames, n);
}
std::optional<Severity> severityFromName(std::string_view n)
{
    return valueIn<Severity>(kSeverityNames, n);
}
std::optional<ViolationRead> violationReadFromName(std::string_view n)
{
    return valueIn<ViolationRead>(kViolationReadNames, n);
}
std::optional<ViolationKind> violationKindFromName(std::string_view n)
{
    return valueIn<ViolationKind>(kViolationKindNames, n);
}
std::optional<CollectiveKind> collectiveKindFromName(std::string_view n)
{
    return valueIn<CollectiveKind>(kCollectiveKindNames, n);
}
std::optional<CollectivePosition> collectivePositionFromName(std::string_view n)
{
    return valueIn<CollectivePosition>(kCollectivePositionNames, n);
}
std::optional<EventType> eventTypeFromName(std::string_view n)
{
    return valueIn<EventType>(kEventTypeNames, n, 1);
}

bool parseGuardPolicy(std::string_view s, GuardPolicy &out)
{
    const std::optional<GuardPolicy> p = guardPolicyFromName(s);
    if (p) out = *p;
    return p.has_value();
}

} // namespace shardscope

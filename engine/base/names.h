#pragma once
// Every name of the vocabulary in base/types.h, written once: the snapshot and State JSON,
// the Python agent, the command lines, NVTX ranges and the inspector's labels all read
// these. A value outside its enum is named "unknown" ("UNKNOWN" for a status), except as
// noted.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "base/types.h"

namespace shardscope {

// Indexed by the enum's value.
inline constexpr std::array<std::string_view, 2> kDTypeNames = {"float32", "bfloat16"};
inline constexpr std::array<std::string_view, 3> kStatusNames = {"NOT_AVAILABLE", "INFLIGHT",
                                                                 "AVAILABLE"};
inline constexpr std::array<std::string_view, 2> kPhaseNames = {"forward", "backward"};
inline constexpr std::array<std::string_view, 3> kGuardPolicyNames = {"error", "warn", "auto"};
inline constexpr std::array<std::string_view, 4> kGuardActionNames = {
    "error", "gathered", "auto_registered", "recorded"};
inline constexpr std::array<std::string_view, 5> kFetchReasonNames = {
    "forward", "backward", "prefetch", "gathered_parameters", "guard"};
inline constexpr std::array<std::string_view, 12> kViolationKindNames = {
    "unregistered_access", "late_parameter",
    "trace_invalidated",   "gathered_write_without_modifier",
    "tied_across_groups",  "backward_unfinished",
    "shard_order",         "partitioned_save",
    "partitioned_load",    "resume_world_size",
    "collective_mismatch", "rank_stalled"};
inline constexpr std::array<std::string_view, 3> kCollectiveKindNames = {
    "all_gather", "reduce_scatter", "broadcast"};
inline constexpr std::array<std::string_view, 4> kCollectivePositionNames = {"issued", "waiting",
                                                                             "behind", "finished"};
inline constexpr std::array<std::string_view, 3> kSeverityNames = {"error", "cost", "info"};
inline constexpr std::array<std::string_view, 2> kViolationReadNames = {"values", "attribute"};
// Index 0 is no event type ("unknown"); the types start at 1.
inline constexpr std::array<std::string_view, 24> kEventTypeNames = {"unknown",
                                                                     "module_enter",
                                                                     "module_exit",
                                                                     "fetch_begin",
                                                                     "fetch_end",
                                                                     "release",
                                                                     "broadcast",
                                                                     "external_register",
                                                                     "external_unregister",
                                                                     "unregistered_access",
                                                                     "late_parameter",
                                                                     "parameter_adopted",
                                                                     "trace_recorded",
                                                                     "trace_invalidated",
                                                                     "step_begin",
                                                                     "step_end",
                                                                     "memory_sample",
                                                                     "dropped_events",
                                                                     "gathered_write_error",
                                                                     "reduce_scatter_begin",
                                                                     "reduce_scatter_end",
                                                                     "allocator_sample",
                                                                     "collective_begin",
                                                                     "collective_end"};

static_assert(kDTypeNames.size() == std::size_t(DType::BF16) + 1);
static_assert(kStatusNames.size() == std::size_t(ParamStatus::Available) + 1);
static_assert(kPhaseNames.size() == std::size_t(Phase::Backward) + 1);
static_assert(kGuardPolicyNames.size() == std::size_t(GuardPolicy::Auto) + 1);
static_assert(kGuardActionNames.size() == std::size_t(GuardAction::Recorded) + 1);
static_assert(kFetchReasonNames.size() == std::size_t(FetchReason::Guard) + 1);
static_assert(kViolationKindNames.size() == std::size_t(ViolationKind::RankStalled) + 1);
static_assert(kCollectiveKindNames.size() == std::size_t(CollectiveKind::Broadcast) + 1);
static_assert(kCollectivePositionNames.size() == std::size_t(CollectivePosition::Finished) + 1);
static_assert(kSeverityNames.size() == std::size_t(Severity::Info) + 1);
static_assert(kViolationReadNames.size() == std::size_t(ViolationRead::Attribute) + 1);
static_assert(kEventTypeNames.size() == std::size_t(EventType::CollectiveEnd) + 1);

std::string_view dtypeName(DType t); // a value outside the enum: "float32", as dtypeSize
std::string_view phaseName(Phase p); // a value outside the enum: "forward"
std::string_view statusName(ParamStatus s);
std::string_view guardPolicyName(GuardPolicy p);
std::string_view guardActionName(GuardAction a);
std::string_view fetchReasonName(FetchReason r);
std::string_view violationKindName(ViolationKind k);
std::string_view collectiveKindName(CollectiveKind k);
std::string_view collectivePositionName(CollectivePosition p);
std::string_view severityName(Severity s);
std::string_view violationReadName(ViolationRead r);
std::string_view eventTypeName(EventType type);
bool isKnownEventType(std::uint8_t type);

// The value a name stands for, or nullopt for a name outside the table.
std::optional<DType> dtypeFromName(std::string_view name);
std::optional<ParamStatus> statusFromName(std::string_view name);
std::optional<Phase> phaseFromName(std::string_view name);
std::optional<GuardPolicy> guardPolicyFromName(std::string_view name);
std::optional<GuardAction> guardActionFromName(std::string_view name);
std::optional<FetchReason> fetchReasonFromName(std::string_view name);
std::optional<ViolationKind> violationKindFromName(std::string_view name);
std::optional<CollectiveKind> collectiveKindFromName(std::string_view name);
std::optional<CollectivePosition> collectivePositionFromName(std::string_view name);
std::optional<Severity> severityFromName(std::string_view name);
std::optional<ViolationRead> violationReadFromName(std::string_view name);
std::optional<EventType> eventTypeFromName(std::string_view name);
// As guardPolicyFromName, for command lines: false (and out unchanged) for an unknown name.
bool parseGuardPolicy(std::string_view s, GuardPolicy &out);

} // namespace shardscope

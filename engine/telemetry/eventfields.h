#pragma once
// One make/read pair per event kind over the 48-byte Event: the only place that says
// which of flags, a, b, u0..u2 a kind uses. make* fill the kind and its fields and leave
// the header (tsNs, step, rank) to the writer (stamped()); read* assume ev.type is one of
// the kinds named beside them. The mapping is the wire format (docs/protocol.md, "Event
// records"), pinned by the static_asserts at the end.

#include <bit>
#include <cstdint>

#include "telemetry/event.h"

namespace shardscope::telemetry {

// ModuleEnter, ModuleExit.
struct ModuleFields
{
    ModuleId module = kNoModule;
    Phase phase = Phase::Forward;
};

// FetchBegin, FetchEnd. bytes: the padded (partitioned) size of the full tensor, what the
// all-gather moves.
struct FetchFields
{
    ParamId param = kNoParam;
    ModuleId cause = kNoModule; // the module whose entry fetched it, or kNoModule
    std::uint64_t bytes = 0;
    FetchReason reason = FetchReason::Forward;
};

// Release. bytes: as FetchFields::bytes.
struct ReleaseFields
{
    ParamId param = kNoParam;
    ModuleId cause = kNoModule; // the module whose exit released it, or kNoModule
    std::uint64_t bytes = 0;
};

// Broadcast (GatheredParameters exit with a modifier_rank). bytes: numel x element size
// (unpadded), what the broadcast moves.
struct BroadcastFields
{
    ParamId param = kNoParam;
    std::uint32_t root = 0; // the modifier rank whose tensor was broadcast
    std::uint64_t bytes = 0;
};

// ExternalRegister, ExternalUnregister.
struct ExternalFields
{
    ModuleId module = kNoModule;
    ParamId param = kNoParam;
    bool automatic = false; // registered by the guard's `auto` policy (ExternalRegister only)
};

// UnregisteredAccess.
struct AccessFields
{
    ModuleId accessor = kNoModule; // the module that read it, or kNoModule (outside any module)
    ParamId param = kNoParam;
    ModuleId owner = kNoModule;
    ParamStatus status = ParamStatus::NotAvailable;
    GuardAction action = GuardAction::Recorded;
    // What the read touched, in u1 (0 values, 1 attributes only): a field readers of earlier
    // releases leave unread, as every field a kind does not list.
    ViolationRead read = ViolationRead::Values;
};

// LateParameter (module: where it appeared), ParameterAdopted (module: the owner adopting it).
struct LateFields
{
    ModuleId module = kNoModule;
    ParamId param = kNoParam;
};

// TraceInvalidated: the trace expected `expected` (or kNoModule: past its end), `got` was entered.
struct TraceInvalidatedFields
{
    ModuleId expected = kNoModule;
    ModuleId got = kNoModule;
    Phase phase = Phase::Forward;
};

// MemorySample: this rank's memory after a module exit or a step.
struct MemoryFields
{
    std::uint64_t partitionedBytes = 0;
    std::uint64_t gatheredBytes = 0;
    std::uint64_t peakGatheredBytes = 0;
    std::uint64_t liveElements = 0; // elements of gathered parameters alive now
};

// ReduceScatterBegin, ReduceScatterEnd: gradients reduced across the ranks in backward (each
// rank keeps its shard's sum). module: the module whose gradients they are (an FSDP unit, the
// owner of the parameter); param: the parameter, or kNoParam when a whole group is reduced at
// once (FSDP2, a DeepSpeed bucket); bytes: the padded full gradient size in the dtype it is
// reduced in, what the reduce-scatter moves; params: how many parameters it reduces. On the
// wire u1 is 0 for one named parameter (the engine's case), so that record stays compact in
// a lane (sessioncore::EventLane keeps u1 == 0 inline); read gives 1 back.
struct ReduceScatterFields
{
    ModuleId module = kNoModule;
    ParamId param = kNoParam;
    std::uint64_t bytes = 0;
    std::uint32_t params = 0;
};

// AllocatorSample: the rank's device allocator after a step (torch.cuda.memory_allocated,
// memory_reserved, max_memory_allocated). Never sent for a rank on the CPU.
struct AllocatorFields
{
    std::uint64_t allocatedBytes = 0;
    std::uint64_t reservedBytes = 0;
    std::uint64_t peakAllocatedBytes = 0;
};

// CollectiveBegin, CollectiveEnd (issue 51): one record per collective a rank issues (not per
// parameter); begin just before it is issued (a hang leaves it), end once it has completed,
// with the begin's fields. group: the producer's process-group number (0: the job's default
// group; another group gets the next number in the order the rank first uses it); seq: per
// rank and group, 1, 2, 3, ... in issue order; module: the module or unit it serves, or
// kNoModule; bytes: what it moves; params: how many parameters it carries. Wire: flags kind,
// a module, b group, u0 seq, u1 bytes, u2 reason (low 8 bits) | params << 32.
struct CollectiveFields
{
    CollectiveKind kind = CollectiveKind::AllGather;
    ModuleId module = kNoModule;
    std::uint32_t group = 0;
    std::uint64_t seq = 0;
    std::uint64_t bytes = 0;
    FetchReason reason = FetchReason::Forward;
    std::uint32_t params = 0;
};

namespace detail {
constexpr Event record(EventType type, std::uint8_t flags, std::uint32_t a, std::uint32_t b,
                       std::uint64_t u0 = 0, std::uint64_t u1 = 0, std::uint64_t u2 = 0)
{
    return Event{0, 0, 0, type, flags, a, b, u0, u1, u2};
}
} // namespace detail

// The header every writer adds: when, in which step, on which rank.
constexpr Event stamped(Event ev, std::uint64_t tsNs, std::uint32_t step, std::uint16_t rank)
{
    ev.tsNs = tsNs;
    ev.step = step;
    ev.rank = rank;
    return ev;
}

constexpr Event makeModuleEnter(ModuleFields f)
{
    return detail::record(EventType::ModuleEnter, static_cast<std::uint8_t>(f.phase), f.module, 0);
}
constexpr Event makeModuleExit(ModuleFields f)
{
    return detail::record(EventType::ModuleExit, static_cast<std::uint8_t>(f.phase), f.module, 0);
}
constexpr ModuleFields readModule(const Event &ev)
{
    return ModuleFields{ev.a, static_cast<Phase>(ev.flags)};
}

constexpr Event makeFetchBegin(FetchFields f)
{
    return detail::record(EventType::FetchBegin, static_cast<std::uint8_t>(f.reason), f.param,
                          f.cause, f.bytes);
}
constexpr Event makeFetchEnd(FetchFields f)
{
    return detail::record(EventType::FetchEnd, static_cast<std::uint8_t>(f.reason), f.param,
                          f.cause, f.bytes);
}
constexpr FetchFields readFetch(const Event &ev)
{
    return FetchFields{ev.a, ev.b, ev.u0, static_cast<FetchReason>(ev.flags)};
}

constexpr Event makeRelease(ReleaseFields f)
{
    return detail::record(EventType::Release, 0, f.param, f.cause, f.bytes);
}
constexpr ReleaseFields readRelease(const Event &ev)
{
    return ReleaseFields{ev.a, ev.b, ev.u0};
}

constexpr Event makeBroadcast(BroadcastFields f)
{
    return detail::record(EventType::Broadcast, 0, f.param, f.root, f.bytes);
}
constexpr BroadcastFields readBroadcast(const Event &ev)
{
    return BroadcastFields{ev.a, ev.b, ev.u0};
}

constexpr Event makeExternalRegister(ExternalFields f)
{
    return detail::record(EventType::ExternalRegister, f.automatic ? 1 : 0, f.module, f.param);
}
constexpr Event makeExternalUnregister(ExternalFields f)
{
    return detail::record(EventType::ExternalUnregister, 0, f.module, f.param);
}
constexpr ExternalFields readExternal(const Event &ev)
{
    return ExternalFields{ev.a, ev.b, (ev.flags & 1u) != 0};
}

constexpr Event makeUnregisteredAccess(AccessFields f)
{
    const auto flags = static_cast<std::uint8_t>(static_cast<unsigned>(f.status) |
                                                 (static_cast<unsigned>(f.action) << 4));
    return detail::record(EventType::UnregisteredAccess, flags, f.accessor, f.param, f.owner,
                          static_cast<std::uint64_t>(f.read));
}
constexpr AccessFields readAccess(const Event &ev)
{
    return AccessFields{ev.a,
                        ev.b,
                        static_cast<ModuleId>(ev.u0),
                        static_cast<ParamStatus>(ev.flags & 0x0Fu),
                        static_cast<GuardAction>(ev.flags >> 4),
                        ev.u1 == 1 ? ViolationRead::Attribute : ViolationRead::Values};
}

constexpr Event makeLateParameter(LateFields f)
{
    return detail::record(EventType::LateParameter, 0, f.module, f.param);
}
constexpr Event makeParameterAdopted(LateFields f)
{
    return detail::record(EventType::ParameterAdopted, 0, f.module, f.param);
}
constexpr LateFields readLate(const Event &ev)
{
    return LateFields{ev.a, ev.b};
}

// TraceRecorded: the number of module entries in the trace recorded in the first step.
constexpr Event makeTraceRecorded(std::uint64_t entries)
{
    return detail::record(EventType::TraceRecorded, 0, 0, 0, entries);
}
constexpr std::uint64_t readTraceRecorded(const Event &ev)
{
    return ev.u0;
}

constexpr Event makeTraceInvalidated(TraceInvalidatedFields f)
{
    return detail::record(EventType::TraceInvalidated, static_cast<std::uint8_t>(f.phase),
                          f.expected, f.got);
}
constexpr TraceInvalidatedFields readTraceInvalidated(const Event &ev)
{
    return TraceInvalidatedFields{ev.a, ev.b, static_cast<Phase>(ev.flags)};
}

// StepBegin: no fields; the header's step is the new step.
constexpr Event makeStepBegin()
{
    return detail::record(EventType::StepBegin, 0, 0, 0);
}

// StepEnd: the step's loss (IEEE-754 double bits on the wire).
constexpr Event makeStepEnd(double loss)
{
    return detail::record(EventType::StepEnd, 0, 0, 0, std::bit_cast<std::uint64_t>(loss));
}
constexpr double readStepEnd(const Event &ev)
{
    return std::bit_cast<double>(ev.u0);
}

constexpr Event makeMemorySample(MemoryFields f)
{
    return detail::record(EventType::MemorySample, 0,
                          static_cast<std::uint32_t>(f.liveElements & 0xFFFFFFFFu),
                          static_cast<std::uint32_t>(f.liveElements >> 32), f.partitionedBytes,
                          f.gatheredBytes, f.peakGatheredBytes);
}
constexpr MemoryFields readMemory(const Event &ev)
{
    return MemoryFields{ev.u0, ev.u1, ev.u2, std::uint64_t{ev.a} | (std::uint64_t{ev.b} << 32)};
}

// DroppedEvents: events dropped on this rank since its previous DroppedEvents.
constexpr Event makeDroppedEvents(std::uint64_t dropped)
{
    return detail::record(EventType::DroppedEvents, 0, 0, 0, dropped);
}
constexpr std::uint64_t readDroppedEvents(const Event &ev)
{
    return ev.u0;
}

// GatheredWriteError: the parameter modified in GatheredParameters without modifier_rank.
constexpr Event makeGatheredWriteError(ParamId param)
{
    return detail::record(EventType::GatheredWriteError, 0, param, 0);
}
constexpr ParamId readGatheredWriteError(const Event &ev)
{
    return ev.a;
}

namespace detail {
constexpr std::uint64_t reducedParams(const ReduceScatterFields &f)
{
    return f.param != kNoParam && f.params == 1 ? 0 : f.params;
}
} // namespace detail
constexpr Event makeReduceScatterBegin(ReduceScatterFields f)
{
    return detail::record(EventType::ReduceScatterBegin, 0, f.module, f.param, f.bytes,
                          detail::reducedParams(f));
}
constexpr Event makeReduceScatterEnd(ReduceScatterFields f)
{
    return detail::record(EventType::ReduceScatterEnd, 0, f.module, f.param, f.bytes,
                          detail::reducedParams(f));
}
constexpr ReduceScatterFields readReduceScatter(const Event &ev)
{
    const auto params = static_cast<std::uint32_t>(ev.u1);
    return ReduceScatterFields{ev.a, ev.b, ev.u0, ev.b != kNoParam && params == 0 ? 1u : params};
}

constexpr Event makeAllocatorSample(AllocatorFields f)
{
    return detail::record(EventType::AllocatorSample, 0, 0, 0, f.allocatedBytes, f.reservedBytes,
                          f.peakAllocatedBytes);
}
constexpr AllocatorFields readAllocator(const Event &ev)
{
    return AllocatorFields{ev.u0, ev.u1, ev.u2};
}

namespace detail {
constexpr std::uint64_t collectiveWord(const CollectiveFields &f)
{
    return static_cast<std::uint64_t>(static_cast<std::uint8_t>(f.reason)) |
           (static_cast<std::uint64_t>(f.params) << 32);
}
} // namespace detail
constexpr Event makeCollectiveBegin(CollectiveFields f)
{
    return detail::record(EventType::CollectiveBegin, static_cast<std::uint8_t>(f.kind), f.module,
                          f.group, f.seq, f.bytes, detail::collectiveWord(f));
}
constexpr Event makeCollectiveEnd(CollectiveFields f)
{
    return detail::record(EventType::CollectiveEnd, static_cast<std::uint8_t>(f.kind), f.module,
                          f.group, f.seq, f.bytes, detail::collectiveWord(f));
}
constexpr CollectiveFields readCollective(const Event &ev)
{
    return CollectiveFields{static_cast<CollectiveKind>(ev.flags),
                            ev.a,
                            ev.b,
                            ev.u0,
                            ev.u1,
                            static_cast<FetchReason>(ev.u2 & 0xFFu),
                            static_cast<std::uint32_t>(ev.u2 >> 32)};
}

// The wire mapping, pinned: each make writes the raw fields docs/protocol.md names.
namespace detail {
constexpr bool raw(const Event &e, EventType type, std::uint8_t flags, std::uint32_t a,
                   std::uint32_t b, std::uint64_t u0 = 0, std::uint64_t u1 = 0,
                   std::uint64_t u2 = 0)
{
    return e.tsNs == 0 && e.step == 0 && e.rank == 0 && e.type == type && e.flags == flags &&
           e.a == a && e.b == b && e.u0 == u0 && e.u1 == u1 && e.u2 == u2;
}
static_assert(raw(makeModuleEnter({7, Phase::Backward}), EventType::ModuleEnter, 1, 7, 0));
static_assert(raw(makeModuleExit({7, Phase::Forward}), EventType::ModuleExit, 0, 7, 0));
static_assert(raw(makeFetchBegin({3, 5, 4096, FetchReason::Guard}), EventType::FetchBegin, 4, 3, 5,
                  4096));
static_assert(raw(makeFetchEnd({3, kNoModule, 8, FetchReason::Prefetch}), EventType::FetchEnd, 2, 3,
                  kNoModule, 8));
static_assert(raw(makeRelease({3, 5, 4096}), EventType::Release, 0, 3, 5, 4096));
static_assert(raw(makeBroadcast({3, 1, 4096}), EventType::Broadcast, 0, 3, 1, 4096));
static_assert(raw(makeExternalRegister({9, 3, true}), EventType::ExternalRegister, 1, 9, 3));
static_assert(raw(makeExternalUnregister({9, 3, false}), EventType::ExternalUnregister, 0, 9, 3));
static_assert(raw(makeUnregisteredAccess({9, 3, 2, ParamStatus::Inflight,
                                          GuardAction::AutoRegistered}),
                  EventType::UnregisteredAccess, 0x21, 9, 3, 2));
static_assert(raw(makeLateParameter({9, 3}), EventType::LateParameter, 0, 9, 3));
static_assert(raw(makeParameterAdopted({9, 3}), EventType::ParameterAdopted, 0, 9, 3));
static_assert(raw(makeTraceRecorded(12), EventType::TraceRecorded, 0, 0, 0, 12));
static_assert(raw(makeTraceInvalidated({4, 6, Phase::Backward}), EventType::TraceInvalidated, 1, 4,
                  6));
static_assert(raw(makeStepBegin(), EventType::StepBegin, 0, 0, 0));
static_assert(raw(makeStepEnd(2.5), EventType::StepEnd, 0, 0, 0, 0x4004000000000000ull));
static_assert(raw(makeMemorySample({10, 20, 30, 0x100000002ull}), EventType::MemorySample, 0, 2, 1,
                  10, 20, 30));
static_assert(raw(makeDroppedEvents(5), EventType::DroppedEvents, 0, 0, 0, 5));
static_assert(raw(makeGatheredWriteError(3), EventType::GatheredWriteError, 0, 3, 0));
static_assert(raw(makeReduceScatterBegin({4, 3, 4096, 1}), EventType::ReduceScatterBegin, 0, 4, 3,
                  4096, 0));
static_assert(raw(makeReduceScatterBegin({4, 3, 4096, 2}), EventType::ReduceScatterBegin, 0, 4, 3,
                  4096, 2));
static_assert(readReduceScatter(makeReduceScatterBegin({4, 3, 4096, 1})).params == 1);
static_assert(raw(makeReduceScatterEnd({4, kNoParam, 8192, 6}), EventType::ReduceScatterEnd, 0, 4,
                  kNoParam, 8192, 6));
static_assert(raw(makeAllocatorSample({10, 20, 30}), EventType::AllocatorSample, 0, 0, 0, 10, 20,
                  30));
static_assert(readReduceScatter(makeReduceScatterEnd({4, 3, 4096, 7})).params == 7);
static_assert(raw(makeCollectiveBegin({CollectiveKind::ReduceScatter, 5, 1, 42, 4096,
                                       FetchReason::Backward, 3}),
                  EventType::CollectiveBegin, 1, 5, 1, 42, 4096, 0x300000001ull));
static_assert(raw(makeCollectiveEnd({CollectiveKind::Broadcast, kNoModule, 0, 7, 8,
                                     FetchReason::GatheredParameters, 0}),
                  EventType::CollectiveEnd, 2, kNoModule, 0, 7, 8, 3));
static_assert(readCollective(makeCollectiveBegin({CollectiveKind::AllGather, 5, 2, 9, 16,
                                                  FetchReason::Prefetch, 0xFFFFFFFFu}))
                  .params == 0xFFFFFFFFu);
static_assert(readCollective(makeCollectiveEnd({CollectiveKind::Broadcast, 5, 2, 9, 16,
                                                FetchReason::Guard, 1}))
                  .reason == FetchReason::Guard);
static_assert(readCollective(makeCollectiveEnd({CollectiveKind::Broadcast, 5, 2, 9, 16,
                                                FetchReason::Guard, 1}))
                  .kind == CollectiveKind::Broadcast);
static_assert(readAllocator(makeAllocatorSample({10, 20, 30})).peakAllocatedBytes == 30);
static_assert(readAccess(makeUnregisteredAccess({9, 3, 2, ParamStatus::Available,
                                                 GuardAction::Recorded}))
                  .action == GuardAction::Recorded);
static_assert(readMemory(makeMemorySample({10, 20, 30, 0x100000002ull})).liveElements ==
              0x100000002ull);
static_assert(readStepEnd(makeStepEnd(-0.25)) == -0.25);
} // namespace detail

} // namespace shardscope::telemetry

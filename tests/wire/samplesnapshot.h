#pragma once
// A snapshot that uses every field of the schema and one event of every type, for the
// codec round trips and as the seed of the robustness tests.

#include "state/severity.h"
#include "state/state.h"
#include "telemetry/event.h"
#include "wire/messages.h"
#include "wire/snapshot.h"

namespace shardscope::test {

// Raw, not eventfields.h: the codecs must carry every field of every kind, used or not.
inline telemetry::Event makeEvent(EventType type, std::uint32_t i)
{
    telemetry::Event e{};
    e.tsNs = 1'000'000'000ull * 3600 + i * 17;
    e.step = 1 + i % 3;
    e.rank = static_cast<std::uint16_t>(i % 2);
    e.type = type;
    e.flags = static_cast<std::uint8_t>(i * 7 % 256);
    e.a = 0xFFFFFFFFu - i;
    e.b = i * 3;
    e.u0 = 0xFFFFFFFFFFFFFFFFull - i;
    e.u1 = 1ull << (i % 63);
    e.u2 = 42 + i;
    return e;
}

// One record of every EventType, with distinctive values in every field.
inline std::vector<telemetry::Event> everyEventType()
{
    std::vector<telemetry::Event> out;
    for (std::uint8_t t = 1; wire::isKnownEventType(t); ++t)
        out.push_back(makeEvent(static_cast<EventType>(t), t));
    return out;
}

inline wire::Snapshot sampleSnapshot()
{
    wire::Snapshot s;
    s.meta.producer = "tst";
    s.meta.pid = 4242;
    s.meta.createdUnixMs = 1764470000123ull;
    s.meta.endpoint = "tcp:127.0.0.1:5000";
    state::EngineState &st = s.state;
    st.modelName = "tied-lm \xC3\xA9"; // UTF-8 survives
    st.worldSize = 2;
    st.backend = "cpu";
    st.step = 7;
    st.config = {100, 5000, 100000, GuardPolicy::Auto};
    st.localRanks = {0, 1};
    st.modules = {{0, "", "Model", kNoModule},
                  {1, "embed", "Embedding", 0},
                  {2, "lm_head", "Linear", 0},
                  {3, "conv", "Conv1d", 0}};
    // FSDP2 units: the root alone, embed and lm_head as one group (fully_shard([embed, lm_head])).
    st.modules[0].unitGroup = 0;
    st.modules[0].reshardAfterForward = "False";
    st.modules[0].mesh = "dp=2";
    for (ModuleId m : {1u, 2u}) {
        st.modules[m].unitGroup = 1;
        st.modules[m].reshardAfterForward = "True";
        st.modules[m].mesh = "replicate=1, shard=2";
    }
    state::ParamRecord w;
    w.id = 0;
    w.name = "embed.weight";
    w.owner = 1;
    w.shape = {6, 5};
    w.dtype = DType::F32;
    w.numel = 30;
    w.paddedNumel = 30;
    w.partitionNumel = 15;
    w.partitioned = true;
    w.status = {ParamStatus::Available, ParamStatus::Inflight};
    w.externals = {{2, true}, {3, false}};
    w.activeModules = {1, 2};
    w.gatherCount = 12;
    w.gatherBytes = 1440;
    w.gatherNs = 99999;
    w.lastGatherTsNs = 123456789012345ull;
    w.placements = "(Replicate(), Shard(0))";
    state::ParamRecord b;
    b.id = 2; // id 1 was removed
    b.name = "conv.weight_g";
    b.owner = 3;
    b.shape = {1, 1, 3};
    b.dtype = DType::BF16;
    b.numel = 3;
    b.paddedNumel = 4;
    b.partitionNumel = 2;
    b.persistent = true;
    b.late = true;
    b.status = {ParamStatus::NotAvailable, ParamStatus::NotAvailable};
    st.params = {w, b};
    state::ViolationRecord v;
    v.kind = ViolationKind::UnregisteredAccess;
    v.step = 1;
    v.lastStep = 3;
    v.rank = 1;
    v.accessor = 2;
    v.param = 0;
    v.paramName = "embed.weight";
    v.owner = 1;
    v.status = ParamStatus::NotAvailable;
    v.action = GuardAction::Gathered;
    v.count = 3;
    v.tsNs = 5555;
    v.fix = "register_external_parameter(lm_head, embed.weight)";
    v.message = "module `lm_head` read `embed.weight` owned by `embed`";
    v.location.file = "/home/user/train.py";
    v.location.line = 42;
    v.location.function = "TinyLM.forward";
    v.location.chain = {"/home/user/train.py:97 in main", "/home/user/train.py:120 in <module>"};
    v.building = "TinyLM (train.py:75) > .pos_conv PositionalConv (train.py:58)";
    state::ViolationRecord late = v;
    late.kind = ViolationKind::LateParameter;
    late.accessor = kNoModule;
    late.param = 1; // removed parameter: absent from params, its name kept by the engine
    late.paramName = "conv.weight";
    late.owner = 3;
    late.action = GuardAction::Recorded;
    late.fix.clear();
    late.location = {}; // one without a location (a snapshot of an earlier release)
    late.building.clear();
    state::ViolationRecord trace = v;
    trace.kind = ViolationKind::TraceInvalidated;
    trace.param = kNoParam;
    trace.paramName.clear();
    trace.status = ParamStatus::Available;
    trace.action = GuardAction::Raised;
    state::ViolationRecord gw = v;
    gw.kind = ViolationKind::GatheredWriteWithoutModifier;
    gw.action = GuardAction::AutoRegistered;
    // T5's `self.wo.weight.dtype`: an attribute read, information only.
    state::ViolationRecord attr = v;
    attr.action = GuardAction::AutoRegistered;
    attr.read = ViolationRead::Attribute;
    attr.location.line = 43;
    attr.fix.clear();
    attr.building.clear();
    // A checkpoint kind (issue 54): on the model, no accessor; the message with its numbers.
    state::ViolationRecord save = v;
    save.kind = ViolationKind::PartitionedSave;
    save.accessor = kNoModule;
    save.owner = 0;
    save.action = GuardAction::Recorded;
    save.message = "model.state_dict() was taken while ZeRO-3 partitions the model: 2 parameters";
    save.fix = "engine.save_16bit_model(DIR)";
    save.location.line = 88;
    save.building.clear();
    // A collective kind (issue 51): the job's aligner's mismatch, with its sides and sites.
    state::ViolationRecord mismatch = v;
    mismatch.kind = ViolationKind::CollectiveMismatch;
    mismatch.rank = 0;
    mismatch.param = kNoParam;
    mismatch.paramName.clear();
    mismatch.owner = kNoModule;
    mismatch.action = GuardAction::Recorded;
    mismatch.message = "the ranks issued different collectives at #57 of the default group";
    mismatch.fix = "run the extra forward on every rank";
    mismatch.location.line = 91;
    mismatch.building.clear();
    state::CollectiveDetail &d = mismatch.collective;
    d.group = 1;
    d.seq = 57;
    d.waitedMs = 6500;
    state::CollectiveSide extra;
    extra.ranks = {0};
    extra.position = CollectivePosition::Waiting;
    extra.kind = CollectiveKind::AllGather;
    extra.hasModule = true;
    extra.module = "lm_head";
    extra.reason = FetchReason::Forward;
    extra.bytes = 4096;
    extra.params = 2;
    extra.lastSeq = 57;
    state::CollectiveSide other = extra;
    other.ranks = {1, 3};
    other.kind = CollectiveKind::ReduceScatter;
    other.hasModule = true;
    other.module = ""; // the root
    other.reason = FetchReason::Backward;
    other.bytes = 8192;
    other.params = 7;
    state::CollectiveSide gone;
    gone.ranks = {2};
    gone.position = CollectivePosition::Finished;
    gone.lastSeq = 56;
    d.sides = {extra, other, gone};
    d.sites = {{0, 57, 6500, v.location}, {3, 57, 6400, {"/home/user/t\xC3\xA9st.py", 7, "f", {}}}};
    st.violations = {v, late, trace, gw, attr, save, mismatch};
    // Severities as the ledger writes them (state/severity.h).
    for (state::ViolationRecord &r : st.violations)
        r.severity = state::severityOf(r.kind, r.action, r.read);
    s.events = everyEventType();
    s.droppedEvents = 17;
    return s;
}

} // namespace shardscope::test

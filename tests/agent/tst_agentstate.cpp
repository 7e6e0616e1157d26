// AgentState, the state a process without our Engine fills (the DeepSpeed agent), served by
// the same Inspector: its events and State, violation words in DeepSpeed's dialect, late
// parameters, the job in Welcome, and flushNow() writing the snapshot while serving.

#include <QTemporaryDir>
#include <QTest>

#include <algorithm>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "agent/agentstate.h"
#include "client/inspectorclient.h"
#include "server/inspector.h"
#include "telemetry/eventfields.h"
#include "telemetry/telemetryhub.h"
#include "wire/discovery.h"
#include "wire/job.h"
#include "wire/snapshot.h"

using namespace shardscope;

namespace {

// A sink that keeps what it is given.
class Recorder final : public telemetry::EventSink
{
  public:
    void write(const telemetry::Event &ev) noexcept override { events.push_back(ev); }
    std::vector<telemetry::Event> events;
};

agent::AgentParam param(ParamId id, const std::string &name, ModuleId owner)
{
    agent::AgentParam p;
    p.record.id = id;
    p.record.name = name;
    p.record.owner = owner;
    p.record.shape = {37, 16};
    p.record.numel = 592;
    p.record.partitionNumel = 296;
    p.record.paddedNumel = 592;
    p.record.partitioned = true;
    return p;
}

} // namespace

class TestAgentState : public QObject
{
    Q_OBJECT

  private slots:
    // Collectives (issue 51): seq per group in issue order, begin and end with the same fields,
    // the oldest in flight for the watchdog, rank_stalled once per (group, seq) while in flight.
    void collectivesCarrySeqAndStallOnce()
    {
        agent::AgentConfig cfg;
        cfg.rank = 2;
        cfg.worldSize = 3;
        agent::AgentState s(cfg);
        const ModuleId fc1 = s.ensureModule("layers.0.fc1", "Linear");
        Recorder rec;
        s.setEventSink(&rec);
        QVERIFY(!s.oldestInFlight().has_value());
        const std::uint64_t a =
            s.collectiveBegin(CollectiveKind::AllGather, 0, fc1, FetchReason::Forward, 4096, 2);
        const std::uint64_t b = s.collectiveBegin(CollectiveKind::AllGather, 1, kNoModule,
                                                  FetchReason::Prefetch, 512, 1);
        const std::uint64_t c = s.collectiveBegin(CollectiveKind::ReduceScatter, 0, fc1,
                                                  FetchReason::Backward, 8192, 2);
        QCOMPARE(a, std::uint64_t(1));
        QCOMPARE(b, std::uint64_t(1)); // each group counts its own
        QCOMPARE(c, std::uint64_t(2));
        const auto oldest = s.oldestInFlight();
        QVERIFY(oldest.has_value());
        QCOMPARE(oldest->group, 0u);
        QCOMPARE(oldest->seq, a);
        QCOMPARE(oldest->module, fc1);
        s.collectiveEnd(0, a);
        s.collectiveEnd(0, a);  // not in flight any more: ignored
        s.collectiveEnd(7, 99); // a group never used: ignored
        QCOMPARE(s.oldestInFlight()->group, 1u);
        QCOMPARE(rec.events.size(), std::size_t(4));
        const telemetry::Event &end = rec.events[3];
        QCOMPARE(end.type, EventType::CollectiveEnd);
        const telemetry::CollectiveFields f = telemetry::readCollective(end);
        QCOMPARE(f.seq, a);
        QCOMPARE(f.module, fc1);
        QCOMPARE(f.bytes, std::uint64_t(4096));
        QCOMPARE(f.params, 2u);
        QCOMPARE(f.reason, FetchReason::Forward);
        QCOMPARE(end.rank, std::uint16_t(2));
        QCOMPARE(telemetry::readCollective(rec.events[1]).group, 1u);

        // The watchdog: c has waited; its record names the rank's line, once.
        const auto inFlight = s.inFlight(0, c);
        QVERIFY(inFlight.has_value());
        state::SourceLocation where{"train.py", 88, "main", {}};
        s.collectiveStalled(*inFlight, 6.5, where, {state::SourceLocation{"run.py", 3, "go", {}}});
        s.collectiveStalled(*inFlight, 7.5, where, {});
        s.collectiveEnd(0, c);
        s.collectiveStalled(*inFlight, 8.5, where, {}); // no longer in flight
        const state::EngineState st = s.state();
        QCOMPARE(st.violations.size(), std::size_t(1));
        const state::ViolationRecord &v = st.violations[0];
        QCOMPARE(v.kind, ViolationKind::RankStalled);
        QCOMPARE(v.severity, Severity::Error);
        QCOMPARE(v.rank, 2);
        QCOMPARE(v.count, std::uint64_t(1));
        QCOMPARE(v.location.fileLine(), std::string("train.py:88"));
        QCOMPARE(v.location.chain, std::vector<std::string>{"run.py:3 in go"});
        QCOMPARE(v.collective.group, 0u);
        QCOMPARE(v.collective.seq, c);
        QCOMPARE(v.collective.sides.size(), std::size_t(1));
        QCOMPARE(v.collective.sides[0].module, std::string("layers.0.fc1"));
        QCOMPARE(v.collective.sides[0].position, CollectivePosition::Waiting);
        QCOMPARE(v.collective.sites.at(0).where.line, 88u);
        QVERIFY2(v.message.find("6.5 s") != std::string::npos, v.message.c_str());
        QVERIFY2(v.message.find("layers.0.fc1") != std::string::npos, v.message.c_str());
        QVERIFY2(v.message.find("train.py:88") != std::string::npos, v.message.c_str());
        QVERIFY(!v.fix.empty());
        s.setEventSink(nullptr);
    }

    void modulesAndEvents()
    {
        agent::AgentConfig cfg;
        cfg.rank = 1;
        cfg.worldSize = 2;
        agent::AgentState s(cfg);
        Recorder rec;
        s.setEventSink(&rec);
        // A module deep in the tree brings its ancestors, parents first.
        const ModuleId conv = s.ensureModule("pos_conv.conv", "Conv1d");
        const ModuleId embed = s.ensureModule("embed", "Embedding");
        const ModuleId head = s.ensureModule("lm_head", "Head");
        QCOMPARE(s.ensureModule("pos_conv.conv", "Conv1d"), conv);
        s.setParam(param(0, "embed.weight", embed));
        s.fetchBegin(0, head, 2368, FetchReason::Guard);
        state::EngineState st = s.state();
        QCOMPARE(st.modules.size(),
                 std::size_t(5)); // root, pos_conv, pos_conv.conv, embed, lm_head
        QCOMPARE(st.modules[2].path, std::string("pos_conv.conv"));
        QCOMPARE(st.modules[2].parent, st.modules[1].id);
        QCOMPARE(st.params[0].status,
                 (std::vector<ParamStatus>{ParamStatus::NotAvailable, ParamStatus::Inflight}));
        s.fetchEnd(0, head, 2368, FetchReason::Guard);
        s.release(0, head, 2368);
        st = s.state();
        QCOMPARE(st.params[0].status[1], ParamStatus::NotAvailable);
        QCOMPARE(st.params[0].gatherCount, std::uint64_t(1));
        // gather_ns and last_gather_ts_ns are the events' times (docs/protocol.md)
        QCOMPARE(st.params[0].gatherNs, rec.events[1].tsNs - rec.events[0].tsNs);
        QCOMPARE(st.params[0].lastGatherTsNs, rec.events[1].tsNs);
        QCOMPARE(st.params[0].gatherBytes, std::uint64_t(2368));
        QCOMPARE(st.localRanks, std::vector<int>{1});
        QCOMPARE(st.fixDialect, std::string("deepspeed"));
        QCOMPARE(rec.events.size(), std::size_t(3));
        QCOMPARE(rec.events[0].type, EventType::FetchBegin);
        QCOMPARE(rec.events[0].rank, std::uint16_t(1));
        QCOMPARE(telemetry::readFetch(rec.events[0]).param, 0u);
        QCOMPARE(telemetry::readFetch(rec.events[0]).cause, head);
        QCOMPARE(telemetry::readFetch(rec.events[0]).reason, FetchReason::Guard);
        QCOMPARE(rec.events[2].type, EventType::Release);
        s.setEventSink(nullptr);
    }

    // The memory plot reads for an agent's rank as for ours: after each module exit and
    // step, what the rank holds (partitions, whole tensors where not partitioned), gathers
    // now and at most, in the parameters' own element sizes.
    void memorySamples()
    {
        agent::AgentState s(agent::AgentConfig{});
        Recorder rec;
        s.setEventSink(&rec);
        const ModuleId embed = s.ensureModule("embed", "Embedding");
        agent::AgentParam half = param(0, "embed.weight", embed); // fp16: 2 bytes an element
        half.elementBytes = 2;
        s.setParam(half);
        agent::AgentParam whole = param(1, "norm.weight", embed); // persistent: all of it
        whole.record.partitioned = false;
        whole.record.persistent = true;
        s.setParam(whole);
        const auto lastMemory = [&] {
            for (auto it = rec.events.rbegin(); it != rec.events.rend(); ++it)
                if (it->type == EventType::MemorySample) return telemetry::readMemory(*it);
            return telemetry::MemoryFields{.partitionedBytes = ~0ull};
        };
        s.moduleEnter(embed, Phase::Forward);
        s.statusChanged(0, ParamStatus::NotAvailable, ParamStatus::Available, embed, 1184,
                        FetchReason::Forward);
        s.moduleExit(embed, Phase::Forward);
        telemetry::MemoryFields m = lastMemory();
        QCOMPARE(m.partitionedBytes, std::uint64_t(296 * 2 + 592 * 4));
        QCOMPARE(m.gatheredBytes, std::uint64_t(592 * 2));
        QCOMPARE(m.liveElements, std::uint64_t(592));
        s.release(0, embed, 1184);
        s.stepEnd(1.0);
        m = lastMemory();
        QCOMPARE(m.gatheredBytes, std::uint64_t(0));
        QCOMPARE(m.peakGatheredBytes, std::uint64_t(592 * 2));
        QCOMPARE(m.liveElements, std::uint64_t(0));
        // Updating a record replaces its share; removing it takes it away.
        s.setParam(half);
        s.removeParam(1);
        s.stepEnd(1.0);
        QCOMPARE(lastMemory().partitionedBytes, std::uint64_t(296 * 2));
        // ZeRO++ hpZ: a secondary partition is held beside the primary one until it is dropped;
        // republishing the record keeps it, removing the parameter takes both away.
        s.setSecondary(0, 148 * 2);
        s.moduleExit(embed, Phase::Forward);
        QCOMPARE(lastMemory().partitionedBytes, std::uint64_t(296 * 2 + 148 * 2));
        s.setParam(half);
        s.setSecondary(7, 100); // no such parameter: nothing
        s.stepEnd(1.0);
        QCOMPARE(lastMemory().partitionedBytes, std::uint64_t(296 * 2 + 148 * 2));
        s.setSecondary(0, 0);
        s.stepEnd(1.0);
        QCOMPARE(lastMemory().partitionedBytes, std::uint64_t(296 * 2));
        s.setSecondary(0, 148 * 2);
        s.removeParam(0);
        s.stepEnd(1.0);
        QCOMPARE(lastMemory().partitionedBytes, std::uint64_t(0));
        s.setEventSink(nullptr);
    }

    void violationsInDeepSpeedsWords()
    {
        agent::AgentState s(agent::AgentConfig{});
        Recorder rec;
        s.setEventSink(&rec);
        const ModuleId embed = s.ensureModule("embed", "Embedding");
        const ModuleId head = s.ensureModule("blocks.0.lm_head", "Head");
        s.setParam(param(0, "embed.weight", embed));
        s.stepBegin();
        const state::ViolationText t = s.unregisteredAccess(head, 0, GuardAction::AutoRegistered);
        QCOMPARE(t.fix,
                 std::string("deepspeed.zero.register_external_parameter(model.blocks[0].lm_head, "
                             "model.embed.weight)"));
        s.unregisteredAccess(head, 0, GuardAction::AutoRegistered); // same step: once
        s.stepEnd(1.5);
        s.stepBegin();
        s.unregisteredAccess(head, 0, GuardAction::AutoRegistered);
        const state::EngineState st = s.state();
        QCOMPARE(st.violations.size(), std::size_t(1));
        QCOMPARE(st.violations[0].count, std::uint64_t(2));
        QCOMPARE(st.violations[0].step, 1u);
        QCOMPARE(st.violations[0].lastStep, 2u);
        QCOMPARE(st.violations[0].fix, t.fix);
        QCOMPARE(st.violations[0].message, t.message);
        int accesses = 0;
        for (const telemetry::Event &e : rec.events)
            accesses += e.type == EventType::UnregisteredAccess;
        QCOMPARE(accesses, 2);
        // A read outside any module, at build time (it changes the parameter).
        const state::ViolationText outside =
            s.unregisteredAccess(kNoModule, 0, GuardAction::Recorded, state::AccessUse::Write);
        QCOMPARE(outside.fix,
                 std::string("with deepspeed.zero.GatheredParameters(model.embed.weight, "
                             "modifier_rank=0): <change it here>"));
        // A read autograd records: GatheredParameters would give no gradient back, so the fix
        // moves it into the model's forward and registers it there.
        const state::ViolationText grad =
            s.unregisteredAccess(kNoModule, 0, GuardAction::Recorded, state::AccessUse::NeedsGrad);
        QCOMPARE(grad.fix, std::string("deepspeed.zero.register_external_parameter(model, "
                                       "model.embed.weight)  # and move the read into "
                                       "model.forward"));
        QVERIFY2(grad.message.find("needs its gradient") != std::string::npos,
                 grad.message.c_str());
        s.setEventSink(nullptr);
    }

    // T5's `self.wo.weight.dtype` in DeepSpeed's forward: recorded after DeepSpeed gathered
    // the weight (status at the read given), as an attribute read: information, no fix, its
    // event saying so in u1; a read of the values beside it stays a cost, and a recorded
    // one an error.
    void attributeReadsAreInformation()
    {
        agent::AgentState s(agent::AgentConfig{});
        Recorder rec;
        s.setEventSink(&rec);
        const ModuleId ff =
            s.ensureModule("encoder.block.0.layer.1.DenseReluDense", "T5DenseActDense");
        const ModuleId wo = s.ensureModule("encoder.block.0.layer.1.DenseReluDense.wo", "Linear");
        s.setParam(param(0, "encoder.block.0.layer.1.DenseReluDense.wo.weight", wo));
        s.setParam(param(1, "shared.weight", wo));
        s.setStatuses({{0, ParamStatus::Available}});
        s.stepBegin();
        const state::SourceLocation at{"/w/train.py", 40, "main", {}};
        const state::ViolationText t =
            s.unregisteredAccess(ff, 0, GuardAction::AutoRegistered, state::AccessUse::Attribute,
                                 at, {}, {}, ParamStatus::NotAvailable);
        QVERIFY(t.fix.empty());
        QVERIFY2(t.message.find("read only attributes of "
                                "`encoder.block.0.layer.1.DenseReluDense.wo.weight`") !=
                     std::string::npos,
                 t.message.c_str());
        QVERIFY2(t.message.find("no values") != std::string::npos, t.message.c_str());
        QVERIFY2(t.message.find("NOT_AVAILABLE") != std::string::npos, t.message.c_str());
        s.unregisteredAccess(ff, 1, GuardAction::AutoRegistered, state::AccessUse::Read,
                             {"/w/train.py", 41, "main", {}});
        s.unregisteredAccess(kNoModule, 1, GuardAction::Recorded, state::AccessUse::Read,
                             {"/w/train.py", 50, "main", {}});
        const state::EngineState st = s.state();
        QCOMPARE(st.violations.size(), std::size_t(3));
        QCOMPARE(st.violations[0].read, ViolationRead::Attribute);
        QCOMPARE(st.violations[0].severity, Severity::Info);
        QCOMPARE(st.violations[0].status, ParamStatus::NotAvailable); // as read, not as now
        QCOMPARE(st.violations[1].read, ViolationRead::Values);
        QCOMPARE(st.violations[1].severity, Severity::Cost);
        QCOMPARE(st.violations[2].severity, Severity::Error);
        std::vector<telemetry::AccessFields> accesses;
        for (const telemetry::Event &e : rec.events)
            if (e.type == EventType::UnregisteredAccess)
                accesses.push_back(telemetry::readAccess(e));
        QCOMPARE(accesses.size(), std::size_t(3));
        QCOMPARE(accesses[0].read, ViolationRead::Attribute);
        QCOMPARE(accesses[0].status, ParamStatus::NotAvailable);
        QCOMPARE(accesses[1].read, ViolationRead::Values);
        s.setEventSink(nullptr);
    }

    // The FSDP2 agent's state (shardscope.fsdp): its dialect, and tied weights in two groups
    // recorded in the state (no event kind carries them).
    void violationsInFsdpWords()
    {
        agent::AgentConfig cfg;
        cfg.dialect = state::FixDialect::Fsdp;
        agent::AgentState s(cfg);
        const ModuleId embed = s.ensureModule("embed", "FSDPEmbedding");
        const ModuleId head = s.ensureModule("head", "FSDPLinear");
        const ModuleId block = s.ensureModule("blocks.1", "FSDPBlock");
        s.setParam(param(0, "embed.weight", embed));
        s.setParam(param(1, "blocks.1.fc1.weight", block));
        const state::ViolationText tied = s.tiedAcrossGroups(0, embed, head);
        QCOMPARE(tied.fix, std::string("fully_shard([model.embed, model.head])  # one FSDP unit "
                                       "for both, instead of a fully_shard call for each"));
        QVERIFY2(tied.message.find("torch refuses it at the first forward") != std::string::npos,
                 tied.message.c_str());
        // A torch before 2.13 accepts the tie and trains two copies: the message says so, the
        // fix is the same.
        const state::ViolationText untied = s.tiedAcrossGroups(0, embed, head, false);
        QCOMPARE(untied.fix, tied.fix);
        QVERIFY2(untied.message.find("no longer tied (this torch does not refuse it)") !=
                     std::string::npos,
                 untied.message.c_str());
        // One parameter tied into three units (T5's shared embedding with the encoder and
        // decoder stacks each a unit): one record, one fix naming all of them (a fix per pair
        // would put the root into two units), and the message counts three groups.
        const ModuleId root = s.ensureModule("", "FSDPT5ForConditionalGeneration");
        const ModuleId encoder = s.ensureModule("encoder", "FSDPT5Stack");
        const ModuleId decoder = s.ensureModule("decoder", "FSDPT5Stack");
        s.setParam(param(2, "shared.weight", root));
        const state::ViolationText three = s.tiedAcrossGroups(2, root, encoder, true, {decoder});
        QCOMPARE(three.fix, std::string("fully_shard([model, model.encoder, model.decoder])  # one "
                                        "FSDP unit for all of them, instead of a fully_shard call "
                                        "for each"));
        QCOMPARE(three.message,
                 std::string("`shared.weight` is tied into FSDP units `encoder` and `decoder` as "
                             "well as `<root>`: three groups would shard and gather the one tensor "
                             "(torch refuses it at the first forward)"));
        const ModuleId lmHead = s.ensureModule("lm_head", "FSDPLinear");
        const state::ViolationText four =
            s.tiedAcrossGroups(2, root, encoder, true, {decoder, lmHead});
        QVERIFY2(four.fix.starts_with(
                     "fully_shard([model, model.encoder, model.decoder, model.lm_head])"),
                 four.fix.c_str());
        QVERIFY2(four.message.starts_with("`shared.weight` is tied into FSDP units `encoder`, "
                                          "`decoder` and `lm_head` as well as `<root>`: 4 groups"),
                 four.message.c_str());
        state::EngineState st = s.state();
        QCOMPARE(st.fixDialect, std::string("fsdp"));
        QCOMPARE(st.violations.size(), std::size_t(2));
        QCOMPARE(st.violations[0].kind, ViolationKind::TiedAcrossGroups);
        QCOMPARE(st.violations[0].accessor, head);
        QCOMPARE(st.violations[0].owner, embed);
        s.stepBegin();
        QCOMPARE(s.unregisteredAccess(kNoModule, 1, GuardAction::Recorded).fix,
                 std::string("model.blocks[1].fc1.weight.full_tensor()  # all-gathers it: every "
                             "rank must run this line"));
        QCOMPARE(
            s.unregisteredAccess(kNoModule, 1, GuardAction::Recorded, state::AccessUse::NeedsGrad)
                .fix,
            std::string("# move the read of model.blocks[1].fc1.weight into "
                        "model.blocks[1].forward (FSDP unshards it there and "
                        "reduce-scatters its gradient)"));
        const state::ViolationText direct = s.unregisteredAccess(block, 1, GuardAction::Recorded);
        QVERIFY2(direct.fix.starts_with("model.blocks[1](...)  # call the module, not "
                                        "model.blocks[1].forward(...)"),
                 direct.fix.c_str());
        QVERIFY2(direct.message.find("while it was sharded") != std::string::npos,
                 direct.message.c_str());
        // A backward FSDP2 never finished: one record on the root unit, no parameter, at the
        // user's line; the fix follows the cause (what the backward raised, or compiled
        // autograd). The DeepSpeed dialect has ZeRO-3's words (backwardUnfinishedInDeepSpeed);
        // every other, FSDP2's.
        const state::SourceLocation at{"/src/train.py", 88, "main", {}};
        const state::ViolationText raised =
            s.backwardUnfinished(root, "RuntimeError: CUDA out of memory.", false, at);
        QCOMPARE(raised.fix, std::string("raise  # in the except around loss.backward(): stop the "
                                         "run there and resume from the last checkpoint"));
        QVERIFY2(
            raised.message.starts_with("FSDP2's backward did not finish: its final callback "
                                       "(FSDPState._root_post_backward_final_callback) never ran"),
            raised.message.c_str());
        QVERIFY2(raised.message.ends_with("The backward raised RuntimeError: CUDA out of memory., "
                                          "and FSDP2 does not recover from an exception inside "
                                          "backward: going on after it (skipping the batch) trains "
                                          "on like this"),
                 raised.message.c_str());
        const state::ViolationText compiled = s.backwardUnfinished(root, "", true);
        QVERIFY2(compiled.fix.starts_with("torch._dynamo.config.compiled_autograd = False"),
                 compiled.fix.c_str());
        QVERIFY2(compiled.message.ends_with("The backward ran under compiled autograd, which drops "
                                            "that callback without an error"),
                 compiled.message.c_str());
        const state::ViolationText unknownCause = s.backwardUnfinished(root, "", false);
        QVERIFY2(unknownCause.fix.starts_with("# let loss.backward() run to its end"),
                 unknownCause.fix.c_str());
        state::ViolationSubject elsewhere;
        elsewhere.kind = ViolationKind::BackwardUnfinished;
        elsewhere.compiledAutograd = true;
        QCOMPARE(state::describeViolation(elsewhere, state::FixDialect::ShardScope).fix,
                 compiled.fix);
        const std::vector<state::ViolationRecord> all = s.state().violations;
        const auto first =
            std::find_if(all.begin(), all.end(), [](const state::ViolationRecord &v) {
                return v.kind == ViolationKind::BackwardUnfinished;
            });
        QVERIFY(first != all.end());
        QCOMPARE(first->owner, root);
        QCOMPARE(first->param, kNoParam);
        QVERIFY(first->location == at);
        QCOMPARE(first->message, raised.message);
    }

    // DeepSpeed's backward that raised with gradients in ZeRO-3's reduce bucket (the DeepSpeed
    // agent, on_backward_raised): one record on the root, no parameter, at the user's line, in
    // DeepSpeed's words, with how many gradients were left and what fails next; the fix stops
    // the run. Its status is the bucketed parameters': NOT_AVAILABLE.
    void backwardUnfinishedInDeepSpeed()
    {
        agent::AgentState s(agent::AgentConfig{});
        const ModuleId root = s.ensureModule("", "TinyLM");
        const state::SourceLocation at{"/src/train.py", 120, "main", {}};
        const state::ViolationText t =
            s.backwardUnfinished(root, "RuntimeError: CUDA out of memory.", false, at, 2);
        QVERIFY2(t.message.starts_with("DeepSpeed ZeRO-3's backward did not finish: it raised "
                                       "RuntimeError: CUDA out of memory. after the gradients of "
                                       "2 parameters were put in stage 3's reduce bucket"),
                 t.message.c_str());
        QVERIFY2(t.message.find("the next backward or engine.step() fails, with an AssertionError "
                                "in __reduce_and_partition_ipg_grads") != std::string::npos,
                 t.message.c_str());
        QCOMPARE(t.fix, std::string("raise  # in the except around the backward: stop the run "
                                    "there and resume it from the last checkpoint "
                                    "(engine.load_checkpoint)"));
        state::ViolationSubject one;
        one.kind = ViolationKind::BackwardUnfinished;
        one.bucketed = 1;
        QVERIFY2(
            state::describeViolation(one, state::FixDialect::DeepSpeed)
                .message.starts_with("DeepSpeed ZeRO-3's backward did not finish: it raised an "
                                     "exception after one parameter's gradient was put in"),
            state::describeViolation(one, state::FixDialect::DeepSpeed).message.c_str());
        const std::vector<state::ViolationRecord> all = s.state().violations;
        QCOMPARE(all.size(), std::size_t(1));
        QCOMPARE(all[0].kind, ViolationKind::BackwardUnfinished);
        QCOMPARE(all[0].owner, root);
        QCOMPARE(all[0].param, kNoParam);
        QCOMPARE(all[0].status, ParamStatus::NotAvailable);
        QVERIFY(all[0].location == at);
        QCOMPARE(all[0].fix, t.fix);
    }

    // Issue 54: the checkpoint records, in each dialect's words, with the numbers the agent
    // passes; one row per call site, severity error, the parameter by id where it is published.
    void checkpointRecords()
    {
        agent::AgentState s(agent::AgentConfig{});
        const ModuleId root = s.ensureModule("", "TinyLM");
        s.setParam(param(0, "embed.weight", root));
        const state::SourceLocation at{"/src/train.py", 88, "main", {}};
        agent::AgentState::Checkpoint save;
        save.kind = ViolationKind::PartitionedSave;
        save.root = root;
        save.param = "embed.weight";
        save.paramId = 0;
        save.params = 6;
        save.bytes = 7680;
        save.where = at;
        const state::ViolationText t = s.checkpoint(save);
        QVERIFY2(t.message.starts_with("model.state_dict() was taken while ZeRO-3 partitions the "
                                       "model: 6 parameters (`embed.weight` first) are "
                                       "placeholders of size 0") &&
                     t.message.find("loses 7.5 KiB of weights") != std::string::npos,
                 t.message.c_str());
        QVERIFY2(t.fix.starts_with("engine.save_16bit_model(DIR)"), t.fix.c_str());
        s.checkpoint(save); // the same line again: one row, counted twice
        agent::AgentState::Checkpoint resume;
        resume.kind = ViolationKind::ResumeWorldSize;
        resume.root = root;
        resume.call = "engine.load_checkpoint";
        resume.checkpoint = "ckpt/global_step10";
        resume.savedWorld = 3;
        resume.world = 2;
        resume.where = {"/src/train.py", 40, "main", {}};
        const state::ViolationText r = s.checkpoint(resume);
        QVERIFY2(r.message.starts_with("engine.load_checkpoint resumes the ZeRO checkpoint "
                                       "ckpt/global_step10, saved at a data-parallel world size "
                                       "of 3, in a run at world size 2"),
                 r.message.c_str());
        QVERIFY2(
            r.fix.starts_with("python -m deepspeed.checkpoint.ds_to_universal --input_folder "
                              "ckpt/global_step10 --output_folder ckpt/global_step10_universal"),
            r.fix.c_str());
        const std::vector<state::ViolationRecord> all = s.state().violations;
        QCOMPARE(all.size(), std::size_t(2));
        for (const state::ViolationRecord &v : all) {
            QCOMPARE(v.owner, root);
            QCOMPARE(v.status, ParamStatus::NotAvailable);
            QCOMPARE(v.severity, Severity::Error);
            if (v.kind == ViolationKind::PartitionedSave) {
                QCOMPARE(v.count, std::uint64_t(2));
                QCOMPARE(v.param, ParamId(0));
                QCOMPARE(v.paramName, std::string("embed.weight"));
                QVERIFY(v.location == at);
            } else {
                QCOMPARE(v.kind, ViolationKind::ResumeWorldSize);
                QCOMPARE(v.param, kNoParam);
            }
        }
        // FSDP2's words: DTensor shards, get_model_state_dict and set_model_state_dict
        state::ViolationSubject fsdp;
        fsdp.kind = ViolationKind::PartitionedSave;
        fsdp.call = "torch.save";
        fsdp.params = 1;
        fsdp.bytes = 1 << 20;
        const state::ViolationText f = state::describeViolation(fsdp, state::FixDialect::Fsdp);
        QVERIFY2(f.message.starts_with("torch.save wrote one parameter") &&
                     f.message.find("1.0 MiB") != std::string::npos,
                 f.message.c_str());
        QVERIFY2(f.fix.starts_with("sd = get_model_state_dict(model, "), f.fix.c_str());
        fsdp.kind = ViolationKind::PartitionedLoad;
        fsdp.call = "model.load_state_dict";
        QVERIFY2(state::describeViolation(fsdp, state::FixDialect::Fsdp)
                     .fix.starts_with("set_model_state_dict(model, state_dict, "),
                 state::describeViolation(fsdp, state::FixDialect::Fsdp).fix.c_str());
        QCOMPARE(state::bytesText(512), std::string("512 B"));
        QCOMPARE(state::bytesText(3 * 1024 * 1024 + 512 * 1024), std::string("3.5 MiB"));
    }

    // A late parameter is recorded as a violation only if a step starts before it is adopted.
    void lateParameters()
    {
        agent::AgentState s(agent::AgentConfig{});
        const ModuleId conv = s.ensureModule("pos_conv.conv", "Conv1d");
        agent::AgentParam g = param(1u << 20, "pos_conv.conv.weight_g", conv);
        g.record.replaces = "pos_conv.conv.weight";
        s.setParam(g);
        // Where the user's code registered it: the violation's location.
        const state::SourceLocation site{"/src/train.py",
                                         65,
                                         "PositionalConv.__init__",
                                         {"/src/train.py:79 in TinyLM.__init__"}};
        s.lateParameter(g.record.id, site);
        s.stepBegin();
        state::EngineState st = s.state();
        QCOMPARE(st.violations.size(), std::size_t(1));
        QCOMPARE(st.violations[0].kind, ViolationKind::LateParameter);
        QVERIFY(st.violations[0].location == site);
        s.stepBegin(); // the next step's sighting counts into the same row
        QCOMPARE(s.state().violations.size(), std::size_t(1));
        QCOMPARE(s.state().violations[0].count, std::uint64_t(2));
        QVERIFY2(st.violations[0].fix.find("GatheredParameters(model.pos_conv.conv.weight, "
                                           "modifier_rank=0)") != std::string::npos,
                 st.violations[0].fix.c_str());
        QCOMPARE(st.params[0].late, true);
        QCOMPARE(st.params[0].partitioned, false);
        // What it replaced unknown: the fix line still names only real code.
        state::ViolationSubject unknown;
        unknown.kind = ViolationKind::LateParameter;
        unknown.param = "conv.weight_g";
        unknown.owner = "conv";
        QCOMPARE(
            state::describeViolation(unknown, state::FixDialect::DeepSpeed).fix,
            std::string(
                "create model.conv.weight_g inside deepspeed.zero.Init, or adopt it, then "
                "deepspeed.zero.register_external_parameter(model.conv, model.conv.weight_g)"));

        agent::AgentState adopted(agent::AgentConfig{});
        const ModuleId c2 = adopted.ensureModule("pos_conv.conv", "Conv1d");
        agent::AgentParam v = param(7, "pos_conv.conv.weight_v", c2);
        adopted.setParam(v);
        adopted.lateParameter(7);
        adopted.parameterAdopted(7);
        adopted.stepBegin();
        st = adopted.state();
        QCOMPARE(st.violations.size(), std::size_t(0));
        QCOMPARE(st.params[0].late, true);
        QCOMPARE(st.params[0].partitioned, true);
    }

    // The same Inspector serves it: Welcome names the job and the rank; flushNow() writes
    // the snapshot while serving.
    void servedByTheInspector()
    {
        QTemporaryDir dir;
        agent::AgentConfig cfg;
        cfg.modelName = "TinyLM";
        cfg.rank = 1;
        cfg.worldSize = 2;
        agent::AgentState s(cfg);
        const ModuleId embed = s.ensureModule("embed", "Embedding");
        const ModuleId head = s.ensureModule("lm_head", "Head");
        s.setParam(param(0, "embed.weight", embed));
        server::InspectorOptions o;
        o.endpoint = "unix:" + dir.filePath("agent.sock").toStdString();
        o.snapshotOut = dir.filePath("snap.json").toStdString();
        o.job = "job-42";
        server::Inspector inspector(s, o);
        auto client = client::InspectorClient::connect(inspector.endpoint(), {});
        QVERIFY2(client, client ? "" : client.error().c_str());
        const wire::Welcome &w = (*client)->welcome();
        QCOMPARE(w.model, std::string("TinyLM"));
        QCOMPARE(w.worldSize, 2);
        QCOMPARE(w.job.id, std::string("job-42"));
        QCOMPARE(w.job.ranks, std::vector<int>{1});
        s.stepBegin();
        s.unregisteredAccess(head, 0, GuardAction::AutoRegistered);
        QCOMPARE(inspector.flushNow(), std::string());
        auto snap = wire::readSnapshotFile(o.snapshotOut);
        QVERIFY2(snap, snap ? "" : snap.error().c_str());
        QCOMPARE(snap->state.violations.size(), std::size_t(1));
        QCOMPARE(snap->state.fixDialect, std::string("deepspeed"));
        bool sawAccess = false;
        for (const telemetry::Event &e : snap->events)
            sawAccess = sawAccess || e.type == EventType::UnregisteredAccess;
        QVERIFY(sawAccess);
        inspector.finish();
        QCOMPARE(inspector.flushNow(), std::string("the inspector has finished"));
    }

    void jobFromTheEnvironment()
    {
        ::unsetenv("TORCHELASTIC_RUN_ID");
        ::setenv("MASTER_ADDR", "10.1.2.3", 1);
        ::setenv("MASTER_PORT", "29500", 1);
        wire::JobIdentity job = wire::jobFromEnvironment("", {3}, 8);
        QCOMPARE(job.id, std::string("10.1.2.3:29500"));
        QCOMPARE(job.ranks, std::vector<int>{3});
        QCOMPARE(job.worldSize, 8);
        ::setenv("TORCHELASTIC_RUN_ID", "run-7", 1);
        QCOMPARE(wire::jobFromEnvironment("", {3}, 8).id, std::string("run-7"));
        QCOMPARE(wire::jobFromEnvironment("mine", {3}, 8).id, std::string("mine"));
        ::unsetenv("TORCHELASTIC_RUN_ID");
        ::unsetenv("MASTER_ADDR");
        ::unsetenv("MASTER_PORT");
        job = wire::jobFromEnvironment("", {0, 1}, 2);
        QVERIFY(job.id.starts_with(job.host + "-"));
        // The job survives the trip through a discovery file; bad ranks are refused.
        wire::DiscoveryEntry e;
        e.pid = 1;
        e.endpoint = "unix:/x";
        e.job = job;
        auto back = wire::decodeDiscovery(wire::encodeDiscovery(e));
        QVERIFY(back);
        QCOMPARE(back->job.ranks, job.ranks);
        QCOMPARE(back->job.id, job.id);
        nlohmann::json bad = nlohmann::json::parse(wire::encodeDiscovery(e));
        bad["job"]["ranks"] = {5, 1}; // rank 5 of a world of 2
        auto refused = wire::decodeDiscovery(bad.dump());
        QVERIFY(!refused);
        QVERIFY2(refused.error().find("job.ranks") != std::string::npos, refused.error().c_str());
    }

    // Rings only for this process's ranks: events of others are counted, not stored.
    void hubRingsForLocalRanksOnly()
    {
        telemetry::TelemetryHub hub(64, std::vector<int>{5}, 1024);
        telemetry::Event e = telemetry::stamped(telemetry::makeStepBegin(), 0, 0, 5);
        hub.write(e);
        e.rank = 6;
        hub.write(e);
        std::vector<telemetry::Event> out;
        QCOMPARE(hub.drain(out), std::size_t(1));
        QCOMPARE(out[0].rank, std::uint16_t(5));
        QCOMPARE(hub.droppedEvents(), std::uint64_t(1));
        QCOMPARE(hub.ringCapacity(), std::size_t(1024));
    }
};

QTEST_GUILESS_MAIN(TestAgentState)
#include "tst_agentstate.moc"

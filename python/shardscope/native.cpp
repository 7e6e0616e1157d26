// shardscope._native: the Python agents' bridge to the C++ endpoint (shardscope.deepspeed
// and shardscope.fsdp both fill its AgentState; _native.pyi declares what it exports). The
// agents' Python hooks call these methods, their native hooks are hotpath.cpp (DeepSpeed's)
// and fsdppath.cpp (FSDP2's); the state, the events, the violation text, the server and the
// snapshot are the C++ ones every ShardScope producer uses (engine/server, engine/wire,
// engine/state/violationtext), so there is one implementation of the protocol.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <csignal>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "agent/agentstate.h"
#include "base/names.h"
#include "base/version.h"
#include "fsdppath.h"
#include "hotpath.h"
#include "server/finishonsignal.h"
#include "server/inspector.h"
#include "sessioncore/collectivealigner.h"
#include "state/severity.h"
#include "state/shape.h"
#include "state/violationledger.h"
#include "telemetry/clock.h"
#include "wire/atomicfile.h"
#include "wire/endpoint.h"
#include "wire/jobmerge.h"
#include "wire/messages.h"
#include "wire/snapshot.h"
#include "wire/token.h"

namespace py = pybind11;
using namespace shardscope;

namespace {

ParamStatus statusFrom(int s)
{
    if (s < 0 || static_cast<std::size_t>(s) >= kStatusNames.size()) {
        std::string known;
        for (std::size_t i = 0; i < kStatusNames.size(); ++i)
            known +=
                (i ? ", " : "") + std::to_string(i) + " (" + std::string(kStatusNames[i]) + ")";
        throw py::value_error("status must be one of " + known);
    }
    return static_cast<ParamStatus>(s);
}

// A name of base/names.h's tables back to its value; an unknown one is refused with the
// table's names (the names are said once, there).
template <typename E, std::size_t N>
E fromName(const std::string &name, std::optional<E> (*fromNameOf)(std::string_view),
           const std::array<std::string_view, N> &names, const char *what)
{
    if (const std::optional<E> value = fromNameOf(name)) return *value;
    std::string known;
    for (const std::string_view n : names)
        known += (known.empty() ? "'" : ", '") + std::string(n) + "'";
    throw py::value_error(std::string("unknown ") + what + " '" + name + "'; one of " + known);
}

Phase phaseFrom(const std::string &p)
{
    return fromName(p, phaseFromName, kPhaseNames, "phase");
}

GuardAction actionFrom(const std::string &a)
{
    return fromName(a, guardActionFromName, kGuardActionNames, "guard action");
}

// The agent's words for state::AccessUse.
state::AccessUse accessUseFrom(const std::string &u)
{
    if (u == "read") return state::AccessUse::Read;
    if (u == "write") return state::AccessUse::Write;
    if (u == "grad") return state::AccessUse::NeedsGrad;
    if (u == "attribute") return state::AccessUse::Attribute; // no values read: severity info
    throw std::invalid_argument("unknown access use '" + u + "' (read, write, grad, attribute)");
}

DType dtypeFrom(const std::string &d)
{
    if (d == "bfloat16") return DType::BF16;
    return DType::F32; // sizes of other dtypes are given in bytes by the agent
}

ModuleId moduleFrom(std::optional<std::uint32_t> m)
{
    return m ? *m : kNoModule;
}

// A user's source location as the agents pass it: (file, line, function, chain), or None.
using PyLocation =
    std::optional<std::tuple<std::string, std::uint32_t, std::string, std::vector<std::string>>>;

state::SourceLocation locationFrom(const PyLocation &location)
{
    state::SourceLocation where;
    if (location) std::tie(where.file, where.line, where.function, where.chain) = *location;
    return where;
}

// One agent per process: the provider and the endpoint serving it.
class Agent
{
  public:
    Agent(const std::string &model, int rank, int worldSize, const std::string &backend,
          bool listen, const std::string &endpoint, const std::string &token,
          const std::string &snapshotOut, std::size_t history, const std::string &job,
          const std::string &dialect)
    {
        if (worldSize < 1 || rank < 0 || rank >= worldSize)
            throw py::value_error("rank " + std::to_string(rank) + " is outside world size " +
                                  std::to_string(worldSize));
        agent::AgentConfig cfg;
        cfg.modelName = model;
        cfg.rank = rank;
        m_rank = rank;
        cfg.worldSize = worldSize;
        cfg.backend = backend;
        if (!state::parseFixDialect(dialect, cfg.dialect))
            throw py::value_error("unknown dialect '" + dialect + "' (deepspeed, fsdp)");
        m_state = std::make_unique<agent::AgentState>(cfg);
        server::InspectorOptions o;
        o.listen = listen;
        o.endpoint = endpoint;
        o.token = token;
        o.snapshotOut = snapshotOut;
        o.historyEvents = history;
        o.job = job;
        try {
            m_inspector = std::make_unique<server::Inspector>(*m_state, o);
        } catch (const server::InspectorError &e) {
            throw std::runtime_error(e.what());
        }
    }

    agent::AgentState &state() { return *m_state; }
    std::string endpoint() const { return m_inspector->endpoint(); }
    std::string flush()
    {
        py::gil_scoped_release release;
        return m_inspector->flushNow();
    }
    // The signal path goes only once the inspector has finished: a SIGTERM during the finish
    // (a launcher stopping the other ranks as this one fails) then waits for it in
    // Inspector::finish and the snapshot is written before the process dies; with the
    // default disposition back first, it died mid-finish without one.
    void finish(const std::string &reason)
    {
        py::gil_scoped_release release;
        struct Release
        {
            std::unique_ptr<server::FinishOnSignal> &onSignal;
            ~Release() { onSignal.reset(); }
        } release_after{m_onSignal};
        m_inspector->finish(reason);
    }
    // SIGTERM finishes the inspector (the snapshot written) from a native thread, then the
    // process dies of it, even while the main thread is blocked in a collective.
    void finishOnSigterm()
    {
        if (!m_onSignal)
            m_onSignal = std::make_unique<server::FinishOnSignal>(
                *m_inspector, "shardscope (rank " + std::to_string(m_rank) + ")",
                std::vector<int>{SIGTERM});
    }
    void refreshDiscovery() { m_inspector->refreshDiscovery(); }
    std::uint64_t dropped() const { return m_inspector->droppedEvents(); }
    std::uint64_t published() const { return m_inspector->publishedEvents(); }

  private:
    std::unique_ptr<agent::AgentState> m_state; // outlives the inspector that serves it
    std::unique_ptr<server::Inspector> m_inspector;
    std::unique_ptr<server::FinishOnSignal> m_onSignal; // before the inspector it names goes
    int m_rank = 0;
};

} // namespace

PYBIND11_MODULE(_native, module)
{
    module.doc() =
        "ShardScope's native endpoint for the agents (shardscope.deepspeed, shardscope.fsdp)";
    module.attr("__version__") = kVersion;
    module.attr("PROTOCOL_VERSION") = wire::kProtocolVersion;
    // The numbers both sides of the module use, from their one C++ home (_native.pyi lists
    // them): a parameter's status (base/types.h ParamStatus; DeepSpeed's ZeroParamStatus, and
    // FSDP2's sharded, all-gathering, unsharded), by name too (base/names.h), and the longest
    // history an inspector keeps and the one it keeps unless told (server/inspector.h).
    module.attr("PARAM_STATUS_NOT_AVAILABLE") = static_cast<int>(ParamStatus::NotAvailable);
    module.attr("PARAM_STATUS_INFLIGHT") = static_cast<int>(ParamStatus::Inflight);
    module.attr("PARAM_STATUS_AVAILABLE") = static_cast<int>(ParamStatus::Available);
    {
        py::dict statuses;
        for (std::size_t i = 0; i < kStatusNames.size(); ++i)
            statuses[py::str(std::string(kStatusNames[i]))] = static_cast<int>(i);
        module.attr("PARAM_STATUSES") = statuses;
    }
    module.attr("MAX_HISTORY") = server::kMaxHistoryEvents;
    module.attr("DEFAULT_HISTORY") = server::InspectorOptions{}.historyEvents;
    module.def("default_runtime_dir", [] { return wire::defaultRuntimeDir(); });
    // Phase name -> the number HotPath's scope hooks take (base/names.h says the names).
    {
        py::dict phases;
        for (int i = 0; i < 2; ++i)
            phases[py::str(std::string(phaseName(static_cast<Phase>(i))))] = i;
        module.attr("PHASES") = phases;
    }
    module.def(
        "endpoint_of_rank",
        [](const std::string &endpoint, int rank) {
            auto e = wire::endpointOfRank(endpoint, rank);
            if (!e) throw std::runtime_error(e.error());
            return *e;
        },
        py::arg("endpoint"), py::arg("rank"),
        "The endpoint rank N listens on when every rank was given this one (wire/endpoint.h)");
    module.def(
        "stall_seconds",
        [](const std::string &backend) {
            // The one reading of SHARDSCOPE_STALL_SECONDS (sessioncore::stallNsFromEnvironment)
            // and the one default per backend (defaultStallNs): the agents' watchdogs use the
            // threshold the job's aligner uses.
            std::string error;
            const std::uint64_t ns =
                sessioncore::stallNsFromEnvironment(sessioncore::defaultStallNs(backend), &error);
            if (!error.empty()) throw py::value_error(error);
            return static_cast<double>(ns) / 1e9;
        },
        py::arg("backend"),
        "The seconds a collective may wait before its rank is said stalled: "
        "SHARDSCOPE_STALL_SECONDS, else the backend's default (60 on nccl, 5 otherwise); a bad "
        "value raises ValueError naming the variable");
    module.def(
        "merge_job_snapshots",
        [](const std::vector<std::string> &paths, const std::string &job) {
            // One snapshot of a job's processes (wire::mergeJobSnapshots, the one merge), and
            // for each of its violation entries the ledger row it counts into
            // (state::ViolationLedger, the one grouping rule): shardscope-check's report reads
            // these rows instead of grouping entries again.
            std::vector<wire::Snapshot> parts;
            for (const std::string &path : paths) {
                auto s = wire::readSnapshotFile(path);
                if (!s) throw std::runtime_error(path + ": " + s.error());
                parts.push_back(std::move(*s));
            }
            auto merged = wire::mergeJobSnapshots(parts, job);
            if (!merged) throw std::runtime_error(merged.error());
            // The job's collectives aligned (issue 51): collective_mismatch and rank_stalled
            // records join its violations (sessioncore/collectivealigner.h).
            const sessioncore::JobDiagnosis diagnosis =
                sessioncore::diagnoseJob(*merged, 0, &parts);
            if (!diagnosis.error.empty()) throw py::value_error(diagnosis.error);
            state::ViolationLedger ledger;
            std::vector<std::size_t> rows;
            for (const state::ViolationRecord &v : merged->state.violations)
                rows.push_back(ledger.add(v, state::Tally::Total).row);
            return py::make_tuple(wire::encodeSnapshot(*merged), rows);
        },
        py::arg("paths"), py::arg("job"),
        "(snapshot JSON of the job, ledger row of each of its violations) from rank snapshots");
    module.def("output_of_rank", &wire::outputOfRank, py::arg("path"), py::arg("rank"),
               py::arg("world_size"),
               "The snapshot file rank N writes when every rank was given this name "
               "(wire/snapshot.h)");
    module.def(
        "check_output_file",
        [](const std::string &path) {
            auto ok = wire::checkOutputFile(path);
            return ok ? std::string() : ok.error();
        },
        py::arg("path"), "'' when a snapshot can be written there, else why not");
    module.def(
        "write_file_atomically",
        [](const std::string &path, const std::string &contents) {
            // The one writer (wire/atomicfile.h): a regular file, a symlink included, is replaced
            // by a rename, so a symlink planted at the name is replaced, its target untouched.
            auto ok = wire::writeFileAtomically(path, contents);
            return ok ? std::string() : ok.error();
        },
        py::arg("path"), py::arg("contents"),
        "'' once contents (str or bytes) are in path, written as every ShardScope output is "
        "(wire/atomicfile.h writeFileAtomically), else why not");
    module.def(
        "resolve_token",
        [](const std::string &token, const std::string &tokenFile) {
            auto t = wire::resolveToken(token, tokenFile);
            if (!t) throw std::runtime_error(t.error());
            return *t;
        },
        py::arg("token") = "", py::arg("token_file") = "",
        "The token as every ShardScope executable resolves it: token, token_file, "
        "$SHARDSCOPE_TOKEN, the 0600 file named by $SHARDSCOPE_TOKEN_FILE");
    module.def(
        "violation_kinds",
        [] {
            return std::vector<std::string>(kViolationKindNames.begin(), kViolationKindNames.end());
        },
        "Every violation kind's name (docs/snapshot.md), in the order of their values");
    module.def(
        "severities",
        [] { return std::vector<std::string>(kSeverityNames.begin(), kSeverityNames.end()); },
        "Every severity's name, worst first (docs/snapshot.md, a violation's `severity`)");
    module.def(
        "severity_of",
        [](const std::string &kind, const std::string &action, const std::string &read) {
            return std::string(severityName(state::severityOf(
                fromName(kind, violationKindFromName, kViolationKindNames, "violation kind"),
                actionFrom(action),
                fromName(read, violationReadFromName, kViolationReadNames, "read"))));
        },
        py::arg("kind"), py::arg("action"), py::arg("read") = "values",
        "A violation's severity by the one rule (engine/state/severity.h): 'error', 'cost' or "
        "'info'");

    py::class_<Agent>(module, "Agent")
        .def(py::init<const std::string &, int, int, const std::string &, bool, const std::string &,
                      const std::string &, const std::string &, std::size_t, const std::string &,
                      const std::string &>(),
             py::arg("model"), py::arg("rank"), py::arg("world_size"), py::arg("backend"),
             py::arg("listen") = true, py::arg("endpoint") = "", py::arg("token") = "",
             py::arg("snapshot_out") = "", py::arg("history") = server::InspectorOptions{}.historyEvents, py::arg("job") = "",
             py::arg("dialect") = "deepspeed")
        .def_property_readonly("endpoint", &Agent::endpoint)
        .def_property_readonly("dropped_events", &Agent::dropped)
        .def_property_readonly("published_events", &Agent::published)
        .def("flush", &Agent::flush,
             "Hands everything recorded to the clients and writes snapshot_out now; returns an "
             "error or ''")
        .def("finish", &Agent::finish, py::arg("reason") = "training finished",
             "Says goodbye with reason (\"training failed: ...\" when the run failed), writes "
             "snapshot_out, stops serving")
        .def("finish_on_sigterm", &Agent::finishOnSigterm,
             "SIGTERM writes the snapshot from a native thread, then the process dies of it")
        .def("ensure_module",
             [](Agent &a, const std::string &path, const std::string &type) {
                 return a.state().ensureModule(path, type);
             })
        .def("set_unit",
             [](Agent &a, std::uint32_t id, std::uint32_t group,
                const std::string &reshardAfterForward, const std::string &mesh) {
                 a.state().setUnit(id, group, reshardAfterForward, mesh);
             },
             py::arg("module"), py::arg("group"), py::arg("reshard_after_forward"), py::arg("mesh"),
             "FSDP2: module is a unit of the group headed by module group (docs/fsdp.md)")
        .def("set_model_name",
             [](Agent &a, const std::string &n) {
                 a.state().setModelName(n);
                 a.refreshDiscovery(); // `shardscope-capture --list` names it from now on
             })
        .def("set_config",
             [](Agent &a, std::int64_t persistence, std::int64_t bucket, std::int64_t maxLive,
                const std::string &guard) {
                 state::EngineConfigRecord c;
                 c.persistenceThreshold = persistence;
                 c.prefetchBucketSize = bucket;
                 c.maxLiveParameters = maxLive;
                 if (!parseGuardPolicy(guard, c.guard))
                     throw py::value_error("unknown guard '" + guard + "'");
                 a.state().setConfig(c);
             })
        .def(
            "set_param",
            [](Agent &a, std::uint32_t id, const std::string &name, std::uint32_t owner,
               std::vector<std::int64_t> shape, const std::string &dtype, std::int64_t numel,
               std::int64_t partitionNumel, std::int64_t paddedNumel, bool persistent,
               bool partitioned, bool late, int status, const std::string &replaces,
               std::uint32_t elementSize, const std::string &placements) {
                agent::AgentParam p;
                state::ParamRecord &r = p.record;
                r.id = id;
                r.name = name;
                r.owner = owner;
                r.shape = std::move(shape);
                r.dtype = dtypeFrom(dtype);
                r.numel = numel;
                r.partitionNumel = partitionNumel;
                r.paddedNumel = paddedNumel;
                r.persistent = persistent;
                r.partitioned = partitioned;
                r.late = late;
                r.replaces = replaces;
                r.placements = placements;
                p.status = statusFrom(status);
                p.elementBytes = elementSize;
                a.state().setParam(p);
            },
            py::arg("id"), py::arg("name"), py::arg("owner"), py::arg("shape"), py::arg("dtype"),
            py::arg("numel"), py::arg("partition_numel"), py::arg("padded_numel"),
            py::arg("persistent"), py::arg("partitioned"), py::arg("late"), py::arg("status"),
            py::arg("replaces") = "", py::arg("element_size") = 4, py::arg("placements") = "")
        .def("remove_param", [](Agent &a, std::uint32_t id) { a.state().removeParam(id); })
        .def("has_param", [](Agent &a, std::uint32_t id) { return a.state().hasParam(id); })
        .def("set_active",
             [](Agent &a, std::uint32_t id, std::vector<std::uint32_t> modules) {
                 a.state().setActive(id, std::move(modules));
             })
        .def("set_active_many",
             [](Agent &a,
                std::vector<std::pair<std::uint32_t, std::vector<std::uint32_t>>> changes) {
                 a.state().setActive(std::move(changes));
             })
        .def("broadcast", [](Agent &a, std::uint32_t p, int root,
                             std::uint64_t bytes) { a.state().broadcast(p, root, bytes); })
        .def("register_external",
             [](Agent &a, std::uint32_t m, std::uint32_t p, bool automatic) {
                 a.state().registerExternal(m, p, automatic);
             })
        .def("unregister_external",
             [](Agent &a, std::uint32_t m, std::uint32_t p) { a.state().unregisterExternal(m, p); })
        .def(
            "unregistered_access",
            [](Agent &a, std::optional<std::uint32_t> accessor, std::uint32_t p,
               const std::string &action, const std::string &use,
               const PyLocation &location,
               const std::string &building, const std::string &paramCode,
               std::optional<int> statusAtRead) {
                const state::SourceLocation where = locationFrom(location);
                std::optional<ParamStatus> status;
                if (statusAtRead) status = statusFrom(*statusAtRead);
                const state::ViolationText t = a.state().unregisteredAccess(
                    moduleFrom(accessor), p, actionFrom(action), accessUseFrom(use), where,
                    building, paramCode, status);
                return py::make_tuple(t.message, t.fix);
            },
            py::arg("accessor"), py::arg("param"), py::arg("action"), py::arg("use") = "read",
            py::arg("location") = py::none(), py::arg("building") = "",
            py::arg("param_code") = "", py::arg("status_at_read") = py::none(),
            "Records an unregistered access; use 'attribute' for a read of attributes only "
            "(severity info); status_at_read: its status when it was read (0-2), if not now")
        .def("complete_build_names",
             [](Agent &a, const std::map<std::uint32_t, std::uint32_t> &moved) {
                 std::map<ModuleId, ModuleId> m;
                 for (const auto &[from, to] : moved)
                     m.emplace(from, to);
                 a.state().completeBuildNames(m);
             })
        .def("module_enter",
             [](Agent &a, std::uint32_t m, const std::string &phase) {
                 a.state().moduleEnter(m, phaseFrom(phase));
             })
        .def("module_exit",
             [](Agent &a, std::uint32_t m, const std::string &phase) {
                 a.state().moduleExit(m, phaseFrom(phase));
             })
        .def("tied_across_groups",
             [](Agent &a, std::uint32_t p, std::uint32_t first, std::uint32_t second,
                bool refusedByTorch, const std::vector<std::uint32_t> &more) {
                 const state::ViolationText t = a.state().tiedAcrossGroups(
                     p, first, second, refusedByTorch, std::vector<ModuleId>(more.begin(), more.end()));
                 return py::make_tuple(t.message, t.fix);
             },
             py::arg("param"), py::arg("first"), py::arg("second"), py::arg("refused_by_torch") = true,
             py::arg("more") = std::vector<std::uint32_t>{})
        .def(
            "backward_unfinished",
            [](Agent &a, std::uint32_t root, const std::string &raised, bool compiledAutograd,
               const PyLocation &location, std::size_t bucketed) {
                const state::SourceLocation where = locationFrom(location);
                const state::ViolationText t =
                    a.state().backwardUnfinished(root, raised, compiledAutograd, where, bucketed);
                return py::make_tuple(t.message, t.fix);
            },
            py::arg("root"), py::arg("raised") = "", py::arg("compiled_autograd") = false,
            py::arg("location") = py::none(), py::arg("bucketed") = 0)
        .def(
            "checkpoint",
            [](Agent &a, const std::string &kind, std::uint32_t root, const std::string &call,
               const std::string &param, std::optional<std::uint32_t> paramId,
               std::size_t params, std::uint64_t bytes, const std::string &checkpoint,
               int savedWorld, int world, bool withoutModifier, const PyLocation &location) {
                agent::AgentState::Checkpoint c;
                c.kind = fromName(kind, violationKindFromName, kViolationKindNames, "violation kind");
                if (c.kind != ViolationKind::PartitionedSave &&
                    c.kind != ViolationKind::PartitionedLoad &&
                    c.kind != ViolationKind::ResumeWorldSize)
                    throw py::value_error("checkpoint(): kind must be partitioned_save, "
                                          "partitioned_load or resume_world_size, not " + kind);
                c.root = root;
                c.call = call;
                c.param = param;
                c.paramId = paramId.value_or(kNoParam);
                c.params = params;
                c.bytes = bytes;
                c.checkpoint = checkpoint;
                c.savedWorld = savedWorld;
                c.world = world;
                c.withoutModifier = withoutModifier;
                c.where = locationFrom(location);
                const state::ViolationText t = a.state().checkpoint(c);
                return py::make_tuple(t.message, t.fix);
            },
            py::arg("kind"), py::arg("root"), py::arg("call"), py::arg("param") = "",
            py::arg("param_id") = py::none(), py::arg("params") = 0, py::arg("bytes") = 0,
            py::arg("checkpoint") = "", py::arg("saved_world") = 0, py::arg("world") = 0, py::arg("without_modifier") = false,
            py::arg("location") = py::none())
        .def(
            "shard_order",
            [](Agent &a, std::uint32_t parent, std::uint32_t child, const std::string &param,
               const PyLocation &parentLocation, const PyLocation &location) {
                const state::ViolationText t = a.state().shardOrder(
                    parent, child, param, locationFrom(parentLocation), locationFrom(location));
                return py::make_tuple(t.message, t.fix);
            },
            py::arg("parent"), py::arg("child"), py::arg("param"),
            py::arg("parent_location") = py::none(), py::arg("location") = py::none())
        .def(
            "late_parameter",
            [](Agent &a, std::uint32_t p,
               const PyLocation &location) {
                const state::SourceLocation where = locationFrom(location);
                a.state().lateParameter(p, where);
            },
            py::arg("param"), py::arg("location") = py::none())
        .def("parameter_adopted", [](Agent &a, std::uint32_t p) { a.state().parameterAdopted(p); })
        .def("trace_invalidated",
             [](Agent &a, std::optional<std::uint32_t> expected, std::uint32_t got,
                const std::string &phase) {
                 std::optional<ModuleId> e;
                 if (expected) e = *expected;
                 return a.state().traceInvalidated(e, got, phaseFrom(phase)).message;
             })
        .def(
            "step_begin", [](Agent &a, std::uint32_t step) { a.state().stepBegin(step); },
            py::arg("step") = 0)
        .def("set_statuses",
             [](Agent &a, const std::vector<std::pair<std::uint32_t, int>> &statuses) {
                 std::vector<std::pair<ParamId, ParamStatus>> s;
                 s.reserve(statuses.size());
                 for (const auto &[id, status] : statuses)
                     s.emplace_back(id, statusFrom(status));
                 a.state().setStatuses(s);
             })
        .def(
            "step_end",
            [](Agent &a, py::handle loss) { a.state().stepEnd(agent::lossNumber(loss)); },
            py::arg("loss") = py::none()) // a number, a loss tensor (agent::lossNumber) or None
        .def(
            "reduce_scatter_begin",
            [](Agent &a, std::uint32_t unit, std::optional<std::uint32_t> param,
               std::uint64_t bytes, std::uint32_t params) {
                a.state().reduceScatterBegin(unit, param.value_or(kNoParam), bytes, params);
            },
            py::arg("module"), py::arg("param"), py::arg("bytes"), py::arg("params"))
        .def(
            "reduce_scatter_end",
            [](Agent &a, std::uint32_t unit, std::optional<std::uint32_t> param,
               std::uint64_t bytes, std::uint32_t params) {
                a.state().reduceScatterEnd(unit, param.value_or(kNoParam), bytes, params);
            },
            py::arg("module"), py::arg("param"), py::arg("bytes"), py::arg("params"))
        .def(
            "allocator_sample",
            [](Agent &a, std::uint64_t allocated, std::uint64_t reserved, std::uint64_t peak) {
                a.state().allocatorSample(allocated, reserved, peak);
            },
            py::arg("allocated"), py::arg("reserved"), py::arg("peak_allocated"))
        // Collectives (issue 51; docs/protocol.md collective_begin/end): kind "all_gather",
        // "reduce_scatter" or "broadcast"; reason a fetch reason's name.
        .def(
            "collective_begin",
            [](Agent &a, const std::string &kind, std::uint32_t group,
               std::optional<std::uint32_t> served, const std::string &reason,
               std::uint64_t bytes, std::uint32_t params) {
                return a.state().collectiveBegin(
                    fromName(kind, collectiveKindFromName, kCollectiveKindNames,
                             "collective kind"),
                    group, moduleFrom(served),
                    fromName(reason, fetchReasonFromName, kFetchReasonNames, "reason"), bytes,
                    params);
            },
            py::arg("kind"), py::arg("group"), py::arg("module"), py::arg("reason"),
            py::arg("bytes"), py::arg("params"))
        .def(
            "collective_end",
            [](Agent &a, std::uint32_t group, std::uint64_t seq) {
                a.state().collectiveEnd(group, seq);
            },
            py::arg("group"), py::arg("seq"))
        .def("oldest_in_flight",
             [](Agent &a) -> py::object {
                 const auto c = a.state().oldestInFlight();
                 if (!c) return py::none();
                 const std::uint64_t now = telemetry::nowNs();
                 const double waited = now > c->sinceNs ? double(now - c->sinceNs) * 1e-9 : 0.0;
                 return py::make_tuple(
                     c->group, c->seq, std::string(collectiveKindName(c->kind)),
                     c->module == kNoModule ? py::object(py::none()) : py::int_(c->module),
                     std::string(fetchReasonName(c->reason)), c->bytes, c->params, waited);
             })
        .def(
            "collective_stalled",
            [](Agent &a, std::uint32_t group, std::uint64_t seq, double waited,
               const PyLocation &location, const std::vector<PyLocation> &stack) {
                const auto c = a.state().inFlight(group, seq);
                if (!c) return;
                std::vector<state::SourceLocation> frames;
                frames.reserve(stack.size());
                for (const PyLocation &f : stack) frames.push_back(locationFrom(f));
                a.state().collectiveStalled(*c, waited, locationFrom(location), std::move(frames));
            },
            py::arg("group"), py::arg("seq"), py::arg("waited"), py::arg("location"),
            py::arg("stack"))
        .def_property_readonly("step", [](Agent &a) { return a.state().step(); })
        .def("state_json", [](Agent &a) {
            wire::Snapshot s;
            s.state = a.state().state();
            return wire::encodeSnapshot(s);
        });
    auto stateOf = [](py::handle a) -> agent::AgentState & { return a.cast<Agent &>().state(); };
    agent::bindHotPath(module, stateOf);
    agent::bindFsdpPath(module, stateOf); // shardscope.fsdp's group methods
}

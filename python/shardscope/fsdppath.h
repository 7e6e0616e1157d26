#pragma once
// shardscope.fsdp's per-unit path, in C++: FSDP2's group methods it observes (unshard,
// _to_unsharded, _to_sharded, _to_sharded_post_forward, pre/post_forward, pre/post_backward,
// _prefetch_unshard) and the foreach_reduce it calls as native hooks. In Python each was a wrapper
// frame and a handler, ~1,300 calls a step on a 101-unit model at ~7 µs each, +8 % of the training
// thread's CPU (docs/performance.md, section 15). Here each is one vectorcall into C++ that keeps
// the group's status, the open scopes and the cause of each all-gather, and writes the events
// through AgentState. What is rare stays in Python (shardscope/fsdp.py): publishing a group
// the first time, working out a reduce-scatter's size, the read watching, violations.

#include <cstdint>
#include <deque>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>

#include "agent/agentstate.h"
#include "base/types.h"

namespace shardscope::agent {

namespace py = pybind11;

class FsdpPath : public std::enable_shared_from_this<FsdpPath>
{
  public:
    // The FSDPParamGroup methods observed; their Python names are kMethodNames.
    enum class Method : std::uint8_t
    {
        Unshard,
        ToUnsharded,
        ToSharded,
        ToShardedPostForward,
        PreForward,
        PostForward,
        PreBackward,
        PostBackward,
        PrefetchUnshard,  // a staticmethod (target, pass_type)
        ForeachReduce,    // the function _fsdp_param_group calls in post_backward
        ForeachAllGather, // the function unshard() issues the group's all-gather with
    };
    static constexpr std::string_view kMethodNames[] = {
        "unshard",           "_to_unsharded",  "_to_sharded",       "_to_sharded_post_forward",
        "pre_forward",       "post_forward",   "pre_backward",      "post_backward",
        "_prefetch_unshard", "foreach_reduce", "foreach_all_gather"};

    // A group's status on this rank, as shardscope.fsdp numbers it (SHARDED, GATHERING,
    // UNSHARDED): ParamStatus's NotAvailable, Inflight, Available (base/types.h), which the
    // native module exports as PARAM_STATUS_*.
    static constexpr int kSharded = static_cast<int>(ParamStatus::NotAvailable);
    static constexpr int kGathering = static_cast<int>(ParamStatus::Inflight);
    static constexpr int kUnsharded = static_cast<int>(ParamStatus::Available);

    // agent: the native Agent (kept alive); observer: the Python _Agent (held weakly), asked
    // for what is rare (_group: a group met for the first time; poll_reduces); preBackward:
    // FSDP's TrainingState.PRE_BACKWARD.
    FsdpPath(AgentState &state, py::object agent, py::object observer, py::object preBackward);

    // The native replacement of method, calling original inside the bookkeeping; None when
    // name is not one of kMethodNames.
    py::object hook(const std::string &name, py::object original);
    // Its call: a new reference, or nullptr with the Python error set (FSDP's own, unchanged).
    PyObject *call(Method m, PyObject *original, PyObject *const *args, std::size_t nargsf,
                   PyObject *kwnames);

    // A group the agent publishes (again: its parameters and unit replaced): its number.
    // params: [(param id, bytes an all-gather of it moves)]; status: as it is now.
    std::size_t addGroup(py::handle group, std::vector<std::pair<ParamId, std::uint64_t>> params,
                         ModuleId unit, int status);
    int status(std::size_t group) const { return at(group).status; }
    // Its status as it is now, without events (resume(): what changed while paused).
    void setStatus(std::size_t group, int status) { at(group).status = status; }
    bool anyInBackward() const;
    // A module's id (pre_forward/post_forward name the module whose forward runs).
    void setModule(py::handle module, ModuleId id) { m_modules[module.ptr()] = id; }
    void clearScopes() { m_scopes.clear(); } // the root's forward begins
    // How many gradient reduce-scatters the group issued, and their bytes (describe()).
    std::pair<std::uint64_t, std::uint64_t> reduceCounts(std::size_t group) const
    {
        return {at(group).reduceScatters, at(group).reduceBytes};
    }

    int inside = 0;        // depth of FSDP's own code (its reads of the shards are not the user's)
    bool closed = false;   // the agent has finished: every hook passes through
    bool attached = false; // the root is known: a group met for the first time is published
    bool pendingReduces = false; // CUDA reduce-scatters wait to be seen complete (poll_reduces)

  private:
    struct Group
    {
        PyObject *object; // the FSDPParamGroup (the Python _Group keeps it alive)
        std::vector<std::pair<ParamId, std::uint64_t>> params;
        std::uint64_t bytes = 0;     // what its all-gather moves (the params' sum)
        std::uint64_t gatherSeq = 0; // its all-gather collective in flight, or 0
        std::uint32_t gatherGroup = 0;
        ModuleId unit = 0;
        int status = kSharded;
        FetchReason reason = FetchReason::Forward; // of the all-gather in flight
        ModuleId cause = kNoModule;
        bool inBackward = false;
        std::uint64_t reduceScatters = 0, reduceBytes = 0;
        // The last reduce-scatter's size, for the same parameters, process group and reduce
        // dtype (borrowed: FSDP keeps them; compared, never dereferenced): worked out in
        // Python (_reduce_size) only when one of them changes.
        std::vector<PyObject *> reduceKey;
        std::uint64_t reduceSize = 0;
        bool reduceOnCpu = true;
    };
    struct Cause
    {
        FetchReason reason;
        ModuleId module;
    };

    Group &at(std::size_t group);
    const Group &at(std::size_t group) const;
    Group *groupOf(PyObject *g); // published now if it is new; nullptr: not one of the model's
    py::object observer() const; // the Python _Agent, or a RuntimeError once it is gone
    void changeStatus(Group &g, int to, ModuleId cause, FetchReason reason);
    void closeScope(ModuleId m);
    ModuleId moduleOf(PyObject *module, ModuleId otherwise) const;
    bool truth(PyObject *object, PyObject *name);  // bool(object.name)
    bool isNone(PyObject *object, PyObject *name); // object.name is None

    PyObject *callInside(Cause c, PyObject *original, PyObject *const *args, std::size_t nargsf,
                         PyObject *kwnames);
    PyObject *unshard(Group &g, PyObject *original, PyObject *const *args, std::size_t nargsf,
                      PyObject *kwnames);
    PyObject *toUnsharded(Group *g, PyObject *original, PyObject *const *args, std::size_t nargsf,
                          PyObject *kwnames);
    PyObject *toSharded(Group *g, PyObject *original, PyObject *const *args, std::size_t nargsf,
                        PyObject *kwnames);
    PyObject *preForward(Group &g, PyObject *original, PyObject *const *args, std::size_t nargsf,
                         PyObject *kwnames);
    PyObject *postForward(Group &g, PyObject *original, PyObject *const *args, std::size_t nargsf,
                          PyObject *kwnames);
    PyObject *preBackward(Group &g, PyObject *original, PyObject *const *args, std::size_t nargsf,
                          PyObject *kwnames);
    PyObject *postBackward(Group &g, PyObject *original, PyObject *const *args, std::size_t nargsf,
                           PyObject *kwnames);
    PyObject *prefetchUnshard(PyObject *original, PyObject *const *args, std::size_t nargsf,
                              PyObject *kwnames);
    PyObject *foreachReduce(PyObject *original, PyObject *const *args, std::size_t nargsf,
                            PyObject *kwnames);
    PyObject *foreachAllGather(PyObject *original, PyObject *const *args, std::size_t nargsf,
                               PyObject *kwnames);
    std::uint32_t groupNumber(PyObject *pg); // the observer's group_number, kept per object
    void endGather(Group &g);                // its all-gather's collective_end, once

    AgentState &m_state;
    py::object m_agent;
    py::weakref m_observer; // weak: the _Agent holds this FsdpPath (no cycle through pybind11)
    py::object m_preBackward;
    std::deque<Group> m_groups; // stable: a hook holds its Group while FSDP publishes another
    std::unordered_map<PyObject *, std::size_t> m_index; // FSDPParamGroup -> m_groups
    std::unordered_map<PyObject *, ModuleId> m_modules;  // module -> its id
    std::vector<Cause> m_causes;      // the FSDP methods running now, innermost last
    std::vector<ModuleId> m_scopes;   // units whose forward or backward is open
    PyObject *m_reducing = nullptr;   // borrowed: post_backward's group while it runs
    PyObject *m_unsharding = nullptr; // borrowed: unshard's group while it runs
    std::vector<std::pair<py::object, std::uint32_t>> m_groupNumbers; // process group -> number
    py::str m_kAllGatherResult{"_all_gather_result"}, m_kIsUnsharded{"is_unsharded"},
        m_kTrainingState{"_training_state"}, m_kModule{"module"}, m_kReduceDtype{"reduce_dtype"};
};

// Registers FsdpPath in the module; stateOf gives the AgentState of the module's Agent object.
void bindFsdpPath(py::module_ &m, AgentState &(*stateOf)(py::handle agent));

} // namespace shardscope::agent

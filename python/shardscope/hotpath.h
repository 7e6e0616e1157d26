#pragma once
// The DeepSpeed agent's per-event path, in C++: every ds_status assignment of a converted
// parameter and every module scope DeepSpeed's hooks open and close. In Python these cost
// the small model's step several percent (docs/performance.md, section 10): a descriptor's
// __set__, the observer's method and its lookups, a wrapper frame around each of DeepSpeed's
// four scope functions. Here each is one call into C++ that reads the parameter's or the
// module's __dict__, keeps the scope stack, decides the fetch's cause and reason, and
// writes the event through AgentState. What is rare stays in Python (shardscope/deepspeed.py):
// naming a module the first time, its own parameters, suspect reads, violations.

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "agent/agentstate.h"
#include "state/shape.h"

namespace shardscope::agent {

namespace py = pybind11;

// The loss a step ends with, as one number, for every agent (the DeepSpeed agent's HotPath and
// shardscope.fsdp's step_end): a scalar tensor or a number is its value, another tensor its
// mean, None or anything else NaN. The script's own loss is kept by the one pass-through
// wrapper of torch.Tensor.backward (shardscope/_runtime.py, watch_backward).
double lossNumber(py::handle loss);

// Runs after(), then returns r; when r is nullptr the pending Python error survives after()
// (which must not raise then: its own errors are dropped, the framework's is what the user
// sees).
template <typename After> PyObject *finally(PyObject *r, After &&after)
{
    if (!r) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        try {
            after();
        } catch (py::error_already_set &) {
        } catch (const std::exception &) {
        }
        PyErr_Restore(type, value, traceback);
        return nullptr;
    }
    try {
        after();
    } catch (...) {
        Py_DECREF(r);
        throw;
    }
    return r;
}

class HotPath : public std::enable_shared_from_this<HotPath>
{
  public:
    // agent: the native Agent (kept alive); observer: the Python _Agent, asked for what is
    // rare (held weakly); statuses: DeepSpeed's ZeroParamStatus members NOT_AVAILABLE, INFLIGHT,
    // AVAILABLE; names: DeepSpeed's attribute names it uses (_dsinternals.native_names()).
    HotPath(agent::AgentState &state, py::object agent, py::object observer,
            py::object notAvailable, py::object inflight, py::object available,
            const py::dict &names);

    // The descriptor's __set__: stores value as the parameter's ds_status, then turns the
    // change into events (docs/deepspeed.md, "What is observed where").
    void statusSet(py::handle param, py::handle value);
    PyObject *statusKey() const { return m_kStatus.ptr(); } // ds_status
    // The data descriptor that observes ds_status (get, set and delete as an instance
    // attribute would behave), for the parameters' class.
    py::object statusDescriptor();

    // A replacement for one of DeepSpeedZeRoOffload's {pre,post}_sub_module_{forward,
    // backward}_function: calls original(self, module) inside the scope's bookkeeping.
    py::object scopeHook(py::object original, Phase phase, bool begin);
    // Its call (args: the DeepSpeedZeRoOffload and the module): a new reference, or nullptr
    // with the Python error set (DeepSpeed's own, unchanged).
    PyObject *scopeBegin(PyObject *original, PyObject *const *args, std::size_t nargsf,
                         Phase phase);
    PyObject *scopeEnd(PyObject *original, PyObject *const *args, std::size_t nargsf, Phase phase);

    // A replacement for DeepSpeedEngine.forward, .backward or .step: calls original with the
    // same arguments inside the step's bookkeeping (docs/deepspeed.md, "What is observed
    // where"). Native like the scope hooks: a Python wrapper frame around each of the three
    // cost the small model's step 1-2 % (docs/performance.md, section 10).
    enum class EngineCall
    {
        Forward,
        Backward,
        Step
    };
    py::object engineHook(py::object original, EngineCall call);
    // Its call (args[0]: the DeepSpeedEngine): a new reference, or nullptr with the Python
    // error set (DeepSpeed's own, unchanged).
    PyObject *engineCall(PyObject *original, PyObject *const *args, std::size_t nargsf,
                         PyObject *kwnames, EngineCall call);
    // A replacement for ZeROOrderedDict.__getitem__ (a module's parameter read by attribute
    // after deepspeed.initialize): a parameter that is not NOT_AVAILABLE goes straight to
    // original(self, key); one that is goes to slow(self, key, param) in Python, which
    // records the read and calls original itself (DeepSpeed's silent registration).
    py::object getitemHook(py::object original, py::object slow);
    PyObject *getitemCall(PyObject *original, PyObject *slow, PyObject *const *args,
                          std::size_t nargsf);

    // A replacement for partition_parameters._dist_allgather_fn(input, output, group), the one
    // function ZeRO-3's all_gather_coalesced issues its all-gathers through: the batch whose
    // parameters went NOT_AVAILABLE -> INFLIGHT since the last one (the coordinator's fetch or
    // prefetch of a module) is one collective_begin before the call (docs/deepspeed.md,
    // "Collectives"); the same batch's first INFLIGHT -> AVAILABLE (its handle waited for) is its
    // collective_end. The later calls of one batch (one per parameter when DeepSpeed gathers
    // them one by one, the quantization scales) begin nothing.
    py::object gatherHook(py::object original);
    PyObject *gatherCall(PyObject *original, PyObject *const *args, std::size_t nargsf,
                         PyObject *kwnames);

    // The engine the observer attached to (None: none). A forward while none is attached goes
    // to the observer's on_engine_forward, which attaches that engine; a second engine in the
    // process (an RLHF critic, say) is not attached to, but its forwards and steps still
    // begin and end steps, as they did before the hooks were native.
    void setEngine(py::object engine);

    void enter(py::handle module, Phase phase);
    void exit(py::handle module, Phase phase);
    void closeScopes();            // every open scope exits (end of forward/backward, pause)
    void setLoss(py::object loss); // the loss a step ends with (a plain loss.backward())
    // A step begins (DeepSpeedEngine.forward): open scopes close, then AgentState's step.
    void beginStep(std::uint32_t step);
    // A step ends (DeepSpeedEngine.step): active sub-modules sampled, then AgentState's step.
    void endStep(double loss);
    std::size_t depth() const { return m_stack.size(); }
    py::object top() const;                // the innermost module, or None
    bool onStack(py::handle module) const; // module's scope is open
    py::object topEntry() const;           // (module, phase number), or None

    // A parameter clients see (bytes: what a gather of it moves); its active sub-modules are
    // sampled at the next flushActive(). hpz: it has a ZeRO++ hpZ secondary group
    // (ds_zero_param_process_group): the secondary partition DeepSpeed gives it at a release
    // (ds_secondary_tensor) is counted in the rank's held bytes until a step's end finds it
    // dropped (the optimizer step's invalidate_secondary_tensor).
    void publish(std::uint32_t dsId, std::uint64_t bytes, py::object param, bool hpz = false);
    void unpublish(std::uint32_t dsId)
    {
        clearPendingGather(); // holds pointers into m_published
        m_published.erase(dsId);
    }
    void mapModule(std::int64_t dsModuleId, ModuleId id) { m_dsModules[dsModuleId] = id; }
    void markDirty(std::uint32_t dsId); // sample it at the next flushActive()
    void forgetOwn(ModuleId module);    // its registrations changed
    // ds_active_sub_modules of the parameters whose status changed since the last call, sent
    // where they differ from what was sent, in one AgentState call: sampled when a step ends
    // and when the agent flushes, because following every change costs a step several percent.
    void flushActive();

    int gathered = 0;    // depth of GatheredParameters scopes being entered or exited
    int autoDepth = 0;   // depth of DeepSpeed's automatic registration
    bool slow = false;   // suspect reads exist: the observer must hear of scopes and gathers
    bool inStep = false; // a step began (forward) and has not ended (step that stepped)
    // Called with no arguments after each step's end (the agent's allocator_sample on a CUDA
    // model, python/shardscope/_allocator.py); None: nothing.
    py::object afterStep = py::none();

  private:
    struct Scope
    {
        py::object module;
        ModuleId id;
        Phase phase;
    };
    using OwnSet = std::unordered_set<std::uint32_t>; // a module's own ds_ids
    struct Fetching
    {
        ModuleId id;
        Phase phase;
        const OwnSet *own; // in m_own or m_retiredOwn while fetching
    };

    PyObject *engineForward(PyObject *original, PyObject *const *args, std::size_t nargsf,
                            PyObject *kwnames);
    PyObject *engineBackward(PyObject *original, PyObject *const *args, std::size_t nargsf,
                             PyObject *kwnames);
    PyObject *engineStep(PyObject *original, PyObject *const *args, std::size_t nargsf,
                         PyObject *kwnames);
    long long globalSteps(PyObject *engine); // engine.global_steps, -1 without one
    double lossValue();                      // the loss handed to backward, as one number
    ModuleId moduleId(py::handle module);
    const OwnSet *ownOf(ModuleId id, py::handle module); // kept in m_own
    void endFetching(); // no scope fetches now: m_fetching and m_retiredOwn cleared
    int statusCode(PyObject *s) const;

    agent::AgentState &m_state;
    py::object m_agent;
    py::object observer() const; // the Python _Agent, or a RuntimeError once it is gone
    py::weakref m_observer;      // weak: the _Agent holds this HotPath (no cycle through pybind11)
    PyObject *m_status[3];       // borrowed from m_statusRefs
    py::object m_statusRefs[3];
    py::str m_kStatus, m_kId, m_kModuleId{"_shardscope_id"}; // ds_status, ds_id
    py::object m_engine;             // the attached DeepSpeedEngine, or None
    py::object m_loss;               // what the step's backward was given, or None
    py::str m_kGlobalSteps, m_kLoss; // the engine's step counter, backward's loss argument
    std::vector<Scope> m_stack;
    std::optional<Fetching> m_fetching;
    // By module id (dense from 0): found without hashing or a reference count per scope.
    std::vector<std::unique_ptr<const OwnSet>> m_own;
    std::vector<std::unique_ptr<const OwnSet>> m_retiredOwn; // forgotten while fetching
    struct Published
    {
        std::uint64_t bytes = 0; // what a gather moves
        py::object param;
        std::vector<ModuleId> activeSent; // the active sub-modules last sent
        bool dirty = false;
        bool hpz = false;
        const void *secondary = nullptr; // the ds_secondary_tensor counted (identity only)
        std::uint64_t gatherSeq = 0;     // the all-gather collective in flight for it, or 0
        std::uint32_t gatherGroup = 0;
    };
    // The all-gather batch being made (NOT_AVAILABLE -> INFLIGHT since the last issue), begun
    // at the issue (gatherCall); its parameters' records (stable: node-based map).
    struct PendingGather
    {
        std::uint32_t params = 0;
        std::uint64_t bytes = 0;
        ModuleId cause = kNoModule;
        FetchReason reason = FetchReason::Prefetch;
    };
    struct OpenGather
    {
        std::uint32_t group;
        std::uint64_t seq;
    };
    void clearPendingGather()
    {
        m_pending = PendingGather{};
        m_pendingParams.clear();
    }
    void endGather(Published &p);               // its batch's collective_end, once
    std::uint32_t groupNumber(PyObject *group); // the observer's group_number, kept per object
    PendingGather m_pending;
    std::vector<Published *> m_pendingParams; // reused: no allocation once warm
    std::vector<OpenGather> m_openGathers;    // begun, not ended (a few: prefetches)
    std::vector<std::pair<py::object, std::uint32_t>> m_groupNumbers;
    py::str m_kGroup{"group"};
    // Counts what ds_secondary_tensor the parameter holds now (AgentState::setSecondary):
    // true when it holds one it did not hold before.
    bool checkSecondary(std::uint32_t dsId, Published &p);
    void recheckSecondaries(); // at a step's end: the ones dropped since are no longer held
    std::vector<std::uint32_t> m_secondaries; // ds_ids holding a counted secondary partition
    std::unordered_map<std::uint32_t, Published> m_published; // by ds_id
    std::unordered_map<std::int64_t, ModuleId> m_dsModules;   // DeepSpeed's module.id -> ours
    std::vector<std::uint32_t> m_dirty;
    std::vector<std::pair<ParamId, std::vector<ModuleId>>> m_changes; // flushActive's, reused
    py::str m_kActive;                                                // ds_active_sub_modules
    py::str m_kSecondary;                                             // ds_secondary_tensor
};

class FsdpPath;
// The hook type's FSDP kind (shardscope.fsdp): a native callable that binds as a method, as
// HotPath's hooks do, and calls path->call(method, original, ...).
py::object fsdpHook(std::shared_ptr<FsdpPath> path, std::uint8_t method, py::object original);

// Registers HotPath and its descriptor (StatusDescriptor) in the module; stateOf gives the
// AgentState of the module's Agent object.
void bindHotPath(py::module_ &m, agent::AgentState &(*stateOf)(py::handle agent));

} // namespace shardscope::agent

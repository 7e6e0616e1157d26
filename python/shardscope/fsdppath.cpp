#include "fsdppath.h"

#include <stdexcept>
#include <string>

#include "hotpath.h"

namespace shardscope::agent {

FsdpPath::FsdpPath(AgentState &state, py::object agent, py::object observer, py::object preBackward)
    : m_state(state), m_agent(std::move(agent)), m_observer(observer),
      m_preBackward(std::move(preBackward))
{
}

py::object FsdpPath::hook(const std::string &name, py::object original)
{
    for (std::size_t i = 0; i < std::size(kMethodNames); ++i)
        if (kMethodNames[i] == name)
            return fsdpHook(shared_from_this(), static_cast<std::uint8_t>(i), std::move(original));
    return py::none();
}

py::object FsdpPath::observer() const
{
    py::object o = m_observer();
    if (o.is_none()) throw std::runtime_error("the shardscope.fsdp agent was closed");
    return o;
}

FsdpPath::Group &FsdpPath::at(std::size_t group)
{
    if (group >= m_groups.size()) throw py::index_error("no FSDP group " + std::to_string(group));
    return m_groups[group];
}

const FsdpPath::Group &FsdpPath::at(std::size_t group) const
{
    if (group >= m_groups.size()) throw py::index_error("no FSDP group " + std::to_string(group));
    return m_groups[group];
}

std::size_t FsdpPath::addGroup(py::handle group,
                               std::vector<std::pair<ParamId, std::uint64_t>> params, ModuleId unit,
                               int status)
{
    if (status < kSharded || status > kUnsharded)
        throw py::value_error("status must be 0 (sharded), 1 (gathering) or 2 (unsharded)");
    auto [it, added] = m_index.try_emplace(group.ptr(), m_groups.size());
    if (added) m_groups.emplace_back();
    Group &g = m_groups[it->second];
    g.object = group.ptr();
    g.params = std::move(params);
    g.unit = unit;
    g.status = status;
    g.bytes = 0;
    for (const auto &[id, bytes] : g.params)
        g.bytes += bytes;
    return it->second;
}

bool FsdpPath::anyInBackward() const
{
    for (const Group &g : m_groups)
        if (g.inBackward) return true;
    return false;
}

FsdpPath::Group *FsdpPath::groupOf(PyObject *g)
{
    auto it = m_index.find(g);
    if (it != m_index.end()) return &m_groups[it->second];
    if (!attached) return nullptr;
    // A group the agent has not met (sharded after attach): published now, in Python.
    observer().attr("_group")(py::handle(g));
    it = m_index.find(g);
    return it != m_index.end() ? &m_groups[it->second] : nullptr;
}

void FsdpPath::changeStatus(Group &g, int to, ModuleId cause, FetchReason reason)
{
    const auto from = static_cast<ParamStatus>(g.status);
    for (const auto &[id, bytes] : g.params)
        m_state.statusChanged(id, from, static_cast<ParamStatus>(to), cause, bytes, reason);
    g.status = to;
}

void FsdpPath::closeScope(ModuleId m)
{
    for (auto i = m_scopes.size(); i-- > 0;)
        if (m_scopes[i] == m) {
            m_scopes.erase(m_scopes.begin() + static_cast<std::ptrdiff_t>(i));
            return;
        }
}

ModuleId FsdpPath::moduleOf(PyObject *module, ModuleId otherwise) const
{
    if (!module || module == Py_None) return otherwise;
    auto it = m_modules.find(module);
    return it != m_modules.end() ? it->second : otherwise;
}

bool FsdpPath::truth(PyObject *object, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(object, name);
    if (!v) throw py::error_already_set();
    const int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (t < 0) throw py::error_already_set();
    return t != 0;
}

bool FsdpPath::isNone(PyObject *object, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(object, name);
    if (!v) throw py::error_already_set();
    const bool none = v == Py_None;
    Py_DECREF(v);
    return none;
}

namespace {

// The argument FSDP passes as `name`: positional at index, or by keyword; nullptr: absent.
PyObject *argument(PyObject *const *args, std::size_t nargsf, PyObject *kwnames, Py_ssize_t index,
                   PyObject *name)
{
    const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (index < n) return args[index];
    if (kwnames)
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); ++i)
            if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, i), name) == 0) return args[n + i];
    return nullptr;
}

} // namespace

PyObject *FsdpPath::call(Method m, PyObject *original, PyObject *const *args, std::size_t nargsf,
                         PyObject *kwnames)
{
    if (m == Method::PrefetchUnshard) return prefetchUnshard(original, args, nargsf, kwnames);
    if (m == Method::ForeachReduce) return foreachReduce(original, args, nargsf, kwnames);
    if (m == Method::ForeachAllGather) return foreachAllGather(original, args, nargsf, kwnames);
    if (closed || PyVectorcall_NARGS(nargsf) < 1) // unbound without self: the original's error
        return PyObject_Vectorcall(original, args, nargsf, kwnames);
    Group *g = groupOf(args[0]);
    if (!g) return PyObject_Vectorcall(original, args, nargsf, kwnames);
    switch (m) {
    case Method::Unshard:
        return unshard(*g, original, args, nargsf, kwnames);
    case Method::ToUnsharded:
        return toUnsharded(g, original, args, nargsf, kwnames);
    case Method::ToSharded:
    case Method::ToShardedPostForward:
        return toSharded(g, original, args, nargsf, kwnames);
    case Method::PreForward:
        return preForward(*g, original, args, nargsf, kwnames);
    case Method::PostForward:
        return postForward(*g, original, args, nargsf, kwnames);
    case Method::PreBackward:
        return preBackward(*g, original, args, nargsf, kwnames);
    case Method::PostBackward:
        return postBackward(*g, original, args, nargsf, kwnames);
    case Method::PrefetchUnshard:
    case Method::ForeachReduce:
    case Method::ForeachAllGather:
        break;
    }
    return PyObject_Vectorcall(original, args, nargsf, kwnames);
}

// An all-gather issued for the group: GATHERING, with the cause of the method running now
// (an explicit unshard() outside them: gathered_parameters). unshard() again while one is in
// flight, or on an unsharded group, changes nothing.
PyObject *FsdpPath::unshard(Group &g, PyObject *original, PyObject *const *args, std::size_t nargsf,
                            PyObject *kwnames)
{
    PyObject *self = args[0];
    const bool pending = !isNone(self, m_kAllGatherResult.ptr());
    const bool was = truth(self, m_kIsUnsharded.ptr());
    ++inside;
    PyObject *const previous = m_unsharding;
    m_unsharding = self; // foreachAllGather: the group whose all-gather is issued
    PyObject *r = PyObject_Vectorcall(original, args, nargsf, kwnames);
    m_unsharding = previous;
    --inside;
    if (!r) return nullptr;
    return finally(r, [&] {
        if (!pending && !was && g.status == kSharded && !isNone(self, m_kAllGatherResult.ptr())) {
            const Cause c = m_causes.empty() ? Cause{FetchReason::GatheredParameters, kNoModule}
                                             : m_causes.back();
            g.reason = c.reason;
            g.cause = c.module;
            changeStatus(g, kGathering, g.cause, g.reason);
        }
    });
}

// The group's unsharded parameters are registered: UNSHARDED (from SHARDED: an all-gather
// that was waited for at once, both of its events).
PyObject *FsdpPath::toUnsharded(Group *g, PyObject *original, PyObject *const *args,
                                std::size_t nargsf, PyObject *kwnames)
{
    const bool was = truth(args[0], m_kIsUnsharded.ptr());
    PyObject *r = PyObject_Vectorcall(original, args, nargsf, kwnames);
    if (!r || was) return r;
    return finally(r, [&] {
        endGather(*g); // waited for (wait_for_unshard) or synchronous: it has completed
        if (g->status == kUnsharded) return;
        if (g->status == kSharded) {
            const Cause c = m_causes.empty() ? Cause{FetchReason::GatheredParameters, kNoModule}
                                             : m_causes.back();
            g->reason = c.reason;
            g->cause = c.module;
        }
        changeStatus(*g, kUnsharded, g->cause, g->reason);
    });
}

// The sharded DTensors are registered again: SHARDED, released by the method running now.
PyObject *FsdpPath::toSharded(Group *g, PyObject *original, PyObject *const *args,
                              std::size_t nargsf, PyObject *kwnames)
{
    PyObject *r = PyObject_Vectorcall(original, args, nargsf, kwnames);
    if (!r) return nullptr;
    return finally(r, [&] {
        if (g->status != kSharded)
            changeStatus(*g, kSharded, m_causes.empty() ? kNoModule : m_causes.back().module,
                         FetchReason::Forward);
    });
}

// original(...) as FSDP's own code (its reads of the shards are not the user's), with what it
// unshards caused by c.
PyObject *FsdpPath::callInside(Cause c, PyObject *original, PyObject *const *args,
                               std::size_t nargsf, PyObject *kwnames)
{
    m_causes.push_back(c);
    ++inside;
    PyObject *r = PyObject_Vectorcall(original, args, nargsf, kwnames);
    --inside;
    m_causes.pop_back();
    return r;
}

// pre_forward(self, module, args, kwargs): the module's forward scope opens; what it
// unshards is for its forward.
PyObject *FsdpPath::preForward(Group &g, PyObject *original, PyObject *const *args,
                               std::size_t nargsf, PyObject *kwnames)
{
    const ModuleId mid = moduleOf(argument(args, nargsf, kwnames, 1, m_kModule.ptr()), g.unit);
    m_state.moduleEnter(mid, Phase::Forward);
    m_scopes.push_back(mid);
    return callInside({FetchReason::Forward, mid}, original, args, nargsf, kwnames);
}

// post_forward(self, module, input, output): the scope closes, even when FSDP raises.
PyObject *FsdpPath::postForward(Group &g, PyObject *original, PyObject *const *args,
                                std::size_t nargsf, PyObject *kwnames)
{
    const ModuleId mid = moduleOf(argument(args, nargsf, kwnames, 1, m_kModule.ptr()), g.unit);
    PyObject *r = callInside({FetchReason::Forward, mid}, original, args, nargsf, kwnames);
    return finally(r, [&] {
        closeScope(mid);
        m_state.moduleExit(mid, Phase::Forward);
    });
}

// The group's backward scope opens at its first pre_backward of the pass (FSDP calls it once
// per forward output that needs a gradient; again while PRE_BACKWARD: nothing new).
PyObject *FsdpPath::preBackward(Group &g, PyObject *original, PyObject *const *args,
                                std::size_t nargsf, PyObject *kwnames)
{
    if (g.inBackward) return PyObject_Vectorcall(original, args, nargsf, kwnames);
    PyObject *state = PyObject_GetAttr(args[0], m_kTrainingState.ptr());
    if (!state) return nullptr;
    const int same = PyObject_RichCompareBool(state, m_preBackward.ptr(), Py_EQ);
    Py_DECREF(state);
    if (same < 0) return nullptr;
    if (same) return PyObject_Vectorcall(original, args, nargsf, kwnames);
    g.inBackward = true;
    // No mode is left or entered here: autograd runs the pass on a copy of the thread's
    // function-mode stack (shardscope.fsdp's _keep_loss takes the read watching off around it).
    m_state.moduleEnter(g.unit, Phase::Backward);
    m_scopes.push_back(g.unit);
    return callInside({FetchReason::Backward, g.unit}, original, args, nargsf, kwnames);
}

// post_backward: the group's gradients are reduce-scattered (foreachReduce: the group whose
// post_backward runs); its backward scope closes, even when FSDP raises.
PyObject *FsdpPath::postBackward(Group &g, PyObject *original, PyObject *const *args,
                                 std::size_t nargsf, PyObject *kwnames)
{
    if (pendingReduces) observer().attr("poll_reduces")(); // earlier groups' CUDA reduce-scatters
    PyObject *const previous = m_reducing;
    m_reducing = args[0];
    PyObject *r = callInside({FetchReason::Backward, g.unit}, original, args, nargsf, kwnames);
    m_reducing = previous;
    return finally(r, [&] {
        if (g.inBackward) {
            g.inBackward = false;
            closeScope(g.unit);
            m_state.moduleExit(g.unit, Phase::Backward);
        }
    });
}

// _prefetch_unshard(target, pass_type): the unshards issued in it are prefetches, caused by
// the unit whose method runs (FSDPState's hooks prefetch after the group's pre-forward or
// pre-backward returned: then the unit whose scope is open).
PyObject *FsdpPath::prefetchUnshard(PyObject *original, PyObject *const *args, std::size_t nargsf,
                                    PyObject *kwnames)
{
    const ModuleId cause = !m_causes.empty()   ? m_causes.back().module
                           : !m_scopes.empty() ? m_scopes.back()
                                               : kNoModule;
    m_causes.push_back({FetchReason::Prefetch, cause});
    PyObject *r = PyObject_Vectorcall(original, args, nargsf, kwnames);
    m_causes.pop_back();
    return r;
}

// foreach_reduce(fsdp_params, unsharded_grads, reduce_scatter_group, ..., reduce_dtype (7th),
// ...): the group's gradient reduce-scatter (the group whose post_backward runs).
// reduce_scatter_begin when FSDP issues it, with what it moves (every gradient's dim 0 padded
// to the shard world, in the reduce dtype), reduce_scatter_end once it has completed: on
// return on the CPU, else when its CUDA event is next seen complete (Python's poll_reduces:
// the next group's post_backward, the end of backward, the optimizer step; finish() waits).
PyObject *FsdpPath::foreachReduce(PyObject *original, PyObject *const *args, std::size_t nargsf,
                                  PyObject *kwnames)
{
    const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    auto found = m_reducing ? m_index.find(m_reducing) : m_index.end();
    if (closed || nargs < 3 || found == m_index.end())
        return PyObject_Vectorcall(original, args, nargsf, kwnames);
    Group &g = m_groups[found->second];
    PyObject *params = args[0], *grads = args[1], *pg = args[2];
    const Py_ssize_t n = PyObject_Length(grads); // foreach_reduce empties the list
    if (n <= 0 || !PyList_Check(params)) {
        PyErr_Clear();
        return PyObject_Vectorcall(original, args, nargsf, kwnames);
    }
    PyObject *dtype = argument(args, nargsf, kwnames, 6, m_kReduceDtype.ptr());
    if (!dtype) dtype = Py_None;
    // The key: the parameters, the process group and the reduce dtype as FSDP passed them.
    const Py_ssize_t np = PyList_GET_SIZE(params);
    bool same = g.reduceKey.size() == static_cast<std::size_t>(np) + 2 && g.reduceKey[0] == pg &&
                g.reduceKey[1] == dtype;
    for (Py_ssize_t i = 0; same && i < np; ++i)
        same = g.reduceKey[static_cast<std::size_t>(i) + 2] == PyList_GET_ITEM(params, i);
    if (!same) {
        py::tuple size =
            observer().attr("_reduce_size")(py::handle(grads), py::handle(pg), py::handle(dtype));
        g.reduceSize = size[0].cast<std::uint64_t>();
        g.reduceOnCpu = size[1].cast<bool>();
        g.reduceKey.assign({pg, dtype});
        for (Py_ssize_t i = 0; i < np; ++i)
            g.reduceKey.push_back(PyList_GET_ITEM(params, i));
    }
    const std::uint64_t bytes = g.reduceSize;
    const auto count = static_cast<std::uint32_t>(n);
    const std::uint32_t number = groupNumber(pg);
    m_state.reduceScatterBegin(g.unit, kNoParam, bytes, count);
    const std::uint64_t seq = m_state.collectiveBegin(CollectiveKind::ReduceScatter, number, g.unit,
                                                      FetchReason::Backward, bytes, count);
    PyObject *r = PyObject_Vectorcall(original, args, nargsf, kwnames);
    if (!r) {
        m_state.collectiveEnd(number, seq); // FSDP's error, unchanged: nothing waits for it
        return nullptr;
    }
    ++g.reduceScatters;
    g.reduceBytes += bytes;
    return finally(r, [&] {
        PyObject *event =
            PyTuple_Check(r) && PyTuple_GET_SIZE(r) > 1 ? PyTuple_GET_ITEM(r, 1) : Py_None;
        if (event == Py_None || g.reduceOnCpu) {
            m_state.reduceScatterEnd(g.unit, kNoParam, bytes, count);
            m_state.collectiveEnd(number, seq);
        } else {
            observer().attr("_pending_reduce")(py::handle(event), g.unit, bytes, count, number,
                                               seq);
        }
    });
}

std::uint32_t FsdpPath::groupNumber(PyObject *pg)
{
    for (const auto &[object, number] : m_groupNumbers)
        if (object.ptr() == pg) return number;
    const auto number = observer().attr("group_number")(py::handle(pg)).cast<std::uint32_t>();
    m_groupNumbers.emplace_back(py::reinterpret_borrow<py::object>(pg), number);
    return number;
}

void FsdpPath::endGather(Group &g)
{
    if (g.gatherSeq == 0) return;
    const std::uint64_t seq = g.gatherSeq;
    g.gatherSeq = 0;
    m_state.collectiveEnd(g.gatherGroup, seq);
}

// foreach_all_gather(fsdp_params, group, async_op, ...): unshard() issues the group's
// all-gather (only when one is needed: not on a world of one, not an unsharded group): its
// collective_begin just before, with the unit, the cause of the method running now
// (pre_forward: forward, pre_backward: backward, _prefetch_unshard: prefetch, an explicit
// unshard(): gathered_parameters), the group's bytes and parameters; the end when the group
// is unsharded (_to_unsharded, after wait_for_unshard), or at once when FSDP raised.
PyObject *FsdpPath::foreachAllGather(PyObject *original, PyObject *const *args, std::size_t nargsf,
                                     PyObject *kwnames)
{
    auto found = m_unsharding ? m_index.find(m_unsharding) : m_index.end();
    if (closed || PyVectorcall_NARGS(nargsf) < 2 || found == m_index.end())
        return PyObject_Vectorcall(original, args, nargsf, kwnames);
    Group &g = m_groups[found->second];
    const Cause c =
        m_causes.empty() ? Cause{FetchReason::GatheredParameters, kNoModule} : m_causes.back();
    endGather(g); // a previous one never seen unsharded: not waited for any more
    g.gatherGroup = groupNumber(args[1]);
    g.gatherSeq =
        m_state.collectiveBegin(CollectiveKind::AllGather, g.gatherGroup, g.unit, c.reason, g.bytes,
                                static_cast<std::uint32_t>(g.params.size()));
    PyObject *r = PyObject_Vectorcall(original, args, nargsf, kwnames);
    if (!r) endGather(g); // FSDP's error, unchanged
    return r;
}

void bindFsdpPath(py::module_ &m, AgentState &(*stateOf)(py::handle agent))
{
    py::class_<FsdpPath, std::shared_ptr<FsdpPath>>(m, "FsdpPath")
        .def(py::init([stateOf](py::object agent, py::object observer, py::object preBackward) {
                 AgentState &state = stateOf(agent);
                 return std::make_shared<FsdpPath>(state, std::move(agent), std::move(observer),
                                                   std::move(preBackward));
             }),
             py::arg("agent"), py::arg("observer"), py::arg("pre_backward"))
        .def("hook", &FsdpPath::hook, py::arg("name"), py::arg("original"),
             "The native replacement of FSDPParamGroup.<name> calling original, or None when "
             "the method is not one observed natively")
        .def("add_group", &FsdpPath::addGroup, py::arg("group"), py::arg("params"), py::arg("unit"),
             py::arg("status"))
        .def("status", &FsdpPath::status)
        .def("set_status", &FsdpPath::setStatus)
        .def("any_in_backward", &FsdpPath::anyInBackward)
        .def("set_module", &FsdpPath::setModule)
        .def("clear_scopes", &FsdpPath::clearScopes)
        .def("reduce_counts", &FsdpPath::reduceCounts)
        .def_readwrite("inside", &FsdpPath::inside)
        .def_readwrite("closed", &FsdpPath::closed)
        .def_readwrite("attached", &FsdpPath::attached)
        .def_readwrite("pending_reduces", &FsdpPath::pendingReduces);
}

} // namespace shardscope::agent

#include "hotpath.h"
#include "fsdppath.h"

#include <structmember.h>

#include <algorithm>
#include <limits>
#include <new>
#include <string>

namespace shardscope::agent {

namespace {

// obj's instance dictionary, borrowed (obj holds it); made empty when obj has none yet (as
// `obj.__dict__` does); nullptr, no error set, when obj's type has no instance dictionaries.
// Public API only (PyObject_GenericGetDict, not the private _PyObject_GetDictPtr): the
// reference it returns is given back at once, since obj keeps its dictionary. ds_status is
// read ~3,000 times a step through this (bench/bench_agent_crossings.py times the read).
inline PyObject *instanceDict(PyObject *obj)
{
    if (Py_TYPE(obj)->tp_dictoffset == 0) return nullptr;
    PyObject *d = PyObject_GenericGetDict(obj, nullptr);
    if (!d) {
        PyErr_Clear();
        return nullptr;
    }
    Py_DECREF(d);
    return d;
}

// The same as a reference, or nullptr with the error set.
py::object ownDict(PyObject *obj)
{
    PyObject *d = PyObject_GenericGetDict(obj, nullptr);
    if (!d) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(d);
}

FetchReason reasonOf(Phase phase)
{
    return phase == Phase::Backward ? FetchReason::Backward : FetchReason::Forward;
}

// ds_status as a data descriptor on the parameters' own class (torch.nn.Parameter), so that
// their type stays exact: torch takes its fast path for an exact Parameter, while every op on
// an instance of a subclass looks up __torch_function__ (that cost the step 3 %). A raw
// CPython type rather than a pybind11 class: assignments reach HotPath::statusSet without
// pybind11's dispatch, reads are one instance-dictionary lookup, and a parameter without a
// ds_status (one DeepSpeed never converted) has no such attribute, as before.
struct StatusDescriptor
{
    PyObject_HEAD std::shared_ptr<HotPath> hot;
};

PyObject *missingStatus(PyObject *obj)
{
    PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute 'ds_status'",
                 Py_TYPE(obj)->tp_name);
    return nullptr;
}

PyObject *statusDescrGet(PyObject *self, PyObject *obj, PyObject *)
{
    if (obj == nullptr || obj == Py_None) return Py_NewRef(self);
    auto *d = reinterpret_cast<StatusDescriptor *>(self);
    PyObject *dict = instanceDict(obj);
    if (!dict) return missingStatus(obj);
    PyObject *value = PyDict_GetItemWithError(dict, d->hot->statusKey());
    if (value) return Py_NewRef(value);
    if (PyErr_Occurred()) return nullptr;
    return missingStatus(obj);
}

int statusDescrSet(PyObject *self, PyObject *obj, PyObject *value)
{
    auto *d = reinterpret_cast<StatusDescriptor *>(self);
    if (value == nullptr) { // del param.ds_status
        PyObject *dict = PyObject_GenericGetDict(obj, nullptr);
        if (!dict) return -1;
        const int r = PyDict_DelItem(dict, d->hot->statusKey());
        Py_DECREF(dict);
        if (r != 0 && PyErr_ExceptionMatches(PyExc_KeyError)) {
            PyErr_Clear();
            missingStatus(obj);
        }
        return r;
    }
    try {
        d->hot->statusSet(obj, value);
        return 0;
    } catch (py::error_already_set &e) {
        e.restore();
    } catch (const std::exception &e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    return -1;
}

void statusDescrDealloc(PyObject *self)
{
    auto *d = reinterpret_cast<StatusDescriptor *>(self);
    PyTypeObject *type = Py_TYPE(self);
    d->hot.~shared_ptr();
    type->tp_free(self);
    Py_DECREF(type);
}

// A DeepSpeed function replaced (a module scope function, DeepSpeedEngine.forward/backward/
// step, ZeROOrderedDict.__getitem__): a raw vectorcall callable that binds as a method
// (DeepSpeed calls self.f(...)), keeps HotPath's bookkeeping and calls the original with the
// same arguments, without pybind11's dispatch or an argument tuple. What it observes is the
// vectorcall it is made with (hookCall<observeScope>, ...); the fields that kind does not use
// stay empty.
struct Hook
{
    PyObject_HEAD vectorcallfunc vectorcall;
    std::shared_ptr<HotPath> hot; // constructed in makeHook; tp_alloc zeroed the rest
    PyObject *original;
    PyObject *slow;                 // getitem: the Python slow path
    Phase phase;                    // scopes
    bool begin;                     // scopes: pre (true) or post
    HotPath::EngineCall call;       // engine
    std::shared_ptr<FsdpPath> fsdp; // shardscope.fsdp's group methods
    FsdpPath::Method method;
};

using Observe = PyObject *(*)(Hook &h, PyObject *const *args, size_t nargsf, PyObject *kwnames);

// The hook's call: C++ exceptions become Python ones, DeepSpeed's pass unchanged.
template <Observe observe>
PyObject *hookCall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    try {
        return observe(*reinterpret_cast<Hook *>(self), args, nargsf, kwnames);
    } catch (py::error_already_set &e) {
        e.restore();
    } catch (const std::exception &e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    return nullptr;
}

// {pre,post}_sub_module_{forward,backward}_function(self, module)
PyObject *observeScope(Hook &h, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != nullptr) // not DeepSpeed's call
        return PyObject_Vectorcall(h.original, args, nargsf, kwnames);
    return h.begin ? h.hot->scopeBegin(h.original, args, nargsf, h.phase)
                   : h.hot->scopeEnd(h.original, args, nargsf, h.phase);
}

// DeepSpeedEngine.forward/backward/step(self, ...): every argument, keywords included
PyObject *observeEngine(Hook &h, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) < 1) // unbound and without self: the original's own error
        return PyObject_Vectorcall(h.original, args, nargsf, kwnames);
    return h.hot->engineCall(h.original, args, nargsf, kwnames, h.call);
}

// ZeROOrderedDict.__getitem__(self, key): the common read (an AVAILABLE parameter, or not a
// converted one) costs one dictionary lookup more than DeepSpeed's own, no Python frame.
PyObject *observeGetitem(Hook &h, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != nullptr)
        return PyObject_Vectorcall(h.original, args, nargsf, kwnames);
    return h.hot->getitemCall(h.original, h.slow, args, nargsf);
}

// partition_parameters._dist_allgather_fn(input, output, group): a plain function (looked up
// as a module global, never bound).
PyObject *observeGather(Hook &h, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return h.hot->gatherCall(h.original, args, nargsf, kwnames);
}

// An FSDPParamGroup method (shardscope.fsdp): FsdpPath decides what the arguments are.
PyObject *observeFsdp(Hook &h, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return h.fsdp->call(h.method, h.original, args, nargsf, kwnames);
}

PyObject *hookGet(PyObject *self, PyObject *obj, PyObject *)
{
    if (obj == nullptr || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

void hookDealloc(PyObject *self)
{
    auto *h = reinterpret_cast<Hook *>(self);
    PyTypeObject *type = Py_TYPE(self);
    Py_XDECREF(h->original);
    Py_XDECREF(h->slow);
    h->hot.~shared_ptr();
    h->fsdp.~shared_ptr();
    type->tp_free(self);
    Py_DECREF(type);
}

PyTypeObject *g_statusDescriptorType = nullptr;
PyTypeObject *g_hookType = nullptr;

PyTypeObject *makeType(const char *name, int basicSize, unsigned flags, PyType_Slot *slots)
{
    PyType_Spec spec{name, basicSize, 0, flags, slots};
    PyObject *type = PyType_FromSpec(&spec);
    if (!type) throw py::error_already_set();
    return reinterpret_cast<PyTypeObject *>(type);
}

void makeTypes()
{
    static PyType_Slot descriptorSlots[] = {
        {Py_tp_descr_get, reinterpret_cast<void *>(statusDescrGet)},
        {Py_tp_descr_set, reinterpret_cast<void *>(statusDescrSet)},
        {Py_tp_dealloc, reinterpret_cast<void *>(statusDescrDealloc)},
        {Py_tp_doc, const_cast<char *>("ds_status of DeepSpeed's parameters, observed")},
        {0, nullptr}};
    static PyMemberDef hookMembers[] = {{const_cast<char *>("__vectorcalloffset__"), T_PYSSIZET,
                                         static_cast<Py_ssize_t>(offsetof(Hook, vectorcall)),
                                         READONLY, nullptr},
                                        {nullptr, 0, 0, 0, nullptr}};
    static PyType_Slot hookSlots[] = {
        {Py_tp_call, reinterpret_cast<void *>(PyVectorcall_Call)},
        {Py_tp_descr_get, reinterpret_cast<void *>(hookGet)},
        {Py_tp_dealloc, reinterpret_cast<void *>(hookDealloc)},
        {Py_tp_members, hookMembers},
        {Py_tp_doc, const_cast<char *>("a DeepSpeed or FSDP function, observed")},
        {0, nullptr}};
    g_statusDescriptorType =
        makeType("shardscope._native.StatusDescriptor", sizeof(StatusDescriptor),
                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, descriptorSlots);
    g_hookType = makeType("shardscope._native.Hook", sizeof(Hook),
                          Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION |
                              Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
                          hookSlots);
}

// A new Hook observing with `observe`, holding hot and (a reference to) original.
Hook *makeHook(std::shared_ptr<HotPath> hot, vectorcallfunc observe, py::object original)
{
    PyObject *o = g_hookType->tp_alloc(g_hookType, 0);
    if (!o) throw py::error_already_set();
    auto *h = reinterpret_cast<Hook *>(o);
    new (&h->hot) std::shared_ptr<HotPath>(std::move(hot));
    new (&h->fsdp) std::shared_ptr<FsdpPath>();
    h->vectorcall = observe;
    h->original = original.release().ptr();
    return h;
}

} // namespace

namespace {

py::str nameOf(const py::dict &names, const char *key)
{
    if (!names.contains(key))
        throw py::value_error(std::string("HotPath: names lacks '") + key + "'");
    return py::str(names[key]);
}

} // namespace

HotPath::HotPath(agent::AgentState &state, py::object agent, py::object observer,
                 py::object notAvailable, py::object inflight, py::object available,
                 const py::dict &names)
    : m_state(state), m_agent(std::move(agent)),
      m_observer(observer), m_statusRefs{std::move(notAvailable), std::move(inflight),
                                         std::move(available)},
      m_kStatus(nameOf(names, "status")), m_kId(nameOf(names, "id")),
      m_kGlobalSteps(nameOf(names, "global_steps")), m_kLoss(nameOf(names, "loss")),
      m_kActive(nameOf(names, "active")), m_kSecondary(nameOf(names, "secondary"))
{
    for (int i = 0; i < 3; ++i)
        m_status[i] = m_statusRefs[i].ptr();
}

py::object HotPath::observer() const
{
    py::object o = m_observer();
    if (o.is_none()) throw std::runtime_error("the shardscope.deepspeed agent was closed");
    return o;
}

int HotPath::statusCode(PyObject *s) const
{
    for (int i = 0; i < 3; ++i)
        if (s == m_status[i]) return i;
    return -1;
}

ModuleId HotPath::moduleId(py::handle module)
{
    py::object d = ownDict(module.ptr());
    if (PyObject *id = PyDict_GetItemWithError(d.ptr(), m_kModuleId.ptr()))
        return static_cast<ModuleId>(PyLong_AsUnsignedLong(id));
    if (PyErr_Occurred()) throw py::error_already_set();
    return observer().attr("module_id")(module).cast<ModuleId>(); // names it: rare
}

const HotPath::OwnSet *HotPath::ownOf(ModuleId id, py::handle module)
{
    if (id < m_own.size() && m_own[id]) return m_own[id].get();
    auto own = std::make_unique<OwnSet>();
    for (py::handle dsId : observer().attr("own_ds_ids")(module))
        own->insert(dsId.cast<std::uint32_t>());
    if (id >= m_own.size()) m_own.resize(static_cast<std::size_t>(id) + 1);
    m_own[id] = std::move(own);
    return m_own[id].get();
}

void HotPath::forgetOwn(ModuleId module)
{
    if (module >= m_own.size() || !m_own[module]) return;
    // A scope fetching now keeps the set it began with: kept until no scope fetches.
    if (m_fetching) m_retiredOwn.push_back(std::move(m_own[module]));
    m_own[module].reset();
}

void HotPath::endFetching()
{
    m_fetching.reset();
    m_retiredOwn.clear();
}

void HotPath::statusSet(py::handle param, py::handle value)
{
    py::object d = ownDict(param.ptr());
    PyObject *oldBorrowed = PyDict_GetItemWithError(d.ptr(), m_kStatus.ptr());
    if (!oldBorrowed && PyErr_Occurred()) throw py::error_already_set();
    py::object old = py::reinterpret_borrow<py::object>(oldBorrowed); // kept past the store
    if (PyDict_SetItem(d.ptr(), m_kStatus.ptr(), value.ptr()) != 0) throw py::error_already_set();
    if (!oldBorrowed || oldBorrowed == value.ptr() || oldBorrowed == Py_None) return;

    PyObject *idObj = PyDict_GetItemWithError(d.ptr(), m_kId.ptr());
    if (!idObj) {
        if (PyErr_Occurred()) throw py::error_already_set();
        return;
    }
    const auto dsId = static_cast<std::uint32_t>(PyLong_AsUnsignedLong(idObj));
    if (PyErr_Occurred()) throw py::error_already_set();
    const auto published = m_published.find(dsId);
    if (published == m_published.end()) return; // not in the state clients see
    const int from = statusCode(oldBorrowed);
    const int to = statusCode(value.ptr());
    if (from < 0 || to < 0) return;
    if (!published->second.dirty) {
        published->second.dirty = true;
        m_dirty.push_back(dsId);
    }
    // hpZ: DeepSpeed makes the secondary partition just before it writes NOT_AVAILABLE.
    if (to == 0 && published->second.hpz && checkSecondary(dsId, published->second))
        m_secondaries.push_back(dsId);

    ModuleId cause = kNoModule;
    FetchReason reason = FetchReason::Prefetch;
    if (to == 0) { // released, by the innermost scope if any
        if (!m_stack.empty()) cause = m_stack.back().id;
        reason = FetchReason::Forward; // not carried by a release
    } else if (m_fetching && gathered == 0 && autoDepth == 0) {
        cause = m_fetching->id;
        reason =
            m_fetching->own->contains(dsId) ? reasonOf(m_fetching->phase) : FetchReason::Prefetch;
    } else if (gathered > 0) {
        reason = FetchReason::GatheredParameters;
    } else if (autoDepth > 0) {
        if (!m_stack.empty()) cause = m_stack.back().id;
        reason = FetchReason::Guard;
    }
    m_state.statusChanged(dsId, static_cast<ParamStatus>(from), static_cast<ParamStatus>(to), cause,
                          published->second.bytes, reason);
    if (from == 0 && to == 1 && gathered == 0) { // joins the batch all_gather_coalesced issues
        if (m_pending.params == 0) {
            m_pending.cause = cause;
            m_pending.reason = reason;
        }
        ++m_pending.params;
        m_pending.bytes += published->second.bytes;
        m_pendingParams.push_back(&published->second);
    } else if (from == 1 && published->second.gatherSeq != 0) {
        endGather(published->second); // its handle was waited for
    }
    if (slow && to == 2) observer().attr("suspects_available")(param);
    if (slow && to == 0) observer().attr("suspects_released")(param); // pending attribute reads
}

void HotPath::endGather(Published &p)
{
    const std::uint32_t group = p.gatherGroup;
    const std::uint64_t seq = p.gatherSeq;
    p.gatherSeq = 0;
    for (std::size_t i = 0; i < m_openGathers.size(); ++i) {
        if (m_openGathers[i].group == group && m_openGathers[i].seq == seq) {
            m_openGathers.erase(m_openGathers.begin() + static_cast<std::ptrdiff_t>(i));
            m_state.collectiveEnd(group, seq);
            return;
        }
    }
}

std::uint32_t HotPath::groupNumber(PyObject *group)
{
    for (const auto &[object, number] : m_groupNumbers)
        if (object.ptr() == group) return number;
    const auto number = observer().attr("group_number")(py::handle(group)).cast<std::uint32_t>();
    m_groupNumbers.emplace_back(py::reinterpret_borrow<py::object>(group), number);
    return number;
}

PyObject *HotPath::gatherCall(PyObject *original, PyObject *const *args, std::size_t nargsf,
                              PyObject *kwnames)
{
    if (m_pending.params == 0) return PyObject_Vectorcall(original, args, nargsf, kwnames);
    // group: the third positional argument or the keyword (DeepSpeed passes it positionally)
    PyObject *group = Py_None;
    const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n > 2) {
        group = args[2];
    } else if (kwnames) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); ++i)
            if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, i), m_kGroup.ptr()) == 0)
                group = args[n + i];
    }
    const std::uint32_t number = groupNumber(group);
    const std::uint64_t seq =
        m_state.collectiveBegin(CollectiveKind::AllGather, number, m_pending.cause,
                                m_pending.reason, m_pending.bytes, m_pending.params);
    for (Published *p : m_pendingParams) {
        p->gatherSeq = seq;
        p->gatherGroup = number;
    }
    if (m_openGathers.size() >= 64) m_openGathers.erase(m_openGathers.begin()); // never waited for
    m_openGathers.push_back(OpenGather{number, seq});
    clearPendingGather();
    PyObject *r = PyObject_Vectorcall(original, args, nargsf, kwnames);
    if (!r) { // DeepSpeed's error, unchanged: nothing waits for this one any more
        std::erase_if(m_openGathers,
                      [&](const OpenGather &o) { return o.group == number && o.seq == seq; });
        m_state.collectiveEnd(number, seq);
    }
    return r;
}

void HotPath::enter(py::handle module, Phase phase)
{
    clearPendingGather();
    if (slow) observer().attr("suspects_close")();
    const ModuleId id = moduleId(module);
    const OwnSet *own = ownOf(id, module);
    m_stack.push_back(Scope{py::reinterpret_borrow<py::object>(module), id, phase});
    m_state.moduleEnter(id, phase);
    m_fetching = Fetching{id, phase, own};
}

void HotPath::exit(py::handle module, Phase phase)
{
    clearPendingGather();
    for (std::size_t i = m_stack.size(); i-- > 0;) {
        if (m_stack[i].module.ptr() == module.ptr()) {
            const ModuleId id = m_stack[i].id;
            m_stack.erase(m_stack.begin() + static_cast<std::ptrdiff_t>(i));
            m_state.moduleExit(id, phase);
            return;
        }
    }
    m_state.moduleExit(moduleId(module), phase); // a scope entered while paused
}

void HotPath::closeScopes()
{
    while (!m_stack.empty()) {
        const Scope s = std::move(m_stack.back());
        m_stack.pop_back();
        m_state.moduleExit(s.id, s.phase);
    }
    endFetching();
}

void HotPath::beginStep(std::uint32_t step)
{
    closeScopes();
    m_state.stepBegin(step);
}

void HotPath::endStep(double loss)
{
    flushActive();
    recheckSecondaries();
    m_state.stepEnd(loss);
    if (!afterStep.is_none()) {
        PyObject *r = PyObject_CallNoArgs(afterStep.ptr());
        if (r)
            Py_DECREF(r);
        else
            PyErr_WriteUnraisable(afterStep.ptr()); // said on stderr; the step goes on
    }
}

bool HotPath::onStack(py::handle module) const
{
    for (const Scope &s : m_stack)
        if (s.module.ptr() == module.ptr()) return true;
    return false;
}

py::object HotPath::top() const
{
    return m_stack.empty() ? py::none() : m_stack.back().module;
}

py::object HotPath::topEntry() const
{
    if (m_stack.empty()) return py::none();
    return py::make_tuple(m_stack.back().module, static_cast<int>(m_stack.back().phase));
}

void HotPath::publish(std::uint32_t dsId, std::uint64_t bytes, py::object param, bool hpz)
{
    Published &p = m_published[dsId];
    p.bytes = bytes;
    p.param = std::move(param);
    p.hpz = hpz;
    if (!p.dirty) {
        p.dirty = true;
        m_dirty.push_back(dsId);
    }
    // Looked at afresh (AgentState::setSecondary sets the figure, it does not add to it): the
    // first publish after initialize, whose first gather already made the secondary partitions,
    // or a republish, whose tensor may be another one by now.
    p.secondary = nullptr;
    if (hpz && checkSecondary(dsId, p) &&
        std::find(m_secondaries.begin(), m_secondaries.end(), dsId) == m_secondaries.end())
        m_secondaries.push_back(dsId);
}

bool HotPath::checkSecondary(std::uint32_t dsId, Published &p)
{
    PyObject *dict = instanceDict(p.param.ptr());
    PyObject *tensor = dict ? PyDict_GetItemWithError(dict, m_kSecondary.ptr()) : nullptr;
    if (!tensor && PyErr_Occurred()) throw py::error_already_set();
    if (tensor == Py_None) tensor = nullptr;
    if (tensor == p.secondary) return false; // DeepSpeed keeps it until the optimizer step
    const bool held = p.secondary != nullptr;
    std::uint64_t bytes = 0;
    if (tensor) { // its own size: a frozen parameter's may be quantized (ds_quant_scale)
        py::handle t(tensor);
        bytes = t.attr("numel")().cast<std::uint64_t>() *
                t.attr("element_size")().cast<std::uint64_t>();
    }
    p.secondary = tensor;
    m_state.setSecondary(dsId, bytes);
    return tensor && !held;
}

void HotPath::recheckSecondaries()
{
    std::erase_if(m_secondaries, [&](std::uint32_t dsId) {
        auto it = m_published.find(dsId);
        if (it == m_published.end() || !it->second.secondary) return true;
        checkSecondary(dsId, it->second);
        return it->second.secondary == nullptr;
    });
}

void HotPath::markDirty(std::uint32_t dsId)
{
    auto it = m_published.find(dsId);
    if (it == m_published.end() || it->second.dirty) return;
    it->second.dirty = true;
    m_dirty.push_back(dsId);
}

void HotPath::flushActive()
{
    if (m_dirty.empty()) return;
    m_changes.clear();
    std::vector<ModuleId> now;
    for (const std::uint32_t dsId : m_dirty) {
        auto it = m_published.find(dsId);
        if (it == m_published.end()) continue;
        Published &p = it->second;
        p.dirty = false;
        now.clear();
        py::object d =
            py::reinterpret_steal<py::object>(PyObject_GenericGetDict(p.param.ptr(), nullptr));
        if (!d) throw py::error_already_set();
        PyObject *active = PyDict_GetItemWithError(d.ptr(), m_kActive.ptr());
        if (!active && PyErr_Occurred()) throw py::error_already_set();
        if (active && active != Py_None) {
            py::object iter = py::reinterpret_steal<py::object>(PyObject_GetIter(active));
            if (!iter) throw py::error_already_set();
            while (PyObject *item = PyIter_Next(iter.ptr())) {
                const long long m = PyLong_AsLongLong(item);
                Py_DECREF(item);
                if (m == -1 && PyErr_Occurred()) throw py::error_already_set();
                if (auto ours = m_dsModules.find(m); ours != m_dsModules.end())
                    now.push_back(ours->second);
            }
            if (PyErr_Occurred()) throw py::error_already_set();
        }
        if (now != p.activeSent) {
            p.activeSent = now;
            m_changes.emplace_back(dsId, now);
        }
    }
    m_dirty.clear();
    if (!m_changes.empty()) m_state.setActive(std::move(m_changes));
    m_changes.clear();
}

PyObject *HotPath::scopeBegin(PyObject *original, PyObject *const *args, std::size_t nargsf,
                              Phase phase)
{
    enter(args[1], phase);
    PyObject *r = PyObject_Vectorcall(original, args, nargsf, nullptr);
    endFetching(); // the module's own fetches are issued (or it failed)
    return r;
}

PyObject *HotPath::scopeEnd(PyObject *original, PyObject *const *args, std::size_t nargsf,
                            Phase phase)
{
    PyObject *r = PyObject_Vectorcall(original, args, nargsf, nullptr);
    return finally(r, [&] { exit(args[1], phase); }); // DeepSpeed's exception unchanged
}

PyObject *HotPath::getitemCall(PyObject *original, PyObject *slow, PyObject *const *args,
                               std::size_t nargsf)
{
    // OrderedDict.__getitem__(self, key): ZeROOrderedDict is a dict underneath.
    PyObject *param = PyDict_Check(args[0]) ? PyDict_GetItemWithError(args[0], args[1]) : nullptr;
    if (!param && PyErr_Occurred()) return nullptr;
    if (param && param != Py_None) {
        PyObject *dict = instanceDict(param); // borrowed: the parameter keeps it alive
        if (!dict)                            // no __dict__ (yet): not a converted parameter
            return PyObject_Vectorcall(original, args, nargsf, nullptr);
        PyObject *status = PyDict_GetItemWithError(dict, m_kStatus.ptr()); // borrowed
        if (!status && PyErr_Occurred()) return nullptr;
        if (status == m_status[0]) { // NOT_AVAILABLE: a read DeepSpeed will register (rare)
            Py_INCREF(param);        // borrowed from the dict, which the slow path may change
            PyObject *slowArgs[] = {args[0], args[1], param};
            PyObject *r = PyObject_Vectorcall(slow, slowArgs, 3, nullptr);
            Py_DECREF(param);
            return r;
        }
    }
    return PyObject_Vectorcall(original, args, nargsf, nullptr);
}

void HotPath::setEngine(py::object engine)
{
    m_engine = std::move(engine);
    if (m_engine.is_none()) {
        m_engine = py::object();
        m_loss = py::object();
        inStep = false;
    }
}

long long HotPath::globalSteps(PyObject *engine)
{
    PyObject *steps = PyObject_GetAttr(engine, m_kGlobalSteps.ptr());
    if (!steps) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) throw py::error_already_set();
        PyErr_Clear();
        return -1;
    }
    const long long n = PyLong_AsLongLong(steps);
    Py_DECREF(steps);
    if (n == -1 && PyErr_Occurred()) throw py::error_already_set();
    return n;
}

void HotPath::setLoss(py::object loss)
{
    m_loss = std::move(loss);
}

double lossNumber(py::handle loss)
{
    if (!loss || loss.is_none()) return std::numeric_limits<double>::quiet_NaN();
    py::object value = py::reinterpret_borrow<py::object>(loss);
    if (py::hasattr(value, "detach")) { // a tensor: its value (float() of one that needs a
        try {                           // gradient warns)
            value = value.attr("detach")();
        } catch (py::error_already_set &) {
            return std::numeric_limits<double>::quiet_NaN();
        }
    }
    if (PyObject *f = PyNumber_Float(value.ptr())) { // a scalar tensor: its item()
        const double v = PyFloat_AS_DOUBLE(f);
        Py_DECREF(f);
        return v;
    }
    PyErr_Clear();
    try { // not a scalar: its mean
        return value.attr("float")().attr("mean")().cast<double>();
    } catch (py::error_already_set &) {
        return std::numeric_limits<double>::quiet_NaN();
    } catch (const py::cast_error &) {
        return std::numeric_limits<double>::quiet_NaN();
    }
}

double HotPath::lossValue()
{
    py::object loss = std::move(m_loss);
    m_loss = py::object();
    return lossNumber(loss);
}

PyObject *HotPath::engineCall(PyObject *original, PyObject *const *args, std::size_t nargsf,
                              PyObject *kwnames, EngineCall call)
{
    switch (call) {
    case EngineCall::Forward:
        return engineForward(original, args, nargsf, kwnames);
    case EngineCall::Backward:
        return engineBackward(original, args, nargsf, kwnames);
    case EngineCall::Step:
        return engineStep(original, args, nargsf, kwnames);
    }
    return PyObject_Vectorcall(original, args, nargsf, kwnames);
}

PyObject *HotPath::engineForward(PyObject *original, PyObject *const *args, std::size_t nargsf,
                                 PyObject *kwnames)
{
    PyObject *engine = args[0];
    if (!m_engine) // no engine attached yet: the observer attaches this one (once)
        observer().attr("on_engine_forward")(py::handle(engine));
    else if (inStep)
        closeScopes(); // a second forward within the step (gradient accumulation, eval)
    else {
        inStep = true;
        beginStep(static_cast<std::uint32_t>(globalSteps(engine) + 1));
    }
    return PyObject_Vectorcall(original, args, nargsf, kwnames);
}

PyObject *HotPath::engineBackward(PyObject *original, PyObject *const *args, std::size_t nargsf,
                                  PyObject *kwnames)
{
    // backward(self, loss, ...): the loss is the first argument after self, or loss=...
    const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n >= 2) {
        m_loss = py::reinterpret_borrow<py::object>(args[1]);
    } else if (kwnames) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); ++i)
            if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, i), m_kLoss.ptr()) == 0)
                m_loss = py::reinterpret_borrow<py::object>(args[n + i]);
    }
    PyObject *r = PyObject_Vectorcall(original, args, nargsf, kwnames);
    // DeepSpeed's post-backward hook never runs for a module whose inputs need no gradient
    // (the embedding): its backward scope ends with the backward pass.
    if (r) return finally(r, [&] { closeScopes(); });
    // It raised: the observer looks at what ZeRO-3 was left with (on_backward_raised), the
    // exception held aside and handed back to the script unchanged, whatever the look does.
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback && value) PyException_SetTraceback(value, traceback);
    try {
        closeScopes();
        py::object o = m_observer();
        if (!o.is_none() && value)
            o.attr("on_backward_raised")(py::handle(args[0]), py::handle(value));
    } catch (py::error_already_set &) {
    } catch (const std::exception &) {
    }
    PyErr_Restore(type, value, traceback);
    return nullptr;
}

PyObject *HotPath::engineStep(PyObject *original, PyObject *const *args, std::size_t nargsf,
                              PyObject *kwnames)
{
    PyObject *engine = args[0];
    const long long before = globalSteps(engine);
    PyObject *r = PyObject_Vectorcall(original, args, nargsf, kwnames);
    return finally(r, [&] {
        // A step that did not step (gradient accumulation's micro-steps) does not end one.
        if (globalSteps(engine) != before && inStep) {
            inStep = false;
            closeScopes(); // a plain loss.backward() (DeepSpeed >= 0.18.3) closed none
            endStep(lossValue());
        }
    });
}

py::object HotPath::statusDescriptor()
{
    PyObject *o = g_statusDescriptorType->tp_alloc(g_statusDescriptorType, 0);
    if (!o) throw py::error_already_set();
    new (&reinterpret_cast<StatusDescriptor *>(o)->hot)
        std::shared_ptr<HotPath>(shared_from_this());
    return py::reinterpret_steal<py::object>(o);
}

// A hook as a class attribute in DeepSpeed's place: an instancemethod (PyInstanceMethod_New),
// which binds like a function. The Hook alone binds too (hookGet), but torch.compile's dynamo
// resolves a class attribute it does not know statically, unbound: it then called
// post_sub_module_forward_function(module) without self (TypeError in every compiled forward).
// An instancemethod it looks up on the instance at run time, bound. It costs a bound method a
// call (LOAD_METHOD cannot skip it), ~1,000 a step.
static py::object asMethod(Hook *h)
{
    PyObject *hook = reinterpret_cast<PyObject *>(h);
    PyObject *method = PyInstanceMethod_New(hook);
    Py_DECREF(hook);
    if (!method) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(method);
}

py::object HotPath::scopeHook(py::object original, Phase phase, bool begin)
{
    Hook *h = makeHook(shared_from_this(), hookCall<observeScope>, std::move(original));
    h->phase = phase;
    h->begin = begin;
    return asMethod(h);
}

py::object HotPath::engineHook(py::object original, EngineCall call)
{
    Hook *h = makeHook(shared_from_this(), hookCall<observeEngine>, std::move(original));
    h->call = call;
    return asMethod(h);
}

py::object HotPath::getitemHook(py::object original, py::object slow)
{
    Hook *h = makeHook(shared_from_this(), hookCall<observeGetitem>, std::move(original));
    h->slow = slow.release().ptr();
    return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject *>(h));
}

py::object HotPath::gatherHook(py::object original)
{
    Hook *h = makeHook(shared_from_this(), hookCall<observeGather>, std::move(original));
    return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject *>(h));
}

py::object fsdpHook(std::shared_ptr<FsdpPath> path, std::uint8_t method, py::object original)
{
    Hook *h = makeHook(nullptr, hookCall<observeFsdp>, std::move(original));
    h->fsdp = std::move(path);
    h->method = static_cast<FsdpPath::Method>(method);
    return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject *>(h));
}

void bindHotPath(py::module_ &m, agent::AgentState &(*stateOf)(py::handle agent))
{
    makeTypes();
    auto phaseOf = [](int p) {
        if (p != 0 && p != 1) throw py::value_error("phase must be 0 (forward) or 1 (backward)");
        return static_cast<Phase>(p);
    };
    py::class_<HotPath, std::shared_ptr<HotPath>>(m, "HotPath")
        .def(py::init([stateOf](py::object agent, py::object observer, py::object notAvailable,
                                py::object inflight, py::object available, py::dict names) {
                 agent::AgentState &state = stateOf(agent);
                 return std::make_shared<HotPath>(state, std::move(agent), std::move(observer),
                                                  std::move(notAvailable), std::move(inflight),
                                                  std::move(available), names);
             }),
             py::arg("agent"), py::arg("observer"), py::arg("not_available"), py::arg("inflight"),
             py::arg("available"), py::arg("names"))
        .def("status_descriptor", &HotPath::statusDescriptor)
        .def("scope_hook",
             [phaseOf](HotPath &h, py::object original, int phase, bool begin) {
                 return h.scopeHook(std::move(original), phaseOf(phase), begin);
             })
        .def("engine_hook",
             [](HotPath &h, py::object original, const std::string &call) {
                 if (call == "forward")
                     return h.engineHook(std::move(original), HotPath::EngineCall::Forward);
                 if (call == "backward")
                     return h.engineHook(std::move(original), HotPath::EngineCall::Backward);
                 if (call == "step")
                     return h.engineHook(std::move(original), HotPath::EngineCall::Step);
                 throw py::value_error("engine_hook: call must be forward, backward or step");
             })
        .def("getitem_hook", &HotPath::getitemHook)
        .def("gather_hook", &HotPath::gatherHook, py::arg("original"),
             "The native replacement of partition_parameters._dist_allgather_fn calling original")
        .def("set_engine", &HotPath::setEngine)
        .def_readwrite("in_step", &HotPath::inStep)
        .def_readwrite("after_step", &HotPath::afterStep)
        .def("close_scopes", &HotPath::closeScopes)
        .def("on_stack", &HotPath::onStack)
        .def("set_loss", &HotPath::setLoss)
        .def("begin_step", &HotPath::beginStep)
        .def("end_step", &HotPath::endStep)
        .def_property_readonly("depth", &HotPath::depth)
        .def("top", &HotPath::top)
        .def("top_entry", &HotPath::topEntry)
        .def("publish", &HotPath::publish, py::arg("ds_id"), py::arg("bytes"), py::arg("param"),
             py::arg("hpz") = false)
        .def("unpublish", &HotPath::unpublish)
        .def("forget_own", &HotPath::forgetOwn)
        .def("map_module", &HotPath::mapModule)
        .def("mark_dirty", &HotPath::markDirty)
        .def("flush_active", &HotPath::flushActive)
        .def_readwrite("gathered", &HotPath::gathered)
        .def_readwrite("auto", &HotPath::autoDepth)
        .def_readwrite("slow", &HotPath::slow);
}

} // namespace shardscope::agent

#include "hotpath.h"

#include <string>

namespace shardscope::agent {

namespace {

FetchReason reasonOf(Phase phase)
{
    return phase == Phase::Backward ? FetchReason::Backward : FetchReason::Forward;
}

// ds_status as a data descriptor with only __set__: reads stay plain instance-dictionary
// lookups; assignments reach HotPath::statusSet.
struct StatusDescriptor
{
    std::shared_ptr<HotPath> hot;
};

} // namespace

HotPath::HotPath(AgentState &state, py::object agent, py::object observer,
                 py::object notAvailable, py::object inflight, py::object available)
    : m_state(state), m_agent(std::move(agent)), m_observer(std::move(observer)),
      m_statusRefs{std::move(notAvailable), std::move(inflight), std::move(available)}
{
    for (int i = 0; i < 3; ++i)
        m_status[i] = m_statusRefs[i].ptr();
}

int HotPath::statusCode(PyObject *s) const
{
    for (int i = 0; i < 3; ++i)
        if (s == m_status[i]) return i;
    return -1;
}

ModuleId HotPath::moduleId(py::handle module)
{
    py::object d = py::reinterpret_steal<py::object>(PyObject_GenericGetDict(module.ptr(), nullptr));
    if (!d) throw py::error_already_set();
    if (PyObject *id = PyDict_GetItemWithError(d.ptr(), m_kModuleId.ptr()))
        return static_cast<ModuleId>(PyLong_AsUnsignedLong(id));
    if (PyErr_Occurred()) throw py::error_already_set();
    return m_observer.attr("module_id")(module).cast<ModuleId>(); // names it: rare
}

HotPath::Own HotPath::ownOf(ModuleId id, py::handle module)
{
    if (auto it = m_own.find(id); it != m_own.end()) return it->second;
    auto own = std::make_shared<std::unordered_set<std::uint32_t>>();
    for (py::handle dsId : m_observer.attr("own_ds_ids")(module))
        own->insert(dsId.cast<std::uint32_t>());
    Own shared = std::move(own);
    m_own.emplace(id, shared);
    return shared;
}

void HotPath::forgetOwn(ModuleId module)
{
    m_own.erase(module); // a scope fetching now keeps the set it began with
}

void HotPath::statusSet(py::handle param, py::handle value)
{
    py::object d = py::reinterpret_steal<py::object>(PyObject_GenericGetDict(param.ptr(), nullptr));
    if (!d) throw py::error_already_set();
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
    m_dirty.push_back(dsId);

    ModuleId cause = kNoModule;
    FetchReason reason = FetchReason::Prefetch;
    if (to == 0) { // released, by the innermost scope if any
        if (!m_stack.empty()) cause = m_stack.back().id;
        reason = FetchReason::Forward; // not carried by a release
    } else if (m_fetching && gathered == 0 && autoDepth == 0) {
        cause = m_fetching->id;
        reason = m_fetching->own->contains(dsId) ? reasonOf(m_fetching->phase)
                                                 : FetchReason::Prefetch;
    } else if (gathered > 0) {
        reason = FetchReason::GatheredParameters;
    } else if (autoDepth > 0) {
        if (!m_stack.empty()) cause = m_stack.back().id;
        reason = FetchReason::Guard;
    }
    m_state.statusChanged(dsId, static_cast<ParamStatus>(from), static_cast<ParamStatus>(to),
                          cause, published->second, reason);
    if (slow && to == 2) m_observer.attr("suspects_available")(param);
}

void HotPath::enter(py::handle module, Phase phase)
{
    if (slow) m_observer.attr("suspects_close")();
    const ModuleId id = moduleId(module);
    Own own = ownOf(id, module);
    m_stack.push_back(Scope{py::reinterpret_borrow<py::object>(module), id, phase});
    m_state.moduleEnter(id, phase);
    m_fetching = Fetching{id, phase, std::move(own)};
}

void HotPath::exit(py::handle module, Phase phase)
{
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
    m_fetching.reset();
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

std::vector<std::uint32_t> HotPath::takeDirty()
{
    std::vector<std::uint32_t> out;
    out.swap(m_dirty);
    return out;
}

py::object HotPath::scopeHook(py::object original, Phase phase, bool begin)
{
    std::shared_ptr<HotPath> self = shared_from_this();
    py::cpp_function f;
    if (begin) {
        f = py::cpp_function([self, original, phase](py::handle offload, py::handle module) {
            self->enter(module, phase);
            try {
                py::object r = original(offload, module);
                self->m_fetching.reset(); // the module's own fetches are issued
                return r;
            } catch (...) {
                self->m_fetching.reset();
                throw;
            }
        });
    } else {
        f = py::cpp_function([self, original, phase](py::handle offload, py::handle module) {
            py::object r;
            try {
                r = original(offload, module);
            } catch (...) {
                self->exit(module, phase);
                throw;
            }
            self->exit(module, phase);
            return r;
        });
    }
    // An instance method, so that DeepSpeed's self.pre_sub_module_forward_function(module)
    // passes the DeepSpeedZeRoOffload as the first argument, as to the function it replaces.
    PyObject *method = PyInstanceMethod_New(f.ptr());
    if (!method) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(method);
}

void bindHotPath(py::module_ &m, AgentState &(*stateOf)(py::handle agent))
{
    auto phaseOf = [](int p) {
        if (p != 0 && p != 1) throw py::value_error("phase must be 0 (forward) or 1 (backward)");
        return static_cast<Phase>(p);
    };
    py::class_<HotPath, std::shared_ptr<HotPath>>(m, "HotPath")
        .def(py::init([stateOf](py::object agent, py::object observer, py::object notAvailable,
                                py::object inflight, py::object available) {
                 AgentState &state = stateOf(agent);
                 return std::make_shared<HotPath>(state, std::move(agent), std::move(observer),
                                                  std::move(notAvailable), std::move(inflight),
                                                  std::move(available));
             }),
             py::arg("agent"), py::arg("observer"), py::arg("not_available"),
             py::arg("inflight"), py::arg("available"))
        .def("status_descriptor",
             [](std::shared_ptr<HotPath> self) { return StatusDescriptor{std::move(self)}; })
        .def("scope_hook",
             [phaseOf](HotPath &h, py::object original, int phase, bool begin) {
                 return h.scopeHook(std::move(original), phaseOf(phase), begin);
             })
        .def("close_scopes", &HotPath::closeScopes)
        .def_property_readonly("depth", &HotPath::depth)
        .def("top", &HotPath::top)
        .def("top_entry", &HotPath::topEntry)
        .def("publish", &HotPath::publish)
        .def("unpublish", &HotPath::unpublish)
        .def("forget_own", &HotPath::forgetOwn)
        .def("take_dirty", &HotPath::takeDirty)
        .def_readwrite("gathered", &HotPath::gathered)
        .def_readwrite("auto", &HotPath::autoDepth)
        .def_readwrite("slow", &HotPath::slow);
    py::class_<StatusDescriptor>(m, "StatusDescriptor")
        .def("__set__", [](StatusDescriptor &d, py::handle param, py::handle value) {
            d.hot->statusSet(param, value);
        });
}

} // namespace shardscope::agent

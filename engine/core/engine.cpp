#include "core/engine.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>

#include "core/engineimpl.h"
#include "state/stallthreshold.h"
#include "state/violationtext.h"
#include "telemetry/clock.h"

namespace shardscope::core {

namespace {

std::string quoted(const std::string &path)
{
    return path.empty() ? std::string("<root>") : path;
}

} // namespace

std::uint64_t hashBytes(const std::byte *data, std::size_t n)
{
    // 64-bit multiply-mix over 8-byte words: detects in-place edits, cheap next to a gather.
    std::uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        std::uint64_t w;
        std::memcpy(&w, data + i, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    for (; i < n; ++i)
        h = (h ^ static_cast<std::uint64_t>(data[i])) * 0x94D049BB133111EBull;
    return h;
}

// ---------------------------------------------------------------- construction

Engine::Engine(EngineConfig config, std::vector<std::unique_ptr<comm::Communicator>> comms)
    : m_config(std::move(config)), d(std::make_unique<Impl>())
{
    d->q = this;
    if (m_config.worldSize < 1) throw EngineError("EngineConfig.worldSize must be at least 1");
    if (comms.empty())
        throw EngineError("Engine needs one communicator per local rank; none was given");
    if (m_config.persistenceThreshold < 0 || m_config.prefetchBucketSize < 0 ||
        m_config.maxLiveParameters < 0)
        throw EngineError("persistence threshold, prefetch bucket size and max live parameters "
                          "must not be negative");
    d->localIndex.assign(m_config.worldSize, -1);
    for (auto &c : comms) {
        if (!c) throw EngineError("Engine was given a null communicator");
        if (c->worldSize() != m_config.worldSize)
            throw EngineError("communicator of rank " + std::to_string(c->rank()) +
                              " has world size " + std::to_string(c->worldSize()) +
                              " but EngineConfig.worldSize is " +
                              std::to_string(m_config.worldSize));
        const int r = c->rank();
        if (r < 0 || r >= m_config.worldSize || d->localIndex[r] != -1)
            throw EngineError("communicators must have distinct ranks in [0, world size); rank " +
                              std::to_string(r) + " is out of range or given twice");
        d->localIndex[r] = static_cast<int>(d->ranks.size());
        m_fast.resize(static_cast<std::size_t>(m_config.worldSize), nullptr);
        auto rs = std::make_unique<RankState>();
        rs->rank = r;
        rs->comm = c.get();
        rs->mem = &c->memory();
        m_fast[static_cast<std::size_t>(r)] = &rs->fast;
        d->ranks.push_back(std::move(rs));
        m_localRanks.push_back(r);
        d->comms.push_back(std::move(c));
    }
    ModuleInfo root;
    root.id = 0;
    root.type = "Model";
    root.name = "";
    d->modules.push_back(std::move(root));
    for (auto &rs : d->ranks)
        rs->externals.resize(1);
    d->stallNs = m_config.stallNs;
    if (d->stallNs == 0) {
        std::string error;
        d->stallNs = state::stallNsFromEnvironment(
            state::defaultStallNs(comm::backendName(d->comms.front()->backend())), &error);
        if (!error.empty()) throw EngineError(error);
    }
    d->watchdog = std::thread([impl = d.get()] { impl->watch(); });
}

Engine::~Engine()
{
    {
        std::lock_guard lock(d->watchMu);
        d->watchStop = true;
    }
    d->watchCv.notify_all();
    if (d->watchdog.joinable()) d->watchdog.join();
    // No collective may still write into memory about to be freed.
    for (auto &rs : d->ranks)
        for (ParamId p : rs->inflight) {
            try {
                rs->params[p].gather.wait();
            } catch (...) {
            }
        }
    // Tensors go back to their memory spaces before the communicators that own them.
    d->ranks.clear();
    // Device communicators are destroyed together: ncclCommDestroy is an intra-node
    // collective, so destroying them one after the other would wait forever on the first.
    if (d->comms.size() > 1 && d->comms.front()->backend() != comm::Backend::Cpu) {
        std::vector<std::thread> threads;
        for (auto &c : d->comms)
            threads.emplace_back([&c] {
                try {
                    c->bindThread();
                } catch (...) {
                    // Destroying on the wrong device still releases the communicator.
                }
                c.reset();
            });
        for (auto &t : threads)
            t.join();
    }
}

comm::Backend Engine::backend() const
{
    return d->comms.front()->backend();
}

comm::Communicator &Engine::comm(int rank)
{
    return *d->rankState(rank).comm;
}

comm::MemorySpace &Engine::memory(int rank)
{
    return *d->rankState(rank).mem;
}

std::vector<std::byte> Engine::toHost(int rank, TensorView v)
{
    RankState &rs = d->rankState(rank);
    std::vector<std::byte> out(static_cast<std::size_t>(v.numel) * dtypeSize(v.dtype));
    if (!out.empty()) {
        if (!v.data) throw EngineError("toHost: the tensor view is empty (was it released?)");
        rs.mem->copy(out.data(), v.data, out.size(), comm::CopyKind::SpaceToHost);
    }
    return out;
}

RankState &Engine::Impl::rankState(int rank)
{
    if (rank < 0 || rank >= static_cast<int>(localIndex.size()) || localIndex[rank] < 0)
        throw EngineError("rank " + std::to_string(rank) + " is not a local rank of this engine");
    return *ranks[localIndex[rank]];
}

const RankState &Engine::Impl::rankState(int rank) const
{
    return const_cast<Impl *>(this)->rankState(rank);
}

void Engine::setEventSink(telemetry::EventSink *sink)
{
    d->sink.store(sink, std::memory_order_release);
}

telemetry::EventSink *Engine::eventSink() const
{
    return d->sink.load(std::memory_order_acquire);
}

void Engine::forEachLocalRank(const std::function<void(int)> &fn)
{
    // The first failure is the one to report: the ranks it aborts fail after it, with
    // "aborted" errors that say nothing about the cause.
    std::mutex errorMutex;
    std::exception_ptr first;
    std::vector<std::thread> threads;
    threads.reserve(m_localRanks.size());
    for (std::size_t i = 0; i < m_localRanks.size(); ++i) {
        threads.emplace_back([&, i] {
            try {
                d->ranks[i]->comm->bindThread();
                fn(m_localRanks[i]);
            } catch (...) {
                bool isFirst = false;
                {
                    std::lock_guard lock(errorMutex);
                    if (!first) {
                        first = std::current_exception();
                        isFirst = true;
                    }
                }
                if (isFirst && m_localRanks.size() > 1)
                    for (auto &rs : d->ranks)
                        rs->comm->abort();
            }
        });
    }
    for (auto &t : threads)
        t.join();
    if (first) std::rethrow_exception(first);
}

// ---------------------------------------------------------------- telemetry

void Engine::Impl::emitAt(const RankState &rs, const telemetry::Event &fields, std::uint64_t tsNs)
{
    telemetry::EventSink *s = sink.load(std::memory_order_acquire);
    if (!s || !q->m_telemetryOn.load(std::memory_order_relaxed)) return;
    s->write(telemetry::stamped(fields, tsNs, rs.step.load(std::memory_order_relaxed),
                                static_cast<std::uint16_t>(rs.rank)));
}

void Engine::Impl::emit(const RankState &rs, const telemetry::Event &fields)
{
    telemetry::EventSink *s = sink.load(std::memory_order_acquire);
    if (!s || !q->m_telemetryOn.load(std::memory_order_relaxed)) return;
    const std::uint64_t ts = rs.batchTs ? rs.batchTs : telemetry::nowNs();
    s->write(telemetry::stamped(fields, ts, rs.step.load(std::memory_order_relaxed),
                                static_cast<std::uint16_t>(rs.rank)));
}

bool Engine::Impl::telemetryLive() const
{
    return sink.load(std::memory_order_relaxed) && q->m_telemetryOn.load(std::memory_order_relaxed);
}

namespace {

// Opens a telemetry batch on a rank for one module entry or exit (one clock read, when
// telemetry is on) and closes it however the scope ends.
class TelemetryBatch
{
  public:
    TelemetryBatch(RankState &rs, bool live) : m_rs(rs)
    {
        rs.batchTs = live ? telemetry::nowNs() : 0;
    }
    ~TelemetryBatch() { m_rs.batchTs = 0; }
    TelemetryBatch(const TelemetryBatch &) = delete;
    TelemetryBatch &operator=(const TelemetryBatch &) = delete;

  private:
    RankState &m_rs;
};

} // namespace

void Engine::Impl::emitMemory(RankState &rs)
{
    emit(rs, telemetry::makeMemorySample(
                 {.partitionedBytes = rs.partitionedBytes,
                  .gatheredBytes = rs.gatheredBytesNow,
                  .peakGatheredBytes = rs.peakGatheredBytes,
                  .liveElements = static_cast<std::uint64_t>(rs.liveElements)}));
}

// ---------------------------------------------------------------- model structure

ModuleId Engine::addModule(ModuleId parent, std::string_view name, std::string_view type)
{
    std::unique_lock lock(d->structure);
    if (parent >= d->modules.size())
        throw EngineError("addModule(" + std::string(name) + "): parent module id " +
                          std::to_string(parent) + " does not exist");
    if (name.empty() || name.find('.') != std::string_view::npos)
        throw EngineError("module name '" + std::string(name) +
                          "' must be non-empty and contain no '.'; nest modules instead");
    const ModuleInfo &p = d->modules[parent];
    for (ModuleId c : p.children)
        if (d->modules[c].name == name)
            throw EngineError("module '" + quoted(p.path) + "' already has a child named '" +
                              std::string(name) + "'");
    ModuleInfo m;
    m.id = static_cast<ModuleId>(d->modules.size());
    m.parent = parent;
    m.name = std::string(name);
    m.path = p.path.empty() ? m.name : p.path + "." + m.name;
    m.type = std::string(type);
    d->modules[parent].children.push_back(m.id);
    d->modules.push_back(std::move(m));
    for (auto &rs : d->ranks)
        rs->externals.resize(d->modules.size());
    d->touch();
    return d->modules.back().id;
}

ParamId Engine::addParameter(ModuleId owner, std::string_view name, Shape shape, DType dtype,
                             const void *init, std::source_location where)
{
    std::unique_lock lock(d->structure);
    if (owner >= d->modules.size())
        throw EngineError("addParameter(" + std::string(name) + "): module id " +
                          std::to_string(owner) + " does not exist");
    if (name.empty() || name.find('.') != std::string_view::npos)
        throw EngineError("parameter name '" + std::string(name) +
                          "' must be non-empty and contain no '.'");
    for (std::int64_t dim : shape)
        if (dim < 0)
            throw EngineError("parameter '" + std::string(name) + "' has a negative dimension in " +
                              state::shapeString(shape));
    ModuleInfo &m = d->modules[owner];
    for (ParamId q : m.params)
        if (d->params[q].localName == name)
            throw EngineError("module '" + quoted(m.path) + "' already has a parameter named '" +
                              std::string(name) + "'");

    ParamInfo info;
    info.id = static_cast<ParamId>(d->params.size());
    info.owner = owner;
    info.localName = std::string(name);
    info.name = m.path.empty() ? info.localName : m.path + "." + info.localName;
    info.shape = std::move(shape);
    info.dtype = dtype;
    info.numel = state::shapeNumel(info.shape);
    info.layout = state::PartitionLayout::make(info.numel, m_config.worldSize);
    info.late = m_partitioned;
    const std::size_t es = dtypeSize(dtype);
    const std::size_t bytes = static_cast<std::size_t>(info.numel) * es;

    const ParamId id = info.id;
    m.params.push_back(id);
    d->params.push_back(std::move(info));
    d->pending.emplace_back();
    d->lateReported.push_back(false);
    d->gatherTotals.emplace_back();
    for (auto &rs : d->ranks) {
        rs->params.emplace_back();
        rs->status.emplace_back(ParamStatus::NotAvailable);
        rs->fast.push_back(FastEntry{nullptr, d->params[id].numel, 0, dtype});
    }

    if (!m_partitioned) {
        d->touch();
        auto &buf = d->pending[id];
        buf.resize(bytes);
        if (init && bytes) std::memcpy(buf.data(), init, bytes);
        return id;
    }

    // A late parameter: whole on every rank, not managed by the partitioner until adopted.
    d->lateParams.push_back(id);
    d->lateSites.insert_or_assign(id, where);
    d->touch();
    const ParamInfo &pi = d->params[id];
    for (auto &rsp : d->ranks) {
        RankState &rs = *rsp;
        std::lock_guard rl(rs.mu);
        RankParam &rp = rs.params[id];
        Impl::setAlwaysAvailable(rs, id, true);
        d->setFull(rs, id, Impl::zeroed(rs, static_cast<std::size_t>(pi.layout.paddedNumel) * es));
        if (init && bytes) rs.mem->copy(rp.full.data(), init, bytes, comm::CopyKind::HostToSpace);
        rp.grad = Impl::zeroed(rs, static_cast<std::size_t>(pi.numel) * sizeof(float));
        rs.status[id].store(ParamStatus::Available, std::memory_order_release);
        rs.gatheredBytesNow += pi.layout.paddedNumel * es;
        rs.peakGatheredBytes = std::max(rs.peakGatheredBytes, rs.gatheredBytesNow);
        d->emit(rs, telemetry::makeLateParameter({.module = owner, .param = id}));
    }
    return id;
}

void Engine::removeParameter(ParamId p)
{
    std::unique_lock lock(d->structure);
    if (p >= d->params.size() || d->params[p].removed)
        throw EngineError("removeParameter: parameter id " + std::to_string(p) + " does not exist");
    ParamInfo &info = d->params[p];
    for (auto &rsp : d->ranks) {
        std::lock_guard rl(rsp->mu);
        const RankParam &rp = rsp->params[p];
        if (!rp.active.empty() || rp.inScope) {
            std::string users;
            for (ModuleId m : rp.active)
                users += (users.empty() ? "" : ", ") + quoted(d->modules[m].path);
            throw EngineError("cannot remove " + info.name + ": on rank " +
                              std::to_string(rsp->rank) + " it is in use by " +
                              (rp.inScope ? std::string("a GatheredParameters scope") : users) +
                              "; remove it after those scopes end");
        }
    }
    for (auto &rsp : d->ranks)
        d->complete(*rsp, p); // a prefetch still in flight writes into the tensor
    info.removed = true;
    d->touch();
    auto &owned = d->modules[info.owner].params;
    owned.erase(std::remove(owned.begin(), owned.end(), p), owned.end());
    for (auto &rsp : d->ranks) {
        RankState &rs = *rsp;
        std::lock_guard rl(rs.mu);
        RankParam &rp = rs.params[p];
        if (rp.full) rs.gatheredBytesNow -= d->fullBytes(p);
        rs.partitionedBytes -= rp.shard.size();
        d->setFull(rs, p, comm::Buffer());
        rp.shard.reset();
        rp.grad.reset();
        Impl::setAlwaysAvailable(rs, p, false);
        rs.status[p].store(ParamStatus::NotAvailable, std::memory_order_release);
        for (auto &ext : rs.externals)
            std::erase_if(ext, [p](const ExternalEntry &e) { return e.param == p; });
    }
    d->pending[p] = {};
}

void Engine::partition()
{
    std::unique_lock lock(d->structure);
    if (m_partitioned)
        throw EngineError("partition() was already called; parameters added since are late: "
                          "adopt them with adoptParameter()");
    for (ParamId p = 0; p < d->params.size(); ++p) {
        ParamInfo &info = d->params[p];
        if (info.removed) continue;
        info.persistent = info.numel < m_config.persistenceThreshold;
        info.partitioned = !info.persistent;
        const std::size_t es = dtypeSize(info.dtype);
        std::vector<std::byte> &src = d->pending[p];
        src.resize(static_cast<std::size_t>(info.layout.paddedNumel) * es); // zero tail padding
        const std::size_t shardBytes = static_cast<std::size_t>(info.layout.partitionNumel) * es;
        for (auto &rsp : d->ranks) {
            RankState &rs = *rsp;
            std::lock_guard rl(rs.mu);
            RankParam &rp = rs.params[p];
            // The padded source's slices already carry the zero padding.
            rp.shard = comm::Buffer(*rs.mem, shardBytes);
            rs.mem->copy(rp.shard.data(), src.data() + info.layout.offset(rs.rank) * es, shardBytes,
                         comm::CopyKind::HostToSpace);
            rp.grad = Impl::zeroed(rs, static_cast<std::size_t>(info.layout.partitionNumel) *
                                           sizeof(float));
            rs.partitionedBytes += rp.shard.size();
            if (info.persistent) {
                Impl::setAlwaysAvailable(rs, p, true);
                d->setFull(rs, p, comm::Buffer(*rs.mem, src.size()));
                rs.mem->copy(rp.full.data(), src.data(), src.size(), comm::CopyKind::HostToSpace);
                rs.status[p].store(ParamStatus::Available, std::memory_order_release);
                rs.gatheredBytesNow += src.size();
                rs.peakGatheredBytes = std::max(rs.peakGatheredBytes, rs.gatheredBytesNow);
            }
        }
        src = {};
    }
    m_partitioned = true;
    d->touch();
    // The first gathers read the shards just written.
    for (auto &rs : d->ranks)
        rs->comm->waitForCompute();
}

void Engine::adoptParameter(ParamId p)
{
    std::unique_lock lock(d->structure);
    if (p >= d->params.size() || d->params[p].removed)
        throw EngineError("adoptParameter: parameter id " + std::to_string(p) + " does not exist");
    ParamInfo &info = d->params[p];
    if (!info.late || info.partitioned || info.persistent)
        throw EngineError("adoptParameter(" + info.name +
                          "): only a late parameter that is not yet "
                          "adopted can be adopted; this one is already managed by the partitioner");
    for (auto &rsp : d->ranks) {
        std::lock_guard rl(rsp->mu);
        const RankParam &rp = rsp->params[p];
        if (!rp.active.empty() || rp.inScope)
            throw EngineError("adoptParameter(" + info.name + "): it is in use on rank " +
                              std::to_string(rsp->rank) +
                              "; adopt it outside module and "
                              "GatheredParameters scopes");
    }
    info.persistent = info.numel < m_config.persistenceThreshold;
    info.partitioned = !info.persistent;
    d->touch();
    const std::size_t es = dtypeSize(info.dtype);
    for (auto &rsp : d->ranks) {
        RankState &rs = *rsp;
        std::lock_guard rl(rs.mu);
        RankParam &rp = rs.params[p];
        rp.shard = comm::Buffer(*rs.mem, static_cast<std::size_t>(info.layout.partitionNumel) * es);
        d->shardFromFull(rs, p);
        rp.grad =
            Impl::zeroed(rs, static_cast<std::size_t>(info.layout.partitionNumel) * sizeof(float));
        rs.partitionedBytes += rp.shard.size();
        if (info.partitioned) {
            d->setFull(rs, p, comm::Buffer());
            Impl::setAlwaysAvailable(rs, p, false);
            rs.gatheredBytesNow -= d->fullBytes(p);
            rs.status[p].store(ParamStatus::NotAvailable, std::memory_order_release);
        }
        d->emit(rs, telemetry::makeParameterAdopted({.module = info.owner, .param = p}));
        rs.comm->waitForCompute();
    }
}

std::vector<std::byte> Engine::hostRead(ParamId p)
{
    const ParamInfo &info = param(p);
    const RankState &first = d->rankState(m_localRanks.front());
    const std::size_t bytes = static_cast<std::size_t>(info.numel) * dtypeSize(info.dtype);
    if (!m_partitioned) {
        return d->pending[p];
    }
    if (!info.partitioned) {
        const RankParam &rp = first.params[p];
        std::vector<std::byte> out(bytes);
        first.mem->copy(out.data(), rp.full.data(), bytes, comm::CopyKind::SpaceToHost);
        return out;
    }
    std::vector<std::byte> out(bytes);
    forEachLocalRank([&](int rank) {
        RankState &rs = d->rankState(rank);
        TensorView v = d->slowAccess(rs, p, std::source_location::current());
        if (rank == m_localRanks.front())
            rs.mem->copy(out.data(), v.data, bytes, comm::CopyKind::SpaceToHost);
        d->releaseIdle(rs);
    });
    return out;
}

std::size_t Engine::moduleCount() const
{
    std::shared_lock lock(d->structure);
    return d->modules.size();
}

std::size_t Engine::paramCount() const
{
    std::shared_lock lock(d->structure);
    return d->params.size();
}

const ModuleInfo &Engine::module(ModuleId id) const
{
    std::shared_lock lock(d->structure);
    if (id >= d->modules.size())
        throw EngineError("module id " + std::to_string(id) + " does not exist");
    return d->modules[id];
}

const ParamInfo &Engine::param(ParamId id) const
{
    std::shared_lock lock(d->structure);
    if (id >= d->params.size() || d->params[id].removed)
        throw EngineError("parameter id " + std::to_string(id) + " does not exist");
    return d->params[id];
}

ModuleId Engine::findModule(std::string_view path) const
{
    std::shared_lock lock(d->structure);
    for (const ModuleInfo &m : d->modules)
        if (m.path == path) return m.id;
    return kNoModule;
}

ParamId Engine::findParam(std::string_view name) const
{
    std::shared_lock lock(d->structure);
    for (const ParamInfo &p : d->params)
        if (!p.removed && p.name == name) return p.id;
    return kNoParam;
}

std::string Engine::modulePath(ModuleId id) const
{
    if (id == kNoModule) return "<none>";
    return quoted(module(id).path);
}

// ---------------------------------------------------------------- externals

void Engine::Impl::addExternal(RankState &rs, ModuleId m, ParamId p, bool automatic)
{
    {
        std::lock_guard rl(rs.mu);
        auto &ext = rs.externals[m];
        for (const ExternalEntry &e : ext)
            if (e.param == p) return;
        if (ext.empty())
            rs.externalModules.insert(
                std::lower_bound(rs.externalModules.begin(), rs.externalModules.end(), m), m);
        ext.push_back({p, automatic});
    }
    touch();
    emit(rs, telemetry::makeExternalRegister({.module = m, .param = p, .automatic = automatic}));
}

void Engine::registerExternalParameter(ModuleId m, ParamId p)
{
    const ModuleInfo &mi = module(m);
    const ParamInfo &pi = param(p);
    (void)pi;
    (void)mi;
    for (auto &rs : d->ranks)
        d->addExternal(*rs, m, p, false);
}

void Engine::unregisterExternalParameter(ModuleId m, ParamId p)
{
    const ModuleInfo &mi = module(m);
    const ParamInfo &pi = param(p);
    bool found = false;
    for (auto &rsp : d->ranks) {
        std::lock_guard rl(rsp->mu);
        auto &ext = rsp->externals[m];
        const auto n = std::erase_if(ext, [p](const ExternalEntry &e) { return e.param == p; });
        if (n > 0 && ext.empty()) std::erase(rsp->externalModules, m);
        found = found || n > 0;
    }
    d->touch();
    if (!found) {
        std::string where;
        const RankState &rs = *d->ranks.front();
        {
            std::lock_guard rl(rs.mu);
            for (ModuleId o = 0; o < rs.externals.size(); ++o)
                for (const ExternalEntry &e : rs.externals[o])
                    if (e.param == p)
                        where += (where.empty() ? "" : ", ") + quoted(d->modules[o].path);
        }
        throw EngineError("unregister_external_parameter(" + quoted(mi.path) + ", " + pi.name +
                          "): " + pi.name + " is not registered on " + quoted(mi.path) +
                          (where.empty() ? std::string("; it is not registered on any module")
                                         : "; it is registered on: " + where));
    }
    for (auto &rs : d->ranks)
        d->emit(*rs, telemetry::makeExternalUnregister({.module = m, .param = p}));
}

bool Engine::isExternal(int rank, ModuleId m, ParamId p) const
{
    const RankState &rs = d->rankState(rank);
    std::lock_guard rl(rs.mu);
    if (m >= rs.externals.size()) return false;
    for (const ExternalEntry &e : rs.externals[m])
        if (e.param == p) return true;
    return false;
}

// ---------------------------------------------------------------- fetch and release

void Engine::Impl::fetch(RankState &rs, ParamId p, ModuleId cause, FetchReason reason)
{
    RankParam &rp = rs.params[p];
    if (rs.status[p].load(std::memory_order_acquire) != ParamStatus::NotAvailable) return;
    const ParamInfo &info = params[p];
    const std::size_t es = dtypeSize(info.dtype);
    const std::uint64_t bytes = fullBytes(p);
    comm::Buffer full = comm::Buffer::adopt(*rs.mem, rs.mem->allocateForCollective(bytes), bytes);
    // Issued at the batch's time when a module entry issues it (one clock read for all),
    // and stamped with the instant gather_ns counts from (docs/protocol.md, "Timestamps in
    // State").
    const std::uint64_t t0 = rs.batchTs ? rs.batchTs : telemetry::nowNs();
    emitAt(
        rs,
        telemetry::makeFetchBegin({.param = p, .cause = cause, .bytes = bytes, .reason = reason}),
        t0);
    {
        std::lock_guard rl(rs.mu);
        setFull(rs, p, std::move(full));
        rs.gatheredBytesNow += bytes;
        rs.peakGatheredBytes = std::max(rs.peakGatheredBytes, rs.gatheredBytesNow);
        rs.liveElements += info.layout.paddedNumel;
    }
    rp.gatherIssuedNs = t0;
    rp.gatherCause = cause;
    rp.gatherReason = reason;
    rp.gatherSeq = ++rs.collectiveSeq;
    emitAt(rs, telemetry::makeCollectiveBegin(gatherCollective(rp, bytes)), t0);
    rs.status[p].store(ParamStatus::Inflight, std::memory_order_release);
    rs.inflight.push_back(p);
    // A synchronous communicator (threads, gloo) blocks here until every rank has joined.
    const WaitingScope waiting(rs, gatherCollective(rp, bytes), t0);
    rp.gather = rs.comm->allGather(rp.shard.data(), rp.full.data(),
                                   static_cast<std::size_t>(info.layout.partitionNumel) * es);
}

void Engine::Impl::complete(RankState &rs, ParamId p)
{
    RankParam &rp = rs.params[p];
    if (rs.status[p].load(std::memory_order_acquire) != ParamStatus::Inflight) return;
    {
        const WaitingScope waiting(rs, gatherCollective(rp, fullBytes(p)), telemetry::nowNs());
        rp.gather.wait(); // a failed collective throws here and the parameter stays INFLIGHT
    }
    rp.gather = comm::CommHandle();
    const std::uint64_t bytes = fullBytes(p);
    const std::uint64_t t1 = telemetry::nowNs();
    if (rs.batchTs) rs.batchTs = t1; // what follows in the batch is not earlier
    GatherTotals &tot = gatherTotals[p];
    tot.count.fetch_add(1, std::memory_order_relaxed);
    tot.bytes.fetch_add(bytes, std::memory_order_relaxed);
    tot.ns.fetch_add(t1 - rp.gatherIssuedNs, std::memory_order_relaxed);
    for (std::uint64_t last = tot.lastTs.load(std::memory_order_relaxed);
         last < t1 && !tot.lastTs.compare_exchange_weak(last, t1, std::memory_order_relaxed);)
        ;
    rs.totalGatheredBytes.fetch_add(bytes, std::memory_order_relaxed);
    auto it = std::find(rs.inflight.begin(), rs.inflight.end(), p);
    if (it != rs.inflight.end()) rs.inflight.erase(it);
    rs.status[p].store(ParamStatus::Available, std::memory_order_release);
    touch();
    emitAt(rs, telemetry::makeCollectiveEnd(gatherCollective(rp, bytes)), t1);
    emitAt(rs,
           telemetry::makeFetchEnd(
               {.param = p, .cause = rp.gatherCause, .bytes = bytes, .reason = rp.gatherReason}),
           t1);
}

void Engine::Impl::poll(RankState &rs)
{
    for (std::size_t i = 0; i < rs.inflight.size();) {
        const ParamId p = rs.inflight[i];
        if (rs.params[p].gather.ready())
            complete(rs, p); // removes it from inflight
        else
            ++i;
    }
}

void Engine::Impl::shardFromFull(RankState &rs, ParamId p)
{
    const ParamInfo &info = params[p];
    const std::size_t es = dtypeSize(info.dtype);
    RankParam &rp = rs.params[p];
    // Full tensors are padded with zeros, so the slice carries the shard's padding.
    rs.mem->copy(rp.shard.data(), rp.full.data() + info.layout.offset(rs.rank) * es,
                 static_cast<std::size_t>(info.layout.partitionNumel) * es,
                 comm::CopyKind::WithinSpace);
}

std::uint64_t Engine::Impl::hashFull(RankState &rs, ParamId p)
{
    const std::size_t bytes = static_cast<std::size_t>(params[p].numel) * elemSize(p);
    const RankParam &rp = rs.params[p];
    if (rs.mem->isHost()) return hashBytes(rp.full.data(), bytes);
    std::vector<std::byte> host(bytes);
    rs.mem->copy(host.data(), rp.full.data(), bytes, comm::CopyKind::SpaceToHost);
    return hashBytes(host.data(), bytes);
}

void Engine::Impl::release(RankState &rs, ParamId p, ModuleId cause)
{
    RankParam &rp = rs.params[p];
    const ParamInfo &info = params[p];
    if (rp.alwaysAvailable) return;
    const ParamStatus st = rs.status[p].load(std::memory_order_acquire);
    if (st == ParamStatus::NotAvailable) return;
    if (st == ParamStatus::Inflight) complete(rs, p); // the collective still writes into the tensor
    comm::Buffer freed;
    {
        std::lock_guard rl(rs.mu);
        if (!rp.active.empty() || rp.inScope) {
            std::string users;
            for (ModuleId m : rp.active)
                users += (users.empty() ? "" : ", ") + quoted(modules[m].path);
            if (rp.inScope)
                users += (users.empty() ? "" : ", ") + std::string("a GatheredParameters scope");
            throw EngineError("cannot release " + info.name + " on rank " +
                              std::to_string(rs.rank) + ": it is still active in " + users);
        }
        freed = std::move(rp.full);
        rs.fast[p].data = nullptr;
        clearPrefetched(rs, p);
        rs.gatheredBytesNow -= fullBytes(p);
        rs.liveElements -= info.layout.paddedNumel;
    }
    rs.status[p].store(ParamStatus::NotAvailable, std::memory_order_release);
    touch();
    emit(rs, telemetry::makeRelease({.param = p, .cause = cause, .bytes = fullBytes(p)}));
}

void Engine::Impl::releaseIdle(RankState &rs)
{
    for (ParamId p = 0; p < rs.params.size(); ++p) {
        RankParam &rp = rs.params[p];
        if (rp.alwaysAvailable || rp.inScope || !rp.active.empty()) continue;
        if (rs.status[p].load(std::memory_order_relaxed) != ParamStatus::NotAvailable)
            release(rs, p, kNoModule);
    }
}

void Engine::Impl::useParam(RankState &rs, ParamId p, ModuleId m, bool counted, FetchReason reason)
{
    gather(rs, p, m, reason);
    RankParam &rp = rs.params[p];
    {
        std::lock_guard rl(rs.mu);
        if (rp.active.empty()) rs.activeParams.push_back(p);
        rp.active.push_back(m);
        clearPrefetched(rs, p);
    }
    if (counted) ++rs.fast[p].readable;
    rs.frames[rs.depth - 1].params.emplace_back(p, counted);
}

void Engine::Impl::clearPrefetched(RankState &rs, ParamId p)
{
    RankParam &rp = rs.params[p];
    if (rp.prefetched) {
        rp.prefetched = false;
        rs.prefetchedNumel -= params[p].layout.paddedNumel;
    }
}

// Walks the recorded trace ahead of the current module, gathering what the next modules
// will need until prefetchBucketSize elements are gathered ahead of use. The cursor only
// moves forward, so a step costs O(trace length) however many modules it enters.
void Engine::Impl::prefetch(RankState &rs)
{
    if (!rs.traceValid || rs.traceBroken) return;
    const std::int64_t bucket = q->m_config.prefetchBucketSize;
    const std::int64_t maxLive = q->m_config.maxLiveParameters;
    rs.prefetchCursor = std::max(rs.prefetchCursor, rs.tracePos);
    while (rs.prefetchCursor < rs.trace.size() && rs.prefetchedNumel < bucket) {
        const ModuleId m = rs.trace[rs.prefetchCursor].module;
        bool blocked = false;
        auto consider = [&](ParamId p) {
            const ParamInfo &info = params[p];
            RankParam &rp = rs.params[p];
            if (blocked || info.removed || rp.alwaysAvailable ||
                rs.status[p].load(std::memory_order_relaxed) != ParamStatus::NotAvailable)
                return;
            if (rs.liveElements + info.layout.paddedNumel > maxLive) {
                blocked = true; // retried on the next module entry, once something is released
                return;
            }
            fetch(rs, p, m, FetchReason::Prefetch);
            std::lock_guard rl(rs.mu);
            rp.prefetched = true;
            rs.prefetchedNumel += info.layout.paddedNumel;
        };
        for (ParamId p : modules[m].params)
            consider(p);
        for (const ExternalEntry &e : rs.externals[m])
            consider(e.param);
        if (blocked) return;
        ++rs.prefetchCursor;
    }
}

// ---------------------------------------------------------------- steps and modules

void Engine::beginStep(int rank)
{
    RankState &rs = d->rankState(rank);
    if (!m_partitioned)
        throw EngineError("beginStep: call partition() before training (it is zero.Init: every "
                          "parameter must be partitioned before the first step)");
    if (rs.inStep)
        throw EngineError("beginStep on rank " + std::to_string(rank) + ": step " +
                          std::to_string(rs.step.load()) + " has not ended; call endStep first");
    rs.inStep = true;
    const std::uint32_t step = rs.step.fetch_add(1) + 1;
    d->touch();
    rs.tracePos = 0;
    rs.prefetchCursor = 0;
    rs.traceBroken = false;
    rs.order.clear();
    rs.violationsThisStep.clear();
    d->releaseIdle(rs);
    // This step's gathers read the shards the optimizer wrote since the last step.
    rs.comm->waitForCompute();
    d->emit(rs, telemetry::makeStepBegin());

    // A step that starts with late, unadopted parameters: they are never partitioned.
    std::shared_lock lock(d->structure);
    for (ParamId p : d->lateParams) {
        const ParamInfo &info = d->params[p];
        if (info.removed || info.partitioned || info.persistent) continue;
        state::ViolationRecord v;
        v.kind = ViolationKind::LateParameter;
        v.step = step;
        v.rank = rank;
        v.accessor = info.owner;
        v.param = p;
        v.paramName = info.name;
        v.owner = info.owner;
        v.status = rs.status[p].load();
        v.action = GuardAction::Recorded;
        if (const auto site = d->lateSites.find(p); site != d->lateSites.end()) {
            v.location.file = site->second.file_name();
            v.location.line = site->second.line();
            v.location.function = site->second.function_name();
        }
        state::ViolationSubject subject;
        subject.kind = ViolationKind::LateParameter;
        subject.param = info.name;
        subject.owner = d->modules[info.owner].path;
        subject.replaces = d->replacedBy(p);
        auto text = state::describeViolation(subject, state::FixDialect::ShardScope);
        v.fix = std::move(text.fix);
        v.message = std::move(text.message);
        d->recordViolation(std::move(v));
    }
}

void Engine::endStep(int rank, double loss)
{
    RankState &rs = d->rankState(rank);
    if (!rs.inStep)
        throw EngineError("endStep on rank " + std::to_string(rank) + " without beginStep");
    if (rs.depth != 0)
        throw EngineError("endStep on rank " + std::to_string(rank) + " while module '" +
                          quoted(d->modules[rs.frames[rs.depth - 1].module].path) +
                          "' is still entered; every enterModule needs its exitModule");
    d->releaseIdle(rs);
    if (!rs.traceValid || rs.traceBroken) {
        rs.trace = rs.order;
        rs.traceValid = true;
        d->emit(rs, telemetry::makeTraceRecorded(rs.trace.size()));
    }
    rs.inStep = false;
    d->emitMemory(rs);
    d->emit(rs, telemetry::makeStepEnd(loss));
}

std::uint32_t Engine::step(int rank) const
{
    return d->rankState(rank).step.load();
}

void Engine::enterModule(int rank, ModuleId m, Phase phase, std::source_location where)
{
    RankState &rs = d->rankState(rank);
    rs.site = where;
    if (m >= d->modules.size())
        throw EngineError("enterModule: module id " + std::to_string(m) + " does not exist");
    if (rs.depth == rs.frames.size()) rs.frames.emplace_back();
    Frame &f = rs.frames[rs.depth++];
    f.module = m;
    f.phase = phase;
    f.params.clear();
    const TelemetryBatch batch(rs, d->telemetryLive());
    d->emit(rs, telemetry::makeModuleEnter({.module = m, .phase = phase}));
    if (!rs.inflight.empty()) d->poll(rs);

    const TraceEntry entry{m, phase};
    rs.order.push_back(entry);
    if (rs.traceValid && !rs.traceBroken) {
        if (rs.tracePos < rs.trace.size() && rs.trace[rs.tracePos] == entry) {
            ++rs.tracePos;
        } else {
            rs.traceBroken = true;
            const ModuleId expected =
                rs.tracePos < rs.trace.size() ? rs.trace[rs.tracePos].module : kNoModule;
            d->emit(rs, telemetry::makeTraceInvalidated(
                            {.expected = expected, .got = m, .phase = phase}));
            state::ViolationRecord v;
            v.kind = ViolationKind::TraceInvalidated;
            v.step = rs.step.load();
            v.rank = rank;
            v.accessor = m;
            v.owner = expected;
            v.action = GuardAction::Recorded;
            state::ViolationSubject subject;
            subject.kind = ViolationKind::TraceInvalidated;
            subject.hasAccessor = true;
            subject.accessor = d->modules[m].path;
            subject.hasOwner = expected != kNoModule;
            if (subject.hasOwner) subject.owner = d->modules[expected].path;
            v.message = state::describeViolation(subject, state::FixDialect::ShardScope).message;
            d->recordViolation(std::move(v));
        }
    }

    const FetchReason reason =
        phase == Phase::Forward ? FetchReason::Forward : FetchReason::Backward;
    for (ParamId p : d->modules[m].params)
        d->useParam(rs, p, m, true, reason);
    // Copy: auto registration may append to this module's externals while it runs.
    const std::size_t nExt = rs.externals[m].size();
    for (std::size_t i = 0; i < nExt; ++i)
        d->useParam(rs, rs.externals[m][i].param, m, true, reason);
    d->prefetch(rs);
}

void Engine::exitModule(int rank, ModuleId m, Phase phase)
{
    RankState &rs = d->rankState(rank);
    if (rs.depth == 0 || rs.frames[rs.depth - 1].module != m ||
        rs.frames[rs.depth - 1].phase != phase) {
        const std::string inner =
            rs.depth == 0 ? std::string("no module is entered")
                          : "the innermost module is '" +
                                quoted(d->modules[rs.frames[rs.depth - 1].module].path) + "' (" +
                                std::string(phaseName(rs.frames[rs.depth - 1].phase)) + ")";
        throw EngineError("exitModule('" +
                          (m < d->modules.size() ? quoted(d->modules[m].path) : std::string("?")) +
                          "', " + std::string(phaseName(phase)) + ") on rank " +
                          std::to_string(rank) + " but " + inner +
                          "; modules must exit in reverse order of entry");
    }
    Frame &f = rs.frames[rs.depth - 1];
    const TelemetryBatch batch(rs, d->telemetryLive());
    for (auto [p, counted] : f.params) {
        RankParam &rp = rs.params[p];
        if (counted) --rs.fast[p].readable;
        bool idle;
        {
            std::lock_guard rl(rs.mu);
            auto it = std::find(rp.active.begin(), rp.active.end(), m);
            if (it != rp.active.end()) {
                rp.active.erase(it);
                if (rp.active.empty()) std::erase(rs.activeParams, p);
            }
            idle = rp.active.empty() && !rp.inScope;
        }
        if (idle) d->release(rs, p, m);
    }
    f.params.clear();
    --rs.depth;
    if (!rs.inflight.empty()) d->poll(rs);
    d->emit(rs, telemetry::makeModuleExit({.module = m, .phase = phase}));
    d->emitMemory(rs);
}

// ---------------------------------------------------------------- gradients

namespace {

void ensureBytes(comm::MemorySpace &mem, comm::Buffer &b, std::size_t bytes)
{
    if (b.size() < bytes) b = comm::Buffer(mem, bytes);
}

} // namespace

void Engine::reduceScatterGrad(int rank, ParamId p, const float *fullGrad,
                               std::source_location where)
{
    RankState &rs = d->rankState(rank);
    rs.site = where;
    const ParamInfo &info = d->params[p];
    if (info.removed) throw EngineError("reduceScatterGrad: " + info.name + " was removed");
    if (info.dtype != DType::F32)
        throw EngineError("reduceScatterGrad(" + info.name +
                          "): gradients are fp32 only; this "
                          "parameter is " +
                          std::string(dtypeName(info.dtype)));
    const state::PartitionLayout &l = info.layout;
    RankParam &rp = rs.params[p];
    comm::MemorySpace &mem = *rs.mem;
    const std::size_t numelBytes = static_cast<std::size_t>(l.numel) * sizeof(float);
    const std::size_t paddedBytes = static_cast<std::size_t>(l.paddedNumel) * sizeof(float);
    const std::size_t shardBytes = static_cast<std::size_t>(l.partitionNumel) * sizeof(float);
    ensureBytes(mem, rs.scratch, paddedBytes);
    ensureBytes(mem, rs.scratchShard, shardBytes);
    float *padded = rs.scratch.f32();
    mem.copy(padded, fullGrad, numelBytes, comm::CopyKind::WithinSpace);
    mem.zero(padded + l.numel, paddedBytes - numelBytes);
    rs.comm->waitForCompute();
    // One span per parameter: its owner's gradient, the padded fp32 bytes the collective moves.
    const telemetry::ReduceScatterFields span{
        .module = info.owner, .param = p, .bytes = paddedBytes, .params = 1};
    // Stamped here, not with a module batch's instant: the span is the collective's own.
    const bool live = d->telemetryLive();
    // Its place in the rank's collective sequence: the owner's gradients, in backward.
    const telemetry::CollectiveFields collective{.kind = CollectiveKind::ReduceScatter,
                                                 .module = info.owner,
                                                 .seq = ++rs.collectiveSeq,
                                                 .bytes = paddedBytes,
                                                 .reason = FetchReason::Backward,
                                                 .params = 1};
    if (live) {
        const std::uint64_t t0 = telemetry::nowNs();
        d->emitAt(rs, telemetry::makeCollectiveBegin(collective), t0);
        d->emitAt(rs, telemetry::makeReduceScatterBegin(span), t0);
    }
    std::optional<WaitingScope> waiting(std::in_place, rs, collective, telemetry::nowNs());
    rs.comm
        ->reduceScatter(padded, rs.scratchShard.data(), static_cast<std::size_t>(l.partitionNumel),
                        DType::F32)
        .wait();
    const bool managed = info.partitioned || info.persistent;
    const auto ended = [&] {
        if (!live) return;
        const std::uint64_t t1 = telemetry::nowNs();
        d->emitAt(rs, telemetry::makeReduceScatterEnd(span), t1);
        d->emitAt(rs, telemetry::makeCollectiveEnd(collective), t1);
    };
    if (managed) {
        waiting.reset();
        ended();
        mem.addF32(rp.grad.f32(), rs.scratchShard.f32(),
                   static_cast<std::size_t>(l.partitionNumel));
        return;
    }
    // Not partitioned (late, not adopted): an all-reduce, every rank keeps the whole gradient.
    rs.comm->allGather(rs.scratchShard.data(), padded, shardBytes).wait();
    waiting.reset();
    ended();
    mem.addF32(rp.grad.f32(), padded, static_cast<std::size_t>(l.numel));
}

std::span<float> Engine::shardData(int rank, ParamId p)
{
    RankState &rs = d->rankState(rank);
    const ParamInfo &info = d->params[p];
    if (info.dtype != DType::F32)
        throw EngineError("shardData(" + info.name + "): fp32 parameters only");
    RankParam &rp = rs.params[p];
    d->complete(rs, p); // a gather in flight still reads the shard
    if (info.partitioned || info.persistent)
        return {rp.shard.f32(), static_cast<std::size_t>(info.layout.partitionNumel)};
    return {rp.full.f32(), static_cast<std::size_t>(info.numel)};
}

std::span<float> Engine::shardGrad(int rank, ParamId p)
{
    RankState &rs = d->rankState(rank);
    const comm::Buffer &g = rs.params[p].grad;
    return {g.f32(), g.size() / sizeof(float)};
}

void Engine::zeroGrads(int rank)
{
    RankState &rs = d->rankState(rank);
    for (RankParam &rp : rs.params)
        if (!rp.grad.empty()) rs.mem->zero(rp.grad.data(), rp.grad.size());
}

void Engine::refreshPersistent(int rank)
{
    RankState &rs = d->rankState(rank);
    rs.comm->waitForCompute(); // the optimizer just wrote the shards
    std::vector<comm::CommHandle> pending;
    for (ParamId p = 0; p < d->params.size(); ++p) {
        const ParamInfo &info = d->params[p];
        if (info.removed || !info.persistent) continue;
        RankParam &rp = rs.params[p];
        pending.push_back(rs.comm->allGather(rp.shard.data(), rp.full.data(), rp.shard.size()));
    }
    for (const comm::CommHandle &h : pending)
        h.wait();
}

} // namespace shardscope::core

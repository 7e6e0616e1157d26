// The GPU training run. The model is built once on a one-rank CPU Engine with the
// trainer's own nn::buildModel, so module ids, parameter ids, names, initial values,
// persistence, late parameters and external registrations are exactly the CPU run's;
// then every rank moves its shards to its GPU and trains there.

#include "cuda/gputrainer.h"

#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/cpucommunicator.h"
#include "core/engine.h"
#include "core/partition.h"
#include "cuda/backendselect.h"
#include "cuda/blas.h"
#include "cuda/cudacheck.h"
#include "cuda/devicebuffer.h"
#include "cuda/layers.h"
#include "cuda/ncclcommunicator.h"
#include "cuda/rendezvous.h"
#include "nn/markov.h"
#include "telemetry/clock.h"

namespace shardscope::gpu {

namespace {

constexpr float kLayerNormEps = 1e-5f;

// What every rank needs to know about one parameter, taken from the CPU model engine.
struct ParamSpec
{
    ParamId id = kNoParam;
    ModuleId owner = kNoModule;
    std::string name;
    std::int64_t numel = 0;
    bool partitioned = false;
    bool late = false;
    bool decays = false; // AdamW decay: matrices and weight_v, as the CPU trainer
    PartitionLayout layout;
    std::vector<float> init; // the full initial tensor
};

struct ModuleSpec
{
    ModuleId id = kNoModule;
    std::string path;
    std::vector<std::size_t> fetch; // indices into Model::params: owned + registered externals
};

struct BlockIds
{
    ModuleId block = kNoModule, ln = kNoModule, fc1 = kNoModule, fc2 = kNoModule;
    std::size_t lnW = 0, lnB = 0, fc1W = 0, fc1B = 0, fc2W = 0, fc2B = 0;
};

// The model as built by nn::buildModel, flattened for the GPU ranks.
struct Model
{
    std::vector<ParamSpec> params;
    std::vector<ModuleSpec> modules; // index == ModuleId
    std::size_t embedW = 0, convG = 0, convV = 0, convB = 0, lnfW = 0, lnfB = 0, headB = 0;
    ModuleId embed = kNoModule, posConv = kNoModule, lnf = kNoModule, head = kNoModule;
    std::vector<BlockIds> blocks;
    std::uint64_t buildAccesses = 0; // unregistered accesses while building (per rank)
    std::uint64_t lateCount = 0;     // late parameters never adopted
};

std::size_t indexOf(const Model &m, const Engine &engine, const std::string &name)
{
    const ParamId id = engine.findParam(name);
    for (std::size_t i = 0; i < m.params.size(); ++i)
        if (m.params[i].id == id) return i;
    throw EngineError("the GPU trainer expected parameter `" + name +
                      "` in the model that nn::buildModel made; the CPU and GPU trainers disagree");
}

ModuleId moduleOf(const Engine &engine, const std::string &path)
{
    const ModuleId id = engine.findModule(path);
    if (id == kNoModule)
        throw EngineError(
            "the GPU trainer expected module `" + path +
            "` in the model that nn::buildModel made; the CPU and GPU trainers disagree");
    return id;
}

Model buildModelSpec(const nn::TrainConfig &config, int worldSize)
{
    nn::TrainConfig one = config;
    one.worldSize = 1;
    Engine engine(nn::makeEngineConfig(one), makeCpuWorld(1));
    nn::buildModel(engine, one);

    Model m;
    for (std::size_t id = 0; id < engine.paramCount(); ++id) {
        const ParamInfo &info = engine.param(static_cast<ParamId>(id));
        if (info.removed) continue;
        if (info.dtype != DType::F32)
            throw EngineError("the GPU trainer handles fp32 parameters only; `" + info.name +
                              "` is " + std::string(dtypeName(info.dtype)));
        ParamSpec p;
        p.id = info.id;
        p.owner = info.owner;
        p.name = info.name;
        p.numel = info.numel;
        p.partitioned = info.partitioned;
        p.late = info.late && !info.partitioned && !info.persistent; // late and never adopted
        p.decays = info.shape.size() == 2 || info.localName == "weight_v";
        p.layout = PartitionLayout::make(info.numel, worldSize);
        const std::span<float> whole = engine.shardData(0, info.id); // world 1: the whole tensor
        p.init.assign(whole.begin(), whole.begin() + info.numel);
        if (p.late) ++m.lateCount;
        m.params.push_back(std::move(p));
    }
    m.modules.resize(engine.moduleCount());
    for (std::size_t mid = 0; mid < engine.moduleCount(); ++mid) {
        const ModuleInfo &info = engine.module(static_cast<ModuleId>(mid));
        ModuleSpec &spec = m.modules[mid];
        spec.id = info.id;
        spec.path = info.path;
        for (std::size_t i = 0; i < m.params.size(); ++i) {
            const ParamSpec &p = m.params[i];
            if (p.owner == info.id || engine.isExternal(0, info.id, p.id)) spec.fetch.push_back(i);
        }
    }
    m.embed = moduleOf(engine, "embed");
    m.posConv = moduleOf(engine, "pos_conv");
    m.lnf = moduleOf(engine, "ln_f");
    m.head = moduleOf(engine, "lm_head");
    m.embedW = indexOf(m, engine, "embed.weight");
    m.convG = indexOf(m, engine, "pos_conv.weight_g");
    m.convV = indexOf(m, engine, "pos_conv.weight_v");
    m.convB = indexOf(m, engine, "pos_conv.bias");
    m.lnfW = indexOf(m, engine, "ln_f.weight");
    m.lnfB = indexOf(m, engine, "ln_f.bias");
    m.headB = indexOf(m, engine, "lm_head.bias");
    for (int i = 0; i < config.layers; ++i) {
        const std::string b = "blocks." + std::to_string(i);
        BlockIds ids;
        ids.block = moduleOf(engine, b);
        ids.ln = moduleOf(engine, b + ".ln");
        ids.fc1 = moduleOf(engine, b + ".fc1");
        ids.fc2 = moduleOf(engine, b + ".fc2");
        ids.lnW = indexOf(m, engine, b + ".ln.weight");
        ids.lnB = indexOf(m, engine, b + ".ln.bias");
        ids.fc1W = indexOf(m, engine, b + ".fc1.weight");
        ids.fc1B = indexOf(m, engine, b + ".fc1.bias");
        ids.fc2W = indexOf(m, engine, b + ".fc2.weight");
        ids.fc2B = indexOf(m, engine, b + ".fc2.bias");
        m.blocks.push_back(ids);
    }
    m.buildAccesses = engine.unregisteredAccessCount();
    return m;
}

// State shared by the rank threads of this process.
struct Shared
{
    const nn::TrainConfig *config = nullptr;
    const Model *model = nullptr;
    EventSink *sink = nullptr;
    int worldSize = 1;
    std::atomic<std::uint64_t> unregistered{0};
    std::atomic<std::uint64_t> gatheredBytes{0};
    std::vector<NcclCommunicator *> comms; // to abort every local rank when one fails
};

// One parameter on one rank's GPU.
struct DeviceParam
{
    const ParamSpec *spec = nullptr;
    DeviceBuffer data;     // partitioned: the shard (partitionNumel); otherwise the whole tensor
    DeviceBuffer grad;     // same size as data: the reduced gradient of this rank's part
    DeviceBuffer m, v;     // Adam moments, same size
    DeviceBuffer fullGrad; // the local full gradient (padded numel), summed over ranks into grad
    float *gathered = nullptr;
    ParamStatus status = ParamStatus::NotAvailable;
    CommHandle handle;
    std::set<ModuleId> active;
    ModuleId cause = kNoModule;
    FetchReason reason = FetchReason::Forward;
    nvtxRangeId_t range = 0;

    bool whole() const { return !spec->partitioned; }
    const float *full() const { return whole() ? data.f32() : gathered; }
};

class RankRun
{
  public:
    RankRun(Shared &shared, NcclCommunicator &comm, int localBatch, int batchOffset);
    ~RankRun();
    double step(int stepNo); // returns this rank's summed token loss

  private:
    void emit(EventType type, std::uint8_t flags, std::uint32_t a, std::uint32_t b,
              std::uint64_t u0 = 0, std::uint64_t u1 = 0, std::uint64_t u2 = 0);
    void enter(ModuleId module, Phase phase);
    void exit(ModuleId module, Phase phase);
    void fetch(std::size_t p, ModuleId cause, FetchReason reason);
    void waitAvailable(std::size_t p);
    void pollInflight();
    void release(std::size_t p, ModuleId cause);
    void prefetchAfter(ModuleId module, Phase phase);
    const float *use(std::size_t p, ModuleId accessor, Phase phase);
    float *gradOf(std::size_t p) { return m_params[p].fullGrad.f32(); }
    void initialBroadcast();
    void forward();
    void backward();
    void reduceAndUpdate(int stepNo);

    Shared &m_shared;
    const nn::TrainConfig &m_cfg;
    const Model &m_model;
    NcclCommunicator &m_comm;
    int m_rank;
    std::uint32_t m_step = 0;
    std::vector<DeviceParam> m_params;
    std::vector<std::vector<std::size_t>> m_externals; // per module: auto-registered params
    std::set<std::uint64_t> m_violationsThisStep;
    std::vector<ModuleId> m_order[2]; // forward / backward module order (modules with parameters)
    Stream m_compute;
    Blas m_blas;
    nn::MarkovStream m_stream;
    int m_first; // this rank's first sequence of the global batch
    int m_batch; // sequences on this rank
    int m_rows;  // m_batch * seq
    std::int64_t m_peakGathered = 0;
    std::int64_t m_liveGathered = 0;
    double m_globalTokens;
    std::vector<std::int32_t> m_hostTokens, m_hostTargets;

    // Activations and their gradients.
    DeviceBuffer m_tokens, m_targets, m_e, m_convW, m_convNorms, m_convOut, m_h0;
    std::vector<DeviceBuffer> m_hin, m_lnOut, m_lnMean, m_lnRstd, m_u, m_a;
    DeviceBuffer m_hL, m_lnfOut, m_lnfMean, m_lnfRstd, m_logits, m_dLogits, m_rowLoss;
    DeviceBuffer m_dh, m_dtmp, m_dwide, m_dwide2, m_dConvW, m_dConvOut;
};

RankRun::RankRun(Shared &shared, NcclCommunicator &comm, int localBatch, int batchOffset)
    : m_shared(shared), m_cfg(*shared.config), m_model(*shared.model), m_comm(comm),
      m_rank(comm.rank()), m_compute((setDevice(comm.device()), Stream())),
      m_blas(comm.device(), m_compute.get()), m_stream(shared.config->seed, shared.config->vocab),
      m_first(batchOffset), m_batch(localBatch), m_rows(localBatch * shared.config->seq),
      m_globalTokens(static_cast<double>(shared.config->batch) * shared.config->seq)
{
    m_comm.setOrderAfterCompute(false);
    m_comm.setComputeStream(m_compute.get());
    // Gathered tensors come from the stream-ordered pool; keep its memory between steps
    // instead of returning it to the driver at every synchronisation.
    cudaMemPool_t pool = nullptr;
    SHARDSCOPE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, comm.device()));
    std::uint64_t keep = UINT64_MAX;
    SHARDSCOPE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    const int world = m_shared.worldSize;
    m_params.resize(m_model.params.size());
    for (std::size_t i = 0; i < m_params.size(); ++i) {
        DeviceParam &p = m_params[i];
        p.spec = &m_model.params[i];
        const std::int64_t n = p.whole() ? p.spec->numel : p.spec->layout.partitionNumel;
        p.data = DeviceBuffer(n * sizeof(float));
        p.grad = DeviceBuffer(n * sizeof(float));
        p.m = DeviceBuffer(n * sizeof(float));
        p.v = DeviceBuffer(n * sizeof(float));
        p.fullGrad =
            DeviceBuffer(PartitionLayout::make(p.spec->numel, world).paddedNumel * sizeof(float));
        p.status = p.whole() ? ParamStatus::Available : ParamStatus::NotAvailable;
    }
    m_externals.resize(m_model.modules.size());

    std::vector<ModuleId> fwd = {m_model.embed, m_model.posConv};
    for (const BlockIds &b : m_model.blocks) {
        fwd.push_back(b.ln);
        fwd.push_back(b.fc1);
        fwd.push_back(b.fc2);
    }
    fwd.push_back(m_model.lnf);
    fwd.push_back(m_model.head);
    m_order[0] = fwd;
    m_order[1].assign(fwd.rbegin(), fwd.rend());

    const int H = m_cfg.hidden, V = m_cfg.vocab, F = 4 * m_cfg.hidden, R = m_rows;
    const auto f = [](std::int64_t n) { return DeviceBuffer(n * sizeof(float)); };
    m_tokens = DeviceBuffer(static_cast<std::size_t>(R) * sizeof(std::int32_t));
    m_targets = DeviceBuffer(static_cast<std::size_t>(R) * sizeof(std::int32_t));
    m_e = f(std::int64_t(R) * H);
    m_convW = f(m_model.params[m_model.convV].numel);
    m_dConvW = f(m_model.params[m_model.convV].numel);
    m_convNorms = f(m_cfg.kernel);
    m_convOut = f(std::int64_t(R) * H);
    m_dConvOut = f(std::int64_t(R) * H);
    m_h0 = f(std::int64_t(R) * H);
    for (std::size_t i = 0; i < m_model.blocks.size(); ++i) {
        m_hin.push_back(f(std::int64_t(R) * H));
        m_lnOut.push_back(f(std::int64_t(R) * H));
        m_lnMean.push_back(f(R));
        m_lnRstd.push_back(f(R));
        m_u.push_back(f(std::int64_t(R) * F));
        m_a.push_back(f(std::int64_t(R) * F));
    }
    m_hL = f(std::int64_t(R) * H);
    m_lnfOut = f(std::int64_t(R) * H);
    m_lnfMean = f(R);
    m_lnfRstd = f(R);
    m_logits = f(std::int64_t(R) * V);
    m_dLogits = f(std::int64_t(R) * V);
    m_rowLoss = DeviceBuffer(static_cast<std::size_t>(R) * sizeof(double));
    m_dh = f(std::int64_t(R) * H);
    m_dtmp = f(std::int64_t(R) * H);
    m_dwide = f(std::int64_t(R) * F);
    m_dwide2 = f(std::int64_t(R) * F);
    initialBroadcast();
}

RankRun::~RankRun()
{
    cudaSetDevice(m_comm.device());
    cudaStreamSynchronize(m_compute.get());
    cudaStreamSynchronize(m_comm.commStream());
    for (DeviceParam &p : m_params)
        if (p.gathered) cudaFree(p.gathered);
}

void RankRun::emit(EventType type, std::uint8_t flags, std::uint32_t a, std::uint32_t b,
                   std::uint64_t u0, std::uint64_t u1, std::uint64_t u2)
{
    if (!m_shared.sink) return;
    m_shared.sink->write(
        Event{nowNs(), m_step, static_cast<std::uint16_t>(m_rank), type, flags, a, b, u0, u1, u2});
}

// zero.Init: rank 0's initial values reach every rank by broadcast, and each rank keeps
// its own shard of them.
void RankRun::initialBroadcast()
{
    for (std::size_t i = 0; i < m_params.size(); ++i) {
        DeviceParam &p = m_params[i];
        const ParamSpec &s = *p.spec;
        const std::int64_t padded = s.layout.paddedNumel;
        DeviceBuffer full(padded * sizeof(float));
        if (m_rank == 0) full.upload(s.init.data(), s.init.size() * sizeof(float));
        const std::string label =
            "broadcast " + s.name + " (module " + m_model.modules[s.owner].path + ", root 0)";
        nvtxRangePushA(label.c_str());
        emit(EventType::Broadcast, 0, s.id, 0, s.numel * sizeof(float));
        m_comm.broadcast(full.data(), padded * sizeof(float), 0).wait();
        nvtxRangePop();
        const float *from = p.whole() ? full.f32() : full.f32() + s.layout.offset(m_rank);
        const std::int64_t count = p.whole() ? s.numel : s.layout.partitionNumel;
        SHARDSCOPE_CUDA_CHECK(cudaMemcpyAsync(p.data.data(), from, count * sizeof(float),
                                              cudaMemcpyDeviceToDevice, m_comm.commStream()));
        SHARDSCOPE_CUDA_CHECK(cudaStreamSynchronize(m_comm.commStream()));
    }
    for (std::size_t i = 0; i < m_params.size(); ++i)
        if (m_params[i].spec->late)
            emit(EventType::LateParameter, 0, m_params[i].spec->owner, m_params[i].spec->id);
}

void RankRun::fetch(std::size_t i, ModuleId cause, FetchReason reason)
{
    DeviceParam &p = m_params[i];
    if (p.whole() || p.status != ParamStatus::NotAvailable) return;
    const ParamSpec &s = *p.spec;
    const std::size_t shardBytes = s.layout.partitionNumel * sizeof(float);
    const std::size_t fullBytes = shardBytes * m_shared.worldSize;
    void *buf = nullptr;
    SHARDSCOPE_CUDA_CHECK(cudaMallocAsync(&buf, fullBytes, m_comm.commStream()));
    p.gathered = static_cast<float *>(buf);
    p.cause = cause;
    p.reason = reason;
    const std::string label =
        "fetch " + s.name + " (module " +
        (cause == kNoModule ? std::string("<none>") : m_model.modules[cause].path) + ", " +
        std::string(fetchReasonName(reason)) + ")";
    p.range = nvtxRangeStartA(label.c_str());
    emit(EventType::FetchBegin, static_cast<std::uint8_t>(reason), s.id, cause,
         s.numel * sizeof(float));
    p.status = ParamStatus::Inflight;
    p.handle = m_comm.allGather(p.data.data(), p.gathered, shardBytes);
    m_shared.gatheredBytes.fetch_add(fullBytes, std::memory_order_relaxed);
    m_liveGathered += static_cast<std::int64_t>(fullBytes);
    m_peakGathered = std::max(m_peakGathered, m_liveGathered);
}

void RankRun::waitAvailable(std::size_t i)
{
    DeviceParam &p = m_params[i];
    if (p.status != ParamStatus::Inflight) return;
    p.handle.wait();
    p.handle = CommHandle();
    p.status = ParamStatus::Available;
    nvtxRangeEnd(p.range);
    emit(EventType::FetchEnd, static_cast<std::uint8_t>(p.reason), p.spec->id, p.cause,
         p.spec->numel * sizeof(float));
}

// A prefetched gather becomes AVAILABLE as soon as its event is seen complete.
void RankRun::pollInflight()
{
    for (std::size_t i = 0; i < m_params.size(); ++i)
        if (m_params[i].status == ParamStatus::Inflight && m_params[i].handle.ready())
            waitAvailable(i);
}

void RankRun::release(std::size_t i, ModuleId cause)
{
    DeviceParam &p = m_params[i];
    if (p.whole() || !p.active.empty() || p.status == ParamStatus::NotAvailable) return;
    waitAvailable(i);
    const std::string label =
        "release " + p.spec->name + " (module " +
        (cause == kNoModule ? std::string("<none>") : m_model.modules[cause].path) + ")";
    nvtxRangePushA(label.c_str());
    // Freed in the compute stream's order: after the kernels that read it.
    SHARDSCOPE_CUDA_CHECK(cudaFreeAsync(p.gathered, m_compute.get()));
    p.gathered = nullptr;
    p.status = ParamStatus::NotAvailable;
    m_liveGathered -= static_cast<std::int64_t>(p.spec->layout.paddedNumel * sizeof(float));
    emit(EventType::Release, 0, p.spec->id, cause, p.spec->numel * sizeof(float));
    nvtxRangePop();
}

void RankRun::enter(ModuleId module, Phase phase)
{
    emit(EventType::ModuleEnter, static_cast<std::uint8_t>(phase), module, 0);
    pollInflight();
    const FetchReason reason =
        phase == Phase::Forward ? FetchReason::Forward : FetchReason::Backward;
    std::vector<std::size_t> want = m_model.modules[module].fetch;
    want.insert(want.end(), m_externals[module].begin(), m_externals[module].end());
    for (std::size_t i : want)
        fetch(i, module, reason);
    prefetchAfter(module, phase);
    for (std::size_t i : want) {
        waitAvailable(i);
        m_params[i].active.insert(module);
    }
}

void RankRun::exit(ModuleId module, Phase phase)
{
    std::vector<std::size_t> held;
    for (std::size_t i = 0; i < m_params.size(); ++i)
        if (m_params[i].active.erase(module)) held.push_back(i);
    for (std::size_t i : held)
        release(i, module);
    emit(EventType::ModuleExit, static_cast<std::uint8_t>(phase), module, 0);
}

// Gathers the next module's parameters on the communication stream now, so they arrive
// while this module computes.
void RankRun::prefetchAfter(ModuleId module, Phase phase)
{
    const std::vector<ModuleId> &order = m_order[phase == Phase::Forward ? 0 : 1];
    const auto it = std::find(order.begin(), order.end(), module);
    if (it == order.end() || it + 1 == order.end()) return;
    const ModuleId next = *(it + 1);
    std::vector<std::size_t> want = m_model.modules[next].fetch;
    want.insert(want.end(), m_externals[next].begin(), m_externals[next].end());
    for (std::size_t i : want)
        fetch(i, next, FetchReason::Prefetch);
}

// The access guard, as core/Engine applies it.
const float *RankRun::use(std::size_t i, ModuleId accessor, Phase phase)
{
    DeviceParam &p = m_params[i];
    const ModuleSpec &mod = m_model.modules[accessor];
    const bool owned = std::find(mod.fetch.begin(), mod.fetch.end(), i) != mod.fetch.end() ||
                       std::find(m_externals[accessor].begin(), m_externals[accessor].end(), i) !=
                           m_externals[accessor].end();
    if (owned) return p.full();
    const GuardPolicy policy = m_cfg.guard;
    const ParamStatus st = p.status;
    const std::string accessorPath = mod.path;
    const std::string ownerPath = m_model.modules[p.spec->owner].path;
    const std::string fix =
        "register_external_parameter(" + accessorPath + ", " + p.spec->name + ")";
    const GuardAction action = policy == GuardPolicy::Error  ? GuardAction::Raised
                               : policy == GuardPolicy::Auto ? GuardAction::AutoRegistered
                                                             : GuardAction::Gathered;
    const std::uint64_t key = (static_cast<std::uint64_t>(accessor) << 32) | p.spec->id;
    if (m_violationsThisStep.insert(key).second) {
        emit(EventType::UnregisteredAccess,
             static_cast<std::uint8_t>(static_cast<std::uint8_t>(st) |
                                       (static_cast<std::uint8_t>(action) << 4)),
             accessor, p.spec->id, p.spec->owner);
        m_shared.unregistered.fetch_add(1, std::memory_order_relaxed);
    }
    if (action == GuardAction::Raised)
        throw UnregisteredAccessError("module `" + accessorPath + "` read `" + p.spec->name +
                                          "` owned by `" + ownerPath + "` while it was " +
                                          std::string(statusName(st)) + " on rank " +
                                          std::to_string(m_rank) + "; call " + fix,
                                      fix);
    if (action == GuardAction::AutoRegistered) {
        m_externals[accessor].push_back(i);
        emit(EventType::ExternalRegister, 1, accessor, p.spec->id);
    }
    fetch(i, accessor, FetchReason::Guard);
    waitAvailable(i);
    p.active.insert(accessor);
    (void)phase;
    return p.full();
}

void RankRun::forward()
{
    const nn::TrainConfig &c = m_cfg;
    const int H = c.hidden, V = c.vocab, F = 4 * c.hidden, R = m_rows;
    const cudaStream_t s = m_compute.get();
    const Model &M = m_model;

    emit(EventType::ModuleEnter, static_cast<std::uint8_t>(Phase::Forward), 0,
         0); // the root module
    enter(M.embed, Phase::Forward);
    embeddingForward(m_tokens.i32(), R, use(M.embedW, M.embed, Phase::Forward), V, H, m_e.f32(), s);
    exit(M.embed, Phase::Forward);

    enter(M.posConv, Phase::Forward);
    const ConvShape cs{m_batch, c.seq, H, c.kernel, c.groups};
    weightNormForward(use(M.convV, M.posConv, Phase::Forward),
                      use(M.convG, M.posConv, Phase::Forward), H, H / c.groups, c.kernel,
                      m_convW.f32(), m_convNorms.f32(), s);
    conv1dForward(cs, m_e.f32(), m_convW.f32(), use(M.convB, M.posConv, Phase::Forward),
                  m_convOut.f32(), s);
    geluForward(m_convOut.f32(), std::int64_t(R) * H, m_h0.f32(), s);
    addInPlace(m_h0.f32(), m_e.f32(), std::int64_t(R) * H, s);
    exit(M.posConv, Phase::Forward);

    const float *h = m_h0.f32();
    for (std::size_t i = 0; i < M.blocks.size(); ++i) {
        const BlockIds &b = M.blocks[i];
        const std::int64_t n = std::int64_t(R) * H;
        SHARDSCOPE_CUDA_CHECK(
            cudaMemcpyAsync(m_hin[i].data(), h, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
        float *next = (i + 1 < M.blocks.size()) ? m_hin[i + 1].f32() : m_hL.f32();
        emit(EventType::ModuleEnter, 0, b.block, 0);
        enter(b.ln, Phase::Forward);
        layerNormForward(m_hin[i].f32(), R, H, use(b.lnW, b.ln, Phase::Forward),
                         use(b.lnB, b.ln, Phase::Forward), kLayerNormEps, m_lnOut[i].f32(),
                         m_lnMean[i].f32(), m_lnRstd[i].f32(), s);
        exit(b.ln, Phase::Forward);
        enter(b.fc1, Phase::Forward);
        m_blas.linearForward(m_lnOut[i].f32(), R, H, F, use(b.fc1W, b.fc1, Phase::Forward),
                             use(b.fc1B, b.fc1, Phase::Forward), m_u[i].f32());
        exit(b.fc1, Phase::Forward);
        geluForward(m_u[i].f32(), std::int64_t(R) * F, m_a[i].f32(), s);
        enter(b.fc2, Phase::Forward);
        m_blas.linearForward(m_a[i].f32(), R, F, H, use(b.fc2W, b.fc2, Phase::Forward),
                             use(b.fc2B, b.fc2, Phase::Forward), next);
        exit(b.fc2, Phase::Forward);
        addInPlace(next, m_hin[i].f32(), n, s);
        emit(EventType::ModuleExit, 0, b.block, 0);
        h = next;
    }
    if (M.blocks.empty())
        SHARDSCOPE_CUDA_CHECK(cudaMemcpyAsync(m_hL.data(), m_h0.data(),
                                              std::size_t(R) * H * sizeof(float),
                                              cudaMemcpyDeviceToDevice, s));

    enter(M.lnf, Phase::Forward);
    layerNormForward(m_hL.f32(), R, H, use(M.lnfW, M.lnf, Phase::Forward),
                     use(M.lnfB, M.lnf, Phase::Forward), kLayerNormEps, m_lnfOut.f32(),
                     m_lnfMean.f32(), m_lnfRstd.f32(), s);
    exit(M.lnf, Phase::Forward);

    enter(M.head, Phase::Forward);
    m_blas.linearForward(m_lnfOut.f32(), R, H, V, use(M.embedW, M.head, Phase::Forward),
                         use(M.headB, M.head, Phase::Forward), m_logits.f32());
    crossEntropy(m_logits.f32(), R, V, m_targets.i32(), m_globalTokens, m_dLogits.f32(),
                 m_rowLoss.f64(), s);
    exit(M.head, Phase::Forward);
    emit(EventType::ModuleExit, static_cast<std::uint8_t>(Phase::Forward), 0, 0);
}

void RankRun::backward()
{
    const nn::TrainConfig &c = m_cfg;
    const int H = c.hidden, V = c.vocab, F = 4 * c.hidden, R = m_rows;
    const std::int64_t n = std::int64_t(R) * H;
    const cudaStream_t s = m_compute.get();
    const Model &M = m_model;

    emit(EventType::ModuleEnter, static_cast<std::uint8_t>(Phase::Backward), 0, 0);
    enter(M.head, Phase::Backward);
    m_blas.linearBackward(m_lnfOut.f32(), R, H, V, use(M.embedW, M.head, Phase::Backward),
                          m_dLogits.f32(), m_dtmp.f32(), gradOf(M.embedW), gradOf(M.headB));
    exit(M.head, Phase::Backward);

    enter(M.lnf, Phase::Backward);
    layerNormBackward(m_hL.f32(), R, H, use(M.lnfW, M.lnf, Phase::Backward), m_lnfMean.f32(),
                      m_lnfRstd.f32(), m_dtmp.f32(), m_dh.f32(), gradOf(M.lnfW), gradOf(M.lnfB), s);
    exit(M.lnf, Phase::Backward);

    for (std::size_t k = M.blocks.size(); k-- > 0;) {
        const BlockIds &b = M.blocks[k];
        emit(EventType::ModuleEnter, 1, b.block, 0);
        enter(b.fc2, Phase::Backward);
        m_blas.linearBackward(m_a[k].f32(), R, F, H, use(b.fc2W, b.fc2, Phase::Backward),
                              m_dh.f32(), m_dwide.f32(), gradOf(b.fc2W), gradOf(b.fc2B));
        exit(b.fc2, Phase::Backward);
        geluBackward(m_u[k].f32(), std::int64_t(R) * F, m_dwide.f32(), m_dwide2.f32(), s);
        enter(b.fc1, Phase::Backward);
        m_blas.linearBackward(m_lnOut[k].f32(), R, H, F, use(b.fc1W, b.fc1, Phase::Backward),
                              m_dwide2.f32(), m_dtmp.f32(), gradOf(b.fc1W), gradOf(b.fc1B));
        exit(b.fc1, Phase::Backward);
        enter(b.ln, Phase::Backward);
        float *dIn = m_dConvOut.f32(); // scratch [R,H] until the pos_conv backward
        layerNormBackward(m_hin[k].f32(), R, H, use(b.lnW, b.ln, Phase::Backward),
                          m_lnMean[k].f32(), m_lnRstd[k].f32(), m_dtmp.f32(), dIn, gradOf(b.lnW),
                          gradOf(b.lnB), s);
        exit(b.ln, Phase::Backward);
        addInPlace(m_dh.f32(), dIn, n, s); // the residual: d(hin) = d(out) + d(ln path)
        emit(EventType::ModuleExit, 1, b.block, 0);
    }

    // h0 = e + gelu(conv(e)): dE = dh + conv^T(dh * gelu'(convOut)).
    enter(M.posConv, Phase::Backward);
    const ConvShape cs{m_batch, c.seq, H, c.kernel, c.groups};
    geluBackward(m_convOut.f32(), n, m_dh.f32(), m_dConvOut.f32(), s);
    SHARDSCOPE_CUDA_CHECK(cudaMemsetAsync(m_dConvW.data(), 0, m_dConvW.bytes(), s));
    conv1dBackward(cs, m_e.f32(), m_convW.f32(), m_dConvOut.f32(), m_dtmp.f32(), m_dConvW.f32(),
                   gradOf(M.convB), s);
    weightNormBackward(use(M.convV, M.posConv, Phase::Backward),
                       use(M.convG, M.posConv, Phase::Backward), m_convNorms.f32(), m_dConvW.f32(),
                       H, H / c.groups, c.kernel, gradOf(M.convV), gradOf(M.convG), s);
    addInPlace(m_dh.f32(), m_dtmp.f32(), n, s);
    exit(M.posConv, Phase::Backward);

    enter(M.embed, Phase::Backward);
    use(M.embedW, M.embed, Phase::Backward);
    embeddingBackward(m_tokens.i32(), R, m_dh.f32(), V, H, gradOf(M.embedW), s);
    exit(M.embed, Phase::Backward);
    emit(EventType::ModuleExit, static_cast<std::uint8_t>(Phase::Backward), 0, 0);
}

// ZeRO-3's step end: gradients reduce-scattered to their shards (all-reduced for whole
// parameters), Adam on each rank's own part, on the GPU.
void RankRun::reduceAndUpdate(int stepNo)
{
    const cudaStream_t s = m_compute.get();
    m_comm.commWaitFor(s);
    for (DeviceParam &p : m_params) {
        if (p.whole())
            m_comm.allReduceSum(p.fullGrad.f32(), p.grad.f32(),
                                static_cast<std::size_t>(p.spec->numel));
        else
            m_comm.reduceScatter(p.fullGrad.data(), p.grad.data(),
                                 static_cast<std::size_t>(p.spec->layout.partitionNumel),
                                 DType::F32);
    }
    m_comm.streamWaitComm(s);
    AdamParams ap;
    ap.lr = m_cfg.lr;
    ap.beta1 = m_cfg.beta1;
    ap.beta2 = m_cfg.beta2;
    ap.eps = m_cfg.eps;
    ap.step = stepNo;
    for (DeviceParam &p : m_params) {
        const std::int64_t count = p.whole() ? p.spec->numel : p.spec->layout.partitionNumel;
        ap.weightDecay = p.spec->decays ? m_cfg.weightDecay : 0.0f;
        adamStep(p.data.f32(), p.grad.f32(), p.m.f32(), p.v.f32(), count, ap, s);
    }
    // The next step's gathers read the updated shards.
    m_comm.commWaitFor(s);
}

double RankRun::step(int stepNo)
{
    SHARDSCOPE_CUDA_CHECK(cudaSetDevice(m_comm.device()));
    m_step = static_cast<std::uint32_t>(stepNo);
    m_violationsThisStep.clear();
    emit(EventType::StepBegin, 0, 0, 0);
    const cudaStream_t s = m_compute.get();
    // The CPU trainer's batch: sequence j of the step is MarkovStream::sequence(step, j).
    const int T = m_cfg.seq;
    std::vector<std::int32_t> sequence(static_cast<std::size_t>(T) + 1);
    m_hostTokens.resize(static_cast<std::size_t>(m_rows));
    m_hostTargets.resize(static_cast<std::size_t>(m_rows));
    for (int j = 0; j < m_batch; ++j) {
        m_stream.sequence(static_cast<std::uint32_t>(stepNo), m_first + j, T + 1, sequence.data());
        std::copy_n(sequence.begin(), T, m_hostTokens.begin() + std::int64_t(j) * T);
        std::copy_n(sequence.begin() + 1, T, m_hostTargets.begin() + std::int64_t(j) * T);
    }
    const std::vector<std::int32_t> &tok = m_hostTokens;
    const std::vector<std::int32_t> &tgt = m_hostTargets;
    SHARDSCOPE_CUDA_CHECK(cudaMemcpyAsync(
        m_tokens.data(), tok.data(), tok.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, s));
    SHARDSCOPE_CUDA_CHECK(cudaMemcpyAsync(m_targets.data(), tgt.data(),
                                          tgt.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                                          s));
    for (DeviceParam &p : m_params)
        SHARDSCOPE_CUDA_CHECK(cudaMemsetAsync(p.fullGrad.data(), 0, p.fullGrad.bytes(), s));

    forward();
    backward();
    reduceAndUpdate(stepNo);

    std::vector<double> rowLoss(static_cast<std::size_t>(m_rows));
    SHARDSCOPE_CUDA_CHECK(cudaMemcpyAsync(rowLoss.data(), m_rowLoss.data(),
                                          rowLoss.size() * sizeof(double), cudaMemcpyDeviceToHost,
                                          s));
    m_compute.synchronize();
    double local = 0.0;
    for (double x : rowLoss)
        local += x;
    const double global = m_comm.allReduceHost(local);
    const double loss = global / m_globalTokens;
    std::int64_t partitionedBytes = 0;
    for (const DeviceParam &p : m_params)
        partitionedBytes += static_cast<std::int64_t>(p.data.bytes());
    const auto live = static_cast<std::uint64_t>(m_liveGathered) / sizeof(float);
    emit(EventType::MemorySample, 0, static_cast<std::uint32_t>(live),
         static_cast<std::uint32_t>(live >> 32), static_cast<std::uint64_t>(partitionedBytes),
         static_cast<std::uint64_t>(m_liveGathered), static_cast<std::uint64_t>(m_peakGathered));
    std::uint64_t bits = 0;
    std::memcpy(&bits, &loss, sizeof bits);
    emit(EventType::StepEnd, 0, 0, 0, bits);
    return loss;
}

std::vector<int> splitBatch(int batch, int world)
{
    std::vector<int> sizes(static_cast<std::size_t>(world), batch / world);
    for (int r = 0; r < batch % world; ++r)
        ++sizes[static_cast<std::size_t>(r)];
    return sizes;
}

int offsetOf(const std::vector<int> &sizes, int rank)
{
    int off = 0;
    for (int r = 0; r < rank; ++r)
        off += sizes[static_cast<std::size_t>(r)];
    return off;
}

} // namespace

nn::TrainResult runNcclTraining(const nn::TrainConfig &config, const nn::StepCallback &onStep,
                                EventSink *sink)
{
    const std::string bad = nn::validate(config);
    if (!bad.empty()) throw std::invalid_argument(bad);

    chooseBackend("nccl"); // a CommError saying what is missing (no GPU, driver, NCCL)
    const bool multiProcess = std::getenv("RANK") && std::getenv("WORLD_SIZE");
    NcclLocalWorld comms;
    int world = config.worldSize;
    if (multiProcess) {
        const RendezvousConfig rdzv = rendezvousFromEnv();
        world = rdzv.worldSize;
        std::vector<std::unique_ptr<NcclCommunicator>> one;
        one.push_back(makeNcclRank(rdzv));
        comms = NcclLocalWorld(std::move(one));
    } else {
        int available = 0;
        SHARDSCOPE_CUDA_CHECK(cudaGetDeviceCount(&available));
        if (world > available)
            throw CommError(
                "--world-size " + std::to_string(world) + " with --backend nccl needs " +
                std::to_string(world) + " GPUs (one rank per GPU) but this machine has " +
                std::to_string(available) + "; use --world-size " + std::to_string(available) +
                " or less, or launch one process per GPU with torchrun");
        std::vector<int> devices(static_cast<std::size_t>(world));
        for (int d = 0; d < world; ++d)
            devices[static_cast<std::size_t>(d)] = d;
        comms = makeNcclLocalWorld(devices);
    }
    if (config.batch < world)
        throw std::invalid_argument("--batch " + std::to_string(config.batch) +
                                    " is smaller than the " + std::to_string(world) +
                                    " ranks; every rank needs a sequence");

    const Model model = buildModelSpec(config, world);
    Shared shared;
    shared.config = &config;
    shared.model = &model;
    shared.sink = sink;
    shared.worldSize = world;
    for (std::size_t i = 0; i < comms.size(); ++i)
        shared.comms.push_back(&comms[i]);
    const std::vector<int> sizes = splitBatch(config.batch, world);

    nn::TrainResult result;
    std::mutex resultMutex;
    std::exception_ptr firstError;
    std::atomic<bool> failed{false};
    const auto start = std::chrono::steady_clock::now();

    // A failing rank records its error first, then aborts every local communicator so
    // that ranks waiting on a collective it will never join are released.
    auto fail = [&](std::exception_ptr error) {
        {
            std::lock_guard lock(resultMutex);
            if (!firstError) firstError = error;
        }
        if (!failed.exchange(true))
            for (NcclCommunicator *c : shared.comms)
                c->abort();
    };
    auto runRank = [&](NcclCommunicator *comm) {
        try {
            const int r = comm->rank();
            RankRun run(shared, *comm, sizes[static_cast<std::size_t>(r)], offsetOf(sizes, r));
            try {
                for (int s = 1; s <= config.steps; ++s) {
                    const auto t0 = std::chrono::steady_clock::now();
                    const double loss = run.step(s);
                    const double secs =
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                            .count();
                    if (comm != &comms.front())
                        continue; // one report per step: the first local rank's
                    std::lock_guard lock(resultMutex);
                    result.losses.push_back(loss);
                    const std::int64_t tokens = std::int64_t(config.batch) * config.seq;
                    result.tokens += tokens;
                    nn::StepReport rep;
                    rep.step = s;
                    rep.steps = config.steps;
                    rep.loss = loss;
                    rep.seconds = secs;
                    rep.tokensPerSecond = secs > 0 ? double(tokens) / secs : 0.0;
                    rep.megabytesGathered = double(shared.gatheredBytes.load()) / 1e6;
                    rep.unregisteredAccesses =
                        shared.unregistered.load() + model.buildAccesses * world;
                    rep.lateParameters = model.lateCount;
                    if (onStep && (!multiProcess || r == 0)) onStep(rep);
                }
            } catch (...) {
                fail(std::current_exception()); // before ~RankRun waits on its streams
                throw;
            }
        } catch (...) {
            fail(std::current_exception());
        }
    };

    if (comms.size() == 1) {
        runRank(&comms.front());
    } else {
        std::vector<std::thread> threads;
        for (std::size_t i = 0; i < comms.size(); ++i)
            threads.emplace_back(runRank, &comms[i]);
        for (std::thread &t : threads)
            t.join();
    }
    if (firstError) std::rethrow_exception(firstError);

    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result.firstLoss = result.losses.empty() ? 0.0 : result.losses.front();
    result.lastLoss = result.losses.empty() ? 0.0 : result.losses.back();
    result.megabytesGathered = double(shared.gatheredBytes.load()) / 1e6;
    result.unregisteredAccesses = shared.unregistered.load() + model.buildAccesses * world;
    result.lateParameters = model.lateCount;
    return result;
}

} // namespace shardscope::gpu

// The GPU training run on core/Engine. The engine does everything ZeRO-3 (fetch, prefetch,
// release, the guard, late parameters, telemetry) on tensors in the ranks' GPU memory;
// this file is the model's CUDA forward and backward, module scope by module scope in
// nn::RankModel's order, and AdamW on the device shards.

#include "cuda/gputrainer.h"

#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/nccl/cudacheck.h"
#include "comm/nccl/ncclcommunicator.h"
#include "comm/tcprendezvous.h"
#include "core/engine.h"
#include "cuda/backendselect.h"
#include "cuda/blas.h"
#include "cuda/devicebuffer.h"
#include "cuda/layers.h"
#include "cuda/nvtxeventsink.h"
#include "nn/markov.h"
#include "nn/model.h"

namespace shardscope::cuda {

namespace {

constexpr float kLayerNormEps = 1e-5f;

ConvShape convShape(const nn::TrainConfig &c, int sequences)
{
    return ConvShape{sequences, c.seq, c.hidden, c.kernel, c.groups, c.causalConv};
}

comm::NcclCommunicator &ncclOf(core::Engine &engine, int rank)
{
    auto *comm = dynamic_cast<comm::NcclCommunicator *>(&engine.comm(rank));
    if (!comm)
        throw core::EngineError("trainOnGpu needs an engine made by cuda::makeNcclEngine; rank " +
                                std::to_string(rank) + " has a " +
                                std::string(comm::backendName(engine.comm(rank).backend())) +
                                " communicator (use nn::trainModel for the CPU backend)");
    return *comm;
}

// "forward blocks.0.fc1" / "backward blocks.0.fc1" for every module: NVTX range names,
// built once before the ranks start.
struct ScopeLabels
{
    std::vector<std::string> forward, backward;

    explicit ScopeLabels(const core::Engine &engine)
    {
        for (std::size_t m = 0; m < engine.moduleCount(); ++m) {
            const std::string path = engine.modulePath(static_cast<ModuleId>(m));
            forward.push_back("forward " + path);
            backward.push_back("backward " + path);
        }
    }
    const std::string &of(ModuleId m, Phase phase) const
    {
        return phase == Phase::Forward ? forward[m] : backward[m];
    }
};

class NvtxRange
{
  public:
    explicit NvtxRange(const std::string &label) { nvtxRangePushA(label.c_str()); }
    ~NvtxRange() { nvtxRangePop(); }
    NvtxRange(const NvtxRange &) = delete;
    NvtxRange &operator=(const NvtxRange &) = delete;
};

// A module scope inside an NVTX range of the same name (the range opens first and closes
// last, so the engine's fetches and releases fall inside it in Nsight).
class Scope
{
  public:
    Scope(core::Engine &engine, int rank, ModuleId module, Phase phase, const ScopeLabels &labels)
        : m_range(labels.of(module, phase)), m_scope(engine, rank, module, phase)
    {
    }

  private:
    NvtxRange m_range;
    core::ModuleScope m_scope;
};

// One rank's model on its GPU: activations, full-size parameter gradients (reduce-scattered
// by the engine when a module's backward ends) and the Adam moments of its shards.
class GpuRank
{
  public:
    GpuRank(core::Engine &engine, int rank, const nn::TrainConfig &config,
            const nn::ModelHandles &h, const ScopeLabels &labels, nn::BatchSlice slice);

    // Uploads the step's tokens, runs forward and backward; returns the rank's summed
    // token loss (its share of the global mean loss times the global token count).
    double forwardBackward(std::uint32_t step);
    void optimizerStep(int step);

  private:
    const float *read(ParamId p) { return m_engine.access(m_rank, p).f32(); }
    float *grad(ParamId p) { return m_grads[p].f32(); }
    void reduce(ParamId p) { m_engine.reduceScatterGrad(m_rank, p, grad(p)); }
    void forward();
    void backward();

    core::Engine &m_engine;
    int m_rank;
    const nn::TrainConfig &m_cfg;
    const nn::ModelHandles &m_h;
    const ScopeLabels &m_labels;
    std::vector<ParamId> m_params;
    cudaStream_t m_stream;
    Blas m_blas;
    nn::MarkovStream m_data;
    nn::BatchSlice m_slice;
    int m_rows;
    double m_globalTokens;
    ConvShape m_conv;
    std::vector<std::int32_t> m_hostTokens, m_hostTargets;

    std::vector<DeviceBuffer> m_grads;          // by ParamId: numel floats
    std::vector<DeviceBuffer> m_adamM, m_adamV; // by ParamId: the shard's size

    DeviceBuffer m_tokens, m_targets, m_e, m_convW, m_convNorms, m_convOut, m_h0;
    std::vector<DeviceBuffer> m_hin, m_lnOut, m_lnMean, m_lnRstd, m_u, m_a;
    DeviceBuffer m_hL, m_lnfOut, m_lnfMean, m_lnfRstd, m_logits, m_dLogits, m_rowLoss;
    DeviceBuffer m_dh, m_dtmp, m_dIn, m_dwide, m_dwide2, m_dConvW, m_dConvOut;
};

GpuRank::GpuRank(core::Engine &engine, int rank, const nn::TrainConfig &config,
                 const nn::ModelHandles &h, const ScopeLabels &labels, nn::BatchSlice slice)
    : m_engine(engine), m_rank(rank), m_cfg(config), m_h(h), m_labels(labels), m_params(h.params()),
      m_stream(ncclOf(engine, rank).computeStream()),
      m_blas(ncclOf(engine, rank).device(), m_stream), m_data(config.seed, config.vocab),
      m_slice(slice), m_rows(slice.count * config.seq),
      m_globalTokens(static_cast<double>(config.batch) * config.seq),
      m_conv(convShape(config, slice.count))
{
    const auto f = [](std::int64_t n) {
        return DeviceBuffer(static_cast<std::size_t>(n) * sizeof(float));
    };
    m_grads.resize(engine.paramCount());
    m_adamM.resize(engine.paramCount());
    m_adamV.resize(engine.paramCount());
    for (ParamId p : m_params) {
        const core::ParamInfo &info = engine.param(p);
        if (info.dtype != DType::F32)
            throw core::EngineError("the GPU trainer handles fp32 parameters only; `" + info.name +
                                    "` is " + std::string(dtypeName(info.dtype)));
        m_grads[p] = f(info.numel);
        const auto shard = static_cast<std::int64_t>(engine.shardData(rank, p).size());
        m_adamM[p] = f(shard);
        m_adamV[p] = f(shard);
    }

    const int H = config.hidden, V = config.vocab, F = 4 * config.hidden, R = m_rows;
    m_tokens = DeviceBuffer(static_cast<std::size_t>(R) * sizeof(std::int32_t));
    m_targets = DeviceBuffer(static_cast<std::size_t>(R) * sizeof(std::int32_t));
    m_e = f(std::int64_t(R) * H);
    m_convW = f(m_conv.weightNumel());
    m_dConvW = f(m_conv.weightNumel());
    m_convNorms = f(config.kernel);
    m_convOut = f(std::int64_t(R) * H);
    m_dConvOut = f(std::int64_t(R) * H);
    m_h0 = f(std::int64_t(R) * H);
    for (int i = 0; i < config.layers; ++i) {
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
    m_dIn = f(std::int64_t(R) * H);
    m_dwide = f(std::int64_t(R) * F);
    m_dwide2 = f(std::int64_t(R) * F);
}

double GpuRank::forwardBackward(std::uint32_t step)
{
    const int T = m_cfg.seq;
    std::vector<std::int32_t> sequence(static_cast<std::size_t>(T) + 1);
    m_hostTokens.resize(static_cast<std::size_t>(m_rows));
    m_hostTargets.resize(static_cast<std::size_t>(m_rows));
    for (int j = 0; j < m_slice.count; ++j) {
        m_data.sequence(step, m_slice.first + j, T + 1, sequence.data());
        std::copy_n(sequence.begin(), T, m_hostTokens.begin() + std::int64_t(j) * T);
        std::copy_n(sequence.begin() + 1, T, m_hostTargets.begin() + std::int64_t(j) * T);
    }
    // Pageable sources are staged before cudaMemcpyAsync returns.
    SHARDSCOPE_CUDA_CHECK(cudaMemcpyAsync(m_tokens.data(), m_hostTokens.data(),
                                          m_hostTokens.size() * sizeof(std::int32_t),
                                          cudaMemcpyHostToDevice, m_stream));
    SHARDSCOPE_CUDA_CHECK(cudaMemcpyAsync(m_targets.data(), m_hostTargets.data(),
                                          m_hostTargets.size() * sizeof(std::int32_t),
                                          cudaMemcpyHostToDevice, m_stream));
    // Gradients accumulate within the step (embed.weight from lm_head and embed); the
    // previous step's reduce-scatters have been consumed by its optimizer step.
    for (ParamId p : m_params)
        SHARDSCOPE_CUDA_CHECK(cudaMemsetAsync(m_grads[p].data(), 0, m_grads[p].bytes(), m_stream));

    forward();
    crossEntropy(m_logits.f32(), m_rows, m_cfg.vocab, m_targets.i32(), m_globalTokens,
                 m_dLogits.f32(), m_rowLoss.f64(), m_stream);
    backward();

    std::vector<double> rowLoss(static_cast<std::size_t>(m_rows));
    SHARDSCOPE_CUDA_CHECK(cudaMemcpyAsync(rowLoss.data(), m_rowLoss.data(),
                                          rowLoss.size() * sizeof(double), cudaMemcpyDeviceToHost,
                                          m_stream));
    SHARDSCOPE_CUDA_CHECK(cudaStreamSynchronize(m_stream));
    double sum = 0.0;
    for (double x : rowLoss)
        sum += x;
    return sum;
}

void GpuRank::forward()
{
    const int H = m_cfg.hidden, V = m_cfg.vocab, F = 4 * m_cfg.hidden, R = m_rows;
    const std::int64_t n = std::int64_t(R) * H;
    const cudaStream_t s = m_stream;
    core::Engine &e = m_engine;
    const int r = m_rank;
    const ScopeLabels &L = m_labels;

    Scope model(e, r, e.root(), Phase::Forward, L);
    {
        Scope scope(e, r, m_h.embed, Phase::Forward, L);
        embeddingForward(m_tokens.i32(), R, read(m_h.embedWeight), V, H, m_e.f32(), s);
    }
    {
        Scope scope(e, r, m_h.posConv, Phase::Forward, L);
        weightNormForward(read(m_h.convV), read(m_h.convG), H, H / m_cfg.groups, m_cfg.kernel,
                          m_convW.f32(), m_convNorms.f32(), s);
        conv1dForward(m_conv, m_e.f32(), m_convW.f32(), read(m_h.convBias), m_convOut.f32(), s);
        geluForward(m_convOut.f32(), n, m_h0.f32(), s);
        addInPlace(m_h0.f32(), m_e.f32(), n, s);
    }
    const float *x = m_h0.f32();
    if (!m_hin.empty()) {
        SHARDSCOPE_CUDA_CHECK(cudaMemcpyAsync(m_hin.front().data(), x, n * sizeof(float),
                                              cudaMemcpyDeviceToDevice, s));
    }
    for (std::size_t i = 0; i < m_h.blocks.size(); ++i) {
        const nn::ModelHandles::Block &b = m_h.blocks[i];
        float *out = i + 1 < m_hin.size() ? m_hin[i + 1].f32() : m_hL.f32();
        Scope block(e, r, b.block, Phase::Forward, L);
        {
            Scope scope(e, r, b.ln, Phase::Forward, L);
            layerNormForward(m_hin[i].f32(), R, H, read(b.lnWeight), read(b.lnBias), kLayerNormEps,
                             m_lnOut[i].f32(), m_lnMean[i].f32(), m_lnRstd[i].f32(), s);
        }
        {
            Scope scope(e, r, b.fc1, Phase::Forward, L);
            m_blas.linearForward(m_lnOut[i].f32(), R, H, F, read(b.fc1Weight), read(b.fc1Bias),
                                 m_u[i].f32());
        }
        geluForward(m_u[i].f32(), std::int64_t(R) * F, m_a[i].f32(), s);
        {
            Scope scope(e, r, b.fc2, Phase::Forward, L);
            m_blas.linearForward(m_a[i].f32(), R, F, H, read(b.fc2Weight), read(b.fc2Bias), out);
        }
        addInPlace(out, m_hin[i].f32(), n, s); // the residual
    }
    if (m_hin.empty())
        SHARDSCOPE_CUDA_CHECK(
            cudaMemcpyAsync(m_hL.data(), x, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
    {
        Scope scope(e, r, m_h.lnF, Phase::Forward, L);
        layerNormForward(m_hL.f32(), R, H, read(m_h.lnFWeight), read(m_h.lnFBias), kLayerNormEps,
                         m_lnfOut.f32(), m_lnfMean.f32(), m_lnfRstd.f32(), s);
    }
    {
        // The tied head reads embed.weight, which embed owns (story 1).
        Scope scope(e, r, m_h.lmHead, Phase::Forward, L);
        m_blas.linearForward(m_lnfOut.f32(), R, H, V, read(m_h.embedWeight), read(m_h.headBias),
                             m_logits.f32());
    }
}

void GpuRank::backward()
{
    const int H = m_cfg.hidden, V = m_cfg.vocab, F = 4 * m_cfg.hidden, R = m_rows;
    const std::int64_t n = std::int64_t(R) * H;
    const cudaStream_t s = m_stream;
    core::Engine &e = m_engine;
    const int r = m_rank;
    const ScopeLabels &L = m_labels;

    Scope model(e, r, e.root(), Phase::Backward, L);
    {
        Scope scope(e, r, m_h.lmHead, Phase::Backward, L);
        // embed.weight's gradient from the head waits for the lookup's part (embed's backward).
        m_blas.linearBackward(m_lnfOut.f32(), R, H, V, read(m_h.embedWeight), m_dLogits.f32(),
                              m_dtmp.f32(), grad(m_h.embedWeight), grad(m_h.headBias));
        reduce(m_h.headBias);
    }
    {
        Scope scope(e, r, m_h.lnF, Phase::Backward, L);
        layerNormBackward(m_hL.f32(), R, H, read(m_h.lnFWeight), m_lnfMean.f32(), m_lnfRstd.f32(),
                          m_dtmp.f32(), m_dh.f32(), grad(m_h.lnFWeight), grad(m_h.lnFBias), s);
        reduce(m_h.lnFWeight);
        reduce(m_h.lnFBias);
    }
    for (std::size_t k = m_h.blocks.size(); k-- > 0;) {
        const nn::ModelHandles::Block &b = m_h.blocks[k];
        Scope block(e, r, b.block, Phase::Backward, L);
        {
            Scope scope(e, r, b.fc2, Phase::Backward, L);
            m_blas.linearBackward(m_a[k].f32(), R, F, H, read(b.fc2Weight), m_dh.f32(),
                                  m_dwide.f32(), grad(b.fc2Weight), grad(b.fc2Bias));
            reduce(b.fc2Weight);
            reduce(b.fc2Bias);
        }
        geluBackward(m_u[k].f32(), std::int64_t(R) * F, m_dwide.f32(), m_dwide2.f32(), s);
        {
            Scope scope(e, r, b.fc1, Phase::Backward, L);
            m_blas.linearBackward(m_lnOut[k].f32(), R, H, F, read(b.fc1Weight), m_dwide2.f32(),
                                  m_dtmp.f32(), grad(b.fc1Weight), grad(b.fc1Bias));
            reduce(b.fc1Weight);
            reduce(b.fc1Bias);
        }
        {
            Scope scope(e, r, b.ln, Phase::Backward, L);
            layerNormBackward(m_hin[k].f32(), R, H, read(b.lnWeight), m_lnMean[k].f32(),
                              m_lnRstd[k].f32(), m_dtmp.f32(), m_dIn.f32(), grad(b.lnWeight),
                              grad(b.lnBias), s);
            reduce(b.lnWeight);
            reduce(b.lnBias);
            addInPlace(m_dh.f32(), m_dIn.f32(), n, s); // the residual
        }
    }
    {
        Scope scope(e, r, m_h.posConv, Phase::Backward, L);
        // h0 = e + GELU(conv(e)): dConvOut = GELU'(convOut) * dh.
        geluBackward(m_convOut.f32(), n, m_dh.f32(), m_dConvOut.f32(), s);
        SHARDSCOPE_CUDA_CHECK(cudaMemsetAsync(m_dConvW.data(), 0, m_dConvW.bytes(), s));
        conv1dBackward(m_conv, m_e.f32(), m_convW.f32(), m_dConvOut.f32(), m_dtmp.f32(),
                       m_dConvW.f32(), grad(m_h.convBias), s);
        weightNormBackward(read(m_h.convV), read(m_h.convG), m_convNorms.f32(), m_dConvW.f32(), H,
                           H / m_cfg.groups, m_cfg.kernel, grad(m_h.convV), grad(m_h.convG), s);
        reduce(m_h.convV);
        reduce(m_h.convG);
        reduce(m_h.convBias);
        addInPlace(m_dh.f32(), m_dtmp.f32(), n, s);
    }
    {
        Scope scope(e, r, m_h.embed, Phase::Backward, L);
        embeddingBackward(m_tokens.i32(), R, m_dh.f32(), V, H, grad(m_h.embedWeight), s);
        reduce(m_h.embedWeight);
    }
}

// AdamW on this rank's shards, on the compute stream: the engine orders the next step's
// gathers and the persistent refresh after it (Communicator::waitForCompute).
void GpuRank::optimizerStep(int step)
{
    nn::AdamOptions ap;
    ap.lr = m_cfg.lr;
    ap.beta1 = m_cfg.beta1;
    ap.beta2 = m_cfg.beta2;
    ap.eps = m_cfg.eps;
    for (ParamId p : m_params) {
        const std::span<float> data = m_engine.shardData(m_rank, p);
        const std::span<float> g = m_engine.shardGrad(m_rank, p);
        if (g.size() != data.size() || m_adamM[p].bytes() != data.size() * sizeof(float))
            throw core::EngineError("the shard of " + m_engine.param(p).name + " on rank " +
                                    std::to_string(m_rank) + " changed size during training");
        ap.weightDecay =
            m_cfg.weightDecay > 0.0f && nn::decays(m_engine.param(p)) ? m_cfg.weightDecay : 0.0f;
        adamStep(data.data(), g.data(), m_adamM[p].f32(), m_adamV[p].f32(),
                 static_cast<std::int64_t>(data.size()), ap, step, m_stream);
    }
}

} // namespace

std::unique_ptr<core::Engine> makeNcclEngine(const nn::TrainConfig &config)
{
    const std::string bad = nn::validate(config);
    if (!bad.empty()) throw std::invalid_argument(bad);

    chooseBackend("nccl"); // a CommError saying what is missing (no GPU, driver, NCCL)
    const bool multiProcess = std::getenv("RANK") && std::getenv("WORLD_SIZE");
    const auto checkBatch = [&config](int world) {
        if (config.batch < world)
            throw std::invalid_argument("--batch " + std::to_string(config.batch) +
                                        " is smaller than the " + std::to_string(world) +
                                        " ranks; every rank needs a sequence");
    };
    std::vector<std::unique_ptr<comm::NcclCommunicator>> ranks;
    int world = config.worldSize;
    if (multiProcess) {
        const comm::RendezvousConfig rdzv = comm::rendezvousFromEnv();
        world = rdzv.worldSize;
        checkBatch(world);
        ranks.push_back(comm::makeNcclRank(rdzv));
        ranks.front()->useOwnComputeStream();
        ranks.front()->setOrderAfterCompute(false);
    } else {
        checkBatch(world);
        int available = 0;
        SHARDSCOPE_CUDA_CHECK(cudaGetDeviceCount(&available));
        if (world > available)
            throw comm::CommError(
                "--world-size " + std::to_string(world) + " with --backend nccl needs " +
                std::to_string(world) + " GPUs (one rank per GPU) but this machine has " +
                std::to_string(available) + "; use --world-size " + std::to_string(available) +
                " or less, or launch one process per GPU with torchrun");
        std::vector<int> devices(static_cast<std::size_t>(world));
        for (int d = 0; d < world; ++d)
            devices[static_cast<std::size_t>(d)] = d;
        // Until the Engine owns them, the local world destroys them (one thread each, as
        // ncclCommDestroy is an intra-node collective) if anything here throws.
        comm::NcclLocalWorld local = comm::makeNcclLocalWorld(devices);
        for (std::size_t i = 0; i < local.size(); ++i) {
            local[i].useOwnComputeStream();
            local[i].setOrderAfterCompute(false);
        }
        ranks = local.release();
    }

    nn::TrainConfig sized = config;
    sized.worldSize = world;
    // From here the Engine alone owns the communicators and destroys them, one thread each.
    std::vector<std::unique_ptr<comm::Communicator>> comms;
    comms.reserve(ranks.size());
    for (auto &r : ranks)
        comms.push_back(std::move(r));
    return std::make_unique<core::Engine>(nn::makeEngineConfig(sized), std::move(comms));
}

nn::TrainResult trainOnGpu(core::Engine &engine, const nn::TrainConfig &config,
                           const nn::StepCallback &onStep)
{
    nn::TrainConfig c = config;
    c.worldSize = engine.worldSize(); // torchrun's WORLD_SIZE, not --world-size
    const std::string problem = nn::validate(c);
    if (!problem.empty()) throw core::EngineError(problem);
    const int world = engine.worldSize();
    if (c.batch < world)
        throw core::EngineError("--batch " + std::to_string(c.batch) + " is smaller than the " +
                                std::to_string(world) + " ranks; every rank needs a sequence");
    for (int r : engine.localRanks())
        (void)ncclOf(engine, r);
    const nn::ModelHandles handles = nn::findModel(engine, c.layers);
    const ScopeLabels labels(engine);
    // NVTX ranges for the engine's fetches around whatever sink is installed (the
    // inspector's hub, or none), so Nsight Systems lines them up with NCCL's kernels.
    // Made after the model is built, so every parameter and module has its name.
    telemetry::EventSink *const installed = engine.eventSink();
    NvtxEventSink nvtx(engine, installed);
    engine.setEventSink(&nvtx);
    struct Restore
    {
        core::Engine &engine;
        telemetry::EventSink *sink;
        ~Restore() { engine.setEventSink(sink); }
    } restore{engine, installed};
    const double globalTokens = static_cast<double>(c.batch) * c.seq;
    const int reporter = engine.localRanks().front();

    nn::TrainResult result;
    result.losses.resize(static_cast<std::size_t>(c.steps));
    const auto start = std::chrono::steady_clock::now();

    engine.forEachLocalRank([&](int rank) {
        comm::NcclCommunicator &comm = ncclOf(engine, rank);
        GpuRank model(engine, rank, c, handles, labels, nn::sliceOf(c.batch, world, rank));
        for (int step = 1; step <= c.steps; ++step) {
            const auto stepStart = std::chrono::steady_clock::now();
            engine.beginStep(rank);
            engine.zeroGrads(rank);
            const double partial = model.forwardBackward(static_cast<std::uint32_t>(step));
            model.optimizerStep(step);
            engine.refreshPersistent(rank);

            const double loss = comm.allReduceHost(partial) / globalTokens;
            engine.endStep(rank, loss);
            comm.barrier();

            if (rank == reporter) {
                const double seconds =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - stepStart)
                        .count();
                result.losses[static_cast<std::size_t>(step - 1)] = loss;
                if (onStep && reporter == 0)
                    onStep(nn::makeStepReport(engine, c, step, loss, seconds));
            }
        }
        // The kernels of the last step finish before this rank's buffers are freed.
        SHARDSCOPE_CUDA_CHECK(cudaStreamSynchronize(comm.computeStream()));
    });

    nn::finishResult(
        result, engine, c,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return result;
}

nn::TrainResult runNcclTraining(const nn::TrainConfig &config, const nn::StepCallback &onStep,
                                telemetry::EventSink *sink)
{
    std::unique_ptr<core::Engine> engine = makeNcclEngine(config);
    engine->setEventSink(sink); // trainOnGpu adds the NVTX ranges around it
    // Whatever happens, the engine stops writing to the sink before it goes.
    struct Detach
    {
        core::Engine &engine;
        ~Detach() { engine.setEventSink(nullptr); }
    } detach{*engine};
    nn::TrainConfig sized = config;
    sized.worldSize = engine->worldSize();
    nn::buildModel(*engine, sized);
    return trainOnGpu(*engine, sized, onStep);
}

} // namespace shardscope::cuda

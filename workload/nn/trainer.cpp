#include "nn/trainer.h"

#include <algorithm>
#include <cblas.h>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "comm/asynccommunicator.h"
#include "comm/cpucommunicator.h"
#include "nn/adam.h"
#include "nn/markov.h"
#include "nn/model.h"

namespace shardscope::nn {

namespace {

} // namespace

BatchSlice sliceOf(int batch, int world, int rank)
{
    const int base = batch / world;
    const int extra = batch % world;
    return BatchSlice{rank * base + std::min(rank, extra), base + (rank < extra ? 1 : 0)};
}

bool decays(const core::ParamInfo &info)
{
    return info.shape.size() == 2 || info.localName == "weight_v";
}

namespace {

double megabytesGathered(const core::Engine &engine)
{
    double bytes = 0.0;
    for (int r : engine.localRanks())
        bytes += static_cast<double>(engine.gatheredBytes(r));
    return bytes / 1e6;
}

} // namespace

StepReport makeStepReport(const core::Engine &engine, const TrainConfig &config, int step,
                          double loss, double seconds)
{
    const double globalTokens = static_cast<double>(config.batch) * config.seq;
    StepReport report;
    report.step = step;
    report.steps = config.steps;
    report.loss = loss;
    report.seconds = seconds;
    report.tokensPerSecond = seconds > 0.0 ? globalTokens / seconds : 0.0;
    report.megabytesGathered = megabytesGathered(engine);
    report.unregisteredAccesses = engine.unregisteredAccessCount();
    report.lateParameters = engine.lateParameterCount();
    return report;
}

void finishResult(TrainResult &result, const core::Engine &engine, const TrainConfig &config,
                  double seconds)
{
    result.seconds = seconds;
    result.firstLoss = result.losses.empty() ? 0.0 : result.losses.front();
    result.lastLoss = result.losses.empty() ? 0.0 : result.losses.back();
    result.tokens = static_cast<std::int64_t>(config.batch) * config.seq * config.steps;
    result.megabytesGathered = megabytesGathered(engine);
    result.unregisteredAccesses = engine.unregisteredAccessCount();
    result.lateParameters = engine.lateParameterCount();
}

core::EngineConfig makeEngineConfig(const TrainConfig &config)
{
    core::EngineConfig e;
    e.worldSize = config.worldSize;
    e.persistenceThreshold = config.persistenceThreshold;
    e.guard = config.guard;
    e.modelName = "shardscope-train lm (" + std::to_string(config.layers) + " blocks, hidden " +
                  std::to_string(config.hidden) + ", vocab " + std::to_string(config.vocab) + ")";
    return e;
}

std::unique_ptr<core::Engine> makeCpuEngine(const TrainConfig &config)
{
    std::vector<std::unique_ptr<comm::Communicator>> world = comm::makeCpuWorld(config.worldSize);
    if (config.overlapComm) world = comm::makeAsyncCommunicators(std::move(world));
    return std::make_unique<core::Engine>(makeEngineConfig(config), std::move(world));
}

TrainResult trainModel(core::Engine &engine, const TrainConfig &config, const StepCallback &onStep)
{
    const std::string problem = validate(config);
    if (!problem.empty()) throw core::EngineError(problem);
    if (engine.worldSize() != config.worldSize)
        throw core::EngineError("the engine has world size " + std::to_string(engine.worldSize()) +
                                " but the run asks for " + std::to_string(config.worldSize));
    const ModelHandles handles = findModel(engine, config.layers);
    const std::vector<ParamId> params = handles.params();
    const MarkovStream data(config.seed, config.vocab);
    const int T = config.seq;
    const double globalTokens = static_cast<double>(config.batch) * T;
    const int reporter = engine.localRanks().front();
    // Ranks are threads already: one BLAS thread each.
    openblas_set_num_threads(1);

    TrainResult result;
    result.losses.resize(static_cast<std::size_t>(config.steps));
    const auto start = std::chrono::steady_clock::now();

    engine.forEachLocalRank([&](int rank) {
        RankModel model(engine, rank, config, handles);
        Adam adam(
            AdamOptions{config.lr, config.beta1, config.beta2, config.eps, config.weightDecay});
        comm::Communicator &comm = engine.comm(rank);
        const BatchSlice mine = sliceOf(config.batch, config.worldSize, rank);
        std::vector<std::int32_t> sequence(static_cast<std::size_t>(T) + 1);
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(mine.count) * T);
        std::vector<std::int32_t> targets(tokens.size());
        std::vector<double> partials(static_cast<std::size_t>(config.worldSize));

        // --diverge (issue 51): this rank takes another path at divergeStep.
        const bool diverges = !config.diverge.empty() && rank == config.divergeRank;
        const int divergeStep = config.divergeStep ? config.divergeStep : config.steps;
        const auto batchOf = [&](int step) {
            for (int s = 0; s < mine.count; ++s) {
                data.sequence(static_cast<std::uint32_t>(step), mine.first + s, T + 1,
                              sequence.data());
                std::copy_n(sequence.begin(), T, tokens.begin() + std::int64_t(s) * T);
                std::copy_n(sequence.begin() + 1, T, targets.begin() + std::int64_t(s) * T);
            }
        };
        for (int step = 1; step <= config.steps; ++step) {
            const auto stepStart = std::chrono::steady_clock::now();
            if (diverges && step == divergeStep) {
                if (config.diverge == "slow")
                    std::this_thread::sleep_for(
                        std::chrono::duration<double>(config.divergeSeconds));
                if (config.diverge == "raise")
                    throw std::runtime_error("rank " + std::to_string(rank) + " failed at step " +
                                             std::to_string(step) + " (--diverge raise)");
            }
            engine.beginStep(rank);
            engine.zeroGrads(rank);
            batchOf(step);
            const double partial =
                model.forwardBackward(tokens.data(), targets.data(), mine.count, globalTokens);

            adam.beginStep();
            for (std::size_t i = 0; i < params.size(); ++i) {
                const ParamId p = params[i];
                adam.update(i, engine.shardData(rank, p), engine.shardGrad(rank, p),
                            config.weightDecay > 0.0f && decays(engine.param(p)));
            }
            engine.refreshPersistent(rank);

            // The global mean loss, summed in rank order so every world size adds the same way.
            comm.allGather(&partial, partials.data(), sizeof(double)).wait();
            double sum = 0.0;
            for (double x : partials)
                sum += x;
            const double loss = sum / globalTokens;
            engine.endStep(rank, loss);
            comm.barrier();

            if (rank == reporter) {
                const double seconds =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - stepStart)
                        .count();
                result.losses[step - 1] = loss;
                if (onStep) onStep(makeStepReport(engine, config, step, loss, seconds));
            }
            if (diverges && step == divergeStep) {
                if (config.diverge == "extra-forward") { // it evaluates one more batch
                    engine.beginStep(rank);
                    model.evaluate(tokens.data(), targets.data(), mine.count);
                    engine.endStep(rank, loss);
                } else if (config.diverge == "gathered") { // it looks at a weight on its own
                    const core::GatheredParameters look(engine, rank, {handles.embedWeight});
                }
            }
        }
        if (diverges && config.diverge == "extra-batch") { // one more micro-batch, at the end
            engine.beginStep(rank);
            batchOf(config.steps + 1);
            model.forwardBackward(tokens.data(), targets.data(), mine.count, globalTokens);
            engine.endStep(rank, 0.0);
        }
        // As a script does before it saves: every rank meets here, so the others wait for the
        // one that took another path (in a collective they never issue).
        if (!config.diverge.empty()) comm.barrier();
    });

    finishResult(result, engine, config,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return result;
}

TrainResult runCpuTraining(const TrainConfig &config, core::Engine &engine,
                           const StepCallback &onStep)
{
    buildModel(engine, config);
    return trainModel(engine, config, onStep);
}

} // namespace shardscope::nn

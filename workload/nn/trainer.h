#pragma once
// The data-parallel ZeRO-3 training run on the engine: builds the model in the engine,
// partitions it, applies weight normalisation as the stories do, then trains with one
// thread per rank and reports every step. The GPU path mirrors this interface.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/engine.h"
#include "nn/trainconfig.h"

namespace shardscope::nn {

// One line of the run's progress, produced after every step.
struct StepReport
{
    int step = 0;                   // 1-based
    int steps = 0;                  // total steps of the run
    double loss = 0.0;              // global mean next-token cross-entropy of the step
    double tokensPerSecond = 0.0;   // tokens of this step / its wall time
    double megabytesGathered = 0.0; // all-gathered so far, summed over local ranks (MB = 1e6 bytes)
    std::uint64_t unregisteredAccesses = 0; // engine.unregisteredAccessCount() so far
    std::uint64_t lateParameters = 0;       // engine.lateParameterCount() so far
    double seconds = 0.0;                   // wall time of this step
};

struct TrainResult
{
    std::vector<double> losses; // one per step
    double firstLoss = 0.0;
    double lastLoss = 0.0;
    double seconds = 0.0;    // wall time of all steps
    std::int64_t tokens = 0; // tokens trained on, all steps
    double megabytesGathered = 0.0;
    std::uint64_t unregisteredAccesses = 0;
    std::uint64_t lateParameters = 0;
};

using StepCallback = std::function<void(const StepReport &)>;

// Sequences [first, first + count) of the global batch belong to a rank: the batch is
// split as evenly as it goes, the first (batch % world) ranks take one more.
struct BatchSlice
{
    int first = 0;
    int count = 0;
};
BatchSlice sliceOf(int batch, int world, int rank);

// AdamW's decoupled decay applies to matrices (and weight_v), not to biases, norms or weight_g.
bool decays(const core::ParamInfo &info);

// What both trainers report, from the engine's counters: one step's line, and the run's
// totals (result.losses already filled, one per step).
StepReport makeStepReport(const core::Engine &engine, const TrainConfig &config, int step,
                          double loss, double seconds);
void finishResult(TrainResult &result, const core::Engine &engine, const TrainConfig &config,
                  double seconds);

// The EngineConfig a run uses (world size, guard, persistence threshold, model name).
core::EngineConfig makeEngineConfig(const TrainConfig &config);
// An engine over a threads-as-ranks CPU world of config.worldSize ranks.
std::unique_ptr<core::Engine> makeCpuEngine(const TrainConfig &config);

// Creates the model's modules and parameters in engine (which must be empty and not yet
// partitioned), partitions it (zero.Init), then applies weight normalisation to pos_conv
// as config.externals says. Throws UnregisteredAccessError / EngineError from the engine.
void buildModel(core::Engine &engine, const TrainConfig &config);

// Trains the model built by buildModel for config.steps steps, one thread per local rank,
// calling onStep (if set) from one thread after each step. Throws the first error of any
// rank (e.g. UnregisteredAccessError under --guard error).
TrainResult trainModel(core::Engine &engine, const TrainConfig &config, const StepCallback &onStep);

// buildModel followed by trainModel.
TrainResult runCpuTraining(const TrainConfig &config, core::Engine &engine,
                           const StepCallback &onStep);

} // namespace shardscope::nn

#pragma once
// The GPU training run on core/Engine: NCCL communicators whose MemorySpace is the rank's
// GPU, so the engine keeps shards, gathered tensors and shard gradients in device memory
// and does the fetching, prefetching, releasing, the access guard, late parameters and
// telemetry exactly as on the CPU; the trainer adds the CUDA kernels (layers.h, blas.h)
// and AdamW on the device shards. The Inspector attaches to the engine as on the CPU.

#include <memory>

#include "core/engine.h"
#include "nn/trainer.h"
#include "telemetry/event.h"

namespace shardscope::cuda {

// An Engine over NCCL ranks. Two launches:
// - RANK and WORLD_SIZE set (torchrun, one process per GPU, possibly many nodes): this
//   process is one rank on GPU LOCAL_RANK; WORLD_SIZE overrides config.worldSize.
// - otherwise: config.worldSize ranks in this process, one per GPU 0..N-1.
// Each rank gets its own non-blocking compute stream; collectives do not wait for it
// implicitly (the engine orders them with Communicator::waitForCompute).
// Throws CommError: no GPU/driver/NCCL, fewer GPUs than ranks, NCCL/CUDA failures.
std::unique_ptr<core::Engine> makeNcclEngine(const nn::TrainConfig &config);

// Trains the model that nn::buildModel(engine, config) built in an engine made by
// makeNcclEngine, for config.steps steps, one thread per local rank (forEachLocalRank).
// The losses match nn::trainModel's to fp32 rounding (same data, initial values and
// order of updates). onStep is called from one thread after each step, in the process
// that holds rank 0 only (so a torchrun launch prints once). Throws the first error of
// any rank: UnregisteredAccessError (--guard error), EngineError, CommError.
nn::TrainResult trainOnGpu(core::Engine &engine, const nn::TrainConfig &config,
                           const nn::StepCallback &onStep);

// makeNcclEngine, the engine's events to sink (may be null; wrapped with NVTX
// annotations), nn::buildModel and trainOnGpu: the whole run without an inspector.
nn::TrainResult runNcclTraining(const nn::TrainConfig &config, const nn::StepCallback &onStep,
                                telemetry::EventSink *sink = nullptr);

} // namespace shardscope::cuda

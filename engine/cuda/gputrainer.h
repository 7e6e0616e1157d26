#pragma once
// The GPU training run: the model and the step of nn/trainer.h on NCCL ranks, with
// parameter shards and gathered tensors in device memory, gathers on a communication
// stream (status INFLIGHT until their CUDA event completes, then AVAILABLE) and the
// next module's parameters prefetched while the current module computes. It emits the
// engine's telemetry Events through an EventSink; it does not run on core/Engine,
// which keeps tensors in host memory (see docs/gpu.md for what is shared).

#include "nn/trainer.h"
#include "telemetry/event.h"

namespace shardscope::gpu {

// Trains config's model with the NCCL backend and returns the same TrainResult as
// nn::runCpuTraining. Two launches:
// - RANK and WORLD_SIZE set (torchrun, one process per GPU, possibly many nodes): this
//   process is one rank on GPU LOCAL_RANK; WORLD_SIZE overrides config.worldSize.
// - otherwise: config.worldSize ranks in this process, one thread per GPU 0..N-1.
// onStep is called from one thread after each step (rank 0's only, in multi-process
// runs); sink (may be null) receives every rank's events of this process.
// Throws CommError (no GPU, too few GPUs, NCCL/CUDA failures: the message names the
// failing call), UnregisteredAccessError (--guard error) and EngineError.
nn::TrainResult runNcclTraining(const nn::TrainConfig &config, const nn::StepCallback &onStep,
                                EventSink *sink = nullptr);

} // namespace shardscope::gpu

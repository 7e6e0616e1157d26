// The GPU run in a build without CUDA: chooseBackend() never picks NCCL here, and a direct
// call says why it cannot run.

#include "cuda/gputrainer.h"

namespace shardscope::cuda {

namespace {

[[noreturn]] void noCuda()
{
    throw comm::CommError("this build of ShardScope has no CUDA/NCCL support (configured with "
                          "SHARDSCOPE_CUDA=OFF, or nvcc/NCCL were missing); rebuild with "
                          "-DSHARDSCOPE_CUDA=ON or use --backend cpu");
}

} // namespace

std::unique_ptr<core::Engine> makeNcclEngine(const nn::TrainConfig &)
{
    noCuda();
}

nn::TrainResult trainOnGpu(core::Engine &, const nn::TrainConfig &, const nn::StepCallback &)
{
    noCuda();
}

nn::TrainResult runNcclTraining(const nn::TrainConfig &, const nn::StepCallback &,
                                telemetry::EventSink *)
{
    noCuda();
}

} // namespace shardscope::cuda

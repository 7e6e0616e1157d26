// runNcclTraining() in a build without CUDA: chooseBackend() never picks NCCL here, and
// a direct call says why it cannot run.

#include "cuda/gputrainer.h"

namespace shardscope::gpu {

nn::TrainResult runNcclTraining(const nn::TrainConfig &, const nn::StepCallback &, EventSink *)
{
    throw CommError("this build of ShardScope has no CUDA/NCCL support (configured with "
                    "SHARDSCOPE_CUDA=OFF, or nvcc/NCCL were missing); rebuild with "
                    "-DSHARDSCOPE_CUDA=ON or use --backend cpu");
}

} // namespace shardscope::gpu

#include "comm/communicator.h"

namespace shardscope::comm {

std::string_view backendName(Backend b)
{
    switch (b) {
    case Backend::Cpu:
        return "cpu";
    case Backend::Nccl:
        return "nccl";
    case Backend::Gloo:
        return "gloo";
    }
    return "unknown";
}

} // namespace shardscope::comm

#include "comm/communicator.h"

namespace shardscope {

std::string_view backendName(Backend b)
{
    switch (b) {
    case Backend::Cpu:
        return "cpu";
    case Backend::Nccl:
        return "nccl";
    }
    return "unknown";
}

} // namespace shardscope

#include "state/partition.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace shardscope::state {

PartitionLayout PartitionLayout::make(std::int64_t numel, int worldSize)
{
    if (worldSize < 1)
        throw std::invalid_argument("world_size must be >= 1, got " + std::to_string(worldSize));
    if (numel < 0) throw std::invalid_argument("numel must be >= 0, got " + std::to_string(numel));
    PartitionLayout l;
    l.numel = numel;
    l.worldSize = worldSize;
    const std::int64_t w = worldSize;
    l.paddedNumel = (numel + w - 1) / w * w;
    l.partitionNumel = l.paddedNumel / w;
    return l;
}

std::int64_t PartitionLayout::validNumel(int rank) const
{
    const std::int64_t begin = offset(rank);
    const std::int64_t end = begin + partitionNumel;
    return std::clamp<std::int64_t>(std::min(end, numel) - begin, 0, partitionNumel);
}

} // namespace shardscope::state

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

PartitionLayout PartitionLayout::reported(std::int64_t numel, std::int64_t paddedNumel,
                                          std::int64_t partitionNumel, int worldSize)
{
    if (worldSize < 1)
        throw std::invalid_argument("world_size must be >= 1, got " + std::to_string(worldSize));
    if (numel < 0) throw std::invalid_argument("numel must be >= 0, got " + std::to_string(numel));
    const bool sane = partitionNumel > 0 && paddedNumel >= numel &&
                      paddedNumel % partitionNumel == 0 &&
                      paddedNumel / partitionNumel <= worldSize &&
                      worldSize % (paddedNumel / partitionNumel) == 0;
    if (!sane) return make(numel, worldSize);
    PartitionLayout l;
    l.numel = numel;
    l.worldSize = worldSize;
    l.paddedNumel = paddedNumel;
    l.partitionNumel = partitionNumel;
    return l;
}

std::int64_t PartitionLayout::validNumel(int rank) const
{
    const std::int64_t begin = offset(rank);
    const std::int64_t end = begin + partitionNumel;
    return std::clamp<std::int64_t>(std::min(end, numel) - begin, 0, partitionNumel);
}

} // namespace shardscope::state

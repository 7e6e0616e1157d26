#pragma once
// ZeRO-3 partition math: flatten, pad to a multiple of world_size, and give rank r
// the slice [r*p, (r+1)*p) with p = padded / world_size. Padding lives at the tail.

#include <cstddef>
#include <cstdint>

namespace shardscope::state {

struct PartitionLayout
{
    std::int64_t numel = 0;
    int worldSize = 1;
    std::int64_t paddedNumel = 0;
    std::int64_t partitionNumel = 0;

    static PartitionLayout make(std::int64_t numel, int worldSize);

    std::int64_t offset(int rank) const { return static_cast<std::int64_t>(rank) * partitionNumel; }
    // Elements of real data in rank's shard (the rest of the shard is padding).
    std::int64_t validNumel(int rank) const;
    std::int64_t paddingNumel(int rank) const { return partitionNumel - validNumel(rank); }
    // Padding of the whole flattened tensor: paddedNumel - numel, all in the last shards.
    std::int64_t totalPadding() const { return paddedNumel - numel; }
};

} // namespace shardscope::state

#pragma once
// ZeRO-3 partition math: flatten, pad to a multiple of world_size, and give rank r
// the slice [r*p, (r+1)*p) with p = padded / world_size. Padding lives at the tail.
// FSDP2's dim-0 shards are such slices too (a row-major tensor's rows are contiguous), of
// a size make() does not compute: reported() takes the producer's.

#include <algorithm>
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
    // The layout a producer reported for a parameter (its record's numel, padded_numel and
    // partition_numel): FSDP2 pads dim 0 to a multiple of the shard world, so a 33 x 16
    // tensor on 2 ranks has shards of 17 rows (272 elements, the last 16 padding), not
    // make()'s 264; HSDP shards over the shard mesh dimension only (shards() < worldSize).
    // Where the three do not make a layout of worldSize ranks (a partition that does not
    // divide padded, padded below numel, more shards than ranks or a number that does not
    // divide them) it is make(numel, worldSize).
    static PartitionLayout reported(std::int64_t numel, std::int64_t paddedNumel,
                                    std::int64_t partitionNumel, int worldSize);

    // How many distinct shards there are: worldSize for ZeRO-3 and FSDP2, the shard mesh
    // dimension for HSDP, whose rank r holds shard shardOf(r) = r mod shards().
    int shards() const
    {
        return partitionNumel > 0 ? static_cast<int>(paddedNumel / partitionNumel) : worldSize;
    }
    int shardOf(int rank) const { return rank % std::max(1, shards()); }

    std::int64_t offset(int rank) const { return static_cast<std::int64_t>(rank) * partitionNumel; }
    // Elements of real data in rank's shard (the rest of the shard is padding).
    std::int64_t validNumel(int rank) const;
    std::int64_t paddingNumel(int rank) const { return partitionNumel - validNumel(rank); }
    // Padding of the whole flattened tensor: paddedNumel - numel, all in the last shards.
    std::int64_t totalPadding() const { return paddedNumel - numel; }
};

} // namespace shardscope::state

#pragma once
// Copies a block with non-temporal stores, as glibc's memcpy does past its threshold,
// so that gathering into a receive buffer larger than the cache does not read every
// destination line first. An all_gather copies one block per rank, each below the
// threshold even when the whole receive buffer is far above it.

#include <cstddef>

namespace shardscope::comm::detail {

// Receive buffers at least this large are written with streamingCopy: 3/8 of the
// last-level cache, the threshold glibc's memcpy uses on these machines.
std::size_t streamingThreshold();

// memcpy for non-overlapping buffers, with non-temporal stores where the CPU has them.
void streamingCopy(void *dst, const void *src, std::size_t bytes);

} // namespace shardscope::comm::detail

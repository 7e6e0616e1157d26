#pragma once
// The reduction of reduceScatter, shared by every host backend so that they agree to the
// bit: out[i] = in[0][i] + in[1][i] + ... in rank order, accumulated in fp32 (bf16 inputs
// are widened, the sum rounded back to nearest-even).

#include <cstddef>

#include "base/types.h"

namespace shardscope::comm::detail {

// inputs[r] points at rank r's count elements of dtype; out receives count elements.
void sumInRankOrder(const void *const *inputs, int ranks, void *out, std::size_t count,
                    DType dtype);

} // namespace shardscope::comm::detail

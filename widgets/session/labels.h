#pragma once
// The engine's vocabulary as the inspector shows it: the same names the engine and
// the snapshot use ("NOT_AVAILABLE", "unregistered_access", "float32"), as QStrings.

#include <QString>

#include "core/state.h"
#include "core/types.h"

namespace shardscope::labels {

QString status(ParamStatus s);
QString action(GuardAction a);
QString kind(ViolationKind k);
QString dtype(DType t);
QString reason(FetchReason r);
QString phase(Phase p);
QString shape(const Shape &s);         // "[4, 8]"
QString count(std::uint64_t n);        // "1,234,567"
QString bytes(std::uint64_t n);        // "12.5 MiB"
QString ranks(std::uint64_t rankMask); // "0-3", "0, 2"

} // namespace shardscope::labels

#pragma once
// A Chrome / Perfetto trace (JSON "traceEvents") of what a store holds: one pid per
// rank, module and gather spans as "X" events with integer-microsecond ts/dur,
// violations as instant events, and a top-level "distributedInfo".

#include <QByteArray>

#include "session/sessionstore.h"

namespace shardscope {

QByteArray chromeTrace(const SessionStore &store);

} // namespace shardscope

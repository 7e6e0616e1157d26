#pragma once
// A Chrome / Perfetto trace (JSON "traceEvents") of what a store holds: one pid per
// rank, module and gather spans as "X" events with integer-microsecond ts/dur (on every
// thread they nest or are disjoint; overlapping gathers of a rank go onto its threads
// "gathers 0", "gathers 1", ...), violations as instant events, and a "distributedInfo".

#include <QByteArray>

#include "session/sessionstore.h"

namespace shardscope::session {

QByteArray chromeTrace(const SessionStore &store);

} // namespace shardscope::session

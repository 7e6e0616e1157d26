#pragma once
// A Chrome / Perfetto trace (JSON "traceEvents") of what a store holds: one pid per
// rank, module and gather spans as "X" events with integer-microsecond ts/dur (on every
// thread they nest or are disjoint; overlapping gathers of a rank go onto its threads
// "gathers 0", "gathers 1", ...), violations as instant events, and a "distributedInfo".
// The one trace writer: the inspector's File → Export trace and shardscope-capture
// --export-trace both call it (docs/trace.md).

#include <string>

#include "sessioncore/store.h"
#include "wire/result.h"

namespace shardscope::sessioncore {

std::string chromeTrace(const Store &store);
// The trace written to path atomically, gzip'd when path ends in ".gz" (a trace.json.gz
// opens in Perfetto and Chrome's DevTools as it is).
wire::Status writeTraceFile(const std::string &path, const Store &store);

} // namespace shardscope::sessioncore

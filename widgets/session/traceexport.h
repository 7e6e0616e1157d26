#pragma once
// The inspector's trace export: the one trace writer of the Qt-free session core
// (sessioncore/traceexport.h, what shardscope-capture --export-trace calls too) over the
// store this adapter holds, as bytes for the export file writers.

#include <QByteArray>

#include "session/sessionstore.h"
#include "sessioncore/tracebuilder.h"

namespace shardscope::session {

using TraceIds = sessioncore::TraceIds;

QByteArray chromeTrace(const SessionStore &store);

} // namespace shardscope::session

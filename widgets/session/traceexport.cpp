#include "session/traceexport.h"

#include "sessioncore/traceexport.h"

namespace shardscope::session {

QByteArray chromeTrace(const SessionStore &store)
{
    return QByteArray::fromStdString(sessioncore::chromeTrace(store.core()));
}

} // namespace shardscope::session

#pragma once
// The one colour of each violation severity (state/severity.h): the violations table, the
// module tree and the gather timeline's marks draw errors red, costs amber and information
// grey, so a benign read never looks like a crash.

#include <QColor>

#include "base/types.h"

namespace shardscope::models {

inline QColor severityColor(Severity s)
{
    switch (s) {
    case Severity::Error:
        return QColor(0xc0, 0x10, 0x10);
    case Severity::Cost:
        return QColor(0xb8, 0x6e, 0x00);
    case Severity::Info:
        return QColor(0x5f, 0x6b, 0x78);
    }
    return QColor(0xc0, 0x10, 0x10);
}

} // namespace shardscope::models

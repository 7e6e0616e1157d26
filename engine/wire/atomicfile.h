#pragma once
// Output files that readers see whole, old or new: the one writer of every file ShardScope
// writes, and the check a run makes before it starts that it will be able to.

#include <string>
#include <string_view>

#include "wire/result.h"

namespace shardscope::wire {

// The one writer of every output file (snapshots, exports, discovery files): a regular
// file is written to an unnamed temporary in its directory and renamed over path, so
// readers see the old or the new file. What exists and is not a regular file (a FIFO, a
// character device such as /dev/null) is written into, never replaced; a directory is an
// error.
Status writeFileAtomically(const std::string &path, std::string_view contents);
// Whether writeFileAtomically(path, ...) can succeed, checked before a run starts rather
// than after it: not a directory, its directory exists and takes a new file (not /proc,
// /sys or a read-only mount), or a FIFO/device we may open for writing. The error says
// what to do.
Status checkOutputFile(const std::string &path);

} // namespace shardscope::wire

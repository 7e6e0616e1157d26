#pragma once
// gzip for the files users share (snapshots, traces): written when the file's name ends
// in ".gz", recognised on reading by its magic bytes (1f 8b), whatever the name says.

#include <cstdint>
#include <string>
#include <string_view>

#include "wire/result.h"

namespace shardscope::wire {

// True when bytes start with gzip's magic 1f 8b.
bool isGzip(std::string_view bytes);
// True when path ends in ".gz" (case-insensitive): such files are written gzip'd.
bool wantsGzip(std::string_view path);

// One gzip member of text (RFC 1952), deflate level 6.
std::string gzipCompress(std::string_view text);
// The text of one or more concatenated gzip members. Fails on a damaged or truncated
// stream, bytes after the last member, or text longer than maxBytes (so a small file
// cannot make a reader allocate without bound).
Result<std::string> gzipDecompress(std::string_view gz, std::uint64_t maxBytes);

} // namespace shardscope::wire

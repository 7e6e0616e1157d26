#pragma once
// Internal to shardscope_wire: appending JSON straight into a std::string, for documents
// too large to build as a DOM first (the snapshot's modules, params and events).

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

namespace shardscope::wire::detail {

// Appends s as a quoted JSON string: `"` `\` and control characters escaped, UTF-8 kept as
// is, and every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD.
void appendJsonString(std::string &out, std::string_view s);

// Appends s with the same replacement (each byte that is not part of a valid UTF-8 sequence
// becomes U+FFFD) and nothing escaped: the binary State's strings, so that they decode to
// what the JSON State's do.
void appendValidUtf8(std::string &out, std::string_view s);

inline void appendJsonNumber(std::string &out, std::uint64_t v)
{
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
}

inline void appendJsonNumber(std::string &out, std::int64_t v)
{
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
}

inline void appendJsonBool(std::string &out, bool v)
{
    out.append(v ? "true" : "false");
}

} // namespace shardscope::wire::detail

#pragma once
// Internal to shardscope_wire: parsing untrusted JSON with a bounded nesting depth and
// typed member access that reports "where: what was wrong" instead of crashing.

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "wire/result.h"

namespace shardscope::wire::detail {

using Json = nlohmann::json;

struct DecodeFailure
{
    std::string message;
};

[[noreturn]] inline void failAt(const std::string &where, const std::string &what)
{
    throw DecodeFailure{where + ": " + what};
}

// Deeper documents are refused before parsing, so a hostile "[[[[..." cannot exhaust the stack.
inline constexpr int kMaxJsonDepth = 32;

inline Json parseJson(std::string_view text)
{
    if (text.starts_with("\xEF\xBB\xBF"))
        throw DecodeFailure{"the JSON starts with a byte order mark; send UTF-8 without one"};
    int depth = 0;
    bool inString = false;
    bool escaped = false;
    for (char c : text) {
        if (inString) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                inString = false;
            continue;
        }
        if (c == '"')
            inString = true;
        else if (c == '[' || c == '{') {
            if (++depth > kMaxJsonDepth)
                throw DecodeFailure{"JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                                    " levels"};
        } else if (c == ']' || c == '}')
            --depth;
    }
    try {
        return Json::parse(text.begin(), text.end());
    } catch (const Json::exception &e) {
        throw DecodeFailure{std::string("malformed JSON (") + e.what() + ")"};
    }
}

inline std::string dumpJson(const Json &j, bool pretty = false)
{
    return j.dump(pretty ? 1 : -1, ' ', false, Json::error_handler_t::replace);
}

inline const Json &requireObject(const Json &j, const std::string &where)
{
    if (!j.is_object()) failAt(where, "expected an object");
    return j;
}

inline const Json &member(const Json &obj, const char *key, const std::string &where)
{
    requireObject(obj, where);
    auto it = obj.find(key);
    if (it == obj.end()) failAt(where, std::string("missing field \"") + key + "\"");
    return *it;
}

inline bool hasMember(const Json &obj, const char *key)
{
    return obj.is_object() && obj.contains(key);
}

inline std::string asString(const Json &j, const std::string &where)
{
    if (!j.is_string()) failAt(where, "expected a string");
    return j.get<std::string>();
}

inline std::uint64_t asU64(const Json &j, const std::string &where)
{
    if (j.is_number_unsigned()) return j.get<std::uint64_t>();
    if (j.is_number_integer() && j.get<std::int64_t>() >= 0)
        return static_cast<std::uint64_t>(j.get<std::int64_t>());
    failAt(where, "expected a non-negative integer");
}

inline std::int64_t asI64(const Json &j, const std::string &where)
{
    if (j.is_number_unsigned()) {
        if (j.get<std::uint64_t>() >
            static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
            failAt(where, "integer out of range");
        return static_cast<std::int64_t>(j.get<std::uint64_t>());
    }
    if (j.is_number_integer()) return j.get<std::int64_t>();
    failAt(where, "expected an integer");
}

inline std::uint64_t asBounded(const Json &j, std::uint64_t max, const std::string &where)
{
    const std::uint64_t v = asU64(j, where);
    if (v > max) failAt(where, std::to_string(v) + " is larger than " + std::to_string(max));
    return v;
}

inline bool asBool(const Json &j, const std::string &where)
{
    if (!j.is_boolean()) failAt(where, "expected true or false");
    return j.get<bool>();
}

inline double asDouble(const Json &j, const std::string &where)
{
    if (!j.is_number()) failAt(where, "expected a number");
    return j.get<double>();
}

inline const Json &asArray(const Json &j, const std::string &where)
{
    if (!j.is_array()) failAt(where, "expected an array");
    return j;
}

// Runs a decoder body, turning any failure into an Error that starts with `what`.
template <class T, class F> Result<T> guarded(std::string_view what, F &&body)
{
    try {
        return body();
    } catch (const DecodeFailure &e) {
        return fail(std::string(what) + ": " + e.message);
    } catch (const std::exception &e) {
        return fail(std::string(what) + ": " + e.what());
    }
}

} // namespace shardscope::wire::detail

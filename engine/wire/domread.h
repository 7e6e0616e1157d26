#pragma once
// Internal to shardscope_wire: typed access to a simdjson DOM of untrusted JSON, for the
// large documents (the snapshot). Failures throw DecodeFailure ("where: what") like
// jsonread.h; the location is only rendered into text when something is wrong.

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <simdjson.h>

#include "wire/jsonread.h"

namespace shardscope::wire::detail::sj {

using Element = simdjson::dom::element;
using Object = simdjson::dom::object;
using Array = simdjson::dom::array;

// Where a value sits in the document: "params[3].status". Built on the stack as the
// decoder descends; text only on failure.
class Where
{
  public:
    static Where root() { return Where(nullptr, "snapshot", kNoIndex); }
    Where operator/(std::string_view key) const { return Where(this, key, kNoIndex); }
    Where operator[](std::size_t index) const { return Where(this, {}, index); }

    std::string str() const
    {
        if (!m_parent) return std::string(m_key);
        std::string s = m_parent->m_parent ? m_parent->str() : std::string();
        if (m_index != kNoIndex) return s + "[" + std::to_string(m_index) + "]";
        return s.empty() ? std::string(m_key) : s + "." + std::string(m_key);
    }

  private:
    static constexpr std::size_t kNoIndex = std::numeric_limits<std::size_t>::max();
    Where(const Where *parent, std::string_view key, std::size_t index)
        : m_parent(parent), m_key(key), m_index(index)
    {
    }
    const Where *m_parent;
    std::string_view m_key;
    std::size_t m_index;
};

[[noreturn]] inline void failAt(const Where &where, const std::string &what)
{
    detail::failAt(where.str(), what);
}

inline Object asObject(Element e, const Where &where)
{
    Object o;
    if (e.get_object().get(o) != simdjson::SUCCESS) failAt(where, "expected an object");
    return o;
}

inline Element member(Object o, std::string_view key, const Where &where)
{
    Element e;
    if (o.at_key(key).get(e) != simdjson::SUCCESS)
        failAt(where, "missing field \"" + std::string(key) + "\"");
    return e;
}

inline bool optionalMember(Object o, std::string_view key, Element &out)
{
    return o.at_key(key).get(out) == simdjson::SUCCESS;
}

// The members of one object, found in one pass: fields[k] is the value of names[k].
// Writers put members in the documented order, so each name is tried against the next
// expected one first; any order is accepted, and for a repeated key the last one wins.
template <std::size_t N> class Fields
{
  public:
    Fields(Object o, const std::array<std::string_view, N> &names, const Where &where)
        : m_names(names), m_where(where)
    {
        std::size_t next = 0;
        for (auto field : o) {
            std::size_t k = next < N && names[next] == field.key ? next : N;
            for (std::size_t i = 0; k == N && i < N; ++i)
                if (names[i] == field.key) k = i;
            if (k == N) continue;
            m_values[k] = field.value;
            m_present[k] = true;
            next = k + 1;
        }
    }
    Element operator[](std::size_t k) const
    {
        if (!m_present[k]) failAt(m_where, "missing field \"" + std::string(m_names[k]) + "\"");
        return m_values[k];
    }
    bool has(std::size_t k) const { return m_present[k]; }
    // Where the value of names[k] sits, for messages.
    Where at(std::size_t k) const { return m_where / m_names[k]; }

  private:
    const std::array<std::string_view, N> &m_names;
    const Where &m_where;
    std::array<Element, N> m_values{};
    std::array<bool, N> m_present{};
};

inline std::string_view asStringView(Element e, const Where &where)
{
    std::string_view s;
    if (e.get_string().get(s) != simdjson::SUCCESS) failAt(where, "expected a string");
    return s;
}

inline std::string asString(Element e, const Where &where)
{
    return std::string(asStringView(e, where));
}

inline std::uint64_t asU64(Element e, const Where &where)
{
    std::uint64_t v = 0;
    if (e.get_uint64().get(v) != simdjson::SUCCESS)
        failAt(where, "expected a non-negative integer");
    return v;
}

inline std::int64_t asI64(Element e, const Where &where)
{
    std::int64_t v = 0;
    if (e.get_int64().get(v) == simdjson::SUCCESS) return v;
    if (e.is_uint64()) failAt(where, "integer out of range");
    failAt(where, "expected an integer");
}

inline std::uint64_t asBounded(Element e, std::uint64_t max, const Where &where)
{
    const std::uint64_t v = asU64(e, where);
    if (v > max) failAt(where, std::to_string(v) + " is larger than " + std::to_string(max));
    return v;
}

inline bool asBool(Element e, const Where &where)
{
    bool v = false;
    if (e.get_bool().get(v) != simdjson::SUCCESS) failAt(where, "expected true or false");
    return v;
}

inline Array asArray(Element e, const Where &where)
{
    Array a;
    if (e.get_array().get(a) != simdjson::SUCCESS) failAt(where, "expected an array");
    return a;
}

// The same depth limit as jsonread.h's parseJson, checked by simdjson while it parses
// (simdjson's max_depth counts one level more than the document's own nesting).
// The document's text must stay alive as long as the returned element is used. `padded`:
// the SIMDJSON_PADDING bytes after the text are readable, so it is parsed where it lies.
inline Element parse(simdjson::dom::parser &parser, std::string_view text, bool padded = false)
{
    if (parser.allocate(text.size() < 64 ? 64 : text.size(), kMaxJsonDepth + 1) !=
        simdjson::SUCCESS)
        throw DecodeFailure{"cannot allocate memory to parse " + std::to_string(text.size()) +
                            " bytes of JSON"};
    Element root;
    const simdjson::error_code err = parser.parse(text.data(), text.size(), !padded).get(root);
    if (err == simdjson::MEMALLOC || err == simdjson::CAPACITY)
        throw DecodeFailure{"cannot allocate memory to parse " + std::to_string(text.size()) +
                            " bytes of JSON"};
    if (err == simdjson::DEPTH_ERROR)
        throw DecodeFailure{"JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
    if (err != simdjson::SUCCESS)
        throw DecodeFailure{std::string("malformed JSON (") + simdjson::error_message(err) + ")"};
    return root;
}

} // namespace shardscope::wire::detail::sj

#pragma once
// A value or a readable error. Every wire decoder returns one of these instead of
// throwing, so bad bytes from a socket or a file can never crash a reader.

#include <string>
#include <utility>
#include <variant>

namespace shardscope::wire {

struct Error
{
    std::string message;
};

inline Error fail(std::string message)
{
    return Error{std::move(message)};
}

template <class T> class [[nodiscard]] Result
{
  public:
    Result(T value) : m_v(std::in_place_index<0>, std::move(value)) {}
    Result(Error error) : m_v(std::in_place_index<1>, std::move(error)) {}

    bool ok() const { return m_v.index() == 0; }
    explicit operator bool() const { return ok(); }

    T &value() & { return std::get<0>(m_v); }
    const T &value() const & { return std::get<0>(m_v); }
    T &&value() && { return std::get<0>(std::move(m_v)); }
    T *operator->() { return &value(); }
    const T *operator->() const { return &value(); }
    T &operator*() & { return value(); }
    const T &operator*() const & { return value(); }

    // The reason; empty when ok().
    const std::string &error() const
    {
        static const std::string none;
        return ok() ? none : std::get<1>(m_v).message;
    }

  private:
    std::variant<T, Error> m_v;
};

struct Done
{
};
// The result of an operation that returns nothing but may fail (writing a file).
using Status = Result<Done>;
inline Status success()
{
    return Done{};
}

} // namespace shardscope::wire

#include "sessioncore/tracebuilder.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace shardscope::sessioncore {

using nlohmann::json;

namespace {

// Invalid UTF-8 in a name becomes U+FFFD, as it does everywhere else a name is shown.
std::string compact(const json &j)
{
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

} // namespace

TraceIds::TraceIds(const std::vector<int> &threads)
{
    constexpr std::int64_t kMaxId = std::numeric_limits<std::int32_t>::max();
    std::int64_t most = 1;
    for (int n : threads)
        most = std::max<std::int64_t>(most, n);
    std::int64_t stride = 100;
    while (stride <= most && stride <= kMaxId)
        stride *= 10;
    const auto ranks = static_cast<std::int64_t>(threads.size());
    m_pids.reserve(threads.size());
    if (ranks == 0 || (ranks - 1) * stride + most <= kMaxId) {
        m_stride = stride;
        for (std::int64_t r = 0; r < ranks; ++r)
            m_pids.push_back(static_cast<int>(r * stride + 1));
        return;
    }
    // Packed: at most 2^16 ranks (the decoders' bound) of 3 fixed threads, and each gather
    // thread holds a gather, so the ids pass 2^31 only past 2^31 stored events.
    std::int64_t next = 1;
    for (int n : threads) {
        m_pids.push_back(static_cast<int>(std::min(next, kMaxId)));
        next += std::max(n, 1);
    }
}

std::int64_t TraceBuilder::us(std::uint64_t ts) const
{
    return static_cast<std::int64_t>(ts >= m_t0 ? (ts - m_t0 + 500) / 1000 : 0);
}

std::int64_t TraceBuilder::dur(std::uint64_t begin, std::uint64_t end) const
{
    return end > begin ? us(end) - us(begin) : std::int64_t(0);
}

json TraceBuilder::number(double v)
{
    constexpr double kExact = 9007199254740992.0; // 2^53
    if (std::isfinite(v) && std::trunc(v) == v && std::abs(v) <= kExact)
        return static_cast<std::int64_t>(v);
    return v;
}

void TraceBuilder::add(const json &event)
{
    if (!m_events.empty()) m_events += ',';
    m_events += compact(event);
}

void TraceBuilder::meta(const char *name, int pid, int tid, json args)
{
    add(json{{"name", name}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}});
}

void TraceBuilder::spanUs(const std::string &name, const std::string &cat, int pid, int tid,
                          std::int64_t ts, std::int64_t duration, json args)
{
    add(json{{"name", name},
             {"cat", cat},
             {"ph", "X"},
             {"pid", pid},
             {"tid", tid},
             {"ts", ts},
             {"dur", duration},
             {"args", std::move(args)}});
}

void TraceBuilder::span(const std::string &name, const std::string &cat, int pid, int tid,
                        std::uint64_t begin, std::uint64_t end, json args)
{
    spanUs(name, cat, pid, tid, us(begin), dur(begin, end), std::move(args));
}

void TraceBuilder::counter(const std::string &name, int pid, std::uint64_t ts, json args)
{
    add(json{{"name", name},
             {"cat", "memory"},
             {"ph", "C"},
             {"pid", pid},
             {"tid", pid},
             {"ts", us(ts)},
             {"args", std::move(args)}});
}

void TraceBuilder::instant(const std::string &name, const std::string &cat, int pid, int tid,
                           std::uint64_t ts, json args)
{
    add(json{{"name", name},
             {"cat", cat},
             {"ph", "i"},
             {"s", "p"},
             {"pid", pid},
             {"tid", tid},
             {"ts", us(ts)},
             {"args", std::move(args)}});
}

std::string TraceBuilder::document(json members) const
{
    // The members and displayTimeUnit in key order, then the events spliced into the empty
    // array that stands for them: the events are never held as one tree.
    members["displayTimeUnit"] = "ms";
    members["traceEvents"] = json::array();
    std::string out = compact(members);
    static constexpr std::string_view kEmpty = "\"traceEvents\":[]";
    const std::size_t at = out.find(kEmpty); // escaped inside strings, so only the key matches
    out.insert(at + kEmpty.size() - 1, m_events);
    return out;
}

} // namespace shardscope::sessioncore

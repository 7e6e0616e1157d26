#include "views/gathertimeline_spans.h"

#include "state/severity.h"
#include "telemetry/eventfields.h"

#include <algorithm>

namespace shardscope::views {

namespace {

// SpanKind's first five values are FetchReason's; an unknown reason from the wire is drawn as
// a forward fetch.
SpanKind kindOfReason(FetchReason reason)
{
    const auto r = static_cast<std::uint8_t>(reason);
    return r <= std::uint8_t(FetchReason::Guard) ? SpanKind(r) : SpanKind::Forward;
}

std::uint64_t openKey(int rank, ParamId param)
{
    return std::uint64_t(rank) << 32 | param;
}

bool startsBefore(const GatherSpan &a, const GatherSpan &b)
{
    return a.start < b.start;
}

} // namespace

void GatherSpans::setTimeOrigin(std::uint64_t tsNs)
{
    m_hasOrigin = true;
    m_origin = tsNs;
}

double GatherSpans::secondsOf(std::uint64_t tsNs) const
{
    return double(std::int64_t(tsNs - m_origin)) * 1e-9;
}

GatherSpans::Lane &GatherSpans::lane(int rank)
{
    if (rank >= int(m_lanes.size())) m_lanes.resize(rank + 1);
    return m_lanes[rank];
}

int GatherSpans::lowestFreeRow(const Lane &l)
{
    for (int r = 0; r < kMaxFetchRows - 1; ++r)
        if (l.rowInFlight[r] == 0) return r;
    return kMaxFetchRows - 1;
}

void GatherSpans::add(int rank, SpanTrack t, const GatherSpan &s)
{
    Lane &l = lane(rank);
    const int ti = int(t);
    l.tracks[ti].push_back(s);
    l.maxDuration[ti] = std::max(l.maxDuration[ti], s.end - s.start);
    ++m_counts[ti];
}

void GatherSpans::append(std::span<const telemetry::Event> events)
{
    for (const telemetry::Event &ev : events) {
        if (ev.rank >= maxRanks) continue;
        if (!m_hasOrigin) setTimeOrigin(ev.tsNs);
        const int rank = ev.rank;
        const double t = secondsOf(ev.tsNs);
        bool kept = true;
        switch (ev.type) {
        case EventType::FetchBegin: {
            const telemetry::FetchFields f = telemetry::readFetch(ev);
            Lane &l = lane(rank);
            auto [it, inserted] = m_open.try_emplace(openKey(rank, f.param));
            if (!inserted) --l.rowInFlight[it->second.row]; // re-issued: the new one counts
            const int row = lowestFreeRow(l);
            ++l.rowInFlight[row];
            l.fetchRows = std::max(l.fetchRows, row + 1);
            it->second = OpenFetch{rank, t, f.param, kindOfReason(f.reason), row};
            break;
        }
        case EventType::FetchEnd: {
            const telemetry::FetchFields f = telemetry::readFetch(ev);
            GatherSpan s{t, t, f.param, f.cause, kindOfReason(f.reason)};
            s.bytes = f.bytes;
            Lane &l = lane(rank);
            auto it = m_open.find(openKey(rank, f.param));
            if (it != m_open.end()) {
                s.start = std::min(it->second.start, t);
                s.kind = it->second.kind;
                s.row = std::uint8_t(it->second.row);
                --l.rowInFlight[it->second.row];
                m_open.erase(it);
            } else {
                s.row = std::uint8_t(lowestFreeRow(l)); // its begin was not seen
                l.fetchRows = std::max(l.fetchRows, s.row + 1);
            }
            add(rank, SpanTrack::Fetch, s);
            break;
        }
        case EventType::Release: {
            const telemetry::ReleaseFields f = telemetry::readRelease(ev);
            add(rank, SpanTrack::Mark, GatherSpan{t, t, f.param, f.cause, SpanKind::Release});
            break;
        }
        case EventType::Broadcast:
            add(rank, SpanTrack::Mark,
                GatherSpan{t, t, telemetry::readBroadcast(ev).param, kNoModule,
                           SpanKind::Broadcast});
            break;
        case EventType::UnregisteredAccess: {
            const telemetry::AccessFields f = telemetry::readAccess(ev);
            GatherSpan span{t, t, f.param, f.accessor, SpanKind::Violation};
            span.severity = state::severityOf(ViolationKind::UnregisteredAccess, f.action, f.read);
            add(rank, SpanTrack::Violation, span);
            break;
        }
        case EventType::GatheredWriteError:
            add(rank, SpanTrack::Violation,
                GatherSpan{t, t, telemetry::readGatheredWriteError(ev), kNoModule,
                           SpanKind::Violation});
            break;
        case EventType::ReduceScatterBegin: {
            const telemetry::ReduceScatterFields f = telemetry::readReduceScatter(ev);
            m_openReduces[{rank, f.module, f.param}] = OpenReduce{rank, t};
            break;
        }
        case EventType::ReduceScatterEnd: {
            const telemetry::ReduceScatterFields f = telemetry::readReduceScatter(ev);
            GatherSpan s{t, t, f.param, f.module, SpanKind::ReduceScatter};
            s.params = f.params;
            if (auto it = m_openReduces.find({rank, f.module, f.param});
                it != m_openReduces.end()) {
                s.start = std::min(it->second.start, t);
                m_openReduces.erase(it);
            }
            add(rank, SpanTrack::ReduceScatter, s);
            break;
        }
        case EventType::StepBegin: {
            auto [it, inserted] = m_steps.emplace(ev.step, t);
            if (!inserted) it->second = std::min(it->second, t);
            // A fetch still open when its rank starts a new step lost its FetchEnd (dropped
            // events, or a rank that raised): stop drawing it as in flight.
            std::erase_if(m_open, [&](const auto &kv) {
                if (kv.second.rank != rank || kv.second.start >= t) return false;
                --m_lanes[rank].rowInFlight[kv.second.row];
                return true;
            });
            std::erase_if(m_openReduces, [&](const auto &kv) {
                return kv.second.rank == rank && kv.second.start < t;
            });
            break;
        }
        default:
            kept = false;
            break;
        }
        if (!kept) continue;
        if (!m_hasData) {
            m_first = m_last = t;
            m_hasData = true;
        } else {
            m_first = std::min(m_first, t);
            m_last = std::max(m_last, t);
        }
    }
    sortTails();
}

// Spans arrive in end order; each batch's new tail is sorted by start and merged into
// the sorted prefix, so the vectors are always start-sorted between batches.
void GatherSpans::sortTails()
{
    for (Lane &l : m_lanes) {
        for (int ti = 0; ti < kSpanTrackCount; ++ti) {
            auto &v = l.tracks[ti];
            const std::size_t from = l.sortedUpTo[ti];
            if (from == v.size()) continue;
            const auto mid = v.begin() + std::ptrdiff_t(from);
            if (!std::is_sorted(mid, v.end(), startsBefore))
                std::stable_sort(mid, v.end(), startsBefore);
            std::size_t changed = from;
            if (from > 0 && v[from].start < v[from - 1].start) {
                changed =
                    std::size_t(std::upper_bound(v.begin(), mid, *mid, startsBefore) - v.begin());
                std::inplace_merge(v.begin(), mid, v.end(), startsBefore);
            }
            l.sortedUpTo[ti] = v.size();
            // Latest end per chunk of kChunk spans, so a search skips whole chunks that end
            // before the visible range: one long span cannot make every search linear.
            auto &chunks = l.chunkMaxEnd[ti];
            const std::size_t firstChunk = changed / kChunk;
            chunks.resize((v.size() + kChunk - 1) / kChunk);
            for (std::size_t c = firstChunk; c < chunks.size(); ++c) {
                const std::size_t end = std::min(v.size(), (c + 1) * kChunk);
                double latest = v[c * kChunk].end;
                for (std::size_t i = c * kChunk + 1; i < end; ++i)
                    latest = std::max(latest, v[i].end);
                chunks[c] = latest;
            }
        }
    }
}

void GatherSpans::clear()
{
    m_hasOrigin = false;
    m_origin = 0;
    m_hasData = false;
    m_first = m_last = 0;
    m_lanes.clear();
    std::fill(std::begin(m_counts), std::end(m_counts), 0);
    m_open.clear();
    m_openReduces.clear();
    m_steps.clear();
}

const std::vector<GatherSpan> &GatherSpans::track(int rank, SpanTrack t) const
{
    static const std::vector<GatherSpan> empty;
    if (rank < 0 || rank >= int(m_lanes.size())) return empty;
    return m_lanes[rank].tracks[int(t)];
}

int GatherSpans::fetchRows(int rank) const
{
    return rank >= 0 && rank < int(m_lanes.size()) ? m_lanes[rank].fetchRows : 1;
}

std::optional<GatherSpans::Found> GatherSpans::nearest(SpanTrack t, double at, bool forward,
                                                       int rank, ParamId param) const
{
    std::optional<Found> best;
    const int first = rank < 0 ? 0 : rank;
    const int last = rank < 0 ? laneCount() - 1 : std::min(rank, laneCount() - 1);
    for (int r = first; r <= last; ++r) {
        // A track is in the order its spans closed; a fetch may close after a later one
        // began, so the whole track is looked at (a key press, not a frame).
        for (const GatherSpan &s : track(r, t)) {
            if (param != kNoParam && s.param != param) continue;
            // by the span's middle, where the view centres it; a picosecond apart from `at`
            // (the centre the view was put at, with its rounding) is the same place
            const double mid = (s.start + s.end) / 2;
            if (forward ? !(mid > at + 1e-12) : !(mid < at - 1e-12)) continue;
            const double bestMid = best ? (best->span.start + best->span.end) / 2 : 0;
            if (!best || (forward ? mid < bestMid : mid > bestMid)) best = Found{s, r};
        }
    }
    return best;
}

void GatherSpans::summarize(double t0, double t1, int rank,
                            std::unordered_map<ParamId, Totals> &params,
                            std::unordered_map<ModuleId, Totals> &modules) const
{
    const int first = rank < 0 ? 0 : rank;
    const int last = rank < 0 ? laneCount() - 1 : std::min(rank, laneCount() - 1);
    for (int r = first; r <= last; ++r) {
        const std::vector<GatherSpan> &v = track(r, SpanTrack::Fetch); // sorted by start
        auto it = std::lower_bound(v.begin(), v.end(), t0,
                                   [](const GatherSpan &s, double t) { return s.start < t; });
        for (; it != v.end() && it->start < t1; ++it) {
            const double d = it->end - it->start;
            Totals &p = params[it->param];
            ++p.gathers;
            p.seconds += d;
            p.bytes += it->bytes;
            if (it->module == kNoModule) continue;
            Totals &m = modules[it->module];
            ++m.gathers;
            m.seconds += d;
            m.bytes += it->bytes;
        }
    }
}

std::vector<OpenFetch> GatherSpans::openFetches() const
{
    std::vector<OpenFetch> out;
    out.reserve(m_open.size());
    for (const auto &[key, f] : m_open)
        out.push_back(f);
    std::sort(out.begin(), out.end(), [](const OpenFetch &a, const OpenFetch &b) {
        return a.rank != b.rank ? a.rank < b.rank : a.start < b.start;
    });
    return out;
}

void GatherSpans::blocks(int rank, SpanTrack t, double t0, double t1, double secondsPerPixel,
                         std::vector<TimelineBlock> &out,
                         const std::vector<ParamId> &selectedParams, double minPixels) const
{
    const auto &v = track(rank, t);
    if (v.empty() || t1 < t0) return;
    const double maxDuration = m_lanes[rank].maxDuration[int(t)];
    const double minWidth = std::max(0.0, minPixels * secondsPerPixel);
    const auto &chunks = m_lanes[rank].chunkMaxEnd[int(t)];
    auto lo = std::lower_bound(v.begin(), v.end(), t0 - maxDuration,
                               [](const GatherSpan &s, double x) { return s.start < x; });
    auto hi = std::upper_bound(lo, v.end(), t1,
                               [](double x, const GatherSpan &s) { return x < s.start; });

    // Spans merge only within their fetch sub-row: each row keeps its own open block.
    struct Pending
    {
        TimelineBlock block;
        bool open = false;
        int kindCounts[kSpanKindCount] = {};
    };
    Pending rows[kMaxFetchRows];
    auto flush = [&](Pending &p) {
        if (!p.open) return;
        p.block.kind = SpanKind(std::max_element(std::begin(p.kindCounts), std::end(p.kindCounts)) -
                                std::begin(p.kindCounts));
        out.push_back(p.block);
        p.open = false;
    };
    const std::size_t hiIndex = std::size_t(hi - v.begin());
    for (auto it = lo; it < hi; ++it) {
        const std::size_t index = std::size_t(it - v.begin());
        if (index / kChunk < chunks.size() && chunks[index / kChunk] < t0) {
            const std::size_t next = std::min((index / kChunk + 1) * kChunk, hiIndex);
            it = v.begin() + std::ptrdiff_t(next - 1);
            continue;
        }
        const GatherSpan &s = *it;
        if (s.end < t0) continue;
        const bool selected =
            !selectedParams.empty() &&
            std::binary_search(selectedParams.begin(), selectedParams.end(), s.param);
        const bool wide = s.end - s.start >= minWidth && s.end > s.start;
        const int row = std::min(int(s.row), kMaxFetchRows - 1);
        Pending &p = rows[row];
        if (p.open && !wide && s.start <= p.block.end + minWidth) {
            p.block.end = std::max(p.block.end, s.end);
            p.block.last = index + 1;
            ++p.block.count;
            ++p.kindCounts[int(s.kind)];
            p.block.severity = std::min(p.block.severity, s.severity); // Error is the least
            p.block.selected = p.block.selected || selected;
            continue;
        }
        flush(p);
        p.block =
            TimelineBlock{rank, t, s.start, s.end, s.kind, 1, index, index + 1, selected, row};
        p.block.severity = s.severity;
        std::fill(std::begin(p.kindCounts), std::end(p.kindCounts), 0);
        ++p.kindCounts[int(s.kind)];
        p.open = true;
        if (wide) flush(p);
    }
    for (Pending &p : rows)
        flush(p);
}

std::vector<ParamId> GatherSpans::paramsIn(const TimelineBlock &block) const
{
    std::vector<ParamId> params;
    const auto &v = track(block.rank, block.track);
    const std::size_t last = std::min(block.last, v.size());
    for (std::size_t i = block.first; i < last; ++i) {
        const GatherSpan &s = v[i];
        if (s.end >= block.start && s.start <= block.end && s.param != kNoParam &&
            std::min(int(s.row), kMaxFetchRows - 1) == block.row)
            params.push_back(s.param);
    }
    std::sort(params.begin(), params.end());
    params.erase(std::unique(params.begin(), params.end()), params.end());
    return params;
}

} // namespace shardscope::views

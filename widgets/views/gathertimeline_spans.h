#pragma once
// The gather timeline's data: per-rank, start-sorted vectors of fetch spans, release and
// broadcast marks and violation marks built from telemetry events, searched by binary
// search and merged per pixel (level of detail) so millions of events stay cheap to draw.
// Fetches of a rank that are in flight together (asynchronous prefetches) are stacked in
// sub-rows of the fetch track, so none hides another.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "base/names.h"
#include "state/shape.h"
#include "telemetry/event.h"

namespace shardscope::views {

// What a span is: a fetch's reason (the first five are FetchReason's values, taken from it,
// not restated), then the spans that are no fetch.
enum class SpanKind : std::uint8_t
{
    Forward = std::uint8_t(FetchReason::Forward),
    Backward = std::uint8_t(FetchReason::Backward),
    Prefetch = std::uint8_t(FetchReason::Prefetch),
    GatheredParameters = std::uint8_t(FetchReason::GatheredParameters),
    Guard = std::uint8_t(FetchReason::Guard),
    Release,
    Broadcast,
    Violation,
    ReduceScatter, // a gradient reduce-scatter (backward), on its own track
};
static_assert(std::size_t(SpanKind::Guard) + 1 == kFetchReasonNames.size(),
              "a FetchReason without its SpanKind");
inline constexpr int kSpanKindCount = 9;

// The rows drawn inside a rank's lane.
enum class SpanTrack : std::uint8_t
{
    Fetch = 0,
    Mark = 1,
    Violation = 2,
    ReduceScatter = 3
};
inline constexpr int kSpanTrackCount = 4;

struct GatherSpan
{
    double start = 0;            // seconds since the time origin
    double end = 0;              // == start for marks and violations
    ParamId param = kNoParam;    // kNoParam: a reduce-scatter of a whole group
    ModuleId module = kNoModule; // the module that caused it (fetch, release), the accessor,
                                 // or whose gradients were reduced
    SpanKind kind = SpanKind::Forward;
    std::uint8_t row = 0;                // fetch sub-row, < GatherSpans::kMaxFetchRows; 0 for marks
    std::uint32_t params = 0;            // parameters a reduce-scatter reduced
    std::uint64_t bytes = 0;             // a fetch's bytes gathered (its FetchEnd's)
    Severity severity = Severity::Error; // a violation's (state/severity.h): its mark's colour
};

// One drawn block: a single span, or several sub-pixel spans merged into one.
struct TimelineBlock
{
    int rank = 0;
    SpanTrack track = SpanTrack::Fetch;
    double start = 0;
    double end = 0;
    SpanKind kind = SpanKind::Forward; // the most frequent kind among the merged spans
    int count = 0;                     // spans merged into this block
    std::size_t first = 0;             // index range of the spans in the track vector
    std::size_t last = 0;
    bool selected = false;               // holds a parameter of the current selection
    int row = 0;                         // fetch sub-row; blocks merge only spans of one row
    Severity severity = Severity::Error; // violations: the worst among the merged spans
};

struct OpenFetch
{
    int rank = 0;
    double start = 0;
    ParamId param = kNoParam;
    SpanKind kind = SpanKind::Forward;
    int row = 0; // kept when the fetch ends
};

class GatherSpans
{
  public:
    // Timestamps are shown relative to the origin; without one, the first event sets it.
    void setTimeOrigin(std::uint64_t tsNs);
    bool hasTimeOrigin() const { return m_hasOrigin; }
    std::uint64_t timeOrigin() const { return m_origin; }

    // Events of any type and order; only the ones the timeline draws are kept. Events with
    // a rank at or above maxRanks are ignored (a corrupt record must not create lanes).
    void append(std::span<const telemetry::Event> events);
    void clear();

    int laneCount() const { return int(m_lanes.size()); }
    std::size_t spanCount() const { return m_counts[0]; }      // closed fetch spans
    std::size_t markCount() const { return m_counts[1]; }      // releases and broadcasts
    std::size_t violationCount() const { return m_counts[2]; } // unregistered accesses, bad writes
    std::size_t reduceScatterCount() const { return m_counts[3]; } // closed reduce-scatter spans
    bool isEmpty() const { return !m_hasData; }
    double firstTime() const { return m_first; }
    double lastTime() const { return m_last; }

    const std::vector<GatherSpan> &track(int rank, SpanTrack t) const;
    // Fetches begun and not yet ended; a rank's StepBegin discards its older ones.
    std::vector<OpenFetch> openFetches() const;
    // Sub-rows rank's fetch track has needed so far: 1 + the highest row a fetch took. A
    // fetch takes the lowest row no fetch in flight on its rank holds when it begins;
    // since a rank's events come in time order, that is the lowest row free at its start
    // time, and it keeps the row when it ends. Past kMaxFetchRows - 1 they share the last.
    int fetchRows(int rank) const;
    // First StepBegin seen for each step, in seconds.
    const std::map<std::uint32_t, double> &steps() const { return m_steps; }

    // Blocks of rank's track that intersect [t0, t1], where spans narrower than minPixels
    // (at secondsPerPixel) that lie within minPixels of each other are merged.
    // selectedParams (sorted) marks blocks that hold one of them.
    void blocks(int rank, SpanTrack t, double t0, double t1, double secondsPerPixel,
                std::vector<TimelineBlock> &out, const std::vector<ParamId> &selectedParams = {},
                double minPixels = 1.0) const;
    // Navigation: the span of track t nearest after (forward) or before `at` (its middle
    // strictly past `at`), on rank (or any rank when rank < 0), of parameter param (any when
    // kNoParam); with the rank it is on. Ties between ranks go to the lower rank.
    struct Found
    {
        GatherSpan span;
        int rank = 0;
    };
    std::optional<Found> nearest(SpanTrack t, double at, bool forward, int rank = -1,
                                 ParamId param = kNoParam) const;

    // A selected time range's gathers: the fetch spans that begin in [t0, t1) on rank (all
    // ranks when rank < 0), summed per parameter and per module that caused them.
    struct Totals
    {
        std::uint64_t gathers = 0;
        double seconds = 0;
        std::uint64_t bytes = 0;
    };
    void summarize(double t0, double t1, int rank, std::unordered_map<ParamId, Totals> &params,
                   std::unordered_map<ModuleId, Totals> &modules) const;

    // Distinct parameters of the spans in block, sorted.
    std::vector<ParamId> paramsIn(const TimelineBlock &block) const;

    static constexpr int maxRanks = 1024;
    static constexpr std::size_t kChunk = 256;
    static constexpr int kMaxFetchRows = 4;

  private:
    struct Lane
    {
        std::vector<GatherSpan> tracks[kSpanTrackCount];
        double maxDuration[kSpanTrackCount] = {};
        std::size_t sortedUpTo[kSpanTrackCount] = {};
        std::vector<double> chunkMaxEnd[kSpanTrackCount];
        std::uint32_t rowInFlight[kMaxFetchRows] = {}; // open fetches holding each row
        int fetchRows = 1;
    };

    double secondsOf(std::uint64_t tsNs) const;
    void add(int rank, SpanTrack t, const GatherSpan &s);
    void sortTails();
    Lane &lane(int rank);
    static int lowestFreeRow(const Lane &l);

    bool m_hasOrigin = false;
    std::uint64_t m_origin = 0;
    bool m_hasData = false;
    double m_first = 0;
    double m_last = 0;
    std::vector<Lane> m_lanes;
    std::size_t m_counts[kSpanTrackCount] = {};
    std::unordered_map<std::uint64_t, OpenFetch> m_open; // key: rank << 32 | param
    struct OpenReduce
    {
        int rank = 0;
        double start = 0;
    };
    // Reduce-scatters begun: key (rank, module, param), as the protocol matches them.
    std::map<std::tuple<int, ModuleId, ParamId>, OpenReduce> m_openReduces;
    std::map<std::uint32_t, double> m_steps;
};

} // namespace shardscope::views

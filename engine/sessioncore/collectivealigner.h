#pragma once
// The job's aligner (issue 51): lines up the ranks of a job by their collectives' sequence
// numbers (collective_begin/end, docs/protocol.md) and says where they diverged.
//
// Interface (what the GUI, shardscope-capture and shardscope-check read):
//   - CollectiveAligner: fed every event of a job (any kind; it reads kinds 22 and 23), on one
//     clock (the job's clock after its shift), with each rank's module paths (setModulePaths)
//     and the ranks' own rank_stalled records (addRankRecord: their watchdogs' lines). tick(now)
//     (live: telemetry clock now, on a timer) or finish(end) (a recording that ended) decides
//     stalls. It never allocates per event once a group's window is warm.
//   - records(): its collective_mismatch and job-level rank_stalled records (kind, sides of
//     ranks with their signatures or positions, per-rank sites), words from
//     state::describeViolation in the dialect of options.dialect; revision() changes whenever
//     they do. Callers add them to the job's violations through the one ledger
//     (state::ViolationLedger::add with Tally::Total, or addToLedger below).
//   - progress(): one RankProgress per rank: its current (or last) collective, whether it waits,
//     is stalled, diverged, ended, or sends no sequence numbers.
//   - stragglers(): per collective completed by every rank, the arrival spread and the last rank;
//     summed per rank (StragglerFigures). No fault: no record is made of them.
//   - notes(): what was said once (a rank without sequence numbers, a restarted rank, a jump).
// Rules: at one (group, seq) every rank of a healthy job issues the same signature (kind,
// module path, reason, bytes, parameters): the first two ranks that differ make the group's one
// collective_mismatch (later seqs of a diverged group are not compared again). A rank waiting in
// (group, seq) longer than options.stallNs, or whose own watchdog said so, while some rank never
// reached seq (behind, or its run ended) makes one rank_stalled for (group, seq). A seq that goes
// backwards restarts that rank's alignment in its group (an epoch of its own: compared only with
// ranks that restarted as often), said once; a jump forward is said once. Memory: per group and
// epoch a window of the seqs some rank has not passed yet, at most options.window of them.
//
// Group numbers are each producer's own (0: the default group); ranks of one job number their
// groups in the order they first use them, so the same number means the same role.

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "state/stallthreshold.h"
#include "state/state.h"
#include "state/violationledger.h"
#include "state/violationtext.h"
#include "telemetry/event.h"
#include "wire/snapshot.h"

namespace shardscope::sessioncore {

struct AlignerOptions
{
    // How long a rank may wait in a collective that some rank has not reached (ns).
    std::uint64_t stallNs = 5'000'000'000ull;
    // The most seqs kept per group and epoch; older ones are dropped (counted, not compared).
    std::size_t window = 2048;
    state::FixDialect dialect = state::FixDialect::ShardScope;
};

// Where one rank is (the GUI's per-rank progress view).
struct RankProgress
{
    int rank = 0;
    bool present = false;    // any event of it was seen
    bool aligned = false;    // it sent collective_begin (false: none yet, or an older agent)
    bool noSequence = false; // it ran steps without any: an older agent, said once, not aligned
    bool finished = false;   // its run ended (rankFinished / finish)
    bool inFlight = false;   // the collective below has begun and not ended
    bool stalled = false;    // a rank_stalled names it as waiting
    bool diverged = false;   // a collective_mismatch names it
    std::uint32_t group = 0;
    std::uint64_t seq = 0; // 0: no collective yet
    CollectiveKind kind = CollectiveKind::AllGather;
    ModuleId module = kNoModule; // as its process numbers it
    std::string modulePath;      // "" the root; see hasModule
    bool hasModule = false;
    FetchReason reason = FetchReason::Forward;
    std::uint64_t sinceNs = 0;   // its begin
    state::SourceLocation where; // its own watchdog's line, when it said one
};

struct StragglerFigures
{
    int rank = 0;
    std::uint64_t collectives = 0; // collectives it took part in, completed by every rank
    std::uint64_t timesLast = 0;   // of those, how often it arrived last
    std::uint64_t totalLateNs = 0; // sum over them of its arrival minus the first arrival
    std::uint64_t maxLateNs = 0;
};

struct StragglerSummary
{
    std::uint64_t collectives = 0; // completed by every rank of their group
    std::uint64_t totalSpreadNs = 0;
    std::uint64_t maxSpreadNs = 0;
    std::vector<StragglerFigures> ranks; // by rank
};

// The job's straggler, the one rule every view names it by: the rank with the most lateness in
// all (ties: the one last most often); nullptr while no rank has arrived last.
const StragglerFigures *latestRank(const StragglerSummary &summary);

class CollectiveAligner
{
  public:
    explicit CollectiveAligner(int worldSize = 1, AlignerOptions options = {});

    void setOptions(const AlignerOptions &options) { m_options = options; }
    const AlignerOptions &options() const { return m_options; }
    // Module id -> dotted path as rank `rank`'s process numbers its modules (index == id).
    void setModulePaths(int rank, std::vector<std::string> paths);
    // The same paths for every rank (a merged state's structure).
    void setModulePaths(const std::vector<state::ModuleRecord> &modules);

    // Any event of the job; reads collective_begin/end, and notes that the rank is present.
    // seenNs: when this process received it, on the clock tick() is given (a live store: its
    // clock), so that a wait is measured from the receipt whatever the producer's host clock
    // says (a rank's history, received late, waits at most since then: never a false stall);
    // 0: measured from the event's own time (a recording, finish()).
    void add(const telemetry::Event &e, std::uint64_t seenNs = 0);
    // A rank's own records (any kind; reads rank_stalled of one rank: its watchdog's line).
    void addRankRecord(const state::ViolationRecord &v);
    // Rank `rank`'s run ended (its Goodbye, its process gone); how: the Goodbye's reason.
    void rankFinished(int rank, const std::string &how = {});
    // Live: decide stalls at `nowNs` (the events' clock).
    void tick(std::uint64_t nowNs);
    // A recording that ended at endNs (the job's last event): every rank not waiting in a
    // collective has finished; stalls are decided with endNs and the ranks' own records.
    void finish(std::uint64_t endNs);

    const std::vector<state::ViolationRecord> &records() const { return m_records; }
    std::uint64_t revision() const { return m_revision; }
    std::vector<RankProgress> progress() const;
    StragglerSummary stragglers() const;
    const std::vector<std::string> &notes() const { return m_notes; }
    std::uint64_t eventsAligned() const { return m_aligned; }
    std::size_t windowedSeqs() const; // seqs held in windows now (memory)

  private:
    struct Signature
    {
        CollectiveKind kind = CollectiveKind::AllGather;
        ModuleId module = kNoModule;
        FetchReason reason = FetchReason::Forward;
        std::uint64_t bytes = 0;
        std::uint32_t params = 0;
    };
    struct Arrival
    {
        bool began = false;
        std::uint64_t beginNs = 0;
        std::uint32_t step = 0;
        Signature sig;
    };
    struct Slot
    {
        std::uint64_t seq = 0;
        int arrived = 0;
        int first = -1; // the first rank that arrived
        std::vector<Arrival> ranks;
    };
    struct Window // one (group, epoch)
    {
        std::deque<Slot> seqs; // ascending seq, contiguous from seqs.front().seq
        // Ranks expected at each seq: every rank of the world less those gone (ended, without
        // sequence numbers) and those that restarted away from this epoch.
        int expected = 0;
        bool created = false;
        bool mismatched = false;
    };
    struct Open
    {
        std::uint64_t seq = 0;
        std::uint64_t sinceNs = 0;
        std::uint64_t seenNs = 0; // 0: not known
        Signature sig;
        std::uint64_t waited(std::uint64_t now) const
        {
            const std::uint64_t from = seenNs ? seenNs : sinceNs;
            return now > from ? now - from : 0;
        }
    };
    struct RankGroup
    {
        bool began = false;
        std::uint32_t epoch = 0;
        std::uint64_t lastSeq = 0;
        std::vector<Open> open; // begun, not ended; ascending seq
    };
    struct Rank
    {
        bool present = false, aligned = false, finished = false, steps = false;
        bool saidNoSequence = false;
        bool gone = false; // left the windows' expected ranks (ended, no sequence numbers)
        std::string how;
        std::vector<RankGroup> groups;
        std::vector<std::string> paths; // empty: the shared ones
        // the latest collective it began
        std::uint32_t group = 0;
        std::uint64_t seq = 0, sinceNs = 0;
        Signature sig;
        // its watchdog's lines: (group, seq) -> site
        std::map<std::pair<std::uint32_t, std::uint64_t>, state::CollectiveSite> sites;
        bool stalled = false, diverged = false;
        StragglerFigures straggle;
    };

    Rank &rank(int r);
    Window &window(std::uint32_t group, std::uint32_t epoch);
    void begin(const telemetry::Event &e, std::uint64_t seenNs);
    void end(const telemetry::Event &e);
    bool sameSignature(int ra, const Signature &a, int rb, const Signature &b) const;
    const std::string *pathOf(int r, ModuleId m) const;
    state::CollectiveSide sideOf(int r, const Signature &s, CollectivePosition p,
                                 std::uint64_t seq) const;
    void completeFront(Window &w);
    void leave(int r); // r is no longer expected at any seq of its windows
    void mismatch(std::uint32_t group, std::uint32_t epoch, const Slot &slot);
    void stalls(std::uint64_t nowNs, bool ended);
    void addSites(state::CollectiveDetail &d) const;
    void addRecord(ViolationKind kind, state::CollectiveDetail d, int rank, ModuleId module,
                   std::uint32_t step, std::uint64_t tsNs);
    void redescribe();
    void note(std::string text);

    AlignerOptions m_options;
    int m_world = 1;
    std::vector<Rank> m_ranks;
    std::vector<std::string> m_paths;          // the shared structure
    std::vector<std::vector<Window>> m_groups; // group -> epoch -> window
    std::vector<Slot> m_free;                  // recycled seqs
    std::vector<state::ViolationRecord> m_records;
    std::map<std::pair<std::uint32_t, std::uint64_t>, std::size_t> m_stallAt; // -> m_records
    std::vector<std::string> m_notes;
    std::uint64_t m_revision = 0, m_aligned = 0;
    std::uint64_t m_lastTs = 0;
    StragglerSummary m_spread;
};

// The job's merged snapshot (wire::mergeJobSnapshots / mergeSnapshotFiles) diagnosed: its
// events aligned with its structure and its ranks' own rank_stalled records, the recording
// taken as ended at its last event. Adds the aligner's records to snapshot.state.violations
// (through the one ledger) and returns the aligner (for its stragglers, progress and notes).
// stallNs: 0 reads SHARDSCOPE_STALL_SECONDS (default defaultStallNs of the job's backend); a bad
// value is reported in `error` and the default kept.
struct JobDiagnosis
{
    CollectiveAligner aligner;
    std::vector<state::ViolationRecord> records; // what was added
    std::string error;                           // a bad SHARDSCOPE_STALL_SECONDS
};
// parts: the processes' own snapshots the merge was made of, when the caller has them: each
// rank's module paths then come from its own process (module ids are per process), else
// every rank reads the merged structure's.
JobDiagnosis diagnoseJob(wire::Snapshot &snapshot, std::uint64_t stallNs = 0,
                         const std::vector<wire::Snapshot> *parts = nullptr);
// Each rank of `state`'s local_ranks numbers its modules as `state` lists them.
void setRankPaths(CollectiveAligner &aligner, const state::EngineState &state);

// The one threshold (state/stallthreshold.h), as the aligner's callers have always named it.
using state::defaultStallNs;
using state::stallNsFromEnvironment;

} // namespace shardscope::sessioncore

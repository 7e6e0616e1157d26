#pragma once
// The one ledger of violations. The engine's access guard, the agents' state, the merge of a
// job's processes and the inspector's store all count violations here, through one call
// (add) and one grouping rule (ViolationKey): a row per distinct violation, with an entry per
// rank that saw it. A snapshot's records are the rows' entries (records()).

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "state/state.h"

namespace shardscope::state {

// What makes two sightings one violation: its kind, the module that read (for
// trace_invalidated: the module entered), the parameter, its owner (for
// trace_invalidated: the module expected) and where in the user's code it happened (file and
// line: one row per distinct location). Rank and step are counted, not grouped by.
struct ViolationKey
{
    ViolationKind kind = ViolationKind::UnregisteredAccess;
    ModuleId accessor = kNoModule;
    ParamId param = kNoParam;
    ModuleId owner = kNoModule;
    std::string file;
    std::uint32_t line = 0;
    // A job's collective record (collective_mismatch, and a rank_stalled naming more than one
    // rank: the aligner's): one row per collective, (group, seq + 1); 0 for every other record,
    // a rank's own rank_stalled included (its rows aggregate over seqs like any other).
    std::uint32_t group = 0;
    std::uint64_t jobSeq = 0;

    auto operator<=>(const ViolationKey &) const = default;
};

ViolationKey keyOf(const ViolationRecord &v);
// The key's jobSeq of a record's collective detail (see ViolationKey).
std::uint64_t jobSeqOf(ViolationKind kind, const CollectiveDetail &d);

// How a sighting counts into what its rank has.
enum class Tally : std::uint8_t
{
    Add,   // more sightings: a producer seeing it again, a live event
    Total, // the producer's running total for the rank (a State's record): it replaces the
           // rank's count, steps and first time
    Max    // one of two totals for the same rank (two processes listing it): the larger stands
};

// Where a sighting's words come from.
enum class Words : std::uint8_t
{
    Final,      // the producer's, or written from every name they need
    Provisional // written before the parameter's name was known: the next Final words replace them
};

struct ViolationRow
{
    ViolationKind kind = ViolationKind::UnregisteredAccess;
    ModuleId accessor = kNoModule;
    ParamId param = kNoParam;
    ModuleId owner = kNoModule;
    ParamStatus status = ParamStatus::NotAvailable; // as last seen
    GuardAction action = GuardAction::Recorded;     // as last seen
    // What the reads touched: Attribute until a sighting reads the values (then Values for good).
    ViolationRead read = ViolationRead::Values;
    Severity severity = Severity::Error; // severityOf(kind, action, read), kept by add
    std::string paramName;               // kept when the parameter is removed (weight_norm)
    std::string fix;                     // the words the row was first shown with
    std::string message;
    SourceLocation location;     // the key's file and line, with the function and chain first seen
    std::string building;        // the modules under construction, if it happened while building
    CollectiveDetail collective; // collective_mismatch, rank_stalled: as first seen (or final)
    bool provisionalWords = false;

    // Over all ranks: the earliest sighting (its step and rank), the last step, the count.
    std::uint32_t firstStep = 0;
    std::uint32_t lastStep = 0;
    std::uint64_t firstTsNs = 0;
    int firstRank = 0;
    std::uint64_t count = 0;

    // One entry per rank that saw it, sorted by rank: what a snapshot records.
    struct PerRank
    {
        int rank = 0;
        std::uint32_t firstStep = 0;
        std::uint32_t lastStep = 0;
        std::uint64_t firstTsNs = 0;
        std::uint64_t count = 0;
    };
    std::vector<PerRank> ranks;

    ViolationKey key() const
    {
        return {kind,
                accessor,
                param,
                owner,
                location.file,
                location.line,
                collective.group,
                jobSeqOf(kind, collective)};
    }
    // Bit r set when rank r (< 64) saw it.
    std::uint64_t rankMask() const;
};

class ViolationLedger
{
  public:
    struct Added
    {
        std::size_t row = 0;  // index into rows()
        bool newRow = false;  // the first sighting of this violation
        bool newRank = false; // the first sighting on v.rank
        bool changed = false; // anything the rows show changed
    };
    // Counts v (its rank, steps, first time, count, status, action, read) into its row,
    // creating the row with v's name and words, and gives the row its severity (severityOf:
    // v's own is not read); a row keeps the words it was created with unless they
    // were Provisional and v's are Final. The row's figures over all ranks follow its ranks'.
    Added add(const ViolationRecord &v, Tally tally, Words words = Words::Final);

    const std::vector<ViolationRow> &rows() const { return m_rows; }
    const ViolationRow *find(const ViolationKey &key) const;
    std::size_t size() const { return m_rows.size(); }
    bool empty() const { return m_rows.empty(); }
    void clear();

    // One record per (row, rank), rows in the order they were first seen: what a snapshot's
    // and a State's "violations" carry.
    std::vector<ViolationRecord> records() const;

  private:
    std::vector<ViolationRow> m_rows;
    std::map<ViolationKey, std::size_t> m_index;
};

} // namespace shardscope::state

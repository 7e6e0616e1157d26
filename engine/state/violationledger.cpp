#include "state/violationledger.h"

#include <algorithm>

#include "state/severity.h"

namespace shardscope::state {

std::uint64_t jobSeqOf(ViolationKind kind, const CollectiveDetail &d)
{
    if (d.empty()) return 0;
    const bool job = kind == ViolationKind::CollectiveMismatch || d.sides.size() > 1 ||
                     (!d.sides.empty() && d.sides.front().ranks.size() > 1);
    return job ? d.seq + 1 : 0;
}

ViolationKey keyOf(const ViolationRecord &v)
{
    const std::uint64_t jobSeq = jobSeqOf(v.kind, v.collective);
    return {v.kind,
            v.accessor,
            v.param,
            v.owner,
            v.location.file,
            v.location.line,
            jobSeq ? v.collective.group : 0u,
            jobSeq};
}

std::uint64_t ViolationRow::rankMask() const
{
    std::uint64_t mask = 0;
    for (const PerRank &r : ranks)
        if (r.rank >= 0 && r.rank < 64) mask |= std::uint64_t(1) << r.rank;
    return mask;
}

namespace {

// The row's figures over all ranks, from its ranks.
void summarize(ViolationRow &row)
{
    row.count = 0;
    row.lastStep = 0;
    const ViolationRow::PerRank *first = nullptr;
    for (const ViolationRow::PerRank &r : row.ranks) {
        row.count += r.count;
        row.lastStep = std::max(row.lastStep, r.lastStep);
        if (!first || r.firstTsNs < first->firstTsNs) first = &r;
    }
    if (first) {
        row.firstTsNs = first->firstTsNs;
        row.firstStep = first->firstStep;
        row.firstRank = first->rank;
    }
}

} // namespace

ViolationLedger::Added ViolationLedger::add(const ViolationRecord &v, Tally tally, Words words)
{
    Added out;
    const ViolationKey key = keyOf(v);
    auto it = m_index.find(key);
    if (it == m_index.end()) {
        // A live event carries no location, its producer's records do: the two are one row.
        // An unlocated sighting counts into the first located row of its violation; a located
        // one takes over the row an unlocated one made.
        const ViolationKey base{key.kind, key.accessor, key.param, key.owner, {},
                                0,        key.group,    key.jobSeq};
        auto same = m_index.lower_bound(base);
        const auto sameBase = [&](const ViolationKey &k) {
            return k.kind == key.kind && k.accessor == key.accessor && k.param == key.param &&
                   k.owner == key.owner && k.group == key.group && k.jobSeq == key.jobSeq;
        };
        if (same != m_index.end() && sameBase(same->first)) {
            if (key.file.empty()) {
                it = same;
            } else if (same->first.file.empty()) {
                const std::size_t at = same->second;
                m_index.erase(same);
                m_rows[at].location = v.location;
                if (m_rows[at].building.empty()) m_rows[at].building = v.building;
                it = m_index.emplace(key, at).first;
                out.changed = true;
            }
        }
    }
    if (it == m_index.end()) {
        ViolationRow row;
        row.kind = v.kind;
        row.accessor = v.accessor;
        row.param = v.param;
        row.owner = v.owner;
        row.paramName = v.paramName;
        row.fix = v.fix;
        row.message = v.message;
        row.location = v.location;
        row.building = v.building;
        row.collective = v.collective;
        row.read = v.read;
        row.provisionalWords = words == Words::Provisional;
        it = m_index.emplace(key, m_rows.size()).first;
        m_rows.push_back(std::move(row));
        out.newRow = true;
    }
    out.row = it->second;
    ViolationRow &row = m_rows[out.row];
    if (row.provisionalWords && words == Words::Final) {
        row.paramName = v.paramName.empty() ? row.paramName : v.paramName;
        row.fix = v.fix;
        row.message = v.message;
        if (!v.building.empty()) row.building = v.building;
        if (!v.collective.empty()) row.collective = v.collective;
        row.provisionalWords = false;
        out.changed = true;
    }
    if (row.read == ViolationRead::Attribute && v.read == ViolationRead::Values) {
        // Read for its values after all: a values read from then on, in the words that say so.
        row.read = ViolationRead::Values;
        if (words == Words::Final) {
            row.fix = v.fix;
            row.message = v.message;
        }
        out.changed = true;
    }
    out.changed |= row.status != v.status || row.action != v.action;
    row.status = v.status;
    row.action = v.action;
    row.severity = severityOf(row.kind, row.action, row.read);

    auto r =
        std::lower_bound(row.ranks.begin(), row.ranks.end(), v.rank,
                         [](const ViolationRow::PerRank &e, int rank) { return e.rank < rank; });
    const ViolationRow::PerRank mine{v.rank, v.step, v.lastStep, v.tsNs, v.count};
    if (r == row.ranks.end() || r->rank != v.rank) {
        row.ranks.insert(r, mine);
        out.newRank = true;
    } else {
        const ViolationRow::PerRank before = *r;
        switch (tally) {
        case Tally::Add:
            r->count += v.count;
            r->lastStep = std::max(r->lastStep, v.lastStep);
            if (v.tsNs < r->firstTsNs) {
                r->firstTsNs = v.tsNs;
                r->firstStep = v.step;
            }
            break;
        case Tally::Total:
            *r = mine;
            break;
        case Tally::Max:
            if (v.count > r->count) *r = mine;
            break;
        }
        out.changed |= r->count != before.count || r->lastStep != before.lastStep ||
                       r->firstTsNs != before.firstTsNs;
    }
    out.changed |= out.newRow || out.newRank;
    if (out.changed) summarize(row);
    return out;
}

const ViolationRow *ViolationLedger::find(const ViolationKey &key) const
{
    auto it = m_index.find(key);
    if (it == m_index.end() && key.file.empty()) {
        // An unlocated sighting (a live event) belongs to its violation's first located row.
        it = m_index.lower_bound(key);
        if (it != m_index.end() &&
            (it->first.kind != key.kind || it->first.accessor != key.accessor ||
             it->first.param != key.param || it->first.owner != key.owner))
            it = m_index.end();
    }
    return it == m_index.end() ? nullptr : &m_rows[it->second];
}

void ViolationLedger::clear()
{
    m_rows.clear();
    m_index.clear();
}

std::vector<ViolationRecord> ViolationLedger::records() const
{
    std::vector<ViolationRecord> out;
    for (const ViolationRow &row : m_rows) {
        for (const ViolationRow::PerRank &r : row.ranks) {
            ViolationRecord v;
            v.kind = row.kind;
            v.step = r.firstStep;
            v.lastStep = r.lastStep;
            v.rank = r.rank;
            v.accessor = row.accessor;
            v.param = row.param;
            v.paramName = row.paramName;
            v.owner = row.owner;
            v.status = row.status;
            v.action = row.action;
            v.read = row.read;
            v.severity = row.severity;
            v.count = r.count;
            v.tsNs = r.firstTsNs;
            v.fix = row.fix;
            v.message = row.message;
            v.location = row.location;
            v.building = row.building;
            v.collective = row.collective;
            out.push_back(std::move(v));
        }
    }
    return out;
}

} // namespace shardscope::state

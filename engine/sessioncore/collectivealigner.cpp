#include "sessioncore/collectivealigner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "telemetry/eventfields.h"

namespace shardscope::sessioncore {

CollectiveAligner::CollectiveAligner(int worldSize, AlignerOptions options)
    : m_options(options), m_world(std::max(worldSize, 1))
{
    m_ranks.resize(static_cast<std::size_t>(m_world));
}

CollectiveAligner::Rank &CollectiveAligner::rank(int r)
{
    if (r >= static_cast<int>(m_ranks.size())) {
        const int more = r + 1 - m_world;
        m_ranks.resize(static_cast<std::size_t>(r) + 1);
        m_world = r + 1;
        for (auto &epochs : m_groups)
            for (Window &w : epochs)
                if (w.created) w.expected += more;
    }
    return m_ranks[static_cast<std::size_t>(r)];
}

CollectiveAligner::Window &CollectiveAligner::window(std::uint32_t group, std::uint32_t epoch)
{
    if (group >= m_groups.size()) m_groups.resize(std::size_t(group) + 1);
    std::vector<Window> &epochs = m_groups[group];
    if (epoch >= epochs.size()) epochs.resize(std::size_t(epoch) + 1);
    Window &w = epochs[epoch];
    if (!w.created) {
        w.created = true;
        w.expected = m_world;
        for (const Rank &rk : m_ranks)
            if (rk.gone) --w.expected;
    }
    return w;
}

void CollectiveAligner::setModulePaths(int r, std::vector<std::string> paths)
{
    rank(r).paths = std::move(paths);
}

void CollectiveAligner::setModulePaths(const std::vector<state::ModuleRecord> &modules)
{
    m_paths.clear();
    m_paths.reserve(modules.size());
    for (const state::ModuleRecord &m : modules)
        m_paths.push_back(m.path);
}

const std::string *CollectiveAligner::pathOf(int r, ModuleId m) const
{
    const std::vector<std::string> &own = m_ranks[static_cast<std::size_t>(r)].paths;
    const std::vector<std::string> &paths = own.empty() ? m_paths : own;
    return m < paths.size() ? &paths[m] : nullptr;
}

bool CollectiveAligner::sameSignature(int ra, const Signature &a, int rb, const Signature &b) const
{
    if (a.kind != b.kind || a.reason != b.reason || a.bytes != b.bytes || a.params != b.params)
        return false;
    if (a.module == b.module && m_ranks[std::size_t(ra)].paths.empty() &&
        m_ranks[std::size_t(rb)].paths.empty())
        return true;
    if ((a.module == kNoModule) != (b.module == kNoModule)) return false;
    const std::string *pa = pathOf(ra, a.module), *pb = pathOf(rb, b.module);
    // A module a rank's structure does not list yet: its id is all there is.
    if (!pa || !pb) return a.module == b.module;
    return *pa == *pb;
}

void CollectiveAligner::note(std::string text)
{
    m_notes.push_back(std::move(text));
    ++m_revision;
}

void CollectiveAligner::add(const telemetry::Event &e, std::uint64_t seenNs)
{
    if (e.tsNs > m_lastTs) m_lastTs = e.tsNs;
    switch (e.type) {
    case EventType::CollectiveBegin:
        begin(e, seenNs);
        break;
    case EventType::CollectiveEnd:
        end(e);
        break;
    case EventType::StepEnd: {
        Rank &rk = rank(e.rank);
        rk.present = true;
        rk.steps = true;
        break;
    }
    default:
        rank(e.rank).present = true;
        break;
    }
}

void CollectiveAligner::begin(const telemetry::Event &e, std::uint64_t seenNs)
{
    const int r = e.rank;
    Rank &rk = rank(r);
    rk.present = rk.aligned = true;
    const telemetry::CollectiveFields f = telemetry::readCollective(e);
    const Signature sig{f.kind, f.module, f.reason, f.bytes, f.params};
    if (f.group >= rk.groups.size()) rk.groups.resize(std::size_t(f.group) + 1);
    RankGroup &g = rk.groups[f.group];
    if (g.began && f.seq <= g.lastSeq) {
        // A restarted rank (or its events replayed): its own epoch from here on.
        Window &old = window(f.group, g.epoch);
        if (old.expected > 0) --old.expected;
        note("rank " + std::to_string(r) + "'s collectives of group " + std::to_string(f.group) +
             " went back from #" + std::to_string(g.lastSeq) + " to #" + std::to_string(f.seq) +
             " (a restarted rank?): its alignment starts again there");
        ++g.epoch;
        g.began = false;
        g.open.clear();
        completeFront(old);
    } else if (g.began && f.seq > g.lastSeq + 1) {
        note("rank " + std::to_string(r) + " skipped collectives #" +
             std::to_string(g.lastSeq + 1) + " to #" + std::to_string(f.seq - 1) + " of group " +
             std::to_string(f.group) + " (events dropped?): they are not compared");
    }
    Window &w = window(f.group, g.epoch);
    g.began = true;
    g.lastSeq = f.seq;
    g.open.push_back({f.seq, e.tsNs, seenNs, sig});
    rk.group = f.group;
    rk.seq = f.seq;
    rk.sinceNs = e.tsNs;
    rk.sig = sig;
    ++m_aligned;

    // Its slot: the window runs from its front's seq, contiguous.
    if (w.seqs.empty() || f.seq >= w.seqs.front().seq) {
        if (w.seqs.empty() || f.seq > w.seqs.back().seq) {
            const std::uint64_t from = w.seqs.empty() ? f.seq : w.seqs.back().seq + 1;
            if (f.seq - from >= m_options.window) w.seqs.clear(); // a jump past the whole window
            for (std::uint64_t s = w.seqs.empty() ? f.seq : from; s <= f.seq; ++s) {
                Slot slot;
                if (!m_free.empty()) {
                    slot = std::move(m_free.back());
                    m_free.pop_back();
                }
                slot.seq = s;
                slot.arrived = 0;
                slot.first = -1;
                slot.ranks.assign(m_ranks.size(), Arrival{});
                w.seqs.push_back(std::move(slot));
            }
        }
        Slot &slot = w.seqs[std::size_t(f.seq - w.seqs.front().seq)];
        if (slot.ranks.size() < m_ranks.size()) slot.ranks.resize(m_ranks.size());
        Arrival &a = slot.ranks[std::size_t(r)];
        if (!a.began) {
            a = {true, e.tsNs, e.step, sig};
            ++slot.arrived;
            if (slot.first < 0) {
                slot.first = r;
            } else if (!w.mismatched &&
                       !sameSignature(slot.first, slot.ranks[std::size_t(slot.first)].sig, r,
                                      sig)) {
                w.mismatched = true;
                mismatch(f.group, g.epoch, slot);
            }
        }
        while (w.seqs.size() > m_options.window) {
            m_free.push_back(std::move(w.seqs.front()));
            w.seqs.pop_front();
        }
    }
    completeFront(w);
}

void CollectiveAligner::end(const telemetry::Event &e)
{
    Rank &rk = rank(e.rank);
    rk.present = true;
    const telemetry::CollectiveFields f = telemetry::readCollective(e);
    if (f.group >= rk.groups.size()) return;
    std::vector<Open> &open = rk.groups[f.group].open;
    const auto it =
        std::find_if(open.begin(), open.end(), [&](const Open &o) { return o.seq == f.seq; });
    if (it != open.end()) open.erase(it);
}

// Drops the seqs every rank of the window has passed, with their straggler figures.
void CollectiveAligner::completeFront(Window &w)
{
    while (!w.seqs.empty() && w.expected > 0 && w.seqs.front().arrived >= w.expected) {
        Slot &slot = w.seqs.front();
        if (slot.arrived >= 2) {
            std::uint64_t first = ~0ull, last = 0;
            int lastRank = -1;
            for (std::size_t r = 0; r < slot.ranks.size(); ++r) {
                const Arrival &a = slot.ranks[r];
                if (!a.began) continue;
                first = std::min(first, a.beginNs);
                if (a.beginNs >= last) {
                    last = a.beginNs;
                    lastRank = int(r);
                }
            }
            const std::uint64_t spread = last - first;
            ++m_spread.collectives;
            m_spread.totalSpreadNs += spread;
            m_spread.maxSpreadNs = std::max(m_spread.maxSpreadNs, spread);
            for (std::size_t r = 0; r < slot.ranks.size(); ++r) {
                const Arrival &a = slot.ranks[r];
                if (!a.began) continue;
                StragglerFigures &s = m_ranks[r].straggle;
                const std::uint64_t late = a.beginNs - first;
                ++s.collectives;
                s.totalLateNs += late;
                s.maxLateNs = std::max(s.maxLateNs, late);
                if (int(r) == lastRank && spread > 0) ++s.timesLast;
            }
        }
        m_free.push_back(std::move(slot));
        w.seqs.pop_front();
    }
}

state::CollectiveSide CollectiveAligner::sideOf(int r, const Signature &s, CollectivePosition p,
                                                std::uint64_t seq) const
{
    state::CollectiveSide side;
    side.ranks = {r};
    side.position = p;
    side.kind = s.kind;
    if (const std::string *path = s.module == kNoModule ? nullptr : pathOf(r, s.module)) {
        side.hasModule = true;
        side.module = *path;
    }
    side.reason = s.reason;
    side.bytes = s.bytes;
    side.params = s.params;
    side.lastSeq = seq;
    return side;
}

namespace {

// Sides that did the same thing become one, ranks ascending; sides ordered by their first rank.
void mergeSides(std::vector<state::CollectiveSide> &sides)
{
    std::vector<state::CollectiveSide> out;
    for (state::CollectiveSide &s : sides) {
        auto same = std::find_if(out.begin(), out.end(), [&](const state::CollectiveSide &o) {
            state::CollectiveSide a = o, b = s;
            a.ranks.clear();
            b.ranks.clear();
            return a == b;
        });
        if (same == out.end())
            out.push_back(std::move(s));
        else
            same->ranks.insert(same->ranks.end(), s.ranks.begin(), s.ranks.end());
    }
    for (state::CollectiveSide &s : out)
        std::sort(s.ranks.begin(), s.ranks.end());
    std::sort(out.begin(), out.end(),
              [](const auto &a, const auto &b) { return a.ranks.front() < b.ranks.front(); });
    sides = std::move(out);
}

} // namespace

void CollectiveAligner::mismatch(std::uint32_t group, std::uint32_t epoch, const Slot &slot)
{
    state::CollectiveDetail d;
    d.group = group;
    d.seq = slot.seq;
    std::uint32_t step = 0;
    std::uint64_t ts = ~0ull;
    for (std::size_t r = 0; r < m_ranks.size(); ++r) {
        const Rank &rk = m_ranks[r];
        if (group >= rk.groups.size() || !rk.groups[group].began || rk.groups[group].epoch != epoch)
            continue;
        const Arrival *a = r < slot.ranks.size() && slot.ranks[r].began ? &slot.ranks[r] : nullptr;
        if (a) {
            const auto &open = rk.groups[group].open;
            const bool waiting = std::any_of(open.begin(), open.end(),
                                             [&](const Open &o) { return o.seq == slot.seq; });
            d.sides.push_back(sideOf(
                int(r), a->sig, waiting ? CollectivePosition::Waiting : CollectivePosition::Issued,
                slot.seq));
            if (a->beginNs < ts) {
                ts = a->beginNs;
                step = a->step;
            }
        } else {
            state::CollectiveSide s;
            s.ranks = {int(r)};
            s.position = rk.finished ? CollectivePosition::Finished : CollectivePosition::Behind;
            s.lastSeq = rk.groups[group].lastSeq;
            d.sides.push_back(s);
        }
    }
    mergeSides(d.sides);
    for (const state::CollectiveSide &s : d.sides)
        if (s.position == CollectivePosition::Issued || s.position == CollectivePosition::Waiting)
            for (int r : s.ranks)
                m_ranks[std::size_t(r)].diverged = true;
    const state::CollectiveSide &first = d.sides.front();
    const int r = first.ranks.front();
    const Arrival &a = slot.ranks[std::size_t(r)];
    addRecord(ViolationKind::CollectiveMismatch, std::move(d), r, a.sig.module, step, ts);
}

void CollectiveAligner::addSites(state::CollectiveDetail &d) const
{
    d.sites.clear();
    for (std::size_t r = 0; r < m_ranks.size(); ++r) {
        const auto &sites = m_ranks[r].sites;
        if (sites.empty()) continue;
        // Its line at this collective, else its latest (where it waits instead).
        const auto at = sites.find({d.group, d.seq});
        const state::CollectiveSite &site =
            at != sites.end() ? at->second
                              : std::max_element(sites.begin(), sites.end(), [](auto &x, auto &y) {
                                    return x.second.waitedMs < y.second.waitedMs;
                                })->second;
        d.sites.push_back(site);
    }
}

void CollectiveAligner::addRecord(ViolationKind kind, state::CollectiveDetail d, int r,
                                  ModuleId module, std::uint32_t step, std::uint64_t tsNs)
{
    addSites(d);
    state::ViolationRecord v;
    v.kind = kind;
    v.step = v.lastStep = step;
    v.rank = r;
    v.accessor = module;
    v.action = GuardAction::Recorded;
    v.count = 1;
    v.tsNs = tsNs == ~0ull ? 0 : tsNs;
    v.collective = std::move(d);
    m_records.push_back(std::move(v));
    redescribe();
}

// Every record's sites and words again (a rank's line may have come since).
void CollectiveAligner::redescribe()
{
    for (state::ViolationRecord &v : m_records) {
        addSites(v.collective);
        state::ViolationSubject s;
        s.kind = v.kind;
        s.collective = v.collective;
        // A rank of a side that ended because its run failed: its exception is the cause.
        for (const state::CollectiveSide &side : v.collective.sides)
            for (int r : side.ranks) {
                const std::string &how = m_ranks[std::size_t(r)].how;
                if (side.position == CollectivePosition::Finished && s.raised.empty() &&
                    how.starts_with("training failed"))
                    s.raised = "rank " + std::to_string(r) + " raised (" + how + ")";
            }
        const state::ViolationText text = state::describeViolation(s, m_options.dialect);
        v.message = text.message;
        v.fix = text.fix;
        v.location = {};
        for (const state::CollectiveSite &site : v.collective.sites)
            if (site.rank == v.rank) v.location = site.where;
    }
    ++m_revision;
}

void CollectiveAligner::addRankRecord(const state::ViolationRecord &v)
{
    if (v.kind != ViolationKind::RankStalled || v.collective.empty()) return;
    for (const state::CollectiveSide &s : v.collective.sides)
        if (s.ranks.size() != 1) return; // a job's record, not a rank's
    for (const state::CollectiveSite &site : v.collective.sites) {
        Rank &rk = rank(site.rank);
        const auto key = std::make_pair(v.collective.group, site.seq);
        if (rk.sites.contains(key)) continue;
        rk.sites.emplace(key, site);
        if (!m_records.empty()) redescribe();
    }
}

void CollectiveAligner::leave(int r)
{
    Rank &rk = m_ranks[std::size_t(r)];
    if (rk.gone) return;
    rk.gone = true;
    for (std::uint32_t g = 0; g < m_groups.size(); ++g) {
        const RankGroup *rg = g < rk.groups.size() ? &rk.groups[g] : nullptr;
        const std::uint32_t epoch = rg ? rg->epoch : 0;
        if (epoch > 0 && !rg->began) continue;
        if (epoch >= m_groups[g].size()) continue;
        Window &w = m_groups[g][epoch];
        if (!w.created) continue;
        if (w.expected > 0) --w.expected;
        completeFront(w);
    }
}

void CollectiveAligner::rankFinished(int r, const std::string &how)
{
    Rank &rk = rank(r);
    if (rk.finished) return;
    rk.finished = true;
    rk.how = how;
    leave(r);
}

void CollectiveAligner::tick(std::uint64_t nowNs)
{
    stalls(nowNs, false);
}

void CollectiveAligner::finish(std::uint64_t endNs)
{
    if (endNs == 0) endNs = m_lastTs;
    for (std::size_t r = 0; r < m_ranks.size(); ++r) {
        Rank &rk = m_ranks[r];
        const bool waiting = std::any_of(rk.groups.begin(), rk.groups.end(),
                                         [](const RankGroup &g) { return !g.open.empty(); });
        if (!waiting) rankFinished(int(r));
    }
    stalls(endNs, true);
}

void CollectiveAligner::stalls(std::uint64_t nowNs, bool ended)
{
    // Ranks that ran steps without a single collective_begin: an older agent.
    const bool anyAligned =
        std::any_of(m_ranks.begin(), m_ranks.end(), [](const Rank &r) { return r.aligned; });
    for (std::size_t r = 0; r < m_ranks.size(); ++r) {
        Rank &rk = m_ranks[r];
        if (anyAligned && rk.present && !rk.aligned && (rk.steps || ended) && !rk.saidNoSequence) {
            rk.saidNoSequence = true;
            leave(int(r));
            note("rank " + std::to_string(r) +
                 " sent no collective sequence numbers (an agent of an earlier release?): it is "
                 "not aligned with the others");
        }
    }
    for (std::size_t r = 0; r < m_ranks.size(); ++r) {
        const Rank &rk = m_ranks[r];
        for (std::uint32_t g = 0; g < rk.groups.size(); ++g) {
            const RankGroup &rg = rk.groups[g];
            if (rg.open.empty()) continue;
            const Open &o = rg.open.front();
            const std::uint64_t waited = o.waited(nowNs);
            const bool said = rk.sites.contains({g, o.seq});
            if ((waited < m_options.stallNs && !said) || m_stallAt.contains({g, o.seq})) continue;
            // Who has not reached it: ranks of the same epoch behind it, or ended before it;
            // in the default group also present ranks that have issued nothing yet.
            state::CollectiveDetail d;
            d.group = g;
            d.seq = o.seq;
            bool missing = false;
            std::uint64_t longest = 0;
            int first = -1;
            for (std::size_t q = 0; q < m_ranks.size(); ++q) {
                const Rank &other = m_ranks[q];
                const RankGroup *og = g < other.groups.size() ? &other.groups[g] : nullptr;
                if (og && og->began && og->epoch == rg.epoch) {
                    const auto open = std::find_if(og->open.begin(), og->open.end(),
                                                   [&](const Open &x) { return x.seq == o.seq; });
                    if (open != og->open.end()) {
                        d.sides.push_back(
                            sideOf(int(q), open->sig, CollectivePosition::Waiting, o.seq));
                        const std::uint64_t w = open->waited(nowNs);
                        longest = std::max(longest, w);
                        if (first < 0) first = int(q);
                    } else if (og->lastSeq < o.seq) {
                        state::CollectiveSide s;
                        s.ranks = {int(q)};
                        s.position = other.finished ? CollectivePosition::Finished
                                                    : CollectivePosition::Behind;
                        s.lastSeq = og->lastSeq;
                        d.sides.push_back(s);
                        missing = true;
                    }
                } else if (g == 0 && other.present && !other.aligned && !other.saidNoSequence &&
                           !og) {
                    state::CollectiveSide s;
                    s.ranks = {int(q)};
                    s.position =
                        other.finished ? CollectivePosition::Finished : CollectivePosition::Behind;
                    d.sides.push_back(s);
                    missing = true;
                }
            }
            if (!missing || first < 0) continue;
            if (const auto own = rk.sites.find({g, o.seq}); own != rk.sites.end())
                longest = std::max<std::uint64_t>(longest, own->second.waitedMs * 1'000'000ull);
            d.waitedMs = longest / 1'000'000ull;
            mergeSides(d.sides);
            for (const state::CollectiveSide &s : d.sides)
                if (s.position == CollectivePosition::Waiting)
                    for (int q : s.ranks)
                        m_ranks[std::size_t(q)].stalled = true;
            m_stallAt.emplace(std::make_pair(g, o.seq), m_records.size());
            addRecord(ViolationKind::RankStalled, std::move(d), first, o.sig.module, 0, o.sinceNs);
        }
    }
}

std::vector<RankProgress> CollectiveAligner::progress() const
{
    std::vector<RankProgress> out;
    out.reserve(m_ranks.size());
    for (std::size_t r = 0; r < m_ranks.size(); ++r) {
        const Rank &rk = m_ranks[r];
        RankProgress p;
        p.rank = int(r);
        p.present = rk.present;
        p.aligned = rk.aligned;
        p.noSequence = rk.saidNoSequence;
        p.finished = rk.finished;
        p.stalled = rk.stalled;
        p.diverged = rk.diverged;
        p.group = rk.group;
        p.seq = rk.seq;
        p.kind = rk.sig.kind;
        p.module = rk.sig.module;
        p.reason = rk.sig.reason;
        p.sinceNs = rk.sinceNs;
        // The oldest collective it waits in, if any (what it is stuck on), else its latest.
        for (std::uint32_t g = 0; g < rk.groups.size(); ++g)
            if (!rk.groups[g].open.empty() &&
                (!p.inFlight || rk.groups[g].open.front().sinceNs < p.sinceNs)) {
                const Open &o = rk.groups[g].open.front();
                p.inFlight = true;
                p.group = g;
                p.seq = o.seq;
                p.kind = o.sig.kind;
                p.module = o.sig.module;
                p.reason = o.sig.reason;
                p.sinceNs = o.sinceNs;
            }
        if (p.seq && p.module != kNoModule)
            if (const std::string *path = pathOf(int(r), p.module)) {
                p.hasModule = true;
                p.modulePath = *path;
            }
        if (!rk.sites.empty()) p.where = std::prev(rk.sites.end())->second.where;
        out.push_back(std::move(p));
    }
    return out;
}

const StragglerFigures *latestRank(const StragglerSummary &summary)
{
    const StragglerFigures *latest = nullptr;
    for (const StragglerFigures &f : summary.ranks)
        if (f.timesLast > 0 &&
            (!latest || f.totalLateNs > latest->totalLateNs ||
             (f.totalLateNs == latest->totalLateNs && f.timesLast > latest->timesLast)))
            latest = &f;
    return latest;
}

StragglerSummary CollectiveAligner::stragglers() const
{
    StragglerSummary s = m_spread;
    for (std::size_t r = 0; r < m_ranks.size(); ++r) {
        StragglerFigures f = m_ranks[r].straggle;
        f.rank = int(r);
        s.ranks.push_back(f);
    }
    return s;
}

std::size_t CollectiveAligner::windowedSeqs() const
{
    std::size_t n = 0;
    for (const auto &epochs : m_groups)
        for (const Window &w : epochs)
            n += w.seqs.size();
    return n;
}

void setRankPaths(CollectiveAligner &aligner, const state::EngineState &state)
{
    std::vector<std::string> paths;
    paths.reserve(state.modules.size());
    for (const state::ModuleRecord &m : state.modules)
        paths.push_back(m.path);
    for (int r : state.localRanks)
        aligner.setModulePaths(r, paths);
}

JobDiagnosis diagnoseJob(wire::Snapshot &snapshot, std::uint64_t stallNs,
                         const std::vector<wire::Snapshot> *parts)
{
    JobDiagnosis out;
    AlignerOptions options;
    if (stallNs == 0)
        stallNs = stallNsFromEnvironment(defaultStallNs(snapshot.state.backend), &out.error);
    options.stallNs = stallNs;
    state::parseFixDialect(snapshot.state.fixDialect, options.dialect);
    out.aligner = CollectiveAligner(snapshot.state.worldSize, options);
    CollectiveAligner &a = out.aligner;
    a.setModulePaths(snapshot.state.modules);
    if (parts)
        for (const wire::Snapshot &p : *parts)
            if (!p.state.modules.empty()) setRankPaths(a, p.state);
    for (const state::ViolationRecord &v : snapshot.state.violations)
        a.addRankRecord(v);
    for (const telemetry::Event &e : snapshot.events)
        a.add(e);
    a.finish(0);
    // Through the one ledger, with what the snapshot has (a record of a job already diagnosed
    // is the same row, not a second one).
    state::ViolationLedger ledger;
    for (const state::ViolationRecord &v : snapshot.state.violations)
        ledger.add(v, state::Tally::Total);
    const std::size_t before = ledger.size();
    for (const state::ViolationRecord &v : a.records())
        if (ledger.add(v, state::Tally::Total).newRow) out.records.push_back(v);
    if (ledger.size() != before) snapshot.state.violations = ledger.records();
    return out;
}

} // namespace shardscope::sessioncore

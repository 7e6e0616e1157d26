// The one violation ledger: one row per (kind, accessor, parameter, owner, source location) with an
// entry per rank, counted by sightings (Add), replaced by a producer's running totals (Total), or
// the larger of two totals of one rank (Max); words kept unless provisional.

#include <QtTest>

#include "state/severity.h"
#include "state/violationledger.h"

using namespace shardscope;

namespace {

state::ViolationRecord sighting(int rank, std::uint32_t step, std::uint64_t tsNs,
                                std::uint64_t count = 1)
{
    state::ViolationRecord v;
    v.kind = ViolationKind::UnregisteredAccess;
    v.rank = rank;
    v.step = step;
    v.lastStep = step;
    v.tsNs = tsNs;
    v.count = count;
    v.accessor = 7;
    v.param = 0;
    v.owner = 1;
    v.paramName = "embed.weight";
    v.status = ParamStatus::NotAvailable;
    v.action = GuardAction::Gathered;
    v.fix = "register_external_parameter(lm_head, embed.weight)";
    v.message = "module `lm_head` read `embed.weight` owned by `embed`";
    return v;
}

} // namespace

class TestViolationLedger : public QObject
{
    Q_OBJECT
  private slots:
    void sightingsOfOneViolationAreOneRowWithAnEntryPerRank();
    void theOwnerTellsTwoTraceInvalidationsApart();
    void aTotalReplacesWhatItsRankHadAndMaxKeepsTheLarger();
    void provisionalWordsAreReplacedOnceAndFinalOnesKept();
    void recordsAreOnePerRowAndRank();
    void eachSourceLocationIsARowAndUnlocatedSightingsJoinOne();
    void severityFollowsKindActionAndRead();
    void theLedgerGivesEachRowItsSeverity();
};

// What each kind costs the run: the one rule (state/severity.h) every consumer shows.
void TestViolationLedger::severityFollowsKindActionAndRead()
{
    using state::severityOf;
    const auto values = ViolationRead::Values, attribute = ViolationRead::Attribute;
    // An unregistered read of the values that raised or was only recorded crashes (DeepSpeed's
    // empty placeholder) or computes on a shard: an error.
    QCOMPARE(severityOf(ViolationKind::UnregisteredAccess, GuardAction::Raised, values),
             Severity::Error);
    QCOMPARE(severityOf(ViolationKind::UnregisteredAccess, GuardAction::Recorded, values),
             Severity::Error);
    // Gathered for it (the guard's warn, DeepSpeed's automatic registration): right, but a cost.
    QCOMPARE(severityOf(ViolationKind::UnregisteredAccess, GuardAction::Gathered, values),
             Severity::Cost);
    QCOMPARE(severityOf(ViolationKind::UnregisteredAccess, GuardAction::AutoRegistered, values),
             Severity::Cost);
    // Attributes only (T5's `self.wo.weight.dtype`): information, whatever was done for it.
    for (GuardAction a : {GuardAction::Raised, GuardAction::Gathered, GuardAction::AutoRegistered,
                          GuardAction::Recorded})
        QCOMPARE(severityOf(ViolationKind::UnregisteredAccess, a, attribute), Severity::Info);
    QCOMPARE(severityOf(ViolationKind::TraceInvalidated, GuardAction::Recorded, values),
             Severity::Cost);
    for (ViolationKind k :
         {ViolationKind::LateParameter, ViolationKind::GatheredWriteWithoutModifier,
          ViolationKind::TiedAcrossGroups, ViolationKind::BackwardUnfinished})
        QCOMPARE(severityOf(k, GuardAction::Recorded, values), Severity::Error);
    // Every kind has one, named in base/names.h.
    for (std::size_t k = 0; k < kViolationKindNames.size(); ++k)
        QVERIFY(!severityName(severityOf(ViolationKind(k), GuardAction::Recorded)).empty());
    QCOMPARE(severityName(Severity::Info), std::string_view("info"));
    QCOMPARE(severityFromName("cost"), std::optional<Severity>(Severity::Cost));
}

// A producer never sets a severity: the ledger gives the row the rule's, from what it counts,
// and a row that read attributes only becomes a values read at its first sighting that reads
// the values (with that sighting's words).
void TestViolationLedger::theLedgerGivesEachRowItsSeverity()
{
    state::ViolationLedger ledger;
    state::ViolationRecord attr = sighting(0, 1, 100);
    attr.action = GuardAction::AutoRegistered;
    attr.read = ViolationRead::Attribute;
    attr.severity = Severity::Error; // what a producer left there is not read
    attr.message = "read only attributes";
    attr.fix.clear();
    ledger.add(attr, state::Tally::Add);
    QCOMPARE(ledger.rows()[0].severity, Severity::Info);
    QCOMPARE(ledger.records()[0].severity, Severity::Info);
    QCOMPARE(ledger.records()[0].read, ViolationRead::Attribute);
    // Another rank's attribute read: still information.
    attr.rank = 1;
    ledger.add(attr, state::Tally::Add);
    QCOMPARE(ledger.rows()[0].severity, Severity::Info);

    state::ViolationRecord values = sighting(0, 2, 200);
    values.action = GuardAction::AutoRegistered;
    const auto added = ledger.add(values, state::Tally::Add);
    QVERIFY(added.changed);
    QCOMPARE(ledger.size(), std::size_t(1));
    const state::ViolationRow &row = ledger.rows()[0];
    QCOMPARE(row.read, ViolationRead::Values);
    QCOMPARE(row.severity, Severity::Cost);
    QCOMPARE(row.message, values.message);
    QCOMPARE(row.fix, values.fix);
    for (const state::ViolationRecord &r : ledger.records())
        QCOMPARE(r.severity, Severity::Cost);
    // and it stays one: a later attribute read does not make it information again.
    attr.rank = 0;
    ledger.add(attr, state::Tally::Add);
    QCOMPARE(ledger.rows()[0].severity, Severity::Cost);

    // The action as last seen decides: the guard raising it makes it an error.
    values.action = GuardAction::Raised;
    ledger.add(values, state::Tally::Add);
    QCOMPARE(ledger.rows()[0].severity, Severity::Error);
}

void TestViolationLedger::eachSourceLocationIsARowAndUnlocatedSightingsJoinOne()
{
    state::ViolationLedger ledger;
    // A live event (no location) first: its row is taken over by the located record.
    QVERIFY(ledger.add(sighting(0, 1, 100), state::Tally::Add).newRow);
    state::ViolationRecord at48 = sighting(0, 1, 100);
    at48.location = {"/src/model.py", 48, "Head.forward", {"/src/train.py:9 in main"}};
    const auto took = ledger.add(at48, state::Tally::Total);
    QVERIFY(!took.newRow);
    QCOMPARE(ledger.size(), std::size_t(1));
    QCOMPARE(ledger.rows()[0].location, at48.location);
    // The same (accessor, parameter) from another line: a row of its own.
    state::ViolationRecord at91 = at48;
    at91.location = {"/src/model.py", 91, "Head.logits", {}};
    QVERIFY(ledger.add(at91, state::Tally::Add).newRow);
    QCOMPARE(ledger.size(), std::size_t(2));
    // Another unlocated sighting counts into the first located row, not a third.
    const auto more = ledger.add(sighting(1, 2, 300), state::Tally::Add);
    QVERIFY(!more.newRow);
    QCOMPARE(more.row, std::size_t(0));
    QCOMPARE(ledger.size(), std::size_t(2));
    QVERIFY(ledger.find(state::keyOf(sighting(0, 1, 1))) == &ledger.rows()[0]);
    QVERIFY(ledger.find(state::keyOf(at91)) == &ledger.rows()[1]);
    // Records carry the location and come back to the same rows.
    const std::vector<state::ViolationRecord> records = ledger.records();
    state::ViolationLedger again;
    for (const state::ViolationRecord &r : records)
        again.add(r, state::Tally::Total);
    QCOMPARE(again.size(), std::size_t(2));
    QCOMPARE(again.rows()[1].location.line, std::uint32_t(91));
}

void TestViolationLedger::sightingsOfOneViolationAreOneRowWithAnEntryPerRank()
{
    state::ViolationLedger ledger;
    auto a = ledger.add(sighting(1, 2, 200), state::Tally::Add);
    QVERIFY(a.newRow);
    QVERIFY(a.newRank);
    auto b = ledger.add(sighting(0, 1, 100), state::Tally::Add);
    QVERIFY(!b.newRow);
    QVERIFY(b.newRank);
    state::ViolationRecord later = sighting(1, 5, 500);
    later.status = ParamStatus::Inflight;
    auto c = ledger.add(later, state::Tally::Add);
    QVERIFY(!c.newRow && !c.newRank && c.changed);

    QCOMPARE(ledger.size(), std::size_t(1));
    const state::ViolationRow &row = ledger.rows()[0];
    QCOMPARE(row.count, std::uint64_t(3));
    QCOMPARE(row.firstStep, 1u);
    QCOMPARE(row.firstRank, 0);
    QCOMPARE(row.firstTsNs, std::uint64_t(100));
    QCOMPARE(row.lastStep, 5u);
    QCOMPARE(row.status, ParamStatus::Inflight); // as last seen
    QCOMPARE(row.rankMask(), std::uint64_t(0b11));
    QCOMPARE(row.ranks.size(), std::size_t(2));
    QCOMPARE(row.ranks[0].rank, 0); // sorted by rank
    QCOMPARE(row.ranks[0].count, std::uint64_t(1));
    QCOMPARE(row.ranks[1].rank, 1);
    QCOMPARE(row.ranks[1].count, std::uint64_t(2));
    QCOMPARE(row.ranks[1].firstStep, 2u);
    QCOMPARE(row.ranks[1].lastStep, 5u);

    // Another parameter, another accessor, another kind: each its own row.
    state::ViolationRecord other = sighting(0, 1, 150);
    other.param = 3;
    QVERIFY(ledger.add(other, state::Tally::Add).newRow);
    other.accessor = 8;
    QVERIFY(ledger.add(other, state::Tally::Add).newRow);
    other.kind = ViolationKind::LateParameter;
    QVERIFY(ledger.add(other, state::Tally::Add).newRow);
    QCOMPARE(ledger.size(), std::size_t(4));
    QVERIFY(ledger.find(state::keyOf(other)) == &ledger.rows()[3]);
}

void TestViolationLedger::theOwnerTellsTwoTraceInvalidationsApart()
{
    // "expected embed, got lm_head" and "expected pos_conv, got lm_head" are two findings.
    state::ViolationLedger ledger;
    state::ViolationRecord v;
    v.kind = ViolationKind::TraceInvalidated;
    v.accessor = 7;
    v.owner = 1;
    v.count = 1;
    v.message = "expected `embed`";
    ledger.add(v, state::Tally::Add);
    v.owner = 4;
    v.message = "expected `pos_conv`";
    ledger.add(v, state::Tally::Add);
    QCOMPARE(ledger.size(), std::size_t(2));
    QCOMPARE(ledger.rows()[1].message, std::string("expected `pos_conv`"));
}

void TestViolationLedger::aTotalReplacesWhatItsRankHadAndMaxKeepsTheLarger()
{
    state::ViolationLedger ledger;
    // Live events counted 3 on rank 0, one of which the State below had not yet seen,
    // and the State says rank 0 saw it twice and rank 1 once.
    for (std::uint64_t ts : {100, 110, 120})
        ledger.add(sighting(0, 1, ts), state::Tally::Add);
    state::ViolationRecord total0 = sighting(0, 1, 100, 2);
    total0.lastStep = 2;
    ledger.add(total0, state::Tally::Total);
    ledger.add(sighting(1, 1, 105, 1), state::Tally::Total);
    const state::ViolationRow &row = ledger.rows()[0];
    QCOMPARE(row.ranks[0].count, std::uint64_t(2));
    QCOMPARE(row.ranks[0].lastStep, 2u);
    QCOMPARE(row.count, std::uint64_t(3));
    // A later event adds to the total.
    ledger.add(sighting(1, 3, 300), state::Tally::Add);
    QCOMPARE(row.count, std::uint64_t(4));
    QCOMPARE(row.lastStep, 3u);

    // Two processes list rank 0: the larger total stands, the smaller changes nothing.
    state::ViolationLedger merged;
    merged.add(sighting(0, 1, 100, 5), state::Tally::Max);
    const auto smaller = merged.add(sighting(0, 1, 100, 4), state::Tally::Max);
    QVERIFY(!smaller.changed);
    QCOMPARE(merged.rows()[0].count, std::uint64_t(5));
    merged.add(sighting(0, 1, 100, 7), state::Tally::Max);
    QCOMPARE(merged.rows()[0].count, std::uint64_t(7));
    QCOMPARE(merged.rows()[0].ranks.size(), std::size_t(1));
}

void TestViolationLedger::provisionalWordsAreReplacedOnceAndFinalOnesKept()
{
    state::ViolationLedger ledger;
    state::ViolationRecord early = sighting(0, 1, 100);
    early.paramName = "<parameter 0>";
    early.fix = "register_external_parameter(lm_head, <parameter 0>)";
    ledger.add(early, state::Tally::Add, state::Words::Provisional);
    QVERIFY(ledger.rows()[0].provisionalWords);

    const auto named = ledger.add(sighting(0, 1, 100, 1), state::Tally::Total);
    QVERIFY(named.changed);
    QCOMPARE(ledger.rows()[0].paramName, std::string("embed.weight"));
    QCOMPARE(ledger.rows()[0].fix,
             std::string("register_external_parameter(lm_head, embed.weight)"));
    QVERIFY(!ledger.rows()[0].provisionalWords);

    // Final words stay what the row was first shown with.
    state::ViolationRecord reworded = sighting(0, 2, 200);
    reworded.fix = "words of another release";
    ledger.add(reworded, state::Tally::Add);
    QCOMPARE(ledger.rows()[0].fix,
             std::string("register_external_parameter(lm_head, embed.weight)"));
}

void TestViolationLedger::recordsAreOnePerRowAndRank()
{
    state::ViolationLedger ledger;
    ledger.add(sighting(1, 2, 200, 4), state::Tally::Total);
    ledger.add(sighting(0, 1, 100, 2), state::Tally::Total);
    state::ViolationRecord late = sighting(0, 3, 300);
    late.kind = ViolationKind::LateParameter;
    ledger.add(late, state::Tally::Add);
    const std::vector<state::ViolationRecord> recs = ledger.records();
    QCOMPARE(recs.size(), std::size_t(3));
    QCOMPARE(recs[0].rank, 0);
    QCOMPARE(recs[0].count, std::uint64_t(2));
    QCOMPARE(recs[0].step, 1u);
    QCOMPARE(recs[1].rank, 1);
    QCOMPARE(recs[1].count, std::uint64_t(4));
    QCOMPARE(recs[1].tsNs, std::uint64_t(200));
    QCOMPARE(recs[1].fix, std::string("register_external_parameter(lm_head, embed.weight)"));
    QCOMPARE(recs[2].kind, ViolationKind::LateParameter);
    ledger.clear();
    QVERIFY(ledger.empty());
    QVERIFY(ledger.records().empty());
}

QTEST_APPLESS_MAIN(TestViolationLedger)
#include "tst_violationledger.moc"

#pragma once
// The inspector's store of one training run: a QObject adapter over the Qt-free
// sessioncore::Store (engine/sessioncore: the decoded state, live per-rank status, the one
// violation ledger, every received event in per-rank sorted lanes). Ingest is cheap and
// silent; consumers get one coalesced updated() at most every refresh interval (about
// 30 Hz), never per event. Names come back as QStrings; everything else is the core's.

#include <QObject>
#include <QString>
#include <QTimer>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sessioncore/store.h"
#include "state/state.h"
#include "state/violationledger.h"
#include "telemetry/event.h"

namespace shardscope::session {

// The core's types under the names the inspector's layers have always used.
using EventLane = sessioncore::EventLane;
using RankMemory = sessioncore::RankMemory;
using StoreChanges = sessioncore::StoreChanges;

class SessionStore : public QObject
{
    Q_OBJECT
  public:
    explicit SessionStore(QObject *parent = nullptr);

    // The Qt-free store this adapts (what the trace export and snapshot writer read).
    sessioncore::Store &core() { return m_core; }
    const sessioncore::Store &core() const { return m_core; }

    // ---- ingest (UI thread): see sessioncore::Store
    void clear() { m_core.clear(); }
    state::EngineState applyState(state::EngineState state)
    {
        return m_core.applyState(std::move(state));
    }
    void appendEvents(std::span<const telemetry::Event> events, bool history)
    {
        m_core.appendEvents(events, history);
    }
    void setDroppedEvents(std::uint64_t dropped) { m_core.setDroppedEvents(dropped); }
    void setReadOnly(bool readOnly, const QString &source)
    {
        m_core.setReadOnly(readOnly, source.toStdString());
    }

    // ---- a job: one store fed by several rank processes ("sources", numbered from 0)
    QString applySourceState(int source, state::EngineState state, const QString &name = {})
    {
        return QString::fromStdString(
            m_core.applySourceState(source, std::move(state), name.toStdString()));
    }
    void setSourceDropped(int source, std::uint64_t dropped)
    {
        m_core.setSourceDropped(source, dropped);
    }
    void mergeSources() { m_core.mergeSources(); }
    void clearSources() { m_core.clearSources(); }
    int sourceCount() const { return m_core.sourceCount(); }
    bool hasSourceState(int source) const { return m_core.hasSourceState(source); }

    // ---- reading
    bool hasState() const { return m_core.hasState(); }
    const state::EngineState &state() const { return m_core.state(); }
    bool readOnly() const { return m_core.readOnly(); }
    QString source() const { return QString::fromStdString(m_core.source()); }
    int worldSize() const { return m_core.worldSize(); }

    const state::ModuleRecord *module(ModuleId id) const { return m_core.module(id); }
    const state::ParamRecord *param(ParamId id) const { return m_core.param(id); }
    std::int32_t paramSlot(ParamId id) const { return m_core.paramSlot(id); }
    QString modulePath(ModuleId id) const;
    QString paramName(ParamId id) const;
    std::span<const ModuleId> childModules(ModuleId id) const { return m_core.childModules(id); }
    std::span<const ParamId> ownedParams(ModuleId id) const { return m_core.ownedParams(id); }
    const std::vector<state::ExternalRecord> &externalsOn(ModuleId module) const
    {
        return m_core.externalsOn(module);
    }
    std::uint64_t paramViolations(ParamId id) const { return m_core.paramViolations(id); }
    std::uint64_t moduleViolations(ModuleId id) const { return m_core.moduleViolations(id); }
    std::optional<Severity> paramSeverity(ParamId id) const { return m_core.paramSeverity(id); }
    std::optional<Severity> moduleSeverity(ModuleId id) const { return m_core.moduleSeverity(id); }

    const std::vector<state::ViolationRow> &violationGroups() const
    {
        return m_core.violationGroups();
    }
    const state::ViolationLedger &violationLedger() const { return m_core.violationLedger(); }
    std::optional<state::ViolationRecord> violationOf(const telemetry::Event &ev) const
    {
        return m_core.violationOf(ev);
    }
    const state::ViolationRow *violationGroup(const state::ViolationRecord &v) const
    {
        return m_core.violationGroup(v);
    }
    std::vector<const state::ViolationRow *> violationsOf(ParamId id) const
    {
        return m_core.violationsOf(id);
    }

    int laneCount() const { return m_core.laneCount(); }
    const EventLane &lane(int rank) const { return m_core.lane(rank); }
    std::uint64_t totalEvents() const { return m_core.totalEvents(); }
    std::uint64_t duplicateEvents() const { return m_core.duplicateEvents(); }
    std::uint64_t droppedEvents() const { return m_core.droppedEvents(); }
    std::uint32_t step() const { return m_core.step(); }
    std::uint32_t completedStep() const { return m_core.completedStep(); }
    bool hasLoss() const { return m_core.hasLoss(); }
    double loss() const { return m_core.loss(); }
    const std::vector<RankMemory> &memory() const { return m_core.memory(); }
    std::uint64_t firstTs() const { return m_core.firstTs(); }
    std::uint64_t lastTs() const { return m_core.lastTs(); }
    std::uint64_t timeOrigin() const { return m_core.timeOrigin(); }

    // Emits updated() now if anything changed (the timer does this on its own).
    void flush();
    void setRefreshIntervalMs(int ms) { m_timer.setInterval(ms); }
    void setMaxEvents(std::size_t events) { m_core.setMaxEvents(events); }
    std::size_t maxEvents() const { return m_core.maxEvents(); }
    std::uint64_t evictedEvents() const { return m_core.evictedEvents(); }

  Q_SIGNALS:
    void updated(const shardscope::session::StoreChanges &changes);

  private:
    sessioncore::Store m_core;
    QTimer m_timer;
};

} // namespace shardscope::session

Q_DECLARE_METATYPE(shardscope::session::StoreChanges)

#include "session/traceexport.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>

#include <bit>
#include <optional>
#include <unordered_map>
#include <vector>

#include "session/labels.h"

namespace shardscope {

namespace {

enum Lane
{
    ModulesTid = 0,
    GathersTid = 1,
    ViolationsTid = 2,
    StepsTid = 3
};

struct OpenFetch
{
    std::uint64_t ts = 0;
    std::uint32_t module = kNoModule;
    std::uint8_t reason = 0;
};

} // namespace

QByteArray chromeTrace(const SessionStore &store)
{
    const std::uint64_t t0 = store.firstTs();
    auto us = [t0](std::uint64_t ts) {
        return static_cast<qint64>(ts >= t0 ? (ts - t0 + 500) / 1000 : 0);
    };
    auto dur = [](std::uint64_t begin, std::uint64_t end) {
        return static_cast<qint64>(end > begin ? (end - begin + 500) / 1000 : 0);
    };
    QJsonArray events;
    auto meta = [&](const char *name, int pid, int tid, const QJsonObject &args) {
        events.append(QJsonObject{{QStringLiteral("name"), QLatin1String(name)},
                                  {QStringLiteral("ph"), QStringLiteral("M")},
                                  {QStringLiteral("pid"), pid},
                                  {QStringLiteral("tid"), tid},
                                  {QStringLiteral("args"), args}});
    };
    auto span = [&](const QString &name, const QString &cat, int pid, int tid, std::uint64_t b,
                    std::uint64_t e, const QJsonObject &args) {
        events.append(QJsonObject{{QStringLiteral("name"), name},
                                  {QStringLiteral("cat"), cat},
                                  {QStringLiteral("ph"), QStringLiteral("X")},
                                  {QStringLiteral("pid"), pid},
                                  {QStringLiteral("tid"), tid},
                                  {QStringLiteral("ts"), us(b)},
                                  {QStringLiteral("dur"), dur(b, e)},
                                  {QStringLiteral("args"), args}});
    };
    auto instant = [&](const QString &name, const QString &cat, int pid, int tid, std::uint64_t ts,
                       const QJsonObject &args) {
        events.append(QJsonObject{{QStringLiteral("name"), name},
                                  {QStringLiteral("cat"), cat},
                                  {QStringLiteral("ph"), QStringLiteral("i")},
                                  {QStringLiteral("s"), QStringLiteral("p")},
                                  {QStringLiteral("pid"), pid},
                                  {QStringLiteral("tid"), tid},
                                  {QStringLiteral("ts"), us(ts)},
                                  {QStringLiteral("args"), args}});
    };

    const int ranks = std::max(store.laneCount(), store.worldSize());
    for (int r = 0; r < ranks; ++r) {
        meta("process_name", r, 0, {{QStringLiteral("name"), QStringLiteral("rank %1").arg(r)}});
        meta("process_sort_index", r, 0, {{QStringLiteral("sort_index"), r}});
        meta("thread_name", r, ModulesTid, {{QStringLiteral("name"), QStringLiteral("modules")}});
        meta("thread_name", r, GathersTid, {{QStringLiteral("name"), QStringLiteral("gathers")}});
        meta("thread_name", r, ViolationsTid,
             {{QStringLiteral("name"), QStringLiteral("violations")}});
        meta("thread_name", r, StepsTid, {{QStringLiteral("name"), QStringLiteral("steps")}});
    }

    std::vector<bool> groupHasEvent(store.violationGroups().size(), false);
    for (int r = 0; r < store.laneCount(); ++r) {
        const EventLane &lane = store.lane(r);
        std::vector<std::pair<std::uint32_t, Event>> moduleStack;
        std::unordered_map<std::uint32_t, OpenFetch> fetches;
        Event stepBegin{}; // valid while inStep (a plain value: GCC's -Wmaybe-uninitialized
        bool inStep = false; // misfires on std::optional<Event> here)
        for (std::size_t i = 0; i < lane.size(); ++i) {
            const Event ev = lane.at(i);
            switch (ev.type) {
            case EventType::ModuleEnter:
                moduleStack.emplace_back(ev.a, ev);
                break;
            case EventType::ModuleExit:
                for (std::size_t k = moduleStack.size(); k-- > 0;) {
                    if (moduleStack[k].first != ev.a) continue;
                    const Event b = moduleStack[k].second;
                    const QString phase = labels::phase(static_cast<Phase>(b.flags));
                    span(store.modulePath(ev.a), QStringLiteral("module,") + phase, r, ModulesTid,
                         b.tsNs, ev.tsNs,
                         {{QStringLiteral("step"), qint64(b.step)},
                          {QStringLiteral("phase"), phase}});
                    moduleStack.resize(k);
                    break;
                }
                break;
            case EventType::FetchBegin:
                fetches[ev.a] = OpenFetch{ev.tsNs, ev.b, ev.flags};
                break;
            case EventType::FetchEnd: {
                auto it = fetches.find(ev.a);
                const OpenFetch f =
                    it != fetches.end() ? it->second : OpenFetch{ev.tsNs, ev.b, ev.flags};
                if (it != fetches.end()) fetches.erase(it);
                const QString reason = labels::reason(static_cast<FetchReason>(f.reason));
                span(store.paramName(ev.a), QStringLiteral("gather,") + reason, r, GathersTid, f.ts,
                     ev.tsNs,
                     {{QStringLiteral("param"), store.paramName(ev.a)},
                      {QStringLiteral("module"), store.modulePath(f.module)},
                      {QStringLiteral("reason"), reason},
                      {QStringLiteral("bytes"), qint64(ev.u0)},
                      {QStringLiteral("step"), qint64(ev.step)}});
                break;
            }
            case EventType::Broadcast:
                instant(QStringLiteral("broadcast %1").arg(store.paramName(ev.a)),
                        QStringLiteral("gather,broadcast"), r, GathersTid, ev.tsNs,
                        {{QStringLiteral("root"), qint64(ev.b)},
                         {QStringLiteral("bytes"), qint64(ev.u0)}});
                break;
            case EventType::StepBegin:
                stepBegin = ev;
                inStep = true;
                break;
            case EventType::StepEnd:
                if (inStep) {
                    span(QStringLiteral("step %1").arg(stepBegin.step), QStringLiteral("step"), r,
                         StepsTid, stepBegin.tsNs, ev.tsNs,
                         {{QStringLiteral("loss"), std::bit_cast<double>(ev.u0)},
                          {QStringLiteral("step"), qint64(stepBegin.step)}});
                    inStep = false;
                }
                break;
            case EventType::UnregisteredAccess:
            case EventType::LateParameter:
            case EventType::TraceInvalidated:
            case EventType::GatheredWriteError: {
                ModuleId accessor = ev.a;
                ParamId param = ev.b;
                ModuleId owner = static_cast<ModuleId>(ev.u0);
                ViolationKind kind = ViolationKind::UnregisteredAccess;
                if (ev.type == EventType::LateParameter) {
                    kind = ViolationKind::LateParameter;
                    owner = ev.a;
                } else if (ev.type == EventType::TraceInvalidated) {
                    kind = ViolationKind::TraceInvalidated;
                    accessor = ev.b;
                    param = kNoParam;
                    owner = ev.a;
                } else if (ev.type == EventType::GatheredWriteError) {
                    kind = ViolationKind::GatheredWriteWithoutModifier;
                    accessor = kNoModule;
                    param = ev.a;
                    const ParamRecord *p = store.param(ev.a);
                    owner = p ? p->owner : kNoModule;
                }
                QString fix;
                const auto &groups = store.violationGroups();
                for (std::size_t g = 0; g < groups.size(); ++g) {
                    if (groups[g].kind == kind && groups[g].accessor == accessor &&
                        groups[g].param == param) {
                        groupHasEvent[g] = true;
                        fix = QString::fromStdString(groups[g].fix);
                        break;
                    }
                }
                instant(labels::kind(kind), QStringLiteral("violation"), r, ViolationsTid, ev.tsNs,
                        {{QStringLiteral("accessor"), store.modulePath(accessor)},
                         {QStringLiteral("param"),
                          param == kNoParam ? QString() : store.paramName(param)},
                         {QStringLiteral("owner"), store.modulePath(owner)},
                         {QStringLiteral("step"), qint64(ev.step)},
                         {QStringLiteral("fix"), fix}});
                break;
            }
            default:
                break;
            }
        }
    }
    // Violations known only from the state (their events are older than the history).
    const auto &groups = store.violationGroups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
        if (groupHasEvent[g]) continue;
        const ViolationGroup &v = groups[g];
        instant(
            labels::kind(v.kind), QStringLiteral("violation"), v.firstRank, ViolationsTid,
            std::max(v.firstTsNs, t0),
            {{QStringLiteral("accessor"), store.modulePath(v.accessor)},
             {QStringLiteral("param"), v.param == kNoParam ? QString() : store.paramName(v.param)},
             {QStringLiteral("owner"), store.modulePath(v.owner)},
             {QStringLiteral("step"), qint64(v.firstStep)},
             {QStringLiteral("count"), qint64(v.count)},
             {QStringLiteral("fix"), QString::fromStdString(v.fix)}});
    }

    const EngineState &st = store.state();
    QJsonObject root{
        {QStringLiteral("traceEvents"), events},
        {QStringLiteral("displayTimeUnit"), QStringLiteral("ms")},
        {QStringLiteral("distributedInfo"),
         QJsonObject{{QStringLiteral("backend"), QString::fromStdString(st.backend)},
                     {QStringLiteral("world_size"), st.worldSize},
                     {QStringLiteral("rank"), st.localRanks.empty() ? 0 : st.localRanks.front()},
                     {QStringLiteral("local_ranks"), qint64(st.localRanks.size())},
                     {QStringLiteral("model"), QString::fromStdString(st.modelName)}}},
        {QStringLiteral("otherData"),
         QJsonObject{{QStringLiteral("producer"), QStringLiteral("shardscope")},
                     {QStringLiteral("step"), qint64(store.step())},
                     {QStringLiteral("dropped_events"), qint64(store.droppedEvents())}}}};
    return QJsonDocument(root).toJson(QJsonDocument::Compact);
}

} // namespace shardscope

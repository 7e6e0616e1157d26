#pragma once
// What Perfetto's JSON importer needs of a trace export, read from its source
// (google/perfetto: src/trace_processor/importers/json/json_trace_tokenizer.cc,
// json_trace_parser_impl.cc, importers/common/slice_tracker.cc), and the ids
// session::TraceIds promises. Perfetto itself cannot be run here; scripts/
// check-trace-for-perfetto applies the same rules to a file.

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QList>
#include <QMap>
#include <QSet>
#include <QString>
#include <QStringList>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

namespace shardscope::test {

// Perfetto's slice stack on one thread (slice_tracker.cc, MaybeCloseStack) fed the X
// spans sorted by ts alone, ties in file order, as its sorter did before it weighed
// durations: a span that starts inside the open one and ends after it is dropped.
inline QString droppedByPerfetto(QList<std::pair<qint64, qint64>> spans) // ts, dur in file order
{
    std::stable_sort(spans.begin(), spans.end(),
                     [](const auto &a, const auto &b) { return a.first < b.first; });
    QList<std::pair<qint64, qint64>> stack;
    for (const auto &[ts, dur] : spans) {
        while (!stack.isEmpty()) {
            const qint64 end = stack.back().first + stack.back().second;
            if (end < ts || (end == ts && !(stack.back().second == 0 && dur == 0)))
                stack.pop_back();
            else
                break;
        }
        if (!stack.isEmpty() && ts + dur > stack.back().first + stack.back().second)
            return QStringLiteral("[%1, +%2] dropped inside [%3, +%4]")
                .arg(ts)
                .arg(dur)
                .arg(stack.back().first)
                .arg(stack.back().second);
        stack.append({ts, dur});
    }
    return QString();
}

// What Perfetto's JSON importer (trace_processor's json_trace_tokenizer.cc,
// json_trace_parser_impl.cc and slice_tracker.cc) needs of every event, and the ids
// TraceIds promises: returns the first thing wrong, or an empty string. `stride` is the pid
// spacing expected.
inline QString perfettoProblem(const QJsonDocument &doc, int stride)
{
    QMap<QPair<int, int>, QList<std::pair<qint64, qint64>>> spans;
    QMap<int, int> pidOfTid;
    QMap<int, QString> processNames;
    QSet<QPair<int, int>> namedThreads, usedThreads;
    QMap<int, int> modulesTid;
    for (const QJsonValue &v : doc.object().value(QStringLiteral("traceEvents")).toArray()) {
        const QJsonObject e = v.toObject();
        const QString ph = e.value(QStringLiteral("ph")).toString();
        const QString what = QString::fromUtf8(QJsonDocument(e).toJson(QJsonDocument::Compact));
        // The tokenizer fails the whole file on an event with an array at its top level.
        for (auto it = e.begin(); it != e.end(); ++it)
            if (it.value().isArray()) return QStringLiteral("a top-level array in ") + what;
        // It takes an event without "ts" only as metadata; metadata should carry none.
        if ((ph == QLatin1String("M")) == e.contains(QStringLiteral("ts")))
            return QStringLiteral("ts present or missing wrongly in ") + what;
        if (ph != QLatin1String("M") && (!e.value(QStringLiteral("ts")).isDouble() ||
                                         e.value(QStringLiteral("ts")).toInteger() < 0))
            return QStringLiteral("a bad ts in ") + what;
        if (ph == QLatin1String("X") && !e.value(QStringLiteral("dur")).isDouble())
            return QStringLiteral("an X event without dur: ") + what;
        if (ph == QLatin1String("i") &&
            !QStringList{QStringLiteral("t"), QStringLiteral("p"), QStringLiteral("g")}.contains(
                e.value(QStringLiteral("s")).toString()))
            return QStringLiteral("an instant without a scope: ") + what;
        if (!e.value(QStringLiteral("pid")).isDouble() ||
            !e.value(QStringLiteral("tid")).isDouble())
            return QStringLiteral("pid or tid not a number in ") + what;
        const qint64 pid = e.value(QStringLiteral("pid")).toInteger();
        const qint64 tid = e.value(QStringLiteral("tid")).toInteger();
        if (pid < 1 || tid < 1 || pid > std::numeric_limits<std::int32_t>::max() ||
            tid > std::numeric_limits<std::int32_t>::max())
            return QStringLiteral("an id that is 0 or past 32 bits in ") + what;
        if (pidOfTid.contains(int(tid)) && pidOfTid.value(int(tid)) != pid)
            return QStringLiteral("tid %1 in pids %2 and %3")
                .arg(tid)
                .arg(pidOfTid.value(int(tid)))
                .arg(pid);
        pidOfTid.insert(int(tid), int(pid));
        const QString name = e.value(QStringLiteral("name")).toString();
        const QString argName =
            e.value(QStringLiteral("args")).toObject().value(QStringLiteral("name")).toString();
        if (ph == QLatin1String("M") && name == QLatin1String("process_name"))
            processNames.insert(int(pid), argName);
        else if (ph == QLatin1String("M") && name == QLatin1String("thread_name")) {
            namedThreads.insert({int(pid), int(tid)});
            if (argName == QLatin1String("modules")) modulesTid.insert(int(pid), int(tid));
        } else if (ph != QLatin1String("M"))
            usedThreads.insert({int(pid), int(tid)});
        if (ph == QLatin1String("X"))
            spans[{int(pid), int(tid)}].append({e.value(QStringLiteral("ts")).toInteger(),
                                                e.value(QStringLiteral("dur")).toInteger()});
    }
    for (auto it = spans.cbegin(); it != spans.cend(); ++it)
        if (const QString dropped = droppedByPerfetto(it.value()); !dropped.isEmpty())
            return QStringLiteral("pid %1 tid %2: %3")
                .arg(it.key().first)
                .arg(it.key().second)
                .arg(dropped);
    for (auto it = processNames.cbegin(); it != processNames.cend(); ++it) {
        // rank r is pid r * stride + 1, and its modules thread is the process's main thread.
        if (it.value() != QStringLiteral("rank %1").arg((it.key() - 1) / stride) ||
            (it.key() - 1) % stride != 0)
            return QStringLiteral("pid %1 is named %2").arg(it.key()).arg(it.value());
        if (modulesTid.value(it.key()) != it.key())
            return QStringLiteral("pid %1's modules thread is tid %2")
                .arg(it.key())
                .arg(modulesTid.value(it.key()));
    }
    for (const auto &t : usedThreads) {
        if (!processNames.contains(t.first))
            return QStringLiteral("pid %1 has events but no process_name").arg(t.first);
        if (!namedThreads.contains(t) && t.second != t.first)
            return QStringLiteral("pid %1 tid %2 has events but no thread_name")
                .arg(t.first)
                .arg(t.second);
    }
    return processNames.isEmpty() ? QStringLiteral("no process_name") : QString();
}

} // namespace shardscope::test

#pragma once
// Ends a process the tests started and everything below it. scripts/launch starts each rank
// in a session of its own (setsid) and shardscope-check its ranks the same way
// (start_new_session), so killing the launcher or the check alone leaves the ranks running,
// re-parented to init (a hanging script loops forever). The one way the tests end such a
// tree: stop it from the top down, then kill every process of it and its process group.

#include <QByteArray>
#include <QDir>
#include <QFile>
#include <QList>
#include <QString>
#include <QStringList>
#include <QThread>

#include <csignal>
#include <set>
#include <sys/types.h>

namespace shardscope::test {

// The state letter (R, S, Z, ...) and parent of a process, from /proc/PID/stat; state 0 when
// there is no such process.
struct ProcessInfo
{
    char state = 0;
    pid_t parent = 0;
};

inline ProcessInfo processInfo(pid_t pid)
{
    QFile stat(QStringLiteral("/proc/%1/stat").arg(pid));
    if (!stat.open(QIODevice::ReadOnly)) return {};
    const QByteArray text = stat.readAll();
    // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses; it ends at the last ')'
    const qsizetype close = text.lastIndexOf(')');
    if (close < 0) return {};
    const QList<QByteArray> fields = text.mid(close + 2).split(' ');
    if (fields.size() < 2 || fields[0].isEmpty()) return {};
    return {fields[0][0], static_cast<pid_t>(fields[1].toInt())};
}

// Whether pid names a process that still runs (a zombie has ended: it only waits to be reaped).
inline bool processAlive(pid_t pid)
{
    const char state = processInfo(pid).state;
    return state != 0 && state != 'Z' && state != 'X';
}

// The live processes below root (children, their children, ...), from /proc.
inline std::set<pid_t> descendantsOf(pid_t root)
{
    std::set<pid_t> below;
    std::set<pid_t> parents{root};
    for (bool grew = true; grew;) {
        grew = false;
        for (const QString &entry : QDir(QStringLiteral("/proc")).entryList(QDir::Dirs)) {
            bool number = false;
            const pid_t pid = static_cast<pid_t>(entry.toInt(&number));
            if (!number || below.count(pid) || pid == root) continue;
            const ProcessInfo info = processInfo(pid);
            if (info.state == 0 || info.state == 'Z' || !parents.count(info.parent)) continue;
            below.insert(pid);
            parents.insert(pid);
            grew = true;
        }
    }
    return below;
}

// SIGKILL to root and to every process below it, sessions of their own included, and to the
// process group each of them leads (what a rank started in its group after it). Each one is
// stopped first, from the top down, so none starts another or is re-parented out of sight
// while the tree is read. Returns once none of them runs (or after about 5 s).
inline void endProcessTree(pid_t root)
{
    if (root <= 0) return;
    ::kill(root, SIGSTOP);
    std::set<pid_t> tree;
    for (int round = 0; round < 50; ++round) { // until a pass finds nothing new
        std::set<pid_t> found = descendantsOf(root);
        bool grew = false;
        for (pid_t pid : found)
            if (tree.insert(pid).second) ::kill(pid, SIGSTOP), grew = true;
        if (!grew) break;
    }
    for (pid_t pid : tree) {
        ::kill(-pid, SIGKILL); // its group, when it leads one (a rank after setsid)
        ::kill(pid, SIGKILL);
    }
    ::kill(root, SIGKILL);
    for (int waited = 0; waited < 5000; waited += 20) {
        bool any = processAlive(root);
        for (pid_t pid : tree)
            any = any || processAlive(pid);
        if (!any) return;
        QThread::msleep(20);
    }
}

} // namespace shardscope::test

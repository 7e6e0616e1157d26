#include "session/jobsession.h"

#include <algorithm>
#include <set>

#include "client/livejobs.h"
#include "wire/discovery.h"
#include "wire/endpoint.h"

namespace shardscope::session {

JobSession::JobSession(SessionStore *store, QObject *parent) : QObject(parent), m_store(store)
{
    m_watch.setInterval(250);
    connect(&m_watch, &QTimer::timeout, this, &JobSession::checkSilence);
}

JobSession::~JobSession() = default;

std::string JobSession::discoveryDirOf(const QString &discoveryDir)
{
    return discoveryDir.isEmpty() ? wire::defaultRuntimeDir() : discoveryDir.toStdString();
}

std::vector<client::LiveJob> JobSession::liveJobs(const QString &discoveryDir)
{
    return client::liveJobs(discoveryDirOf(discoveryDir));
}

QString JobSession::resolve(const QString &spec, std::vector<JobTarget> &targets, QString &jobName,
                            const QString &discoveryDir)
{
    targets.clear();
    jobName.clear();
    // The one parser of what to attach to (wire::parseAttachTarget: shardscope-capture's too).
    const auto target = wire::parseAttachTarget(spec.toStdString());
    if (!target) return QString::fromStdString(target.error());
    if (!target->job.empty()) {
        jobName = QString::fromStdString(target->job);
        const std::string dir = discoveryDirOf(discoveryDir);
        // One run (wire::selectRun: each endpoint once, two runs of one name refused).
        auto job = client::liveJob(dir, target->job);
        if (!job)
            return tr("%1 in %2 (File → Attach lists the live jobs)")
                .arg(QString::fromStdString(job.error()), QString::fromStdString(dir));
        for (const wire::DiscoveryEntry &e : job->processes)
            targets.push_back({QString::fromStdString(e.endpoint), e.job.ranks, e});
        return {};
    }
    // Each endpoint once (the parser drops a repeat).
    for (const std::string &ep : target->endpoints)
        targets.push_back({QString::fromStdString(ep), {}, {}});
    return {};
}

void JobSession::attach(const QString &endpoint, const QString &token)
{
    attach(std::vector<JobTarget>{{endpoint, {}, {}}}, token);
}

void JobSession::attach(const std::vector<JobTarget> &targets, const QString &token,
                        const QString &jobName)
{
    detach();
    m_processes.clear();
    m_store->clearSources();
    m_reference = -1;
    m_job = targets.size() > 1 || !jobName.isEmpty();
    m_jobName = jobName;
    for (std::size_t k = 0; k < targets.size(); ++k) {
        const int i = static_cast<int>(k);
        Process p;
        p.target = targets[k];
        p.connection = std::make_unique<Connection>(m_store);
        p.connection->setReconnectIntervalMs(m_reconnectMs);
        if (m_job) p.connection->setSource(i, targets[k].endpoint);
        connect(p.connection.get(), &Connection::welcomed, this,
                [this, i](const WelcomeInfo &info) { onWelcomed(i, info); });
        connect(p.connection.get(), &Connection::stateChanged, this,
                [this, i](Connection::State state, const QString &message) {
                    onState(i, state, message);
                });
        m_processes.push_back(std::move(p));
    }
    if (m_job)
        m_store->setReadOnly(
            false, jobName.isEmpty() ? tr("%n processes", nullptr, static_cast<int>(targets.size()))
                                     : QStringLiteral("job:") + jobName);
    for (Process &p : m_processes)
        p.connection->attach(p.target.endpoint, token);
    m_sinceAttach.start();
    m_watch.start();
    Q_EMIT changed();
}

void JobSession::detach()
{
    m_watch.stop();
    for (Process &p : m_processes)
        p.connection->detach();
}

void JobSession::setReconnectIntervalMs(int ms)
{
    m_reconnectMs = ms;
    for (Process &p : m_processes)
        p.connection->setReconnectIntervalMs(ms);
}

Connection *JobSession::connection(int i) const
{
    return i >= 0 && i < processCount() ? m_processes[static_cast<std::size_t>(i)].connection.get()
                                        : nullptr;
}

JobSession::Health JobSession::health(int i) const
{
    return m_processes.at(static_cast<std::size_t>(i)).health;
}

std::vector<int> JobSession::ranks(int i) const
{
    const Process &p = m_processes.at(static_cast<std::size_t>(i));
    const std::vector<int> &fromWelcome = p.connection->welcome().ranks;
    return fromWelcome.empty() ? p.target.ranks : fromWelcome;
}

wire::ClockShift JobSession::clockShift(int i) const
{
    return m_processes.at(static_cast<std::size_t>(i)).shift;
}

void JobSession::onWelcomed(int i, const WelcomeInfo &info)
{
    Process &p = m_processes[static_cast<std::size_t>(i)];
    // A discovery file that names another process's endpoint: not merged into the job.
    if (const wire::DiscoveryEntry &a = p.target.announced; a.pid != 0 && info.pid != a.pid) {
        p.connection->detach();
        p.message = QString::fromStdString(wire::checkAnswered(a, info.pid, a.job));
        setHealth(i, Health::Unreachable);
        return;
    }
    p.everWelcomed = true;
    p.host = info.host;
    if (!m_job) return;
    // The first process welcomed is the reference; the others are put on its timeline. The
    // shift is fixed for the session: a reconnect keeps it, so lanes never jump.
    if (p.shiftSet) return;
    p.shiftSet = true;
    if (m_reference < 0) m_reference = i;
    if (i == m_reference) {
        p.shift = {};
        p.shift.sharedClock = true;
        p.shift.known = p.connection->clock().valid;
    } else {
        const Process &ref = m_processes[static_cast<std::size_t>(m_reference)];
        const bool sameHost = !p.host.isEmpty() && p.host == ref.host;
        p.shift = wire::clockShift(p.connection->clock(), ref.connection->clock(), sameHost);
        p.connection->setClockShift(p.shift.shiftNs);
    }
}

void JobSession::setHealth(int i, Health h)
{
    Process &p = m_processes[static_cast<std::size_t>(i)];
    if (p.health == h) return;
    if ((h == Health::Lost || h == Health::Silent) && p.health != Health::Lost &&
        p.health != Health::Silent)
        p.stepAtLoss = lastStepOf(i);
    p.health = h;
    // A process that said goodbye or whose connection was lost runs no more collectives: the
    // job's aligner stops expecting its ranks (a rank the others wait for is then "ended").
    if (h == Health::Finished || h == Health::Lost)
        for (int rank : ranks(i))
            m_store->core().rankFinished(rank, h == Health::Finished ? "finished" : "lost");
    Q_EMIT changed();
}

void JobSession::onState(int i, Connection::State state, const QString &message)
{
    Process &p = m_processes[static_cast<std::size_t>(i)];
    p.message = message;
    switch (state) {
    case Connection::State::Idle:
        break;
    case Connection::State::Connecting:
        // The first Connecting is attach() itself; later ones are failed attempts.
        if (!p.everWelcomed && !message.startsWith(tr("connecting to")))
            setHealth(i, Health::Unreachable);
        break;
    case Connection::State::Connected:
        setHealth(i, Health::Live);
        break;
    case Connection::State::Lost:
        setHealth(i, Health::Lost);
        break;
    case Connection::State::Finished:
        setHealth(i, Health::Finished);
        break;
    case Connection::State::Failed:
        setHealth(i, Health::Failed);
        break;
    }
    Q_EMIT changed();
}

void JobSession::checkSilence()
{
    for (int i = 0; i < processCount(); ++i) {
        const Process &p = m_processes[static_cast<std::size_t>(i)];
        const qint64 quiet = p.connection->msSinceData();
        if (p.health == Health::Live && quiet > m_silenceMs)
            setHealth(i, Health::Silent);
        else if (p.health == Health::Silent && quiet >= 0 && quiet <= m_silenceMs)
            setHealth(i, Health::Live);
    }
}

std::uint32_t JobSession::lastStepOf(int i) const
{
    std::uint32_t step = 0;
    bool any = false;
    for (int r : ranks(i)) {
        if (r < 0 || r >= m_store->laneCount()) continue;
        const EventLane &lane = m_store->lane(r);
        if (lane.size() == 0) continue;
        step = std::max(step, lane.at(lane.size() - 1).step);
        any = true;
    }
    return any ? step : m_store->completedStep();
}

QString JobSession::ranksText(int i) const
{
    const std::vector<int> r = ranks(i);
    if (r.empty())
        return tr("process %1 (%2)")
            .arg(i)
            .arg(m_processes[static_cast<std::size_t>(i)].target.endpoint);
    QStringList parts;
    for (int x : r)
        parts << QString::number(x);
    return (r.size() == 1 ? tr("rank ") : tr("ranks ")) + parts.join(QLatin1Char(','));
}

QString JobSession::processLine(int i) const
{
    const Process &p = m_processes.at(static_cast<std::size_t>(i));
    const QString who = ranksText(i);
    switch (p.health) {
    case Health::Connecting:
        return tr("%1 connecting to %2").arg(who, p.target.endpoint);
    case Health::Live:
        return tr("%1 live").arg(who);
    case Health::Silent:
        return tr("%1 not answering: nothing received for %2 s since step %3 (stopped or hung?); "
                  "its data is kept")
            .arg(who)
            .arg(qMax<qint64>(0, p.connection->msSinceData()) / 1000)
            .arg(p.stepAtLoss);
    case Health::Lost:
        return tr("%1 lost: connection closed at step %2; its data is kept")
            .arg(who)
            .arg(p.stepAtLoss);
    case Health::Unreachable:
        return tr("%1 unreachable: %2").arg(who, p.message);
    case Health::Finished:
        return tr("%1 finished: %2").arg(who, p.message);
    case Health::Failed:
        return tr("%1 failed: %2").arg(who, p.message);
    }
    return who;
}

bool JobSession::anyProblem() const
{
    return std::any_of(m_processes.begin(), m_processes.end(), [](const Process &p) {
        return p.health == Health::Silent || p.health == Health::Lost ||
               p.health == Health::Unreachable || p.health == Health::Failed;
    });
}

bool JobSession::allDone() const
{
    return !m_processes.empty() &&
           std::all_of(m_processes.begin(), m_processes.end(), [](const Process &p) {
               return p.health == Health::Lost || p.health == Health::Finished ||
                      p.health == Health::Failed;
           });
}

bool JobSession::caughtUp() const
{
    bool any = false;
    for (const Process &p : m_processes) {
        if (p.health == Health::Connecting || p.health == Health::Silent) return false;
        if (p.health != Health::Live) continue;
        if (!p.connection->caughtUp()) return false;
        any = true;
    }
    return any;
}

QStringList JobSession::notAnswering() const
{
    QStringList out;
    for (int i = 0; i < processCount(); ++i) {
        const Process &p = m_processes[static_cast<std::size_t>(i)];
        if (p.health == Health::Silent ||
            (p.health == Health::Connecting && m_sinceAttach.isValid() &&
             m_sinceAttach.elapsed() > m_silenceMs))
            out << processLine(i);
    }
    return out;
}

QString JobSession::summary() const
{
    if (m_processes.empty()) return {};
    if (!m_job) return m_processes.front().connection->message();
    std::set<int> live;
    for (int i = 0; i < processCount(); ++i)
        if (m_processes[static_cast<std::size_t>(i)].health == Health::Live)
            for (int r : ranks(i))
                live.insert(r);
    int world = m_store->hasState() ? m_store->worldSize() : 0;
    if (world <= 0) {
        std::set<int> all;
        for (int i = 0; i < processCount(); ++i)
            for (int r : ranks(i))
                all.insert(r);
        world = static_cast<int>(all.size());
    }
    QString text = (m_jobName.isEmpty() ? tr("%1 processes").arg(processCount())
                                        : tr("job %1").arg(m_jobName)) +
                   tr(": %1 of %2 ranks live").arg(live.size()).arg(world);
    for (int i = 0; i < processCount(); ++i) {
        const Health h = m_processes[static_cast<std::size_t>(i)].health;
        if (h != Health::Live && h != Health::Connecting)
            text += QStringLiteral("; ") + processLine(i);
    }
    return text;
}

QString JobSession::details() const
{
    QStringList lines;
    for (int i = 0; i < processCount(); ++i) {
        const Process &p = m_processes[static_cast<std::size_t>(i)];
        QString line = processLine(i) + QStringLiteral(" — ") + p.target.endpoint;
        if (!p.host.isEmpty()) line += tr(" on %1").arg(p.host);
        if (m_job && p.everWelcomed) {
            line +=
                tr("; clock: %1").arg(QString::fromStdString(wire::describeClockShift(p.shift)));
            if (!p.connection->clockError().isEmpty())
                line += QStringLiteral(" (") + p.connection->clockError() + QLatin1Char(')');
        }
        lines << line;
    }
    return lines.join(QLatin1Char('\n'));
}

} // namespace shardscope::session

// shardscope-capture: attaches to a live engine without a GUI (like tracy-capture) and
// writes a snapshot of its state and the events received; --list shows live engines.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include <memory>
#include <poll.h>
#include <set>

#include "base/version.h"
#include "client/clientstate.h"
#include "client/inspectorclient.h"
#include "client/livejobs.h"
#include "sessioncore/collectivealigner.h"
#include "sessioncore/store.h"
#include "sessioncore/traceexport.h"
#include "wire/atomicfile.h"
#include "wire/discovery.h"
#include "wire/endpoint.h"
#include "wire/jobmerge.h"
#include "wire/snapshot.h"
#include "wire/token.h"

using namespace shardscope;

namespace {

const char *kUsage = R"(Usage: shardscope-capture --attach ENDPOINT --out FILE [options]
       shardscope-capture --attach ENDPOINT --export-trace FILE [options]
       shardscope-capture --open FILE [--open FILE ...] --out FILE | --export-trace FILE
       shardscope-capture --list

Attaches to a live ShardScope engine, receives its state, recent history and live events,
and writes them as a snapshot file (docs/snapshot.md), a Chrome / Perfetto trace
(docs/trace.md), or both.

  --attach ENDPOINT   unix:PATH or tcp:HOST:PORT; several separated by commas: the
                      processes of one job (e.g. on several hosts); or job:NAME: every
                      live process of that job on this host (--list prints the job:
                      argument of each job); a job is written as one snapshot
  --token T           the token the engine was started with (visible to other local
                      users in the process list: prefer --token-file or SHARDSCOPE_TOKEN)
  --token-file F      read the token from F (a file only you can read: chmod 600);
                      SHARDSCOPE_TOKEN and SHARDSCOPE_TOKEN_FILE are used when neither
                      flag is given
  --open FILE         instead of --attach: the snapshot file a rank process wrote; given
                      several times (the files of one job's rank processes, e.g. of a
                      multi-node job that died: run.rank0.json, run.rank1.json), the
                      files are merged into one job as a live job is
  --out FILE          snapshot to write (atomically); gzip'd when FILE ends in .gz
  --export-trace FILE trace to write (atomically), the bytes the inspector's File >
                      Export trace writes for this snapshot; gzip'd when FILE ends in .gz
  --seconds N         stop after N seconds
  --until-step K      stop once step K has ended
                      (default: until the engine finishes, or Ctrl-C)
  --max-events N      keep at most the last N events (default 1000000)
  --list              print the live engines found in the runtime directory
  --help              show this help
  --version           print the release and exit

The job's collectives are aligned (rank by rank, by sequence number): each
collective_mismatch (the ranks issued different collectives) and rank_stalled (ranks
waited in one that others never reached, longer than SHARDSCOPE_STALL_SECONDS, default 5)
is printed with each rank's line and the fix, and is in the snapshot's violations; then
the stragglers (no fault): the rank that arrived last most often, and how late in all.

Exit status: 0 written, 1 could not attach or write, 2 bad command line (or a bad
SHARDSCOPE_STALL_SECONDS), 3 written but the engine went away before it finished or
before --until-step, or its goodbye said the training failed (what was collected is in
the file), 4 written, and the job's collectives diverged or stalled (printed above;
this takes precedence over 3).
)";

// The status of a capture whose job's collectives diverged or stalled (--help).
constexpr int kExitCollectives = 4;

struct Options
{
    bool list = false;
    std::string attach;
    std::vector<std::string> open; // --open: rank snapshot files, merged into one job
    std::string token;
    std::string tokenFile;
    std::string out;
    std::string trace;
    std::optional<double> seconds;
    std::optional<std::uint32_t> untilStep;
    std::size_t maxEvents = 1000000;
};

struct UsageError
{
    std::string message;
};

template <typename T> T parsePositive(std::string_view flag, std::string_view text)
{
    T value{};
    const char *end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (text.empty() || ec != std::errc() || ptr != end || !(value > T{}))
        throw UsageError{std::string(flag) + " expects a positive number, got '" +
                         std::string(text) + "'"};
    return value;
}

std::optional<Options> parseArgs(int argc, char **argv)
{
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string flag = argv[i];
        std::optional<std::string> inlineValue;
        if (const auto eq = flag.find('='); flag.starts_with("--") && eq != std::string::npos) {
            inlineValue = flag.substr(eq + 1);
            flag = flag.substr(0, eq);
        }
        auto value = [&]() -> std::string {
            if (inlineValue) return *inlineValue;
            if (i + 1 >= argc) throw UsageError{flag + " needs a value"};
            return argv[++i];
        };
        if (flag == "--help" || flag == "-h")
            return std::nullopt;
        else if (flag == "--list")
            o.list = true;
        else if (flag == "--attach")
            o.attach = value();
        else if (flag == "--open")
            o.open.push_back(value());
        else if (flag == "--token")
            o.token = value();
        else if (flag == "--token-file")
            o.tokenFile = value();
        else if (flag == "--out")
            o.out = value();
        else if (flag == "--export-trace")
            o.trace = value();
        else if (flag == "--seconds")
            o.seconds = parsePositive<double>(flag, value());
        else if (flag == "--until-step")
            o.untilStep = parsePositive<std::uint32_t>(flag, value());
        else if (flag == "--max-events")
            o.maxEvents = parsePositive<std::size_t>(flag, value());
        else
            throw UsageError{"unknown option '" + flag + "'"};
    }
    if (o.list) return o;
    if (!o.open.empty() && !o.attach.empty())
        throw UsageError{"--attach and --open exclude each other: capture a live run or files"};
    if (!o.open.empty() && (o.seconds || o.untilStep || !o.token.empty() || !o.tokenFile.empty()))
        throw UsageError{"--seconds, --until-step, --token and --token-file are for --attach"};
    if (o.attach.empty() && o.open.empty())
        throw UsageError{
            "--attach ENDPOINT is required (shardscope-capture --list shows live engines)"};
    if (o.open.empty())
        if (auto target = wire::parseAttachTarget(o.attach); !target)
            throw UsageError{"--attach: " + target.error()};
    if (o.out.empty() && o.trace.empty())
        throw UsageError{"--out FILE (a snapshot) or --export-trace FILE (a trace) is required"};
    for (const std::string *f : {&o.out, &o.trace})
        if (!f->empty())
            if (auto ok = wire::checkOutputFile(*f); !ok)
                throw UsageError{(f == &o.out ? "--out: " : "--export-trace: ") + ok.error()};
    if (o.seconds && o.untilStep)
        throw UsageError{"--seconds and --until-step cannot be combined; choose one"};
    return o;
}

volatile std::sig_atomic_t g_interrupted = 0;

// A server sends a heartbeat every second; this long without a frame is a stopped process
// (as the GUI's "not answering").
constexpr std::chrono::seconds kSilentAfter{5};

void onSignal(int)
{
    g_interrupted = 1;
}

std::string localTime(std::uint64_t unixMs)
{
    const std::time_t t = static_cast<std::time_t>(unixMs / 1000);
    std::tm tm{};
    ::localtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

// An argument as a shell takes it: as it is when it holds only characters no shell
// interprets, else in single quotes (a job named "my run" is attached as 'job:my run').
std::string shellWord(const std::string &arg)
{
    const bool plain = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) ||
               std::string_view("_@%+=:,./-").find(c) != std::string_view::npos;
    });
    if (plain) return arg;
    std::string out = "'";
    for (char c : arg)
        out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

std::string ranksText(const std::vector<int> &ranks)
{
    if (ranks.empty()) return "rank ?";
    if (ranks.size() == 1) return "rank " + std::to_string(ranks[0]);
    const bool contiguous = ranks.back() - ranks.front() + 1 == static_cast<int>(ranks.size());
    if (contiguous)
        return "ranks " + std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
    std::string out = "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i)
        out += (i ? "," : "") + std::to_string(ranks[i]);
    return out;
}

// Live processes grouped by job: every rank process of a torchrun/deepspeed job together.
int listEngines()
{
    const std::string dir = wire::defaultRuntimeDir();
    if (wire::listLiveEngines(dir).empty()) {
        struct stat st
        {
        };
        if (::lstat(dir.c_str(), &st) == 0 &&
            (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 022) != 0))
            std::printf("%s is not a private directory of yours (another user may have created "
                        "it); its entries are not trusted. Remove it, or set XDG_RUNTIME_DIR\n",
                        dir.c_str());
        else
            std::printf("no live ShardScope engines in %s\n", dir.c_str());
        return 0;
    }
    // Grouped by run (client::liveJobs: wire::sameRun): two jobs of one name are listed
    // apart, each with the name that attaches it; a rank two files announce is one rank.
    // Each job with its model (the one the user built, whatever ranks still building it
    // announce meanwhile) and the argument that attaches it, as it is to be typed in a
    // shell: job:NAME (NAME is ID@RENDEZVOUS when two live runs share an id), or the
    // endpoint of a process that announced no job.
    for (const client::LiveJob &job : client::liveJobs(dir)) {
        const std::string argument =
            shellWord(job.named ? "job:" + job.id : job.processes.front().endpoint);
        std::printf("job %s  (world size %d, %zu of %d ranks live)  model %s  --attach %s\n",
                    job.id.c_str(), job.worldSize, job.ranks.size(), job.worldSize,
                    job.model.c_str(), argument.c_str());
        std::printf("  %-10s %-8s %-20s %-7s %-16s %-19s %s\n", "RANKS", "PID", "MODEL", "BACKEND",
                    "HOST", "STARTED", "ENDPOINT");
        for (const auto &e : job.processes) {
            std::printf("  %-10s %-8lld %-20s %-7s %-16s %-19s %s%s\n",
                        ranksText(e.job.ranks).c_str(), static_cast<long long>(e.pid),
                        e.model.c_str(), e.backend.c_str(), e.job.host.c_str(),
                        localTime(e.startUnixMs).c_str(), e.endpoint.c_str(),
                        e.tokenRequired ? "  (token required)" : "");
        }
    }
    return 0;
}

// One attached process: a rank process of a job, or a whole engine.
struct Source
{
    std::string endpoint;
    std::unique_ptr<client::InspectorClient> client;
    client::ClientState state;
    std::string ended; // why it stopped before its engine finished, if it did
    std::string error; // a frame that could not be applied
    bool done = false;
    // When the last frame came: a live server sends at least a heartbeat a second.
    std::chrono::steady_clock::time_point lastFrame = std::chrono::steady_clock::now();
    explicit Source(std::size_t maxEvents) : state(maxEvents) {}
};

// Applies the frames s has (timeoutMs 0: only those already received; a read needs a few
// milliseconds, as next() rounds its deadline down to whole ones); true if it applied any.
bool pump(Source &s, int timeoutMs, bool several)
{
    bool any = false;
    while (!s.done) {
        auto frame = s.client->next(timeoutMs);
        if (!frame) {
            s.ended = frame.error();
            s.done = true;
            if (several)
                std::fprintf(stderr, "shardscope-capture: %s: %s; keeping what it sent\n",
                             s.endpoint.c_str(), frame.error().c_str());
            break;
        }
        if (!frame->has_value()) break;
        any = true;
        s.lastFrame = std::chrono::steady_clock::now();
        if (auto ok = s.state.apply(**frame); !ok) {
            s.error = ok.error();
            s.done = true;
            break;
        }
        if (s.state.finished()) s.done = true;
    }
    return any;
}

// The processes of "job:NAME" (every live process of that one run: wire::selectRun), or the
// endpoints given (entries with no pid: nothing to check them against but each other).
std::vector<wire::DiscoveryEntry> endpointsOf(const wire::AttachTarget &target)
{
    if (target.job.empty()) {
        std::vector<wire::DiscoveryEntry> out;
        for (const std::string &endpoint : target.endpoints) {
            wire::DiscoveryEntry e;
            e.endpoint = endpoint;
            out.push_back(std::move(e));
        }
        return out;
    }
    const std::string &job = target.job;
    auto live = client::liveJob(wire::defaultRuntimeDir(), job);
    if (!live) {
        std::fprintf(stderr,
                     "shardscope-capture: %s in %s (shardscope-capture --list shows the "
                     "jobs)\n",
                     live.error().c_str(), wire::defaultRuntimeDir().c_str());
        return {};
    }
    if (const std::vector<int> missing = live->missingRanks(); !missing.empty()) {
        std::string text;
        for (int r : missing)
            text += (text.empty() ? "" : ", ") + std::to_string(r);
        std::fprintf(stderr,
                     "shardscope-capture: job %s: no live process announces rank(s) %s (on another "
                     "host, or gone); capturing the others\n",
                     job.c_str(), text.c_str());
    }
    return std::move(live->processes);
}

// Writes what was captured or opened: the snapshot (--out) and the trace of it (--export-trace)
// as the inspector exports it once it has opened the file: the same store (loadSnapshot) and
// the same writer. false: said on stderr.
bool writeOutputs(const Options &o, const wire::Snapshot &snap)
{
    if (!o.out.empty())
        if (auto written = wire::writeSnapshotFile(o.out, snap); !written) {
            std::fprintf(stderr, "shardscope-capture: %s\n", written.error().c_str());
            return false;
        }
    if (!o.trace.empty()) {
        sessioncore::Store store;
        sessioncore::loadSnapshot(store, snap, o.out);
        if (auto written = sessioncore::writeTraceFile(o.trace, store); !written) {
            std::fprintf(stderr, "shardscope-capture: %s\n", written.error().c_str());
            return false;
        }
    }
    return true;
}

// The job's collectives aligned (sessioncore/collectivealigner.h): its collective_mismatch and
// rank_stalled records join the snapshot's violations and are printed, the job's first, then
// each rank's own. Returns how many the job has.
std::size_t diagnoseCollectives(wire::Snapshot &snap,
                                const std::vector<wire::Snapshot> *parts = nullptr)
{
    sessioncore::JobDiagnosis d = sessioncore::diagnoseJob(snap, 0, parts);
    for (const std::string &note : d.aligner.notes())
        std::printf("collectives: %s\n", note.c_str());
    std::size_t n = 0;
    for (const bool ranksOwn : {false, true})
        for (const state::ViolationRecord &v : snap.state.violations) {
            if (v.kind != ViolationKind::CollectiveMismatch && v.kind != ViolationKind::RankStalled)
                continue;
            bool own = v.kind == ViolationKind::RankStalled;
            for (const state::CollectiveSide &side : v.collective.sides)
                own = own && side.ranks.size() == 1 && v.collective.sides.size() == 1;
            if (own != ranksOwn) continue;
            ++n;
            std::printf("%s%s (group %u, #%llu, rank %d): %s\n", ranksOwn ? "  " : "",
                        std::string(violationKindName(v.kind)).c_str(), v.collective.group,
                        static_cast<unsigned long long>(v.collective.seq), v.rank,
                        v.message.c_str());
            for (const state::CollectiveSite &site : v.collective.sites)
                if (site.where.known() && !ranksOwn)
                    std::printf("    rank %d: %s%s%s\n", site.rank, site.where.fileLine().c_str(),
                                site.where.function.empty() ? "" : " in ",
                                site.where.function.c_str());
            if (!v.fix.empty()) std::printf("%s  fix: %s\n", ranksOwn ? "  " : "", v.fix.c_str());
        }
    // Stragglers, no fault: the rank that arrived last most often, and how late in all.
    const sessioncore::StragglerSummary spread = d.aligner.stragglers();
    if (const sessioncore::StragglerFigures *last = sessioncore::latestRank(spread))
        std::printf("stragglers: %llu collectives completed by every rank, arrival spread up to "
                    "%.1f ms; the latest: rank %d, last in %llu of them, %.1f ms late in all\n",
                    static_cast<unsigned long long>(spread.collectives),
                    static_cast<double>(spread.maxSpreadNs) / 1e6, last->rank,
                    static_cast<unsigned long long>(last->timesLast),
                    static_cast<double>(last->totalLateNs) / 1e6);
    return n;
}

// SHARDSCOPE_STALL_SECONDS, checked before anything is attached or read.
bool stallSecondsOk()
{
    std::string error;
    (void)sessioncore::stallNsFromEnvironment(0, &error);
    if (error.empty()) return true;
    std::fprintf(stderr, "shardscope-capture: %s\n", error.c_str());
    return false;
}

// --open FILE...: one job from the snapshot files its rank processes wrote (wire/jobmerge.h).
int openFiles(const Options &o)
{
    std::vector<wire::Snapshot> parts;
    auto merged = wire::mergeSnapshotFiles(o.open, &parts);
    if (!merged) {
        std::fprintf(stderr, "shardscope-capture: %s\n", merged.error().c_str());
        return 1;
    }
    wire::Snapshot snap = std::move(merged).value();
    snap.meta.producer = "shardscope-capture";
    snap.meta.createdUnixMs = wire::unixTimeMs();
    const std::size_t collectives = diagnoseCollectives(snap, &parts);
    if (!writeOutputs(o, snap)) return 1;
    std::printf("opened %zu snapshot files of one job: %s, step %u, %zu events, %zu "
                "violations -> %s\n",
                o.open.size(), ranksText(snap.state.localRanks).c_str(), snap.state.step,
                snap.events.size(), snap.state.violations.size(),
                (o.out.empty()     ? o.trace
                 : o.trace.empty() ? o.out
                                   : o.out + " and " + o.trace)
                    .c_str());
    return collectives ? kExitCollectives : 0;
}

int capture(const Options &o)
{
    auto token = wire::resolveToken(o.token, o.tokenFile);
    if (!token) {
        std::fprintf(stderr, "shardscope-capture: %s\n", token.error().c_str());
        return 2;
    }
    // parseArgs checked it: the one parser of endpoints, lists and job:NAME.
    const wire::AttachTarget target = wire::parseAttachTarget(o.attach).value();
    const std::string &job = target.job;
    // A job (job:NAME, or several endpoints) is written as one merged snapshot.
    const bool several = !job.empty() || target.endpoints.size() > 1;
    const std::string jobName = !job.empty() ? job : o.attach;
    const std::vector<wire::DiscoveryEntry> entries = endpointsOf(target);
    if (entries.empty()) return 1;
    client::InspectorClient::Options copts;
    copts.token = *token;
    copts.name = "shardscope-capture";
    std::vector<std::unique_ptr<Source>> sources;
    for (const wire::DiscoveryEntry &entry : entries) {
        const std::string &ep = entry.endpoint;
        // The check the inspector makes too (wire::checkReachable), in its words.
        if (auto reached = wire::checkReachable(ep); !reached) {
            std::fprintf(stderr, "shardscope-capture: %s\n", reached.error().c_str());
            continue;
        }
        auto client = client::InspectorClient::connect(ep, copts);
        if (!client) {
            std::fprintf(stderr, "shardscope-capture: %s: %s\n", ep.c_str(),
                         client.error().c_str());
            continue;
        }
        const wire::Welcome &w = (*client)->welcome();
        // Each process is the one its discovery file announced; endpoints given by hand are
        // processes of the run the first one attached belongs to (wire::checkAnswered).
        wire::DiscoveryEntry expected = entry;
        if (expected.pid == 0 && !sources.empty()) {
            expected.pid = w.pid;
            expected.job = sources.front()->client->welcome().job;
        }
        if (several && expected.pid != 0)
            if (const std::string wrong = wire::checkAnswered(expected, w.pid, w.job);
                !wrong.empty()) {
                std::fprintf(stderr, "shardscope-capture: %s\n", wrong.c_str());
                continue;
            }
        std::printf("attached to %s: pid %lld, model %s, world size %d, backend %s", ep.c_str(),
                    static_cast<long long>(w.pid), w.model.c_str(), w.worldSize, w.backend.c_str());
        if (several && !w.job.ranks.empty()) std::printf(", rank %d", w.job.ranks.front());
        std::printf("\n");
        auto src = std::make_unique<Source>(o.maxEvents);
        src->endpoint = ep;
        src->client = std::move(client.value());
        sources.push_back(std::move(src));
    }
    if (sources.empty()) {
        if (several)
            std::fprintf(stderr, "shardscope-capture: no process of job %s could be attached\n",
                         jobName.c_str());
        return 1;
    }
    std::fflush(stdout);

    struct sigaction sa
    {
    };
    sa.sa_handler = onSignal;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);

    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    std::string ended; // why the capture stopped early, if it did
    // After --until-step is reached, wait (briefly) for the state that follows that step.
    std::optional<Clock::time_point> settleUntil;
    auto live = [&] {
        std::vector<Source *> out;
        for (auto &s : sources)
            if (!s->done) out.push_back(s.get());
        return out;
    };
    for (;;) {
        if (g_interrupted) {
            ended = "interrupted";
            break;
        }
        if (o.seconds && std::chrono::duration<double>(Clock::now() - start).count() >= *o.seconds)
            break;
        const std::vector<Source *> active = live();
        if (active.empty()) break;
        // Every process still attached silent (not even a heartbeat) for kSilentAfter:
        // stopped (SIGSTOP) or hung. Waiting on would never end (a job whose other ranks
        // failed): what was collected is written, and the capture says which.
        if (std::all_of(active.begin(), active.end(),
                        [&](Source *s) { return Clock::now() - s->lastFrame > kSilentAfter; })) {
            for (Source *s : active) {
                const auto &ranks = s->client->welcome().job.ranks;
                std::fprintf(stderr,
                             "shardscope-capture: %s (%s) has sent nothing for %lld s, not even "
                             "a heartbeat: stopped (SIGSTOP) or hung; not waiting for it\n",
                             s->endpoint.c_str(), ranksText(ranks).c_str(),
                             static_cast<long long>(kSilentAfter.count()));
                s->ended = "not answering (stopped or hung)";
                s->done = true;
            }
            if (ended.empty()) ended = "not answering (stopped or hung)";
            break;
        }
        if (o.untilStep && !settleUntil &&
            std::all_of(active.begin(), active.end(),
                        [&](Source *s) { return s->state.latestCompletedStep() >= *o.untilStep; }))
            settleUntil = Clock::now() + std::chrono::seconds(2);
        if (settleUntil && (Clock::now() >= *settleUntil ||
                            std::all_of(active.begin(), active.end(), [&](Source *s) {
                                return s->state.hasState() &&
                                       s->state.snapshot().state.step >= *o.untilStep &&
                                       s->state.historyDone();
                            })))
            break;
        // Frames the client already holds first (the handshake may have read past the
        // Welcome), then whatever arrives.
        std::vector<pollfd> fds;
        for (Source *s : active)
            fds.push_back({s->client->fd(), POLLIN, 0});
        const bool anyBuffered = std::any_of(active.begin(), active.end(), [&](Source *s) {
            return pump(*s, 0, sources.size() > 1);
        });
        if (!anyBuffered) ::poll(fds.data(), fds.size(), 100);
        for (std::size_t i = 0; i < active.size(); ++i) {
            if (active[i]->done) continue;
            if (fds[i].revents & (POLLIN | POLLHUP | POLLERR))
                pump(*active[i], 5, sources.size() > 1);
            if (!active[i]->error.empty()) {
                std::fprintf(stderr, "shardscope-capture: %s: %s\n", active[i]->endpoint.c_str(),
                             active[i]->error.c_str());
                return 1;
            }
        }
    }
    std::vector<wire::Snapshot> parts;
    std::vector<std::string> failed; // processes whose Goodbye says the run failed
    std::uint64_t history = 0, liveEvents = 0;
    for (auto &s : sources) {
        if (!s->state.hasState()) {
            std::fprintf(stderr, "shardscope-capture: no state was received from %s%s\n",
                         s->endpoint.c_str(),
                         several ? "; the job's snapshot lacks it" : "; nothing written");
            continue;
        }
        wire::Snapshot snap = s->state.snapshot();
        snap.meta.pid = s->client->welcome().pid;
        snap.meta.endpoint = s->endpoint;
        parts.push_back(std::move(snap));
        history += s->state.historyEvents();
        liveEvents += s->state.liveEvents();
        if (!s->ended.empty() && !s->state.finished() && ended.empty()) ended = s->ended;
        if (s->state.finished() && wire::goodbyeSaysFailed(s->state.goodbye()))
            failed.push_back(s->endpoint + ": " + s->state.goodbye().reason);
    }
    if (parts.empty()) return 1;
    wire::Snapshot snap;
    if (!several) {
        snap = std::move(parts.front());
    } else {
        auto merged = wire::mergeJobSnapshots(parts, jobName);
        if (!merged) {
            std::fprintf(stderr, "shardscope-capture: %s\n", merged.error().c_str());
            return 1;
        }
        snap = std::move(merged.value());
    }
    snap.meta.producer = "shardscope-capture";
    snap.meta.createdUnixMs = wire::unixTimeMs();
    if (!several)
        snap.meta.endpoint = target.endpoints.front();
    else if (job.empty())
        snap.meta.endpoint = o.attach;
    const std::size_t collectives = diagnoseCollectives(snap, several ? &parts : nullptr);
    if (!writeOutputs(o, snap)) return 1;
    // An engine closed the connection without its goodbye (it died or was killed).
    const bool engineLost = !ended.empty() && !g_interrupted;
    if (engineLost)
        std::printf("capture ended early: the engine went away before it finished (%s); "
                    "everything collected so far is written\n",
                    ended.c_str());
    else if (!ended.empty())
        std::printf("capture ended: %s\n", ended.c_str());
    // A run that failed (also while its model was built) is not a successful capture.
    for (const std::string &f : failed)
        std::printf("the run failed: %s; everything collected so far is written\n", f.c_str());
    std::printf(
        "captured step %u%s: %zu events (%llu history, %llu live), %llu dropped, %zu "
        "violations -> %s\n",
        snap.state.step,
        !several
            ? ""
            : (" of job " + jobName + " (" + std::to_string(parts.size()) + " processes)").c_str(),
        snap.events.size(), static_cast<unsigned long long>(history),
        static_cast<unsigned long long>(liveEvents),
        static_cast<unsigned long long>(snap.droppedEvents), snap.state.violations.size(),
        (o.out.empty()     ? o.trace
         : o.trace.empty() ? o.out
                           : o.out + " and " + o.trace)
            .c_str());
    if (collectives) return kExitCollectives;
    return engineLost || !failed.empty() ? 3 : 0;
}

} // namespace

int main(int argc, char **argv)
{
    if (argc == 2 && std::string_view(argv[1]) == "--version") {
        std::printf("%s %s\n", "shardscope-capture", shardscope::kVersion);
        return 0;
    }
    std::optional<Options> options;
    try {
        options = parseArgs(argc, argv);
    } catch (const UsageError &e) {
        std::fprintf(stderr,
                     "shardscope-capture: %s\nRun 'shardscope-capture --help' for the options.\n",
                     e.message.c_str());
        return 2;
    }
    if (!options) {
        std::fputs(kUsage, stdout);
        return 0;
    }
    if (options->list) return listEngines();
    if (!stallSecondsOk()) return 2;
    return options->open.empty() ? capture(*options) : openFiles(*options);
}

// shardscope-capture: attaches to a live engine without a GUI (like tracy-capture) and
// writes a snapshot of its state and the events received; --list shows live engines.

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

#include "server/inspectorclient.h"
#include "wire/clientstate.h"
#include "wire/discovery.h"
#include "wire/endpoint.h"
#include "wire/snapshot.h"
#include "wire/token.h"

using namespace shardscope;

namespace {

const char *kUsage = R"(Usage: shardscope-capture --attach ENDPOINT --out FILE [options]
       shardscope-capture --list

Attaches to a live ShardScope engine, receives its state, recent history and live events,
and writes them as a snapshot file (docs/snapshot.md).

  --attach ENDPOINT   unix:PATH or tcp:HOST:PORT (see --list)
  --token T           the token the engine was started with (visible to other local
                      users in the process list: prefer --token-file or SHARDSCOPE_TOKEN)
  --token-file F      read the token from F (a file only you can read: chmod 600);
                      SHARDSCOPE_TOKEN and SHARDSCOPE_TOKEN_FILE are used when neither
                      flag is given
  --out FILE          snapshot to write (atomically)
  --seconds N         stop after N seconds
  --until-step K      stop once step K has ended
                      (default: until the engine finishes, or Ctrl-C)
  --max-events N      keep at most the last N events (default 1000000)
  --list              print the live engines found in the runtime directory
  --help              show this help

Exit status: 0 written, 1 could not attach or write, 2 bad command line, 3 written but
the engine went away before it finished or before --until-step (what was collected is in
the file).
)";

struct Options
{
    bool list = false;
    std::string attach;
    std::string token;
    std::string tokenFile;
    std::string out;
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
        else if (flag == "--token")
            o.token = value();
        else if (flag == "--token-file")
            o.tokenFile = value();
        else if (flag == "--out")
            o.out = value();
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
    if (o.attach.empty())
        throw UsageError{
            "--attach ENDPOINT is required (shardscope-capture --list shows live engines)"};
    if (auto ep = wire::parseEndpoint(o.attach); !ep) throw UsageError{"--attach: " + ep.error()};
    if (o.out.empty()) throw UsageError{"--out FILE is required"};
    if (o.seconds && o.untilStep)
        throw UsageError{"--seconds and --until-step cannot be combined; choose one"};
    return o;
}

volatile std::sig_atomic_t g_interrupted = 0;

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

int listEngines()
{
    const std::string dir = wire::defaultRuntimeDir();
    const auto engines = wire::listLiveEngines(dir);
    if (engines.empty()) {
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
    std::printf("%-8s %-20s %-5s %-7s %-19s %s\n", "PID", "MODEL", "WORLD", "BACKEND", "STARTED",
                "ENDPOINT");
    for (const auto &e : engines)
        std::printf("%-8lld %-20s %-5d %-7s %-19s %s%s\n", static_cast<long long>(e.pid),
                    e.model.c_str(), e.worldSize, e.backend.c_str(),
                    localTime(e.startUnixMs).c_str(), e.endpoint.c_str(),
                    e.tokenRequired ? "  (token required)" : "");
    return 0;
}

int capture(const Options &o)
{
    auto token = wire::resolveToken(o.token, o.tokenFile);
    if (!token) {
        std::fprintf(stderr, "shardscope-capture: %s\n", token.error().c_str());
        return 2;
    }
    server::InspectorClient::Options copts;
    copts.token = *token;
    copts.name = "shardscope-capture";
    auto client = server::InspectorClient::connect(o.attach, copts);
    if (!client) {
        std::fprintf(stderr, "shardscope-capture: %s\n", client.error().c_str());
        return 1;
    }
    const wire::Welcome &w = (*client)->welcome();
    std::printf("attached to %s: pid %lld, model %s, world size %d, backend %s\n", o.attach.c_str(),
                static_cast<long long>(w.pid), w.model.c_str(), w.worldSize, w.backend.c_str());
    std::fflush(stdout);

    struct sigaction sa
    {
    };
    sa.sa_handler = onSignal;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);

    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    wire::ClientState state(o.maxEvents);
    std::string ended; // why the capture stopped early, if it did
    // After --until-step is reached, wait (briefly) for the state that follows that step.
    std::optional<Clock::time_point> settleUntil;
    for (;;) {
        if (g_interrupted) {
            ended = "interrupted";
            break;
        }
        if (o.seconds && std::chrono::duration<double>(Clock::now() - start).count() >= *o.seconds)
            break;
        if (o.untilStep && !settleUntil && state.latestCompletedStep() >= *o.untilStep)
            settleUntil = Clock::now() + std::chrono::seconds(2);
        if (settleUntil && (Clock::now() >= *settleUntil ||
                            (state.hasState() && state.snapshot().state.step >= *o.untilStep &&
                             state.historyDone())))
            break;
        auto frame = (*client)->next(100);
        if (!frame) {
            if (!state.hasState()) {
                std::fprintf(stderr, "shardscope-capture: %s\n", frame.error().c_str());
                return 1;
            }
            ended = frame.error();
            break;
        }
        if (!frame->has_value()) continue;
        const bool wasState = (*frame)->type == wire::MessageType::State;
        if (auto ok = state.apply(**frame); !ok) {
            std::fprintf(stderr, "shardscope-capture: %s\n", ok.error().c_str());
            return 1;
        }
        if (state.finished()) break;
        if (settleUntil && wasState && state.snapshot().state.step >= *o.untilStep) break;
    }
    if (!state.hasState()) {
        std::fprintf(stderr, "shardscope-capture: no state was received from %s; nothing written\n",
                     o.attach.c_str());
        return 1;
    }
    wire::Snapshot snap = state.snapshot();
    snap.meta.producer = "shardscope-capture";
    snap.meta.pid = w.pid;
    snap.meta.createdUnixMs = wire::unixTimeMs();
    snap.meta.endpoint = o.attach;
    if (auto written = wire::writeSnapshotFile(o.out, snap); !written) {
        std::fprintf(stderr, "shardscope-capture: %s\n", written.error().c_str());
        return 1;
    }
    // The engine closed the connection without its goodbye (it died or was killed).
    const bool engineLost = !ended.empty() && !state.finished() && !g_interrupted;
    if (engineLost)
        std::printf("capture ended early: the engine went away before it finished (%s); "
                    "everything collected so far is written\n",
                    ended.c_str());
    else if (!ended.empty() && !state.finished())
        std::printf("capture ended: %s\n", ended.c_str());
    std::printf("captured step %u: %zu events (%llu history, %llu live), %llu dropped, %zu "
                "violations -> %s\n",
                snap.state.step, snap.events.size(),
                static_cast<unsigned long long>(state.historyEvents()),
                static_cast<unsigned long long>(state.liveEvents()),
                static_cast<unsigned long long>(snap.droppedEvents), snap.state.violations.size(),
                o.out.c_str());
    return engineLost ? 3 : 0;
}

} // namespace

int main(int argc, char **argv)
{
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
    return options->list ? listEngines() : capture(*options);
}

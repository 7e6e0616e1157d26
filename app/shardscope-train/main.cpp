// shardscope-train: a data-parallel ZeRO-3 training run on the ShardScope engine, with the
// two user stories (tied embedding, weight_norm after zero.Init) reproduced or fixed.

#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <exception>
#include <fcntl.h>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unistd.h>
#include <vector>

#include "base/version.h"
#include "comm/asynccommunicator.h"
#include "comm/gloocommunicator.h"
#include "comm/torchrunenv.h"
#include "core/engine.h"
#include "core/engineprovider.h"
#include "cuda/backendselect.h"
#include "cuda/gputrainer.h"
#include "nn/markov.h"
#include "nn/trainer.h"
#include "server/finishonsignal.h"
#include "server/inspector.h"
#include "wire/endpoint.h"
#include "wire/snapshot.h"
#include "wire/token.h"

using namespace shardscope;

namespace {

constexpr const char *kUsage = R"(Usage: shardscope-train [options]

A data-parallel ZeRO-3 training run of a small language model on the ShardScope engine.
Each rank is a thread; parameters are partitioned across ranks and gathered on demand.

The run:
  --world-size N        ranks (default 4)
  --steps S             optimizer steps (default 800)
  --seed N              seed of the initial weights and of the synthetic data (default 1)
  --backend B           cpu, nccl, gloo or auto (default auto: NCCL when GPUs are usable, else
                        CPU). gloo: one process per rank, collectives over TCP; start the
                        ranks with scripts/launch -n N or torchrun (WORLD_SIZE, not
                        --world-size, sets the ranks)
  --comm-timeout S      gloo: the longest a collective waits for its peers, in seconds
                        (default 60); a rank that died or stopped answering makes the others
                        fail within about 1.5 S, naming it
  --diverge HOW         one rank takes another path, as scripts do by accident (the hang of a
                        sharded job, reproduced): extra-forward (it evaluates one more batch
                        after step S), extra-batch (one more micro-batch after the last step),
                        gathered (GatheredParameters over embed.weight after step S), raise (it
                        fails at step S), slow (it sleeps T seconds before step S: a straggler,
                        no fault). Every rank then meets in a barrier after the last step
  --diverge-rank R      the rank that diverges (default 0)
  --diverge-step S      the step (default: the last)
  --diverge-seconds T   slow: the seconds it sleeps (default 1)

The model (embed, pos_conv, blocks.<i>.{ln,fc1,fc2}, ln_f, tied lm_head):
  --layers L            blocks (default 2)
  --hidden H            hidden size (default 64)
  --vocab V             vocabulary size (default 97)
  --seq T               tokens per sequence (default 32)
  --kernel K            pos_conv kernel size (default 8)
  --groups G            pos_conv groups, must divide H (default 4)
  --causal-conv         pad pos_conv causally: position t sees no later token (the default)
  --symmetric-conv      pad pos_conv symmetrically ("same", wav2vec2's positional
                        convolution): position t then also sees tokens t+1 .. t+K/2-1, its
                        own next-token target among them, and the loss falls below the
                        data's floor (see "The loss" below): a language model that cheats

The optimisation (Adam):
  --batch B             global batch in sequences per step, split across ranks (default 30)
  --lr X                learning rate (default 0.003)
  --weight-decay X      decoupled (AdamW) weight decay of the matrices (default 0)

The engine:
  --externals none|manual
                        none (default): the model code does what the users in the stories
                        did first: lm_head reads embed.weight unregistered, and weight_norm
                        creates pos_conv.weight_g/weight_v after partitioning (late
                        parameters). manual: the stories' fixes, register_external_parameter
                        and weight_norm inside GatheredParameters(modifier_rank=0) + adoption
  --guard error|warn|auto
                        what the engine does about an unregistered access (default warn):
                        error stops with the fix (with --externals none, at weight_norm's
                        read of pos_conv.weight while the model is built), warn gathers and
                        records, auto registers
  --persistence-threshold N
                        parameters with fewer elements are never partitioned (default 1000)
  --overlap-comm        CPU and gloo: run each rank's collectives on a progress thread, so
                        prefetched gathers overlap compute and show INFLIGHT (DeepSpeed's
                        overlap_comm; NCCL always overlaps on its own stream)

The inspector endpoint:
  --listen ENDPOINT     unix:PATH or tcp:HOST:PORT (default: a Unix socket, announced in a
                        discovery file). Under torchrun every process serves its own rank:
                        rank N > 0 listens on PATH.rank<N> or on PORT+N (the default socket
                        is per process anyway), and writes --snapshot-out FILE.rank<N>
  --token T             required to listen on a non-loopback TCP host; other local users
                        can read it in the process list: prefer --token-file
  --token-file F        read the token from F, a file only you can read (chmod 600);
                        without either flag, SHARDSCOPE_TOKEN or the file named by
                        SHARDSCOPE_TOKEN_FILE is used
  --no-listen           do not serve the live endpoint
  --snapshot-out FILE   write the final state and recent history to FILE at the end
  --history N           recent events kept for a client that attaches late (default 65536)
  --no-telemetry        the engine emits no events (the endpoint still serves the state)
  --wait-for-client[=SECONDS]
                        before building the model, wait until an inspector is attached (at
                        most SECONDS; without a value, as long as it takes)
  --linger SECONDS      after the last step, wait up to SECONDS for an inspector to attach,
                        so it receives the end of a short run (default 0)

  --help                show this help
  --version             print the release and exit

Each step prints one line: step, loss, tokens/s, MB gathered, and the unregistered accesses
and late parameters recorded so far; the last line begins with "final".
Exit status: 0 done, 1 the run failed (e.g. --guard error stopped it), 2 bad command line
or endpoint.
)";

struct UsageError
{
    std::string message;
};

template <typename T> T parseNumber(std::string_view flag, std::string_view text)
{
    T value{};
    const char *end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (text.empty() || ec != std::errc() || ptr != end)
        throw UsageError{std::string(flag) + " expects a number, got '" + std::string(text) + "'"};
    return value;
}

// Returns the config, or nullopt after printing the help.
std::optional<nn::TrainConfig> parseArgs(const std::vector<std::string> &args)
{
    nn::TrainConfig c;
    for (std::size_t i = 0; i < args.size(); ++i) {
        std::string flag = args[i];
        std::optional<std::string> inlineValue;
        if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
            inlineValue = flag.substr(eq + 1);
            flag = flag.substr(0, eq);
        }
        auto value = [&]() -> std::string {
            if (inlineValue) return *inlineValue;
            if (i + 1 >= args.size()) throw UsageError{flag + " needs a value"};
            return args[++i];
        };
        auto noValue = [&] {
            if (inlineValue) throw UsageError{flag + " takes no value"};
        };
        if (flag == "--help" || flag == "-h") {
            noValue();
            return std::nullopt;
        } else if (flag == "--world-size") {
            c.worldSize = parseNumber<int>(flag, value());
        } else if (flag == "--steps") {
            c.steps = parseNumber<int>(flag, value());
        } else if (flag == "--layers") {
            c.layers = parseNumber<int>(flag, value());
        } else if (flag == "--hidden") {
            c.hidden = parseNumber<int>(flag, value());
        } else if (flag == "--vocab") {
            c.vocab = parseNumber<int>(flag, value());
        } else if (flag == "--seq") {
            c.seq = parseNumber<int>(flag, value());
        } else if (flag == "--batch") {
            c.batch = parseNumber<int>(flag, value());
        } else if (flag == "--kernel") {
            c.kernel = parseNumber<int>(flag, value());
        } else if (flag == "--groups") {
            c.groups = parseNumber<int>(flag, value());
        } else if (flag == "--lr") {
            c.lr = parseNumber<float>(flag, value());
        } else if (flag == "--weight-decay") {
            c.weightDecay = parseNumber<float>(flag, value());
        } else if (flag == "--seed") {
            c.seed = parseNumber<std::uint64_t>(flag, value());
        } else if (flag == "--persistence-threshold") {
            c.persistenceThreshold = parseNumber<std::int64_t>(flag, value());
        } else if (flag == "--externals") {
            const std::string v = value();
            if (!nn::parseExternals(v, c.externals))
                throw UsageError{"--externals '" + v + "' is not one of none, manual"};
        } else if (flag == "--guard") {
            const std::string v = value();
            if (!parseGuardPolicy(v, c.guard))
                throw UsageError{"--guard '" + v + "' is not one of error, warn, auto"};
        } else if (flag == "--backend") {
            c.backend = value();
        } else if (flag == "--comm-timeout") {
            c.commTimeoutSeconds = parseNumber<int>(flag, value());
        } else if (flag == "--diverge") {
            c.diverge = value();
        } else if (flag == "--diverge-rank") {
            c.divergeRank = parseNumber<int>(flag, value());
        } else if (flag == "--diverge-step") {
            c.divergeStep = parseNumber<int>(flag, value());
        } else if (flag == "--diverge-seconds") {
            c.divergeSeconds = parseNumber<double>(flag, value());
        } else if (flag == "--listen") {
            c.endpoint = value();
            c.listen = true;
        } else if (flag == "--token") {
            c.token = value();
        } else if (flag == "--token-file") {
            c.tokenFile = value();
        } else if (flag == "--no-listen") {
            noValue();
            c.listen = false;
        } else if (flag == "--snapshot-out") {
            c.snapshotOut = value();
        } else if (flag == "--history") {
            c.historyEvents = parseNumber<std::size_t>(flag, value());
        } else if (flag == "--overlap-comm") {
            noValue();
            c.overlapComm = true;
        } else if (flag == "--causal-conv") {
            noValue();
            c.causalConv = true;
        } else if (flag == "--symmetric-conv") {
            noValue();
            c.causalConv = false;
        } else if (flag == "--wait-for-client") {
            c.waitForClient = true;
            c.waitForClientSeconds = inlineValue ? parseNumber<double>(flag, *inlineValue) : 0.0;
        } else if (flag == "--linger") {
            c.lingerSeconds = parseNumber<double>(flag, value());
        } else if (flag == "--no-telemetry") {
            noValue();
            c.telemetry = false;
        } else {
            throw UsageError{"unknown option '" + args[i] + "'"};
        }
    }
    const std::string problem = nn::validate(c);
    if (!problem.empty()) throw UsageError{problem};
    return c;
}

void printStep(const nn::StepReport &r)
{
    std::printf(
        "step %d/%d  loss %.6f  tokens/s %.0f  gathered %.1f MB  unregistered %llu  late %llu\n",
        r.step, r.steps, r.loss, r.tokensPerSecond, r.megabytesGathered,
        static_cast<unsigned long long>(r.unregisteredAccesses),
        static_cast<unsigned long long>(r.lateParameters));
    std::fflush(stdout);
}

void printFinal(const nn::TrainResult &r, int steps)
{
    const double drop = r.firstLoss > 0.0 ? 100.0 * (r.firstLoss - r.lastLoss) / r.firstLoss : 0.0;
    std::printf("final loss %.6f  first %.6f  drop %.1f%%  steps %d  time %.1f s  tokens/s %.0f  "
                "gathered %.1f MB  unregistered %llu  late %llu\n",
                r.lastLoss, r.firstLoss, drop, steps, r.seconds,
                r.seconds > 0.0 ? static_cast<double>(r.tokens) / r.seconds : 0.0,
                r.megabytesGathered, static_cast<unsigned long long>(r.unregisteredAccesses),
                static_cast<unsigned long long>(r.lateParameters));
    std::fflush(stdout);
}

// Prints each problem the engine records the first time it appears, as the first local
// rank saw it (not once per rank), so the two stories show up in a plain terminal at the
// step they happen.
class ViolationPrinter
{
  public:
    explicit ViolationPrinter(const core::Engine &engine) : m_engine(engine) {}

    void printNew()
    {
        const std::vector<state::ViolationRecord> all = m_engine.violations();
        for (; m_seen < all.size(); ++m_seen) {
            const state::ViolationRecord &v = all[m_seen];
            if (v.kind == ViolationKind::TraceInvalidated ||
                v.rank != m_engine.localRanks().front())
                continue;
            const std::string when = v.step == 0 ? std::string("while building the model")
                                                 : "at step " + std::to_string(v.step);
            std::printf("  %s %s: %s\n", std::string(violationKindName(v.kind)).c_str(),
                        when.c_str(), v.message.c_str());
            if (!v.fix.empty()) std::printf("    fix: %s\n", v.fix.c_str());
        }
        std::fflush(stdout);
    }

  private:
    const core::Engine &m_engine;
    std::size_t m_seen = 0;
};

// The help's last paragraph: what the loss can reach, computed from the data itself.
void printLossFloor()
{
    const nn::TrainConfig d;
    const double floor = nn::MarkovStream(d.seed, d.vocab).lossFloor(d.seq);
    std::printf("\nThe loss: the data is an order-2 Markov chain over the vocabulary (each context "
                "has\nat most four successors), so no next-token model can reach a mean loss "
                "below the\nchain's entropy: the loss floor is %.4f nats with the defaults "
                "(--vocab %d --seq %d;\nthe first target of a sequence is uniform, ln V = %.4f). "
                "An untrained model starts\nnear ln V; with causal padding the loss falls towards "
                "the floor and stays above it.\nEach run prints its own floor. With "
                "--symmetric-conv it falls below: the model sees\nits targets.\n",
                floor, d.vocab, d.seq, std::log(static_cast<double>(d.vocab)));
}

// Blocks until an inspector is attached, at most `seconds` (0: no limit).
bool waitForInspector(server::Inspector &inspector, double seconds)
{
    using std::chrono::milliseconds;
    return inspector.waitForClient(
        seconds > 0.0 ? milliseconds(static_cast<long long>(seconds * 1e3)) : milliseconds::max());
}

using Trainer = std::function<nn::TrainResult(core::Engine &, const nn::TrainConfig &,
                                              const nn::StepCallback &)>;

// One run on an engine of either backend: the inspector endpoint (up before the model is
// built, so a client sees weight_norm's late parameters and reads as they happen), the
// model, the steps and the final line. Under torchrun only the process holding rank 0
// prints the model, the steps and the problems; every process prints its final line.
int trainWithInspector(core::Engine &engine, const nn::TrainConfig &config, const Trainer &train)
{
    const int firstRank = engine.localRanks().front();
    const bool reporter = firstRank == 0;
    if (reporter) {
        std::printf("model: %d blocks, hidden %d, vocab %d, seq %d, pos_conv kernel %d, groups "
                    "%d, %s padding; world size %d, global batch %d sequences; externals %s, "
                    "guard %s\n",
                    config.layers, config.hidden, config.vocab, config.seq, config.kernel,
                    config.groups, config.causalConv ? "causal" : "same", engine.worldSize(),
                    config.batch, std::string(nn::externalsName(config.externals)).c_str(),
                    std::string(guardPolicyName(config.guard)).c_str());
        std::fflush(stdout);
    }

    server::InspectorOptions options;
    options.listen = config.listen;
    auto endpoint = wire::endpointOfRank(config.endpoint, firstRank);
    if (!endpoint) {
        std::fprintf(stderr, "shardscope-train: --listen %s\n", endpoint.error().c_str());
        return 2;
    }
    options.endpoint = *endpoint;
    options.token = config.token;
    options.historyEvents = config.historyEvents;
    options.snapshotOut = wire::outputOfRank(config.snapshotOut, firstRank, engine.worldSize());
    options.telemetry = config.telemetry;
    std::unique_ptr<server::Inspector> inspector;
    try {
        inspector = std::make_unique<server::Inspector>(
            std::make_unique<core::EngineStateProvider>(engine), options);
    } catch (const server::InspectorError &e) {
        std::fprintf(stderr, "shardscope-train: %s\n", e.what());
        return 2;
    }
    // SIGTERM and SIGINT end the run as a finish would, then the process dies of the signal.
    const server::FinishOnSignal finishOnSignal(*inspector, "shardscope-train", {SIGTERM, SIGINT});
    if (const std::string at = inspector->endpoint(); !at.empty()) {
        if (engine.localRanks().size() == 1 && engine.worldSize() > 1)
            std::printf("inspector (rank %d): listening on %s\n", firstRank, at.c_str());
        else
            std::printf("inspector: listening on %s\n", at.c_str());
    }
    std::fflush(stdout);

    if (config.waitForClient) {
        char limit[64] = "";
        if (config.waitForClientSeconds > 0.0)
            std::snprintf(limit, sizeof limit, ", at most %g s", config.waitForClientSeconds);
        std::printf("waiting for an inspector to attach (shardscope --attach %s%s)\n",
                    inspector->endpoint().c_str(), limit);
        std::fflush(stdout);
        const bool attached = waitForInspector(*inspector, config.waitForClientSeconds);
        std::printf(attached ? "inspector attached; training\n"
                             : "no inspector attached in time; training anyway\n");
        std::fflush(stdout);
    }
    if (reporter && config.vocab <= nn::MarkovStream::kMaxLossFloorVocab)
        std::printf("data: the loss cannot fall below %.4f nats without seeing its targets\n",
                    nn::MarkovStream(config.seed, config.vocab).lossFloor(config.seq));

    ViolationPrinter violations(engine);
    nn::buildModel(engine, config);
    if (reporter) violations.printNew();
    nn::TrainResult result;
    try {
        result = train(engine, config, [&violations, reporter](const nn::StepReport &r) {
            if (!reporter) return; // a process per rank (gloo, NCCL): rank 0 speaks for all
            printStep(r);
            violations.printNew();
        });
    } catch (const std::exception &e) {
        // Clients hear why the run ends (a job's inspector shows it for this rank).
        if (inspector) inspector->finish(std::string("training failed: ") + e.what());
        throw;
    }
    if (config.lingerSeconds > 0.0 && inspector->liveClients() == 0) {
        std::printf("lingering up to %.1f s for an inspector to attach\n", config.lingerSeconds);
        std::fflush(stdout);
        waitForInspector(*inspector, config.lingerSeconds);
    }
    inspector->finish();
    if (!options.snapshotOut.empty()) std::printf("snapshot: %s\n", options.snapshotOut.c_str());
    printFinal(result, config.steps);
    return 0;
}

int runCpu(const nn::TrainConfig &config)
{
    if (!config.diverge.empty() && config.diverge != "slow") {
        // The threads' collectives have no timeout: a rank on another path would hang forever.
        std::fprintf(stderr,
                     "shardscope-train: --diverge %s hangs the ranks until a collective "
                     "times out, which needs a process per rank: start it with "
                     "scripts/launch -n N shardscope-train --backend gloo ...\n",
                     config.diverge.c_str());
        return 2;
    }
    std::unique_ptr<core::Engine> engine = nn::makeCpuEngine(config);
    return trainWithInspector(*engine, config, nn::trainModel);
}

int runNccl(const nn::TrainConfig &config)
{
    if (!config.diverge.empty()) {
        std::fprintf(stderr, "shardscope-train: --diverge runs on the cpu and gloo backends; "
                             "add --backend gloo (or cpu)\n");
        return 2;
    }
    std::unique_ptr<core::Engine> engine = cuda::makeNcclEngine(config);
    nn::TrainConfig sized = config;
    sized.worldSize = engine->worldSize(); // torchrun's WORLD_SIZE
    return trainWithInspector(*engine, sized, cuda::trainOnGpu);
}

// One process of a gloo world: WORLD_SIZE ranks, this process holding RANK.
int runGloo(const nn::TrainConfig &config)
{
    if (!comm::launchedPerRank()) {
        std::fprintf(stderr,
                     "shardscope-train: --backend gloo runs one process per rank, but RANK and "
                     "WORLD_SIZE are not set; start the ranks with scripts/launch -n N "
                     "shardscope-train --backend gloo ..., or with torchrun\n");
        return 2;
    }
    comm::GlooOptions options;
    options.rendezvous = comm::rendezvousFromEnv();
    options.timeout = std::chrono::seconds(config.commTimeoutSeconds);
    nn::TrainConfig sized = config;
    sized.worldSize = options.rendezvous.worldSize; // torchrun's WORLD_SIZE
    if (const std::string problem = nn::validate(sized); !problem.empty()) {
        std::fprintf(stderr, "shardscope-train: %s\n", problem.c_str());
        return 2;
    }
    std::vector<std::unique_ptr<comm::Communicator>> comms;
    comms.push_back(comm::makeGlooCommunicator(options));
    if (config.overlapComm) comms = comm::makeAsyncCommunicators(std::move(comms));
    core::Engine engine(nn::makeEngineConfig(sized), std::move(comms));
    return trainWithInspector(engine, sized, nn::trainModel);
}

} // namespace

int main(int argc, char **argv)
{
    if (argc == 2 && std::string_view(argv[1]) == "--version") {
        std::printf("%s %s\n", "shardscope-train", shardscope::kVersion);
        return 0;
    }
    std::optional<nn::TrainConfig> config;
    try {
        config = parseArgs(std::vector<std::string>(argv + 1, argv + argc));
    } catch (const UsageError &e) {
        std::fprintf(stderr,
                     "shardscope-train: %s\nRun 'shardscope-train --help' for the options.\n",
                     e.message.c_str());
        return 2;
    }
    if (!config) {
        std::fputs(kUsage, stdout);
        printLossFloor();
        return 0;
    }
    if (auto token = wire::resolveToken(config->token, config->tokenFile); !token) {
        std::fprintf(stderr, "shardscope-train: %s\n", token.error().c_str());
        return 2;
    } else {
        config->token = *token;
    }

    try {
        cuda::BackendChoice choice;
        try {
            choice = cuda::chooseBackend(config->backend);
        } catch (const std::invalid_argument &e) {
            std::fprintf(stderr, "shardscope-train: %s\n", e.what());
            return 2;
        }
        if (config->backend == "auto" && choice.backend == comm::Backend::Nccl &&
            choice.deviceCount < config->worldSize) {
            choice.reason = "CPU backend: " + std::to_string(config->worldSize) + " ranks need " +
                            std::to_string(config->worldSize) + " GPUs but " +
                            std::to_string(choice.deviceCount) +
                            " are usable; running the ranks as CPU threads (pass --world-size " +
                            std::to_string(choice.deviceCount) + " --backend nccl for the GPUs)";
            choice.backend = comm::Backend::Cpu;
        }
        std::printf("backend: %s (%s)\n", std::string(comm::backendName(choice.backend)).c_str(),
                    choice.reason.c_str());
        std::fflush(stdout);
        switch (choice.backend) {
        case comm::Backend::Nccl:
            return runNccl(*config);
        case comm::Backend::Gloo:
            return runGloo(*config);
        case comm::Backend::Cpu:
            break;
        }
        return runCpu(*config);
    } catch (const core::UnregisteredAccessError &e) {
        std::fflush(stdout);
        std::fprintf(stderr, "shardscope-train: stopped by --guard error: %s\n    fix: %s\n",
                     e.what(), e.fix().c_str());
        return 1;
    } catch (const std::exception &e) {
        std::fflush(stdout);
        std::fprintf(stderr, "shardscope-train: %s\n", e.what());
        return 1;
    }
}

#pragma once
// Every setting of a training run (the command line of shardscope-train), shared by
// the CPU trainer and the GPU training path so both read the same flags the same way.

#include <cstddef>
#include <cstdint>
#include <string>

#include "state/shape.h"

namespace shardscope::nn {

// How the model code treats parameters used outside their owning module.
enum class Externals : std::uint8_t
{
    None = 0,   // what the users in the stories did first: unregistered reads, late parameters
    Manual = 1, // the stories' fixes: register_external_parameter, GatheredParameters + adopt
};
std::string_view externalsName(Externals e); // "none", "manual"
bool parseExternals(std::string_view s, Externals &out);

struct TrainConfig
{
    // ---- the run
    int worldSize = 4;
    int steps = 800;
    std::uint64_t seed = 1;
    std::string backend = "auto"; // "cpu", "nccl", "gloo" or "auto"

    // ---- the model
    int layers = 2;
    int hidden = 64; // H
    int vocab = 97;  // V (prime: no world size divides the embedding)
    int seq = 32;    // T: tokens per sequence
    int kernel = 8;  // K of pos_conv (wav2vec2: num_conv_pos_embeddings)
    int groups = 4;  // G of pos_conv (wav2vec2: num_conv_pos_embedding_groups); divides hidden
    // pos_conv's padding. true (default): causal (t sees t-K+1 .. t), a proper next-token
    // model whose loss stays above the data's floor (MarkovStream::lossFloor), CPU and GPU.
    // false: wav2vec2's symmetric "same" padding, so position t also sees tokens
    // t+1 .. t+K/2-1, its own target among them, and the loss falls below that floor.
    bool causalConv = true;

    // ---- the optimisation
    int batch = 30;           // global batch: sequences per step, split across ranks
    float lr = 3e-3f;         // Adam learning rate
    float weightDecay = 0.0f; // decoupled (AdamW) weight decay
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;

    // ---- the engine
    Externals externals = Externals::None;
    GuardPolicy guard = GuardPolicy::Warn;
    // Parameters with fewer elements are never partitioned. DeepSpeed's default (1e5) would
    // keep the whole demo model persistent; this keeps biases and norms persistent and
    // partitions the matrices.
    std::int64_t persistenceThreshold = 1000;
    // CPU backend: each rank's collectives run on a progress thread (makeAsyncCommunicators),
    // so prefetches overlap compute as NCCL's do (DeepSpeed's overlap_comm). Same results.
    bool overlapComm = false;
    // gloo backend: the longest a collective waits for its peers before the run fails,
    // naming the rank that died or stopped answering.
    int commTimeoutSeconds = 60;

    // ---- a rank that takes another path (issue 51: the hang of a sharded job, on purpose)
    // "" none; extra-forward: rank divergeRank evaluates one more batch after step divergeStep;
    // extra-batch: it trains one more micro-batch after the last step; gathered: it opens a
    // GatheredParameters over embed.weight after step divergeStep; raise: it throws at step
    // divergeStep; slow: it sleeps divergeSeconds before step divergeStep (a straggler). With
    // any of them every rank meets in a barrier after the last step, as scripts do before they
    // save, so the others wait there for the rank that took another path.
    std::string diverge;
    int divergeRank = 0;
    int divergeStep = 0; // 0: the last step
    double divergeSeconds = 1.0;

    // ---- the inspector endpoint (see server/inspector.h)
    bool listen = true;
    std::string endpoint; // "unix:PATH" | "tcp:HOST:PORT"; empty = default
    std::string token;
    std::string tokenFile;   // --token-file: resolved into token by wire::resolveToken
    std::string snapshotOut; // snapshot file written at the end, if not empty
    std::size_t historyEvents = 65536;
    bool telemetry = true;
    // Runs too short to attach to, as profilers offer: wait for a client before the model is
    // built (waitForClientSeconds 0 = no limit), and after the last step wait up to
    // lingerSeconds for one, so someone attached receives the end. Both off by default.
    bool waitForClient = false;
    double waitForClientSeconds = 0.0;
    double lingerSeconds = 0.0;
};

// Checks ranges and consistency (e.g. groups divides hidden). Returns an empty string
// when valid, otherwise a message in the flags' terms ("--groups 3 does not divide --hidden 64").
std::string validate(const TrainConfig &config);

} // namespace shardscope::nn

#pragma once
// What a training process calls to be inspectable: connects the engine's telemetry,
// serves the live endpoint (unless disabled) and writes the snapshot file at finish().

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace shardscope::state {
class StateProvider;
}

namespace shardscope::server {

// The most recent events an inspector keeps for late clients (InspectorOptions::historyEvents);
// a larger history is refused. shardscope._native exports it as MAX_HISTORY.
inline constexpr std::size_t kMaxHistoryEvents = std::size_t(1) << 24;

struct InspectorOptions
{
    bool listen = true;                // --no-listen sets false
    std::string endpoint;              // "unix:PATH" | "tcp:HOST:PORT"; empty = default Unix socket
    std::string token;                 // required for a non-loopback TCP host
    std::size_t historyEvents = 65536; // recent events a late client receives (kMaxHistoryEvents)
    std::string snapshotOut;           // written atomically by finish() when not empty
    bool telemetry = true;             // false: the engine emits nothing
    std::string job; // the job's name (the agent's job=); empty: from the environment (wire/job.h)
    // Tests only: pretend this process's clock runs this far ahead, as another host's would:
    // added to every timestamp sent (events, state, clock probes). 0: the environment
    // variable SHARDSCOPE_TEST_CLOCK_OFFSET_NS, if set, gives it.
    std::int64_t testClockOffsetNs = 0;
};

// A bad endpoint, a refused bind, a non-loopback host without a token... what() says
// what to do. The trainer reports it and exits with code 2.
class InspectorError : public std::runtime_error
{
  public:
    using std::runtime_error::runtime_error;
};

class Inspector
{
  public:
    // Serves any state provider: our Engine's (core::EngineStateProvider), the DeepSpeed
    // agent's; provider outlives the Inspector. Throws InspectorError.
    Inspector(state::StateProvider &provider, InspectorOptions options);
    // The same, owning the provider:
    //   Inspector(std::make_unique<core::EngineStateProvider>(engine), options)
    Inspector(std::unique_ptr<state::StateProvider> own, InspectorOptions options);
    ~Inspector(); // finish() if not yet done
    Inspector(const Inspector &) = delete;
    Inspector &operator=(const Inspector &) = delete;

    std::string
    endpoint() const; // the bound endpoint, e.g. "tcp:127.0.0.1:40123"; empty if not listening
    std::uint64_t droppedEvents() const;
    // Events the server handed to its clients' live streams, and those it dropped for
    // clients that did not read fast enough (summed over clients).
    std::uint64_t publishedEvents() const;
    std::uint64_t clientDroppedEvents() const;
    // Clients past the handshake (they hold the state and receive events), as the server
    // thread last counted them.
    std::size_t liveClients() const;
    // Blocks until at least one client is live, at most `timeout` (milliseconds::max():
    // no limit). False when the time ran out, nothing listens, or finish() was called.
    // For runs too short to attach to (shardscope-train --wait-for-client, --linger).
    bool waitForClient(std::chrono::milliseconds timeout);
    // Rewrites the discovery file with the provider's modelName() as it is now, e.g. once
    // the DeepSpeed agent has seen the model built (a listing of the job then names it).
    void refreshDiscovery();
    // What serving costs the training process: the server thread (it drains the rings,
    // encodes and sends; no other thread of the inspector runs), for benchmarks and logs.
    struct Cost
    {
        double serverCpuSeconds =
            0.0; // the server thread's CPU time so far (all of it, once finished)
        double stateCpuSeconds = 0.0; // of which building and encoding States
        std::uint64_t wakeups = 0;    // rounds of its loop
        std::uint64_t states = 0;     // States built
    };
    Cost cost() const;
    // Flushes telemetry, writes the snapshot (if asked), stops serving. Idempotent.
    void finish();
    // The same, telling clients why in the Goodbye's reason ("training failed: rank 2 is gone").
    void finish(const std::string &reason);
    // Now, while serving: hands every event recorded so far and the current state to the
    // clients and writes the snapshot file (if asked), so that a run about to die of an
    // exception leaves its diagnosis. Blocks until the server thread did it (at most a few
    // seconds); returns an error message, or "" when done.
    std::string flushNow();

    struct Impl;

  private:
    std::unique_ptr<Impl> d;
};

} // namespace shardscope::server

#pragma once
// The one signal path of a process that serves an Inspector (shardscope-train, the
// DeepSpeed agent's rank processes): a termination signal ends the run as a finish would
// (goodbye to clients, discovery file and socket removed, the snapshot written), then the
// process gets the signal as it would have without ShardScope (dies of it: exit 143 for
// SIGTERM, or the disposition found at install runs).
//
// The handler is native and async-signal-safe: it only writes the signal's number to a
// pipe, and a thread of ours does the work. So it works while every other thread is blocked
// in native code (a rendezvous whose peer never comes, a collective), where a Python-level
// handler never runs.

#include <string>
#include <vector>

namespace shardscope::server {

class Inspector;

class FinishOnSignal
{
  public:
    // who prefixes the one line said on stderr ("shardscope-train: terminated; ...").
    FinishOnSignal(Inspector &inspector, std::string who, std::vector<int> signals);
    // Restores the dispositions found, where ours is still the one installed.
    ~FinishOnSignal();
    FinishOnSignal(const FinishOnSignal &) = delete;
    FinishOnSignal &operator=(const FinishOnSignal &) = delete;

  private:
    std::vector<int> m_signals;
};

} // namespace shardscope::server

#pragma once
// One snapshot of a whole job from the snapshots of its rank processes (each a process of
// the same training job, observing its own ranks): shardscope-capture --attach job:NAME
// writes this, and a client showing a job reads the same merge.

#include <span>
#include <string>
#include <vector>

#include "wire/result.h"
#include "wire/snapshot.h"

namespace shardscope::wire {

// The structure (modules, parameters, configuration) is the first part's, plus the parameters
// only later parts list (a process that observes part of the model); each parameter's
// status on rank r comes from the part whose local_ranks hold r; gather counts, bytes and
// times are summed, registrations and active modules united; violations of all parts go
// through the one ledger (state/violationledger.h: a record is its process's total for its
// rank; of two parts listing one rank, the larger total stands) and events of all parts are
// kept (they name their rank), ordered by time. Parts must agree on the world size and
// model; a part that disagrees is an error naming it. Ranks no part observed keep the first
// part's view of them (the shard alone) and are absent from local_ranks.
Result<Snapshot> mergeJobSnapshots(const std::vector<Snapshot> &parts, const std::string &job);

// The same merge of the states alone (the inspector keeps the latest state of each process
// of a job and shows their merge); names[k] names part k in errors ("the process 123
// (tcp:...)"). Events and dropped counts are the caller's.
Result<state::EngineState> mergeJobStates(std::span<const state::EngineState *const> parts,
                                          std::span<const std::string> names);

} // namespace shardscope::wire

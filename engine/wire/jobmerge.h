#pragma once
// One snapshot of a whole job from the snapshots of its rank processes (each a process of
// the same training job, observing its own ranks): shardscope-capture --attach job:NAME
// writes this, and a client showing a job reads the same merge.

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "wire/result.h"
#include "wire/snapshot.h"

namespace shardscope::wire {

// The structure (modules, parameters, configuration) is the first built part's (one that
// lists parameters), plus the parameters only later parts list (a process that observes part
// of the model); each parameter's status on rank r comes from the part whose local_ranks hold
// r; gather counts, bytes and times are summed, registrations and active modules united;
// violations of all parts go through the one ledger (state/violationledger.h: a record is its
// process's total for its rank; of two parts listing one rank, the larger total stands) and
// events of all parts are kept (they name their rank), ordered by time. Parts must be of one
// job (checkOneJob); a part that is not is an error naming it. The model's name is the first
// final one (provisionalModelName) of the parts, else the structure's. Ranks no part observed
// keep the structure's view of them (the shard alone) and are absent from local_ranks.
// partNames: how an error names each part (default: "the process PID (ENDPOINT)").
Result<Snapshot> mergeJobSnapshots(const std::vector<Snapshot> &parts, const std::string &job,
                                   const std::vector<std::string> &partNames = {});

// A job from the snapshot files its rank processes wrote (`run.rank{rank}.json` on a shared
// file system: what is left of a multi-node job that died), as one job, with the same merge
// as a live job's (mergeJobSnapshots). Each file is read (readSnapshotFile, plain or gzip'd);
// two files holding one rank are refused, naming both (two runs' files mixed up); an error
// names the file. The job is named after the first file, without its rank and extension
// ("run" for run.rank0.json). Each file's events keep their own process's clock: files of one
// host line up, files of several hosts are as far apart as those hosts' clocks.
// partsOut: when given, the files' snapshots as read (each process's own structure).
Result<Snapshot> mergeSnapshotFiles(const std::vector<std::string> &paths,
                                    std::vector<Snapshot> *partsOut = nullptr);

// The one rule of what makes the states of processes one job's (issue #49, defect 8): the
// same world size. Which run a process belongs to is its announced job (wire::sameRun on
// the discovery file and Welcome); its state adds only the world size it runs. The model's
// name is never compared: it changes while the ranks build the model (each agent announces
// a provisional name until then), so ranks attached during the build would be refused.
// "" when `part` can join a job whose other parts run `others`, else why not, naming
// `partName`.
std::string checkOneJob(const state::EngineState &part, const std::string &partName,
                        const state::EngineState &others);

// Whether a model name is an agent's provisional one, announced before the model is built
// ("TinyLM (model not built yet: ...)", "(model not sharded yet: ...)": docs/protocol.md).
bool provisionalModelName(std::string_view name);

// The same merge of the states alone (the inspector keeps the latest state of each process
// of a job and shows their merge); names[k] names part k in errors ("the process 123
// (tcp:...)"). Events and dropped counts are the caller's.
Result<state::EngineState> mergeJobStates(std::span<const state::EngineState *const> parts,
                                          std::span<const std::string> names);

} // namespace shardscope::wire

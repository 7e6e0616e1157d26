#pragma once
// The one rule of how bad a violation is (docs/snapshot.md, a violation's `severity`): the
// engine's ledger, the agents' state, the inspector's store and the snapshot readers (for a
// file written before severities) all ask here, and the Python side through the native
// module (shardscope._native.severity_of), so the table, the snapshot, shardscope-check's
// report and its SARIF levels never disagree.

#include "base/types.h"

namespace shardscope::state {

// kind and action as recorded; read: what an unregistered access touched (Values for every
// other kind).
//   error: an unregistered read of the values that raised or was only recorded (DeepSpeed
//          crashes on the empty placeholder or computes on it; FSDP2 computes on the shard),
//          late_parameter (each rank trains its own copy), gathered_write_without_modifier
//          (the edit is lost), tied_across_groups, backward_unfinished;
//   cost:  an unregistered read of the values that was gathered for it (the guard's warn,
//          DeepSpeed's or the guard's automatic registration: right, but a gather nothing
//          prefetched and memory held longer), trace_invalidated (prefetches wasted);
//   info:  an unregistered access that read attributes only (.dtype, .shape): no values.
Severity severityOf(ViolationKind kind, GuardAction action,
                    ViolationRead read = ViolationRead::Values);

} // namespace shardscope::state

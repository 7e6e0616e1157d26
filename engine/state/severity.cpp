#include "state/severity.h"

namespace shardscope::state {

Severity severityOf(ViolationKind kind, GuardAction action, ViolationRead read)
{
    switch (kind) {
    case ViolationKind::UnregisteredAccess:
        if (read == ViolationRead::Attribute) return Severity::Info;
        return action == GuardAction::Gathered || action == GuardAction::AutoRegistered
                   ? Severity::Cost
                   : Severity::Error;
    case ViolationKind::TraceInvalidated:
        return Severity::Cost;
    case ViolationKind::LateParameter:
    case ViolationKind::GatheredWriteWithoutModifier:
    case ViolationKind::TiedAcrossGroups:
    case ViolationKind::BackwardUnfinished:
    case ViolationKind::ShardOrder:         // torch raises at the next fully_shard
    case ViolationKind::PartitionedSave:    // the checkpoint holds no weights, or one rank's shard
    case ViolationKind::PartitionedLoad:    // nothing loaded, or a raise that names no cause
    case ViolationKind::ResumeWorldSize:    // DeepSpeed raises
    case ViolationKind::CollectiveMismatch: // the job hangs until the collectives' timeout
    case ViolationKind::RankStalled:
        return Severity::Error;
    }
    return Severity::Error; // a kind this build does not know: shown as the worst
}

} // namespace shardscope::state

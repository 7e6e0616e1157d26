#pragma once
// The one author of what a user reads about a violation: the sentence and the line that
// fixes it. The engine, the DeepSpeed agent, the inspector's store and the exports all
// call describeViolation, so a row never changes its words on the way from the producer
// to the screen. Text names modules and parameters by the names the caller passes in.

#include <string>
#include <string_view>
#include <vector>

#include "state/shape.h"
#include "state/state.h"

namespace shardscope::state {

// How fix lines are written: for ShardScope's C++ engine (its API names), or as Python a
// DeepSpeed user pastes (`deepspeed.zero.register_external_parameter(model.lm_head,
// model.embed.weight)`).
enum class FixDialect : std::uint8_t
{
    ShardScope = 0,
    DeepSpeed = 1,
    Fsdp = 2 // PyTorch FSDP2 (fully_shard): `fully_shard([model.embed, model.lm_head])`
};
std::string_view fixDialectName(FixDialect d); // "shardscope", "deepspeed", "fsdp"
bool parseFixDialect(std::string_view s, FixDialect &out);

// What a read outside any module's forward/backward does with the parameter: it decides
// the fix. GatheredParameters is right for a plain read, and (with modifier_rank) for a
// change; a read that needs the parameter's gradient must move into a forward DeepSpeed
// runs, registered there: GatheredParameters hands back no gradient to the partition.
enum class AccessUse : std::uint8_t
{
    Read = 0,
    Write = 1,     // it changes the values (model-building code)
    NeedsGrad = 2, // autograd records it (the parameter requires grad, grad mode is on)
    // It read attributes only (.dtype, .shape, .device, .requires_grad), no values: the
    // record's read is ViolationRead::Attribute, its severity info, and there is nothing to fix.
    Attribute = 3
};

// What is known of one violation, by name. An empty optional name is written as unknown.
struct ViolationSubject
{
    ViolationKind kind = ViolationKind::UnregisteredAccess;
    bool hasAccessor = false; // false: read outside any module's forward/backward
    std::string accessor;     // module path ("" is the root module)
    std::string param;        // parameter name ("embed.weight"); for trace_invalidated: empty
    std::string owner;        // owner's path; for trace_invalidated: the module expected;
                              // in the FSDP dialect: the FSDP unit (fully_shard module) holding it
    bool hasOwner = true;     // for trace_invalidated: false when the end of the step was expected
    ParamStatus status = ParamStatus::NotAvailable;
    std::string replaces; // late_parameter: the parameter it replaced ("pos_conv.weight"), if known
    int modifierRank = 0; // gathered_write_without_modifier: the rank to keep, as a suggestion
    AccessUse use = AccessUse::Read; // unregistered_access outside modules
    // The parameter as the fix line writes it, when its dotted name is not yet final (read
    // while the model is being built: "self.conv.weight", relative to the constructor
    // running); empty: codeName(param).
    std::string paramCode;
    // tied_across_groups: the units beyond owner and accessor the same parameter is tied into
    // (T5's shared embedding: the root, encoder and decoder), so that one fix names them all.
    std::vector<std::string> alsoTiedInto;
    // tied_across_groups: whether this torch refuses the tie at the first forward (>= 2.13);
    // before, each group shards and trains its own copy and nothing fails.
    bool refusedByTorch = true;
    // backward_unfinished: what the backward raised ("ValueError: ..."; empty: it did not
    // raise), and whether it began under compiled autograd. collective_mismatch and the job's
    // rank_stalled: a rank that ended by an exception and what it raised ("rank 1 raised
    // ValueError: ..."), the cause the fix then names.
    std::string raised;
    bool compiledAutograd = false;
    // backward_unfinished in the DeepSpeed dialect: how many parameters' gradients the failed
    // pass left in ZeRO-3's reduce bucket.
    std::size_t bucketed = 0;
    // shard_order: the user's lines of the two fully_shard calls, the one on owner (the
    // parent, sharded first) and the one on accessor (the module inside it, sharded after).
    SourceLocation parentCall;
    SourceLocation childCall;
    // partitioned_save, partitioned_load, resume_world_size: the checkpoint call as the user
    // wrote it ("model.state_dict()", "torch.save", "model.load_state_dict",
    // "engine.load_checkpoint"), how many parameters it would lose or leave unchanged and
    // their bytes (owner: the model; param: the first of them); for resume_world_size the
    // checkpoint's directory and tag and the two data-parallel world sizes.
    std::string call;
    std::size_t params = 0;
    std::uint64_t bytes = 0;
    std::string checkpoint;
    int savedWorld = 0;
    int world = 0;
    // partitioned_load in DeepSpeed's words: the parameters were gathered for the load, but by
    // GatheredParameters without modifier_rank, so ZeRO-3 discards it at the scope's exit.
    bool withoutModifier = false;
    // collective_mismatch, rank_stalled: the collective (group, seq), its sides (what each set
    // of ranks issued, or where it stands) and where each rank is. A rank's own rank_stalled
    // (its watchdog's) has one Waiting side of its rank and its site; the job's names them all.
    // Unlike every other kind's, these messages name ranks: which ranks diverged is the finding.
    CollectiveDetail collective;
    // rank_stalled of one rank (its watchdog's): true; the job's aligner: false.
    bool ownRank = false;
};

struct ViolationText
{
    std::string message; // a sentence in the user's terms; names neither rank nor step
    std::string fix;     // the line that fixes it; empty where none exists (trace_invalidated)
};

ViolationText describeViolation(const ViolationSubject &s, FixDialect dialect);

// What a severity means for the run, in a user's words (the inspector's tooltip and legend).
std::string_view severityMeaning(Severity s);

// A module path or parameter name as the dialect writes it in code: "lm_head" (ShardScope),
// "model.lm_head" / "model.blocks[0].fc1" (DeepSpeed, relative to the model object).
std::string codeName(std::string_view dottedName, FixDialect dialect);
// A byte count as a message shows it: "512 B", "3.2 KiB", "1.5 GiB".
std::string bytesText(std::uint64_t bytes);
// A module path as a message shows it: "<root>" for the root.
std::string displayPath(std::string_view path);

} // namespace shardscope::state

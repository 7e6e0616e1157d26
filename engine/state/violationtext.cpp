#include "state/violationtext.h"

#include <cctype>
#include <cstdio>
#include <iterator>

namespace shardscope::state {

std::string_view fixDialectName(FixDialect d)
{
    switch (d) {
    case FixDialect::DeepSpeed:
        return "deepspeed";
    case FixDialect::Fsdp:
        return "fsdp";
    case FixDialect::ShardScope:
        break;
    }
    return "shardscope";
}

bool parseFixDialect(std::string_view s, FixDialect &out)
{
    if (s == "shardscope")
        out = FixDialect::ShardScope;
    else if (s == "deepspeed")
        out = FixDialect::DeepSpeed;
    else if (s == "fsdp")
        out = FixDialect::Fsdp;
    else
        return false;
    return true;
}

std::string displayPath(std::string_view path)
{
    return path.empty() ? std::string("<root>") : std::string(path);
}

std::string bytesText(std::uint64_t bytes)
{
    static constexpr const char *kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = double(bytes);
    std::size_t u = 0;
    while (v >= 1024.0 && u + 1 < std::size(kUnits)) {
        v /= 1024.0;
        ++u;
    }
    if (u == 0) return std::to_string(bytes) + " B";
    char text[32];
    std::snprintf(text, sizeof text, "%.1f %s", v, kUnits[u]);
    return text;
}

namespace {

bool allDigits(std::string_view s)
{
    if (s.empty()) return false;
    for (char c : s)
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    return true;
}

// A parameter's status in FSDP2's words: its DTensor shard, the all-gather, the full tensor.
std::string fsdpStatus(ParamStatus s)
{
    switch (s) {
    case ParamStatus::NotAvailable:
        return "sharded";
    case ParamStatus::Inflight:
        return "being all-gathered";
    case ParamStatus::Available:
        return "unsharded";
    }
    return std::string(statusName(s));
}

// The FSDP2 dialect: what a `fully_shard` user reads and pastes (docs/fsdp.md). owner is the
// FSDP unit (the module fully_shard was called on) whose group holds the parameter.
ViolationText describeFsdp(const ViolationSubject &s)
{
    const FixDialect d = FixDialect::Fsdp;
    const std::string param = s.param.empty() ? std::string("<unknown parameter>") : s.param;
    const std::string paramCode = s.param.empty() ? param : codeName(s.param, d);
    const std::string unit = displayPath(s.owner);
    ViolationText t;
    switch (s.kind) {
    case ViolationKind::UnregisteredAccess:
        if (s.hasAccessor) {
            // The unit's forward ran without its pre-forward hook: called as .forward() or
            // another method FSDP does not know.
            const std::string m = codeName(s.accessor, d);
            t.fix = m + "(...)  # call the module, not " + m +
                    ".forward(...); for another method: "
                    "torch.distributed.fsdp.register_fsdp_forward_method(" +
                    m + ", \"<method>\")";
            t.message = "FSDP unit `" + displayPath(s.accessor) +
                        "` ran without its pre-forward all-gather (its forward, or another "
                        "method, was called directly) and read `" +
                        param + "` while it was " + fsdpStatus(s.status) +
                        " (a DTensor holding this rank's shard)";
        } else if (s.use == AccessUse::NeedsGrad) {
            const std::string fwd =
                s.owner.empty() ? std::string("model.forward") : codeName(s.owner, d) + ".forward";
            t.fix = "# move the read of " + paramCode + " into " + fwd +
                    " (FSDP unshards it there and reduce-scatters its gradient)";
            t.message = "`" + param + "` (FSDP unit `" + unit +
                        "`) was read outside any FSDP unit's forward/backward while it was " +
                        fsdpStatus(s.status) +
                        " (a DTensor holding this rank's shard), and the read needs its "
                        "gradient: do it inside the unit's forward, where FSDP unshards it";
        } else {
            t.fix = paramCode + ".full_tensor()  # all-gathers it: every rank must run this line";
            t.message = "`" + param + "` (FSDP unit `" + unit +
                        "`) was read outside any FSDP unit's forward/backward while it was " +
                        fsdpStatus(s.status) +
                        " (a DTensor holding this rank's shard); gather the full tensor for "
                        "the read";
        }
        break;
    case ViolationKind::LateParameter:
        t.fix = "<create " + paramCode + "> before fully_shard(" + codeName(s.owner, d) +
                ")  # or the fully_shard call above it";
        t.message = "`" + param + "` was created in `" + unit + "` after fully_shard" +
                    (s.replaces.empty() ? std::string() : " (it replaces `" + s.replaces + "`)") +
                    ", so FSDP does not shard it: every rank keeps the whole tensor and its "
                    "gradient is not reduced across ranks";
        break;
    case ViolationKind::TiedAcrossGroups: {
        // the units beside the owner's: "FSDP unit `a`", "FSDP units `a` and `b`", "`a`, `b` and
        // `c`"
        std::vector<std::string> tied{s.accessor};
        tied.insert(tied.end(), s.alsoTiedInto.begin(), s.alsoTiedInto.end());
        std::string units = codeName(s.owner, d);
        std::string others = tied.size() == 1 ? "FSDP unit " : "FSDP units ";
        for (std::size_t i = 0; i < tied.size(); ++i) {
            units += ", " + codeName(tied[i], d);
            others += std::string(i == 0                 ? ""
                                  : i + 1 == tied.size() ? " and "
                                                         : ", ") +
                      "`" + displayPath(tied[i]) + "`";
        }
        const std::size_t n = 1 + tied.size();
        const std::string groups = n == 2 ? "two" : n == 3 ? "three" : std::to_string(n);
        t.fix = "fully_shard([" + units + "])  # one FSDP unit for " +
                (s.alsoTiedInto.empty() ? "both" : "all of them") +
                ", instead of a fully_shard call for each";
        t.message = "`" + param + "` is tied into " + others + " as well as `" + unit +
                    (s.refusedByTorch
                         ? "`: " + groups +
                               " groups would shard and gather the one tensor (torch "
                               "refuses it at the first forward)"
                         : "`: each group shards and trains its own copy, so the weights are no "
                           "longer tied (this torch does not refuse it)");
        break;
    }
    case ViolationKind::BackwardUnfinished:
        t.message = "FSDP2's backward did not finish: its final callback "
                    "(FSDPState._root_post_backward_final_callback) never ran, so the root "
                    "unit's gradients were not reduce-scattered and its parameters stay "
                    "unsharded. From then on FSDP2 unshards every group at its forward and never "
                    "reshards or reduce-scatters again: each rank trains its own full copy of "
                    "the model, with no error. ";
        if (!s.raised.empty()) {
            t.message += "The backward raised " + s.raised +
                         ", and FSDP2 does not recover from an exception inside backward: going "
                         "on after it (skipping the batch) trains on like this";
            t.fix = "raise  # in the except around loss.backward(): stop the run there and "
                    "resume from the last checkpoint";
        } else if (s.compiledAutograd) {
            t.message += "The backward ran under compiled autograd, which drops that callback "
                         "without an error";
            t.fix = "torch._dynamo.config.compiled_autograd = False  # and loss.backward() "
                    "outside torch._dynamo.compiled_autograd._enable(...)";
        } else {
            t.message += "An exception inside backward that the script caught and went on "
                         "from, or compiled autograd, leaves FSDP2 so";
            t.fix = "# let loss.backward() run to its end: no exception caught inside it, no "
                    "compiled autograd";
        }
        break;
    case ViolationKind::ShardOrder: {
        // accessor: the module fully_shard was called on second, inside owner, called first
        const std::string child = codeName(s.accessor, d), parent = codeName(s.owner, d);
        const auto at = [](const SourceLocation &w) {
            return w.known() ? " (" + w.fileLine() + ")" : std::string();
        };
        t.fix = "fully_shard(" + child + ")  # before fully_shard(" + parent +
                "): children first; a loop over model.modules() goes over "
                "reversed(list(model.modules()))";
        t.message = "fully_shard(" + child + ")" + at(s.childCall) + " came after fully_shard(" +
                    parent + ")" + at(s.parentCall) +
                    ", which contains it: FSDP2 shards a module's whole subtree, so `" + param +
                    "` and the other parameters of `" + displayPath(s.accessor) +
                    "` are already sharded by `" + unit +
                    "`'s group, and fully_shard cannot shard them again. torch fails in this "
                    "fully_shard call or at the first forward, with an error that names neither "
                    "module";
        break;
    }
    case ViolationKind::TraceInvalidated:
    case ViolationKind::GatheredWriteWithoutModifier:
    case ViolationKind::PartitionedSave: // describeCheckpoint's
    case ViolationKind::PartitionedLoad:
    case ViolationKind::ResumeWorldSize:
    case ViolationKind::CollectiveMismatch: // describeCollective's
    case ViolationKind::RankStalled:
        return {};
    }
    return t;
}

// partitioned_save, partitioned_load, resume_world_size: in DeepSpeed's words (ZeRO-3's
// placeholders and partitioned checkpoints) or FSDP2's (DTensor shards, DCP); owner is the
// model the call was made on.
ViolationText describeCheckpoint(const ViolationSubject &s, FixDialect dialect)
{
    const bool fsdp = dialect == FixDialect::Fsdp;
    const std::string model = codeName(s.owner, dialect);
    const std::string n =
        s.params == 1 ? std::string("one parameter") : std::to_string(s.params) + " parameters";
    const std::string first = s.param.empty() ? std::string() : " (`" + s.param + "` first)";
    const std::string call = s.call.empty() ? model + ".state_dict()" : s.call;
    ViolationText t;
    switch (s.kind) {
    case ViolationKind::PartitionedSave:
        if (fsdp) {
            // torch 2.13: torch.load of the file needs torch.distributed.tensor imported
            // (weights_only); without the process group full_tensor() raises "Could not
            // resolve the process group", at world size 1 "Expected cond to be True"; a plain
            // model's load_state_dict raises the mixed-tensor RuntimeError.
            t.message = call + " wrote " + n + first +
                        " as DTensors of a model fully_shard shards: each rank's file holds "
                        "that rank's shards alone, " +
                        bytesText(s.bytes) +
                        " of them are in the other ranks' files, and without this run's process "
                        "group or at another world size the DTensors cannot be gathered "
                        "(full_tensor() fails) and a model without fully_shard refuses them "
                        "(\"got mixed torch.Tensor and DTensor\")";
            t.fix = "sd = get_model_state_dict(" + model +
                    ", options=StateDictOptions(full_state_dict=True, cpu_offload=True))  # "
                    "torch.distributed.checkpoint.state_dict; torch.save(sd, PATH) on rank 0, "
                    "or torch.distributed.checkpoint.save(" +
                    model + ".state_dict(), checkpoint_id=DIR) on every rank";
        } else {
            t.message = call + " was taken while ZeRO-3 partitions the model: " + n + first +
                        " are placeholders of size 0 in it, so a checkpoint written from it "
                        "holds empty tensors and loses " +
                        bytesText(s.bytes) +
                        " of weights, with no error (loading it copies nothing or fails on the "
                        "sizes)";
            t.fix =
                "engine.save_16bit_model(DIR)  # \"stage3_gather_16bit_weights_on_model_save\": "
                "true; or engine.save_checkpoint(DIR) and zero_to_fp32.py, or the state "
                "dict taken inside deepspeed.zero.GatheredParameters(list(" +
                model + ".parameters())) on every rank";
        }
        break;
    case ViolationKind::PartitionedLoad:
        if (fsdp) {
            // torch 2.13: strict or not, one RuntimeError naming each parameter ("While
            // copying the parameter named ..., an exception occurred : ('aten.copy_.default got
            // mixed torch.Tensor and DTensor, ...')"), nothing copied; with assign=True the
            // first module's plain tensors replace its shards, then FSDPParam's load post-hook
            // raises AttributeError: 'Parameter' object has no attribute '_local_tensor', and
            // so does every forward after it.
            t.message = (s.call.empty() ? model + ".load_state_dict" : s.call) +
                        " was given plain tensors of the full shape for " + n + first +
                        " that fully_shard holds as DTensor shards (" + bytesText(s.bytes) +
                        " in all): torch cannot copy a plain tensor into a DTensor, so the load "
                        "copies nothing and raises one RuntimeError (\"got mixed torch.Tensor "
                        "and DTensor\", with strict=False too) that names neither FSDP nor the "
                        "fix, and with assign=True it puts a module's plain tensors in place of "
                        "its shards before FSDP2 raises an AttributeError (\"_local_tensor\") "
                        "that every later forward raises again";
            t.fix = "set_model_state_dict(" + model +
                    ", state_dict, options=StateDictOptions(full_state_dict=True, "
                    "broadcast_from_rank0=True))  # torch.distributed.checkpoint.state_dict, on "
                    "every rank; state_dict is needed on rank 0 only ({} on the others)";
        } else if (s.withoutModifier) {
            t.message = call + " loaded " + n + first + " (" + bytesText(s.bytes) +
                        ") inside deepspeed.zero.GatheredParameters without modifier_rank: "
                        "ZeRO-3 gathered them for reading only and puts each back from its "
                        "unchanged partitions when the scope exits, so the model keeps its old "
                        "weights, with no error";
            t.fix = "with deepspeed.zero.GatheredParameters(list(" + model +
                    ".parameters()), modifier_rank=0): " + model +
                    ".load_state_dict(state_dict)  # modifier_rank: rank 0's values are "
                    "broadcast and partitioned at the exit";
        } else {
            t.message = call + " was given full tensors for " + n + first +
                        " that ZeRO-3 partitions (" + bytesText(s.bytes) +
                        " in all): each is a placeholder of size 0 in the model, so nothing can "
                        "be copied into it and torch raises a size mismatch for each, which "
                        "names neither ZeRO-3 nor the fix";
            t.fix = "with deepspeed.zero.GatheredParameters(list(" + model +
                    ".parameters()), modifier_rank=0): " + model +
                    ".load_state_dict(state_dict)  # on every rank; or engine.load_checkpoint(DIR) "
                    "for a checkpoint DeepSpeed saved";
        }
        break;
    case ViolationKind::ResumeWorldSize: {
        const std::string dir = s.checkpoint.empty() ? std::string("DIR/TAG") : s.checkpoint;
        t.message = (s.call.empty() ? std::string("engine.load_checkpoint") : s.call) +
                    " resumes the ZeRO checkpoint " + dir +
                    ", saved at a data-parallel world size of " + std::to_string(s.savedWorld) +
                    ", in a run at world size " + std::to_string(s.world) +
                    ": ZeRO cut its optimizer states and fp32 weights into " +
                    std::to_string(s.savedWorld) +
                    " partitions, one per rank, and DeepSpeed cannot cut them again for " +
                    std::to_string(s.world) + " (it raises a ZeRORuntimeException)";
        t.fix = "python -m deepspeed.checkpoint.ds_to_universal --input_folder " + dir +
                " --output_folder " + dir +
                "_universal  # then \"checkpoint\": {\"load_universal\": true} in the config, "
                "and engine.load_checkpoint(DIR, tag=<that folder's name>); or zero_to_fp32.py for "
                "the weights alone, loaded with load_optimizer_states=False";
        break;
    }
    default:
        break;
    }
    return t;
}

} // namespace

std::string codeName(std::string_view dotted, FixDialect dialect)
{
    if (dialect == FixDialect::ShardScope) return displayPath(dotted);
    // Python: attribute access from the model object; numeric parts of ModuleList and
    // Sequential index the container ("blocks.0.fc1" -> "model.blocks[0].fc1").
    std::string out = "model";
    std::size_t pos = 0;
    while (pos < dotted.size()) {
        std::size_t dot = dotted.find('.', pos);
        if (dot == std::string_view::npos) dot = dotted.size();
        const std::string_view part = dotted.substr(pos, dot - pos);
        if (allDigits(part))
            out.append("[").append(part).append("]");
        else
            out.append(".").append(part);
        pos = dot + 1;
    }
    return out;
}

std::string_view severityMeaning(Severity s)
{
    switch (s) {
    case Severity::Error:
        return "error: the run crashes, or computes silently on a placeholder, a shard or a "
               "copy of its own";
    case Severity::Cost:
        return "cost: the run is right, but it costs memory or time (a gather nothing "
               "prefetched, a parameter held longer)";
    case Severity::Info:
        return "info: no values were read; nothing to fix";
    }
    return "unknown severity";
}

namespace {

std::string ranksText(const std::vector<int> &ranks)
{
    std::string out = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) {
        if (i) out += i + 1 == ranks.size() ? " and " : ", ";
        out += std::to_string(ranks[i]);
    }
    return out;
}

std::string secondsText(std::uint64_t ms)
{
    const double s = double(ms) / 1000.0;
    char text[32];
    std::snprintf(text, sizeof text, s < 10 ? "%.1f s" : "%.0f s", s);
    return text;
}

// A collective as the dialect's framework names it: ZeRO-3's all-gather of a module's
// parameters, FSDP2's unshard of a unit, the engine's fetch.
std::string collectiveText(const CollectiveSide &c, FixDialect dialect)
{
    const bool fsdp = dialect == FixDialect::Fsdp;
    std::string what;
    switch (c.kind) {
    case CollectiveKind::AllGather:
        what = fsdp ? "an all-gather (unshard)" : "an all-gather";
        break;
    case CollectiveKind::ReduceScatter:
        what = "a gradient reduce-scatter";
        break;
    case CollectiveKind::Broadcast:
        what = "a broadcast";
        break;
    }
    if (c.hasModule)
        what += std::string(c.kind == CollectiveKind::ReduceScatter ? " of " : " for ") +
                (fsdp ? "FSDP unit `" : "`") + displayPath(c.module) + "`";
    std::string why(fetchReasonName(c.reason));
    if (c.reason == FetchReason::GatheredParameters) why = "GatheredParameters";
    what += " (" + why;
    if (c.bytes) what += ", " + bytesText(c.bytes);
    if (c.params)
        what += ", " + std::to_string(c.params) + (c.params == 1 ? " parameter" : " parameters");
    return what + ")";
}

std::string siteText(const CollectiveDetail &d, const std::vector<int> &ranks)
{
    std::string out;
    for (int r : ranks)
        for (const CollectiveSite &site : d.sites)
            if (site.rank == r && site.where.known())
                out += std::string(out.empty() ? "" : ", ") +
                       (ranks.size() > 1 ? "rank " + std::to_string(r) + " " : std::string()) +
                       "at " + site.where.fileLine();
    return out;
}

std::string sideText(const CollectiveDetail &d, const CollectiveSide &c, FixDialect dialect)
{
    std::string out = ranksText(c.ranks) + " ";
    switch (c.position) {
    case CollectivePosition::Issued:
        out += "issued " + collectiveText(c, dialect);
        break;
    case CollectivePosition::Waiting:
        out += "waits in " + collectiveText(c, dialect);
        break;
    case CollectivePosition::Behind:
        out += "never reached it (" +
               (c.lastSeq ? "last at #" + std::to_string(c.lastSeq) : std::string("none yet")) +
               ")";
        break;
    case CollectivePosition::Finished:
        out += "had ended " +
               (c.lastSeq ? "after #" + std::to_string(c.lastSeq) : std::string("before any")) +
               // A recording cannot tell an end from a wait outside the numbered collectives
               // (the barrier a script meets in before it saves, an all-reduce of its own).
               (c.ranks.size() == 1
                    ? " (its run was over, or it waits outside the numbered collectives, e.g. "
                      "in a barrier)"
                    : " (their runs were over, or they wait outside the numbered collectives, "
                      "e.g. in a barrier)");
        break;
    }
    const std::string where = siteText(d, c.ranks);
    if (!where.empty()) out += ", " + where;
    return out;
}

// The cause a record's sides point at, and the line that fixes it in the dialect's code.
std::string collectiveFix(const ViolationSubject &subject, FixDialect dialect)
{
    const CollectiveDetail &d = subject.collective;
    if (!subject.raised.empty())
        return "fix what " + subject.raised +
               " (the others wait for it in a collective it will never issue)";
    const bool ds = dialect == FixDialect::DeepSpeed;
    const bool fsdp = dialect == FixDialect::Fsdp;
    bool gathered = false, forward = false, ended = false;
    for (const CollectiveSide &c : d.sides) {
        if (c.position == CollectivePosition::Finished) ended = true;
        if (c.position != CollectivePosition::Issued && c.position != CollectivePosition::Waiting)
            continue;
        if (c.reason == FetchReason::GatheredParameters || c.kind == CollectiveKind::Broadcast)
            gathered = true;
        if (c.reason == FetchReason::Forward || c.reason == FetchReason::Prefetch) forward = true;
    }
    if (gathered)
        return ds ? "with deepspeed.zero.GatheredParameters(params, modifier_rank=0): ...  # on "
                    "every rank, not under `if rank == 0`"
               : fsdp ? "model.unshard()  # or full_tensor(): on every rank, not under "
                        "`if rank == 0`"
                      : "GatheredParameters(engine, rank, params) on every rank thread, not on "
                        "one";
    if (ended)
        return fsdp || ds ? "DistributedSampler(dataset, drop_last=True) and "
                            "DataLoader(..., drop_last=True)  # the same number of batches on "
                            "every rank"
                          : "run the same number of steps on every rank";
    if (forward)
        return ds     ? "run the extra forward (evaluation, generate()) on every rank, or on "
                        "model.module outside the DeepSpeed engine with the parameters gathered"
               : fsdp ? "run the extra forward (evaluation, generate()) on every rank, or on an "
                        "unsharded copy outside the fully_shard model"
                      : "enter the extra module on every rank thread, or outside the sharded "
                        "model";
    return ds || fsdp ? "let every rank take the same path through the model; a rank that "
                        "raised: its exception, which the others wait for, is the fault"
                      : "let every rank thread take the same path through the model";
}

ViolationText describeCollective(const ViolationSubject &s, FixDialect dialect)
{
    const CollectiveDetail &d = s.collective;
    const std::string at = "#" + std::to_string(d.seq) +
                           (d.group ? " of process group " + std::to_string(d.group)
                                    : std::string(" of the default process group"));
    const std::string hang =
        dialect == FixDialect::ShardScope
            ? "the ranks wait for each other until the communicator's timeout"
            : "on GPUs NCCL waits until its timeout (10 to 30 minutes) and then fails without "
              "naming the rank or the line";
    ViolationText t;
    std::string sides;
    for (const CollectiveSide &c : d.sides)
        sides += (sides.empty() ? "" : "; ") + sideText(d, c, dialect);
    if (s.kind == ViolationKind::CollectiveMismatch) {
        t.message = "the ranks issued different collectives at " + at + ": " + sides +
                    ". Every rank must issue the same collectives in the same order; " + hang;
    } else if (s.ownRank) {
        const CollectiveSide *c = d.sides.empty() ? nullptr : &d.sides.front();
        const std::string where = d.sites.empty() || !d.sites.front().where.known()
                                      ? std::string()
                                      : " at " + d.sites.front().where.fileLine();
        t.message = "this rank has waited " + secondsText(d.waitedMs) + " in " +
                    (c ? collectiveText(*c, dialect) : std::string("a collective")) + ", " + at +
                    where + ", which the other ranks have not joined; " + hang;
    } else {
        t.message = "collective " + at + " stalled for " + secondsText(d.waitedMs) + ": " + sides +
                    "; " + hang;
    }
    t.fix = collectiveFix(s, dialect);
    return t;
}

} // namespace

ViolationText describeViolation(const ViolationSubject &s, FixDialect dialect)
{
    if (s.kind == ViolationKind::CollectiveMismatch || s.kind == ViolationKind::RankStalled)
        return describeCollective(s, dialect);
    if (s.kind == ViolationKind::PartitionedSave || s.kind == ViolationKind::PartitionedLoad ||
        s.kind == ViolationKind::ResumeWorldSize)
        return describeCheckpoint(s, dialect);
    // backward_unfinished: in FSDP2's words but in the DeepSpeed dialect (ZeRO-3's);
    // shard_order: FSDP2's alone, in its words whatever the dialect
    if (s.kind == ViolationKind::ShardOrder ||
        (s.kind == ViolationKind::BackwardUnfinished && dialect != FixDialect::DeepSpeed) ||
        (dialect == FixDialect::Fsdp &&
         ((s.kind == ViolationKind::UnregisteredAccess && s.use != AccessUse::Attribute) ||
          s.kind == ViolationKind::LateParameter || s.kind == ViolationKind::TiedAcrossGroups)))
        return describeFsdp(s);
    const bool ds = dialect == FixDialect::DeepSpeed;
    const std::string ns = ds ? "deepspeed.zero." : "";
    const std::string param = s.param.empty() ? std::string("<unknown parameter>") : s.param;
    const std::string paramCode = !s.paramCode.empty() ? s.paramCode
                                  : s.param.empty()    ? param
                                                       : codeName(s.param, dialect);
    const std::string owner = displayPath(s.owner);
    ViolationText t;
    switch (s.kind) {
    case ViolationKind::UnregisteredAccess:
        if (s.use == AccessUse::Attribute) {
            // Transformers' T5 blocks read `self.wo.weight.dtype`: DeepSpeed registers and
            // gathers the weight for it, and nothing reads a value of it.
            const std::string who = s.hasAccessor ? "module `" + displayPath(s.accessor) + "`"
                                                  : std::string("code outside any module");
            t.message = who + " read only attributes of `" + param + "` (owned by `" + owner +
                        "`, such as its dtype or shape), no values, while it was " +
                        std::string(statusName(s.status)) +
                        (s.hasAccessor && ds ? "; DeepSpeed registered and gathered it on `" +
                                                   displayPath(s.accessor) + "` for that"
                                             : std::string()) +
                        ": nothing to fix";
            break;
        }
        if (s.hasAccessor) {
            t.fix = ns + "register_external_parameter(" + codeName(s.accessor, dialect) + ", " +
                    paramCode + ")";
            t.message = "module `" + displayPath(s.accessor) + "` read `" + param + "` owned by `" +
                        owner + "` while it was " + std::string(statusName(s.status)) +
                        "; register it on `" + displayPath(s.accessor) + "`";
        } else if (s.use == AccessUse::NeedsGrad) {
            // The root module's forward is the one every step runs.
            t.fix = ns + "register_external_parameter(" + codeName("", dialect) + ", " + paramCode +
                    ")  # and move the read into " +
                    (ds ? "model.forward" : "the root module's forward");
            t.message = "`" + param + "` (owned by `" + owner +
                        "`) was read outside any module's forward/backward while it was " +
                        std::string(statusName(s.status)) +
                        ", and the read needs its gradient, which GatheredParameters does not "
                        "give back: do the read inside the model's forward and register it on "
                        "the model";
        } else {
            const bool writes = s.use == AccessUse::Write;
            t.fix = "with " + ns + "GatheredParameters(" + paramCode +
                    (writes ? ", modifier_rank=0" : "") + "): <" + (writes ? "change" : "read") +
                    " it here>";
            t.message = "`" + param + "` (owned by `" + owner +
                        "`) was read outside any module's forward/backward while it was " +
                        std::string(statusName(s.status)) + "; gather it around the " +
                        (writes ? "change, with the rank whose values to keep" : "read");
        }
        break;
    case ViolationKind::LateParameter: {
        const std::string module = codeName(s.owner, dialect);
        const std::string replaced =
            s.replaces.empty() ? std::string() : codeName(s.replaces, dialect);
        if (!replaced.empty())
            t.fix = "with " + ns + "GatheredParameters(" + replaced +
                    ", modifier_rank=0): <create " + paramCode + ">; then " + ns +
                    "register_external_parameter(" + module + ", " + paramCode + ")";
        else
            t.fix = "create " + paramCode + " inside " +
                    (ds ? "deepspeed.zero.Init" : "zero.Init") + ", or adopt it, then " + ns +
                    "register_external_parameter(" + module + ", " + paramCode + ")";
        t.message = "`" + param + "` was created in `" + owner +
                    "` after the model was partitioned" +
                    (s.replaces.empty() ? std::string() : " (it replaces `" + s.replaces + "`)") +
                    ", so it is not partitioned: every rank keeps the whole tensor";
        break;
    }
    case ViolationKind::TraceInvalidated:
        t.message = "expected module " +
                    (s.hasOwner ? "`" + owner + "`" : std::string("<end of step>")) + ", got `" +
                    displayPath(s.accessor) +
                    "`: the prefetch trace is invalidated and re-recorded this step";
        break;
    case ViolationKind::GatheredWriteWithoutModifier:
        t.fix = ns + "GatheredParameters(" + paramCode +
                ", modifier_rank=" + std::to_string(s.modifierRank) + ")";
        t.message = "`" + param +
                    "` was modified in place inside GatheredParameters without modifier_rank; the "
                    "change was discarded and no shard changed";
        break;
    case ViolationKind::BackwardUnfinished: // DeepSpeed's; every other dialect's: describeFsdp
        // What ZeRO-3 (stage3.py) is left with when an exception leaves the backward pass:
        // the epilogue that reduce-scatters the bucket and averages the gradients never ran.
        t.message = "DeepSpeed ZeRO-3's backward did not finish: it raised " +
                    (s.raised.empty() ? std::string("an exception") : s.raised) + " after " +
                    (s.bucketed == 1
                         ? std::string("one parameter's gradient was")
                         : "the gradients of " + std::to_string(s.bucketed) + " parameters were") +
                    " put in stage 3's reduce bucket, where " +
                    (s.bucketed == 1 ? "it stays" : "they stay") +
                    " unreduced, and the parameters it gathered for the rest of the pass stay "
                    "gathered. DeepSpeed does not recover from an exception inside backward: "
                    "after it (the batch skipped), the next backward or engine.step() fails, "
                    "with an AssertionError in __reduce_and_partition_ipg_grads (the same "
                    "parameters bucketed twice) or a TypeError in get_grad_norm_direct (no "
                    "averaged gradients)";
        t.fix = "raise  # in the except around the backward: stop the run there and resume it "
                "from the last checkpoint (engine.load_checkpoint)";
        break;
    case ViolationKind::ShardOrder:
        break; // describeFsdp's
    case ViolationKind::PartitionedSave:
    case ViolationKind::PartitionedLoad:
    case ViolationKind::ResumeWorldSize:
        break; // describeCheckpoint's
    case ViolationKind::CollectiveMismatch:
    case ViolationKind::RankStalled:
        break; // describeCollective's
    case ViolationKind::TiedAcrossGroups:
        t.fix = "fully_shard([" + codeName(s.owner, dialect) + ", " +
                codeName(s.accessor, dialect) + "])";
        t.message = "`" + param + "` is tied into `" + displayPath(s.accessor) + "` as well as `" +
                    owner + "`, which are sharded as two groups";
        break;
    }
    return t;
}

} // namespace shardscope::state

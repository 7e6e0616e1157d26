#include "state/violationtext.h"

#include <cctype>

namespace shardscope::state {

std::string_view fixDialectName(FixDialect d)
{
    return d == FixDialect::DeepSpeed ? "deepspeed" : "shardscope";
}

bool parseFixDialect(std::string_view s, FixDialect &out)
{
    if (s == "shardscope")
        out = FixDialect::ShardScope;
    else if (s == "deepspeed")
        out = FixDialect::DeepSpeed;
    else
        return false;
    return true;
}

std::string displayPath(std::string_view path)
{
    return path.empty() ? std::string("<root>") : std::string(path);
}

namespace {

bool allDigits(std::string_view s)
{
    if (s.empty()) return false;
    for (char c : s)
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    return true;
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

ViolationText describeViolation(const ViolationSubject &s, FixDialect dialect)
{
    const bool ds = dialect == FixDialect::DeepSpeed;
    const std::string ns = ds ? "deepspeed.zero." : "";
    const std::string param = s.param.empty() ? std::string("<unknown parameter>") : s.param;
    const std::string paramCode = !s.paramCode.empty() ? s.paramCode
                                  : s.param.empty()      ? param
                                                         : codeName(s.param, dialect);
    const std::string owner = displayPath(s.owner);
    ViolationText t;
    switch (s.kind) {
    case ViolationKind::UnregisteredAccess:
        if (s.hasAccessor) {
            t.fix = ns + "register_external_parameter(" + codeName(s.accessor, dialect) + ", " +
                    paramCode + ")";
            t.message = "module `" + displayPath(s.accessor) + "` read `" + param + "` owned by `" +
                        owner + "` while it was " + std::string(statusName(s.status)) +
                        "; register it on `" + displayPath(s.accessor) + "`";
        } else if (s.use == AccessUse::NeedsGrad) {
            // The root module's forward is the one every step runs.
            t.fix = ns + "register_external_parameter(" + codeName("", dialect) + ", " +
                    paramCode + ")  # and move the read into " +
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
    }
    return t;
}

} // namespace shardscope::state

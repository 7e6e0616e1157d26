#pragma once
// Engine states and events for the inspector's tests: a small tied-embedding model like
// the trainer's, and a large one with any number of parameters.

#include <cstdint>
#include <string>

#include "state/state.h"
#include "telemetry/eventfields.h"
#include "testevents.h"

namespace shardscope::test {

// root, embed, blocks.{0,1}.fc, lm_head, pos_conv; embed.weight tied into lm_head.
// Params: 0 embed.weight, 1 blocks.0.fc.weight, 2 blocks.0.fc.bias, 3 blocks.1.fc.weight,
// 4 blocks.1.fc.bias, 5 lm_head.bias, 6 pos_conv.weight_g (late), 7 pos_conv.weight_v (late).
inline state::EngineState smallState(int world = 4)
{
    state::EngineState st;
    st.modelName = "tiny-lm";
    st.worldSize = world;
    st.backend = "cpu";
    st.step = 1;
    for (int r = 0; r < world; ++r)
        st.localRanks.push_back(r);
    auto mod = [&](const std::string &path, const std::string &type, ModuleId parent) {
        state::ModuleRecord m;
        m.id = static_cast<ModuleId>(st.modules.size());
        m.path = path;
        m.type = type;
        m.parent = parent;
        st.modules.push_back(m);
        return m.id;
    };
    const ModuleId root = mod("", "TinyLM", kNoModule);
    const ModuleId embed = mod("embed", "Embedding", root);
    const ModuleId blocks = mod("blocks", "ModuleList", root);
    const ModuleId b0 = mod("blocks.0", "Block", blocks);
    const ModuleId fc0 = mod("blocks.0.fc", "Linear", b0);
    const ModuleId b1 = mod("blocks.1", "Block", blocks);
    const ModuleId fc1 = mod("blocks.1.fc", "Linear", b1);
    const ModuleId head = mod("lm_head", "TiedHead", root);
    const ModuleId conv = mod("pos_conv", "WeightNormConv1d", root);
    auto param = [&](const std::string &name, ModuleId owner, Shape shape, bool late = false) {
        state::ParamRecord p;
        p.id = static_cast<ParamId>(st.params.size());
        p.name = name;
        p.owner = owner;
        p.numel = 1;
        for (auto d : shape)
            p.numel *= d;
        p.shape = std::move(shape);
        p.paddedNumel = (p.numel + world - 1) / world * world;
        p.partitionNumel = p.paddedNumel / world;
        p.late = late;
        p.partitioned = !late;
        if (late) p.replaces = "pos_conv.weight"; // weight_norm's weight_g / weight_v
        p.status.assign(static_cast<std::size_t>(world),
                        late ? ParamStatus::Available : ParamStatus::NotAvailable);
        st.params.push_back(p);
        return p.id;
    };
    param("embed.weight", embed, {101, 16});
    param("blocks.0.fc.weight", fc0, {16, 16});
    param("blocks.0.fc.bias", fc0, {16});
    param("blocks.1.fc.weight", fc1, {16, 16});
    param("blocks.1.fc.bias", fc1, {16});
    param("lm_head.bias", head, {101});
    param("pos_conv.weight_g", conv, {1, 1, 3}, true);
    param("pos_conv.weight_v", conv, {16, 4, 3}, true);
    (void)b1;
    return st;
}

// smallState as FSDP2 would shard it: the root, each block, and embed with lm_head
// (fully_shard([model.embed, model.lm_head])) are units on a mesh "dp"; the blocks reshard
// after forward, the root does not, embed's group to 2 ranks; every partitioned parameter is
// Shard(0), lm_head.bias an HSDP (Replicate(), Shard(0)).
inline state::EngineState fsdpState(int world = 4)
{
    state::EngineState st = smallState(world);
    st.fixDialect = "fsdp";
    const std::string mesh = "dp=" + std::to_string(world);
    auto unit = [&](ModuleId m, ModuleId group, const char *reshard) {
        st.modules[m].unitGroup = group;
        st.modules[m].reshardAfterForward = reshard;
        st.modules[m].mesh = mesh;
    };
    unit(0, 0, "False");
    unit(1, 1, "2");    // embed heads the group ...
    unit(7, 1, "2");    // ... lm_head is in
    unit(3, 3, "True"); // blocks.0
    unit(5, 5, "True"); // blocks.1
    for (state::ParamRecord &p : st.params)
        if (p.partitioned) p.placements = "Shard(0)";
    st.params[5].placements = "(Replicate(), Shard(0))";
    return st;
}

// modules * paramsPerModule parameters, under root -> group.G -> layer.L.
inline state::EngineState largeState(int modules, int paramsPerModule, int world = 8)
{
    state::EngineState st;
    st.modelName = "large";
    st.worldSize = world;
    st.backend = "cpu";
    state::ModuleRecord root;
    root.id = 0;
    root.type = "Root";
    st.modules.push_back(root);
    ModuleId group = 0;
    for (int m = 0; m < modules; ++m) {
        if (m % 100 == 0) {
            state::ModuleRecord g;
            g.id = static_cast<ModuleId>(st.modules.size());
            g.path = "group" + std::to_string(m / 100);
            g.type = "Group";
            g.parent = 0;
            st.modules.push_back(g);
            group = g.id;
        }
        state::ModuleRecord l;
        l.id = static_cast<ModuleId>(st.modules.size());
        l.path = st.modules[group].path + ".layer" + std::to_string(m);
        l.type = "Linear";
        l.parent = group;
        st.modules.push_back(l);
        for (int p = 0; p < paramsPerModule; ++p) {
            state::ParamRecord r;
            r.id = static_cast<ParamId>(st.params.size());
            r.name = l.path + ".w" + std::to_string(p);
            r.owner = l.id;
            r.shape = {64, p + 1};
            r.numel = 64 * (p + 1);
            r.paddedNumel = (r.numel + world - 1) / world * world;
            r.partitionNumel = r.paddedNumel / world;
            r.partitioned = true;
            r.status.assign(static_cast<std::size_t>(world), ParamStatus::NotAvailable);
            st.params.push_back(std::move(r));
        }
    }
    return st;
}

// lm_head (module 7) reads embed.weight (param 0) owned by embed (module 1) while NOT_AVAILABLE,
// gathered.
inline telemetry::Event lmHeadViolation(std::uint64_t ts, int rank, std::uint32_t step = 1)
{
    return eventAt(ts, rank,
                   telemetry::makeUnregisteredAccess({.accessor = 7,
                                                      .param = 0,
                                                      .owner = 1,
                                                      .status = ParamStatus::NotAvailable,
                                                      .action = GuardAction::Gathered}),
                   step);
}

} // namespace shardscope::test

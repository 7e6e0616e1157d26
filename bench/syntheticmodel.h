#pragma once
// A large transformer-shaped model for the attach and tree-filter benchmarks: blocks.B with
// attn.{q,k,v,out}_proj, mlp.fc{1,2}, ln{1,2}, each with weight and bias (16 parameters per
// block), built either as an EngineState or inside a real Engine.

#include <cstdint>
#include <string>
#include <vector>

#include "core/engine.h"
#include "state/state.h"

namespace shardscope::bench {

struct SyntheticModule
{
    std::string name; // local name
    std::string path;
    std::string type;
    std::int32_t parent = -1; // index into modules; -1 for the root
};

struct SyntheticParam
{
    std::int32_t owner = 0; // index into modules
    std::string localName;
    Shape shape;
};

struct SyntheticModel
{
    std::vector<SyntheticModule> modules; // [0] is the root
    std::vector<SyntheticParam> params;
};

// ceil(params / 16) blocks; exactly `params` parameters.
inline SyntheticModel makeSyntheticModel(int params, int hidden = 64)
{
    SyntheticModel m;
    m.modules.push_back({"", "", "Transformer", -1});
    auto add = [&](std::int32_t parent, const std::string &name, const std::string &type) {
        const std::string &pp = m.modules[static_cast<std::size_t>(parent)].path;
        m.modules.push_back({name, pp.empty() ? name : pp + "." + name, type, parent});
        return static_cast<std::int32_t>(m.modules.size() - 1);
    };
    const std::int32_t blocks = add(0, "blocks", "ModuleList");
    const std::int64_t h = hidden;
    for (int b = 0; static_cast<int>(m.params.size()) < params; ++b) {
        const std::int32_t block = add(blocks, std::to_string(b), "Block");
        const std::int32_t attn = add(block, "attn", "Attention");
        const std::int32_t mlp = add(block, "mlp", "MLP");
        struct Leaf
        {
            std::int32_t parent;
            const char *name;
            const char *type;
            std::int64_t out, in;
        };
        const Leaf leaves[] = {
            {attn, "q_proj", "Linear", h, h},  {attn, "k_proj", "Linear", h, h},
            {attn, "v_proj", "Linear", h, h},  {attn, "out_proj", "Linear", h, h},
            {mlp, "fc1", "Linear", 4 * h, h},  {mlp, "fc2", "Linear", h, 4 * h},
            {block, "ln1", "LayerNorm", h, 0}, {block, "ln2", "LayerNorm", h, 0},
        };
        for (const Leaf &leaf : leaves) {
            const std::int32_t mod = add(leaf.parent, leaf.name, leaf.type);
            for (const char *pn : {"weight", "bias"}) {
                if (static_cast<int>(m.params.size()) >= params) break;
                Shape shape = (leaf.in && std::string(pn) == "weight") ? Shape{leaf.out, leaf.in}
                                                                       : Shape{leaf.out};
                m.params.push_back({mod, pn, std::move(shape)});
            }
        }
    }
    return m;
}

// The state an engine of `world` ranks would report after partitioning (nothing gathered).
inline state::EngineState syntheticState(const SyntheticModel &m, int world,
                                         std::int64_t persistenceThreshold)
{
    state::EngineState st;
    st.modelName = "synthetic";
    st.worldSize = world;
    st.backend = "cpu";
    for (int r = 0; r < world; ++r)
        st.localRanks.push_back(r);
    st.config.persistenceThreshold = persistenceThreshold;
    for (std::size_t i = 0; i < m.modules.size(); ++i) {
        const SyntheticModule &sm = m.modules[i];
        st.modules.push_back(
            state::ModuleRecord{static_cast<ModuleId>(i), sm.path, sm.type,
                                sm.parent < 0 ? kNoModule : static_cast<ModuleId>(sm.parent)});
    }
    for (std::size_t i = 0; i < m.params.size(); ++i) {
        const SyntheticParam &sp = m.params[i];
        state::ParamRecord p;
        p.id = static_cast<ParamId>(i);
        p.name = m.modules[static_cast<std::size_t>(sp.owner)].path + "." + sp.localName;
        p.owner = static_cast<ModuleId>(sp.owner);
        p.shape = sp.shape;
        p.numel = state::shapeNumel(sp.shape);
        p.persistent = p.numel < persistenceThreshold;
        p.partitioned = !p.persistent;
        p.paddedNumel = p.persistent ? p.numel : (p.numel + world - 1) / world * world;
        p.partitionNumel = p.persistent ? p.numel : p.paddedNumel / world;
        p.status.assign(static_cast<std::size_t>(world),
                        p.persistent ? ParamStatus::Available : ParamStatus::NotAvailable);
        st.params.push_back(std::move(p));
    }
    return st;
}

// Adds the model's modules and parameters (zero-initialised) to an empty engine.
inline void buildSyntheticModel(core::Engine &engine, const SyntheticModel &m)
{
    std::vector<ModuleId> ids(m.modules.size(), engine.root());
    for (std::size_t i = 1; i < m.modules.size(); ++i) {
        const SyntheticModule &sm = m.modules[i];
        ids[i] = engine.addModule(ids[static_cast<std::size_t>(sm.parent)], sm.name, sm.type);
    }
    for (const SyntheticParam &sp : m.params)
        engine.addParameter(ids[static_cast<std::size_t>(sp.owner)], sp.localName, sp.shape,
                            DType::F32, nullptr);
}

} // namespace shardscope::bench

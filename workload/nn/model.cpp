#include "nn/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "nn/trainer.h"

namespace shardscope::nn {

namespace {

constexpr float kLayerNormEps = 1e-5f;

ModuleId requireModule(const core::Engine &engine, const std::string &path)
{
    const ModuleId m = engine.findModule(path);
    if (m == kNoModule)
        throw core::EngineError("the model has no module '" + path +
                                "'; build it with buildModel()");
    return m;
}

ParamId requireParam(const core::Engine &engine, const std::string &name)
{
    const ParamId p = engine.findParam(name);
    if (p == kNoParam)
        throw core::EngineError(
            "the model has no parameter '" + name +
            "'; build it with buildModel() (weight_norm creates pos_conv.weight_g "
            "and pos_conv.weight_v)");
    return p;
}

// Initial values, the same whatever the world size: one generator per parameter.
class Init
{
  public:
    explicit Init(std::uint64_t seed) : m_seed(seed) {}

    std::vector<float> normal(std::int64_t n, float stddev)
    {
        std::mt19937_64 rng(m_seed * 1000003u + m_count++);
        std::normal_distribution<float> dist(0.0f, stddev);
        std::vector<float> v(static_cast<std::size_t>(n));
        for (float &x : v)
            x = dist(rng);
        return v;
    }
    std::vector<float> uniform(std::int64_t n, float bound)
    {
        std::mt19937_64 rng(m_seed * 1000003u + m_count++);
        std::uniform_real_distribution<float> dist(-bound, bound);
        std::vector<float> v(static_cast<std::size_t>(n));
        for (float &x : v)
            x = dist(rng);
        return v;
    }
    static std::vector<float> constant(std::int64_t n, float value)
    {
        return std::vector<float>(static_cast<std::size_t>(n), value);
    }

  private:
    std::uint64_t m_seed;
    std::uint64_t m_count = 0;
};

void addParam(core::Engine &engine, ModuleId owner, const char *name, Shape shape,
              const std::vector<float> &init)
{
    engine.addParameter(owner, name, std::move(shape), DType::F32, init.data());
}

void addLinear(core::Engine &engine, Init &init, ModuleId owner, int in, int out)
{
    // PyTorch's nn.Linear default: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
    const float bound = 1.0f / std::sqrt(static_cast<float>(in));
    addParam(engine, owner, "weight", {out, in}, init.uniform(std::int64_t(out) * in, bound));
    addParam(engine, owner, "bias", {out}, init.uniform(out, bound));
}

void addLayerNorm(core::Engine &engine, ModuleId owner, int dim)
{
    addParam(engine, owner, "weight", {dim}, Init::constant(dim, 1.0f));
    addParam(engine, owner, "bias", {dim}, Init::constant(dim, 0.0f));
}

// torch.nn.utils.weight_norm(pos_conv, name="weight", dim=2) on the full weight.
struct WeightNormed
{
    std::vector<float> g, v;
};

WeightNormed decompose(const TrainConfig &c, const float *weight)
{
    WeightNormed w;
    const int in = c.hidden / c.groups;
    w.g.resize(c.kernel);
    w.v.resize(static_cast<std::size_t>(c.hidden) * in * c.kernel);
    weightNormDecompose(weight, c.hidden, in, c.kernel, w.v.data(), w.g.data());
    return w;
}

// What the users in story 2 did first: weight_norm on the partitioned conv. It reads the
// weight from model-building code (an unregistered access with accessor none; under
// --guard error the engine stops here) and creates weight_g / weight_v after zero.Init:
// late parameters, never partitioned.
void weightNormAsUsersDidFirst(core::Engine &engine, const TrainConfig &c, ModuleId conv,
                               ParamId weight)
{
    const std::vector<std::byte> full = engine.hostRead(weight);
    const WeightNormed w = decompose(c, reinterpret_cast<const float *>(full.data()));
    engine.removeParameter(weight);
    const int in = c.hidden / c.groups;
    addParam(engine, conv, "weight_g", {1, 1, c.kernel}, w.g);
    addParam(engine, conv, "weight_v", {c.hidden, in, c.kernel}, w.v);
}

// The story's fix: weight_norm inside GatheredParameters(pos_conv.weight, modifier_rank=0),
// then adopt weight_g / weight_v (zero.Init) and register them on the module.
void weightNormAsTheStoryFixes(core::Engine &engine, const TrainConfig &c, ModuleId conv,
                               ParamId weight)
{
    const int in = c.hidden / c.groups;
    ParamId g = kNoParam;
    ParamId v = kNoParam;
    {
        core::GatheredParameters gathered(engine, {weight}, 0);
        const std::vector<std::byte> full = gathered.toHost(0); // the tensor may be on a GPU
        const WeightNormed w = decompose(c, reinterpret_cast<const float *>(full.data()));
        g = engine.addParameter(conv, "weight_g", {1, 1, c.kernel}, DType::F32, w.g.data());
        v = engine.addParameter(conv, "weight_v", {c.hidden, in, c.kernel}, DType::F32, w.v.data());
        gathered.close();
    }
    engine.removeParameter(weight);
    engine.adoptParameter(g);
    engine.adoptParameter(v);
    engine.registerExternalParameter(conv, v);
    engine.registerExternalParameter(conv, g);
}

} // namespace

std::vector<ParamId> ModelHandles::params() const
{
    std::vector<ParamId> out = {embedWeight, convG, convV, convBias};
    for (const Block &b : blocks)
        out.insert(out.end(),
                   {b.lnWeight, b.lnBias, b.fc1Weight, b.fc1Bias, b.fc2Weight, b.fc2Bias});
    out.insert(out.end(), {lnFWeight, lnFBias, headBias});
    return out;
}

ModelHandles findModel(const core::Engine &engine, int layers)
{
    ModelHandles h;
    h.embed = requireModule(engine, "embed");
    h.posConv = requireModule(engine, "pos_conv");
    h.lnF = requireModule(engine, "ln_f");
    h.lmHead = requireModule(engine, "lm_head");
    h.embedWeight = requireParam(engine, "embed.weight");
    h.convG = requireParam(engine, "pos_conv.weight_g");
    h.convV = requireParam(engine, "pos_conv.weight_v");
    h.convBias = requireParam(engine, "pos_conv.bias");
    h.lnFWeight = requireParam(engine, "ln_f.weight");
    h.lnFBias = requireParam(engine, "ln_f.bias");
    h.headBias = requireParam(engine, "lm_head.bias");
    for (int i = 0; i < layers; ++i) {
        const std::string b = "blocks." + std::to_string(i);
        ModelHandles::Block blk;
        blk.block = requireModule(engine, b);
        blk.ln = requireModule(engine, b + ".ln");
        blk.fc1 = requireModule(engine, b + ".fc1");
        blk.fc2 = requireModule(engine, b + ".fc2");
        blk.lnWeight = requireParam(engine, b + ".ln.weight");
        blk.lnBias = requireParam(engine, b + ".ln.bias");
        blk.fc1Weight = requireParam(engine, b + ".fc1.weight");
        blk.fc1Bias = requireParam(engine, b + ".fc1.bias");
        blk.fc2Weight = requireParam(engine, b + ".fc2.weight");
        blk.fc2Bias = requireParam(engine, b + ".fc2.bias");
        h.blocks.push_back(blk);
    }
    return h;
}

void buildModel(core::Engine &engine, const TrainConfig &c)
{
    const std::string problem = validate(c);
    if (!problem.empty()) throw core::EngineError(problem);
    Init init(c.seed);
    const ModuleId root = engine.root();
    const ModuleId embed = engine.addModule(root, "embed", "Embedding");
    addParam(engine, embed, "weight", {c.vocab, c.hidden},
             init.normal(std::int64_t(c.vocab) * c.hidden, 0.5f / std::sqrt(float(c.hidden))));

    const ModuleId conv = engine.addModule(root, "pos_conv", "Conv1d");
    const int in = c.hidden / c.groups;
    // Kaiming normal, as wav2vec2's _init_weights does for its positional conv.
    addParam(engine, conv, "weight", {c.hidden, in, c.kernel},
             init.normal(std::int64_t(c.hidden) * in * c.kernel,
                         std::sqrt(2.0f / float(in * c.kernel))));
    addParam(engine, conv, "bias", {c.hidden}, Init::constant(c.hidden, 0.0f));

    const ModuleId blocks = engine.addModule(root, "blocks", "ModuleList");
    for (int i = 0; i < c.layers; ++i) {
        const ModuleId block = engine.addModule(blocks, std::to_string(i), "Block");
        addLayerNorm(engine, engine.addModule(block, "ln", "LayerNorm"), c.hidden);
        addLinear(engine, init, engine.addModule(block, "fc1", "Linear"), c.hidden, 4 * c.hidden);
        addLinear(engine, init, engine.addModule(block, "fc2", "Linear"), 4 * c.hidden, c.hidden);
    }
    addLayerNorm(engine, engine.addModule(root, "ln_f", "LayerNorm"), c.hidden);
    const ModuleId head = engine.addModule(root, "lm_head", "TiedLMHead");
    addParam(engine, head, "bias", {c.vocab}, Init::constant(c.vocab, 0.0f));

    const ParamId embedWeight = engine.findParam("embed.weight");
    if (c.externals == Externals::Manual) engine.registerExternalParameter(head, embedWeight);

    engine.partition();

    const ParamId convWeight = engine.findParam("pos_conv.weight");
    if (c.externals == Externals::Manual)
        weightNormAsTheStoryFixes(engine, c, conv, convWeight);
    else
        weightNormAsUsersDidFirst(engine, c, conv, convWeight);
}

// ---------------------------------------------------------------- one rank

RankModel::RankModel(core::Engine &engine, int rank, const TrainConfig &config,
                     ModelHandles handles)
    : m_engine(engine), m_rank(rank), m_config(config), m_h(std::move(handles)),
      m_blocks(static_cast<std::size_t>(config.layers)), m_grads(engine.paramCount())
{
    const int in = config.hidden / config.groups;
    m_convWeight.resize(static_cast<std::size_t>(config.hidden) * in * config.kernel);
    m_convNorms.resize(config.kernel);
}

const float *RankModel::read(ParamId p)
{
    return m_engine.access(m_rank, p).f32();
}

std::vector<float> &RankModel::gradBuffer(ParamId p)
{
    std::vector<float> &g = m_grads[p];
    const auto n = static_cast<std::size_t>(m_engine.param(p).numel);
    if (g.size() != n) g.assign(n, 0.0f);
    return g;
}

void RankModel::reduce(ParamId p)
{
    std::vector<float> &g = gradBuffer(p);
    m_engine.reduceScatterGrad(m_rank, p, g.data());
    std::fill(g.begin(), g.end(), 0.0f);
}

double RankModel::forwardBackward(const std::int32_t *tokens, const std::int32_t *targets,
                                  int sequences, double globalTokens)
{
    forwardBackwardShapes(sequences);
    forward(tokens);
    const double lossSum = crossEntropy(m_logits.data(), m_rows, m_config.vocab, targets,
                                        globalTokens, m_dLogits.data());
    backward(tokens);
    return lossSum;
}

void RankModel::forwardBackwardShapes(int sequences)
{
    const int H = m_config.hidden;
    const int V = m_config.vocab;
    m_rows = sequences * m_config.seq;
    m_conv = ConvShape{sequences,       m_config.seq,    H,
                       m_config.kernel, m_config.groups, m_config.causalConv};
    const auto rh = static_cast<std::size_t>(m_rows) * H;
    for (auto *v : {&m_x0, &m_convOut, &m_x1, &m_xL, &m_hF})
        v->resize(rh);
    for (BlockActs &b : m_blocks) {
        b.in.resize(rh);
        b.normed.resize(rh);
        b.mean.resize(m_rows);
        b.rstd.resize(m_rows);
        b.hidden.resize(rh * 4);
        b.activated.resize(rh * 4);
    }
    m_lnFMean.resize(m_rows);
    m_lnFRstd.resize(m_rows);
    m_logits.resize(static_cast<std::size_t>(m_rows) * V);
    m_dLogits.resize(m_logits.size());
}

double RankModel::evaluate(const std::int32_t *tokens, const std::int32_t *targets, int sequences)
{
    // The activations as a training micro-batch sizes them; no backward, no gradient kept.
    forwardBackwardShapes(sequences);
    forward(tokens);
    const double tokensHere = static_cast<double>(m_rows);
    return crossEntropy(m_logits.data(), m_rows, m_config.vocab, targets,
                        tokensHere > 0 ? tokensHere : 1.0, m_dLogits.data());
}

void RankModel::forward(const std::int32_t *tokens)
{
    const int H = m_config.hidden;
    const int V = m_config.vocab;
    const std::int64_t n = static_cast<std::int64_t>(m_rows) * H;
    core::ModuleScope model(m_engine, m_rank, m_engine.root(), Phase::Forward);
    {
        core::ModuleScope s(m_engine, m_rank, m_h.embed, Phase::Forward);
        embeddingForward(tokens, m_rows, read(m_h.embedWeight), H, m_x0.data());
    }
    {
        core::ModuleScope s(m_engine, m_rank, m_h.posConv, Phase::Forward);
        weightNormForward(read(m_h.convV), read(m_h.convG), H, H / m_config.groups, m_config.kernel,
                          m_convWeight.data(), m_convNorms.data());
        conv1dForward(m_conv, m_x0.data(), m_convWeight.data(), read(m_h.convBias),
                      m_convOut.data());
        geluForward(m_convOut.data(), n, m_x1.data());
        for (std::int64_t i = 0; i < n; ++i)
            m_x1[i] += m_x0[i];
    }
    if (!m_blocks.empty()) m_blocks.front().in = m_x1;
    for (std::size_t i = 0; i < m_blocks.size(); ++i) {
        const ModelHandles::Block &h = m_h.blocks[i];
        BlockActs &a = m_blocks[i];
        core::ModuleScope s(m_engine, m_rank, h.block, Phase::Forward);
        {
            core::ModuleScope ln(m_engine, m_rank, h.ln, Phase::Forward);
            layerNormForward(a.in.data(), m_rows, H, read(h.lnWeight), read(h.lnBias),
                             kLayerNormEps, a.normed.data(), a.mean.data(), a.rstd.data());
        }
        {
            core::ModuleScope fc1(m_engine, m_rank, h.fc1, Phase::Forward);
            linearForward(a.normed.data(), m_rows, H, 4 * H, read(h.fc1Weight), read(h.fc1Bias),
                          a.hidden.data());
        }
        geluForward(a.hidden.data(), n * 4, a.activated.data());
        std::vector<float> &out = i + 1 < m_blocks.size() ? m_blocks[i + 1].in : m_xL;
        {
            core::ModuleScope fc2(m_engine, m_rank, h.fc2, Phase::Forward);
            linearForward(a.activated.data(), m_rows, 4 * H, H, read(h.fc2Weight), read(h.fc2Bias),
                          out.data());
        }
        for (std::int64_t j = 0; j < n; ++j)
            out[j] += a.in[j]; // the residual
    }
    if (m_blocks.empty()) m_xL = m_x1;
    {
        core::ModuleScope s(m_engine, m_rank, m_h.lnF, Phase::Forward);
        layerNormForward(m_xL.data(), m_rows, H, read(m_h.lnFWeight), read(m_h.lnFBias),
                         kLayerNormEps, m_hF.data(), m_lnFMean.data(), m_lnFRstd.data());
    }
    {
        // The tied head reads embed.weight, which embed owns (story 1).
        core::ModuleScope s(m_engine, m_rank, m_h.lmHead, Phase::Forward);
        tiedHeadForward(m_hF.data(), m_rows, H, V, read(m_h.embedWeight), read(m_h.headBias),
                        m_logits.data());
    }
}

void RankModel::backward(const std::int32_t *tokens)
{
    const int H = m_config.hidden;
    const int V = m_config.vocab;
    const std::int64_t n = static_cast<std::int64_t>(m_rows) * H;
    std::vector<float> dx(static_cast<std::size_t>(n));
    std::vector<float> dTmp(static_cast<std::size_t>(n));
    core::ModuleScope model(m_engine, m_rank, m_engine.root(), Phase::Backward);
    {
        core::ModuleScope s(m_engine, m_rank, m_h.lmHead, Phase::Backward);
        // embed.weight's gradient from the head waits for the lookup's part (embed's backward).
        tiedHeadBackward(m_hF.data(), m_rows, H, V, read(m_h.embedWeight), m_dLogits.data(),
                         dTmp.data(), gradBuffer(m_h.embedWeight).data(),
                         gradBuffer(m_h.headBias).data());
        reduce(m_h.headBias);
    }
    {
        core::ModuleScope s(m_engine, m_rank, m_h.lnF, Phase::Backward);
        layerNormBackward(m_xL.data(), m_rows, H, read(m_h.lnFWeight), m_lnFMean.data(),
                          m_lnFRstd.data(), dTmp.data(), dx.data(),
                          gradBuffer(m_h.lnFWeight).data(), gradBuffer(m_h.lnFBias).data());
        reduce(m_h.lnFWeight);
        reduce(m_h.lnFBias);
    }
    std::vector<float> dHidden(static_cast<std::size_t>(n) * 4);
    for (std::size_t i = m_blocks.size(); i-- > 0;) {
        const ModelHandles::Block &h = m_h.blocks[i];
        BlockActs &a = m_blocks[i];
        core::ModuleScope s(m_engine, m_rank, h.block, Phase::Backward);
        {
            core::ModuleScope fc2(m_engine, m_rank, h.fc2, Phase::Backward);
            linearBackward(a.activated.data(), m_rows, 4 * H, H, read(h.fc2Weight), dx.data(),
                           dHidden.data(), gradBuffer(h.fc2Weight).data(),
                           gradBuffer(h.fc2Bias).data());
            reduce(h.fc2Weight);
            reduce(h.fc2Bias);
        }
        geluBackward(a.hidden.data(), n * 4, dHidden.data(), dHidden.data());
        {
            core::ModuleScope fc1(m_engine, m_rank, h.fc1, Phase::Backward);
            linearBackward(a.normed.data(), m_rows, H, 4 * H, read(h.fc1Weight), dHidden.data(),
                           dTmp.data(), gradBuffer(h.fc1Weight).data(),
                           gradBuffer(h.fc1Bias).data());
            reduce(h.fc1Weight);
            reduce(h.fc1Bias);
        }
        {
            core::ModuleScope ln(m_engine, m_rank, h.ln, Phase::Backward);
            std::vector<float> dIn(static_cast<std::size_t>(n));
            layerNormBackward(a.in.data(), m_rows, H, read(h.lnWeight), a.mean.data(),
                              a.rstd.data(), dTmp.data(), dIn.data(), gradBuffer(h.lnWeight).data(),
                              gradBuffer(h.lnBias).data());
            reduce(h.lnWeight);
            reduce(h.lnBias);
            for (std::int64_t j = 0; j < n; ++j)
                dx[j] += dIn[j]; // the residual
        }
    }
    {
        core::ModuleScope s(m_engine, m_rank, m_h.posConv, Phase::Backward);
        // x1 = x0 + GELU(conv(x0)): dConvOut = GELU'(convOut) * dx.
        geluBackward(m_convOut.data(), n, dx.data(), dTmp.data());
        std::vector<float> dConvWeight(m_convWeight.size(), 0.0f);
        std::vector<float> dx0(static_cast<std::size_t>(n));
        conv1dBackward(m_conv, m_x0.data(), m_convWeight.data(), dTmp.data(), dx0.data(),
                       dConvWeight.data(), gradBuffer(m_h.convBias).data());
        weightNormBackward(read(m_h.convV), read(m_h.convG), m_convNorms.data(), dConvWeight.data(),
                           H, H / m_config.groups, m_config.kernel, gradBuffer(m_h.convV).data(),
                           gradBuffer(m_h.convG).data());
        reduce(m_h.convV);
        reduce(m_h.convG);
        reduce(m_h.convBias);
        for (std::int64_t j = 0; j < n; ++j)
            dx[j] += dx0[j];
    }
    {
        core::ModuleScope s(m_engine, m_rank, m_h.embed, Phase::Backward);
        embeddingBackward(tokens, m_rows, dx.data(), H, gradBuffer(m_h.embedWeight).data());
        reduce(m_h.embedWeight);
    }
}

} // namespace shardscope::nn

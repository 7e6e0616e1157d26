#include "nn/adam.h"

#include <cmath>
#include <stdexcept>

namespace shardscope::nn {

void Adam::update(std::size_t slot, std::span<float> data, std::span<const float> grad, bool decay)
{
    if (data.size() != grad.size())
        throw std::logic_error("Adam: parameter and gradient sizes differ");
    if (slot >= m_m.size()) {
        m_m.resize(slot + 1);
        m_v.resize(slot + 1);
    }
    auto &m = m_m[slot];
    auto &v = m_v[slot];
    if (m.size() != data.size()) {
        m.assign(data.size(), 0.0f);
        v.assign(data.size(), 0.0f);
    }
    const AdamOptions &o = m_options;
    const float c1 = 1.0f - static_cast<float>(std::pow(o.beta1, m_step));
    const float c2 = 1.0f - static_cast<float>(std::pow(o.beta2, m_step));
    const float shrink = decay ? 1.0f - o.lr * o.weightDecay : 1.0f;
    for (std::size_t i = 0; i < data.size(); ++i) {
        const float g = grad[i];
        m[i] = o.beta1 * m[i] + (1.0f - o.beta1) * g;
        v[i] = o.beta2 * v[i] + (1.0f - o.beta2) * g * g;
        const float mHat = m[i] / c1;
        const float vHat = v[i] / c2;
        data[i] = data[i] * shrink - o.lr * mHat / (std::sqrt(vHat) + o.eps);
    }
}

} // namespace shardscope::nn

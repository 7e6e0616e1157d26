#include "state/shape.h"

namespace shardscope::state {

std::int64_t shapeNumel(const Shape &s)
{
    std::int64_t n = 1;
    for (std::int64_t d : s)
        n *= d;
    return n;
}

std::string shapeString(const Shape &s)
{
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (i) out += ", ";
        out += std::to_string(s[i]);
    }
    return out + "]";
}

} // namespace shardscope::state

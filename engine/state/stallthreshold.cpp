#include "state/stallthreshold.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace shardscope::state {

std::uint64_t stallNsFromEnvironment(std::uint64_t fallbackNs, std::string *error)
{
    const char *text = std::getenv("SHARDSCOPE_STALL_SECONDS");
    if (!text || !*text) return fallbackNs;
    char *end = nullptr;
    errno = 0;
    const double seconds = std::strtod(text, &end);
    if (errno || end == text || *end || !std::isfinite(seconds) || seconds <= 0 || seconds > 1e6) {
        if (error)
            *error = std::string("SHARDSCOPE_STALL_SECONDS is `") + text +
                     "`, not a number of seconds above 0 (e.g. 5 or 0.5); unset it for the "
                     "default";
        return fallbackNs;
    }
    return static_cast<std::uint64_t>(seconds * 1e9);
}

std::uint64_t defaultStallNs(std::string_view backend)
{
    return backend == "nccl" ? 60 * 1'000'000'000ull : 5 * 1'000'000'000ull;
}

} // namespace shardscope::state

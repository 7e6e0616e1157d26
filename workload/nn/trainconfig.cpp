#include "nn/trainconfig.h"

#include <algorithm>
#include <limits>
#include <sstream>

namespace shardscope::nn {

std::string_view externalsName(Externals e)
{
    return e == Externals::Manual ? "manual" : "none";
}

bool parseExternals(std::string_view s, Externals &out)
{
    if (s == "none") {
        out = Externals::None;
        return true;
    }
    if (s == "manual") {
        out = Externals::Manual;
        return true;
    }
    return false;
}

std::string validate(const TrainConfig &c)
{
    std::ostringstream err;
    auto range = [&err](const char *flag, long long v, long long lo, long long hi) {
        if (err.tellp() == 0 && (v < lo || v > hi))
            err << flag << " " << v << " is out of range: use a value from " << lo << " to " << hi;
    };
    range("--world-size", c.worldSize, 1, 64);
    range("--steps", c.steps, 1, 10000000);
    range("--layers", c.layers, 0, 256);
    range("--hidden", c.hidden, 1, 8192);
    range("--vocab", c.vocab, 2, 1000000);
    range("--seq", c.seq, 2, 65536);
    range("--batch", c.batch, 1, 1000000);
    range("--kernel", c.kernel, 1, 1024);
    range("--groups", c.groups, 1, 8192);
    range("--history", static_cast<long long>(c.historyEvents), 0, 1LL << 30);
    range("--persistence-threshold", c.persistenceThreshold, 0, 1LL << 40);
    range("--comm-timeout", c.commTimeoutSeconds, 1, 86400);
    if (err.tellp() != 0) return err.str();
    const long long widest = std::max(4LL * c.hidden, static_cast<long long>(c.vocab));
    if (static_cast<long long>(c.batch) * c.seq * widest > std::numeric_limits<int>::max()) {
        err << "--batch " << c.batch << " x --seq " << c.seq << " x max(4 x --hidden, --vocab) = "
            << static_cast<long long>(c.batch) * c.seq * widest
            << " activations is more than this CPU trainer holds; lower one of them";
        return err.str();
    }
    if (c.hidden % c.groups != 0) {
        err << "--groups " << c.groups << " does not divide --hidden " << c.hidden
            << ": choose groups that divide the hidden size";
        return err.str();
    }
    if (!(c.lr > 0.0f && c.lr < 10.0f)) return "--lr must be a positive number below 10";
    if (!(c.weightDecay >= 0.0f && c.weightDecay < 10.0f))
        return "--weight-decay must be a number from 0 to 10";
    if (!(c.waitForClientSeconds >= 0.0 && c.waitForClientSeconds <= 1e6))
        return "--wait-for-client=SECONDS must be a number of seconds from 0 to 1000000";
    if (!(c.lingerSeconds >= 0.0 && c.lingerSeconds <= 1e6))
        return "--linger must be a number of seconds from 0 to 1000000";
    if ((c.waitForClient || c.lingerSeconds > 0.0) && !c.listen)
        return std::string(c.waitForClient ? "--wait-for-client" : "--linger") +
               " waits for a client of the endpoint, which --no-listen turns off; drop one of them";
    if (!c.diverge.empty() && c.diverge != "extra-forward" && c.diverge != "extra-batch" &&
        c.diverge != "gathered" && c.diverge != "raise" && c.diverge != "slow")
        return "--diverge '" + c.diverge +
               "' is not one of extra-forward, extra-batch, gathered, raise, slow";
    if (c.divergeRank < 0 || c.divergeRank >= c.worldSize)
        return "--diverge-rank " + std::to_string(c.divergeRank) + " is not a rank of the " +
               std::to_string(c.worldSize) + " ranks";
    if (c.divergeStep < 0 || c.divergeStep > c.steps)
        return "--diverge-step " + std::to_string(c.divergeStep) + " is not one of the " +
               std::to_string(c.steps) + " steps (0: the last)";
    if (!(c.divergeSeconds >= 0.0 && c.divergeSeconds <= 3600.0))
        return "--diverge-seconds must be a number of seconds from 0 to 3600";
    if (c.backend != "cpu" && c.backend != "nccl" && c.backend != "gloo" && c.backend != "auto")
        return "--backend '" + c.backend + "' is not one of cpu, nccl, gloo, auto";
    return {};
}

} // namespace shardscope::nn

#include "comm/torchrunenv.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "comm/communicator.h"

namespace shardscope::comm {

namespace {

int parseIntVar(const char *name, bool required, int fallback, int minValue)
{
    const char *v = std::getenv(name);
    if (!v || !*v) {
        if (required)
            throw CommError(std::string("a process-per-rank run (--backend nccl or gloo) needs "
                                        "the environment variable ") +
                            name +
                            " (launch with torchrun or scripts/launch, or set RANK, WORLD_SIZE, "
                            "LOCAL_RANK, MASTER_ADDR and MASTER_PORT for every process)");
        return fallback;
    }
    char *end = nullptr;
    errno = 0;
    const long x = std::strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < minValue || x > 1000000)
        throw CommError(
            std::string("environment variable ") + name + "='" + v +
            "' is not a valid number (expected an integer >= " + std::to_string(minValue) + ")");
    return static_cast<int>(x);
}

} // namespace

bool launchedPerRank()
{
    const char *rank = std::getenv("RANK");
    const char *world = std::getenv("WORLD_SIZE");
    return rank && *rank && world && *world;
}

RendezvousConfig rendezvousFromEnv()
{
    RendezvousConfig c;
    c.rank = parseIntVar("RANK", true, 0, 0);
    c.worldSize = parseIntVar("WORLD_SIZE", true, 1, 1);
    c.localRank = parseIntVar("LOCAL_RANK", false, c.rank, 0);
    if (c.rank >= c.worldSize)
        throw CommError("RANK=" + std::to_string(c.rank) + " is not below WORLD_SIZE=" +
                        std::to_string(c.worldSize) + "; ranks count from 0");
    const char *addr = std::getenv("MASTER_ADDR");
    if (c.worldSize > 1 && (!addr || !*addr))
        throw CommError("a process-per-rank run needs MASTER_ADDR (the host of rank 0) when "
                        "WORLD_SIZE > 1");
    if (addr && *addr) c.masterAddr = addr;
    c.masterPort = parseIntVar("MASTER_PORT", c.worldSize > 1, 29500, 1);
    if (c.masterPort > 65535)
        throw CommError("MASTER_PORT=" + std::to_string(c.masterPort) + " is not a TCP port");
    c.timeout = std::chrono::seconds(parseIntVar("SHARDSCOPE_RENDEZVOUS_TIMEOUT_S", false, 60, 1));
    return c;
}

} // namespace shardscope::comm

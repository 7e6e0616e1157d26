// all_gather throughput of the gloo backend (TCP over loopback, a communicator per rank as
// separate processes would have, here threads of one process) against the threads backend
// (shared memory), same sizes and ranks. Prints a Markdown table for docs/performance.md.
//
// Usage: bench_gloogather [--reps 5]   (world sizes 2 and 4, 64 KiB to 16 MiB gathered)

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "benchutil.h"
#include "comm/cpucommunicator.h"
#include "comm/gloocommunicator.h"

using namespace shardscope;
using namespace shardscope::bench;

namespace {

int freePort()
{
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len);
    ::close(fd);
    return ntohs(addr.sin_port);
}

std::vector<std::unique_ptr<comm::Communicator>> glooWorld(int world)
{
    const int port = freePort();
    std::vector<std::unique_ptr<comm::Communicator>> comms(static_cast<std::size_t>(world));
    std::vector<std::thread> threads;
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
            comm::GlooOptions o;
            o.rendezvous.rank = r;
            o.rendezvous.worldSize = world;
            o.rendezvous.masterAddr = "127.0.0.1";
            o.rendezvous.masterPort = port;
            try {
                comms[static_cast<std::size_t>(r)] = comm::makeGlooCommunicator(o);
            } catch (const std::exception &e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    for (auto &t : threads)
        t.join();
    for (const auto &e : errors)
        if (!e.empty()) throw std::runtime_error(e);
    return comms;
}

// Aggregate GB/s (bytes landing in all receive buffers per second) of `rounds` all_gathers
// of `total` gathered bytes, one sample per repetition.
std::vector<double> measure(std::vector<std::unique_ptr<comm::Communicator>> &comms,
                            std::size_t total, int reps)
{
    const int world = static_cast<int>(comms.size());
    const std::size_t bytes = total / static_cast<std::size_t>(world);
    const int rounds = std::max(2, static_cast<int>((std::size_t(256) << 20) / (total * world)));
    std::vector<double> gbps;
    std::vector<char> wrong(comms.size(), 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
            comm::Communicator &c = *comms[static_cast<std::size_t>(r)];
            std::vector<char> send(bytes, static_cast<char>(r + 1)), recv(total);
            c.allGather(send.data(), recv.data(), bytes); // warm-up
            for (int rep = 0; rep < reps; ++rep) {
                c.barrier();
                const auto t0 = Clock::now();
                for (int i = 0; i < rounds; ++i)
                    c.allGather(send.data(), recv.data(), bytes);
                c.barrier();
                const double sec = secondsSince(t0);
                if (r == 0) gbps.push_back(double(total) * world * rounds / sec / 1e9);
            }
            wrong[static_cast<std::size_t>(r)] = recv[total - 1] != static_cast<char>(world);
        });
    for (auto &t : threads)
        t.join();
    for (char w : wrong)
        if (w) throw std::runtime_error("all_gather produced wrong data");
    return gbps;
}

} // namespace

int main(int argc, char **argv)
{
    const int reps = parseReps(argc, argv, "bench_gloogather", 5);
    std::printf("all_gather, gloo over loopback TCP vs threads in shared memory: aggregate GB/s "
                "over all ranks; %s; median (min-max) of %d reps\n\n",
                machine().c_str(), reps);
    std::printf("| ranks | gathered per rank | gloo GB/s | threads GB/s | gloo / threads |\n");
    std::printf("|---:|---:|---:|---:|---:|\n");
    for (int world : {2, 4}) {
        auto gloo = glooWorld(world);
        auto cpu = comm::makeCpuWorld(world);
        for (std::size_t total = 64 << 10; total <= (std::size_t(16) << 20); total *= 4) {
            const Stats g = stats(measure(gloo, total, reps));
            const Stats t = stats(measure(cpu, total, reps));
            const std::string label = total >= (1u << 20) ? std::to_string(total >> 20) + " MiB"
                                                          : std::to_string(total >> 10) + " KiB";
            std::printf("| %d | %s | %s | %s | %.3f |\n", world, label.c_str(),
                        format(g, 3).c_str(), format(t, 2).c_str(), g.median / t.median);
            std::fflush(stdout);
        }
    }
    return 0;
}

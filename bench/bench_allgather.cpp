// CPU all_gather throughput against the machine's limit: a plain memcpy of the same
// bytes by the same number of threads, with the same two barriers per round, measured
// side by side and repeated. Prints a Markdown table for docs/performance.md.
//
// Usage: bench_allgather [--ranks 4,8] [--min-kib 4] [--max-mib 256] [--reps 5]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/cpucommunicator.h"

using namespace shardscope;

namespace {

using Clock = std::chrono::steady_clock;

struct Options
{
    std::vector<int> ranks = {4, 8};
    std::size_t minBytes = 4 << 10;
    std::size_t maxBytes = std::size_t(256) << 20;
    int reps = 5;
};

struct FreeDeleter
{
    void operator()(std::byte *p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte[], FreeDeleter>;

// Page-aligned and pre-faulted by the calling thread, so no timed round takes a page fault.
Buffer allocate(std::size_t bytes, int fill)
{
    const std::size_t rounded = std::max<std::size_t>(4096, (bytes + 4095) / 4096 * 4096);
    Buffer b(static_cast<std::byte *>(std::aligned_alloc(4096, rounded)));
    if (!b)
        throw std::runtime_error("out of memory allocating " + std::to_string(rounded) + " bytes");
    std::memset(b.get(), fill, rounded);
    return b;
}

enum class Method
{
    AllGather,
    Memcpy
};

struct Sample
{
    std::vector<double> gbps[2]; // per method: aggregate GB/s of each repetition
};

std::string sizeLabel(std::size_t bytes)
{
    if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
    return std::to_string(bytes >> 10) + " KiB";
}

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Rounds per repetition: about 512 MiB moved by all ranks together, at least 1.
int roundsFor(int world, std::size_t total)
{
    const double perRound = static_cast<double>(world) * static_cast<double>(total);
    return static_cast<int>(std::clamp(512.0 * (1 << 20) / perRound, 1.0, 2000.0));
}

// Runs every size for one world size; each rank is a thread, rank 0 keeps the clock.
std::vector<Sample> runWorld(int world, const std::vector<std::size_t> &sizes, int reps)
{
    auto comms = comm::makeCpuWorld(world);
    std::vector<Sample> samples(sizes.size());
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
        threads.emplace_back([&, r] {
            comm::Communicator &c = *comms[static_cast<std::size_t>(r)];
            try {
                for (std::size_t s = 0; s < sizes.size(); ++s) {
                    const std::size_t total = sizes[s];
                    const std::size_t bytes = total / static_cast<std::size_t>(world);
                    Buffer send = allocate(bytes, r + 1);
                    Buffer recv = allocate(total, 0);
                    Buffer copy = allocate(total, 0);
                    const int rounds = roundsFor(world, total);
                    auto once = [&](Method m) {
                        if (m == Method::AllGather) {
                            c.allGather(send.get(), recv.get(), bytes);
                        } else {
                            c.barrier();
                            std::memcpy(copy.get(), recv.get(),
                                        bytes * static_cast<std::size_t>(world));
                            c.barrier();
                        }
                    };
                    // One untimed round of each warms caches and checks the result.
                    once(Method::AllGather);
                    once(Method::Memcpy);
                    for (int j = 0; j < world; ++j)
                        if (bytes && recv[static_cast<std::size_t>(j) * bytes + bytes - 1] !=
                                         std::byte(j + 1))
                            throw std::runtime_error("all_gather produced wrong data");
                    for (int rep = 0; rep < reps; ++rep) {
                        for (int k = 0; k < 2; ++k) {
                            // Alternate which method goes first, so neither always runs warm.
                            const Method m = (rep + k) % 2 ? Method::Memcpy : Method::AllGather;
                            c.barrier();
                            const auto t0 = Clock::now();
                            for (int i = 0; i < rounds; ++i)
                                once(m);
                            c.barrier();
                            const double sec =
                                std::chrono::duration<double>(Clock::now() - t0).count();
                            if (r == 0) {
                                const double moved =
                                    static_cast<double>(bytes) * world * world * rounds;
                                samples[s].gbps[static_cast<int>(m)].push_back(moved / sec / 1e9);
                            }
                        }
                    }
                }
            } catch (const std::exception &e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    }
    for (auto &t : threads)
        t.join();
    for (const auto &e : errors)
        if (!e.empty()) throw std::runtime_error(e);
    return samples;
}

Options parse(int argc, char **argv)
{
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 >= argc) throw std::invalid_argument("missing value after " + a);
        const std::string v = argv[++i];
        if (a == "--ranks") {
            o.ranks.clear();
            for (std::size_t p = 0; p < v.size();) {
                const std::size_t q = v.find(',', p);
                o.ranks.push_back(std::stoi(v.substr(p, q - p)));
                p = q == std::string::npos ? v.size() : q + 1;
            }
        } else if (a == "--min-kib") {
            o.minBytes = std::stoul(v) << 10;
        } else if (a == "--max-mib") {
            o.maxBytes = std::stoul(v) << 20;
        } else if (a == "--reps") {
            o.reps = std::max(1, std::stoi(v));
        } else {
            throw std::invalid_argument("unknown option " + a);
        }
    }
    return o;
}

} // namespace

int main(int argc, char **argv)
{
    Options opt;
    try {
        opt = parse(argc, argv);
    } catch (const std::exception &e) {
        std::fprintf(stderr,
                     "bench_allgather: %s\nusage: bench_allgather [--ranks 4,8] [--min-kib 4] "
                     "[--max-mib 256] [--reps 5]\n",
                     e.what());
        return 2;
    }
    std::vector<std::size_t> sizes;
    for (std::size_t s = opt.minBytes; s <= opt.maxBytes; s *= 4)
        sizes.push_back(s);

    std::printf("CPU all_gather vs memcpy: aggregate GB/s over all ranks (bytes landing in the "
                "receive buffers per second); %u hardware threads; median (min-max) of %d reps\n\n",
                std::thread::hardware_concurrency(), opt.reps);
    std::printf("| ranks | gathered per rank | all_gather GB/s | memcpy GB/s | ratio |\n");
    std::printf("|---:|---:|---:|---:|---:|\n");
    std::fflush(stdout);
    for (int world : opt.ranks) {
        if (world < 1) {
            std::fprintf(stderr, "bench_allgather: --ranks needs positive rank counts\n");
            return 2;
        }
        std::vector<std::size_t> usable;
        for (std::size_t s : sizes)
            if (s % static_cast<std::size_t>(world) == 0) usable.push_back(s);
        try {
            const auto samples = runWorld(world, usable, opt.reps);
            for (std::size_t i = 0; i < usable.size(); ++i) {
                const auto &ag = samples[i].gbps[0];
                const auto &mc = samples[i].gbps[1];
                const auto [agMin, agMax] = std::minmax_element(ag.begin(), ag.end());
                const auto [mcMin, mcMax] = std::minmax_element(mc.begin(), mc.end());
                std::printf("| %d | %s | %.2f (%.2f-%.2f) | %.2f (%.2f-%.2f) | %.2f |\n", world,
                            sizeLabel(usable[i]).c_str(), median(ag), *agMin, *agMax, median(mc),
                            *mcMin, *mcMax, median(ag) / median(mc));
            }
            std::fflush(stdout);
        } catch (const std::exception &e) {
            std::fprintf(stderr, "bench_allgather: %d ranks: %s\n", world, e.what());
            return 1;
        }
    }
    return 0;
}

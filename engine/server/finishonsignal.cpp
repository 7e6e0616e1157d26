#include "server/finishonsignal.h"

#include <array>
#include <csignal>
#include <cstdio>
#include <exception>
#include <fcntl.h>
#include <mutex>
#include <pthread.h>
#include <thread>
#include <unistd.h>

#include "server/inspector.h"

namespace shardscope::server {

namespace {

// Process-wide: one set of handlers, one pipe, one thread (started on first use, kept).
std::mutex g_mutex;
Inspector *g_inspector = nullptr;
std::string g_who;
int g_pipe[2] = {-1, -1};
std::array<struct sigaction, 65> g_previous{};
std::array<bool, 65> g_installed{};

void onSignal(int sig)
{
    const int saved = errno;
    const char c = static_cast<char>(sig);
    [[maybe_unused]] const ssize_t w = ::write(g_pipe[1], &c, 1);
    errno = saved;
}

const char *signalWord(int sig)
{
    switch (sig) {
    case SIGTERM:
        return "terminated (SIGTERM)";
    case SIGINT:
        return "interrupted (SIGINT)";
    case SIGHUP:
        return "hung up (SIGHUP)";
    default:
        return "stopped by a signal";
    }
}

void watch()
{
    for (;;) {
        char c = 0;
        const ssize_t n = ::read(g_pipe[0], &c, 1);
        if (n != 1) {
            if (n < 0 && errno == EINTR) continue;
            return;
        }
        const int sig = c;
        {
            const std::lock_guard lock(g_mutex);
            if (g_inspector) {
                std::fprintf(stderr, "%s: %s; finishing the inspector\n", g_who.c_str(),
                             signalWord(sig));
                try {
                    g_inspector->finish(std::string("training stopped: ") + signalWord(sig));
                } catch (const std::exception &e) {
                    std::fprintf(stderr, "%s: %s\n", g_who.c_str(), e.what());
                }
                g_inspector = nullptr;
            }
            // Then as without us: the disposition found at install (the default: the process
            // dies of the signal).
            if (sig > 0 && sig < int(g_previous.size()) && g_installed[std::size_t(sig)]) {
                ::sigaction(sig, &g_previous[std::size_t(sig)], nullptr);
                g_installed[std::size_t(sig)] = false;
            } else {
                std::signal(sig, SIG_DFL);
            }
        }
        std::fflush(stdout);
        std::fflush(stderr);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
        ::raise(sig);
    }
}

} // namespace

FinishOnSignal::FinishOnSignal(Inspector &inspector, std::string who, std::vector<int> signals)
    : m_signals(std::move(signals))
{
    const std::lock_guard lock(g_mutex);
    g_inspector = &inspector;
    g_who = std::move(who);
    if (g_pipe[0] < 0) {
        if (::pipe2(g_pipe, O_CLOEXEC) != 0) return; // then the signals keep their dispositions
        // The thread runs with every signal blocked: the handlers run in the others.
        sigset_t all, old;
        sigfillset(&all);
        ::pthread_sigmask(SIG_SETMASK, &all, &old);
        std::thread(watch).detach();
        ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
    for (const int sig : m_signals) {
        if (sig <= 0 || sig >= int(g_previous.size()) || g_installed[std::size_t(sig)]) continue;
        struct sigaction sa
        {
        };
        sa.sa_handler = onSignal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        if (::sigaction(sig, &sa, &g_previous[std::size_t(sig)]) == 0)
            g_installed[std::size_t(sig)] = true;
    }
}

FinishOnSignal::~FinishOnSignal()
{
    const std::lock_guard lock(g_mutex);
    g_inspector = nullptr;
    for (const int sig : m_signals) {
        if (sig <= 0 || sig >= int(g_previous.size()) || !g_installed[std::size_t(sig)]) continue;
        struct sigaction now
        {
        };
        // Restored only while ours is installed: a handler set since then stays.
        if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler == onSignal)
            ::sigaction(sig, &g_previous[std::size_t(sig)], nullptr);
        g_installed[std::size_t(sig)] = false;
    }
}

} // namespace shardscope::server

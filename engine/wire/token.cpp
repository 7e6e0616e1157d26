#include "wire/token.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace shardscope::wire {

namespace {

constexpr std::size_t kMaxTokenFileBytes = 4096;

std::string_view trimmed(std::string_view s)
{
    const auto first = s.find_first_not_of(" \t\r\n");
    if (first == std::string_view::npos) return {};
    const auto last = s.find_last_not_of(" \t\r\n");
    return s.substr(first, last - first + 1);
}

} // namespace

Result<std::string> readTokenFile(const std::string &path)
{
    // O_NONBLOCK: a FIFO in place of the file must not hang the caller.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fail("cannot read the token file " + path + ": " + std::strerror(errno));
    struct stat st
    {
    };
    std::string problem;
    if (::fstat(fd, &st) != 0)
        problem = std::strerror(errno);
    else if (!S_ISREG(st.st_mode))
        problem = "not a regular file";
    else if (st.st_uid != ::getuid())
        problem = "it belongs to another user; use a token file of your own";
    else if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
        problem = "other users can read it; run chmod 600 " + path;
    else if (static_cast<std::uint64_t>(st.st_size) > kMaxTokenFileBytes)
        problem = "larger than " + std::to_string(kMaxTokenFileBytes) + " bytes";
    if (!problem.empty()) {
        ::close(fd);
        return fail("refusing the token file " + path + ": " + problem);
    }
    std::string text(kMaxTokenFileBytes, '\0');
    std::size_t got = 0;
    while (got < text.size()) {
        const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const std::string reason = std::strerror(errno);
            ::close(fd);
            return fail("cannot read the token file " + path + ": " + reason);
        }
        if (n == 0) break;
        got += static_cast<std::size_t>(n);
    }
    ::close(fd);
    text.resize(got);
    const std::string_view firstLine = std::string_view(text).substr(0, text.find('\n'));
    const std::string_view token = trimmed(firstLine);
    if (token.empty()) return fail("the token file " + path + " is empty");
    return std::string(token);
}

Result<std::string> resolveToken(std::string_view flagValue, std::string_view tokenFile)
{
    if (!flagValue.empty() && !tokenFile.empty())
        return fail("give either --token or --token-file, not both");
    if (!flagValue.empty()) return std::string(flagValue);
    if (!tokenFile.empty()) return readTokenFile(std::string(tokenFile));
    if (const char *env = std::getenv(kTokenEnv); env && *env) return std::string(env);
    if (const char *file = std::getenv(kTokenFileEnv); file && *file) {
        auto token = readTokenFile(file);
        if (!token) return fail(token.error() + " (named by " + kTokenFileEnv + ")");
        return token;
    }
    return std::string();
}

} // namespace shardscope::wire

#include "wire/atomicfile.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace shardscope::wire {

namespace {

// The directory a file of this path is created in.
std::string directoryOf(const std::string &path)
{
    const auto slash = path.rfind('/');
    return slash == std::string::npos ? std::string(".") : path.substr(0, slash == 0 ? 1 : slash);
}

Status writeAll(int fd, std::string_view contents, const std::string &path)
{
    std::size_t done = 0;
    while (done < contents.size()) {
        const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return fail("cannot write " + path + ": " + std::strerror(errno));
        done += static_cast<std::size_t>(n);
    }
    return success();
}

// A FIFO, a character device (/dev/null, /dev/stdout's terminal) or a socket is written
// into, never replaced: a rename over it would put a regular file in its place (as root,
// over /dev/null). A FIFO without a reader is an error rather than a wait.
Status writeIntoSpecialFile(const std::string &path, std::string_view contents)
{
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        if (errno == ENXIO)
            return fail("cannot write " + path +
                        ": it is a FIFO that no process reads; start its reader first");
        return fail("cannot write " + path + ": " + std::strerror(errno));
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    Status written = writeAll(fd, contents, path);
    ::close(fd);
    return written;
}

} // namespace

Status checkOutputFile(const std::string &path)
{
    if (path.empty()) return fail("the output file's name is empty");
    struct stat st
    {
    };
    if (::stat(path.c_str(), &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return fail("cannot write " + path + ": it is a directory; name a file in it");
        if (!S_ISREG(st.st_mode)) {
            // Written into at the end; only whether we may open it for writing is checked
            // (a FIFO's reader may come later).
            if (::access(path.c_str(), W_OK) != 0)
                return fail("cannot write " + path + ": " + std::strerror(errno));
            return success();
        }
    }
    // A regular file is replaced by a rename from its directory: that directory must exist
    // and take a new file (not /proc, /sys, a read-only mount, another user's directory).
    const std::string dir = directoryOf(path);
    struct stat dst
    {
    };
    if (::stat(dir.c_str(), &dst) != 0)
        return fail("cannot write " + path + ": its directory " + dir + " " +
                    (errno == ENOENT ? std::string("does not exist; create it first")
                                     : std::string(std::strerror(errno))));
    if (!S_ISDIR(dst.st_mode))
        return fail("cannot write " + path + ": " + dir + " is not a directory");
    int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) {
        const std::string probe = path + ".probe." + std::to_string(::getpid());
        fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0)
            return fail("cannot write " + path + ": cannot create a file in " + dir + ": " +
                        std::strerror(errno));
        ::unlink(probe.c_str());
    }
    ::close(fd);
    return success();
}

Status writeFileAtomically(const std::string &path, std::string_view contents)
{
    struct stat st
    {
    };
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode))
            return fail("cannot write " + path + ": it is a directory; name a file in it");
        return writeIntoSpecialFile(path, contents);
    }
    // The contents go to an unnamed file in the target's directory (O_TMPFILE), which
    // disappears with a writer killed half-way; it gets a name only once complete, for the
    // moment of the rename. File systems without O_TMPFILE get a named FILE.tmp.PID.
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    const std::string dir = directoryOf(path);
    int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
    const bool unnamed = fd >= 0;
    if (!unnamed) fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return fail("cannot write " + path + ": " + std::strerror(errno));
    bool named = !unnamed;
    auto failWith = [&](const char *what) {
        const std::string reason = std::strerror(errno);
        if (fd >= 0) ::close(fd);
        if (named) ::unlink(tmp.c_str());
        return fail(std::string("cannot ") + what + " " + path + ": " + reason);
    };
    std::size_t done = 0;
    while (done < contents.size()) {
        const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return failWith("write");
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0) return failWith("write");
    if (unnamed) {
        const std::string self = "/proc/self/fd/" + std::to_string(fd);
        ::unlink(tmp.c_str()); // left by an earlier writer with our pid
        if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) != 0)
            return failWith("write");
        named = true;
    }
    ::close(fd);
    fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0) return failWith("replace");
    return success();
}

} // namespace shardscope::wire

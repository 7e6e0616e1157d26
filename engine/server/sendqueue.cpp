#include "server/sendqueue.h"

#include <algorithm>
#include <cerrno>
#include <sys/socket.h>
#include <sys/uio.h>

namespace shardscope::server {

namespace {

// Small frames share a chunk up to this size, so a burst of event batches is one write.
constexpr std::size_t kMaxOwnChunk = 256u << 10;
// Chunks handed to one sendmsg().
constexpr std::size_t kMaxIov = 64;

} // namespace

std::string &SendQueue::ownTail()
{
    if (m_chunks.empty() || m_chunks.back().shared || m_chunks.back().own.size() >= kMaxOwnChunk)
        m_chunks.emplace_back();
    return m_chunks.back().own;
}

void SendQueue::append(wire::MessageType type, std::string_view payload)
{
    wire::appendFrame(ownTail(), type, payload);
    m_size += wire::kFrameHeaderSize + payload.size();
}

void SendQueue::append(wire::MessageType type, std::shared_ptr<const std::string> payload)
{
    wire::appendFrameHeader(ownTail(), type, payload->size());
    m_size += wire::kFrameHeaderSize + payload->size();
    if (payload->empty()) return;
    Chunk c;
    c.shared = std::move(payload);
    m_chunks.push_back(std::move(c));
}

void SendQueue::appendFrames(std::string_view frames)
{
    ownTail().append(frames);
    m_size += frames.size();
}

void SendQueue::clear()
{
    m_chunks.clear();
    m_size = 0;
}

SendQueue::Sent SendQueue::sendTo(int fd)
{
    iovec iov[kMaxIov];
    while (!m_chunks.empty()) {
        std::size_t n = 0;
        for (auto it = m_chunks.begin(); it != m_chunks.end() && n < kMaxIov; ++it, ++n) {
            const std::string_view rest = it->rest();
            iov[n].iov_base = const_cast<char *>(rest.data());
            iov[n].iov_len = rest.size();
        }
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = n;
        const ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0 && errno == EINTR) continue;
        if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Sent::WouldBlock;
        if (sent <= 0) {
            clear();
            return Sent::Closed;
        }
        auto left = static_cast<std::size_t>(sent);
        m_size -= left;
        while (left > 0) {
            Chunk &front = m_chunks.front();
            const std::size_t take = std::min(left, front.rest().size());
            front.pos += take;
            left -= take;
            if (front.rest().empty()) m_chunks.pop_front();
        }
    }
    return Sent::All;
}

} // namespace shardscope::server

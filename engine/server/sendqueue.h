#pragma once
// The bytes a server still has to write to one client, in order. A State frame's payload
// (tens of megabytes for a large model) is shared by every client it goes to and written
// from where it lies: never copied into the queue, never moved as the queue drains.

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <string_view>

#include "wire/frame.h"

namespace shardscope::server {

class SendQueue
{
  public:
    // Appends a frame; the payload is copied, so keep this for small messages.
    void append(wire::MessageType type, std::string_view payload);
    // Appends a frame whose payload stays where it is until it has been written.
    void append(wire::MessageType type, std::shared_ptr<const std::string> payload);
    // Appends bytes that already are whole frames.
    void appendFrames(std::string_view frames);

    std::size_t size() const { return m_size; }
    bool empty() const { return m_size == 0; }
    void clear();

    enum class Sent
    {
        All,        // the queue is empty
        WouldBlock, // the socket takes no more now; wait for POLLOUT
        Closed      // the peer is gone; the queue was cleared
    };
    // Writes as much as the non-blocking socket fd takes.
    Sent sendTo(int fd);

  private:
    struct Chunk
    {
        std::shared_ptr<const std::string> shared; // set: the bytes are *shared
        std::string own;                           // otherwise: the bytes
        std::size_t pos = 0;                       // written so far

        std::string_view rest() const
        {
            const std::string &s = shared ? *shared : own;
            return std::string_view(s).substr(pos);
        }
    };
    std::string &ownTail();

    std::deque<Chunk> m_chunks;
    std::size_t m_size = 0;
};

} // namespace shardscope::server

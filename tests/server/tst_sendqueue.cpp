#include <QtTest>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "server/sendqueue.h"
#include "wire/frame.h"

using namespace shardscope;
using server::SendQueue;

class TestSendQueue : public QObject
{
    Q_OBJECT
  private slots:
    void framesArriveInOrderThroughAFullSocket();
    void aSharedPayloadIsReleasedOnceWritten();
    void aClosedPeerClearsTheQueue();
};

namespace {

struct SocketPair
{
    int fds[2] = {-1, -1};
    SocketPair()
    {
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
        for (int fd : fds)
            ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
    }
    ~SocketPair()
    {
        for (int fd : fds)
            if (fd >= 0) ::close(fd);
    }
    bool ok() const { return fds[0] >= 0; }
};

// Reads what is there into the decoder; returns the frames completed.
std::vector<wire::Frame> drain(int fd, wire::FrameDecoder &decoder)
{
    std::vector<wire::Frame> frames;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) break;
        decoder.feed(buf, static_cast<std::size_t>(n));
    }
    for (;;) {
        auto f = decoder.next();
        if (!f || !f->has_value()) break;
        frames.push_back(std::move(**f));
    }
    return frames;
}

std::string pattern(std::size_t size)
{
    std::string s(size, '\0');
    for (std::size_t i = 0; i < size; ++i)
        s[i] = char('a' + (i * 31) % 26);
    return s;
}

} // namespace

// A State larger than the socket takes at once, between small frames: the queue writes
// what the socket takes, says when it would block, and the reader gets every frame whole
// and in order.
void TestSendQueue::framesArriveInOrderThroughAFullSocket()
{
    SocketPair sp;
    QVERIFY(sp.ok());
    const auto state = std::make_shared<const std::string>(pattern(8u << 20));
    SendQueue q;
    q.append(wire::MessageType::Welcome, "{\"w\":1}");
    q.append(wire::MessageType::State, state);
    q.append(wire::MessageType::HistoryBegin, std::string(8, '\0'));
    q.appendFrames(wire::encodeFrame(wire::MessageType::HistoryEnd, ""));
    QCOMPARE(q.size(), 4 * wire::kFrameHeaderSize + 7 + state->size() + 8);

    wire::FrameDecoder decoder;
    std::vector<wire::Frame> frames;
    bool blocked = false;
    for (int round = 0; round < 100000 && !q.empty(); ++round) {
        const SendQueue::Sent r = q.sendTo(sp.fds[0]);
        QVERIFY(r != SendQueue::Sent::Closed);
        blocked = blocked || r == SendQueue::Sent::WouldBlock;
        for (wire::Frame &f : drain(sp.fds[1], decoder))
            frames.push_back(std::move(f));
    }
    QVERIFY(q.empty());
    QVERIFY2(blocked, "the State should not fit into the socket at once");
    for (wire::Frame &f : drain(sp.fds[1], decoder))
        frames.push_back(std::move(f));
    QCOMPARE(frames.size(), std::size_t(4));
    QCOMPARE(frames[0].type, wire::MessageType::Welcome);
    QCOMPARE(frames[0].payload, std::string("{\"w\":1}"));
    QCOMPARE(frames[1].type, wire::MessageType::State);
    QVERIFY(frames[1].payload == *state);
    QCOMPARE(frames[2].type, wire::MessageType::HistoryBegin);
    QCOMPARE(frames[3].type, wire::MessageType::HistoryEnd);
    QCOMPARE(decoder.buffered(), std::size_t(0));
}

// One State goes to many clients without a copy each; the queue lets go of it once sent.
void TestSendQueue::aSharedPayloadIsReleasedOnceWritten()
{
    SocketPair sp;
    QVERIFY(sp.ok());
    auto state = std::make_shared<const std::string>(pattern(1000));
    SendQueue q;
    q.append(wire::MessageType::State, state);
    QCOMPARE(state.use_count(), 2L);
    QCOMPARE(q.sendTo(sp.fds[0]), SendQueue::Sent::All);
    QCOMPARE(state.use_count(), 1L);
    wire::FrameDecoder decoder;
    const std::vector<wire::Frame> frames = drain(sp.fds[1], decoder);
    QCOMPARE(frames.size(), std::size_t(1));
    QVERIFY(frames[0].payload == *state);
}

void TestSendQueue::aClosedPeerClearsTheQueue()
{
    SocketPair sp;
    QVERIFY(sp.ok());
    ::close(sp.fds[1]);
    sp.fds[1] = -1;
    SendQueue q;
    q.append(wire::MessageType::Welcome, "{}");
    QCOMPARE(q.sendTo(sp.fds[0]), SendQueue::Sent::Closed);
    QVERIFY(q.empty());
}

QTEST_GUILESS_MAIN(TestSendQueue)
#include "tst_sendqueue.moc"

// The torchrun-style rendezvous that hands rank 0's ncclUniqueId to the other ranks:
// runs on any machine (threads stand in for processes), including its failure modes.

#include <QtTest>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/tcprendezvous.h"

using namespace shardscope;

namespace {

std::vector<std::byte> blobOf(const std::string &s)
{
    std::vector<std::byte> b(s.size());
    for (std::size_t i = 0; i < s.size(); ++i)
        b[i] = static_cast<std::byte>(s[i]);
    return b;
}

comm::RendezvousConfig configFor(int rank, int world, int port, int timeoutMs)
{
    comm::RendezvousConfig c;
    c.rank = rank;
    c.worldSize = world;
    c.localRank = rank;
    c.masterAddr = "127.0.0.1";
    c.masterPort = port;
    c.timeout = std::chrono::milliseconds(timeoutMs);
    return c;
}

// A port that nothing listens on: bound by a server that is then destroyed.
int closedPort()
{
    comm::RendezvousServer s(configFor(0, 1, 0, 1000), {});
    return s.port();
}

class EnvGuard
{
  public:
    explicit EnvGuard(std::vector<std::pair<const char *, const char *>> vars)
    {
        for (const char *name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                 "SHARDSCOPE_RENDEZVOUS_TIMEOUT_S"}) {
            const char *old = std::getenv(name);
            m_saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
            unsetenv(name);
        }
        for (auto &[k, v] : vars)
            setenv(k, v, 1);
    }
    ~EnvGuard()
    {
        for (auto &[k, v] : m_saved) {
            if (v)
                setenv(k, v->c_str(), 1);
            else
                unsetenv(k);
        }
    }

  private:
    std::vector<std::pair<const char *, std::optional<std::string>>> m_saved;
};

} // namespace

class TestTcpRendezvous : public QObject
{
    Q_OBJECT

  private slots:
    void everyRankGetsRankZerosBlob_data()
    {
        QTest::addColumn<int>("world");
        QTest::newRow("2") << 2;
        QTest::newRow("5") << 5;
    }

    void everyRankGetsRankZerosBlob()
    {
        QFETCH(int, world);
        std::string payload(128, '\0');
        for (std::size_t i = 0; i < payload.size(); ++i)
            payload[i] = static_cast<char>(i * 7 + 3);
        comm::RendezvousServer server(configFor(0, world, 0, 20000), blobOf(payload));
        QVERIFY(server.port() > 0);
        std::vector<std::vector<std::byte>> got(static_cast<std::size_t>(world));
        std::vector<std::string> errors(static_cast<std::size_t>(world));
        std::vector<std::thread> ranks;
        for (int r = 1; r < world; ++r)
            ranks.emplace_back([&, r] {
                try {
                    got[static_cast<std::size_t>(r)] =
                        comm::fetchRendezvousBlob(configFor(r, world, server.port(), 20000));
                } catch (const std::exception &e) {
                    errors[static_cast<std::size_t>(r)] = e.what();
                }
            });
        for (auto &t : ranks)
            t.join();
        server.wait();
        for (int r = 1; r < world; ++r) {
            QVERIFY2(errors[static_cast<std::size_t>(r)].empty(),
                     errors[static_cast<std::size_t>(r)].c_str());
            QVERIFY(got[static_cast<std::size_t>(r)] == blobOf(payload));
        }
    }

    void clientStartedFirstRetriesUntilRankZeroListens()
    {
        const int port = closedPort();
        std::vector<std::byte> got;
        std::string error;
        std::thread client([&] {
            try {
                got = comm::fetchRendezvousBlob(configFor(1, 2, port, 20000));
            } catch (const std::exception &e) {
                error = e.what();
            }
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        comm::RendezvousServer server(configFor(0, 2, port, 20000), blobOf("late rank zero"));
        client.join();
        server.wait();
        QVERIFY2(error.empty(), error.c_str());
        QVERIFY(got == blobOf("late rank zero"));
    }

    void unreachableRankZeroTimesOutWithAClearMessage()
    {
        const int port = closedPort();
        try {
            comm::fetchRendezvousBlob(configFor(3, 4, port, 400));
            QFAIL("fetching from a rank 0 that does not exist must fail");
        } catch (const comm::CommError &e) {
            const std::string msg = e.what();
            QVERIFY2(msg.find("rank 3 of 4") != std::string::npos, e.what());
            QVERIFY2(msg.find("127.0.0.1:" + std::to_string(port)) != std::string::npos, e.what());
            QVERIFY2(msg.find("400 ms") != std::string::npos, e.what());
            QVERIFY2(msg.find("MASTER_ADDR/MASTER_PORT") != std::string::npos, e.what());
        }
    }

    void aRankOfAnotherWorldIsRefused()
    {
        comm::RendezvousServer server(configFor(0, 2, 0, 2000), blobOf("id"));
        try {
            comm::fetchRendezvousBlob(configFor(1, 3, server.port(), 2000));
            QFAIL("a rank with a different WORLD_SIZE must be refused");
        } catch (const comm::CommError &e) {
            QVERIFY2(std::string(e.what()).find("WORLD_SIZE=3") != std::string::npos, e.what());
            QVERIFY2(std::string(e.what()).find("WORLD_SIZE=2") != std::string::npos, e.what());
        }
        QVERIFY_THROWS_EXCEPTION(comm::CommError, server.wait());
    }

    void rankZeroTimesOutWhenRanksAreMissing()
    {
        comm::RendezvousServer server(configFor(0, 3, 0, 300), blobOf("id"));
        try {
            server.wait();
            QFAIL("rank 0 must give up when the other ranks never come");
        } catch (const comm::CommError &e) {
            QVERIFY2(std::string(e.what()).find("0 of 2 other ranks") != std::string::npos,
                     e.what());
        }
    }

    void environmentIsReadAsTorchrunSetsIt()
    {
        EnvGuard env({{"RANK", "2"},
                      {"WORLD_SIZE", "4"},
                      {"LOCAL_RANK", "0"},
                      {"MASTER_ADDR", "node0"},
                      {"MASTER_PORT", "29501"},
                      {"SHARDSCOPE_RENDEZVOUS_TIMEOUT_S", "7"}});
        const comm::RendezvousConfig c = comm::rendezvousFromEnv();
        QCOMPARE(c.rank, 2);
        QCOMPARE(c.worldSize, 4);
        QCOMPARE(c.localRank, 0);
        QCOMPARE(c.masterAddr, std::string("node0"));
        QCOMPARE(c.masterPort, 29501);
        QCOMPARE(c.timeout.count(), 7000);
    }

    void badEnvironmentNamesTheVariable_data()
    {
        QTest::addColumn<QString>("rank");
        QTest::addColumn<QString>("world");
        QTest::addColumn<QString>("port");
        QTest::addColumn<QString>("named");
        QTest::newRow("no RANK") << ""
                                 << "2"
                                 << "29500"
                                 << "RANK";
        QTest::newRow("RANK not a number") << "one"
                                           << "2"
                                           << "29500"
                                           << "RANK='one'";
        QTest::newRow("RANK too big") << "2"
                                      << "2"
                                      << "29500"
                                      << "RANK=2 is not below WORLD_SIZE=2";
        QTest::newRow("no MASTER_PORT") << "1"
                                        << "2"
                                        << ""
                                        << "MASTER_PORT";
        QTest::newRow("port out of range") << "1"
                                           << "2"
                                           << "70000"
                                           << "MASTER_PORT=70000";
    }

    void badEnvironmentNamesTheVariable()
    {
        QFETCH(QString, rank);
        QFETCH(QString, world);
        QFETCH(QString, port);
        QFETCH(QString, named);
        const std::string r = rank.toStdString(), w = world.toStdString(), p = port.toStdString();
        std::vector<std::pair<const char *, const char *>> vars = {{"MASTER_ADDR", "127.0.0.1"}};
        if (!r.empty()) vars.emplace_back("RANK", r.c_str());
        if (!w.empty()) vars.emplace_back("WORLD_SIZE", w.c_str());
        if (!p.empty()) vars.emplace_back("MASTER_PORT", p.c_str());
        EnvGuard env(vars);
        try {
            comm::rendezvousFromEnv();
            QFAIL("a bad environment must be a CommError");
        } catch (const comm::CommError &e) {
            QVERIFY2(std::string(e.what()).find(named.toStdString()) != std::string::npos,
                     e.what());
        }
    }
};

QTEST_GUILESS_MAIN(TestTcpRendezvous)
#include "tst_tcprendezvous.moc"

// Connection: handshake, state, history and live events from a scripted endpoint; a
// dropped connection keeps the data and reconnects, continuing the history without
// duplicates; refusals and garbage give errors, not crashes.

#include <QSignalSpy>
#include <QTest>

#include "fakeengine.h"
#include "session/connection.h"
#include "session/sessionstore.h"
#include "syntheticstate.h"

using namespace shardscope;
using namespace shardscope::test;

class TestConnection : public QObject
{
    Q_OBJECT
  private slots:
    void receivesStateHistoryAndLive();
    void droppedConnectionKeepsDataAndReconnects();
    void wrongTokenIsRefused();
    void garbageFailsCleanly();
    void badEndpointIsRefused();
    void unreachableKeepsRetrying();
};

static std::vector<telemetry::Event> someHistory()
{
    std::vector<telemetry::Event> h;
    for (std::uint64_t i = 0; i < 40; ++i)
        h.push_back(
            eventAt(1000 + i, static_cast<int>(i % 4), telemetry::makeModuleEnter({.module = 3})));
    return h;
}

void TestConnection::receivesStateHistoryAndLive()
{
    FakeEngine engine;
    engine.state = smallState();
    engine.history = someHistory();
    session::SessionStore store;
    session::Connection conn(&store);
    conn.attach(engine.endpoint());
    QTRY_COMPARE(conn.state(), session::Connection::State::Connected);
    QTRY_VERIFY(engine.clientReady());
    QTRY_VERIFY(store.hasState());
    QTRY_COMPARE(store.totalEvents(), std::uint64_t(40));
    QCOMPARE(conn.welcome().pid, 4242);
    QCOMPARE(store.paramName(0), QStringLiteral("embed.weight"));
    QVERIFY(store.violationGroups().empty());
    engine.sendLive({lmHeadViolation(5000, 1)});
    engine.sendDropped(3, 3);
    QTRY_COMPARE(store.violationGroups().size(), std::size_t(1));
    QCOMPARE(QString::fromStdString(store.violationGroups()[0].fix),
             QStringLiteral("register_external_parameter(lm_head, embed.weight)"));
    QTRY_COMPARE(store.droppedEvents(), std::uint64_t(3));
    QVERIFY(conn.historyReceived());
}

void TestConnection::droppedConnectionKeepsDataAndReconnects()
{
    FakeEngine engine;
    engine.state = smallState();
    engine.history = someHistory();
    session::SessionStore store;
    session::Connection conn(&store);
    conn.setReconnectIntervalMs(100);
    conn.attach(engine.endpoint());
    QTRY_VERIFY(engine.clientReady());
    engine.sendLive(
        {lmHeadViolation(5000, 1), eventAt(5001, 1, telemetry::makeModuleExit({.module = 3}))});
    QTRY_COMPARE(store.totalEvents(), std::uint64_t(42));

    QSignalSpy lost(&conn, &session::Connection::stateChanged);
    engine.stopListening();
    engine.dropClient();
    QTRY_COMPARE(conn.state(), session::Connection::State::Lost);
    QVERIFY(conn.message().contains(QStringLiteral("everything collected so far is kept")));
    QCOMPARE(store.totalEvents(), std::uint64_t(42)); // nothing lost
    QVERIFY(store.hasState());
    QCOMPARE(store.violationGroups().size(), std::size_t(1));

    // The same run comes back (same port is not guaranteed: re-listen and re-attach).
    FakeEngine again;
    again.state = smallState();
    again.state.step = 2;
    state::ViolationRecord v;
    v.kind = ViolationKind::UnregisteredAccess;
    v.accessor = 7;
    v.param = 0;
    v.owner = 1;
    v.rank = 1;
    v.count = 1;
    v.tsNs = 5000;
    again.state.violations.push_back(v);
    again.history = someHistory();
    again.history.push_back(lmHeadViolation(5000, 1));
    again.history.push_back(eventAt(5001, 1, telemetry::makeModuleExit({.module = 3})));
    again.history.push_back(eventAt(6000, 2, telemetry::makeModuleExit({.module = 3})));
    conn.attach(again.endpoint());
    QTRY_VERIFY(again.clientReady());
    QTRY_COMPARE(store.totalEvents(), std::uint64_t(43));
    QCOMPARE(store.duplicateEvents(), std::uint64_t(42));
    QCOMPARE(store.step(), 2u);
    QCOMPARE(store.violationGroups().size(), std::size_t(1));
    QCOMPARE(store.violationGroups()[0].count, std::uint64_t(1));
}

void TestConnection::wrongTokenIsRefused()
{
    FakeEngine engine;
    engine.state = smallState();
    engine.token = "s3cret";
    session::SessionStore store;
    session::Connection conn(&store);
    conn.setReconnectIntervalMs(50);
    conn.attach(engine.endpoint(), QStringLiteral("nope"));
    QTRY_COMPARE(conn.state(), session::Connection::State::Failed);
    QVERIFY2(conn.message().contains(QStringLiteral("refused")), qPrintable(conn.message()));
    QVERIFY(conn.message().contains(QStringLiteral("token")));
    QTest::qWait(200);
    QCOMPARE(engine.connections, 1); // no retry after a refusal
    QVERIFY(!store.hasState());
}

void TestConnection::garbageFailsCleanly()
{
    FakeEngine engine;
    engine.state = smallState();
    engine.sendGarbage = true;
    session::SessionStore store;
    session::Connection conn(&store);
    conn.attach(engine.endpoint());
    QTRY_COMPARE(conn.state(), session::Connection::State::Failed);
    QVERIFY2(conn.message().contains(QStringLiteral("refused")) ||
                 conn.message().contains(QStringLiteral("cannot read")),
             qPrintable(conn.message()));
    QVERIFY(!store.hasState());
}

void TestConnection::badEndpointIsRefused()
{
    session::SessionStore store;
    session::Connection conn(&store);
    conn.attach(QStringLiteral("pigeon:coop"));
    QTRY_COMPARE(conn.state(), session::Connection::State::Failed);
    QVERIFY2(conn.message().contains(QStringLiteral("unix:PATH or tcp:HOST:PORT")),
             qPrintable(conn.message()));
}

void TestConnection::unreachableKeepsRetrying()
{
    quint16 port = 0;
    {
        QTcpServer probe;
        probe.listen(QHostAddress::LocalHost, 0);
        port = probe.serverPort();
    }
    session::SessionStore store;
    session::Connection conn(&store);
    conn.setReconnectIntervalMs(50);
    QSignalSpy spy(&conn, &session::Connection::stateChanged);
    conn.attach(QStringLiteral("tcp:127.0.0.1:%1").arg(port));
    QTRY_VERIFY(spy.count() >= 3);
    QCOMPARE(conn.state(), session::Connection::State::Connecting);
    QVERIFY2(conn.message().contains(QStringLiteral("cannot reach the engine")),
             qPrintable(conn.message()));
    conn.detach();
    QCOMPARE(conn.state(), session::Connection::State::Idle);
}

QTEST_GUILESS_MAIN(TestConnection)
#include "tst_connection.moc"

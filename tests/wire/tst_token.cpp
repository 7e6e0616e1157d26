// Where the token comes from (issue #14, defect 7): the flag, a token file only its owner
// can read, SHARDSCOPE_TOKEN or SHARDSCOPE_TOKEN_FILE; refusals say what to do.

#include <QtTest>

#include <QTemporaryDir>
#include <cstdlib>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

#include "wire/token.h"

using namespace shardscope::wire;

namespace {

std::string writeFile(const QTemporaryDir &dir, const char *name, const std::string &text,
                      mode_t mode)
{
    const std::string path = dir.filePath(QString::fromLatin1(name)).toStdString();
    std::ofstream(path, std::ios::binary) << text;
    ::chmod(path.c_str(), mode);
    return path;
}

} // namespace

class TestToken : public QObject
{
    Q_OBJECT
  private slots:
    void init()
    {
        ::unsetenv(kTokenEnv);
        ::unsetenv(kTokenFileEnv);
    }
    void cleanup() { init(); }

    void noSourceMeansNoToken()
    {
        auto t = resolveToken("", "");
        QVERIFY(t.ok());
        QCOMPARE(*t, std::string());
    }

    void flagWinsOverTheEnvironment()
    {
        ::setenv(kTokenEnv, "from-env", 1);
        QCOMPARE(*resolveToken("from-flag", ""), std::string("from-flag"));
        QCOMPARE(*resolveToken("", ""), std::string("from-env"));
    }

    void privateFileGivesItsFirstLineTrimmed()
    {
        QTemporaryDir dir;
        const std::string f = writeFile(dir, "tok", "  s3cret \r\nsecond line\n", 0600);
        auto t = resolveToken("", f);
        QVERIFY2(t.ok(), t.error().c_str());
        QCOMPARE(*t, std::string("s3cret"));
        ::setenv(kTokenEnv, "from-env", 1); // an explicit --token-file beats the environment
        QCOMPARE(*resolveToken("", f), std::string("s3cret"));
        ::unsetenv(kTokenEnv);
        ::setenv(kTokenFileEnv, f.c_str(), 1);
        QCOMPARE(*resolveToken("", ""), std::string("s3cret"));
    }

    void fileReadableByOthersIsRefused()
    {
        QTemporaryDir dir;
        const std::string f = writeFile(dir, "tok", "s3cret\n", 0644);
        auto t = resolveToken("", f);
        QVERIFY(!t.ok());
        QVERIFY2(t.error().find("chmod 600") != std::string::npos, t.error().c_str());
        ::chmod(f.c_str(), 0640);
        QVERIFY(!resolveToken("", f).ok());
        ::setenv(kTokenFileEnv, f.c_str(), 1);
        auto viaEnv = resolveToken("", "");
        QVERIFY(!viaEnv.ok());
        QVERIFY2(viaEnv.error().find("SHARDSCOPE_TOKEN_FILE") != std::string::npos,
                 viaEnv.error().c_str());
    }

    void badFilesAreCleanErrors()
    {
        QTemporaryDir dir;
        QVERIFY(!resolveToken("", dir.filePath("absent").toStdString()).ok());
        QVERIFY(!resolveToken("", writeFile(dir, "empty", " \n", 0600)).ok());
        QVERIFY(!resolveToken("", writeFile(dir, "big", std::string(5000, 'x'), 0600)).ok());
        const std::string fifo = dir.filePath("fifo").toStdString();
        QCOMPARE(::mkfifo(fifo.c_str(), 0600), 0);
        auto f = resolveToken("", fifo); // returns: a FIFO is not waited on
        QVERIFY(!f.ok());
        QVERIFY2(f.error().find("not a regular file") != std::string::npos, f.error().c_str());
        auto both = resolveToken("a", writeFile(dir, "tok", "b", 0600));
        QVERIFY(!both.ok());
        QVERIFY2(both.error().find("either --token or --token-file") != std::string::npos,
                 both.error().c_str());
    }
};

QTEST_APPLESS_MAIN(TestToken)
#include "tst_token.moc"

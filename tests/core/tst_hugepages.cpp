// base/hugepages.h: the advice lands on the whole 2 MiB pages inside a large buffer and
// nowhere else, small buffers are left alone, and reserveHuge leaves a container usable.
// Whether the kernel then backs the range with huge pages is its business (defrag,
// free memory); what is checked is the advice, in /proc/self/smaps' VmFlags ("hg").

#include <QtTest>

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/hugepages.h"

using namespace shardscope;

namespace {

constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;

// The VmFlags of the mapping that contains addr, or "" if none does.
std::string vmFlagsAt(std::uintptr_t addr)
{
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool inside = false;
    while (std::getline(smaps, line)) {
        std::uintptr_t lo = 0, hi = 0;
        char dash = 0;
        std::istringstream head(line);
        if (head >> std::hex >> lo >> dash >> hi && dash == '-' &&
            line.find(':') > line.find(' ')) {
            inside = addr >= lo && addr < hi;
            continue;
        }
        if (inside && line.rfind("VmFlags:", 0) == 0) return line;
    }
    return {};
}

bool advised(std::uintptr_t addr)
{
    const std::string flags = vmFlagsAt(addr);
    return flags.find(" hg") != std::string::npos;
}

// THP can be advised: the kernel has it and it is not switched off.
QString thpUnavailable()
{
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string mode;
    if (!f || !std::getline(f, mode))
        return QStringLiteral("this kernel has no transparent huge pages");
    if (mode.find("[never]") != std::string::npos)
        return QStringLiteral("transparent huge pages are switched off ([never])");
    return {};
}

} // namespace

class TestHugePages : public QObject
{
    Q_OBJECT
  private slots:
    void adviceCoversTheWholeHugePagesInside();
    void smallAndNullBuffersAreLeftAlone();
    void reserveHugeLeavesTheContainerUsable();
};

void TestHugePages::adviceCoversTheWholeHugePagesInside()
{
    if (const QString why = thpUnavailable(); !why.isEmpty()) QSKIP(qPrintable(why));
    // 16 MiB of fresh anonymous memory; the buffer starts 1 MiB past a 2 MiB boundary.
    const std::size_t span = std::size_t{16} << 20;
    void *map =
        ::mmap(nullptr, span + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    QVERIFY(map != MAP_FAILED);
    const auto base = (reinterpret_cast<std::uintptr_t>(map) + kHuge - 1) & ~(kHuge - 1);
    const std::uintptr_t begin = base + (kHuge / 2);
    const std::size_t bytes = std::size_t{9} << 20; // ends 10 MiB past base: 4 whole pages inside
    adviseHugePages(reinterpret_cast<void *>(begin), bytes);
    QVERIFY2(advised(base + kHuge), vmFlagsAt(base + kHuge).c_str());
    QVERIFY(advised(base + 5 * kHuge - 1));
    // Neither the partial page before the first boundary nor the one after the last.
    QVERIFY2(!advised(begin), vmFlagsAt(begin).c_str());
    QVERIFY(!advised(base + 5 * kHuge));
    // The memory stays usable.
    std::memset(reinterpret_cast<void *>(begin), 0x5a, bytes);
    QCOMPARE(reinterpret_cast<const unsigned char *>(begin)[bytes - 1], 0x5a);
    ::munmap(map, span + kHuge);
}

void TestHugePages::smallAndNullBuffersAreLeftAlone()
{
    adviseHugePages(nullptr, std::size_t{1} << 30); // nothing to advise, and no crash
    const std::size_t span = std::size_t{8} << 20;
    void *map = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    QVERIFY(map != MAP_FAILED);
    const auto base = (reinterpret_cast<std::uintptr_t>(map) + kHuge - 1) & ~(kHuge - 1);
    // Below kHugePageAdviceMin: left alone even though it covers a whole 2 MiB page.
    adviseHugePages(reinterpret_cast<void *>(base), kHugePageAdviceMin - 1);
    QVERIFY2(!advised(base), vmFlagsAt(base).c_str());
    ::munmap(map, span);
}

void TestHugePages::reserveHugeLeavesTheContainerUsable()
{
    std::vector<std::int64_t> v;
    reserveHuge(v, std::size_t{1} << 20); // 8 MiB
    QVERIFY(v.capacity() >= std::size_t{1} << 20);
    QVERIFY(v.empty());
    v.resize(std::size_t{1} << 20, 7);
    QCOMPARE(v.back(), std::int64_t{7});
    std::string s;
    reserveHuge(s, 100); // small: a plain reserve
    s.append("abc");
    QCOMPARE(s, std::string("abc"));
}

QTEST_GUILESS_MAIN(TestHugePages)
#include "tst_hugepages.moc"

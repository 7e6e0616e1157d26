#include "wire/statebinary.h"

#include "base/names.h"

#include <array>
#include <bit>
#include <cstring>
#include <functional>
#include <simdjson.h>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/hugepages.h"
#include "state/severity.h"
#include "state/statecolumns.h"
#include "state/violationtext.h"
#include "wire/jsonread.h"
#include "wire/jsonwrite.h"
#include "wire/messages.h"

namespace shardscope::wire {

static_assert(std::endian::native == std::endian::little,
              "the binary State is written and read with memcpy on a little-endian host");

namespace {

constexpr std::uint32_t kNone = 0xFFFFFFFFu;
constexpr std::uint64_t kMaxWorld = 1u << 16;
constexpr std::uint64_t kMaxRank = 0xFFFF;
constexpr unsigned kMaxDims = 16;

// Bytes per entry of each fixed-width part (docs/protocol.md, "StateBinary").
constexpr std::uint64_t kModuleBytes = 4 + 4 + 4;
constexpr std::uint64_t kParamBytes = 4 + 4 + 4 + 1 + 1 + 1 + 8 + 8 + 8 + 4 + 4 + 8 + 8 + 8 + 8 + 4;
constexpr std::uint64_t kViolationBytes = 1 + 1 + 1 + 4 + 4 + 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 4;
// Layout 2 adds a violation's location and build context: file, line, function, chain, building.
constexpr std::uint64_t kViolationLocationBytes = 4 + 4 + 4 + 4 + 4;
// Layout 3 adds FSDP2's units (group, reshard_after_forward, mesh) and parameters' placements.
constexpr std::uint64_t kModuleUnitBytes = 4 + 4 + 4;
constexpr std::uint64_t kParamPlacementBytes = 4;
// Layout 4 adds a violation's severity and what its read touched.
constexpr std::uint64_t kViolationSeverityBytes = 1 + 1;
// Layout 5 adds a violation's collective (collective_mismatch, rank_stalled), one string.
constexpr std::uint64_t kViolationCollectiveBytes = 4;
static_assert(kParamBytes == 83 && kViolationBytes == 55 && kViolationLocationBytes == 20);

// Parameter flags.
constexpr std::uint8_t kPersistent = state::kParamPersistent,
                       kPartitioned = state::kParamPartitioned, kLate = state::kParamLate;

// The counts of the header, which fix the size of every part.
struct Counts
{
    std::uint16_t layout = kBinaryStateLayout;
    std::uint64_t strings = 0, stringBytes = 0, world = 1, localRanks = 0, modules = 0, params = 0,
                  dims = 0, externals = 0, active = 0, violations = 0, events = 0;
};

std::uint64_t statusRowBytes(std::uint64_t world)
{
    return (world + 3) / 4;
}

// Every count is at most 2^32 - 1 and world at most 2^16: the sum cannot overflow.
std::uint64_t payloadSize(const Counts &c)
{
    const bool units = c.layout >= 3;
    return kBinaryStateHeaderSize + 4 * c.strings + c.stringBytes + 4 * c.localRanks +
           (kModuleBytes + (units ? kModuleUnitBytes : 0)) * c.modules +
           c.params * (kParamBytes + (units ? kParamPlacementBytes : 0) + statusRowBytes(c.world)) +
           8 * c.dims + 5 * c.externals + 4 * c.active +
           (kViolationBytes + (c.layout >= 2 ? kViolationLocationBytes : 0) +
            (c.layout >= 4 ? kViolationSeverityBytes : 0) +
            (c.layout >= 5 ? kViolationCollectiveBytes : 0)) *
               c.violations +
           sizeof(telemetry::Event) * c.events;
}

bool isAscii(std::string_view s)
{
    std::size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
        std::uint64_t w;
        std::memcpy(&w, s.data() + i, 8);
        if (w & 0x8080808080808080ull) return false;
    }
    for (; i < s.size(); ++i)
        if (static_cast<unsigned char>(s[i]) >= 0x80) return false;
    return true;
}

// The string table being built: add() appends an entry, intern() reuses an equal one.
class StringTable
{
  public:
    std::uint32_t add(std::string_view s)
    {
        const std::size_t before = m_bytes.size();
        if (isAscii(s) || simdjson::validate_utf8(s.data(), s.size()))
            m_bytes.append(s);
        else
            detail::appendValidUtf8(m_bytes, s);
        m_lengths.push_back(static_cast<std::uint32_t>(m_bytes.size() - before));
        return static_cast<std::uint32_t>(m_lengths.size() - 1);
    }
    std::uint32_t intern(std::string_view s)
    {
        if (const auto it = m_index.find(s); it != m_index.end()) return it->second;
        const std::uint32_t id = add(s);
        m_index.emplace(std::string(s), id);
        return id;
    }
    // Room for what is about to be added, so the table is not grown (and copied) on the way.
    void reserve(std::size_t strings, std::size_t bytes)
    {
        m_lengths.reserve(strings);
        m_bytes.reserve(bytes);
    }
    const std::vector<std::uint32_t> &lengths() const { return m_lengths; }
    const std::string &bytes() const { return m_bytes; }

  private:
    std::vector<std::uint32_t> m_lengths;
    std::string m_bytes;
    // Keys are copies: a caller may intern a string it builds and then drops (a violation's
    // call chain), so a view would dangle and a later lookup compare freed bytes.
    struct Hash
    {
        using is_transparent = void;
        std::size_t operator()(std::string_view s) const noexcept
        {
            return std::hash<std::string_view>{}(s);
        }
    };
    std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> m_index;
};

// Writes into a buffer sized beforehand.
class Out
{
  public:
    explicit Out(char *p) : m_p(p) {}
    template <class T> void put(T v)
    {
        std::memcpy(m_p, &v, sizeof v);
        m_p += sizeof v;
    }
    void bytes(const void *data, std::size_t n)
    {
        if (n) std::memcpy(m_p, data, n);
        m_p += n;
    }
    template <class T> void column(const std::vector<T> &v)
    {
        bytes(v.data(), v.size() * sizeof(T));
    }

  private:
    char *m_p;
};

} // namespace

namespace {

// Whether a table's strings are each valid UTF-8: valid as a whole, and none starting inside
// a character (a continuation byte), so every boundary falls between characters.
bool validTable(const state::StringColumn &t)
{
    const std::string &b = t.bytes();
    if (!isAscii(b) && !simdjson::validate_utf8(b.data(), b.size())) return false;
    std::size_t at = 0;
    for (std::uint32_t n : t.lengths()) {
        if (n && (static_cast<unsigned char>(b[at]) & 0xC0) == 0x80) return false;
        at += n;
    }
    return true;
}

} // namespace

std::string encodeBinaryState(const state::StateColumns &c, const SnapshotMeta &meta,
                              std::uint64_t droppedEvents, std::span<const telemetry::Event> events,
                              std::uint16_t layout)
{
    if (layout < kBinaryStateOldestLayout || layout > kBinaryStateLayout)
        throw std::invalid_argument("encodeBinaryState: layout " + std::to_string(layout) +
                                    " is not one this build writes");
    if (const std::string bad = c.checkConsistent(); !bad.empty())
        throw std::invalid_argument("encodeBinaryState: the state's columns disagree: " + bad);
    const auto world = static_cast<std::uint64_t>(std::max(c.worldSize, 1));

    // The columns' strings go out as they are when they are valid UTF-8 (the usual case);
    // otherwise each invalid byte becomes U+FFFD, as in the JSON, and only lengths change.
    const std::vector<std::uint32_t> *lengths = &c.strings.lengths();
    const std::string *bytes = &c.strings.bytes();
    std::vector<std::uint32_t> fixedLengths;
    std::string fixedBytes;
    if (!validTable(c.strings)) {
        fixedLengths.reserve(lengths->size());
        fixedBytes.reserve(bytes->size() + bytes->size() / 8);
        for (std::string_view v : c.strings.views()) {
            const std::size_t before = fixedBytes.size();
            detail::appendValidUtf8(fixedBytes, v);
            fixedLengths.push_back(static_cast<std::uint32_t>(fixedBytes.size() - before));
        }
        lengths = &fixedLengths;
        bytes = &fixedBytes;
    }
    // The few strings the columns do not hold follow theirs.
    StringTable extra;
    const auto base = static_cast<std::uint32_t>(lengths->size());
    auto more = [&](std::string_view v) { return base + extra.intern(v); };
    const std::uint32_t producer = more(meta.producer);
    const std::uint32_t endpoint = more(meta.endpoint);
    const std::uint32_t model = more(c.modelName);
    const std::uint32_t backend = more(c.backend);
    const std::uint32_t dialect = more(c.fixDialect);
    // A violation names its parameter as the JSON does: the listed parameter's name, else
    // the name the engine kept for a removed one, else none.
    const std::size_t nViolations = c.violations.size();
    std::vector<std::uint32_t> vParamName(nViolations), vFix(nViolations), vMessage(nViolations),
        vFile(nViolations), vLine(nViolations), vFunction(nViolations), vChain(nViolations),
        vBuilding(nViolations), vCollective(nViolations, kNone);
    for (std::size_t i = 0; i < nViolations; ++i) {
        const state::ViolationRecord &v = c.violations[i];
        const auto it = std::lower_bound(c.paramId.begin(), c.paramId.end(), v.param);
        if (it != c.paramId.end() && *it == v.param)
            vParamName[i] = c.paramName[static_cast<std::size_t>(it - c.paramId.begin())];
        else
            vParamName[i] = v.paramName.empty() ? kNone : more(v.paramName);
        vFix[i] = more(v.fix);
        vMessage[i] = more(v.message);
        if (layout < 2) continue;
        vFile[i] = v.location.known() ? more(v.location.file) : kNone;
        vLine[i] = v.location.line;
        vFunction[i] = v.location.known() ? more(v.location.function) : kNone;
        std::string chain;
        for (const std::string &frame : v.location.chain)
            chain.append(chain.empty() ? "" : "\n").append(frame);
        vChain[i] = chain.empty() ? kNone : more(chain);
        vBuilding[i] = v.building.empty() ? kNone : more(v.building);
        if (layout >= 5 && !v.collective.empty())
            vCollective[i] = more(detail::collectiveJson(v.collective));
    }

    Counts n;
    n.layout = layout;
    n.strings = lengths->size() + extra.lengths().size();
    n.stringBytes = bytes->size() + extra.bytes().size();
    n.world = world;
    n.localRanks = c.localRanks.size();
    n.modules = c.modulePath.size();
    n.params = c.paramCount();
    n.dims = c.dims.size();
    n.externals = c.externalModule.size();
    n.active = c.activeModule.size();
    n.violations = nViolations;
    n.events = events.size();
    std::string out;
    reserveHuge(out, payloadSize(n));
    out.resize(payloadSize(n));
    Out o(out.data());

    o.put(kBinaryStateMagic);
    o.put(layout);
    o.put(std::uint16_t(0));
    for (std::uint64_t k : {n.strings, n.stringBytes, n.world, n.localRanks, n.modules, n.params,
                            n.dims, n.externals, n.active, n.violations, n.events})
        o.put(static_cast<std::uint32_t>(k));
    o.put(c.step);
    o.put(droppedEvents);
    o.put(static_cast<std::int64_t>(meta.pid));
    o.put(meta.createdUnixMs);
    o.put(static_cast<std::int64_t>(c.config.persistenceThreshold));
    o.put(static_cast<std::int64_t>(c.config.prefetchBucketSize));
    o.put(static_cast<std::int64_t>(c.config.maxLiveParameters));
    o.put(static_cast<std::uint8_t>(c.config.guard));
    o.put(std::uint8_t(0));
    o.put(std::uint16_t(0));
    for (std::uint32_t idx : {producer, endpoint, model, backend, dialect})
        o.put(idx);

    o.column(*lengths);
    o.column(extra.lengths());
    o.bytes(bytes->data(), bytes->size());
    o.bytes(extra.bytes().data(), extra.bytes().size());
    for (int r : c.localRanks)
        o.put(static_cast<std::uint32_t>(r));
    o.column(c.modulePath);
    o.column(c.moduleType);
    o.column(c.moduleParent);

    o.column(c.paramId);
    o.column(c.paramName);
    o.column(c.paramOwner);
    o.column(c.paramDtype);
    o.column(c.paramFlags);
    o.column(c.paramDims);
    o.column(c.numel);
    o.column(c.paddedNumel);
    o.column(c.partitionNumel);
    o.column(c.dims);
    o.column(c.statusRows);
    o.column(c.externalCount);
    o.column(c.externalModule);
    o.column(c.externalAutomatic);
    o.column(c.activeCount);
    o.column(c.activeModule);
    o.column(c.gatherCount);
    o.column(c.gatherBytes);
    o.column(c.gatherNs);
    o.column(c.lastGatherTsNs);
    o.column(c.paramReplaces);

    auto violationColumn = [&](auto field) {
        for (const state::ViolationRecord &v : c.violations)
            o.put(field(v));
    };
    violationColumn(
        [](const state::ViolationRecord &v) { return static_cast<std::uint8_t>(v.kind); });
    violationColumn(
        [](const state::ViolationRecord &v) { return static_cast<std::uint8_t>(v.status); });
    violationColumn(
        [](const state::ViolationRecord &v) { return static_cast<std::uint8_t>(v.action); });
    violationColumn([](const state::ViolationRecord &v) { return std::uint32_t(v.step); });
    violationColumn([](const state::ViolationRecord &v) { return std::uint32_t(v.lastStep); });
    violationColumn(
        [](const state::ViolationRecord &v) { return static_cast<std::uint32_t>(v.rank); });
    violationColumn([](const state::ViolationRecord &v) { return std::uint32_t(v.accessor); });
    violationColumn([](const state::ViolationRecord &v) { return std::uint32_t(v.param); });
    o.column(vParamName);
    violationColumn([](const state::ViolationRecord &v) { return std::uint32_t(v.owner); });
    violationColumn([](const state::ViolationRecord &v) { return std::uint64_t(v.count); });
    violationColumn([](const state::ViolationRecord &v) { return std::uint64_t(v.tsNs); });
    o.column(vFix);
    o.column(vMessage);
    if (layout >= 2) {
        o.column(vFile);
        o.column(vLine);
        o.column(vFunction);
        o.column(vChain);
        o.column(vBuilding);
    }
    if (layout >= 3) {
        o.column(c.moduleUnitGroup);
        o.column(c.moduleReshard);
        o.column(c.moduleMesh);
        o.column(c.paramPlacements);
    }
    if (layout >= 4) {
        violationColumn(
            [](const state::ViolationRecord &v) { return static_cast<std::uint8_t>(v.severity); });
        violationColumn(
            [](const state::ViolationRecord &v) { return static_cast<std::uint8_t>(v.read); });
    }
    if (layout >= 5) o.column(vCollective);
    o.bytes(events.data(), events.size_bytes());
    return out;
}

std::string encodeBinaryState(const Snapshot &snapshot, std::uint16_t layout)
{
    state::StateColumns columns;
    state::columnsOf(snapshot.state, columns);
    return encodeBinaryState(columns, snapshot.meta, snapshot.droppedEvents, snapshot.events,
                             layout);
}

namespace {

[[noreturn]] void failAt(const std::string &where, const std::string &what)
{
    detail::failAt(where, what);
}

std::string at(std::string_view part, std::uint64_t i)
{
    return std::string(part) + "[" + std::to_string(i) + "]";
}

// Where a value lies, e.g. params[17].name, spelled out only when it is reported: a decoder
// that built the text for each of 100,000 records would spend most of its time on it.
struct Where
{
    const char *part;
    std::uint64_t index;
    const char *field = nullptr;
    operator std::string() const
    {
        std::string s = at(part, index);
        if (field) s.append(".").append(field);
        return s;
    }
    Where operator/(const char *f) const { return Where{part, index, f}; }
};

// One fixed-width column of the payload: n values of T from `data`.
template <class T> class Column
{
  public:
    Column() = default;
    Column(const char *data) : m_data(data) {}
    T operator[](std::uint64_t i) const
    {
        T v;
        std::memcpy(&v, m_data + i * sizeof(T), sizeof(T));
        return v;
    }

  private:
    const char *m_data = nullptr;
};

// Splits the rest of the payload into its parts, in order; payloadSize() made sure they fit.
class Parts
{
  public:
    explicit Parts(const char *first) : m_at(first) {}
    const char *take(std::uint64_t bytes)
    {
        const char *p = m_at;
        m_at += bytes;
        return p;
    }
    template <class T> Column<T> column(std::uint64_t n) { return Column<T>(take(n * sizeof(T))); }
    template <class T> T next() { return Column<T>(take(sizeof(T)))[0]; }

  private:
    const char *m_at;
};

// The table's strings, and a bound on the bytes the records copy out of it: a string may be
// referred to many times, so a small payload could otherwise ask for gigabytes.
class Strings
{
  public:
    Strings(Column<std::uint32_t> lengths, const char *bytes, const Counts &c, std::size_t payload)
        : m_budget(16 * static_cast<std::uint64_t>(payload) + (1u << 20))
    {
        m_views.reserve(c.strings);
        std::uint64_t offset = 0;
        for (std::uint64_t i = 0; i < c.strings; ++i) {
            const std::uint64_t n = lengths[i];
            if (n > c.stringBytes - offset)
                failAt(at("strings", i), "its length " + std::to_string(n) +
                                             " runs past the string bytes (" +
                                             std::to_string(c.stringBytes) + " in all)");
            m_views.emplace_back(bytes + offset, n);
            offset += n;
        }
        if (offset != c.stringBytes)
            failAt("strings", "the lengths add up to " + std::to_string(offset) +
                                  " bytes, the header says " + std::to_string(c.stringBytes));
        // Valid as a whole, and no string starting inside a character: then each one is valid.
        bool valid = simdjson::validate_utf8(bytes, c.stringBytes);
        for (std::uint64_t i = 0; valid && i < m_views.size(); ++i)
            valid =
                m_views[i].empty() || (static_cast<unsigned char>(m_views[i][0]) & 0xC0) != 0x80;
        if (!valid)
            for (std::uint64_t i = 0; i < m_views.size(); ++i)
                if (!simdjson::validate_utf8(m_views[i].data(), m_views[i].size()))
                    failAt(at("strings", i), "is not valid UTF-8");
    }

    template <class W> std::string get(std::uint32_t index, const W &where)
    {
        if (index >= m_views.size())
            failAt(where, "string " + std::to_string(index) + " is not in the table of " +
                              std::to_string(m_views.size()));
        const std::string_view s = m_views[index];
        if (s.size() > m_budget)
            failAt(where, "the strings the records refer to add up to more than 16 times the "
                          "payload's size");
        m_budget -= s.size();
        return std::string(s);
    }
    template <class W> std::string getOrEmpty(std::uint32_t index, const W &where)
    {
        return index == kNone ? std::string() : get(index, where);
    }

  private:
    std::vector<std::string_view> m_views;
    std::uint64_t m_budget;
};

// Byte b of a status row as four ranks' statuses (low bits first); a code 3 marks it invalid.
struct StatusByte
{
    std::array<ParamStatus, 4> status;
    bool valid;
};
constexpr std::array<StatusByte, 256> makeStatusTable()
{
    std::array<StatusByte, 256> t{};
    for (unsigned b = 0; b < 256; ++b) {
        t[b].valid = true;
        for (unsigned k = 0; k < 4; ++k) {
            const unsigned code = (b >> (2 * k)) & 3;
            if (code == 3) t[b].valid = false;
            t[b].status[k] = static_cast<ParamStatus>(code == 3 ? 0 : code);
        }
    }
    return t;
}
constexpr std::array<StatusByte, 256> kStatusTable = makeStatusTable();

void readStatusRow(const std::uint8_t *row, std::uint64_t world, std::vector<ParamStatus> &out,
                   const Where &where)
{
    out.resize(world);
    const std::uint64_t bytes = statusRowBytes(world);
    for (std::uint64_t k = 0; k < bytes; ++k) {
        const StatusByte &b = kStatusTable[row[k]];
        const std::uint64_t ranks = std::min<std::uint64_t>(4, world - 4 * k);
        if (!b.valid || (ranks < 4 && (row[k] >> (2 * ranks)) != 0)) {
            for (std::uint64_t j = 0; j < 4; ++j) {
                const unsigned code = (row[k] >> (2 * j)) & 3;
                if (j >= ranks && code != 0)
                    failAt(where, "the unused bits after rank " + std::to_string(world - 1) +
                                      " are not zero");
                if (code == 3)
                    failAt(where, "rank " + std::to_string(4 * k + j) +
                                      " has status code 3 (expected 0 NOT_AVAILABLE, "
                                      "1 INFLIGHT or 2 AVAILABLE)");
            }
        }
        std::memcpy(out.data() + 4 * k, b.status.data(), ranks);
    }
}

// A module reference: kNone or a listed module.
ModuleId moduleRef(std::uint32_t id, std::uint64_t modules, const Where &where)
{
    if (id != kNone && id >= modules)
        failAt(where, "module id " + std::to_string(id) + " does not exist (" +
                          std::to_string(modules) + " modules)");
    return id;
}

// The enum's values are its names' indices (engine/base/names.h, the one list of each enum's
// values): a kind added there is read here without a second count to keep in step.
template <class E, class Names, class W>
E enumValue(std::uint8_t v, const Names &names, const W &where)
{
    const std::size_t count = names.size();
    if (v >= count)
        failAt(where,
               "value " + std::to_string(v) + " is outside 0 to " + std::to_string(count - 1));
    return static_cast<E>(v);
}

Snapshot decodeBinary(std::string_view payload)
{
    if (payload.size() < kBinaryStateHeaderSize)
        failAt("header", "the payload is " + std::to_string(payload.size()) +
                             " bytes, shorter than the " + std::to_string(kBinaryStateHeaderSize) +
                             "-byte header");
    Parts header(payload.data());
    if (header.next<std::uint32_t>() != kBinaryStateMagic)
        failAt("header", "does not start with \"SSTB\"");
    const auto layout = header.next<std::uint16_t>();
    if (layout < kBinaryStateOldestLayout || layout > kBinaryStateLayout)
        failAt("header", "layout " + std::to_string(layout) +
                             " is not supported; this build reads layouts " +
                             std::to_string(kBinaryStateOldestLayout) + " to " +
                             std::to_string(kBinaryStateLayout));
    if (header.next<std::uint16_t>() != 0) failAt("header", "reserved bytes 6-7 are not 0");
    const auto counts = header.column<std::uint32_t>(11);
    Counts c;
    c.layout = layout;
    c.strings = counts[0];
    c.stringBytes = counts[1];
    c.world = counts[2];
    c.localRanks = counts[3];
    c.modules = counts[4];
    c.params = counts[5];
    c.dims = counts[6];
    c.externals = counts[7];
    c.active = counts[8];
    c.violations = counts[9];
    c.events = counts[10];
    if (c.world < 1 || c.world > kMaxWorld)
        failAt("header.world_size", std::to_string(c.world) + " is outside 1 to 65536");
    const std::uint64_t expected = payloadSize(c);
    if (expected != payload.size())
        failAt("header", "the payload is " + std::to_string(payload.size()) +
                             " bytes but its counts make " + std::to_string(expected) +
                             "; it was truncated or corrupted");

    Snapshot s;
    state::EngineState &st = s.state;
    st.worldSize = static_cast<int>(c.world);
    st.step = header.next<std::uint32_t>();
    s.droppedEvents = header.next<std::uint64_t>();
    s.meta.pid = header.next<std::int64_t>();
    s.meta.createdUnixMs = header.next<std::uint64_t>();
    st.config.persistenceThreshold = header.next<std::int64_t>();
    st.config.prefetchBucketSize = header.next<std::int64_t>();
    st.config.maxLiveParameters = header.next<std::int64_t>();
    st.config.guard =
        enumValue<GuardPolicy>(header.next<std::uint8_t>(), kGuardPolicyNames, "header.guard");
    if (header.next<std::uint8_t>() != 0 || header.next<std::uint16_t>() != 0)
        failAt("header", "reserved bytes 105-107 are not 0");
    const auto metaStrings = header.column<std::uint32_t>(5);

    Parts parts(payload.data() + kBinaryStateHeaderSize);
    const auto lengths = parts.column<std::uint32_t>(c.strings);
    const char *stringBytes = parts.take(c.stringBytes);
    Strings strings(lengths, stringBytes, c, payload.size());
    s.meta.producer = strings.get(metaStrings[0], "header.producer");
    s.meta.endpoint = strings.get(metaStrings[1], "header.endpoint");
    st.modelName = strings.get(metaStrings[2], "header.model");
    st.backend = strings.get(metaStrings[3], "header.backend");
    st.fixDialect = strings.get(metaStrings[4], "header.fix_dialect");
    state::FixDialect known;
    if (!state::parseFixDialect(st.fixDialect, known))
        failAt("header.fix_dialect",
               "\"" + st.fixDialect + "\" is not \"shardscope\", \"deepspeed\" or \"fsdp\"");

    const auto localRanks = parts.column<std::uint32_t>(c.localRanks);
    st.localRanks.reserve(c.localRanks);
    for (std::uint64_t i = 0; i < c.localRanks; ++i) {
        if (localRanks[i] >= c.world)
            failAt(at("local_ranks", i), std::to_string(localRanks[i]) +
                                             " is not a rank of a world of " +
                                             std::to_string(c.world));
        st.localRanks.push_back(static_cast<int>(localRanks[i]));
    }

    const auto modPath = parts.column<std::uint32_t>(c.modules);
    const auto modType = parts.column<std::uint32_t>(c.modules);
    const auto modParent = parts.column<std::uint32_t>(c.modules);
    reserveHuge(st.modules, c.modules);
    st.modules.resize(c.modules);
    for (std::uint64_t i = 0; i < c.modules; ++i) {
        state::ModuleRecord &m = st.modules[i];
        m.id = static_cast<ModuleId>(i);
        const Where w{"modules", i};
        m.path = strings.get(modPath[i], w / "path");
        m.type = strings.get(modType[i], w / "type");
        m.parent = modParent[i];
        if (m.parent != kNone && m.parent >= i)
            failAt(w / "parent", "a parent must come before its children");
    }

    const std::uint64_t P = c.params;
    const auto pId = parts.column<std::uint32_t>(P);
    const auto pName = parts.column<std::uint32_t>(P);
    const auto pModule = parts.column<std::uint32_t>(P);
    const auto pDtype = parts.column<std::uint8_t>(P);
    const auto pFlags = parts.column<std::uint8_t>(P);
    const auto pDims = parts.column<std::uint8_t>(P);
    const auto pNumel = parts.column<std::int64_t>(P);
    const auto pPadded = parts.column<std::int64_t>(P);
    const auto pPartition = parts.column<std::int64_t>(P);
    const auto dims = parts.column<std::int64_t>(c.dims);
    const std::uint64_t row = statusRowBytes(c.world);
    const auto *statusRows = reinterpret_cast<const std::uint8_t *>(parts.take(P * row));
    const auto pExtCount = parts.column<std::uint32_t>(P);
    const auto extModule = parts.column<std::uint32_t>(c.externals);
    const auto extAuto = parts.column<std::uint8_t>(c.externals);
    const auto pActiveCount = parts.column<std::uint32_t>(P);
    const auto activeModule = parts.column<std::uint32_t>(c.active);
    const auto pGatherCount = parts.column<std::uint64_t>(P);
    const auto pGatherBytes = parts.column<std::uint64_t>(P);
    const auto pGatherNs = parts.column<std::uint64_t>(P);
    const auto pLastGather = parts.column<std::uint64_t>(P);
    const auto pReplaces = parts.column<std::uint32_t>(P);

    // A module appears at most once in each of a parameter's lists: the lists never outgrow
    // the model. Marks are per (parameter, list), so checking stays linear.
    std::vector<std::uint64_t> seen(c.externals + c.active > 0 ? c.modules : 0, ~std::uint64_t(0));
    auto moduleList = [&](std::uint64_t list, Column<std::uint32_t> col, std::uint64_t &next,
                          std::uint64_t total, std::uint32_t n, const Where &where, auto &&emit) {
        if (n > total - next)
            failAt(where, std::to_string(n) + " entries run past the " + std::to_string(total) +
                              " the header counts");
        for (std::uint32_t k = 0; k < n; ++k, ++next) {
            const ModuleId m = col[next];
            if (m >= c.modules)
                failAt(at(std::string(where), k), "module id " + std::to_string(m) +
                                                      " does not exist (" +
                                                      std::to_string(c.modules) + " modules)");
            if (seen[m] == list)
                failAt(at(std::string(where), k),
                       "module " + std::to_string(m) + " is listed twice");
            seen[m] = list;
            emit(m, next);
        }
    };
    std::uint64_t dimAt = 0, extAt = 0, activeAt = 0;
    reserveHuge(st.params, P);
    st.params.resize(P);
    for (std::uint64_t i = 0; i < P; ++i) {
        state::ParamRecord &p = st.params[i];
        const Where w{"params", i};
        p.id = pId[i];
        if (p.id == kNone) failAt(w / "id", "4294967295 is not a parameter id");
        p.name = strings.get(pName[i], w / "name");
        p.owner = moduleRef(pModule[i], c.modules, w / "module_id");
        p.dtype = enumValue<DType>(pDtype[i], kDTypeNames, w / "dtype");
        const std::uint8_t flags = pFlags[i];
        if (flags & ~(kPersistent | kPartitioned | kLate))
            failAt(w / "flags", "unknown bits in " + std::to_string(flags));
        p.persistent = flags & kPersistent;
        p.partitioned = flags & kPartitioned;
        p.late = flags & kLate;
        const unsigned ndims = pDims[i];
        if (ndims > kMaxDims) failAt(w / "shape", "more than 16 dimensions");
        if (ndims > c.dims - dimAt)
            failAt(w / "shape",
                   "the dimensions run past the " + std::to_string(c.dims) + " the header counts");
        p.shape.resize(ndims);
        for (unsigned k = 0; k < ndims; ++k, ++dimAt) {
            p.shape[k] = dims[dimAt];
            if (p.shape[k] < 0) failAt(at(std::string(w / "shape"), k), "negative dimension");
        }
        p.numel = pNumel[i];
        p.paddedNumel = pPadded[i];
        p.partitionNumel = pPartition[i];
        if (p.numel < 0 || p.paddedNumel < 0 || p.partitionNumel < 0)
            failAt(w, "numel, padded_numel and partition_numel must not be negative");
        readStatusRow(statusRows + i * row, c.world, p.status, w / "status");
        const std::uint64_t list = 2 * i;
        const std::uint32_t nExt = pExtCount[i];
        p.externals.reserve(std::min<std::uint64_t>(nExt, c.externals - extAt));
        moduleList(list, extModule, extAt, c.externals, nExt, w / "external_modules",
                   [&](ModuleId m, std::uint64_t k) {
                       const std::uint8_t a = extAuto[k];
                       if (a > 1)
                           failAt(w / "external_auto",
                                  "value " + std::to_string(a) + " is not 0 or 1");
                       p.externals.push_back(state::ExternalRecord{m, a == 1});
                   });
        const std::uint32_t nActive = pActiveCount[i];
        p.activeModules.reserve(std::min<std::uint64_t>(nActive, c.active - activeAt));
        moduleList(list + 1, activeModule, activeAt, c.active, nActive, w / "active_modules",
                   [&](ModuleId m, std::uint64_t) { p.activeModules.push_back(m); });
        p.gatherCount = pGatherCount[i];
        p.gatherBytes = pGatherBytes[i];
        p.gatherNs = pGatherNs[i];
        p.lastGatherTsNs = pLastGather[i];
        p.replaces = strings.getOrEmpty(pReplaces[i], w / "replaces");
    }
    if (dimAt != c.dims || extAt != c.externals || activeAt != c.active)
        failAt("params", "the parameters use " + std::to_string(dimAt) + " dimensions, " +
                             std::to_string(extAt) + " externals and " + std::to_string(activeAt) +
                             " active modules; the header counts " + std::to_string(c.dims) + ", " +
                             std::to_string(c.externals) + " and " + std::to_string(c.active));

    const std::uint64_t V = c.violations;
    const auto vKind = parts.column<std::uint8_t>(V);
    const auto vStatus = parts.column<std::uint8_t>(V);
    const auto vAction = parts.column<std::uint8_t>(V);
    const auto vStep = parts.column<std::uint32_t>(V);
    const auto vLastStep = parts.column<std::uint32_t>(V);
    const auto vRank = parts.column<std::uint32_t>(V);
    const auto vAccessor = parts.column<std::uint32_t>(V);
    const auto vParam = parts.column<std::uint32_t>(V);
    const auto vParamName = parts.column<std::uint32_t>(V);
    const auto vOwner = parts.column<std::uint32_t>(V);
    const auto vCount = parts.column<std::uint64_t>(V);
    const auto vTs = parts.column<std::uint64_t>(V);
    const auto vFix = parts.column<std::uint32_t>(V);
    const auto vMessage = parts.column<std::uint32_t>(V);
    const std::uint64_t VL = layout >= 2 ? V : 0;
    const auto vFile = parts.column<std::uint32_t>(VL);
    const auto vLine = parts.column<std::uint32_t>(VL);
    const auto vFunction = parts.column<std::uint32_t>(VL);
    const auto vChain = parts.column<std::uint32_t>(VL);
    const auto vBuilding = parts.column<std::uint32_t>(VL);
    st.violations.resize(V);
    for (std::uint64_t i = 0; i < V; ++i) {
        state::ViolationRecord &v = st.violations[i];
        const Where w{"violations", i};
        v.kind = enumValue<ViolationKind>(vKind[i], kViolationKindNames, w / "kind");
        v.status = enumValue<ParamStatus>(vStatus[i], kStatusNames, w / "status");
        v.action = enumValue<GuardAction>(vAction[i], kGuardActionNames, w / "action");
        v.step = vStep[i];
        v.lastStep = vLastStep[i];
        if (vRank[i] > kMaxRank) failAt(w / "rank", std::to_string(vRank[i]) + " is above 65535");
        v.rank = static_cast<int>(vRank[i]);
        v.accessor = moduleRef(vAccessor[i], c.modules, w / "accessor_id");
        v.param = vParam[i];
        v.paramName = strings.getOrEmpty(vParamName[i], w / "param");
        v.owner = moduleRef(vOwner[i], c.modules, w / "owner_id");
        v.count = vCount[i];
        v.tsNs = vTs[i];
        v.fix = strings.get(vFix[i], w / "fix");
        v.message = strings.get(vMessage[i], w / "message");
        if (layout < 2) continue;
        v.location.file = strings.getOrEmpty(vFile[i], w / "location.file");
        v.location.line = vLine[i];
        v.location.function = strings.getOrEmpty(vFunction[i], w / "location.function");
        if (!v.location.known() && (v.location.line || !v.location.function.empty()))
            failAt(w / "location", "a line or function without a file");
        const std::string chain = strings.getOrEmpty(vChain[i], w / "location.chain");
        for (std::size_t at = 0; at < chain.size();) {
            std::size_t nl = chain.find('\n', at);
            if (nl == std::string::npos) nl = chain.size();
            v.location.chain.push_back(chain.substr(at, nl - at));
            at = nl + 1;
        }
        v.building = strings.getOrEmpty(vBuilding[i], w / "building");
    }

    const std::uint64_t ML = layout >= 3 ? c.modules : 0, PL = layout >= 3 ? P : 0;
    const auto mUnitGroup = parts.column<std::uint32_t>(ML);
    const auto mReshard = parts.column<std::uint32_t>(ML);
    const auto mMesh = parts.column<std::uint32_t>(ML);
    const auto pPlacements = parts.column<std::uint32_t>(PL);
    for (std::uint64_t i = 0; i < ML; ++i) {
        state::ModuleRecord &m = st.modules[i];
        const Where w{"modules", i};
        m.unitGroup = mUnitGroup[i];
        if (!m.fsdpUnit()) {
            if (mReshard[i] != kNone || mMesh[i] != kNone)
                failAt(w / "fsdp_unit", "reshard_after_forward and mesh are set on a module "
                                        "that is not an FSDP unit (unit_group_id is none)");
            continue;
        }
        m.reshardAfterForward = strings.get(mReshard[i], w / "reshard_after_forward");
        m.mesh = strings.get(mMesh[i], w / "mesh");
    }
    for (std::uint64_t i = 0; i < ML; ++i)
        if (const std::string bad = state::unitGroupError(st.modules, st.modules[i]); !bad.empty())
            failAt(Where{"modules", i} / "unit_group_id", bad);
    for (std::uint64_t i = 0; i < PL; ++i) {
        st.params[i].placements =
            strings.getOrEmpty(pPlacements[i], Where{"params", i} / "placements");
        if (pPlacements[i] != kNone && st.params[i].placements.empty())
            failAt(Where{"params", i} / "placements", "is empty; none is written as 0xFFFFFFFF");
    }

    const std::uint64_t VS = layout >= 4 ? V : 0;
    const auto vSeverity = parts.column<std::uint8_t>(VS);
    const auto vRead = parts.column<std::uint8_t>(VS);
    for (std::uint64_t i = 0; i < V; ++i) {
        state::ViolationRecord &v = st.violations[i];
        const Where w{"violations", i};
        if (i < VS) {
            v.read = enumValue<ViolationRead>(vRead[i], kViolationReadNames, w / "read");
            v.severity = enumValue<Severity>(vSeverity[i], kSeverityNames, w / "severity");
        } else { // an earlier layout has none: the one rule gives it
            v.severity = state::severityOf(v.kind, v.action, v.read);
        }
    }

    const std::uint64_t VC = layout >= 5 ? V : 0;
    const auto vCollective = parts.column<std::uint32_t>(VC);
    for (std::uint64_t i = 0; i < VC; ++i) {
        if (vCollective[i] == kNone) continue;
        const Where w{"violations", i};
        const std::string json = strings.get(vCollective[i], w / "collective");
        auto d = detail::decodeCollectiveJson(json);
        if (!d) failAt(w / "collective", d.error());
        if (d->empty()) failAt(w / "collective", "is empty; none is written as 0xFFFFFFFF");
        st.violations[i].collective = std::move(*d);
    }

    const char *events = parts.take(c.events * sizeof(telemetry::Event));
    s.events.resize(c.events);
    if (c.events) std::memcpy(s.events.data(), events, c.events * sizeof(telemetry::Event));
    for (std::uint64_t i = 0; i < c.events; ++i)
        if (!isKnownEventType(static_cast<std::uint8_t>(s.events[i].type)))
            failAt(at("events", i),
                   "unknown event type " + std::to_string(static_cast<unsigned>(s.events[i].type)));
    return s;
}

} // namespace

Result<Snapshot> decodeBinaryState(std::string_view payload)
{
    return detail::guarded<Snapshot>("not a valid binary State",
                                     [&] { return decodeBinary(payload); });
}

Result<Snapshot> decodeStateFrame(const Frame &frame)
{
    switch (frame.type) {
    case MessageType::State:
        return decodeSnapshot(frame.payload);
    case MessageType::StateBinary:
        return decodeBinaryState(frame.payload);
    default:
        return fail("a " + std::string(messageTypeName(frame.type)) + " frame is not a state");
    }
}

} // namespace shardscope::wire

// The bounded pickle reader (pickle_reader.hpp) on pickles written here opcode by opcode, as
// Lib/pickletools.py documents them, and PyTorch's memory snapshot (memory_snapshot.hpp) on
// hand-derived snapshots: allocated and reserved from the segments, the trace walked back to the
// allocated peak and the blocks live there, and every malformed or hostile input refused in one
// line naming the file.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <variant>
#include <vector>

#include "planner/inputs/memory_record.hpp"
#include "planner/inputs/memory_snapshot.hpp"
#include "planner/inputs/pickle_reader.hpp"

namespace np {
namespace {

constexpr int64_t MiB = 1 << 20;
using K = Pickle::Kind;
using namespace std::string_literals;  // "..."s keeps the NUL bytes opcodes carry

// --- Writing pickles -------------------------------------------------------------------------

std::string le(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
std::string proto(int v = 4) { return std::string("\x80", 1) + static_cast<char>(v); }
std::string str(const std::string& s) { return "\x8c" + le(s.size(), 1) + s; }  // SHORT_BINUNICODE
std::string binint(int32_t v) { return "J" + le(static_cast<uint32_t>(v), 4); }
std::string long1(int64_t v) {  // LONG1: little-endian two's complement, 8 bytes
  return std::string("\x8a\x08", 2) + le(static_cast<uint64_t>(v), 8);
}
const std::string kStop = ".";

// A value tree, written as pickle.dump writes it: dicts and lists built with MARK ... SETITEMS
// and APPENDS.
struct Value {
  std::variant<int64_t, std::string, std::vector<Value>, std::vector<std::pair<std::string, Value>>>
      v;
};
Value I(int64_t x) { return {x}; }
Value S(std::string s) { return {std::move(s)}; }
Value L(std::vector<Value> items) { return {std::move(items)}; }
Value D(std::vector<std::pair<std::string, Value>> items) { return {std::move(items)}; }

std::string write(const Value& x) {
  if (auto* i = std::get_if<int64_t>(&x.v)) return long1(*i);
  if (auto* s = std::get_if<std::string>(&x.v)) return str(*s);
  if (auto* l = std::get_if<std::vector<Value>>(&x.v)) {
    std::string out = "](";  // EMPTY_LIST, MARK
    for (const Value& item : *l) out += write(item);
    return out + "e";  // APPENDS
  }
  std::string out = "}(";  // EMPTY_DICT, MARK
  for (const auto& [k, v] : std::get<std::vector<std::pair<std::string, Value>>>(x.v))
    out += str(k) + write(v);
  return out + "u";  // SETITEMS
}
std::string pickled(const Value& x) { return proto() + write(x) + kStop; }

// --- The reader --------------------------------------------------------------------------------

TEST(PickleReader, ReadsPlainData) {
  // {"a": 5, "b": [-1, 2.5, True, None, "x"], "c": (7, 8)}, memoized as protocol 4 does.
  std::string p = proto() + "}\x94(" + str("a") + "K\x05" + str("b") + "]\x94(" +
                  "\x8a\x01\xff" /* LONG1 -1 */ + "G" + std::string("\x40\x04\0\0\0\0\0\0", 8) +
                  "\x88N" + str("x") + "e" + str("c") + "K\x07M\x08\x00\x86"s + "u" + kStop;
  Result<Pickle> r = Pickle::read("t.pickle", p);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const Pickle& k = *r;
  ASSERT_EQ(k.kind(k.root()), K::kDict);
  EXPECT_EQ(k.node(k.get(k.root(), "a")).value, 5);
  int32_t b = k.get(k.root(), "b");
  ASSERT_EQ(k.kind(b), K::kList);
  const std::vector<int32_t>& items = k.items(b);
  ASSERT_EQ(items.size(), 5u);
  EXPECT_EQ(k.node(items[0]).value, -1);
  EXPECT_DOUBLE_EQ(k.node(items[1]).real, 2.5);
  EXPECT_EQ(k.kind(items[2]), K::kBool);
  EXPECT_EQ(k.node(items[2]).value, 1);
  EXPECT_EQ(k.kind(items[3]), K::kNone);
  EXPECT_EQ(k.string(items[4]), "x");
  int32_t c = k.get(k.root(), "c");
  ASSERT_EQ(k.kind(c), K::kTuple);  // TUPLE2 over the 16-bit BININT2
  EXPECT_EQ(k.node(k.items(c)[1]).value, 8);
  EXPECT_EQ(k.get(k.root(), "missing"), -1);
}

TEST(PickleReader, IntegersOfEveryWidthKeepTheirSign) {
  for (int64_t v : {int64_t{0}, int64_t{-1}, int64_t{1} << 40, -(int64_t{1} << 62),
                    int64_t{8466759680}}) {
    Result<Pickle> r = Pickle::read("t", proto() + long1(v) + kStop);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->node(r->root()).value, v);
  }
  Result<Pickle> n = Pickle::read("t", proto() + binint(-5) + kStop);  // BININT is signed
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->node(n->root()).value, -5);
  Result<Pickle> two = Pickle::read("t", proto() + "\x8a\x02\x00\x80"s + kStop);  // LONG1 -32768
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->node(two->root()).value, -32768);
  // More than 64 bits is no size or address of a snapshot.
  Result<Pickle> big = Pickle::read("t", proto() + "\x8a\x09" + std::string(9, '\x01') + kStop);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("64 bits"), std::string::npos) << big.error().message;
}

TEST(PickleReader, TheMemoSharesValuesAndASelfContainingListStaysFinite) {
  // l = [0]; l.append(l); (l, l): the memo gives the same list twice.
  std::string p = proto() + "(]\x94(K\x00h\x00"s /* BINGET 0 */ + "e" + "h\x00t"s + kStop;
  Result<Pickle> r = Pickle::read("t", p);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::vector<int32_t>& pair = r->items(r->root());
  ASSERT_EQ(pair.size(), 2u);
  EXPECT_EQ(pair[0], pair[1]);
  EXPECT_EQ(r->items(pair[0])[1], pair[0]);  // the list holds itself
  // A memo index never stored is refused.
  Result<Pickle> bad = Pickle::read("m.pickle", proto() + "h\x03" + kStop);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("m.pickle"), std::string::npos);
}

// Every prefix of a good pickle is refused (never read past the end), and so is every opcode
// that would run code or build an object: one line, naming the file.
TEST(PickleReader, RefusesTruncatedAndHostilePickles) {
  std::string good = pickled(D({{"segments", L({D({{"total_size", I(2 * MiB)}})})}}));
  ASSERT_TRUE(Pickle::read("t", good).ok());
  for (size_t n = 0; n < good.size(); ++n) {
    Result<Pickle> r = Pickle::read("cut.pickle", good.substr(0, n));
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.error().message.rfind("cut.pickle: ", 0), 0u) << r.error().message;
    EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
  }
  const std::vector<std::string> hostile = {
      proto() + "cos\nsystem\n" + kStop,                                // GLOBAL
      proto() + str("os") + str("system") + "\x93" + kStop,             // STACK_GLOBAL
      proto() + "N)R" + kStop,                                          // REDUCE
      proto() + "(lp0\n" + kStop,                                       // protocol 0's LIST
      proto() + "X" + le(0xfffffff0u, 4) + "ab" + kStop,                // a length past the end
      proto() + "]" + "e" + kStop,                                      // APPENDS with no MARK
      proto() + "K\x01K\x02" + kStop,                                   // two values left
      proto() + "}" + str("k") + "s" + kStop,                           // SETITEM missing a value
      proto() + "](" + str("k") + "K\x02" + "u" + kStop,                 // SETITEMS on a list
      proto(6) + "N" + kStop,                                           // an unknown protocol
  };
  for (const std::string& p : hostile) {
    Result<Pickle> r = Pickle::read("bad.pickle", p);
    ASSERT_FALSE(r.ok()) << testing::PrintToString(p);
    EXPECT_EQ(r.error().message.rfind("bad.pickle: not a readable pickle: ", 0), 0u)
        << r.error().message;
    EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
  }
  // Deep nesting is bounded by the mark stack, not the C++ stack.
  std::string deep = proto();
  for (int i = 0; i < 100000; ++i) deep += "](";
  Result<Pickle> d = Pickle::read("deep.pickle", deep + kStop);
  EXPECT_FALSE(d.ok());
}

// --- The snapshot ------------------------------------------------------------------------------

Value block(int64_t addr, int64_t size, const std::string& state) {
  return D({{"address", I(addr)}, {"size", I(size)}, {"requested_size", I(size)},
            {"state", S(state)}, {"frames", L({})}});
}
Value entry(const std::string& action, int64_t addr, int64_t size) {
  return D({{"action", S(action)}, {"addr", I(addr)}, {"size", I(size)}, {"stream", I(0)},
            {"frames", L({})}});
}

// A 20 MiB segment holding B (6 MiB) and C (2 MiB) at the snapshot; a 2 MiB small segment with
// one 512-byte block awaiting free. The trace: the segment, A (4 MiB) and B allocated, A freed,
// C allocated where A was. Allocated goes 0, 4, 10, 6, 6, 8 MiB (walked back from the snapshot):
// its peak, 10 MiB, is the state after three entries, with A (rebuilt from its request) and B.
TEST(MemorySnapshot, WalksTheTraceBackToTheAllocatedPeak) {
  const int64_t base = 1 << 30;
  Value snap = D({
      {"segments",
       L({D({{"device", I(0)}, {"address", I(base)}, {"total_size", I(20 * MiB)},
             {"segment_type", S("large")},
             {"blocks", L({block(base, 2 * MiB, "active_allocated"),
                           block(base + 2 * MiB, 2 * MiB, "inactive"),
                           block(base + 4 * MiB, 6 * MiB, "active_allocated"),
                           block(base + 10 * MiB, 10 * MiB, "inactive")})}}),
          D({{"device", I(0)}, {"address", I(2 * base)}, {"total_size", I(2 * MiB)},
             {"segment_type", S("small")},
             {"blocks", L({block(2 * base, 512, "active_awaiting_free"),
                           block(2 * base + 512, 2 * MiB - 512, "inactive")})}})})},
      {"device_traces",
       L({L({entry("segment_alloc", base, 20 * MiB), entry("alloc", base, 4 * MiB),
             entry("alloc", base + 4 * MiB, 6 * MiB), entry("free_requested", base, 4 * MiB - 100),
             entry("free_completed", base, 4 * MiB - 100), entry("alloc", base, 2 * MiB)})})},
  });
  Result<MemorySnapshot> r = read_memory_snapshot("s.pickle", pickled(snap));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->reserved, 22 * MiB);
  EXPECT_EQ(r->allocated, 8 * MiB);  // the block awaiting free is off allocated already
  EXPECT_EQ(r->trace_entries, 6u);
  EXPECT_EQ(r->max_allocated, 10 * MiB);
  EXPECT_EQ(r->peak_after, 3u);
  EXPECT_EQ(r->live_at_peak, (std::vector<int64_t>{6 * MiB, 4 * MiB}));
  EXPECT_EQ(r->rounded_blocks, 1u);  // A: its request, 4 MiB - 100, rounded to 512 bytes
  EXPECT_EQ(r->max_reserved, 22 * MiB);

  // As a record: rank from the name, the peak's entry named.
  Result<MemoryRecord> rec = read_memory_record("out/rank5_memory_snapshot.pickle", pickled(snap));
  ASSERT_TRUE(rec.ok()) << rec.error().message;
  EXPECT_EQ(rec->format, RecordFormat::kSnapshot);
  ASSERT_EQ(rec->ranks.size(), 1u);
  EXPECT_EQ(rec->ranks[0].rank, 5);
  EXPECT_EQ(*rec->ranks[0].max_allocated, 10 * MiB);
  EXPECT_EQ(rec->ranks[0].context, "trace entry 3 of 6");
  EXPECT_EQ(rec->ranks[0].live_blocks, (std::vector<int64_t>{6 * MiB, 4 * MiB}));
}

TEST(MemorySnapshot, TheRankComesFromTheFileName) {
  Value snap = D({{"segments", L({})}, {"device_traces", L({})}});
  for (auto [name, rank] : std::vector<std::pair<std::string, int64_t>>{
           {"step_000000000010/000003_step_10.pickle", 3},  // torchtitan's
           {"/tmp/rank12_memory_snapshot.pickle", 12},
           {"snapshot.pickle", 0}}) {
    Result<MemoryRecord> r = read_memory_record(name, pickled(snap));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->ranks[0].rank, rank) << name;
    EXPECT_EQ(r->ranks[0].context.find("rank 0 assumed") != std::string::npos, rank == 0 && name == "snapshot.pickle");
  }
}

// Without a trace the snapshot's own blocks are the record: max allocated is what was allocated
// when it was taken.
TEST(MemorySnapshot, WithoutATraceTheSnapshotsBlocksAreTheRecord) {
  Value snap = D({{"segments", L({D({{"total_size", I(20 * MiB)},
                                     {"blocks", L({block(0, 12 * MiB, "active_allocated")})}})})}});
  Result<MemorySnapshot> r = read_memory_snapshot("s", pickled(snap));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->max_allocated, 12 * MiB);
  EXPECT_EQ(r->max_reserved, 20 * MiB);
  EXPECT_EQ(r->trace_entries, 0u);
  EXPECT_EQ(r->live_at_peak, (std::vector<int64_t>{12 * MiB}));
}

TEST(MemorySnapshot, RefusesWhatIsNotOneDevicesSnapshot) {
  auto refused = [](const Value& v, const std::string& what) {
    Result<MemorySnapshot> r = read_memory_snapshot("x.pickle", pickled(v));
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.error().message.rfind("x.pickle: ", 0), 0u) << r.error().message;
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
  };
  refused(D({{"blocks", L({})}}), "no \"segments\" list");
  refused(L({}), "no \"segments\" list");
  refused(D({{"segments", L({D({{"device", I(0)}, {"total_size", I(2 * MiB)}, {"blocks", L({})}}),
                             D({{"device", I(1)}, {"total_size", I(2 * MiB)}, {"blocks", L({})}})})}}),
          "devices 0 and 1");
  refused(D({{"segments", L({D({{"total_size", I(-2)}, {"blocks", L({})}})})}}), "total_size");
  refused(D({{"segments", L({D({{"total_size", I(2 * MiB)},
                                {"blocks", L({D({{"size", I(512)}, {"address", I(0)}})})}})})}}),
          "\"state\"");
  // An alloc whose block is not live after it: the trace does not lead to the segments.
  refused(D({{"segments", L({D({{"total_size", I(2 * MiB)}, {"blocks", L({})}})})},
             {"device_traces", L({L({entry("alloc", 4096, 512)})})}}),
          "entry 0 allocates a block that is not live after it");
  // A segment freed that was never counted: reserved below zero before it.
  refused(D({{"segments", L({})},
             {"device_traces", L({L({entry("segment_alloc", 0, 2 * MiB)})})}}),
          "below zero");
}

}  // namespace
}  // namespace np

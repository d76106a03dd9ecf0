// The caching allocator model (planner/schedule/caching_allocator.hpp) on traces derived by hand
// from PyTorch's rules, one rule each: size rounding and power-of-two divisions, the small and
// large pools and their segment sizes, best fit, splitting thresholds, merging only within a
// segment, the oversize rules of max_split_size_mb, the out-of-memory retry, expandable
// segments, pools per stream, and the option parser.
#include "planner/schedule/caching_allocator.hpp"

#include <gtest/gtest.h>

#include "planner/schedule/schedule.hpp"
#include "test_util.hpp"

namespace np {
namespace {

constexpr int64_t M = 1 << 20;

TEST(CachingAllocator, SmallPoolPacksMergesAndLargeRequestsGetTwentyMiB) {
  CachingAllocator a;
  int32_t b1 = *a.malloc(1000);  // rounds to 1024; a 2 MiB small segment, split
  EXPECT_EQ(a.block_size(b1), 1024);
  EXPECT_EQ(a.allocated(), 1024);
  EXPECT_EQ(a.reserved(), 2 * M);
  int32_t b2 = *a.malloc(3 * M);  // 1-10 MiB: a 20 MiB segment, split (17 MiB > 1 MiB left)
  EXPECT_EQ(a.allocated(), 3 * M + 1024);
  EXPECT_EQ(a.reserved(), 22 * M);
  a.free(b1);  // merges with the rest of its segment; nothing released
  EXPECT_EQ(a.allocated(), 3 * M);
  EXPECT_EQ(a.reserved(), 22 * M);
  a.malloc(600);  // reuses the small segment
  EXPECT_EQ(a.allocated(), 3 * M + 1024);
  EXPECT_EQ(a.reserved(), 22 * M);
  EXPECT_EQ(a.segments(), 2);
  EXPECT_EQ(a.max_allocated(), 3 * M + 1024);
  EXPECT_EQ(a.max_reserved(), 22 * M);
  a.free(b2);
  EXPECT_EQ(a.requested(), 600);
}

TEST(CachingAllocator, NoSplitWhenAtMostOneMiBWouldRemain) {
  CachingAllocator a;
  int32_t b = *a.malloc(19 * M + 1);  // rounds to 19,923,456; segment 20 MiB; 1,048,064 left
  EXPECT_EQ(a.block_size(b), 20 * M);
  EXPECT_EQ(a.allocated(), 20 * M);
  EXPECT_EQ(a.requested(), 19 * M + 1);
  CachingAllocator c;
  c.malloc(9 * M);                     // a 20 MiB segment: 9 MiB used, 11 MiB cached
  int32_t rest = *c.malloc(11010048);  // 10.5 MiB: best fit, 512 KiB left, so the whole 11 MiB
  EXPECT_EQ(c.block_size(rest), 11 * M);
  EXPECT_EQ(c.allocated(), 20 * M);
  EXPECT_EQ(c.reserved(), 20 * M);
}

TEST(CachingAllocator, NoMergingAcrossSegments) {
  CachingAllocator a;
  int32_t x = *a.malloc(12 * M), y = *a.malloc(12 * M);  // 10 MiB and up: exactly 12 MiB each
  EXPECT_EQ(a.reserved(), 24 * M);
  a.free(x), a.free(y);
  a.malloc(20 * M);  // two free 12 MiB segments cannot serve 20 MiB
  EXPECT_EQ(a.reserved(), 44 * M);
  EXPECT_EQ(a.max_allocated(), 24 * M);
  EXPECT_EQ(a.max_reserved(), 44 * M);
}

TEST(CachingAllocator, OutOfMemoryReleasesCachedSegmentsAndRetries) {
  CachingAllocator a({.capacity = 40 * M});
  int32_t x = *a.malloc(12 * M), y = *a.malloc(12 * M);
  a.free(x), a.free(y);
  ASSERT_TRUE(a.malloc(20 * M).has_value());  // 24 + 20 > 40: the cache is released first
  EXPECT_EQ(a.reserved(), 20 * M);
  EXPECT_EQ(a.max_reserved(), 24 * M);
  EXPECT_EQ(a.segments(), 1);
  EXPECT_FALSE(a.malloc(30 * M).has_value());  // 20 in use + 30 > 40: out of memory
}

TEST(CachingAllocator, MaxSplitSizeKeepsOversizeBlocksWhole) {
  CachingAllocator a(*parse_allocator_conf("max_split_size_mb:20"));
  int32_t big = *a.malloc(40 * M);
  EXPECT_EQ(a.block_size(big), 40 * M);  // not split: at least max_split_size
  a.free(big);
  int32_t again = *a.malloc(30 * M);  // oversize, but less than 20 MiB larger: reused whole
  EXPECT_EQ(a.block_size(again), 40 * M);
  EXPECT_EQ(a.reserved(), 40 * M);
  a.free(again);
  int32_t s = *a.malloc(19 * M);  // below max_split: the oversize block is refused
  EXPECT_EQ(a.block_size(s), 20 * M);  // a new 20 MiB segment, exactly 1 MiB left: not split
  EXPECT_EQ(a.reserved(), 60 * M);
  a.malloc(12 * M);
  EXPECT_EQ(a.reserved(), 72 * M);
  EXPECT_EQ(a.max_allocated(), 40 * M);
  EXPECT_EQ(a.max_reserved(), 72 * M);
  CachingAllocator b(*parse_allocator_conf("max_split_size_mb:20"));
  b.free(*b.malloc(64 * M));
  b.malloc(40 * M);  // 64 >= 40 + 20: refused, a new segment
  EXPECT_EQ(b.reserved(), 104 * M);
}

TEST(CachingAllocator, MaxSplitSizeReleasesOversizeBlocksBeforeTheWholeCache) {
  AllocatorConfig c = *parse_allocator_conf("max_split_size_mb:20");
  c.capacity = 100 * M;
  CachingAllocator a(c);
  int32_t small = *a.malloc(1000);  // a 2 MiB small segment, kept busy
  int32_t big = *a.malloc(80 * M);
  a.free(big);
  // 80 MiB is 20 MiB or more above 50: not reused; 82 + 50 > 100, so it is released first.
  ASSERT_TRUE(a.malloc(50 * M).has_value());
  EXPECT_EQ(a.reserved(), 52 * M);
  EXPECT_EQ(a.segments(), 2);
  a.free(small);
}

TEST(CachingAllocator, PowerOfTwoDivisions) {
  AllocatorConfig four = *parse_allocator_conf("roundup_power2_divisions:4");
  EXPECT_EQ(CachingAllocator::round_size(1200, four), 1536);  // not above 512 x 4: 512 B steps
  EXPECT_EQ(CachingAllocator::round_size(3000, four), 3072);
  EXPECT_EQ(CachingAllocator::round_size(1000000, four), 1048576);
  EXPECT_EQ(CachingAllocator::round_size(1048577, four), 1310720);
  EXPECT_EQ(CachingAllocator::round_size(5 * M + 1, four), 6 * M);
  EXPECT_EQ(CachingAllocator::round_size(4 * M, four), 4 * M);  // a power of two stays
  AllocatorConfig list = *parse_allocator_conf("roundup_power2_divisions:[64:8,>:2]");
  EXPECT_EQ(CachingAllocator::round_size(100 * M, list), 104 * M);
  EXPECT_EQ(CachingAllocator::round_size(200 * M, list), 256 * M);
  EXPECT_EQ(CachingAllocator::round_size(3 * M + 1, list), 3 * M + 256 * 1024);  // 8 below 64
  AllocatorConfig none;
  EXPECT_EQ(CachingAllocator::round_size(1, none), 512);
  EXPECT_EQ(CachingAllocator::round_size(1200, none), 1536);
  CachingAllocator a(four);
  a.malloc(5 * M + 1);
  EXPECT_EQ(a.allocated(), 6 * M);
  EXPECT_EQ(a.reserved(), 20 * M);
}

TEST(CachingAllocator, ExpandableSegmentsMapPagesAtTheEnd) {
  CachingAllocator a(*parse_allocator_conf("expandable_segments:True"));
  a.malloc(3 * M);  // one 20 MiB page mapped
  EXPECT_EQ(a.reserved(), 20 * M);
  int32_t b = *a.malloc(18 * M);  // the free 17 MiB at the end, and one more page
  EXPECT_EQ(a.allocated(), 21 * M);
  EXPECT_EQ(a.reserved(), 40 * M);
  a.malloc(1000);  // the small pool's own segment: one 2 MiB page
  EXPECT_EQ(a.reserved(), 42 * M);
  a.free(b);  // merges with the free 19 MiB after it; nothing unmapped
  EXPECT_EQ(a.reserved(), 42 * M);
  int32_t c = *a.malloc(36 * M);  // fits the 37 MiB free block; split with 1 MiB left
  EXPECT_EQ(a.block_size(c), 36 * M);
  EXPECT_EQ(a.max_allocated(), 39 * M + 1024);
  EXPECT_EQ(a.max_reserved(), 42 * M);
  EXPECT_EQ(a.segments(), 2);
  a.empty_cache();  // the free 1 MiB at the end is a part of a page: nothing unmapped
  EXPECT_EQ(a.reserved(), 42 * M);
  a.free(c);
  a.empty_cache();  // now the whole pages after the 3 MiB block go: 20 MiB stays mapped
  EXPECT_EQ(a.reserved(), 22 * M);
}

// Pools per stream: a block cached by one stream never serves another (BlockComparatorSize orders
// by stream first; get_free_block takes only the request's stream), in both pools; each stream
// grows its own expandable segment; empty_cache releases every stream's cached segments; the
// out-of-memory retry releases other streams' cache too.
TEST(CachingAllocator, EachStreamHasItsOwnPools) {
  CachingAllocator a;
  int32_t side = *a.malloc(4 * M, 1);  // stream 1: a 20 MiB segment
  int32_t tiny = *a.malloc(1000, 1);   // and a 2 MiB small segment
  a.free(side), a.free(tiny);
  EXPECT_EQ(a.reserved(), 22 * M);
  int32_t mine = *a.malloc(4 * M);  // stream 0 cannot take stream 1's cached 20 MiB
  a.malloc(1000);                   // nor its small segment
  EXPECT_EQ(a.reserved(), 44 * M);
  EXPECT_EQ(a.segments(), 4);
  a.malloc(4 * M, 1);  // stream 1 reuses its own
  a.malloc(16 * M);    // stream 0: the 16 MiB left of its own segment
  EXPECT_EQ(a.reserved(), 44 * M);
  a.free(mine);
  a.empty_cache();  // only stream 1's small segment is whole and free: the others hold a block
  EXPECT_EQ(a.reserved(), 42 * M);
  EXPECT_EQ(a.segments(), 3);
  EXPECT_THROW(a.malloc(1000, -1), std::invalid_argument);

  CachingAllocator e(*parse_allocator_conf("expandable_segments:True"));
  int32_t x = *e.malloc(3 * M);  // stream 0's segment: one 20 MiB page
  e.malloc(3 * M, 2);            // stream 2's own segment and page
  EXPECT_EQ(e.reserved(), 40 * M);
  EXPECT_EQ(e.segments(), 2);
  e.malloc(17 * M, 2);  // stream 2: the free 17 MiB at its end
  EXPECT_EQ(e.reserved(), 40 * M);
  e.free(x);
  e.malloc(18 * M, 2);  // stream 2 maps a page of its own; stream 0's free 20 MiB stays unused
  EXPECT_EQ(e.reserved(), 60 * M);
  e.empty_cache();  // stream 0's page goes; stream 2's free 2 MiB is a part of a page
  EXPECT_EQ(e.reserved(), 40 * M);

  CachingAllocator full({.capacity = 40 * M});
  int32_t y = *full.malloc(12 * M, 1);
  full.free(y);
  ASSERT_TRUE(full.malloc(30 * M).has_value());  // 12 + 30 > 40: stream 1's cache released first
  EXPECT_EQ(full.reserved(), 30 * M);
  EXPECT_EQ(full.max_reserved(), 30 * M);
  EXPECT_EQ(full.segments(), 1);
}

// A replay takes each event's stream.
TEST(CachingAllocator, ReplaysEventsOnTheirStreams) {
  std::vector<MemEvent> events = {{0, 1, 3 * M, true, 1}, {1, 1, 3 * M, false, 1},
                                  {2, 2, 3 * M, true, 0}, {3, 2, 3 * M, false, 0}};
  EXPECT_EQ(replay_allocator(events, {}).max_reserved, 40 * M);
  for (MemEvent& e : events) e.stream = 0;
  EXPECT_EQ(replay_allocator(events, {}).max_reserved, 20 * M);
}

TEST(CachingAllocator, SmallSegmentFillsExactly) {
  CachingAllocator a;
  for (int i = 0; i < 2048; ++i) a.malloc(1024);
  EXPECT_EQ(a.allocated(), 2 * M);
  EXPECT_EQ(a.reserved(), 2 * M);
  a.malloc(1024);
  EXPECT_EQ(a.reserved(), 4 * M);
  EXPECT_EQ(a.segments(), 2);
}

TEST(CachingAllocator, OptionsAreParsedAsPyTorchParsesThem) {
  AllocatorConfig c = *parse_allocator_conf(
      "expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6");
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c.max_split_size, 128 * M);
  EXPECT_FALSE(parse_allocator_conf("expandable_segments:true").ok());  // True/False only
  EXPECT_FALSE(parse_allocator_conf("max_split_size_mb:19").ok());      // at least 20
  EXPECT_FALSE(parse_allocator_conf("roundup_power2_divisions:3").ok());
  EXPECT_FALSE(parse_allocator_conf("roundup_power2_divisions:[48:4]").ok());
  Result<AllocatorConfig> unknown = parse_allocator_conf("max_split_size:128");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("unknown key 'max_split_size' (valid: "),
            std::string::npos)
      << unknown.error().message;
  AllocatorConfig list = *parse_allocator_conf("roundup_power2_divisions:[1:4,256:8,>:1]");
  EXPECT_EQ(list.roundup_divisions[0], 4);
  EXPECT_EQ(list.roundup_divisions[7], 0);  // between two entries: the default
  EXPECT_EQ(list.roundup_divisions[8], 8);
  EXPECT_EQ(list.roundup_divisions[9], 1);
}

TEST(CachingAllocator, ReplaysARanksEvents) {
  // Tensor 1: 3 MiB, tensor 2: 1000 B, tensor 1 freed, tensor 3: 18 MiB (the cached 20 MiB
  // segment is too small once tensor 1's 3 MiB merged back: 20 MiB fits 18, so it is reused).
  std::vector<MemEvent> events = {{0, 1, 3 * M, true}, {0, 2, 1000, true}, {1, 1, 3 * M, false},
                                  {2, 3, 18 * M, true}, {3, 4, 0, true}};
  AllocatorReplay r = replay_allocator(events, {});
  EXPECT_EQ(r.max_allocated, 18 * M + 1024);
  EXPECT_EQ(r.max_reserved, 22 * M);
  EXPECT_EQ(r.segments, 2);
  EXPECT_EQ(r.out_of_memory_event, -1);
  AllocatorReplay full = replay_allocator(events, {.capacity = 21 * M});
  EXPECT_EQ(full.out_of_memory_event, 1);  // the small segment does not fit beside 20 MiB
}

// A real stage program: the allocator hands out at least the bytes the simulation counts (sizes
// rounded up, blocks not split), reserves at least what it hands out, and expandable segments
// reserve no more than whole segments do on this step (one stream, no releases).
TEST(CachingAllocator, ReplaysAScheduleAboveItsSimulatedPeak) {
  ModelSpec m = testing::model("llama-3.1-8b");
  TrainSpec t;
  t.tp = 2, t.sp = true, t.pp = 2, t.microbatches = 4, t.seq_len = 2048;
  t.pp_schedule = PpSchedule::k1F1B;
  Schedule s = build_schedule(m, t);
  for (const StageProgram& p : s.stages) {
    SimResult sim = simulate(p, {.events = true});
    AllocatorReplay caching = replay_allocator(sim.events, {});
    AllocatorReplay expandable = replay_allocator(sim.events, {.expandable_segments = true});
    EXPECT_GE(caching.max_allocated, sim.peak_bytes);
    EXPECT_LT(caching.max_allocated, sim.peak_bytes + sim.peak_bytes / 20);
    EXPECT_GE(caching.max_reserved, caching.max_allocated);
    EXPECT_GE(expandable.max_reserved, expandable.max_allocated);
    EXPECT_LE(expandable.max_reserved, caching.max_reserved);
  }
}

// An executor's memory behind the segments: each new segment is one map of its rounded size,
// blocks lie inside their segment, and a device with no room sends the allocator down PyTorch's
// path: the cached whole segments released (unmapped), then the retry.
TEST(CachingAllocator, SegmentsComeFromTheMemoryGiven) {
  struct Device : SegmentMemory {
    int64_t held = 0, limit = 40 * M;
    std::vector<std::pair<int64_t, int64_t>> maps;
    int unmaps = 0;
    bool map(int64_t base, int64_t bytes) override {
      if (held + bytes > limit) return false;
      held += bytes;
      maps.emplace_back(base, bytes);
      return true;
    }
    void unmap(int64_t, int64_t bytes) override { held -= bytes, ++unmaps; }
  } device;
  CachingAllocator a({}, &device);
  int32_t x = *a.malloc(12 * M), y = *a.malloc(12 * M + 1);
  ASSERT_EQ(device.maps.size(), 2u);
  EXPECT_EQ(device.maps[1].second, 14 * M);  // 12 MiB + 512 B, to 2 MiB
  EXPECT_GE(a.address(y), device.maps[1].first);
  EXPECT_LT(a.address(y), device.maps[1].first + device.maps[1].second);
  a.free(x);
  std::optional<int32_t> z = a.malloc(20 * M);  // 12 + 14 + 20 > 40: x's segment goes back
  ASSERT_TRUE(z);
  EXPECT_EQ(device.unmaps, 1);
  EXPECT_EQ(device.held, 34 * M);
  EXPECT_EQ(a.reserved(), device.held);
  EXPECT_FALSE(a.malloc(8 * M));  // a 20 MiB segment: no room even with nothing cached
}

// A run of steps: the statics (the first instruction's allocations) and the kept allocations
// once, then the step until a step reserves nothing new; or exactly as many steps as asked.
TEST(CachingAllocator, StepsReplayStaticsOnceToTheSteadyState) {
  const std::vector<MemEvent> events = {{0, 0, 12 * M, true},   // a static: never freed
                                        {1, 1, 18 * M, true},   // the step's tensor
                                        {1, 1, 18 * M, false}};
  AllocatorReplay r = replay_steps(events, {4 * M}, {});
  EXPECT_EQ(r.max_allocated, 34 * M);  // 12 + 4 + 18, each once
  // The kept 4 MiB takes a 20 MiB segment, whose 16 MiB rest cannot hold 18 MiB.
  EXPECT_EQ(r.max_reserved, (12 + 20 + 18) * M);
  EXPECT_EQ(r.steps, 2);  // the first step mapped a segment; the second nothing new
  EXPECT_TRUE(r.steady);
  AllocatorReplay three = replay_exact_steps(events, {4 * M}, {}, 3);
  EXPECT_EQ(three.steps, 3);
  EXPECT_EQ(three.max_reserved, r.max_reserved);
  AllocatorReplay one = replay_exact_steps(events, {4 * M}, {}, 1);
  EXPECT_EQ(one.steps, 1);
  EXPECT_FALSE(one.steady);  // its one step mapped a segment
}

}  // namespace
}  // namespace np

// Schedules: pipeline order and in-flight micro-batches, well-formedness of every program, the
// simulation's activation high-water mark, ZeRO sharding arithmetic and the stage partition.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>

#include "planner/schedule/schedule.hpp"
#include "planner/schedule/simulate.hpp"
#include "planner/schedule/contract.hpp"
#include "test_util.hpp"

namespace np {
namespace {

using testing::model;

int64_t max_in_flight(const std::vector<PipelinePass>& order) {
  int64_t live = 0, most = 0;
  for (PipelinePass p : order) most = std::max(most, live += p.forward ? 1 : -1);
  return most;
}

TEST(Pipeline, InFlightMatchesTheSchedules) {
  for (int64_t pp : {1, 2, 4, 8})
    for (int64_t m : {1, 2, 3, 8, 13})
      for (int64_t s = 0; s < pp; ++s) {
        auto afab = pipeline_order(PpSchedule::kAfab, s, pp, m);
        EXPECT_EQ(max_in_flight(afab), m);
        EXPECT_EQ(in_flight(PpSchedule::kAfab, s, pp, m), m);
        auto ofob = pipeline_order(PpSchedule::k1F1B, s, pp, m);
        EXPECT_EQ(max_in_flight(ofob), std::min(m, pp - s))
            << "pp " << pp << " m " << m << " stage " << s;
        EXPECT_EQ(in_flight(PpSchedule::k1F1B, s, pp, m), std::min(m, pp - s));
        EXPECT_EQ(static_cast<int64_t>(ofob.size()), 2 * m);
        // every micro-batch's forward comes before its backward
        for (int mb = 0; mb < m; ++mb) {
          auto f = std::find(ofob.begin(), ofob.end(), PipelinePass{true, mb, 0});
          auto b = std::find(ofob.begin(), ofob.end(), PipelinePass{false, mb, 0});
          EXPECT_LT(f, b);
        }
      }
}

// Megatron's interleaved order, checked against its definition by hand: pp 2, v 2, m 4 on stage
// 0 warms up with 2 (2 - 0 - 1) + (2 - 1) 2 = 4 forwards (mb 0, 1 on chunk 0, then on chunk 1),
// then alternates; its first backward is micro-batch 0 on the last chunk.
TEST(Pipeline, InterleavedOrderByHand) {
  using P = PipelinePass;
  std::vector<P> want = {{true, 0, 0},  {true, 1, 0},  {true, 0, 1},  {true, 1, 1},
                         {true, 2, 0},  {false, 0, 1}, {true, 3, 0},  {false, 1, 1},
                         {true, 2, 1},  {false, 0, 0}, {true, 3, 1},  {false, 1, 0},
                         {false, 2, 1}, {false, 3, 1}, {false, 2, 0}, {false, 3, 0}};
  EXPECT_EQ(pipeline_order(PpSchedule::kInterleaved, 0, 2, 4, 2), want);
  // The last stage warms up with (v - 1) pp = 2 forwards.
  auto last = pipeline_order(PpSchedule::kInterleaved, 1, 2, 4, 2);
  EXPECT_EQ(last[2], (P{true, 0, 1}));
  EXPECT_EQ(last[3], (P{false, 0, 1}));
  // m = pp is no exception (Megatron since mid-2024): the last stage warms up with
  // (v - 1) pp = 4 of the 6 forwards, then alternates; the first stage warms up with all 6.
  auto last3 = pipeline_order(PpSchedule::kInterleaved, 1, 2, 2, 3);
  for (int k = 0; k < 5; ++k) EXPECT_TRUE(last3[k].forward) << k;
  EXPECT_FALSE(last3[5].forward);
  auto first3 = pipeline_order(PpSchedule::kInterleaved, 0, 2, 2, 3);
  for (int k = 0; k < 6; ++k) EXPECT_TRUE(first3[k].forward) << k;
}

// Every (micro-batch, chunk) runs forward once and backward once, forward first; the passes alive
// at once match Korthikanti et al. 2022 (section 4.2): 2 (pp - s - 1) + (v - 1) pp + 1 on stage
// s (pp v + pp - 1 on the first), at most m v.
TEST(Pipeline, InterleavedPassesAndInFlight) {
  for (int64_t pp : {2, 3, 4, 8})
    for (int64_t v : {2, 3, 4})
      for (int64_t m : {pp, 2 * pp, 3 * pp, 5 * pp})
        for (int64_t s = 0; s < pp; ++s) {
          auto order = pipeline_order(PpSchedule::kInterleaved, s, pp, m, v);
          ASSERT_EQ(static_cast<int64_t>(order.size()), 2 * m * v);
          for (int mb = 0; mb < m; ++mb)
            for (int c = 0; c < v; ++c) {
              auto f = std::find(order.begin(), order.end(), PipelinePass{true, mb, c});
              auto b = std::find(order.begin(), order.end(), PipelinePass{false, mb, c});
              ASSERT_NE(f, order.end());
              ASSERT_NE(b, order.end());
              EXPECT_LT(f, b);
            }
          int64_t want = std::min(m * v, 2 * (pp - s - 1) + (v - 1) * pp + 1);
          EXPECT_EQ(max_in_flight(order), want) << "pp " << pp << " v " << v << " m " << m;
          EXPECT_EQ(chunk_passes_in_flight(PpSchedule::kInterleaved, s, pp, m, v), want);
          if (s == 0 && m > pp) {
            EXPECT_EQ(want, pp * v + pp - 1);
          }
        }
}

// The steps kept by chunk_loads bound every step: for random kept bytes per chunk and transient
// bytes per running chunk, the largest sum_c alive_c K_c + E_r over the kept steps equals the
// largest over every step of the order. Hand-derived for pp 4, v 2: the first stage peaks with 7
// passes of chunk 0 and 4 of chunk 1 (pp v + pp - 1 = 11) or 8 and 3; on stage 1 the steady
// state moves one pass at a time from (5, 4) to (8, 1), whose ends alone are kept.
TEST(Pipeline, ChunkLoadsBoundEveryStep) {
  using L = std::vector<ChunkLoad>;
  EXPECT_EQ(chunk_loads(PpSchedule::kInterleaved, 0, 4, 8, 2),
            (L{{{7, 4}, 0}, {{8, 3}, 0}, {{7, 4}, 1}, {{8, 3}, 1}}));
  EXPECT_EQ(chunk_loads(PpSchedule::kInterleaved, 1, 4, 8, 2),
            (L{{{5, 4}, 0}, {{8, 1}, 0}, {{5, 4}, 1}, {{8, 1}, 1}}));
  EXPECT_EQ(chunk_loads(PpSchedule::k1F1B, 1, 4, 8), (L{{{3}, 0}}));
  EXPECT_EQ(chunk_loads(PpSchedule::kAfab, 1, 4, 8), (L{{{8}, 0}}));
  std::mt19937_64 rng(31);
  int fewer = 0;
  for (int64_t pp : {2, 3, 4, 8})
    for (int64_t v : {2, 3, 4})
      for (int64_t m : {pp, 2 * pp, 3 * pp})
        for (int64_t s = 0; s < pp; ++s) {
          std::vector<ChunkLoad> kept = chunk_loads(PpSchedule::kInterleaved, s, pp, m, v);
          auto every_step = [&](int64_t mbs, std::vector<ChunkLoad>& into) {
            std::vector<int64_t> alive(v, 0);
            for (PipelinePass p : pipeline_order(PpSchedule::kInterleaved, s, pp, mbs, v)) {
              if (p.forward) ++alive[p.chunk];
              into.push_back({alive, p.chunk});
              if (!p.forward) --alive[p.chunk];
            }
          };
          std::vector<ChunkLoad> all;
          every_step(m, all);
          fewer += kept.size() < all.size();
          // Longer orders: every step is bounded by the kept steps of 2 pp micro-batches (what
          // the solver and the simulation take, simulation_setup).
          std::vector<ChunkLoad> longer;
          if (m == 2 * pp)
            for (int64_t more : {3 * pp, 4 * pp}) every_step(more, longer);
          for (int trial = 0; trial < 20; ++trial) {
            std::vector<int64_t> K(v), E(v);
            for (auto& k : K) k = std::uniform_int_distribution<int64_t>(0, 1000)(rng);
            for (auto& e : E) e = std::uniform_int_distribution<int64_t>(0, 3000)(rng);
            auto peak = [&](const std::vector<ChunkLoad>& steps) {
              int64_t most = 0;
              for (const ChunkLoad& l : steps) {
                int64_t at = E[l.running];
                for (int64_t c = 0; c < v; ++c) at += l.alive[c] * K[c];
                most = std::max(most, at);
              }
              return most;
            };
            ASSERT_EQ(peak(kept), peak(all)) << "pp " << pp << " v " << v << " m " << m;
            if (!longer.empty()) {
              ASSERT_EQ(peak(kept), peak(longer)) << "pp " << pp << " v " << v << " past 2 pp";
            }
          }
        }
  EXPECT_GT(fewer, 100);
}

TrainSpec small(int64_t tp, int64_t pp, Recompute r) {
  TrainSpec t;
  t.tp = tp, t.sp = tp > 1, t.pp = pp, t.recompute = r, t.seq_len = 32, t.microbatches = 3;
  return t;
}

int64_t stage_saved(const StageProgram& p) {
  int64_t n = 0;
  for (const StageBlock& b : p.blocks) n += b.saved.bytes;
  return n;
}

TEST(Schedule, EveryProgramIsWellFormed) {
  for (const char* name :
       {"llama-2-7b", "qwen2.5-7b", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "gpt-22b"}) {
    ModelSpec m = model(name);
    for (int64_t tp : {1, 2})
      for (int64_t pp : {1, 2, 4})
        for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
          for (PpSchedule ps : {PpSchedule::kAfab, PpSchedule::k1F1B})
            for (AttentionImpl att : {AttentionImpl::kFlash, AttentionImpl::kEager}) {
              TrainSpec t = small(tp, pp, r);
              t.pp_schedule = ps;
              t.attention = att;
              ASSERT_FALSE(validate_setup(m, t));
              Schedule s = build_schedule(m, t);
              ASSERT_EQ(static_cast<int64_t>(s.stages.size()), pp);
              for (const StageProgram& p : s.stages) {
                auto e = check_program(p);
                EXPECT_FALSE(e) << name << ": " << (e ? e->message : "");
                // The activation high-water mark is the saved set of every block on the stage times
                // the micro-batches in flight: all saved tensors of a micro-batch live from its
                // forward to its backward.
                EXPECT_EQ(simulate(p).max_by_category[static_cast<int>(Category::kActivation)],
                          stage_saved(p) * in_flight(ps, p.stage, pp, t.microbatches))
                    << name << " stage " << p.stage;
              }
            }
  }
}

// Interleaved, by hand: llama-2-7b (32 layers) over pp 4 x v 2 gives chunks of 4 layers; a
// middle stage (no embedding, no head) holds passes x (4 layers' saved bytes) at its activation
// high-water mark, with 2 (pp - s - 1) + (v - 1) pp + 1 passes: 9 on stage 1 and 7 on stage 2,
// where 1F1B holds 3 and 2 micro-batches of 8 layers (24 and 16 layer-passes against 36 and 28).
TEST(Schedule, InterleavedActivationsByHand) {
  ModelSpec m = model("llama-2-7b");
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    TrainSpec t = small(1, 4, r);
    t.microbatches = 8, t.pp_schedule = PpSchedule::kInterleaved, t.virtual_stages = 2;
    ASSERT_FALSE(validate_setup(m, t));
    EXPECT_EQ(chunk_layers(m, t), std::vector<int64_t>(8, 4));
    Schedule s = build_schedule(m, t);
    EXPECT_EQ(s.stages[1].layers(), (std::vector<int>{4, 5, 6, 7, 20, 21, 22, 23}));
    for (const StageProgram& p : s.stages) EXPECT_FALSE(check_program(p));
    const int64_t layer_saved = s.stages[1].blocks[0].saved.bytes;
    for (int stage : {1, 2}) {
      const StageProgram& p = s.stages[stage];
      int64_t passes = stage == 1 ? 9 : 7;
      EXPECT_EQ(simulate(p).max_by_category[static_cast<int>(Category::kActivation)],
                passes * 4 * layer_saved)
          << name_of(r) << " stage " << stage;
    }
  }
}

// simulation_setup caps the interleaved schedule at 3 pp micro-batches: every stage's peak and
// high-water marks are those of the full step.
TEST(Schedule, InterleavedSimulationCapKeepsThePeaks) {
  ModelSpec m = model("llama-2-7b");
  for (int64_t pp : {2, 3, 4})
    for (int64_t v : {2, 3, 4})
      for (int64_t k : {3, 4, 6}) {
        TrainSpec t = small(2, pp, Recompute::kSelective);
        t.pp_schedule = PpSchedule::kInterleaved, t.virtual_stages = v, t.microbatches = k * pp;
        ASSERT_FALSE(validate_setup(m, t));
        TrainSpec capped = simulation_setup(t);
        ASSERT_EQ(capped.microbatches, 2 * pp);
        Schedule full = build_schedule(m, t), sim = build_schedule(m, capped);
        for (int64_t st = 0; st < pp; ++st) {
          SimResult a = simulate(full.stages[st]), b = simulate(sim.stages[st]);
          EXPECT_EQ(a.peak_bytes, b.peak_bytes) << "pp " << pp << " v " << v << " stage " << st;
          EXPECT_EQ(a.max_by_category, b.max_by_category);
        }
      }
}

TEST(Schedule, ZeroStagesAreWellFormed) {
  ModelSpec m = model("mixtral-8x7b");
  for (int zero : {0, 1, 2, 3}) {
    TrainSpec t = small(2, 1, Recompute::kNone);
    t.zero = zero, t.dp = 4, t.ep = 2;
    Schedule s = build_schedule(m, t);
    EXPECT_FALSE(check_program(s.stages[0])) << "zero " << zero;
  }
}

// Tampering: drop a tensor the backward needs from the kept set; the checker names it.
TEST(Schedule, CheckerRejectsABackwardReadOfADroppedTensor) {
  Schedule s = build_schedule(model("llama-2-7b"), small(1, 1, Recompute::kNone));
  StageProgram& p = s.stages[0];
  StageBlock& layer = p.blocks[1];
  int qkv = -1;
  for (size_t i = 0; i < layer.graph->tensors.size(); ++i)
    if (layer.graph->tensors[i].name == "attn.rope") qkv = static_cast<int>(i);
  ASSERT_GE(qkv, 0);
  ASSERT_TRUE(layer.saved.saved[qkv]);
  layer.saved.saved[qkv] = false;
  auto e = check_program(p);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("L0/mb0/attn.rope, which was neither kept nor recomputed"),
            std::string::npos)
      << e->message;
}

// Live bytes past 2^63 - 1 are reported, never wrapped (signed overflow).
TEST(Simulate, OverflowIsReportedNotWrapped) {
  Schedule s = build_schedule(model("llama-2-7b"), small(1, 1, Recompute::kNone));
  StageProgram& p = s.stages[0];
  for (ScheduleTensor& t : p.tensors)
    if (t.kind == ValueKind::kValue) t.bytes = INT64_MAX / 2;
  try {
    simulate(p);
    FAIL() << "no overflow reported";
  } catch (const std::overflow_error& e) {
    EXPECT_NE(std::string(e.what()).find("exceed 2^63 - 1"), std::string::npos) << e.what();
  }
}

TEST(Schedule, CheckerRejectsUseAfterFreeAndDoubleFree) {
  Schedule s = build_schedule(model("llama-2-7b"), small(1, 1, Recompute::kNone));
  StageProgram p = s.stages[0];
  // Move the first free to the front: its tensor is then read after being freed (or never born).
  auto it = std::find_if(p.instrs.begin(), p.instrs.end(),
                         [](const Instr& i) { return i.kind == InstrKind::kFree; });
  ASSERT_NE(it, p.instrs.end());
  Instr f = *it;
  p.instrs.insert(p.instrs.begin() + 1, f);
  EXPECT_TRUE(check_program(p));
  StageProgram q = s.stages[0];
  q.instrs.pop_back();  // the optimizer step: still fine
  q.instrs.erase(std::find_if(q.instrs.begin(), q.instrs.end(),
                              [](const Instr& i) { return i.kind == InstrKind::kFree; }));
  auto e = check_program(q);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("never freed"), std::string::npos);
}

// Recompute segments: under full recompute every forward op of a layer runs once more per
// micro-batch; of the embedding and the head only the regathered all-gather re-runs.
TEST(Schedule, RecomputeCountsFollowThePolicy) {
  TrainSpec t = small(2, 1, Recompute::kFull);
  Schedule s = build_schedule(model("llama-2-7b"), t);
  const StageProgram& p = s.stages[0];
  int64_t fwd = 0, re = 0;
  for (const Instr& i : p.instrs) {
    if (i.kind == InstrKind::kForward && p.blocks[i.block].kind == BlockKind::kLayer) ++fwd;
    if (i.kind != InstrKind::kRecompute) continue;
    if (p.blocks[i.block].kind == BlockKind::kLayer) {
      ++re;
    } else {
      EXPECT_EQ(p.blocks[i.block].graph->ops[i.op].kind, OpKind::kAllGather) << p.instr_name(i);
    }
  }
  EXPECT_EQ(fwd, re);
  EXPECT_EQ(fwd, 32 * 3 * static_cast<int64_t>(p.blocks[1].graph->ops.size()));
}

int64_t static_bytes(const StageProgram& p, Category c) {
  int64_t n = 0;
  for (const ScheduleTensor& t : p.tensors)
    if (t.kind == ValueKind::kStatic && t.category == c) n += t.bytes;
  return n;
}

// ZeRO arithmetic on llama-2-7b at tp = 1: N = 6,738,415,616 parameters on one stage.
// ZeRO-1 shards the 12 B/param AdamW states over dp; ZeRO-2 also the gradients; ZeRO-3 also the
// bf16 weights. A rank holds ceil(N / dp) elements of each flat buffer.
TEST(Zero, ShardingArithmetic) {
  ModelSpec m = model("llama-2-7b");
  const int64_t N = 6'738'415'616, dp = 3, shard = (N + dp - 1) / dp;
  auto stage = [&](int zero) {
    TrainSpec t = small(1, 1, Recompute::kNone);
    t.dp = dp, t.zero = zero;
    return build_schedule(m, t).stages[0];
  };
  StageProgram z0 = stage(0), z1 = stage(1), z2 = stage(2), z3 = stage(3);
  EXPECT_EQ(static_bytes(z0, Category::kWeight), 2 * N);
  EXPECT_EQ(static_bytes(z0, Category::kGradient), 4 * N);  // fp32 accumulation buffer
  EXPECT_EQ(static_bytes(z0, Category::kOptimizer), 12 * N);
  EXPECT_EQ(static_bytes(z1, Category::kOptimizer), 12 * shard);
  EXPECT_EQ(static_bytes(z1, Category::kGradient),
            4 * N);  // nanotron: fp32 grads not sharded by ZeRO-1
  EXPECT_EQ(static_bytes(z2, Category::kGradient), 4 * shard);
  EXPECT_EQ(static_bytes(z2, Category::kWeight), 2 * N);
  EXPECT_EQ(static_bytes(z3, Category::kWeight), 2 * shard);
  EXPECT_EQ(shard, 2'246'138'539);  // 6,738,415,616 / 3 = 2,246,138,538.67, rounded up
}

// Context parallelism, by hand (llama-2-7b: 32 query and kv heads of 128, hidden 4096; tp 2 with
// SP, seq 8192): each rank holds 1 / cp of every sequence, so every tensor a layer keeps for
// backward halves at cp 2, under every named policy (the gathered K/V is exchanged again in
// backward, not kept); the exchange gathers all 8,192 tokens' K/V of the rank's 16 heads, 8,192 x
// 2 x 16 x 128 x 2 B = 64 MiB; ZeRO-1 shards over dp x cp.
TEST(ContextParallel, HalvesWhatALayerKeeps) {
  ModelSpec m = model("llama-2-7b");
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    TrainSpec t = small(2, 1, r);
    t.seq_len = 8192;
    TrainSpec c = t;
    c.cp = 2;
    ASSERT_FALSE(validate_setup(m, c));
    Schedule one = build_schedule(m, t), two = build_schedule(m, c);
    const StageBlock &l1 = one.stages[0].blocks[1], &l2 = two.stages[0].blocks[1];
    ASSERT_EQ(l1.kind, BlockKind::kLayer);
    EXPECT_EQ(2 * l2.saved.bytes, l1.saved.bytes) << name_of(r);
    EXPECT_EQ(2 * stage_saved(two.stages[0]), stage_saved(one.stages[0])) << name_of(r);
    const BlockGraph& g = *l2.graph;
    auto kv = std::find_if(g.ops.begin(), g.ops.end(),
                           [](const GraphOp& o) { return o.kind == OpKind::kCpGatherKv; });
    ASSERT_NE(kv, g.ops.end());
    EXPECT_EQ(g.tensors[kv->outputs[0]].type.bytes(), int64_t{8192} * 2 * 16 * 128 * 2);
    EXPECT_FALSE(l2.saved.saved[kv->outputs[0]]);
    EXPECT_FALSE(check_program(two.stages[0]));
  }
  const int64_t N = 6'738'415'616;
  TrainSpec z = small(1, 1, Recompute::kNone);
  z.seq_len = 8192, z.dp = 2, z.cp = 2, z.zero = 1;
  ASSERT_FALSE(validate_setup(m, z));
  EXPECT_EQ(static_bytes(build_schedule(m, z).stages[0], Category::kOptimizer), 12 * ((N + 3) / 4));
}

// Optimizer and gradient dtypes: SGD keeps fp32 master weights only (4 B/param), no optimizer
// keeps nothing, bf16 gradient accumulation halves the gradient buffer (2 B/param).
TEST(Zero, OptimizerAndGradientDtypes) {
  ModelSpec m = model("llama-2-7b");
  const int64_t N = 6'738'415'616;
  TrainSpec t = small(1, 1, Recompute::kNone);
  t.optimizer = Optimizer::kSgd;
  EXPECT_EQ(static_bytes(build_schedule(m, t).stages[0], Category::kOptimizer), 4 * N);
  t.optimizer = Optimizer::kNone;
  EXPECT_EQ(static_bytes(build_schedule(m, t).stages[0], Category::kOptimizer), 0);
  t.optimizer = Optimizer::kAdamW;
  t.grad_dtype = Dtype::kBf16;
  EXPECT_EQ(static_bytes(build_schedule(m, t).stages[0], Category::kGradient), 2 * N);
}

// ZeRO-2 keeps an unsharded gradient bucket of one layer alive during its backward, ZeRO-3 also
// gathers the layer's weights: both show up as transients of exactly the layer's weight bytes.
TEST(Zero, BucketsAndGatheredWeightsAreTransients) {
  ModelSpec m = model("llama-2-7b");
  const int64_t layer_weights =
      2 * 4096 + 4 * 4096LL * 4096 + 3 * 4096LL * 11008;  // norms, q k v o, gate up down
  for (int zero : {2, 3}) {
    TrainSpec t = small(1, 1, Recompute::kNone);
    t.dp = 2, t.zero = zero;
    const StageProgram p = build_schedule(m, t).stages[0];
    int buckets = 0, gathers = 0;
    for (const ScheduleTensor& x : p.tensors) {
      if (x.kind == ValueKind::kGradBucket && p.blocks[x.block].kind == BlockKind::kLayer) {
        EXPECT_EQ(x.bytes, 4 * layer_weights);  // fp32 gradients of the layer
        ++buckets;
      }
      if (x.kind == ValueKind::kParamGather && p.blocks[x.block].kind == BlockKind::kLayer) {
        EXPECT_EQ(x.bytes, 2 * layer_weights);  // bf16 weights of the layer
        ++gathers;
      }
    }
    EXPECT_EQ(buckets, 32 * 3);                      // one per layer per micro-batch
    EXPECT_EQ(gathers, zero == 3 ? 2 * 32 * 3 : 0);  // forward and backward
  }
}

// Tied embeddings under ZeRO-2/3 (gpt-22b, pp 1): the table is held once, but the LM head
// gathers it (ZeRO-3) and buckets its gradient (ZeRO-2/3) as the embedding does: the head's
// transients hold 51,200 x 6,144 table elements besides the final norm's weight and bias.
TEST(Zero, TiedTableIsGatheredAndBucketedByTheHeadToo) {
  ModelSpec m = model("gpt-22b");
  const int64_t table = 51200LL * 6144, norm = 2 * 6144;
  for (int zero : {2, 3}) {
    TrainSpec t = small(1, 1, Recompute::kNone);
    t.dp = 2, t.zero = zero;
    const StageProgram p = build_schedule(m, t).stages[0];
    int64_t bucket = 0, gather = 0;
    for (const ScheduleTensor& x : p.tensors)
      if (x.block >= 0 && p.blocks[x.block].kind == BlockKind::kHead) {
        if (x.kind == ValueKind::kGradBucket) bucket = x.bytes;
        if (x.kind == ValueKind::kParamGather) gather = x.bytes;
      }
    EXPECT_EQ(bucket, 4 * (table + norm)) << "zero " << zero;
    EXPECT_EQ(gather, zero == 3 ? 2 * (table + norm) : 0);
    EXPECT_FALSE(check_program(p));
  }
}

// Experts are replicated over dp / ep ranks, so their states shard over dp / ep, not dp.
TEST(Zero, ExpertStatesShardOverDpOverEp) {
  ModelSpec m = model("mixtral-8x7b");
  TrainSpec t = small(1, 1, Recompute::kNone);
  t.dp = 8, t.ep = 4, t.zero = 1;
  StageProgram p = build_schedule(m, t).stages[0];
  const int64_t expert = 32LL * 8 * 3 * 4096 * 14336 / 4;  // local experts of this rank
  const int64_t dense = 46'702'792'704 - 32LL * 8 * 3 * 4096 * 14336;
  EXPECT_EQ(static_bytes(p, Category::kWeight), 2 * (dense + expert));
  EXPECT_EQ(static_bytes(p, Category::kOptimizer), 12 * ((dense + 7) / 8 + (expert + 1) / 2));
}

// Tied embeddings: held once with pp = 1, on both the first and the last stage with pp > 1.
TEST(Weights, TiedEmbeddingsPerStage) {
  ModelSpec m = model("gpt-22b");
  const int64_t table = 51200LL * 6144 * 2;
  TrainSpec t = small(1, 1, Recompute::kNone);
  EXPECT_EQ(static_bytes(build_schedule(m, t).stages[0], Category::kWeight),
            2 * count_parameters(m));
  t.pp = 2;
  Schedule s = build_schedule(m, t);
  EXPECT_EQ(
      static_bytes(s.stages[0], Category::kWeight) + static_bytes(s.stages[1], Category::kWeight),
      2 * count_parameters(m) + table);
}

// Under 1F1B the memory peak of stage s stops changing once m reaches pp - s, its in-flight count
// (its warm-up and the first steady-state pair): the auto planner, the sweep and estimate simulate
// that many only.
TEST(Schedule, OneFOneBPeakIsPeriodicInMicrobatches) {
  for (const char* name : {"llama-2-7b", "mixtral-8x7b"})
    for (int64_t pp : {2, 3, 4, 5, 8})
      for (auto [r, zero] : {std::pair{Recompute::kNone, 0}, std::pair{Recompute::kFull, 0},
                             std::pair{Recompute::kSelective, 3}}) {
        TrainSpec t = small(2, pp, r);
        t.pp_schedule = PpSchedule::k1F1B;
        if (zero > 0) t.dp = 2, t.zero = zero;
        t.microbatches = pp + 1;
        Schedule capped = build_schedule(model(name), t);
        Schedule peak_only = build_schedule(model(name), t, nullptr, /*peak_only=*/true);
        for (int64_t s = 0; s < pp; ++s) {
          size_t mbs = 0;  // micro-batches the peak-only program loads or receives
          for (const Instr& i : peak_only.stages[s].instrs)
            mbs = std::max<size_t>(mbs, static_cast<size_t>(i.mb + 1));
          EXPECT_EQ(mbs, static_cast<size_t>(pp - s)) << name << " stage " << s;
          EXPECT_LE(peak_only.stages[s].instrs.size(), capped.stages[s].instrs.size());
        }
        for (int64_t m : {pp + 2, 3 * pp + 1}) {
          t.microbatches = m;
          Schedule full = build_schedule(model(name), t);
          for (int64_t s = 0; s < pp; ++s) {
            int64_t peak = simulate(full.stages[s]).peak_bytes;
            EXPECT_EQ(peak, simulate(capped.stages[s]).peak_bytes)
                << name << " m " << m << " stage " << s;
            EXPECT_EQ(peak, simulate(peak_only.stages[s]).peak_bytes)
                << name << " m " << m << " stage " << s << " (peak-only)";
          }
        }
      }
}

TEST(Partition, CoversEveryLayerOnceAndBalances) {
  for (int64_t pp : {1, 2, 3, 7, 16}) {
    TrainSpec t = small(8, pp, Recompute::kNone);
    std::vector<int64_t> counts = partition_layers(model("llama-3.1-405b"), t);
    ASSERT_EQ(static_cast<int64_t>(counts.size()), pp);
    int64_t total = 0;
    for (int64_t c : counts) {
      EXPECT_GE(c, 1);
      total += c;
    }
    EXPECT_EQ(total, 126);
    EXPECT_LE(*std::max_element(counts.begin(), counts.end()), (126 + pp - 1) / pp + 1);
  }
}

// A given partition is followed as given; StageStatics, which the partition search uses, equals
// the static bytes of the stage programs it stands for (ZeRO-1 sharding included).
TEST(Partition, GivenCountsAndStageStatics) {
  ModelSpec m = model("llama-2-7b");
  for (int zero : {0, 1}) {
    TrainSpec t = small(2, 3, Recompute::kNone);
    t.dp = 2, t.zero = zero;
    t.stage_layers = {5, 20, 7};
    Schedule s = build_schedule(m, t);
    StageStatics statics(m, t);
    ASSERT_EQ(s.stages.size(), 3u);
    for (int stage = 0; stage < 3; ++stage) {
      EXPECT_EQ(s.stages[stage].num_layers(), t.stage_layers[stage]);
      int64_t fixed = 0;
      for (const ScheduleTensor& x : s.stages[stage].tensors)
        if (x.kind == ValueKind::kStatic) fixed += x.bytes;
      EXPECT_EQ(statics(stage, static_cast<int>(t.stage_layers[stage])), fixed)
          << "stage " << stage << " zero " << zero;
    }
    EXPECT_EQ(s.stages[1].first_layer(), 5);
    EXPECT_EQ(s.stages[2].first_layer(), 25);
  }
}

}  // namespace
}  // namespace np

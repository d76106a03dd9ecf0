// FSDP2 (TrainSpec::fsdp; docs/fsdp.md): the sharded statics, each unit's all-gather, copy-out,
// reduce-scatter and gradient shard as PyTorch 2.10's fully_shard allocates them, the streams
// they are allocated on, the setups refused, and the auto planner's bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "planner/recompute/autoplan.hpp"
#include "planner/recompute/sweep.hpp"
#include "planner/report/plan_report.hpp"
#include "planner/schedule/contract.hpp"
#include "planner/schedule/schedule.hpp"
#include "planner/schedule/simulate.hpp"
#include "test_util.hpp"

namespace np {
namespace {

using testing::model;

TrainSpec fsdp_setup(int64_t dp) {
  TrainSpec t;
  t.dp = dp, t.fsdp = true, t.seq_len = 64, t.microbatches = 1;
  t.pp_schedule = PpSchedule::k1F1B;
  return t;
}

int64_t bytes_of(const StageProgram& p, ValueKind k, Category c, int mb = -2) {
  int64_t n = 0;
  for (const ScheduleTensor& x : p.tensors)
    if (x.kind == k && x.category == c && (mb == -2 || x.mb == mb)) n += x.bytes;
  return n;
}

// The figure: Llama-3.1-8B (8,030,261,248 parameters) on 8 GPUs under FSDP2 holds 16 B
// per parameter over 8: the fp32 shard of the weights (4 B, also AdamW's master), the fp32
// gradient shard (4 B) and AdamW's two fp32 moments (8 B). Every dim 0 of the model divides by 8,
// so nothing is padded.
TEST(Fsdp, StaticsAreSixteenBytesPerParameterOverTheShards) {
  const ModelSpec m = model("llama-3.1-8b");
  const int64_t N = 8'030'261'248;
  TrainSpec t = fsdp_setup(8);
  ASSERT_FALSE(validate_setup(m, t));
  // The planner's static bytes: with one micro-batch the gradient shards come as the activations
  // go (the simulation places them); with more, they are there through every later forward.
  EXPECT_EQ(StageStatics(m, t)(0, 32), 12 * N / 8);
  t.microbatches = 2;
  EXPECT_EQ(StageStatics(m, t)(0, 32), 16 * N / 8);
  const StageProgram p = build_schedule(m, t).stages[0];
  EXPECT_EQ(bytes_of(p, ValueKind::kStatic, Category::kWeight), 4 * N / 8);
  EXPECT_EQ(bytes_of(p, ValueKind::kStatic, Category::kOptimizer), 8 * N / 8);
  EXPECT_EQ(bytes_of(p, ValueKind::kStatic, Category::kGradient), 0);  // made by the backward
  EXPECT_EQ(bytes_of(p, ValueKind::kGradShard, Category::kGradient), 4 * N / 8);
  // HSDP 2 x 4: the same bytes over the 4 shards of a replica.
  t.dp_replicate = 2;
  ASSERT_FALSE(validate_setup(m, t));
  EXPECT_EQ(StageStatics(m, t)(0, 32), 16 * N / 4);
}

// Each parameter is padded on dim 0 to a multiple of the shard group (FSDPParam's
// padded_sharded_param_size): Llama-2-7B over 3 holds ceil(rows / 3) rows of every matrix and
// vector. By hand, the nanotron layer's weights: the two RMSNorm weights [4096], [q | k | v]
// [12288, 4096], o [4096, 4096], [gate | up] [22016, 4096], down [4096, 11008]; the embedding and
// the LM head [32000, 4096]; the final norm [4096].
TEST(Fsdp, EveryParameterIsPaddedOnDimZero) {
  const ModelSpec m = model("llama-2-7b");
  const int64_t r4096 = (4096 + 2) / 3, table = (32000 + 2) / 3 * 4096;  // 1,366 and 10,667 rows
  const int64_t layer = 2 * r4096 + 12288 / 3 * 4096 + r4096 * 4096 + (22016 + 2) / 3 * 4096 +
                        r4096 * 11008;
  const int64_t shard = 2 * table + 32 * layer + r4096;
  TrainSpec t = fsdp_setup(3);
  ASSERT_FALSE(validate_setup(m, t));
  const StageProgram p = build_schedule(m, t).stages[0];
  EXPECT_EQ(bytes_of(p, ValueKind::kStatic, Category::kWeight), 4 * shard);
  EXPECT_EQ(bytes_of(p, ValueKind::kGradShard, Category::kGradient), 4 * shard);
  // A layer's all-gather output, unsharded weights and reduce-scatter input hold 3 shards.
  for (const ScheduleTensor& x : p.tensors) {
    if (x.block < 0 || p.blocks[x.block].kind != BlockKind::kLayer) continue;
    if (x.kind == ValueKind::kAllGatherBuffer || x.kind == ValueKind::kParamGather)
      EXPECT_EQ(x.bytes, 2 * 3 * layer);
    if (x.kind == ValueKind::kReduceScatterInput) EXPECT_EQ(x.bytes, 4 * 3 * layer);
    if (x.kind == ValueKind::kGradShard) EXPECT_EQ(x.bytes, 4 * layer);
  }
}

// What each unit allocates per micro-batch, and on which stream. Resharded after forward, a
// decoder layer is all-gathered twice (forward and backward) and copied out twice; the head
// (final norm and output layer, never resharded) once; kept, every unit once. One reduce-scatter
// input per unit per micro-batch; the first micro-batch's output shard is the gradient (to the
// optimizer step), a later one's is added into it and freed.
TEST(Fsdp, UnitsGatherAndReduceAsFullyShardDoes) {
  const ModelSpec m = model("llama-2-7b");
  for (bool reshard : {true, false}) {
    TrainSpec t = fsdp_setup(2);
    t.reshard_after_forward = reshard, t.microbatches = 3;
    ASSERT_FALSE(validate_setup(m, t));
    const StageProgram p = build_schedule(m, t).stages[0];
    ASSERT_FALSE(check_program(p));
    std::map<std::pair<BlockKind, ValueKind>, int> count;
    for (const ScheduleTensor& x : p.tensors)
      if (x.block >= 0) ++count[{p.blocks[x.block].kind, x.kind}];
    const int per_layer = reshard ? 2 : 1;
    EXPECT_EQ((count[{BlockKind::kLayer, ValueKind::kAllGatherBuffer}]), 32 * 3 * per_layer);
    EXPECT_EQ((count[{BlockKind::kLayer, ValueKind::kParamGather}]), 32 * 3 * per_layer);
    EXPECT_EQ((count[{BlockKind::kEmbedding, ValueKind::kAllGatherBuffer}]), 3 * per_layer);
    EXPECT_EQ((count[{BlockKind::kHead, ValueKind::kAllGatherBuffer}]), 3);
    EXPECT_EQ((count[{BlockKind::kLayer, ValueKind::kReduceScatterInput}]), 32 * 3);
    EXPECT_EQ((count[{BlockKind::kLayer, ValueKind::kGradShard}]), 32 * 3);
    // Each weight's bf16 gradient is its own tensor: 4 linears and 2 norms per layer.
    EXPECT_EQ((count[{BlockKind::kLayer, ValueKind::kGradBucket}]), 32 * 3 * 6);
    for (const ScheduleTensor& x : p.tensors)
      if (x.kind == ValueKind::kGradShard)
        EXPECT_EQ(x.category, x.mb == 0 ? Category::kGradient : Category::kTransient);
    // Streams: the all-gather outputs on the copy-in stream, the shards on the reduce-scatter's.
    const SimResult r = simulate(p, {.events = true, .canonical = false});
    int side = 0;
    for (const MemEvent& e : r.events) {
      if (!e.alloc) continue;
      const ValueKind k = p.tensors[e.tensor].kind;
      EXPECT_EQ(e.stream, k == ValueKind::kAllGatherBuffer || k == ValueKind::kAllGatherInput ? 1
                          : k == ValueKind::kGradShard                                        ? 2
                                                                                               : 0);
      side += e.stream != 0;
    }
    EXPECT_EQ(side, 2 * (34 * 3 * per_layer - (reshard ? 3 : 0)) + 34 * 3);
    // Each all-gather's input is this rank's bf16 shards: half the output over 2 ranks.
    for (const ScheduleTensor& x : p.tensors)
      if (x.kind == ValueKind::kAllGatherInput && p.blocks[x.block].kind == BlockKind::kLayer)
        EXPECT_EQ(x.bytes, 2 * (2 * 4096 + 4 * 4096LL * 4096 + 3 * 4096LL * 11008) / 2);
  }
}

// The buffers a decoder layer's backward holds beside the activations, by hand (Llama-2-7B over
// 2, one micro-batch, no recompute): while layer 16 runs its backward, its unsharded weights
// (2 N), layer 15's prefetched all-gather output (2 N) and layer 17's reduce-scatter input (4 N)
// are live; its bf16 gradients (2 N) come as its backward runs.
TEST(Fsdp, ALayersBackwardHoldsItsNeighboursBuffers) {
  const ModelSpec m = model("llama-2-7b");
  const int64_t N = 2 * 4096 + 4 * 4096LL * 4096 + 3 * 4096LL * 11008;  // divides by 2
  TrainSpec t = fsdp_setup(2);
  const StageProgram p = build_schedule(m, t).stages[0];
  const SimResult r = simulate(p, {.timeline = true});
  // The layer blocks are 1..32: layer 16 is block 17. Find its first backward instruction.
  int32_t at = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(p.instrs.size()); ++i)
    if (p.instrs[i].kind == InstrKind::kBackward && p.instrs[i].block == 17) {
      at = i;
      break;
    }
  ASSERT_GE(at, 0);
  std::map<ValueKind, int64_t> live;
  std::vector<int32_t> alive(p.tensors.size(), 0);
  for (int32_t i = 0; i <= at; ++i) {
    const Instr& in = p.instrs[i];
    if (in.kind == InstrKind::kFree) alive[p.reads(in)[0]] = 0;
    else
      for (int32_t id : p.allocs(in)) alive[id] = 1;
  }
  for (size_t id = 0; id < p.tensors.size(); ++id)
    if (alive[id] && p.tensors[id].kind != ValueKind::kStatic)
      live[p.tensors[id].kind] += p.tensors[id].bytes;
  EXPECT_EQ(live[ValueKind::kParamGather], 2 * N);
  EXPECT_EQ(live[ValueKind::kAllGatherBuffer], 2 * N);
  EXPECT_EQ(live[ValueKind::kReduceScatterInput], 4 * N);
  EXPECT_LE(live[ValueKind::kGradBucket], 2 * N);
  // The gradient shards of layers 17..31 and the head, made so far.
  EXPECT_GT(live[ValueKind::kGradShard], 15 * 4 * N / 2);
  EXPECT_GT(r.peak_bytes, 0);
}

// Under PP (torch.distributed.pipelining with FSDP2): each unit is gathered once, at its first
// forward, and kept; each micro-batch's bf16 gradients are added into one fp32 unsharded gradient
// per unit; after the last backward every unit is reduce-scattered once, in module order, into
// its gradient shard.
TEST(Fsdp, APipelineStageGathersOnceAndReducesAtTheEnd) {
  const ModelSpec m = model("llama-2-7b");
  const int64_t N = 2 * 4096 + 4 * 4096LL * 4096 + 3 * 4096LL * 11008;  // a layer's weights
  TrainSpec t = fsdp_setup(2);
  t.pp = 2, t.reshard_after_forward = false, t.microbatches = 4;
  ASSERT_FALSE(validate_setup(m, t));
  const Schedule s = build_schedule(m, t);
  for (const StageProgram& p : s.stages) {
    ASSERT_FALSE(check_program(p));
    std::map<ValueKind, int> count;
    int accumulated = 0;
    for (const ScheduleTensor& x : p.tensors) {
      if (x.block < 0) continue;
      ++count[x.kind];
      if (x.kind == ValueKind::kGradBucket && x.category == Category::kGradient) {
        ++accumulated;
        if (p.blocks[x.block].kind == BlockKind::kLayer) EXPECT_EQ(x.bytes, 4 * N);
      }
    }
    const int units = static_cast<int>(p.blocks.size());
    EXPECT_EQ(count[ValueKind::kAllGatherBuffer], units) << "stage " << p.stage;
    EXPECT_EQ(count[ValueKind::kParamGather], units);
    EXPECT_EQ(count[ValueKind::kReduceScatterInput], units);
    EXPECT_EQ(count[ValueKind::kGradShard], units);
    EXPECT_EQ(accumulated, units);
    // The reduce-scatters come after every backward.
    int32_t last_backward = -1, first_reduce = -1;
    for (int32_t i = 0; i < static_cast<int32_t>(p.instrs.size()); ++i) {
      if (p.instrs[i].kind == InstrKind::kBackward) last_backward = i;
      for (int32_t id : p.allocs(p.instrs[i]))
        if (p.tensors[id].kind == ValueKind::kReduceScatterInput && first_reduce < 0)
          first_reduce = i;
    }
    EXPECT_GT(first_reduce, last_backward);
  }
  // The planner counts each unit's gathered weights and accumulated gradients as static.
  const int64_t shards = bytes_of(s.stages[1], ValueKind::kStatic, Category::kWeight) +
                         bytes_of(s.stages[1], ValueKind::kStatic, Category::kOptimizer);
  int64_t held = 0;
  for (const ScheduleTensor& x : s.stages[1].tensors)
    if (x.kind == ValueKind::kParamGather ||
        (x.kind == ValueKind::kGradBucket && x.category == Category::kGradient))
      held += x.bytes;
  EXPECT_EQ(StageStatics(m, t)(1, s.stages[1].num_layers()), shards + held);
}

// The estimate simulates fewer micro-batches than the step (the peaks repeat); under FSDP with
// PP one more than the warm-up, whose forward meets the accumulated fp32 gradients: every stage's
// peak is the full schedule's.
TEST(Fsdp, TheSimulatedMicroBatchesHoldEveryStagesPeak) {
  const ModelSpec m = model("llama-2-7b");
  for (int64_t pp : {1, 4}) {
    TrainSpec t = fsdp_setup(2);
    t.pp = pp, t.reshard_after_forward = pp == 1, t.microbatches = 9, t.seq_len = 512;
    ASSERT_FALSE(validate_setup(m, t));
    const Schedule full = build_schedule(m, t);
    const Schedule peak = build_schedule(m, simulation_setup(t), nullptr, /*peak_only=*/true);
    for (size_t st = 0; st < full.stages.size(); ++st)
      EXPECT_EQ(simulate(peak.stages[st]).peak_bytes, simulate(full.stages[st]).peak_bytes)
          << "pp " << pp << " stage " << st;
  }
}

// --recompute-every counts each rank's own layers, as torchtitan's process-global counter does
// over the model part it builds: Llama-2-7B over pp 2 (16 layers each) with N = 3 checkpoints
// the stage's 3rd, 6th, ... layers: 2, 5, ..., 14 and 18, 21, ..., 30.
TEST(Fsdp, EveryNthLayerCountsTheStagesOwnLayers) {
  const ModelSpec m = model("llama-2-7b");
  TrainSpec t = fsdp_setup(2);
  t.pp = 2, t.reshard_after_forward = false, t.microbatches = 2;
  t.recompute = Recompute::kFull, t.recompute_every = 3;
  ASSERT_FALSE(validate_setup(m, t));
  std::vector<int> full;
  for (const StageProgram& p : build_schedule(m, t).stages)
    for (const StageBlock& b : p.blocks)
      if (b.kind == BlockKind::kLayer && b.policy.name == "full") full.push_back(b.layer);
  EXPECT_EQ(full, (std::vector<int>{2, 5, 8, 11, 14, 18, 21, 24, 27, 30}));
}

// What FSDP2 is not modelled with, and what contradicts it, is refused in one line naming the
// way out.
TEST(Fsdp, RefusedSetupsNameTheFix) {
  const ModelSpec m = model("llama-2-7b");
  auto refused = [&](auto edit, const char* says) {
    TrainSpec t = fsdp_setup(4);
    edit(t);
    auto e = validate_setup(m, t);
    ASSERT_TRUE(e) << says;
    EXPECT_NE(e->message.find(says), std::string::npos) << e->message;
    EXPECT_EQ(e->message.find('\n'), std::string::npos);
  };
  refused([](TrainSpec& t) { t.zero = 1; }, "use --zero 0");
  refused([](TrainSpec& t) { t.pp = 2; }, "use --reshard-after-forward off");
  refused([](TrainSpec& t) { t.dp_replicate = 3; }, "a divisor of 4");
  refused([](TrainSpec& t) { t.pp_schedule = PpSchedule::kAfab, t.microbatches = 2; },
          "--pp-schedule 1f1b");
  refused([](TrainSpec& t) { t.grad_dtype = Dtype::kBf16; }, "--grad-accum-dtype fp32");
  refused([](TrainSpec& t) {
    t.pp = 2, t.reshard_after_forward = false, t.pp_schedule = PpSchedule::kInterleaved;
    t.virtual_stages = 2, t.microbatches = 4;
  }, "use --pp-schedule 1f1b or afab");
  refused([](TrainSpec& t) { t.fsdp = false, t.dp_replicate = 2; }, "needs --fsdp");
  refused([](TrainSpec& t) { t.fsdp = false, t.reshard_after_forward = false; }, "needs --fsdp");
  const ModelSpec moe = model("mixtral-8x7b");
  TrainSpec t = fsdp_setup(4);
  t.ep = 2;
  auto e = validate_setup(moe, t);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("use --ep 1"), std::string::npos) << e->message;
}

// Every FSDP program is well formed, over TP with SP, CP, HSDP, PP, a tied table (gpt-22b), an
// MoE model at ep 1, and the recompute policies.
TEST(Fsdp, EveryProgramIsWellFormed) {
  for (const char* name : {"llama-2-7b", "gpt-22b", "mixtral-8x7b", "qwen3-8b"}) {
    const ModelSpec m = model(name);
    for (int64_t tp : {1, 2})
      for (int64_t cp : {1, 2})
        for (int64_t rep : {1, 2})
          for (int64_t pp : {1, 2})
          for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
            TrainSpec t = fsdp_setup(4);
            t.tp = tp, t.sp = tp > 1, t.cp = cp, t.dp_replicate = rep, t.recompute = r;
            t.microbatches = 2, t.pp = pp, t.reshard_after_forward = pp == 1;
            auto bad = validate_setup(m, t);
            ASSERT_FALSE(bad) << name << ": " << bad->message;
            for (const StageProgram& p : build_schedule(m, t).stages) {
              auto e = check_program(p);
              EXPECT_FALSE(e) << name << ": " << (e ? e->message : "");
            }
          }
  }
}

// The auto planner under FSDP: every plan that fits is within its budget by simulation, and the
// sweep's bound refuses only budgets no plan fits.
TEST(Fsdp, AutoPlansFitTheirBudget) {
  for (int64_t pp : {1, 2}) {
  const ModelSpec m = model("llama-3.1-8b");
  TrainSpec t = fsdp_setup(8);
  t.seq_len = 8192, t.micro_batch = 2, t.microbatches = 2, t.recompute = Recompute::kAuto;
  t.pp = pp, t.reshard_after_forward = pp == 1;
  ASSERT_FALSE(validate_setup(m, t));
  const AutoPlan loose = auto_plan(m, t, {}, 1LL << 40, default_hardware());
  ASSERT_TRUE(loose.fits && loose.peak_none && loose.peak_full);
  // torchtitan's default checkpointing (every second layer) lands between none and full, and
  // the report says where.
  ASSERT_EQ(loose.every, 2);
  ASSERT_TRUE(loose.time_every && loose.peak_every);
  EXPECT_LT(*loose.peak_every, *loose.peak_none);
  EXPECT_GT(*loose.peak_every, *loose.peak_full);
  EXPECT_LT(loose.time_every->seconds, loose.time_full->seconds);
  EXPECT_NE(auto_plan_table(loose, 1LL << 40).find("vs torchtitan's selective_ac_option \"2\""),
            std::string::npos);
  int fits = 0;
  for (int i = 0; i <= 8; ++i) {
    const int64_t budget = *loose.peak_full + (*loose.peak_none - *loose.peak_full) * i / 8;
    const AutoPlan p = auto_plan(m, t, {}, budget, default_hardware(), {.compare_uniform = false});
    if (cannot_fit(m, t, {}, budget)) EXPECT_FALSE(p.fits) << budget;
    if (!p.fits) continue;
    ++fits;
    EXPECT_LE(p.estimate.peak_bytes, budget);
  }
  EXPECT_GE(fits, 7) << "pp " << pp;
  }
}

// The verdict is the replayed estimate's: Llama-3.1-70B over 32 GPUs at 80 GB less 3 %, where
// the caching allocator's replay holds some 20 GiB of cached blocks that differ from plan to plan.
// The stage model, tightened by the replays of cheaper plans, finds nothing under its target,
// but the plan of the least peak fits: the plan fits (it was reported as not fitting, with its
// peak under the budget). Around it, a plan fits exactly when its estimate does.
TEST(Fsdp, AReplayedPlanWithinTheBudgetFits) {
  const ModelSpec m = model("llama-3.1-70b");
  TrainSpec t = fsdp_setup(32);
  t.seq_len = 8192, t.recompute = Recompute::kAuto;
  ASSERT_FALSE(validate_setup(m, t));
  const int64_t usable = 80'000'000'000 - 80'000'000'000 * 3 / 100;
  const AutoPlan p = auto_plan(m, t, {}, usable, default_hardware(), {.compare_uniform = false});
  EXPECT_TRUE(p.fits);
  EXPECT_LE(p.estimate.peak_bytes, usable);
  for (int64_t gib : {60, 66, 70, 74}) {
    const AutoPlan q =
        auto_plan(m, t, {}, gib << 30, default_hardware(), {.compare_uniform = false});
    EXPECT_EQ(q.fits, q.estimate.peak_bytes <= (gib << 30)) << gib << " GiB";
  }
}

// `sweep --fsdp` searches FSDP2 setups in place of the ZeRO stages: without PP resharding after
// forward (micro-batches in turn), under PP keeping the units; each row's peak is its own auto
// plan's.
TEST(Fsdp, TheSweepSearchesFsdpSetups) {
  const ModelSpec m = model("llama-3.1-8b");
  SweepOptions o;
  o.gpus = 8, o.budget = 72LL << 30, o.hw = default_hardware();
  o.base.fsdp = true, o.base.seq_len = 8192;
  const SweepReport r = sweep(m, o);
  ASSERT_GT(r.fitting.size(), 4u);
  bool piped = false;
  for (const SweepResult& x : r.fitting) {
    const TrainSpec& t = x.setup;
    EXPECT_TRUE(t.fsdp);
    EXPECT_EQ(t.zero, 0);
    EXPECT_EQ(t.reshard_after_forward, t.pp == 1);
    if (t.pp == 1) EXPECT_EQ(t.pp_schedule, PpSchedule::k1F1B);
    piped |= t.pp > 1;
    const AutoPlan p = auto_plan(m, t, o.runtime, o.budget, o.hw, {.compare_uniform = false});
    EXPECT_TRUE(p.fits);
    EXPECT_EQ(p.estimate.peak_bytes, x.peak_bytes);
    EXPECT_NE(estimate_command(x, o).find("--fsdp on"), std::string::npos);
  }
  EXPECT_TRUE(piped);
}

}  // namespace
}  // namespace np

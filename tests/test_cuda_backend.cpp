// The CUDA backend end to end through the CUDA emulation: the tiny Llama, GPT, Qwen, MoE and
// DeepSeek scenarios across TP, SP, PP, eager and flash attention and the recompute policies, with the event-exact comparison (every allocation and release as the plan
// predicts), the loss near the CPU reference's, and loss and gradients bitwise identical across
// recompute policies (recomputation regenerates exactly what the forward produced).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "executor/compare.hpp"
#include "executor/cpu/cpu_backend.hpp"
#include "executor/cuda/compat.hpp"
#include "executor/cuda/cuda_backend.hpp"
#include "executor/cuda/transfer.hpp"
#include "executor/params.hpp"
#include "executor/runner.hpp"
#include "gpu_env.hpp"
#include "test_util.hpp"

namespace np::exec {
namespace {

RunResult run(const Schedule& s, bool cuda) {
  RunOptions o;
  o.steps = 1;
  o.capture_grads = true;
  auto r = cuda ? run_schedule(s, [] { return cuda::make_cuda_backend(); }, o, cuda::virtual_rank_world())
                : run_schedule(s, [] { return make_cpu_backend(); }, o);
  if (!r) throw std::runtime_error(r.error().message);
  return *r;
}

struct Case {
  int64_t tp, pp;
  bool sp;
  AttentionImpl attention = AttentionImpl::kFlash;
  int64_t dp = 1;  // replicas, each running microbatches / dp of the scenario's micro-batches
  int zero = 0;
  int64_t chunks = 1;  // > 1: the interleaved schedule with this many chunks per stage
  Impl impl = Impl::kNanotron;
  LossFusion loss = LossFusion::kNone;  // megatron: Transformer Engine's loss with kTe
  bool grad_fusion = true;  // megatron: false, each linear's weight gradient whole in bf16 first
  bool fsdp = false, reshard = true;  // FSDP2 over dp (zero 0), resharded after forward or not
  Fp8Recipe fp8 = Fp8Recipe::kNone;    // torchao's float8 linears (torchtitan under FSDP)
  bool fp8_gather = false;             // ... with FSDP's float8 all-gather (tensorwise)
  int64_t replicas = 1;                // HSDP: FSDP2 over dp / replicas in each of the replicas
};

// Each case under each policy: every allocation event as the plan predicts, the loss within 2%
// of the CPU reference's, and loss and gradients bitwise equal to the first policy's.
void check_scenario(const std::string& name, std::initializer_list<Case> cases,
                    std::initializer_list<Recompute> policies) {
  Scenario sc = testing::scenario(name);
  for (Case k : cases) {
    std::optional<RunResult> ref;
    for (Recompute rc : policies) {
      TrainSpec t = sc.base;
      t.tp = k.tp, t.pp = k.pp, t.sp = k.sp, t.recompute = rc, t.pp_schedule = PpSchedule::k1F1B;
      t.attention = k.attention, t.impl = k.impl, t.loss_fusion = k.loss;
      t.grad_accum_fusion = k.grad_fusion;
      t.dp = k.dp, t.zero = k.zero, t.microbatches = std::max<int64_t>(1, sc.base.microbatches / k.dp);
      t.fsdp = k.fsdp, t.reshard_after_forward = k.reshard, t.fp8 = k.fp8;
      t.fp8_all_gather = k.fp8_gather, t.dp_replicate = k.replicas;
      if (k.chunks > 1) t.pp_schedule = PpSchedule::kInterleaved, t.virtual_stages = k.chunks;
      ASSERT_FALSE(validate_setup(sc.model, t)) << name;
      std::string what = name + " " + describe_short(t);
      Schedule s = build_schedule(sc.model, t);
      RunResult r = run(s, true);
      RunComparison c = compare(s, r, what);
      EXPECT_TRUE(c.all_equal) << comparison_table(c);
      for (const RankResult& rr : r.ranks) {  // cuBLAS's workspace, through the allocator
        ASSERT_EQ(rr.runtime_buffers.size(), k.fsdp ? 2u : 1u) << what;
        EXPECT_EQ(rr.runtime_buffers[0].name, "cuBLAS workspace");
        EXPECT_EQ(rr.runtime_buffers[0].bytes, RuntimeAssumptions{}.cublas_workspace_bytes);
        if (k.fsdp) EXPECT_EQ(rr.runtime_buffers[1].name, kFsdpStagingName);
      }
      RunResult cpu = run(s, false);
      ASSERT_EQ(r.losses.size(), cpu.losses.size());
      for (size_t i = 0; i < r.losses.size(); ++i)
        EXPECT_NEAR(r.losses[i], cpu.losses[i], 2e-2 * cpu.losses[i]) << what << " step " << i;
      if (!ref) {
        ref = r;
        continue;
      }
      EXPECT_EQ(std::memcmp(&r.losses[0], &ref->losses[0], sizeof(double)), 0) << what;
      for (const auto& [key, g] : ref->grads) {
        const std::vector<float>& h = r.grads.at(key);
        ASSERT_EQ(h.size(), g.size()) << key;
        EXPECT_EQ(std::memcmp(h.data(), g.data(), g.size() * sizeof(float)), 0) << key << " " << what;
      }
    }
  }
}

// Multi-rank setups run as virtual ranks sharing the device (collectives as device copies and a
// reduction kernel). The emulation runs every CUDA thread as a fiber: a few setups per model keep
// each test to seconds. SP with pipeline stages; TP without SP (the column-parallel backward's
// all-reduce).
TEST(CudaBackend, TinyLlamaEventExactAndRecomputeInvariant) {
  check_scenario("tiny-llama", {{1, 1, false}, {2, 2, true}, {2, 1, false}},
                 {Recompute::kNone, Recompute::kSelective, Recompute::kFull});
  // The other profiles: statistics recomputed and fused SwiGLU; statistics kept, fused SwiGLU.
  check_scenario("tiny-llama",
                 {{2, 1, true, AttentionImpl::kFlash, 1, 0, 1, Impl::kFused},
                  {1, 2, false, AttentionImpl::kFlash, 1, 0, 1, Impl::kMegatron}},
                 {Recompute::kNone, Recompute::kFull});
  // Megatron with Transformer Engine's loss (no softmax kept; the logits' gradient from them and
  // the row statistics), under TP with SP and across pipeline stages.
  check_scenario("tiny-llama",
                 {{2, 1, true, AttentionImpl::kFlash, 1, 0, 1, Impl::kMegatron, LossFusion::kTe},
                  {1, 2, false, AttentionImpl::kFlash, 1, 0, 1, Impl::kMegatron, LossFusion::kTe}},
                 {Recompute::kNone});
  // Hugging Face's: repeat_kv's expanded K/V under eager and flash (sdpa) attention, the fp32
  // softmax, PyTorch's RMSNorm and the log-softmax loss.
  check_scenario("tiny-llama",
                 {{2, 1, true, AttentionImpl::kEager, 1, 0, 1, Impl::kHf},
                  {1, 2, false, AttentionImpl::kFlash, 1, 0, 1, Impl::kHf}},
                 {Recompute::kNone, Recompute::kSelective, Recompute::kFull});
}

// LayerNorm, GeLU, learned positions, biases, tied embeddings, dropout (its mask regenerated bit
// for bit by recomputation), eager attention (selective recompute drops its scores and
// probabilities) and flash attention.
TEST(CudaBackend, TinyGptEagerAndFlash) {
  check_scenario("tiny-gpt", {{2, 2, true, AttentionImpl::kEager}},
                 {Recompute::kNone, Recompute::kSelective, Recompute::kFull});
  check_scenario("tiny-gpt", {{2, 1, false, AttentionImpl::kFlash}, {1, 1, false, AttentionImpl::kEager},
                              {2, 1, true, AttentionImpl::kEager, 1, 0, 1, Impl::kFused}},
                 {Recompute::kNone, Recompute::kFull});
  // Megatron as its functional tests run it: no gradient-accumulation fusion (each linear's
  // bf16 weight gradient, then added into the buffer) and the native fused loss (its fp32
  // gradient buffer), under TP with SP, TP without SP (the all-reduced input gradients) and a
  // pipeline.
  check_scenario("tiny-gpt",
                 {{2, 1, true, AttentionImpl::kFlash, 1, 0, 1, Impl::kMegatron, LossFusion::kNative,
                   false},
                  {2, 2, false, AttentionImpl::kFlash, 1, 0, 1, Impl::kMegatron, LossFusion::kNative,
                   false}},
                 {Recompute::kNone, Recompute::kFull});
}

// Data-parallel replicas as virtual ranks (ZeRO-1: sharded update and weight all-gather; ZeRO-2:
// per-block buckets reduce-scattered on the device; ZeRO-3: per-block weight all-gathers) and the
// interleaved pipeline (messages between chunks tagged): the same comparison.
TEST(CudaBackend, TinyLlamaDataParallelAndInterleaved) {
  check_scenario("tiny-llama",
                 {{1, 2, false, AttentionImpl::kFlash, 1, 0, 2},
                  {1, 1, false, AttentionImpl::kFlash, 2, 1},
                  {1, 1, false, AttentionImpl::kFlash, 2, 2},
                  {2, 1, true, AttentionImpl::kFlash, 2, 3}},
                 {Recompute::kNone, Recompute::kFull});
}

// qkv bias with RoPE, eager attention without TP.
TEST(CudaBackend, TinyQwen) {
  check_scenario("tiny-qwen", {{1, 2, false, AttentionImpl::kEager}, {2, 1, true}, {1, 1, false}},
                 {Recompute::kNone, Recompute::kFull});
}

// Qwen3's q/k norms (head_dim apart from hidden / heads) under TP with SP and a pipeline, TP
// without SP, and ZeRO-3 over 2 replicas; Megatron's profile too, and Hugging Face's (the norms
// as PyTorch ops).
TEST(CudaBackend, TinyQwen3) {
  check_scenario("tiny-qwen3",
                 {{1, 1, false}, {2, 2, true}, {2, 1, false, AttentionImpl::kFlash, 2, 3},
                  {2, 1, true, AttentionImpl::kFlash, 1, 0, 1, Impl::kMegatron},
                  {2, 1, true, AttentionImpl::kEager, 1, 0, 1, Impl::kHf}},
                 {Recompute::kNone, Recompute::kSelective, Recompute::kFull});
}

// torchtitan's code (--impl torchtitan): Llama 3's complex RoPE and SDPA on separate q, k, v
// (GQA), silu and the product, under TP with SP and a pipeline, ZeRO-3 over 2 replicas, and
// torchtitan's per-op checkpointing with its cache; Qwen3's head norms and rotate-half RoPE.
TEST(CudaBackend, TinyTorchtitan) {
  check_scenario("tiny-llama-torchtitan",
                 {{1, 1, false, AttentionImpl::kFlash, 1, 0, 1, Impl::kTorchtitan},
                  {2, 2, true, AttentionImpl::kFlash, 1, 0, 1, Impl::kTorchtitan},
                  {2, 1, true, AttentionImpl::kFlash, 2, 3, 1, Impl::kTorchtitan}},
                 {Recompute::kNone, Recompute::kSelectiveOp, Recompute::kFull});
  check_scenario("tiny-qwen3",
                 {{1, 1, false, AttentionImpl::kFlash, 1, 0, 1, Impl::kTorchtitan},
                  {2, 1, true, AttentionImpl::kFlash, 1, 0, 1, Impl::kTorchtitan}},
                 {Recompute::kNone, Recompute::kSelectiveOp});
}

// Transformer Engine's float8 linears (--impl megatron --fp8 delayed|tensorwise): the norms
// writing e4m3 (each amax reduced into the output's own bytes), the float8 all-gathers under SP
// and their re-runs, the casts, copies and transposes, the GEMMs taking the weight cast on the
// way; over TP with and without SP and a pipeline.
TEST(CudaBackend, TinyGptTeFp8) {
  const Impl mega = Impl::kMegatron;
  const auto flash = AttentionImpl::kFlash;
  const LossFusion none = LossFusion::kNone;
  check_scenario("tiny-gpt-te-fp8",
                 {{1, 1, false, flash, 1, 0, 1, mega, none, true, false, true, Fp8Recipe::kDelayed},
                  {2, 1, true, flash, 1, 0, 1, mega, none, true, false, true, Fp8Recipe::kTensorwise},
                  {2, 1, false, flash, 1, 0, 1, mega, none, true, false, true, Fp8Recipe::kDelayed},
                  {2, 2, true, flash, 1, 0, 1, mega, none, true, false, true, Fp8Recipe::kDelayed}},
                 {Recompute::kNone, Recompute::kFull});
}

// FSDP2 (--fsdp): the fp32 shards, each unit's all-gather and copy-out, the ops' bf16 weight
// gradients (staged on the device), the fp32 reduce-scatter and gradient shard on their streams'
// pools; resharded after forward and kept, over TP with SP and under PP (each unit gathered once
// per step, its gradient accumulated); torchtitan's code and nanotron's; float8 linears.
TEST(CudaBackend, TinyLlamaFsdp) {
  const Impl titan = Impl::kTorchtitan, nano = Impl::kNanotron;
  const auto flash = AttentionImpl::kFlash;
  check_scenario("tiny-llama-fsdp",
                 {{1, 1, false, flash, 2, 0, 1, titan, LossFusion::kNone, true, true, true},
                  {2, 1, true, flash, 2, 0, 1, titan, LossFusion::kNone, true, true, false},
                  {1, 2, false, flash, 2, 0, 1, nano, LossFusion::kNone, true, true, false}},
                 {Recompute::kNone, Recompute::kFull});
  // torchao's float8 linears, each cast's temporaries step by step, tensorwise, rowwise and
  // rowwise_with_gw_hp (the weight gradient through cuBLAS in bf16).
  check_scenario("tiny-llama-fsdp",
                 {{1, 1, false, flash, 2, 0, 1, titan, LossFusion::kNone, true, true, true,
                   Fp8Recipe::kTensorwise},
                  {1, 2, false, flash, 2, 0, 1, titan, LossFusion::kNone, true, true, false,
                   Fp8Recipe::kRowwise},
                  {1, 1, false, flash, 2, 0, 1, titan, LossFusion::kNone, true, true, true,
                   Fp8Recipe::kRowwiseGwHp},
                  // torchao's float8 TP: the float8 all-gathers, the maxima all-reduced on the
                  // device through the scales
                  {2, 1, true, flash, 2, 0, 1, titan, LossFusion::kNone, true, true, true,
                   Fp8Recipe::kTensorwise},
                  // rowwise on plain TP: the maxima over split dimensions all-reduced on the
                  // device, element by element
                  {2, 1, true, flash, 2, 0, 1, titan, LossFusion::kNone, true, true, true,
                   Fp8Recipe::kRowwise}},
                 {Recompute::kNone, Recompute::kFull});
  // torchtitan's per-op checkpointing with float8 linears (each re-run, casts and all; the
  // tensorwise casts' maxima kept for the recompute).
  check_scenario("tiny-llama-fsdp",
                 {{1, 1, false, flash, 2, 0, 1, titan, LossFusion::kNone, true, true, true,
                   Fp8Recipe::kRowwise},
                  {1, 1, false, flash, 2, 0, 1, titan, LossFusion::kNone, true, true, true,
                   Fp8Recipe::kTensorwise}},
                 {Recompute::kNone, Recompute::kSelectiveOp});
  // FSDP's float8 all-gather: each weight's fp32 shard cast before the byte all-gather (the max
  // over the shard group a collective on the device), the linears taking the float8 weights.
  check_scenario("tiny-llama-fsdp",
                 {{1, 1, false, flash, 2, 0, 1, titan, LossFusion::kNone, true, true, true,
                   Fp8Recipe::kTensorwise, true},
                  {1, 2, false, flash, 2, 0, 1, titan, LossFusion::kNone, true, true, false,
                   Fp8Recipe::kTensorwise, true},
                  // under torchao's float8 TP: the float8 TP linears take the gathered weights
                  {2, 1, true, flash, 2, 0, 1, titan, LossFusion::kNone, true, true, true,
                   Fp8Recipe::kTensorwise, true}},
                 {Recompute::kNone, Recompute::kFull});
  // HSDP: 2 replicas of 2 shards (the shard groups' collectives on the device), bf16 over TP
  // with SP, and float8 with the float8 all-gather.
  check_scenario("tiny-llama-fsdp",
                 {{2, 1, true, flash, 4, 0, 1, titan, LossFusion::kNone, true, true, true,
                   Fp8Recipe::kNone, false, 2},
                  {1, 1, false, flash, 4, 0, 1, titan, LossFusion::kNone, true, true, true,
                   Fp8Recipe::kTensorwise, true, 2}},
                 {Recompute::kNone, Recompute::kFull});
}

// Dense layers among MoE layers (DeepSeek's first layers, Qwen-MoE's mlp_only_layers): the
// blocks of each kind on their own graphs, over a pipeline and with a capacity over 2 replicas.
TEST(CudaBackend, TinyMoeMixed) {
  check_scenario("tiny-moe-mixed",
                 {{2, 2, true}, {2, 1, true, AttentionImpl::kFlash, 2, 1}},
                 {Recompute::kNone, Recompute::kFull});
}

// Router, top-2 of 6 experts, dispatch, grouped expert GEMMs, combine and the gated shared expert,
// under TP with SP (the routing gathered over the group).
TEST(CudaBackend, TinyMoe) {
  check_scenario("tiny-moe", {{2, 1, true}, {1, 2, false}, {1, 1, false},
                              {1, 1, false, AttentionImpl::kFlash, 1, 0, 1, Impl::kFused}},
                 {Recompute::kNone, Recompute::kFull});
}

// With an expert capacity (tiny-moe-ep's factor 1: choices dropped), at ep 1 over 2 replicas.
TEST(CudaBackend, TinyMoeWithCapacity) {
  check_scenario("tiny-moe-ep",
                 {{2, 1, true, AttentionImpl::kFlash, 2, 0}, {1, 2, false, AttentionImpl::kFlash, 2, 1}},
                 {Recompute::kNone, Recompute::kFull});
}

// Multi-head latent attention (a direct q projection): the replicated down-projections, MLA's
// RoPE and attention with the values' head dim below q/k's, under TP with SP and a pipeline and
// TP without SP (the keys' RoPE part's gradient all-reduced, and the column-parallel q's input
// gradient all-reduced into what the down-projections gave), eager and flash, Megatron's profile.
TEST(CudaBackend, TinyDeepSeekLite) {
  check_scenario("tiny-deepseek-lite",
                 {{1, 1, false}, {2, 2, true}, {2, 1, false},
                  {2, 1, false, AttentionImpl::kEager, 1, 0, 1, Impl::kMegatron}},
                 {Recompute::kNone, Recompute::kSelective, Recompute::kFull});
}

// DeepSeek-V3's layout: MLA with the q latent, a dense first layer, routed experts routed as V3
// (sigmoid scores, groups, scaled weights) beside the shared expert, with a capacity.
TEST(CudaBackend, TinyDeepSeek) {
  check_scenario("tiny-deepseek",
                 {{2, 1, true}, {1, 2, false, AttentionImpl::kFlash, 2, 1}},
                 {Recompute::kNone, Recompute::kFull});
}

// --allocator expandable on the CUDA backend: the caching allocator's segments grow in place on
// the driver's virtual memory calls (cuMemMap through the emulation, which keeps the driver's
// rules; on a GPU, the driver itself). Every event as predicted, reserved and max allocated as the
// replay predicts, the device level above the reserved peak, and (in the emulation, where nothing
// else shares the device) every page given back at the end.
TEST(CudaBackend, ExpandableSegmentsOnTheDriversVirtualMemory) {
  Scenario sc = testing::scenario("tiny-llama");
  TrainSpec t = sc.base;
  t.tp = 1, t.pp = 2, t.pp_schedule = PpSchedule::k1F1B;
  Schedule s = build_schedule(sc.model, t);
  size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  RuntimeAssumptions rt;
  rt.allocator = *parse_allocator_choice("expandable", "");
  RunOptions o;
  o.steps = 2;
  o.allocator = rt.allocator;
  auto r = run_schedule(s, [] { return cuda::make_cuda_backend(); }, o, cuda::virtual_rank_world());
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_FALSE(r->out_of_memory.has_value());
  RunComparison c = compare(s, *r, "expandable", rt);
  for (const RankComparison& rc : c.ranks) {
    EXPECT_TRUE(rc.equal()) << comparison_table(c);
    ASSERT_TRUE(rc.measured_reserved.has_value());
    EXPECT_GT(*rc.measured_reserved, 0);
    EXPECT_EQ(*rc.measured_reserved % (int64_t{2} << 20), 0) << "whole pages";
  }
  for (const RankResult& rr : r->ranks) {
    ASSERT_TRUE(rr.measured_device_peak.has_value());
    EXPECT_GE(*rr.measured_device_peak, *rr.measured_reserved_peak);
  }
#ifdef NANOPLAN_CUDA_EMULATION
  size_t free_after = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_EQ(free_after, free_before) << "every page unmapped and released";
#endif
}

#ifdef NANOPLAN_CUDA_EMULATION
// The device level (cudaMemGetInfo, sampled after every allocation): with one rank alone on the
// emulated device (no context there) its peak is the allocator's plus the cuBLAS workspace, to the
// byte; virtual ranks share the device, so it lies between the fullest rank's and the sum. The
// comparison predicts it from the plan and the runtime assumptions, and says so in JSON; the
// measured step time stands beside the cost model's.
TEST(CudaBackend, DeviceLevelPeak) {
  Scenario sc = testing::scenario("tiny-llama");
  const int64_t ws = RuntimeAssumptions{}.cublas_workspace_bytes;
  for (int64_t tp : {1, 2}) {
    TrainSpec t = sc.base;
    t.tp = tp, t.pp = 1, t.sp = tp > 1;
    Schedule s = build_schedule(sc.model, t);
    RunResult r = run(s, true);
    int64_t sum = 0, fullest = 0, device = 0;
    for (const RankResult& rr : r.ranks) {
      ASSERT_TRUE(rr.measured_device_peak.has_value());
      sum += rr.measured_peak, fullest = std::max(fullest, rr.measured_peak);
      device = std::max(device, *rr.measured_device_peak);
      ASSERT_EQ(rr.measured_overheads.size(), 2u);
      EXPECT_EQ(rr.measured_overheads[1].name, "cuBLAS handle");
    }
    if (tp == 1) {
      EXPECT_EQ(device, sum + ws);
    }
    EXPECT_GE(device, fullest + ws);
    EXPECT_LE(device, sum + tp * ws);
    RuntimeAssumptions rt;
    HardwareModel hw = default_hardware();
    RunComparison c = compare(s, r, "device level", rt, &hw);
    ASSERT_EQ(c.step_seconds.size(), 1u);  // measured, and the cost model's beside it
    EXPECT_GT(c.step_seconds[0], 0.0);
    ASSERT_TRUE(c.predicted_step_seconds.has_value());
    EXPECT_EQ(*c.predicted_step_seconds, step_time(s, hw).seconds);
    EXPECT_NE(comparison_table(c).find("the cost model predicts"), std::string::npos);
    ASSERT_TRUE(c.device.has_value());
    int64_t predicted = 0;
    for (const RankComparison& rc : c.ranks) predicted += rc.predicted;
    EXPECT_EQ(c.device->predicted, predicted + rt.cuda_context_bytes + tp * ws);
    EXPECT_EQ(c.device->measured, device);
    nlohmann::json j = comparison_json(c);
    EXPECT_EQ(j["measured_device_peak_bytes"], device);
    EXPECT_EQ(j["predicted_device_peak_bytes"], c.device->predicted);
    EXPECT_NE(comparison_table(c).find("device level (cudaMemGetInfo"), std::string::npos);
  }
}

// A device without room: the run stops with the tensor that did not fit, its size and the bytes in
// use (the emulated device holds the cuBLAS workspace and 64 KiB more).
TEST(CudaBackend, DeviceOutOfMemoryNamesTheTensor) {
  Scenario sc = testing::scenario("tiny-llama");
  TrainSpec t = sc.base;
  t.tp = 1, t.pp = 1;
  Schedule s = build_schedule(sc.model, t);
  size_t room = static_cast<size_t>(RuntimeAssumptions{}.cublas_workspace_bytes) + (64 << 10);
  ::np::emu::set_device_memory(room);
  RunOptions o;
  auto r = run_schedule(s, [] { return cuda::make_cuda_backend(); }, o);
  ::np::emu::set_device_memory(size_t{80} << 30);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->out_of_memory.has_value());
  const OutOfBudget& oom = *r->out_of_memory;
  EXPECT_FALSE(oom.tensor.empty());
  EXPECT_GT(oom.bytes, 0);
  EXPECT_LE(oom.in_use, int64_t{64} << 10);
  EXPECT_GT(oom.in_use + oom.bytes, (int64_t{64} << 10) - 4096);  // it did not fit
  std::string m = oom.what();
  EXPECT_NE(m.find("allocating " + oom.tensor + " ("), std::string::npos) << m;
  EXPECT_NE(m.find("the device has no room"), std::string::npos) << m;
}
#endif

}  // namespace
}  // namespace np::exec

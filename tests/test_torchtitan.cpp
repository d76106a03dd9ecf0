// torchtitan's job file in (configs.hpp, torchtitan_config): the keys read with torchtitan's
// meaning and defaults, the world size of data_parallel_shard_degree -1, the setups refused in
// one line naming file, key and value, and the check: a torchtitan Llama 3 8B FSDP config
// on 8 GPUs holds 16 B x N / 8 static bytes per rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <sstream>

#include "planner/graph/policy.hpp"
#include "planner/inputs/configs.hpp"
#include "planner/inputs/setup_flags.hpp"
#include "planner/recompute/autoplan.hpp"
#include "planner/report/emit_config.hpp"
#include "planner/report/plan_report.hpp"
#include "planner/schedule/schedule.hpp"
#include "test_util.hpp"

namespace np {
namespace {

std::string sample_path() { return testing::source_dir() + "/tests/data/torchtitan_llama3_8b.toml"; }

std::string sample() {
  std::ifstream in(sample_path());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `text` with one key's line replaced (or a line added to its section when absent).
std::string edit(std::string text, const std::string& section, const std::string& key,
                 const std::string& value) {
  const std::string line = key + " = " + value;
  size_t head = text.find("[" + section + "]\n");
  EXPECT_NE(head, std::string::npos) << section;
  size_t next = text.find("\n[", head), at = text.find("\n" + key + " = ", head);
  if (at != std::string::npos && at < next) {
    size_t end = text.find('\n', at + 1);
    return text.replace(at + 1, end - at - 1, line);
  }
  return text.insert(head + section.size() + 3, line + "\n");
}
std::string with(const std::string& section, const std::string& key, const std::string& value) {
  return edit(sample(), section, key, value);
}

ConfigSetup read(const std::string& text, int64_t gpus = 8) {
  Result<ConfigSetup> c = torchtitan_config(text, "job.toml", gpus);
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return c.ok() ? *c : ConfigSetup{};
}

std::string error(const std::string& text, int64_t gpus = 8) {
  Result<ConfigSetup> c = torchtitan_config(text, "job.toml", gpus);
  EXPECT_FALSE(c.ok());
  if (c.ok()) return "";
  EXPECT_EQ(c.error().message.find('\n'), std::string::npos);
  return c.error().message;
}

TEST(Torchtitan, ReadsTheSampleWithTorchtitansMeaning) {
  ConfigSetup c = read(sample());
  const TrainSpec& t = c.setup;
  EXPECT_EQ(c.catalog_model, "llama-3.1-8b");
  EXPECT_TRUE(t.fsdp);
  EXPECT_EQ(t.dp, 8);  // -1: the 8 GPUs the other degrees leave
  EXPECT_EQ(t.dp_replicate, 1);
  EXPECT_TRUE(t.reshard_after_forward);  // "default" without PP
  EXPECT_EQ(t.tp, 1);
  EXPECT_EQ(t.micro_batch, 2);
  EXPECT_EQ(t.microbatches, 1);  // global_batch_size -1: no accumulation
  EXPECT_EQ(t.seq_len, 8192);
  EXPECT_EQ(t.recompute, Recompute::kFull);
  EXPECT_EQ(t.recompute_every, 2);
  EXPECT_EQ(t.pp_schedule, PpSchedule::k1F1B);
  EXPECT_EQ(t.optimizer, Optimizer::kAdamW);
  EXPECT_EQ(t.mtp_layers, 0);
  // Defaults where the file is silent: torchtitan's (local batch 8, sequence 2048, selective
  // "2").
  ConfigSetup d = read("[model]\nname = \"qwen3\"\nflavor = \"30B-A3B\"\n", 16);
  EXPECT_EQ(d.catalog_model, "qwen3-30b-a3b");
  EXPECT_EQ(d.setup.micro_batch, 8);
  EXPECT_EQ(d.setup.seq_len, 2048);
  EXPECT_EQ(d.setup.dp, 16);
  EXPECT_EQ(d.setup.recompute_every, 2);
}

// A key torchtitan does not define, in a section nanoplan reads, is said on stderr with its line
// (a typo would otherwise take the default silently); the keys torchtitan has are not.
TEST(Torchtitan, UnknownKeysOfTheSectionsReadAreSaid) {
  const std::vector<std::string> clean = read(sample()).notes;
  EXPECT_TRUE(std::none_of(clean.begin(), clean.end(), [](const std::string& n) {
    return n.find("is not a key") != std::string::npos;
  }));
  const ConfigSetup c = read(with("training", "local_batch_sise", "4"));
  EXPECT_EQ(c.setup.micro_batch, 2);
  EXPECT_TRUE(std::any_of(c.notes.begin(), c.notes.end(), [](const std::string& n) {
    return n == "job.toml:32: training.local_batch_sise is not a key of torchtitan's [training] "
                "(torchtitan refuses it): ignored";
  }));
}

TEST(Torchtitan, ParallelismAndBatch) {
  ConfigSetup h = read(with("parallelism", "data_parallel_replicate_degree", "2"));
  EXPECT_EQ(h.setup.dp, 8);
  EXPECT_EQ(h.setup.dp_replicate, 2);
  EXPECT_EQ(h.setup.fsdp_shards(), 4);
  ConfigSetup tp = read(with("parallelism", "tensor_parallel_degree", "2"));
  EXPECT_EQ(tp.setup.dp, 4);
  EXPECT_TRUE(tp.setup.sp);
  ConfigSetup never = read(with("parallelism", "fsdp_reshard_after_forward", "\"never\""));
  EXPECT_FALSE(never.setup.reshard_after_forward);
  // global 32 over local 2 x dp 8: two accumulation steps.
  ConfigSetup acc = read(with("training", "global_batch_size", "32"));
  EXPECT_EQ(acc.setup.microbatches, 2);
  // PP 2 splits the local batch of 2 into micro-batches of 1; "default" keeps the weights.
  std::string pp = with("parallelism", "pipeline_parallel_degree", "2");
  ConfigSetup p = read(pp);
  EXPECT_EQ(p.setup.pp, 2);
  EXPECT_EQ(p.setup.dp, 4);
  EXPECT_EQ(p.setup.micro_batch, 1);
  EXPECT_EQ(p.setup.microbatches, 2);
  EXPECT_FALSE(p.setup.reshard_after_forward);
  // A given shard degree must agree with --gpus; without --gpus it stands.
  std::string four = with("parallelism", "data_parallel_shard_degree", "4");
  EXPECT_EQ(read(four, 0).setup.dp, 4);
  EXPECT_NE(error(four, 8).find("gives 4 GPUs (replicate x shard x cp x tp x pp), not --gpus 8"),
            std::string::npos);
  // Without FSDP torchtitan trains fp32 parameters (DDP, autocast): not modelled, refused.
  EXPECT_NE(error(with("parallelism", "data_parallel_shard_degree", "1"), 0)
                .find("torchtitan without FSDP"),
            std::string::npos);
  // A negative global batch is torchtitan's default (no accumulation); under PP accumulation
  // (separate pipeline runs, each reducing) is refused.
  EXPECT_EQ(read(with("training", "global_batch_size", "-2")).setup.microbatches, 1);
  std::string pp_acc = with("parallelism", "pipeline_parallel_degree", "2");
  pp_acc.insert(pp_acc.find("[training]\n") + 11, "global_batch_size = 16\n");
  EXPECT_NE(error(pp_acc).find("accumulates 2 pipeline runs"), std::string::npos);
}

TEST(Torchtitan, BadInputNamesFileKeyAndValue) {
  EXPECT_EQ(error(sample(), 0),
            "job.toml:40: parallelism.data_parallel_shard_degree -1 takes the GPUs the others "
            "leave: give --gpus N (the job's world size)");
  EXPECT_EQ(error(with("training", "seq_len", "\"8192\"")),
            "job.toml:33: training.seq_len: expected an integer, got \"8192\"");
  EXPECT_EQ(error(with("model", "flavor", "\"7B\"")),
            "job.toml:20: model.flavor \"7B\" of llama3 is not in the catalog (valid: 8B, 70B, "
            "405B)");
  EXPECT_NE(error(with("model", "name", "\"llama4\"")).find("(valid: llama3, deepseek_v3, qwen3)"),
            std::string::npos);
  EXPECT_NE(error(with("activation_checkpoint", "selective_ac_option", "\"ops\""))
                .find("\"ops\" is invalid (valid: \"op\", or a layer interval"),
            std::string::npos);
  EXPECT_NE(error(with("activation_checkpoint", "selective_ac_option", "2")).find("expected a string"),
            std::string::npos);
  EXPECT_NE(error(with("parallelism", "fsdp_reshard_after_forward", "\"sometimes\""))
                .find("(valid: \"default\", \"always\", \"never\")"),
            std::string::npos);
  EXPECT_NE(error(with("parallelism", "pipeline_parallel_schedule", "\"DualPipeV\""))
                .find("is not modelled (valid: \"1F1B\", \"GPipe\", \"Interleaved1F1B\")"),
            std::string::npos);
  EXPECT_NE(error(with("training", "global_batch_size", "20")).find("not a multiple of"),
            std::string::npos);
  EXPECT_NE(error(with("training", "dtype", "\"bfloat16\"")).find("not modelled"),
            std::string::npos);
  EXPECT_NE(error(with("optimizer", "name", "\"SGD\"")).find("(valid: \"Adam\", \"AdamW\")"),
            std::string::npos);
  EXPECT_NE(error("[model\nname = 1\n").find("malformed TOML"), std::string::npos);
  EXPECT_NE(error(with("parallelism", "tensor_parallel_degree", "3"))
                .find("which do not divide it (valid: --gpus a multiple of 3)"),
            std::string::npos);
}

// The check, through the CLI's path: a torchtitan Llama 3 8B FSDP config on 8 GPUs holds
// 16 B x N / 8 of static bytes per rank (fp32 shard, fp32 gradient shard, two fp32 moments).
TEST(Torchtitan, Llama8bOnEightGpusHoldsSixteenBytesPerParameterOverEight) {
  SetupText s;
  std::vector<std::string> notes;
  Result<ResolvedSetup> r = resolve_setup(
      {"", "", "", testing::source_dir() + "/models", sample_path(), 8}, s, false,
      [&](const std::string& n) { notes.push_back(n); });
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->model.name, "llama-3.1-8b");
  const int64_t N = 8'030'261'248;
  int64_t statics = 0;  // the program's, and the gradient shards its backward makes
  const Schedule sched = build_schedule(r->model, r->setup);  // held: the loop reads into it
  for (const ScheduleTensor& x : sched.stages[0].tensors)
    if (x.kind == ValueKind::kStatic || x.kind == ValueKind::kGradShard) statics += x.bytes;
  EXPECT_EQ(statics, 16 * N / 8);
  // Flags given too override the file.
  s.set("--micro-batch", "1");
  s.set("--reshard-after-forward", "off");
  Result<ResolvedSetup> o = resolve_setup(
      {"", "", "", testing::source_dir() + "/models", sample_path(), 8}, s, false,
      [&](const std::string& n) { notes.push_back(n); });
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->setup.micro_batch, 1);
  EXPECT_FALSE(o->setup.reshard_after_forward);
  EXPECT_EQ(o->setup.recompute_every, 2);
  // --model beside the config, or --gpus without one, is refused.
  EXPECT_FALSE(resolve_setup({"llama-3.1-8b", "", "", testing::source_dir() + "/models",
                              sample_path(), 8},
                             SetupText{}, false, [](const std::string&) {})
                   .ok());
  EXPECT_FALSE(resolve_setup({"llama-3.1-8b", "", "", testing::source_dir() + "/models", "", 8},
                             SetupText{}, false, [](const std::string&) {})
                   .ok());
}

// --emit torchtitan reads back into the same setup: the batch, FSDP2 and HSDP, the reshard
// policy, TP, and the checkpointed layers (none, every layer, every Nth). A plan whose recompute
// torchtitan cannot express becomes whole layers covering every one it re-runs in, said in a
// comment.
TEST(Torchtitan, EmittedSectionsReadBackToTheSameSetup) {
  const ModelSpec m = testing::model("llama-3.1-8b");
  const TrainSpec base = read(sample()).setup;
  std::vector<TrainSpec> setups(9, base);
  setups[1].dp_replicate = 2, setups[1].reshard_after_forward = false;
  setups[2].microbatches = 3;
  setups[3].tp = 2, setups[3].sp = true, setups[3].dp = 4;
  setups[4].recompute_every = 1;
  setups[5].recompute = Recompute::kNone, setups[5].recompute_every = 1;
  // Pipelines: torchtitan's default split, one its stage weights give (2 and 3), and one only
  // module_fqns_per_model_part gives.
  for (auto [k, split] : {std::pair{6, std::vector<int64_t>{8, 9, 8, 7}},
                          std::pair{7, std::vector<int64_t>{7, 9, 9, 7}},
                          std::pair{8, std::vector<int64_t>{3, 13, 9, 7}}}) {
    TrainSpec& t = setups[static_cast<size_t>(k)];
    t.pp = 4, t.dp = 2, t.microbatches = 4, t.reshard_after_forward = false;
    t.stage_layers = split;
  }
  auto fields = [](const TrainSpec& t) {
    return std::make_tuple(t.tp, t.dp, t.fsdp, t.dp_replicate, t.reshard_after_forward,
                           t.micro_batch, t.microbatches, t.seq_len, t.recompute,
                           t.recompute_every, t.pp_schedule, t.pp, t.stage_layers);
  };
  for (const TrainSpec& t : setups) {
    ASSERT_FALSE(validate_setup(m, t));
    const std::string toml = emit_torchtitan(build_schedule(m, t));  // [model] included
    ConfigSetup back = read(toml, 0);
    TrainSpec want = t;
    if (want.pp == 1) want.stage_layers.clear();
    EXPECT_EQ(fields(back.setup), fields(want)) << toml;
    EXPECT_EQ(toml.find("not expressible"), std::string::npos) << toml;
  }
  EXPECT_NE(emit_torchtitan(build_schedule(m, setups[7])).find(
                "pipeline_parallel_first_stage_less_layers = 2\n"
                "pipeline_parallel_last_stage_less_layers = 1"),
            std::string::npos);
  EXPECT_NE(emit_torchtitan(build_schedule(m, setups[8])).find(
                "module_fqns_per_model_part = [[\"tok_embeddings\", \"layers.0\""),
            std::string::npos);
  // A file's own module lists are read, and refused in one line where they do not cover the
  // layers in order.
  std::string pp4 = edit(edit(with("parallelism", "pipeline_parallel_degree", "4"), "training",
                              "local_batch_size", "4"),
                         "parallelism", "fsdp_reshard_after_forward", "\"never\"");
  std::string lists = "[[\"tok_embeddings\", \"layers.0\"], [\"layers.1\"], [\"layers.2\"], [";
  for (int l = 3; l < 32; ++l) lists += "\"layers." + std::to_string(l) + "\", ";
  lists += "\"norm\", \"output\"]]";
  EXPECT_EQ(read(edit(pp4, "parallelism", "module_fqns_per_model_part", lists), 32)
                .setup.stage_layers,
            (std::vector<int64_t>{1, 1, 1, 29}));
  EXPECT_NE(error(edit(pp4, "parallelism", "module_fqns_per_model_part",
                       "[[\"layers.0\"], [\"layers.2\"], [\"layers.1\"], [\"layers.3\"]]"),
                  32)
                .find("lists \"layers.2\" in list 1 where layers.1 comes next"),
            std::string::npos);
  // Layers 3 and 7 recomputed in part: every 4th layer in full covers them.
  std::vector<BlockPolicy> layers;
  Schedule s = build_schedule(m, setups[5]);
  for (StageProgram& p : s.stages)
    for (StageBlock& b : p.blocks)
      if (b.kind == BlockKind::kLayer && (b.layer == 3 || b.layer == 7)) b.policy.recompute[1] = true;
  const std::string emitted = emit_torchtitan(s);
  EXPECT_NE(emitted.find("selective_ac_option = \"4\""), std::string::npos) << emitted;
  EXPECT_NE(emitted.find("# not expressible: the plan re-runs parts of layers"), std::string::npos)
      << emitted;
}

// Under PP the stages hold the layers torchtitan's split gives them (pipeline_parallel.py,
// generate_llm_fqn_per_model_part): the embedding and the output counted as layers, the first
// stages taking the remainder; the weights and layers per stage read, and refused where torchtitan
// refuses them.
TEST(Torchtitan, PipelineStagesSplitAsTorchtitanSplits) {
  std::string pp4 = edit(with("parallelism", "pipeline_parallel_degree", "4"), "training",
                         "local_batch_size", "4");
  EXPECT_EQ(read(pp4, 32).setup.stage_layers, (std::vector<int64_t>{8, 9, 8, 7}));
  std::string heavy = edit(edit(pp4, "parallelism", "pipeline_parallel_first_stage_less_layers", "2"),
                           "parallelism", "pipeline_parallel_last_stage_less_layers", "2");
  EXPECT_EQ(read(heavy, 32).setup.stage_layers, (std::vector<int64_t>{7, 9, 9, 7}));
  EXPECT_EQ(read(edit(pp4, "parallelism", "pipeline_parallel_layers_per_stage", "9"), 32)
                .setup.stage_layers,
            (std::vector<int64_t>{8, 9, 8, 7}));
  EXPECT_NE(error(edit(pp4, "parallelism", "pipeline_parallel_layers_per_stage", "8"), 32)
                .find("makes 5 stages of the 34 layers"),
            std::string::npos);
  EXPECT_NE(error(edit(pp4, "parallelism", "pipeline_parallel_first_stage_less_layers", "20"), 32)
                .find("exceeds the fewest layers of a stage, 13"),
            std::string::npos);
  // A stage of the embedding alone (torchtitan takes it): refused at the key, in one line.
  EXPECT_NE(error(edit(pp4, "parallelism", "pipeline_parallel_first_stage_less_layers", "11"), 32)
                .find("gives stage 0 no decoder layer (only the embedding)"),
            std::string::npos);
  EXPECT_NE(error(edit(pp4, "parallelism", "module_fqns_per_model_part", "[[\"tok_embeddings\"]]"),
                  32)
                .find("has 1 lists for 4 pipeline stages"),
            std::string::npos);
  // Every flavour's layer count is its catalog model's.
  for (auto [name, flavor, catalog] :
       {std::tuple{"llama3", "70B", "llama-3.1-70b"}, {"llama3", "405B", "llama-3.1-405b"},
        {"deepseek_v3", "16B", "deepseek-v2-lite"}, {"deepseek_v3", "671B", "deepseek-v3"},
        {"qwen3", "8B", "qwen3-8b"}, {"qwen3", "32B", "qwen3-32b"},
        {"qwen3", "30B-A3B", "qwen3-30b-a3b"}, {"qwen3", "235B-A22B", "qwen3-235b-a22b"}}) {
    std::string text = edit(edit(with("model", "name", std::string("\"") + name + "\""), "model",
                                 "flavor", std::string("\"") + flavor + "\""),
                            "parallelism", "pipeline_parallel_degree", "2");
    const std::vector<int64_t> split = read(text, 16).setup.stage_layers;
    EXPECT_EQ(std::accumulate(split.begin(), split.end(), int64_t{0}),
              testing::model(catalog).layers)
        << name << " " << flavor;
  }
}

// The torchtitan profile (--impl torchtitan): torchtitan's Llama 3 block as eager PyTorch 2.10
// runs it, op for op, with the model's parameters.
TEST(TorchtitanProfile, TheLayerIsTorchtitansBlock) {
  const ModelSpec m = testing::model("llama-3.1-8b");
  TrainSpec t;
  t.impl = Impl::kTorchtitan, t.seq_len = 8192, t.micro_batch = 2;
  ASSERT_FALSE(validate_setup(m, t));
  const BlockGraph g = build_layer(m, t);
  ASSERT_FALSE(check_graph(g));
  std::vector<std::string> ops;
  for (const GraphOp& op : g.ops) ops.push_back(op.name + ":" + name_of(op.kind));
  EXPECT_EQ(ops, (std::vector<std::string>{
                     "attn.norm:rmsnorm_stats", "attn.wq:column_linear", "attn.wk:column_linear",
                     "attn.wv:column_linear", "attn.rope:rope_qk", "attn.core:sdpa_flash",
                     "attn.wo:row_linear", "attn.residual:add", "mlp.norm:rmsnorm_stats",
                     "mlp.w1:column_linear", "mlp.silu:silu", "mlp.w3:column_linear",
                     "mlp.mul:mul", "mlp.w2:row_linear", "mlp.residual:add"}));
  TrainSpec fused = t;
  fused.impl = Impl::kFused;
  EXPECT_EQ(g.weight_elements(false), build_layer(m, fused).weight_elements(false));
  // RoPE's forward holds fp32 q and k twice each (the casts and the complex products).
  const int64_t T = 2 * 8192;
  const GraphOp& rope = g.ops[4];
  std::vector<TensorType> in{g.tensors[rope.inputs[0]].type, g.tensors[rope.inputs[1]].type};
  int64_t scratch = 0;
  for (const TensorType& w : forward_workspace(op_info(rope.kind), rope.attrs, in))
    scratch += w.bytes();
  EXPECT_EQ(scratch, 2 * T * (4096 + 1024) * 4);
}

// Under TP with SP torchtitan keeps each gathered input for its column linears (the
// redistribute to Replicate is an autograd op whose output they save); nanotron's default keeps
// the sequence shard and gathers again in backward (tp_recompute_allgather), also as given here.
TEST(TorchtitanProfile, KeepsTheGatheredInputsUnderSequenceParallelism) {
  const ModelSpec m = testing::model("llama-3.1-8b");
  for (Impl impl : {Impl::kTorchtitan, Impl::kNanotron}) {
    TrainSpec t;
    t.impl = impl, t.seq_len = 8192, t.micro_batch = 2, t.tp = 8, t.sp = true;
    ASSERT_TRUE(t.tp_recompute_allgather);
    ASSERT_FALSE(validate_setup(m, t));
    const BlockGraph g = build_layer(m, t);
    const BlockPolicy p = named_policy(g, t);
    const SavedSet s = saved_set(g, p);
    int gathers = 0;
    for (size_t o = 0; o < g.ops.size(); ++o) {
      if (g.ops[o].kind != OpKind::kAllGather) continue;
      ++gathers;
      EXPECT_EQ(p.recompute[o], impl != Impl::kTorchtitan) << g.ops[o].name;
      EXPECT_EQ(s.saved[static_cast<size_t>(g.ops[o].outputs[0])], impl == Impl::kTorchtitan)
          << g.ops[o].name;
      EXPECT_EQ(s.saved[static_cast<size_t>(g.ops[o].inputs[0])], impl != Impl::kTorchtitan)
          << g.ops[o].name;
    }
    EXPECT_EQ(gathers, 2) << name_of(impl);
  }
}

// torchtitan's per-op checkpointing of a Llama 3 8B layer (local batch 2, sequence 8192): wk, wo
// and w3 (the 2nd, 4th and 6th matmul) re-run, wq, wv, w1, w2 and SDPA kept, the rest re-run.
// Kept: the layer input, q, v, SDPA's output and fp32 logsumexp, w1's output, and w2's output
// (the cache holds it; the re-run residual add reads it).
TEST(TorchtitanProfile, PerOpCheckpointingKeepsEverySecondMatmul) {
  const ModelSpec m = testing::model("llama-3.1-8b");
  TrainSpec t;
  t.impl = Impl::kTorchtitan, t.seq_len = 8192, t.micro_batch = 2;
  t.recompute = Recompute::kSelectiveOp;
  const BlockGraph g = build_layer(m, t);
  const BlockPolicy p = named_policy(g, t);
  EXPECT_EQ(p.name, "selective-op");
  std::vector<std::string> kept;
  for (size_t o = 0; o < g.ops.size(); ++o)
    if (!p.recompute[o]) kept.push_back(g.ops[o].name);
  EXPECT_EQ(kept, (std::vector<std::string>{"attn.wq", "attn.wv", "attn.core", "mlp.w1",
                                            "mlp.w2"}));
  const int64_t T = 2 * 8192, lse = 2 * 32 * 8192 * 4;
  EXPECT_EQ(saved_set(g, p).bytes, T * 2 * (4096 + 4096 + 1024 + 4096 + 14336 + 4096) + lse);
  // Under TP with sequence parallelism the reduce-scatters are kept too, the all-gathers re-run,
  // and w2's partial output is held by the cache though nothing reads it after the forward: the
  // recompute takes it (its last read is a recompute instruction).
  t.tp = 2, t.sp = true, t.seq_len = 4096, t.micro_batch = 1;
  ASSERT_FALSE(validate_setup(m, t));
  const BlockGraph tg = build_layer(m, t);
  const BlockPolicy tp = named_policy(tg, t);
  const int64_t S = 4096, half = S / 2;
  EXPECT_EQ(saved_set(tg, tp).bytes,
            2 * (half * 4096 + S * 2048 + S * 512 + S * 2048 + S * 7168 + 2 * half * 4096 +
                 S * 4096) +
                16 * 4096 * 4);
  const Schedule s = build_schedule(m, t);
  const StageProgram& prog = s.stages[0];
  int32_t w2 = -1, last = -1;
  for (int32_t id = 0; id < static_cast<int32_t>(prog.tensors.size()); ++id) {
    const ScheduleTensor& x = prog.tensors[id];
    if (x.kind == ValueKind::kValue && x.mb == 0 && x.block == 1 &&
        prog.blocks[1].graph->tensors[x.tensor].name == "mlp.w2")
      w2 = id;
  }
  ASSERT_GE(w2, 0);
  EXPECT_EQ(prog.tensors[w2].category, Category::kActivation);
  for (int32_t i = 0; i < static_cast<int32_t>(prog.instrs.size()); ++i)
    for (int32_t id : prog.reads(prog.instrs[i]))
      if (id == w2 && prog.instrs[i].kind != InstrKind::kFree) last = i;
  ASSERT_GE(last, 0);
  EXPECT_EQ(prog.instrs[last].kind, InstrKind::kRecompute);
  EXPECT_EQ(prog.blocks[1].graph->ops[prog.instrs[last].op].name, "mlp.residual");
}

// The job file's selective_ac_option "op" is the per-op policy on torchtitan's Llama 3 code, and
// --emit torchtitan writes it back; the auto planner says where it lands.
TEST(TorchtitanProfile, OpCheckpointingFromTheJobFileAndBack) {
  ConfigSetup c = read(with("activation_checkpoint", "selective_ac_option", "\"op\""));
  EXPECT_EQ(c.setup.recompute, Recompute::kSelectiveOp);
  EXPECT_EQ(c.setup.impl, Impl::kTorchtitan);
  const ModelSpec m = testing::model("llama-3.1-8b");
  ASSERT_FALSE(validate_setup(m, c.setup));
  Schedule sched = build_schedule(m, c.setup);
  const std::string toml = emit_torchtitan(sched);
  EXPECT_NE(toml.find("selective_ac_option = \"op\""), std::string::npos) << toml;
  EXPECT_EQ(read(toml, 0).setup.recompute, Recompute::kSelectiveOp);
  EXPECT_EQ(toml.find("also holds the outputs it keeps"), std::string::npos) << toml;
  // A plan that re-runs the same ops without the policy's cache (an auto plan's layer) is written
  // as "op" with a note: torchtitan's holds more.
  for (StageProgram& p : sched.stages)
    for (StageBlock& b : p.blocks)
      if (b.kind == BlockKind::kLayer) b.policy.name = "custom";
  EXPECT_NE(emit_torchtitan(sched).find("also holds the outputs it keeps until the recompute"),
            std::string::npos);
  // The MoE and MLA models keep the --impl profile, said in a note; dense Qwen3 is the profile's.
  ConfigSetup ds = read(edit(with("model", "name", "\"deepseek_v3\""), "model", "flavor", "\"16B\""));
  EXPECT_NE(ds.setup.impl, Impl::kTorchtitan);
  EXPECT_TRUE(std::any_of(ds.notes.begin(), ds.notes.end(), [](const std::string& n) {
    return n.find("deepseek_v3 16B code is estimated with the --impl kernels") != std::string::npos;
  }));
  EXPECT_EQ(read(with("model", "name", "\"qwen3\"")).setup.impl, Impl::kTorchtitan);
  // Context parallelism keeps the --impl profile too (torchtitan's CP is not in the profile), and
  // the settings the estimate does not follow are said.
  ConfigSetup cp = read(edit(edit(with("parallelism", "context_parallel_degree", "2"),
                                  "activation_checkpoint", "early_stop", "true"),
                             "activation_checkpoint", "selective_ac_option", "\"op\""));
  EXPECT_NE(cp.setup.impl, Impl::kTorchtitan);
  EXPECT_FALSE(validate_setup(m, cp.setup));
  for (const char* said : {"context_parallel_degree 1", "early_stop true", "counts the --impl"})
    EXPECT_TRUE(std::any_of(cp.notes.begin(), cp.notes.end(), [&](const std::string& n) {
      return n.find(said) != std::string::npos;
    })) << said;
  TrainSpec t = c.setup;
  t.recompute = Recompute::kAuto;
  const AutoPlan plan = auto_plan(m, t, {}, 1LL << 40, default_hardware());
  ASSERT_TRUE(plan.time_op && plan.peak_op);
  EXPECT_LT(*plan.peak_op, *plan.peak_none);
  EXPECT_GT(*plan.peak_op, *plan.peak_full);
  EXPECT_NE(auto_plan_table(plan, 1LL << 40).find("vs torchtitan's selective_ac_option \"op\""),
            std::string::npos);
  // Models the profile does not hold are refused, naming what they have.
  TrainSpec bad = c.setup;
  bad.recompute = Recompute::kNone;
  auto e = validate_setup(testing::model("qwen3-30b-a3b"), bad);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("MoE layers"), std::string::npos) << e->message;
}

// torchtitan's qwen3 block: q_norm and k_norm on q's and k's heads, then its rotate-half RoPE in
// bf16 ops; the parameters are the model's.
TEST(TorchtitanProfile, QwenBlockHasItsHeadNormsAndRope) {
  const ModelSpec m = testing::model("qwen3-8b");
  TrainSpec t;
  t.impl = Impl::kTorchtitan, t.seq_len = 4096, t.micro_batch = 1, t.tp = 2, t.sp = true;
  ASSERT_FALSE(validate_setup(m, t));
  const BlockGraph g = build_layer(m, t);
  ASSERT_FALSE(check_graph(g));
  std::vector<std::string> ops;
  for (const GraphOp& op : g.ops)
    if (op.name.rfind("attn.", 0) == 0) ops.push_back(op.name + ":" + name_of(op.kind));
  EXPECT_EQ(ops, (std::vector<std::string>{
                     "attn.norm:rmsnorm_stats", "attn.all_gather:all_gather",
                     "attn.wq:column_linear", "attn.wk:column_linear", "attn.wv:column_linear",
                     "attn.q_norm:head_rmsnorm", "attn.k_norm:head_rmsnorm",
                     "attn.rope:rope_half_qk", "attn.core:sdpa_flash", "attn.wo:row_linear",
                     "attn.reduce_scatter:reduce_scatter", "attn.residual:add"}));
  for (const GraphOp& op : g.ops)  // the head norms' weights: partial over the TP ranks' heads
    if (op.kind == OpKind::kHeadRmsNorm) EXPECT_TRUE(op.tp_partial_weight_grads) << op.name;
  TrainSpec one = t;
  one.tp = 1, one.sp = false;
  TrainSpec fused = one;
  fused.impl = Impl::kFused;
  EXPECT_EQ(build_layer(m, one).weight_elements(false), build_layer(m, fused).weight_elements(false));
  EXPECT_FALSE(validate_setup(m, read(with("model", "name", "\"qwen3\"")).setup));
}

}  // namespace
}  // namespace np

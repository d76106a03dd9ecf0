// The setup flags' table (planner/inputs/setup_flags.hpp): defaults, the reproduce command read
// back to the same setup, a config overridden by exactly the flags given, and the one-line
// errors of counts, budgets and headrooms.
#include "planner/inputs/setup_flags.hpp"

#include <gtest/gtest.h>

#include <set>
#include <sstream>

namespace np {
namespace {

// The fields the setup flags set, as one comparable tuple.
auto fields(const TrainSpec& t) {
  return std::make_tuple(t.tp, t.pp, t.dp, t.ep, t.cp, t.sp, t.zero, t.moe_capacity_factor,
                         t.micro_batch, t.seq_len, t.microbatches, t.pp_schedule,
                         t.virtual_stages, t.attention, t.impl, t.loss_fusion,
                         t.grad_accum_fusion, t.dataloader_mask, t.vocab_multiple, t.grad_dtype,
                         t.optimizer, t.recompute, t.tp_recompute_allgather, t.stage_layers,
                         t.overlap_grad_reduce, t.overlap_param_gather, t.tp_comm_overlap,
                         t.mtp_layers, t.fsdp, t.dp_replicate, t.reshard_after_forward,
                         t.recompute_every, t.fp8, t.fp8_filter, t.fp8_all_gather,
                         t.fp8_param_gather);
}

// The flags of a command line (" --tp 8 --pp 2 ...") as the CLI would give them.
SetupText read_back(const std::string& flags) {
  SetupText s;
  std::istringstream in(flags);
  for (std::string name, value; in >> name >> value;) s.set(name, value);
  return s;
}

TEST(SetupFlags, TableNamesAreUniqueWithHelpAndDefaultsThatParse) {
  std::set<std::string> names;
  for (const SetupFlag& f : setup_flags()) {
    EXPECT_TRUE(names.insert(std::string(f.name)).second) << f.name;
    EXPECT_TRUE(f.name.starts_with("--")) << f.name;
    EXPECT_FALSE(f.help.empty()) << f.name;
    EXPECT_NE(f.copy, nullptr) << f.name;
    EXPECT_NE(f.write, nullptr) << f.name;
    if (f.count && !f.default_text.empty())
      EXPECT_TRUE(parse_count_flag(f.name, f.default_text, f.lo, f.hi).ok()) << f.name;
  }
  EXPECT_EQ(names.size(), 36u);
}

TEST(SetupFlags, DefaultsAreTheSetupDefaults) {
  Result<TrainSpec> t = setup_from_flags(SetupText{}, /*budgeted=*/false);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(fields(*t), fields(TrainSpec{}));
  Result<TrainSpec> b = setup_from_flags(SetupText{}, /*budgeted=*/true);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->recompute, Recompute::kAuto);  // a budget makes the plan the default
  SetupText pp4;
  pp4.set("--pp", "4");
  pp4.set("--pp-schedule", "interleaved");
  Result<TrainSpec> p = setup_from_flags(pp4, false);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->microbatches, 4);    // default: pp
  EXPECT_EQ(p->virtual_stages, 2);  // default under interleaved
}

TEST(SetupFlags, TheReproduceCommandReadsBackToTheSameSetup) {
  // Every field a flag writes, away from its default, in several combinations.
  std::vector<TrainSpec> setups(6);
  setups[1].tp = 8, setups[1].sp = true, setups[1].pp = 4, setups[1].microbatches = 16,
  setups[1].pp_schedule = PpSchedule::k1F1B, setups[1].zero = 1, setups[1].dp = 2;
  setups[2].tp = 2, setups[2].sp = false, setups[2].cp = 2, setups[2].ep = 4, setups[2].dp = 8,
  setups[2].moe_capacity_factor = 1.25, setups[2].micro_batch = 3, setups[2].seq_len = 16384;
  setups[3].pp = 2, setups[3].pp_schedule = PpSchedule::kInterleaved,
  setups[3].virtual_stages = 3, setups[3].microbatches = 4, setups[3].impl = Impl::kMegatron,
  setups[3].loss_fusion = LossFusion::kTe, setups[3].grad_accum_fusion = false,
  setups[3].dataloader_mask = false, setups[3].vocab_multiple = 64, setups[3].tp = 2,
  setups[3].sp = true, setups[3].tp_comm_overlap = true;
  setups[4].pp = 3, setups[4].microbatches = 3, setups[4].stage_layers = {10, 11, 11},
  setups[4].attention = AttentionImpl::kEager, setups[4].grad_dtype = Dtype::kBf16,
  setups[4].optimizer = Optimizer::kSgd, setups[4].tp_recompute_allgather = false;
  setups[5].tp = 4, setups[5].sp = true, setups[5].zero = 3, setups[5].impl = Impl::kHf;
  TrainSpec& f8 = setups.emplace_back();  // torchtitan's float8 with FSDP's float8 all-gather
  f8.impl = Impl::kTorchtitan, f8.fsdp = true, f8.dp = 8, f8.fp8 = Fp8Recipe::kTensorwise;
  f8.fp8_filter = {"output"}, f8.fp8_all_gather = true, f8.pp_schedule = PpSchedule::k1F1B;
  for (const TrainSpec& t : setups) {
    std::string flags = setup_command_flags(t);
    Result<TrainSpec> back = setup_from_flags(read_back(flags), /*budgeted=*/false);
    ASSERT_TRUE(back.ok()) << flags << ": " << back.error().message;
    EXPECT_EQ(fields(*back), fields(t)) << flags;
  }
  EXPECT_EQ(setup_command_flags(setups[1]),
            " --tp 8 --pp 4 --dp 2 --zero 1 --micro-batch 1 --microbatches 16 --seq-len 4096 "
            "--pp-schedule 1f1b");
}

TEST(SetupFlags, AConfigIsOverriddenByExactlyTheFlagsGiven) {
  TrainSpec config;
  config.tp = 4, config.sp = true, config.pp = 2, config.microbatches = 8;
  config.stage_layers = {17, 15}, config.recompute = Recompute::kFull, config.zero = 1;
  // Each flag alone: only its fields change.
  for (const SetupFlag& f : setup_flags()) {
    if (f.name == "--recompute" || f.name == "--partition") continue;  // rules of their own
    TrainSpec want = config;
    SetupText s;
    std::string v = f.name == "--tp"                 ? "2"
                    : f.name == "--sp"               ? "off"
                    : f.name == "--zero"             ? "2"
                    : f.name == "--pp-schedule"      ? "1f1b"
                    : f.name == "--virtual-stages"   ? "1"
                    : f.name == "--attention"        ? "eager"
                    : f.name == "--impl"             ? "megatron"
                    : f.name == "--fp8"              ? "rowwise"
                    : f.name == "--fp8-filter"       ? "output,attention.wq"
                    : f.name == "--cross-entropy-fusion" ? "native"
                    : f.name == "--gradient-accumulation-fusion" ||
                            f.name == "--dataloader-attention-mask"
                        ? "off"
                    : f.name == "--grad-accum-dtype" ? "bf16"
                    : f.name == "--optimizer"        ? "sgd"
                    : f.name == "--tp-recompute-allgather" ? "false"
                    : f.name == "--fsdp" || f.name == "--fp8-all-gather" ||
                            f.name == "--fp8-param-gather"
                        ? "on"
                    : f.name == "--reshard-after-forward"  ? "off"
                    : f.name == "--moe-capacity-factor"    ? "2"
                    : f.name == "--overlap-grad-reduce" || f.name == "--overlap-param-gather" ||
                            f.name == "--tp-comm-overlap"
                        ? "on"
                        : "3";
    s.set(f.name, v);
    Result<TrainSpec> flags = setup_from_flags(s, false);
    ASSERT_TRUE(flags.ok()) << f.name << " " << v << ": " << flags.error().message;
    f.copy(want, *flags);
    if (f.name == "--pp" || f.name == "--pp-schedule" || f.name == "--virtual-stages")
      want.stage_layers.clear();  // the config's split was for its own pipeline
    if (want.tp == 1) want.sp = false;
    // FSDP under the config's PP: torchtitan's default reshard policy there (off).
    if (f.name == "--fsdp") want.reshard_after_forward = false;
    want.recompute = Recompute::kFull;  // the config's, as --recompute was not given
    Result<TrainSpec> got = override_setup(config, /*config_sets_recompute=*/true, s, false);
    ASSERT_TRUE(got.ok()) << f.name;
    EXPECT_EQ(fields(*got), fields(want)) << f.name;
    EXPECT_NE(fields(*got), fields(config)) << f.name << " changed nothing";
  }
  SetupText none;
  Result<TrainSpec> kept = override_setup(config, true, none, false);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(fields(*kept), fields(config));
  // The recompute policy: the flag, else the config's, else the flags' default.
  EXPECT_EQ(override_setup(config, false, none, /*budgeted=*/true)->recompute, Recompute::kAuto);
  SetupText sel;
  sel.set("--recompute", "selective");
  EXPECT_EQ(override_setup(config, true, sel, false)->recompute, Recompute::kSelective);
  SetupText part;
  part.set("--partition", "16,16");
  part.set("--pp", "2");
  EXPECT_EQ(override_setup(config, true, part, false)->stage_layers,
            (std::vector<int64_t>{16, 16}));
}

TEST(SetupFlags, ErrorsNameTheFlagTheValueAndWhatIsValid) {
  EXPECT_EQ(parse_count_flag("--zero", "5", 0, 3).error().message,
            "invalid --zero 5 (valid: 0, 1, 2, 3)");
  Result<int64_t> word = parse_count_flag("--tp", "x", std::numeric_limits<int64_t>::min(),
                                          std::numeric_limits<int64_t>::max());
  ASSERT_FALSE(word.ok());
  EXPECT_TRUE(word.error().message.starts_with("invalid --tp 'x': ")) << word.error().message;
  EXPECT_TRUE(word.error().message.ends_with("(valid: a whole number)"));
  EXPECT_EQ(parse_count_flag("--top", "0", 1, std::numeric_limits<int64_t>::max())
                .error()
                .message,
            "invalid --top 0 (valid: a positive whole number)");
  SetupText s;
  s.set("--recompute", "auto");
  EXPECT_EQ(setup_from_flags(s, false).error().message,
            "--recompute auto needs a budget: give --budget or --gpu");
  SetupText sp;
  sp.set("--sp", "yes");
  EXPECT_EQ(setup_from_flags(sp, false).error().message,
            "invalid --sp 'yes' (valid: on, off, auto)");
  SetupText gaf;
  gaf.set("--gradient-accumulation-fusion", "true");
  EXPECT_EQ(setup_from_flags(gaf, false).error().message,
            "invalid --gradient-accumulation-fusion 'true' (valid: on, off)");
  SetupText cf;
  cf.set("--moe-capacity-factor", "65");
  EXPECT_TRUE(setup_from_flags(cf, false).error().message.starts_with(
      "invalid --moe-capacity-factor '65' (valid: 0 for dropless"));
}

TEST(SetupFlags, BudgetAndHeadroom) {
  EXPECT_EQ(*parse_budget("80GB"), 80'000'000'000);
  EXPECT_EQ(*parse_budget("80GiB"), int64_t{80} << 30);
  EXPECT_TRUE(parse_budget("80").error().message.find("is under 1 MiB; give a unit") !=
              std::string::npos);
  const int64_t budget = 80'000'000'000;
  EXPECT_EQ(*parse_headroom("3%", budget), 2'400'000'000);
  EXPECT_EQ(*parse_headroom("0%", budget), 0);
  EXPECT_EQ(*parse_headroom("0", budget), 0);
  EXPECT_EQ(*parse_headroom("2GiB", budget), int64_t{2} << 30);
  EXPECT_FALSE(parse_headroom("51%", budget).ok());
  EXPECT_FALSE(parse_headroom("%", budget).ok());
  EXPECT_TRUE(parse_headroom("3", budget).error().message.find("give a unit or %") !=
              std::string::npos);
  EXPECT_TRUE(parse_headroom("80GB", budget).error().message.find("leave nothing of the budget") !=
              std::string::npos);
}

TEST(SetupFlags, ResolveTakesTheModelAndSetupFromWhereTheyAreGiven) {
  const std::string src = NANOPLAN_SOURCE_DIR;
  std::vector<std::string> said;
  auto say = [&](const std::string& line) { said.push_back(line); };
  SetupText tp2;
  tp2.set("--tp", "2");
  Result<ResolvedSetup> r = resolve_setup({"llama-3.1-8b", "", "", src + "/models"}, tp2, false, say);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->model.name, "llama-3.1-8b");
  EXPECT_EQ(r->setup.tp, 2);
  EXPECT_TRUE(r->setup.sp);
  EXPECT_TRUE(said.empty());

  SetupText longer;
  longer.set("--seq-len", "262144");
  ASSERT_TRUE(resolve_setup({"llama-3.1-8b", "", "", src + "/models"}, longer, false, say).ok());
  ASSERT_EQ(said.size(), 1u);
  EXPECT_TRUE(said[0].starts_with("warning: --seq-len 262144 is beyond llama-3.1-8b's "
                                  "max_position_embeddings"))
      << said[0];

  const std::string yaml = src + "/tests/data/nanotron_llama3_8b.yaml";
  Result<ResolvedSetup> n = resolve_setup({"", yaml, "", src + "/models"}, tp2, false, say);
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(n->model.name, "nanotron_llama3_8b");
  EXPECT_EQ(n->model.display_name, "nanotron config nanotron_llama3_8b.yaml");
  EXPECT_EQ(n->setup.tp, 2);  // the flag over the config

  EXPECT_EQ(resolve_setup({"", yaml, "--tensor-model-parallel-size 2", src + "/models"}, tp2,
                          false, say)
                .error()
                .message,
            "--nanotron-config and --megatron-args both give the setup; give one of them");
  EXPECT_TRUE(resolve_setup({"llama-3.1-8b", yaml, "", src + "/models"}, tp2, false, say)
                  .error()
                  .message.starts_with("--model and --nanotron-config both name the model"));
  EXPECT_TRUE(resolve_setup({"", "", "", src + "/models"}, tp2, false, say)
                  .error()
                  .message.starts_with("--model is required"));
  SetupText tp3;
  tp3.set("--tp", "3");  // 8B's 32 heads do not split over 3
  EXPECT_FALSE(resolve_setup({"llama-3.1-8b", "", "", src + "/models"}, tp3, false, say).ok());
}

}  // namespace
}  // namespace np

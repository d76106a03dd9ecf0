// Writing and reading plan files.
#include "planner/schedule/plan_io.hpp"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "planner/inputs/json_reader.hpp"
#include "planner/inputs/read_file.hpp"
#include "planner/inputs/units.hpp"
#include "planner/schedule/plan_check.hpp"

namespace np {

using nlohmann::json;

json model_spec_to_json(const ModelSpec& m) {
  json j = {{"name", m.name},
            {"display_name", m.display_name},
            {"source", m.source},
            {"parameters", count_parameters(m)},
            {"hidden_size", m.hidden},
            {"intermediate_size", m.ffn},
            {"num_layers", m.layers},
            {"num_heads", m.heads},
            {"num_kv_heads", m.kv_heads},
            {"head_dim", m.head_dim},
            {"vocab_size", m.vocab},
            {"max_position_embeddings", m.max_positions},
            {"norm", name_of(m.norm)},
            {"activation", name_of(m.activation)},
            {"position_embedding", name_of(m.position)},
            {"qkv_bias", m.qkv_bias},
            {"linear_bias", m.linear_bias},
            {"tie_word_embeddings", m.tie_embeddings},
            {"dropout", m.dropout}};
  if (m.qk_norm) j["qk_norm"] = true;  // written when set, as plans before it had none
  if (m.moe)
    j["moe"] = {{"num_experts", m.moe->num_experts},
                {"top_k", m.moe->top_k},
                {"expert_intermediate_size", m.moe->expert_ffn},
                {"shared_expert_intermediate_size", m.moe->shared_ffn},
                {"shared_expert_gate", m.moe->shared_gate}};
  if (m.moe && !m.dense_layers.empty()) j["moe"]["dense_layers"] = m.dense_layers;
  if (m.moe && m.moe->expert_bias) j["moe"]["expert_bias"] = true;
  if (m.moe && !m.moe->router.plain()) {  // written when set, as plans before it had none
    const RouterSpec& rt = m.moe->router;
    j["moe"]["routing"] = {{"score_function", rt.sigmoid ? "sigmoid" : "softmax"},
                           {"norm_topk_prob", rt.normalize},
                           {"groups", rt.groups},
                           {"topk_groups", rt.topk_groups},
                           {"routed_scaling_factor", rt.scaling}};
  }
  return j;
}

json setup_to_json(const TrainSpec& t) {
  json j = {{"tp", t.tp},
            {"pp", t.pp},
            {"dp", t.dp},
            {"cp", t.cp},
            {"ep", t.ep},
            {"sp", t.sp},
            {"zero", t.zero},
            {"micro_batch", t.micro_batch},
            {"seq_len", t.seq_len},
            {"microbatches", t.microbatches},
            {"pp_schedule", name_of(t.pp_schedule)},
            {"attention", name_of(t.attention)},
            {"impl", name_of(t.impl)},
            {"cross_entropy_fusion", name_of(t.loss_fusion)},
            {"gradient_accumulation_fusion", t.grad_accum_fusion},
            {"dataloader_attention_mask", t.dataloader_mask},
            {"make_vocab_size_divisible_by", t.vocab_multiple},
            {"grad_accum_dtype", name_of(t.grad_dtype)},
            {"optimizer", name_of(t.optimizer)},
            {"recompute", name_of(t.recompute)},
            {"tp_recompute_allgather", t.tp_recompute_allgather},
            {"gpus", t.gpus()}};
  if (!t.stage_layers.empty()) j["stage_layers"] = t.stage_layers;  // else balanced by FLOPs
  if (t.pp_schedule == PpSchedule::kInterleaved) j["virtual_stages"] = t.virtual_stages;
  if (t.moe_capacity_factor > 0) j["moe_capacity_factor"] = t.moe_capacity_factor;
  if (t.mtp_layers > 0) {  // absent: none (resolve_setup makes the model's default explicit)
    j["mtp_layers"] = t.mtp_layers;
    j["mtp_loss_scale"] = t.mtp_loss_scale;
  }
  if (t.overlap_grad_reduce) j["overlap_grad_reduce"] = true;  // absent: off
  if (t.tp_comm_overlap) j["tp_comm_overlap"] = true;  // absent: off
  if (t.overlap_param_gather) j["overlap_param_gather"] = true;
  if (t.recompute_every > 1) j["recompute_every"] = t.recompute_every;  // absent: 1
  if (t.fp8 != Fp8Recipe::kNone) {  // absent: none
    j["fp8"] = name_of(t.fp8);
    if (!t.fp8_filter.empty()) j["fp8_filter"] = t.fp8_filter;
    if (t.fp8_all_gather) j["fp8_all_gather"] = true;  // absent: off
    if (t.fp8_param_gather) j["fp8_param_gather"] = true;  // absent: off
  }
  if (t.fsdp) {  // absent: off
    j["fsdp"] = true;
    j["dp_replicate"] = t.dp_replicate;
    j["reshard_after_forward"] = t.reshard_after_forward;
  }
  return j;
}


using Reader = JsonReader;

Result<ModelSpec> model_spec_from_json(const json& j) {
  try {
    Reader r{j, "model"};
    r.only({"name", "display_name", "source", "parameters", "hidden_size", "intermediate_size",
            "num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
            "max_position_embeddings", "norm", "activation", "position_embedding", "qkv_bias",
            "qk_norm", "linear_bias", "tie_word_embeddings", "dropout", "moe"});
    ModelSpec m;
    m.name = r.at("name").text();
    m.display_name = r.has("display_name") ? r.at("display_name").text() : m.name;
    m.source = r.has("source") ? r.at("source").text() : "";
    m.hidden = r.at("hidden_size").positive(), m.ffn = r.at("intermediate_size").positive();
    m.layers = r.at("num_layers").positive();
    m.heads = r.at("num_heads").positive(), m.kv_heads = r.at("num_kv_heads").positive();
    m.head_dim = r.at("head_dim").positive();
    m.vocab = r.at("vocab_size").positive();
    m.max_positions = r.at("max_position_embeddings").positive();
    m.norm = r.at("norm").choice<Norm>();
    m.activation = r.at("activation").choice<Activation>();
    m.position = r.at("position_embedding").choice<PosEmb>();
    m.qkv_bias = r.at("qkv_bias").boolean(), m.linear_bias = r.at("linear_bias").boolean();
    m.qk_norm = r.has("qk_norm") && r.at("qk_norm").boolean();
    m.tie_embeddings = r.at("tie_word_embeddings").boolean();
    m.dropout = r.at("dropout").number();
    if (r.has("moe")) {
      Reader e = r.at("moe");
      e.only({"num_experts", "top_k", "expert_intermediate_size",
              "shared_expert_intermediate_size", "shared_expert_gate", "dense_layers",
              "expert_bias", "routing"});
      m.moe = MoeSpec{e.at("num_experts").positive(), e.at("top_k").positive(),
                      e.at("expert_intermediate_size").positive(),
                      e.at("shared_expert_intermediate_size").integer(0, INT64_MAX),
                      e.at("shared_expert_gate").boolean(),
                      e.has("expert_bias") && e.at("expert_bias").boolean()};
      if (e.has("routing")) {
        Reader rr = e.at("routing");
        rr.only({"score_function", "norm_topk_prob", "groups", "topk_groups",
                 "routed_scaling_factor"});
        RouterSpec& rt = m.moe->router;
        std::string score = rr.at("score_function").text();
        if (score != "softmax" && score != "sigmoid")
          return make_error("plan: model.moe.routing.score_function " + quote_input(score, '"') +
                            " is not supported (valid: softmax, sigmoid)");
        rt.sigmoid = score == "sigmoid";
        rt.normalize = rr.at("norm_topk_prob").boolean();
        rt.groups = rr.at("groups").positive(), rt.topk_groups = rr.at("topk_groups").positive();
        rt.scaling = rr.at("routed_scaling_factor").number();
      }
      if (e.has("dense_layers"))
        for (size_t i = 0; i < e.at("dense_layers").size(); ++i)
          m.dense_layers.push_back(e.at("dense_layers").at(i).integer(0, INT32_MAX));
    }
    if (auto e = validate_model(m)) return make_error("plan: model: " + e->message);
    if (r.has("parameters")) {
      int64_t stated = r.at("parameters").positive(), counted = count_parameters(m);
      if (stated != counted)
        return make_error("plan: model.parameters is " + format_int(stated) +
                          ", but the model's fields give " + format_int(counted) +
                          ": the model section was edited");
    }
    return m;
  } catch (const std::exception& e) {
    return make_error(std::string("plan: ") + e.what());
  }
}

Result<TrainSpec> setup_from_json(const json& j) {
  try {
    Reader r{j, "setup"};
    r.only({"tp", "pp", "dp", "ep", "sp", "zero", "micro_batch", "seq_len", "microbatches",
            "pp_schedule", "attention", "impl", "grad_accum_dtype", "optimizer", "recompute",
            "tp_recompute_allgather", "stage_layers", "gpus", "virtual_stages", "cp",
            "moe_capacity_factor", "cross_entropy_fusion", "gradient_accumulation_fusion",
            "dataloader_attention_mask", "make_vocab_size_divisible_by", "overlap_grad_reduce",
            "overlap_param_gather", "tp_comm_overlap", "mtp_layers", "mtp_loss_scale", "fsdp",
            "dp_replicate", "reshard_after_forward", "recompute_every", "fp8", "fp8_filter", "fp8_all_gather", "fp8_param_gather"});
    TrainSpec t;
    t.mtp_layers = r.has("mtp_layers") ? r.at("mtp_layers").integer(0, 16) : 0;
    if (r.has("mtp_loss_scale")) t.mtp_loss_scale = r.at("mtp_loss_scale").number();
    t.tp = r.at("tp").positive(), t.pp = r.at("pp").positive(), t.dp = r.at("dp").positive();
    t.ep = r.at("ep").positive(), t.sp = r.at("sp").boolean();
    if (r.has("cp")) t.cp = r.at("cp").positive();
    t.zero = static_cast<int>(r.at("zero").integer(0, 3));
    t.micro_batch = r.at("micro_batch").positive(), t.seq_len = r.at("seq_len").positive();
    t.microbatches = r.at("microbatches").positive();
    t.pp_schedule = r.at("pp_schedule").choice<PpSchedule>();
    if (r.has("virtual_stages")) t.virtual_stages = r.at("virtual_stages").positive();
    if (r.has("moe_capacity_factor")) t.moe_capacity_factor = r.at("moe_capacity_factor").number();
    t.attention = r.at("attention").choice<AttentionImpl>();
    t.impl = r.at("impl").choice<Impl>();
    if (r.has("cross_entropy_fusion"))
      t.loss_fusion = r.at("cross_entropy_fusion").choice<LossFusion>();
    if (r.has("gradient_accumulation_fusion"))
      t.grad_accum_fusion = r.at("gradient_accumulation_fusion").boolean();
    if (r.has("dataloader_attention_mask"))
      t.dataloader_mask = r.at("dataloader_attention_mask").boolean();
    if (r.has("overlap_grad_reduce")) t.overlap_grad_reduce = r.at("overlap_grad_reduce").boolean();
    if (r.has("tp_comm_overlap")) t.tp_comm_overlap = r.at("tp_comm_overlap").boolean();
    if (r.has("fsdp")) t.fsdp = r.at("fsdp").boolean();
    if (r.has("recompute_every")) t.recompute_every = r.at("recompute_every").integer(1, 1 << 20);
    if (r.has("fp8")) t.fp8 = r.at("fp8").choice<Fp8Recipe>();
    if (r.has("fp8_all_gather")) t.fp8_all_gather = r.at("fp8_all_gather").boolean();
    if (r.has("fp8_param_gather")) t.fp8_param_gather = r.at("fp8_param_gather").boolean();
    if (r.has("fp8_filter")) {
      Reader f = r.at("fp8_filter");
      for (size_t k = 0; k < f.size(); ++k) t.fp8_filter.push_back(f.at(k).text());
    }
    if (r.has("dp_replicate")) t.dp_replicate = r.at("dp_replicate").positive();
    if (r.has("reshard_after_forward"))
      t.reshard_after_forward = r.at("reshard_after_forward").boolean();
    if (r.has("overlap_param_gather"))
      t.overlap_param_gather = r.at("overlap_param_gather").boolean();
    if (r.has("make_vocab_size_divisible_by"))
      t.vocab_multiple = r.at("make_vocab_size_divisible_by").integer(1, 1 << 20);
    t.grad_dtype = r.at("grad_accum_dtype").choice<Dtype>();
    t.optimizer = r.at("optimizer").choice<Optimizer>();
    t.recompute = r.at("recompute").choice<Recompute>();
    t.tp_recompute_allgather = r.at("tp_recompute_allgather").boolean();
    if (r.has("stage_layers")) {
      Reader l = r.at("stage_layers");
      for (size_t i = 0; i < l.size(); ++i) t.stage_layers.push_back(l.at(i).positive());
    }
    return t;
  } catch (const std::exception& e) {
    return make_error(std::string("plan: ") + e.what());
  }
}

json schedule_to_json(const Schedule& s) {
  json stages = json::array();
  for (const StageProgram& p : s.stages) {
    json tensors = json::array(), program = json::array(), blocks = json::array();
    for (const StageBlock& b : p.blocks) {
      json recomputed = json::array(), kept = json::array();
      for (size_t o = 0; o < b.graph->ops.size(); ++o)
        if (b.policy.recompute[o]) recomputed.push_back(b.graph->ops[o].name);
      for (size_t t = 0; t < b.graph->tensors.size(); ++t)
        if (b.saved.saved[t]) kept.push_back(b.graph->tensors[t].name);
      blocks.push_back({{"kind", name_of(b.kind)},
                        {"layer", b.layer},
                        {"policy", b.policy.name},
                        {"recomputed_ops", recomputed},
                        {"kept_tensors", kept},
                        {"saved_bytes", b.saved.bytes}});
      if (s.setup.pp_schedule == PpSchedule::kInterleaved) blocks.back()["chunk"] = b.chunk;
    }
    for (size_t id = 0; id < p.tensors.size(); ++id) {
      const ScheduleTensor& t = p.tensors[id];
      tensors.push_back({{"id", id},
                         {"name", p.tensor_name(static_cast<int32_t>(id))},
                         {"bytes", t.bytes},
                         {"category", name_of(t.category)},
                         {"kind", name_of(t.kind)},
                         {"block", t.block},
                         {"tensor", t.tensor},
                         {"mb", t.mb}});
    }
    for (const Instr& in : p.instrs) {
      json i = {{"kind", name_of(in.kind)}};
      if (in.block >= 0) i["block"] = in.block;
      if (in.op >= 0) {
        const GraphOp& op = p.blocks[in.block].graph->ops[in.op];
        i["op"] = op.name;
        const std::string& coll =
            in.kind == InstrKind::kBackward ? op.bwd_collective : op.fwd_collective;
        if (!coll.empty()) i["collective"] = coll;
      }
      if (in.mb >= 0) i["mb"] = in.mb;
      auto r = p.reads(in), a = p.allocs(in);
      if (!r.empty()) i["reads"] = std::vector<int32_t>(r.begin(), r.end());
      if (!a.empty()) i["allocs"] = std::vector<int32_t>(a.begin(), a.end());
      program.push_back(std::move(i));
    }
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < s.setup.dp * s.setup.tp; ++r)
      ranks.push_back(p.stage * s.setup.dp * s.setup.tp + r);
    stages.push_back({{"pp_stage", p.stage},
                      {"ranks", ranks},
                      {"blocks", blocks},
                      {"tensors", tensors},
                      {"program", program}});
  }
  return {{"format", "nanoplan-schedule"},
          {"format_version", kScheduleFormatVersion},
          {"model", model_spec_to_json(s.model)},
          {"setup", setup_to_json(s.setup)},
          {"stages", stages}};
}

namespace {

template <typename E, size_t N>
E lookup(const Reader& r, const E (&all)[N]) {
  std::string text = r.text(), valid;
  for (E e : all) {
    if (text == name_of(e)) return e;
    valid += (valid.empty() ? "" : ", ") + std::string(name_of(e));
  }
  r.bad("expected one of " + valid);
}

template <typename T, typename Name>
int index_of(const Reader& r, const std::vector<T>& items, Name name) {
  std::string text = r.text();
  for (size_t i = 0; i < items.size(); ++i)
    if (name(items[i]) == text) return static_cast<int>(i);
  r.bad("no such name in this block");
}

StageBlock read_block(const Reader& r, const BlockGraphs& graphs) {
  constexpr BlockKind kinds[] = {BlockKind::kEmbedding, BlockKind::kLayer, BlockKind::kHead};
  r.only({"kind", "layer", "policy", "recomputed_ops", "kept_tensors", "saved_bytes", "chunk"});
  BlockKind kind = lookup(r.at("kind"), kinds);
  const int layer = static_cast<int>(r.at("layer").integer(-1, INT32_MAX));
  std::shared_ptr<const BlockGraph> g = graphs.of(kind, layer);
  StageBlock b{kind,
               layer,
               g,
               {std::vector<bool>(g->ops.size(), false), r.at("policy").text()},
               {},
               r.has("chunk") ? static_cast<int>(r.at("chunk").integer(0, 4095)) : 0};
  Reader ops = r.at("recomputed_ops");
  for (size_t i = 0; i < ops.size(); ++i)
    b.policy.recompute[index_of(ops.at(i), g->ops, [](const GraphOp& o) { return o.name; })] =
        true;
  b.saved.saved.assign(g->tensors.size(), false);
  Reader kept = r.at("kept_tensors");
  for (size_t i = 0; i < kept.size(); ++i) {
    int t = index_of(kept.at(i), g->tensors, [](const GraphTensor& x) { return x.name; });
    b.saved.saved[t] = true;
    b.saved.bytes += g->tensors[t].type.bytes();
  }
  return b;
}

StageProgram read_stage(const Reader& r, const BlockGraphs& graphs) {
  StageProgram p;
  r.only({"pp_stage", "ranks", "blocks", "tensors", "program"});
  p.stage = static_cast<int>(r.at("pp_stage").integer(0, INT32_MAX));
  Reader blocks = r.at("blocks");
  for (size_t i = 0; i < blocks.size(); ++i) p.blocks.push_back(read_block(blocks.at(i), graphs));
  constexpr Category cats[] = {Category::kWeight, Category::kGradient, Category::kOptimizer,
                               Category::kActivation, Category::kTransient};
  constexpr ValueKind kinds[] = {
      ValueKind::kStatic,    ValueKind::kValue,       ValueKind::kRecomputed, ValueKind::kGrad,
      ValueKind::kWorkspace, ValueKind::kParamGather, ValueKind::kGradBucket,
      ValueKind::kAllGatherBuffer, ValueKind::kReduceScatterInput, ValueKind::kGradShard,
      ValueKind::kAllGatherInput};
  const int32_t nblocks = static_cast<int32_t>(p.blocks.size());
  Reader tensors = r.at("tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    Reader tj = tensors.at(i);
    tj.only({"id", "name", "bytes", "category", "kind", "block", "tensor", "mb"});
    if (static_cast<size_t>(tj.at("id").integer(0, INT32_MAX)) != i)
      tj.at("id").bad("tensor ids must be 0, 1, 2, ... in order");
    ScheduleTensor t{tj.at("bytes").integer(0, INT64_MAX),
                     static_cast<int32_t>(tj.at("block").integer(-1, nblocks - 1)),
                     static_cast<int32_t>(tj.at("tensor").integer(-1, INT32_MAX)),
                     static_cast<int32_t>(tj.at("mb").integer(-1, INT32_MAX)),
                     lookup(tj.at("category"), cats),
                     lookup(tj.at("kind"), kinds)};
    if (t.kind == ValueKind::kStatic) {
      t.tensor = static_cast<int32_t>(p.static_names.size());
      p.static_names.push_back(tj.at("name").text());
    } else if (t.block < 0) {
      tj.at("block").bad("a non-static tensor needs a block");
    } else {
      const BlockGraph& g = *p.blocks[t.block].graph;
      int32_t limit =
          static_cast<int32_t>(t.kind == ValueKind::kWorkspace ? g.ops.size() : g.tensors.size());
      bool needs_index = t.kind == ValueKind::kValue || t.kind == ValueKind::kRecomputed ||
                         t.kind == ValueKind::kGrad || t.kind == ValueKind::kWorkspace;
      if (needs_index && (t.tensor < 0 || t.tensor >= limit))
        tj.at("tensor").bad("expected a graph index in [0, " + std::to_string(limit - 1) + "]");
    }
    p.tensors.push_back(t);
  }
  constexpr InstrKind ikinds[] = {
      InstrKind::kAlloc,       InstrKind::kLoad, InstrKind::kForward,      InstrKind::kRecompute,
      InstrKind::kBackward,    InstrKind::kSend, InstrKind::kRecv,         InstrKind::kGatherParams,
      InstrKind::kReduceGrads, InstrKind::kFree, InstrKind::kOptimizerStep, InstrKind::kStep};
  const int64_t ntensors = static_cast<int64_t>(p.tensors.size());
  Reader program = r.at("program");
  for (size_t i = 0; i < program.size(); ++i) {
    Reader ij = program.at(i);
    ij.only({"kind", "block", "op", "collective", "mb", "reads", "allocs"});
    Instr in{lookup(ij.at("kind"), ikinds),
             ij.has("block") ? static_cast<int32_t>(ij.at("block").integer(0, nblocks - 1)) : -1,
             -1,
             ij.has("mb") ? static_cast<int32_t>(ij.at("mb").integer(0, INT32_MAX)) : -1,
             static_cast<uint32_t>(p.pool.size()),
             0,
             0};
    if (ij.has("op")) {
      if (in.block < 0) ij.at("op").bad("an instruction with an op needs a block");
      in.op = index_of(ij.at("op"), p.blocks[in.block].graph->ops,
                       [](const GraphOp& o) { return o.name; });
    }
    for (const char* key : {"reads", "allocs"}) {
      if (!ij.has(key)) continue;
      Reader ids = ij.at(key);
      for (size_t k = 0; k < ids.size(); ++k) {
        p.pool.push_back(static_cast<int32_t>(ids.at(k).integer(0, ntensors - 1)));
        ++(key[0] == 'r' ? in.n_reads : in.n_allocs);
      }
    }
    if (in.kind == InstrKind::kFree && (in.n_reads != 1 || in.n_allocs != 0))
      ij.bad("a free names exactly one tensor, in reads");
    p.instrs.push_back(in);
  }
  return p;
}

}  // namespace

Result<Schedule> schedule_from_json(const json& j) {
  if (!j.is_object() || !j.contains("format") || j["format"] != "nanoplan-schedule")
    return make_error("plan: not a nanoplan schedule (its 'format' is not \"nanoplan-schedule\")");
  if (!j.contains("format_version") || j["format_version"] != kScheduleFormatVersion)
    return make_error("plan: format version " +
                      (j.contains("format_version") ? JsonReader::shown(j["format_version"]) : "(none)") +
                      " is not supported (this nanoplan reads version " +
                      std::to_string(kScheduleFormatVersion) + "); re-run nanoplan plan");
  if (!j.contains("model") || !j.contains("setup") || !j.contains("stages"))
    return make_error("plan: the document needs 'model', 'setup' and 'stages'");
  Result<ModelSpec> m = model_spec_from_json(j["model"]);
  if (!m) return m.error();
  Result<TrainSpec> t = setup_from_json(j["setup"]);
  if (!t) return t.error();
  if (auto e = validate_setup(*m, *t)) return make_error("plan: setup: " + e->message);
  if (auto e = check_sizes(*m, *t)) return make_error("plan: setup: " + e->message);
  Schedule s{*m, *t, {}};
  try {
    Reader stages{j["stages"], "stages"};
    if (static_cast<int64_t>(stages.size()) != t->pp)
      return make_error("plan: stages: " + std::to_string(stages.size()) +
                        " stage programs, but setup.pp is " + std::to_string(t->pp));
    BlockGraphs graphs(*m, *t);
    for (size_t i = 0; i < stages.size(); ++i) {
      Reader st = stages.at(i);
      s.stages.push_back(read_stage(st, graphs));
      if (s.stages.back().stage != static_cast<int>(i))
        st.at("pp_stage").bad("expected " + std::to_string(i));
      Reader ranks = st.at("ranks");
      int64_t per_stage = t->dp * t->tp;
      if (static_cast<int64_t>(ranks.size()) != per_stage)
        ranks.bad("setup.dp x setup.tp = " + std::to_string(per_stage) + " ranks per stage");
      for (size_t r = 0; r < ranks.size(); ++r)
        ranks.at(r).integer(static_cast<int64_t>(i) * per_stage + static_cast<int64_t>(r),
                            static_cast<int64_t>(i) * per_stage + static_cast<int64_t>(r));
    }
  } catch (const std::exception& e) {
    return make_error(std::string("plan: ") + e.what());
  }
  if (auto e = check_plan(s)) return *e;
  return s;
}

Result<Schedule> load_plan(const std::string& path) {
  Result<std::string> read = read_text_file(path, "plan");
  if (!read) return read.error();
  const std::string& text = *read;
  Result<json> j = parse_json(text, path);
  if (!j) return j.error();
  Result<Schedule> s = schedule_from_json(*j);
  if (!s) return make_error(path + ": " + s.error().message);
  return s;
}

std::optional<Error> write_plan(const Schedule& s, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Error{"cannot write " + path + ": it is a folder; give a file name such as " + path +
                 "/plan.json"};
  std::string text = schedule_to_json(s).dump() + "\n";
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out || !(out << text) || !out.flush()) {
      std::filesystem::remove(tmp, ec);
      return Error{"cannot write " + path + ": check that its folder exists and is writable"};
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return Error{"cannot write " + path + ": " + ec.message()};
  }
  return std::nullopt;
}

std::optional<Error> check_plan_model(const ModelSpec& plan, const ModelSpec& named,
                                      const std::string& whose) {
  if (named.name != plan.name)
    return Error{"the plan was made for model " + plan.name + ", not " + named.name};
  json a = model_spec_to_json(named), b = model_spec_to_json(plan);
  for (const char* k : {"source", "display_name"}) a.erase(k), b.erase(k);
  for (auto& [key, value] : a.items())
    if (b[key] != value)
      return Error{"the plan names model " + named.name + " but is not for it: its " + key +
                   " is " + b[key].dump() + ", " + whose + " is " + value.dump()};
  return std::nullopt;
}

}  // namespace np

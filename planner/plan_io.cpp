// Writing and reading plan files.
#include "planner/plan_io.hpp"

#include <fstream>
#include <sstream>

#include "planner/report.hpp"

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
  if (m.moe)
    j["moe"] = {{"num_experts", m.moe->num_experts},
                {"top_k", m.moe->top_k},
                {"expert_intermediate_size", m.moe->expert_ffn},
                {"shared_expert_intermediate_size", m.moe->shared_ffn},
                {"shared_expert_gate", m.moe->shared_gate}};
  return j;
}

namespace {

// Throws json::exception on a missing key or a wrong type; callers turn that into an Error.
template <typename E>
E enum_at(const json& j, const char* key) {
  Result<E> r = parse_enum<E>(key, j.at(key).get<std::string>());
  if (!r) throw std::invalid_argument(r.error().message);
  return *r;
}

}  // namespace

Result<ModelSpec> model_spec_from_json(const json& j) {
  try {
    ModelSpec m;
    m.name = j.at("name");
    m.display_name = j.value("display_name", m.name);
    m.source = j.value("source", "");
    m.hidden = j.at("hidden_size"), m.ffn = j.at("intermediate_size"),
    m.layers = j.at("num_layers");
    m.heads = j.at("num_heads"), m.kv_heads = j.at("num_kv_heads"), m.head_dim = j.at("head_dim");
    m.vocab = j.at("vocab_size"), m.max_positions = j.at("max_position_embeddings");
    m.norm = enum_at<Norm>(j, "norm");
    m.activation = enum_at<Activation>(j, "activation");
    m.position = enum_at<PosEmb>(j, "position_embedding");
    m.qkv_bias = j.at("qkv_bias"), m.linear_bias = j.at("linear_bias");
    m.tie_embeddings = j.at("tie_word_embeddings"), m.dropout = j.at("dropout");
    if (j.contains("moe")) {
      const json& e = j["moe"];
      m.moe = MoeSpec{e.at("num_experts"), e.at("top_k"), e.at("expert_intermediate_size"),
                      e.at("shared_expert_intermediate_size"), e.at("shared_expert_gate")};
    }
    if (auto e = validate_model(m)) return *e;
    return m;
  } catch (const std::exception& e) {
    return make_error(std::string("plan: bad model spec: ") + e.what());
  }
}

Result<TrainSpec> setup_from_json(const json& j) {
  try {
    TrainSpec t;
    t.tp = j.at("tp"), t.pp = j.at("pp"), t.dp = j.at("dp"), t.ep = j.at("ep"), t.sp = j.at("sp");
    t.zero = j.at("zero"), t.micro_batch = j.at("micro_batch"), t.seq_len = j.at("seq_len");
    t.microbatches = j.at("microbatches");
    t.pp_schedule = enum_at<PpSchedule>(j, "pp_schedule");
    t.attention = enum_at<AttentionImpl>(j, "attention");
    t.grad_dtype = enum_at<Dtype>(j, "grad_accum_dtype");
    t.optimizer = enum_at<Optimizer>(j, "optimizer");
    t.recompute = enum_at<Recompute>(j, "recompute");
    t.tp_recompute_allgather = j.at("tp_recompute_allgather");
    if (j.contains("stage_layers")) t.stage_layers = j["stage_layers"].get<std::vector<int64_t>>();
    return t;
  } catch (const std::exception& e) {
    return make_error(std::string("plan: bad setup: ") + e.what());
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
E lookup(const std::string& text, const E (&all)[N], const char* what) {
  for (E e : all)
    if (text == name_of(e)) return e;
  throw std::invalid_argument(std::string("unknown ") + what + " '" + text + "'");
}

int index_of(const std::vector<std::string>& names, const std::string& name, const char* what) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int>(i);
  throw std::invalid_argument(std::string("unknown ") + what + " '" + name + "'");
}

std::vector<std::string> op_names(const BlockGraph& g) {
  std::vector<std::string> n;
  for (const GraphOp& op : g.ops) n.push_back(op.name);
  return n;
}
std::vector<std::string> tensor_names(const BlockGraph& g) {
  std::vector<std::string> n;
  for (const GraphTensor& t : g.tensors) n.push_back(t.name);
  return n;
}

StageBlock read_block(const json& j, const ModelSpec& m, const TrainSpec& t) {
  constexpr BlockKind kinds[] = {BlockKind::kEmbedding, BlockKind::kLayer, BlockKind::kHead};
  BlockKind kind = lookup(j.at("kind").get<std::string>(), kinds, "block kind");
  auto g = std::make_shared<const BlockGraph>(kind == BlockKind::kEmbedding ? build_embedding(m, t)
                                              : kind == BlockKind::kLayer   ? build_layer(m, t)
                                                                            : build_head(m, t));
  StageBlock b{kind,
               j.at("layer").get<int>(),
               g,
               {std::vector<bool>(g->ops.size(), false), j.at("policy")},
               {}};
  for (const json& op : j.at("recomputed_ops"))
    b.policy.recompute[index_of(op_names(*g), op, "op")] = true;
  b.saved.saved.assign(g->tensors.size(), false);
  for (const json& t : j.at("kept_tensors")) {
    int i = index_of(tensor_names(*g), t, "tensor");
    b.saved.saved[i] = true;
    b.saved.bytes += g->tensors[i].type.bytes();
  }
  return b;
}

StageProgram read_stage(const json& j, const ModelSpec& m, const TrainSpec& t) {
  StageProgram p;
  p.stage = j.at("pp_stage");
  for (const json& b : j.at("blocks")) p.blocks.push_back(read_block(b, m, t));
  constexpr Category cats[] = {Category::kWeight, Category::kGradient, Category::kOptimizer,
                               Category::kActivation, Category::kTransient};
  constexpr ValueKind kinds[] = {
      ValueKind::kStatic,    ValueKind::kValue,       ValueKind::kRecomputed, ValueKind::kGrad,
      ValueKind::kWorkspace, ValueKind::kParamGather, ValueKind::kGradBucket};
  const int32_t nblocks = static_cast<int32_t>(p.blocks.size());
  for (const json& tj : j.at("tensors")) {
    if (tj.at("id").get<size_t>() != p.tensors.size())
      throw std::invalid_argument("tensor ids must be 0, 1, 2, ... in order");
    ScheduleTensor t{tj.at("bytes"),
                     tj.at("block"),
                     tj.at("tensor"),
                     tj.at("mb"),
                     lookup(tj.at("category").get<std::string>(), cats, "category"),
                     lookup(tj.at("kind").get<std::string>(), kinds, "tensor kind")};
    if (t.kind == ValueKind::kStatic) {
      t.tensor = static_cast<int32_t>(p.static_names.size());
      p.static_names.push_back(tj.at("name"));
    } else if (t.block < 0 || t.block >= nblocks) {
      throw std::invalid_argument("tensor " + std::to_string(p.tensors.size()) + " names block " +
                                  std::to_string(t.block));
    } else {
      const BlockGraph& g = *p.blocks[t.block].graph;
      int32_t limit =
          static_cast<int32_t>(t.kind == ValueKind::kWorkspace ? g.ops.size() : g.tensors.size());
      bool needs_index = t.kind != ValueKind::kParamGather && t.kind != ValueKind::kGradBucket;
      if (needs_index && (t.tensor < 0 || t.tensor >= limit))
        throw std::invalid_argument("tensor " + std::to_string(p.tensors.size()) +
                                    " has an out-of-range graph index");
    }
    p.tensors.push_back(t);
  }
  constexpr InstrKind ikinds[] = {
      InstrKind::kAlloc,       InstrKind::kLoad, InstrKind::kForward,      InstrKind::kRecompute,
      InstrKind::kBackward,    InstrKind::kSend, InstrKind::kRecv,         InstrKind::kGatherParams,
      InstrKind::kReduceGrads, InstrKind::kFree, InstrKind::kOptimizerStep};
  for (const json& ij : j.at("program")) {
    Instr in{lookup(ij.at("kind").get<std::string>(), ikinds, "instruction"),
             ij.value("block", -1),
             -1,
             ij.value("mb", -1),
             static_cast<uint32_t>(p.pool.size()),
             0,
             0};
    if (in.block >= nblocks)
      throw std::invalid_argument("instruction names block " + std::to_string(in.block));
    if (ij.contains("op")) {
      if (in.block < 0) throw std::invalid_argument("instruction with an op but no block");
      in.op = index_of(op_names(*p.blocks[in.block].graph), ij["op"], "op");
    }
    for (const char* key : {"reads", "allocs"})
      for (const json& id : ij.value(key, json::array())) {
        int32_t v = id.get<int32_t>();
        if (v < 0 || v >= static_cast<int32_t>(p.tensors.size()))
          throw std::invalid_argument("unknown tensor id " + std::to_string(v));
        p.pool.push_back(v);
        ++(key[0] == 'r' ? in.n_reads : in.n_allocs);
      }
    if (in.kind == InstrKind::kFree && in.n_reads != 1)
      throw std::invalid_argument("a free must name exactly one tensor");
    p.instrs.push_back(in);
  }
  return p;
}

}  // namespace

Result<Schedule> schedule_from_json(const json& j) {
  if (!j.is_object() || j.value("format", "") != "nanoplan-schedule")
    return make_error("plan: not a nanoplan schedule (its 'format' is not \"nanoplan-schedule\")");
  int version = j.value("format_version", -1);
  if (version != kScheduleFormatVersion)
    return make_error("plan: format version " + std::to_string(version) +
                      " is not supported (this nanoplan reads version " +
                      std::to_string(kScheduleFormatVersion) + "); re-run nanoplan plan");
  Result<ModelSpec> m = model_spec_from_json(j.value("model", json::object()));
  if (!m) return m.error();
  Result<TrainSpec> t = setup_from_json(j.value("setup", json::object()));
  if (!t) return t.error();
  if (auto e = validate_setup(*m, *t)) return make_error("plan: " + e->message);
  Schedule s{*m, *t, {}};
  try {
    for (const json& st : j.at("stages")) s.stages.push_back(read_stage(st, *m, *t));
  } catch (const std::exception& e) {
    return make_error(std::string("plan: malformed program: ") + e.what());
  }
  if (static_cast<int64_t>(s.stages.size()) != t->pp)
    return make_error("plan: " + std::to_string(s.stages.size()) + " stage programs for pp " +
                      std::to_string(t->pp));
  return s;
}

Result<Schedule> load_plan(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot read plan " + path + ": no such file or not readable");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    size_t line = 1 + std::count(text.begin(), text.begin() + std::min(e.byte, text.size()), '\n');
    return make_error(path + ":" + std::to_string(line) + ": malformed JSON: " + e.what());
  }
  Result<Schedule> s = schedule_from_json(j);
  if (!s) return make_error(path + ": " + s.error().message);
  return s;
}

}  // namespace np

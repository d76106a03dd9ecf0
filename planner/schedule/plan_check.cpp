// Plans that cannot lie: a plan file is compared with the schedule rebuilt from its own model,
// setup and block policies, cheap structural checks first, so that an edited setup is refused
// before anything the size of the edit is built.
#include <algorithm>
#include <set>

#include "planner/schedule/plan_io.hpp"
#include "planner/inputs/units.hpp"
#include "planner/schedule/plan_check.hpp"
#include "planner/schedule/contract.hpp"

namespace np {

namespace {

Error at(const std::string& path, const std::string& what) {
  return Error{"plan: " + path + ": " + what};
}

std::string type_text(const TensorType& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "] " + name_of(t.dtype);
}

// What gives a tensor its bytes, for messages: its graph shape where it has one.
std::string size_source(const StageProgram& p, int32_t id) {
  const ScheduleTensor& t = p.tensors[id];
  if (t.kind == ValueKind::kValue || t.kind == ValueKind::kRecomputed || t.kind == ValueKind::kGrad)
    return "its shape " + type_text(p.blocks[t.block].graph->tensors[t.tensor].type);
  return "the op table";
}

std::string setup_text(const TrainSpec& t) {
  return "tp " + std::to_string(t.tp) + ", sp " + (t.sp ? "on" : "off") + ", micro_batch " +
         std::to_string(t.micro_batch) + ", seq_len " + std::to_string(t.seq_len);
}

std::string layers_text(const StageProgram& p) {
  if (p.num_layers() == 0) return "no decoder layers";
  return "layers " + format_ranges(p.layers());
}

std::optional<Error> check_blocks(const Schedule& plan) {
  const TrainSpec& t = plan.setup;
  const std::vector<std::vector<int>> lists = stage_layer_lists(plan.model, t);
  const std::vector<int64_t> chunks = chunk_layers(plan.model, t);
  const int v = static_cast<int>(chunks.size() / t.pp);
  for (int s = 0; s < static_cast<int>(plan.stages.size()); ++s) {
    const StageProgram& p = plan.stages[s];
    struct Want {
      BlockKind kind;
      int layer, chunk;
    };
    std::vector<Want> want;
    if (s == 0) want.push_back({BlockKind::kEmbedding, -1, 0});
    for (int c = 0, k = 0; c < v; ++c)
      for (int64_t l = 0; l < chunks[c * t.pp + s]; ++l)
        want.push_back({BlockKind::kLayer, lists[s][k++], c});
    if (s == t.pp - 1) want.push_back({BlockKind::kHead, -1, v - 1});
    bool same = want.size() == p.blocks.size();
    for (size_t b = 0; same && b < want.size(); ++b)
      same = p.blocks[b].kind == want[b].kind && p.blocks[b].layer == want[b].layer &&
             p.blocks[b].chunk == want[b].chunk;
    if (!same) {
      std::string expect = lists[s].empty() ? "no decoder layers"
                                            : "layers " + format_ranges(lists[s]);
      return at("stages[" + std::to_string(s) + "].blocks",
                layers_text(p) + " in " + std::to_string(p.blocks.size()) +
                    " blocks, but model.num_layers " + std::to_string(plan.model.layers) +
                    " over setup.pp " + std::to_string(t.pp) +
                    (v > 1 ? " x " + std::to_string(v) + " chunks" : std::string()) +
                    " (layers per stage " + format_partition(partition_layers(plan.model, t)) +
                    ") places " + expect + (s == 0 ? " after the embedding" : "") +
                    (s == t.pp - 1 ? " and the head" : "") + " on this stage" +
                    (v > 1 ? ", in chunk order" : ""));
    }
  }
  return std::nullopt;
}

// Micro-batch indices in range, and every micro-batch of the setup present: bounds the rebuild
// by the plan's own size.
std::optional<Error> check_microbatches(const Schedule& plan) {
  const int64_t m = plan.setup.microbatches;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StageProgram& p = plan.stages[s];
    std::string where = "stages[" + std::to_string(s) + "]";
    std::vector<bool> seen(static_cast<size_t>(std::min<int64_t>(m, 1 << 24)), false);
    for (size_t i = 0; i < p.tensors.size(); ++i) {
      int64_t mb = p.tensors[i].mb;
      if (mb >= m || (mb < 0 && p.tensors[i].kind != ValueKind::kStatic))
        return at(where + ".tensors[" + std::to_string(i) + "].mb",
                  std::to_string(mb) + ", but setup.microbatches is " + std::to_string(m) +
                      " (valid: 0.." + std::to_string(m - 1) + ")");
      if (mb >= 0 && mb < static_cast<int64_t>(seen.size())) seen[mb] = true;
    }
    for (size_t i = 0; i < p.instrs.size(); ++i)
      if (p.instrs[i].mb >= m)
        return at(where + ".program[" + std::to_string(i) + "].mb",
                  std::to_string(p.instrs[i].mb) + ", but setup.microbatches is " +
                      std::to_string(m) + " (valid: 0.." + std::to_string(m - 1) + ")");
    int64_t used = std::count(seen.begin(), seen.end(), true);
    if (used != m)
      return at("setup.microbatches", std::to_string(m) + ", but " + where +
                                          "'s program runs " + std::to_string(used) +
                                          " micro-batches");
  }
  return std::nullopt;
}

BlockPolicies policies_of(const Schedule& plan) {
  BlockPolicies b;
  b.layers.resize(static_cast<size_t>(plan.model.layers));
  for (const StageProgram& p : plan.stages)
    for (const StageBlock& blk : p.blocks) {
      if (blk.kind == BlockKind::kLayer) b.layers[blk.layer] = blk.policy;
      if (blk.kind == BlockKind::kEmbedding) b.embedding = blk.policy;
      if (blk.kind == BlockKind::kHead) b.head = blk.policy;
    }
  return b;
}

bool same_instr(const StageProgram& a, const Instr& x, const StageProgram& b, const Instr& y) {
  if (x.kind != y.kind || x.block != y.block || x.op != y.op || x.mb != y.mb) return false;
  auto ra = a.reads(x), rb = b.reads(y), aa = a.allocs(x), ab = b.allocs(y);
  return std::equal(ra.begin(), ra.end(), rb.begin(), rb.end()) &&
         std::equal(aa.begin(), aa.end(), ab.begin(), ab.end());
}

std::optional<Error> compare_stage(const StageProgram& p, const StageProgram& want,
                                   const TrainSpec& t) {
  std::string where = "stages[" + std::to_string(p.stage) + "]";
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    const std::vector<bool>&listed = p.blocks[b].saved.saved, &kept = want.blocks[b].saved.saved;
    for (size_t k = 0; k < kept.size(); ++k)
      if (listed[k] != kept[k])
        return at(where + ".blocks[" + std::to_string(b) + "].kept_tensors",
                  p.blocks[b].graph->tensors[k].name +
                      (kept[k] ? " is missing, but its recomputed_ops leave it kept"
                               : " is listed, but its recomputed_ops do not keep it") +
                      " (" + format_int(p.blocks[b].saved.bytes) + " bytes listed, " +
                      format_int(want.blocks[b].saved.bytes) + " bytes kept)");
  }
  if (p.tensors.size() != want.tensors.size())
    return at(where + ".tensors", std::to_string(p.tensors.size()) + " tensors, but this setup and " +
                                      "these policies give " + std::to_string(want.tensors.size()));
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const ScheduleTensor &x = p.tensors[i], &y = want.tensors[i];
    std::string path = where + ".tensors[" + std::to_string(i) + "]";
    int32_t id = static_cast<int32_t>(i);
    // The file's name: a static's is the file's own text, quoted (escaped) as input until it is
    // found the same as this setup's (the messages below name it after that check).
    const std::string name =
        x.kind == ValueKind::kStatic ? quote_input(p.tensor_name(id)) : p.tensor_name(id);
    if (x.kind != y.kind || x.block != y.block || x.mb != y.mb ||
        (x.kind != ValueKind::kStatic && x.tensor != y.tensor) ||
        (x.kind == ValueKind::kStatic && p.tensor_name(id) != want.tensor_name(id)))
      return at(path, name + " (" + name_of(x.kind) + "), but this setup and these " +
                          "policies have " + want.tensor_name(id) + " (" + name_of(y.kind) +
                          ") here");
    if (x.bytes != y.bytes)
      return at(path + ".bytes", format_int(x.bytes) + " for " + p.tensor_name(id) +
                                     ", but under the plan's setup (" + setup_text(t) + ") " +
                                     size_source(want, id) + " gives " + format_int(y.bytes));
    if (x.category != y.category)
      return at(path + ".category", std::string(name_of(x.category)) + " for " +
                                        p.tensor_name(id) + ", but it is " + name_of(y.category));
  }
  size_t j = 0;
  for (size_t i = 0; i <= p.instrs.size(); ++i) {
    if (i < p.instrs.size() && p.instrs[i].kind == InstrKind::kFree) continue;
    while (j < want.instrs.size() && want.instrs[j].kind == InstrKind::kFree) ++j;
    if (i == p.instrs.size() || j == want.instrs.size()) {
      if (i == p.instrs.size() && j == want.instrs.size()) break;
      return at(where + ".program",
                i == p.instrs.size() ? "ends before '" + want.instr_name(want.instrs[j]) + "'"
                                     : "'" + p.instr_name(p.instrs[i]) + "' at [" +
                                           std::to_string(i) + "] is past the end of the step");
    }
    if (!same_instr(p, p.instrs[i], want, want.instrs[j]))
      return at(where + ".program[" + std::to_string(i) + "]",
                "'" + p.instr_name(p.instrs[i]) + "', but this setup and these policies run '" +
                    want.instr_name(want.instrs[j]) + "' here (with its reads and allocations)");
    ++j;
  }
  if (auto e = check_program(p)) return at(where + ".program", e->message);
  return std::nullopt;
}

}  // namespace

std::optional<Error> check_sizes(const ModelSpec& m, const TrainSpec& t) {
  int64_t tokens = 0;
  if (__builtin_mul_overflow(t.seq_len, t.micro_batch, &tokens))
    return Error{"seq_len x micro_batch overflows 64 bits"};
  // The widest per-token row of any tensor (fp32, doubled for fused sections) and the largest
  // weight: every tensor and weight of the graphs is at most one of these.
  int64_t width = std::max({m.hidden, 2 * m.ffn, padded_vocab(m, t), (m.heads + 2 * m.kv_heads) * m.head_dim});
  int64_t scores = 0, weight = 0;
  if (__builtin_mul_overflow(m.heads, t.seq_len, &scores)) scores = -1;
  if (m.moe) {
    int64_t e = 0;
    if (__builtin_mul_overflow(m.moe->top_k, 2 * m.moe->expert_ffn, &e) ||
        __builtin_mul_overflow(m.moe->num_experts, 2 * m.moe->expert_ffn, &weight))
      return Error{"the expert sizes overflow 64 bits"};
    width = std::max({width, e, m.moe->num_experts});
  }
  weight = std::max({weight, padded_vocab(m, t), 3 * m.ffn, width});
  int64_t bytes = 0;
  bool overflow = scores < 0 || __builtin_mul_overflow(tokens, std::max(width, scores), &bytes) ||
                  __builtin_mul_overflow(bytes, int64_t{8}, &bytes) ||
                  __builtin_mul_overflow(weight, m.hidden, &weight) ||
                  __builtin_mul_overflow(weight, int64_t{8}, &weight);
  if (overflow)
    return Error{"micro_batch " + std::to_string(t.micro_batch) + " x seq_len " +
                 std::to_string(t.seq_len) + " with this model gives tensors whose byte counts " +
                 "overflow 64 bits"};
  return std::nullopt;
}

std::optional<Error> check_plan(const Schedule& plan) {
  if (auto e = check_blocks(plan)) return e;
  if (auto e = check_microbatches(plan)) return e;
  BlockPolicies policies = policies_of(plan);
  Schedule want = build_schedule(plan.model, plan.setup, &policies);
  for (size_t s = 0; s < plan.stages.size(); ++s)
    if (auto e = compare_stage(plan.stages[s], want.stages[s], plan.setup)) return e;
  return std::nullopt;
}

}  // namespace np

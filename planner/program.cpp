// Names and the well-formedness checker of a stage program.
#include <string>

#include "planner/schedule.hpp"

namespace np {

namespace {
std::string block_label(const StageBlock& b) {
  if (b.kind == BlockKind::kLayer) return "L" + std::to_string(b.layer);
  return b.kind == BlockKind::kEmbedding ? "embed" : "head";
}
}  // namespace

std::string StageProgram::tensor_name(int32_t id) const {
  const ScheduleTensor& t = tensors.at(id);
  if (t.kind == ValueKind::kStatic) return static_names.at(t.tensor);
  std::string where = block_label(blocks.at(t.block)) + "/mb" + std::to_string(t.mb) + "/";
  const BlockGraph& g = *blocks[t.block].graph;
  switch (t.kind) {
    case ValueKind::kGrad:
      return "grad:" + where + g.tensors.at(t.tensor).name;
    case ValueKind::kRecomputed:
      return "recomputed:" + where + g.tensors.at(t.tensor).name;
    case ValueKind::kWorkspace:
      return "workspace:" + where + g.ops.at(t.tensor).name;
    case ValueKind::kParamGather:
      return where + "gathered_weights";
    case ValueKind::kGradBucket:
      return where + "grad_bucket";
    default:
      return where + g.tensors.at(t.tensor).name;
  }
}

std::string StageProgram::instr_name(const Instr& i) const {
  std::string s = name_of(i.kind);
  if (i.block >= 0) s += " " + block_label(blocks.at(i.block));
  if (i.mb >= 0) s += "/mb" + std::to_string(i.mb);
  if (i.op >= 0) s += " " + blocks.at(i.block).graph->ops.at(i.op).name;
  return s;
}

int StageProgram::first_layer() const {
  for (const StageBlock& b : blocks)
    if (b.kind == BlockKind::kLayer) return b.layer;
  return -1;
}

int StageProgram::num_layers() const {
  int n = 0;
  for (const StageBlock& b : blocks) n += b.kind == BlockKind::kLayer;
  return n;
}

std::optional<Error> check_program(const StageProgram& p) {
  enum State : uint8_t { kUnborn, kLive, kFreed };
  std::vector<State> state(p.tensors.size(), kUnborn);
  auto fail = [&](const Instr& in, const std::string& why) {
    return make_error("schedule stage " + std::to_string(p.stage) + ": '" + p.instr_name(in) +
                      "' " + why);
  };
  for (const Instr& in : p.instrs) {
    for (int32_t id : p.reads(in)) {
      if (id < 0 || id >= static_cast<int32_t>(p.tensors.size()))
        return fail(in, "reads an unknown tensor id " + std::to_string(id));
      if (state[id] == kUnborn)
        return fail(in, "reads " + p.tensor_name(id) + " before it is produced");
      if (state[id] == kFreed)
        return fail(in, "reads " + p.tensor_name(id) + " after it was freed");
      const ScheduleTensor& t = p.tensors[id];
      if (in.kind == InstrKind::kBackward && t.kind == ValueKind::kValue && t.block == in.block &&
          !p.blocks[t.block].saved.saved[t.tensor])
        return fail(in, "reads " + p.tensor_name(id) + ", which was neither kept nor recomputed");
    }
    if (in.kind == InstrKind::kFree) {
      int32_t id = p.reads(in)[0];
      if (p.tensors[id].kind == ValueKind::kStatic)
        return fail(in, "frees static tensor " + p.tensor_name(id));
      state[id] = kFreed;
      continue;
    }
    for (int32_t id : p.allocs(in)) {
      if (id < 0 || id >= static_cast<int32_t>(p.tensors.size()))
        return fail(in, "allocates an unknown tensor id " + std::to_string(id));
      if (state[id] != kUnborn)
        return fail(in, "allocates " + p.tensor_name(id) + " a second time");
      state[id] = kLive;
    }
  }
  for (size_t id = 0; id < p.tensors.size(); ++id) {
    bool is_static = p.tensors[id].kind == ValueKind::kStatic;
    if (!is_static && state[id] != kFreed)
      return make_error("schedule stage " + std::to_string(p.stage) + ": " +
                        p.tensor_name(static_cast<int32_t>(id)) + " is never freed");
    if (is_static && state[id] != kLive)
      return make_error("schedule stage " + std::to_string(p.stage) + ": static " +
                        p.tensor_name(static_cast<int32_t>(id)) + " is not live at the end");
  }
  return std::nullopt;
}

}  // namespace np

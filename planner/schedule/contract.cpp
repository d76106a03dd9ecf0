// Names and the well-formedness checker of a stage program.
#include <string>

#include <stdexcept>

#include "planner/schedule/contract.hpp"
#include "planner/schedule/schedule.hpp"

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
    case ValueKind::kAllGatherBuffer:
      return where + "all_gather_buffer";
    case ValueKind::kReduceScatterInput:
      return where + "reduce_scatter_input";
    case ValueKind::kGradShard:
      return where + "grad_shard";
    case ValueKind::kAllGatherInput:  // an op's: its float8 weight's pre-all-gather cast
      return where + (t.tensor >= 0 ? g.ops.at(t.tensor).name + ".fsdp_float8_cast"
                                    : std::string("all_gather_input"));
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

std::string static_weight_name(const StageBlock& block, const GraphOp& op, size_t w) {
  std::string prefix = block.kind == BlockKind::kLayer ? "L" + std::to_string(block.layer) + "/" : "";
  return prefix + op.name + "." + op.weights.at(w).suffix;
}

BackwardOperands backward_operands(const StageProgram& p, const Instr& in) {
  const GraphOp& op = p.blocks.at(in.block).graph->ops.at(in.op);
  const OpInfo& info = op_info(op.kind);
  BackwardOperands b{std::vector<int32_t>(op.outputs.size(), -1),
                     std::vector<int32_t>(op.outputs.size(), -1),
                     std::vector<int32_t>(op.inputs.size(), -1),
                     std::vector<int32_t>(op.inputs.size(), -1)};
  std::span<const int32_t> reads = p.reads(in);
  size_t next = 0;
  // The next read if it is of the expected kind (a gradient or a value), else -1.
  auto take = [&](bool grad) -> int32_t {
    if (next >= reads.size() || (p.tensors[reads[next]].kind == ValueKind::kGrad) != grad)
      return -1;
    return reads[next++];
  };
  for (size_t j = 0; j < op.outputs.size(); ++j) {
    if (info.grad_outputs >> j & 1u) b.grad_outputs[j] = take(true);
    if (info.bwd_reads_outputs >> j & 1u) b.outputs[j] = take(false);
  }
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    if (info.bwd_reads_inputs >> k & 1u) b.inputs[k] = take(false);
    if (info.grad_inputs >> k & 1u) b.grad_inputs[k] = take(true);
  }
  // ZeRO-2/3: the block's gradient bucket and gathered weights are read last.
  while (next < reads.size() && (p.tensors[reads[next]].kind == ValueKind::kGradBucket ||
                                 p.tensors[reads[next]].kind == ValueKind::kParamGather))
    ++next;
  for (size_t j = 0; j < op.outputs.size(); ++j)
    if ((info.bwd_reads_outputs >> j & 1u) && b.outputs[j] < 0)
      throw std::logic_error("'" + p.instr_name(in) + "' does not read output " +
                             std::to_string(j) + ", which its backward needs");
  for (size_t k = 0; k < op.inputs.size(); ++k)
    if ((info.bwd_reads_inputs >> k & 1u) && b.inputs[k] < 0)
      throw std::logic_error("'" + p.instr_name(in) + "' does not read input " +
                             std::to_string(k) + ", which its backward needs");
  if (next != reads.size())
    throw std::logic_error("'" + p.instr_name(in) + "' reads " + p.tensor_name(reads[next]) +
                           " out of the contract's order");
  return b;
}

int StageProgram::first_layer() const {
  for (const StageBlock& b : blocks)
    if (b.kind == BlockKind::kLayer) return b.layer;
  return -1;
}

std::vector<int> StageProgram::layers() const {
  std::vector<int> out;
  for (const StageBlock& b : blocks)
    if (b.kind == BlockKind::kLayer) out.push_back(b.layer);
  return out;
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
  // The last op instruction (a stepped op's steps follow it), and the kind of its first.
  const Instr* op_instr = nullptr;
  InstrKind op_kind = InstrKind::kFree;
  for (const Instr& in : p.instrs) {
    if (in.kind == InstrKind::kStep &&
        (!op_instr || op_instr->block != in.block || op_instr->op != in.op || op_instr->mb != in.mb))
      return fail(in, "is a step of no op's instruction before it");
    if (in.kind == InstrKind::kForward || in.kind == InstrKind::kRecompute ||
        in.kind == InstrKind::kBackward)
      op_instr = &in, op_kind = in.kind;
    else if (in.kind == InstrKind::kStep)
      op_instr = &in;
    else if (in.kind != InstrKind::kFree)
      op_instr = nullptr;
    for (int32_t id : p.reads(in)) {
      if (id < 0 || id >= static_cast<int32_t>(p.tensors.size()))
        return fail(in, "reads an unknown tensor id " + std::to_string(id));
      if (state[id] == kUnborn)
        return fail(in, "reads " + p.tensor_name(id) + " before it is produced");
      if (state[id] == kFreed)
        return fail(in, "reads " + p.tensor_name(id) + " after it was freed");
      const ScheduleTensor& t = p.tensors[id];
      if ((in.kind == InstrKind::kBackward ||
           (in.kind == InstrKind::kStep && op_kind == InstrKind::kBackward)) &&
          t.kind == ValueKind::kValue && t.block == in.block &&
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

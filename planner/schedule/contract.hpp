// The contract between the schedule builder (planner/schedule/schedule.cpp) and the executors' runner
// (executor/rank.cpp): what a stage program's instructions read and allocate, in which order, and
// when tensors die. The builder writes programs in this form; plan files carry it; the runner
// relies on it and checks every point it can.
//
// 1. Statics. Instruction 0 (kAlloc, no block) allocates the stage's static tensors: per block in
//    forward order, per op, each weight (op-table order; a tied weight once, where it first
//    appears; named static_weight_name()), then per parameter group (dense, then expert): the
//    gradient buffer, then the optimizer's fp32 master weights, first and second moments.
//    The runner allocates its statics under the same names and binds them to the plan's ids by
//    name; a static the plan does not name is an unplanned allocation.
// 2. Forward and recompute of op o of a block for micro-batch mb: reads are the op's inputs in
//    op-table order; allocs are its forward workspaces, then its outputs, each in op-table
//    order. Kernels allocate in any order: the runner binds the k-th output the kernel allocates
//    to the k-th output id, the k-th workspace to the k-th workspace id.
// 3. Backward of op o: reads are, per output j in order, its gradient (if it carries one and one
//    exists) then its value (if the backward reads it); then per input k in order, its value (if
//    the backward reads it) then its gradient (if it receives one and one already exists: the
//    kernel accumulates into it). backward_operands() decodes this. Allocs are the op's backward
//    workspaces, then the gradients of inputs that had none yet, in input order.
//    A stepped op (ops.hpp, OpStep: torchao's float8 linear) goes on in kStep instructions, one
//    per further step (frees between them): each reads the op instruction's reads again, then the
//    op's earlier temporaries it uses, and allocates its own temporaries (workspaces), then, in
//    the step that makes them, the outputs, or the input gradients and FSDP's weight gradients.
//    The kernel runs once and passes from step to step through OpContext::step.
// 4. kLoad allocates a micro-batch's token ids or targets; kRecv allocates the tensor it
//    receives; kSend reads the tensor it sends; kOptimizerStep reads every static tensor.
// 5. Lifetimes. Every non-static tensor dies right after its last use: the last instruction
//    that reads or allocates it. The plan's kFree instructions state where the planner expects
//    each death (ids ascending after each instruction); the runner never reads them: it frees
//    by its own last-use count, so that a plan whose frees are wrong diverges from the run.
// 6. Events. Memory is compared as a sequence of MemEvent (planner/schedule/simulate.hpp) in
//    canonical_order(): per instruction, its allocations by tensor id, then its releases.
//
// What the planner and the executors share, and what they do not: the op table's shapes and
// dtypes (planner/graph/ops.hpp) size every tensor on both sides, so weight, gradient-buffer and
// optimizer bytes agree by construction. Independent of the plan are the kernels' own
// allocations (a workspace or output the plan does not name is an unplanned allocation), how
// many bytes each allocation really takes (the executor measures what its kernels asked for),
// and every lifetime (point 5).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "planner/schedule/schedule.hpp"

namespace np {

// The operands of a backward instruction, per graph slot of its op (-1: absent).
struct BackwardOperands {
  std::vector<int32_t> grad_outputs, outputs;  // per op output
  std::vector<int32_t> inputs, grad_inputs;    // per op input
};
// Decodes a backward instruction's reads (point 3). Throws std::logic_error when the reads do
// not follow the contract (a read left over, or a value where a gradient belongs).
BackwardOperands backward_operands(const StageProgram& p, const Instr& in);

// The static name of weight w of op in block (point 1): "L3/attn.qkv.weight", "lm_head.weight".
std::string static_weight_name(const StageBlock& block, const GraphOp& op, size_t w);

// Well-formedness: every tensor is allocated before it is read, every recompute's inputs are
// live, every backward reads only kept or recomputed tensors, every non-static tensor is freed
// exactly once, and nothing is read after its free.
std::optional<Error> check_program(const StageProgram& p);

}  // namespace np

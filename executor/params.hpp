// A rank's parameters: its bf16 weights, the flat gradient buffers they accumulate into, and the
// optimizer states, as the contract's statics (planner/schedule/contract.hpp, point 1), sharded over the
// data-parallel group as the setup's ZeRO stage says. Initial values, gradient synchronisation,
// the optimizer step and gradient capture all go through the backend and the communicator:
// nothing here touches device memory directly.
//
// Each parameter group (dense, expert) is one flat index space: the block's weights in forward
// order, op-table order within a block. ZeRO splits it over the DP group in blocks of
// ceil(n / dp) elements, block q owned by DP rank q: the optimizer states (ZeRO-1), the gradient
// buffer (ZeRO-2) and the bf16 weights (ZeRO-3) hold only the owned block. Under ZeRO-2/3 a
// block's weight gradients go to a per-block bucket ([dense | expert] of the block), reduce-
// scattered into the sharded gradient buffer after the block's backward; under ZeRO-3 a block's
// weights are all-gathered into a per-block buffer of the same layout before its forward and its
// backward. Buckets and gathered buffers are the plan's transients; the runner allocates them.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "executor/backend.hpp"
#include "planner/schedule/schedule.hpp"

namespace np::exec {

// The name of FSDP's gradient staging buffer (ParamStore::use_fsdp_staging) among a rank's
// runtime buffers.
inline constexpr const char* kFsdpStagingName = "FSDP gradient staging";

class ParamStore {
 public:
  // Allocates a static tensor (the runner binds its name to the plan's id).
  using Allocate = std::function<Tensor(const TensorType&, const std::string&, Category)>;

  ParamStore(const Schedule& s, int64_t stage, int64_t tp_rank, Backend& be, Communicator& comm);

  // Allocates and initialises every static tensor of the stage, in the contract's order.
  void allocate(const Allocate& alloc, uint64_t seed);
  // The weights and their gradient views of op `op` of block `block`, in op-table order (ZeRO-3:
  // views into the block's gathered buffer; ZeRO-2/3: gradients into its bucket).
  const std::vector<Tensor>& weights(int block, int op) const { return weights_[block][op]; }
  const std::vector<Tensor>& weight_grads(int block, int op) const { return wgrads_[block][op]; }

  // Elements of block b's bucket or gathered buffer: its weights', tied copies included.
  int64_t block_elements(int block) const;
  // ZeRO-2/3: the block's weight gradients go to `bucket` (zeroed here) until reduce_bucket.
  void bind_bucket(int block, const Tensor& bucket);
  // ZeRO-2/3: the bucket's sum over the DP group, this rank's part added to the gradient buffer.
  void reduce_bucket(int block, const Tensor& bucket);
  // ZeRO-3: the block's weights all-gathered into `gathered`, its weight views bound there.
  void gather_block(int block, const Tensor& gathered);

  // Sums partial gradients over TP and the tied embedding's over its two stages, then over the
  // data-parallel replicas: an all-reduce (ZeRO-0), or a reduce-scatter leaving this rank the sum
  // of the part of the buffer whose optimizer states it holds (ZeRO-1); under ZeRO-2/3 the
  // buckets were reduced already.
  void sync_gradients();
  // This rank's gradients in the global (unsharded) layout: elements other ranks hold are NaN.
  std::map<std::string, std::vector<float>> capture_gradients() const;
  // The optimizer update of step `step` (0-based), new bf16 weights, gradients zeroed. ZeRO-1/2:
  // this rank updates its part and the replicas all-gather the new bf16 weights; ZeRO-3: its
  // part of the weights is all it keeps. FSDP2: each unit's fp32 shard, with its gradient shard.
  void optimizer_step(int step, float lr);

  // FSDP2 (setup.fsdp; planner/schedule/schedule.cpp, fsdp_unshard and fsdp_reduce). A unit is a
  // block; each of its parameters is padded on dim 0 to a multiple of the shard group's size and
  // split into equal row chunks, chunk q held by group rank q. This rank's chunks, in fp32, are
  // the static "params (FSDP shard, fp32)", unit after unit and parameter after parameter.
  // Elements of unit b's all-gather input (this rank's chunks) and of its unsharded buffers.
  int64_t fsdp_shard_elements(int block) const { return units_.at(block).shard_n; }
  // The all-gather input: this rank's chunks of the unit, cast to bf16.
  void fsdp_copy_in(int block, const Tensor& input);
  // The flat all-gather output: the inputs of this rank's shard group, in rank order (under HSDP
  // its replica's S ranks).
  void fsdp_all_gather(int block, const Tensor& input, const Tensor& flat);
  // The copy-out: each parameter's chunks, in rank order, into its own padded place in `params`;
  // the unit's weight views bound there.
  void fsdp_copy_out(int block, const Tensor& flat, const Tensor& params);
  // An op's weight gradients go to the staging buffer (zeroed) while its backward runs; then
  // into `grads`, the op's bf16 gradients in op-table order, which the unit's reduction reads.
  // The staging is device memory outside the plan (fsdp_staging_elements bf16 elements: the
  // largest op's weights), given once by the runner as a runtime buffer of the executor's own.
  int64_t fsdp_staging_elements() const;
  void use_fsdp_staging(const Tensor& staging) { staging_ = staging; }
  void fsdp_stage_grads(int block, int op);
  void fsdp_take_grads(int block, int op, const Tensor& grads);
  // The fp32 reduce-scatter input: each parameter's gradient chunks, rank-major as the flat
  // all-gather output, padding zero; the TP-partial ones summed over TP first.
  void fsdp_fill_reduce_input(int block, const Tensor& input);
  // The reduce-scatter into this rank's fp32 gradient shard: the first micro-batch's becomes the
  // unit's gradient; a later one's sum is added into that gradient (its own `shard`, allocated as
  // the plan says, stays zero).
  void fsdp_reduce_scatter(int block, const Tensor& input, const Tensor& shard, bool first);
  // Under PP (fsdp_accumulate): the micro-batch's bf16 gradients added into the unit's fp32
  // unsharded gradient (`acc`, given at the first micro-batch: zeroed and kept), op after op;
  // the reduction of the step's last backward then reads it.
  void fsdp_accumulate(int block, const Tensor* acc);
  // FSDP's float8 all-gather (setup.fp8_all_gather): step `step` (0-4) of the pre-all-gather
  // cast of op `op`'s float8 weight, into the tensors its instruction allocates (in order): |x|
  // and its max; the max over the shard group; the fp32 scale; x times the scale; the clamp
  // and the e4m3 shard, which the copy-in takes. A unit with float8 weights gathers bytes: its
  // bf16 weights' chunks (fsdp_copy_in's input, fsdp_bf16_elements of them) and the float8
  // ones, in parameter order; the copy-out binds each float8 weight as {e4m3 values, scale}.
  void fsdp_fp8_cast(int block, int op, int step, const std::vector<Tensor>& made);
  int64_t fsdp_bf16_elements(int block) const { return units_.at(block).bf16_n; }
  int64_t fsdp_shard_bytes(int block) const { return units_.at(block).shard_bytes; }
  bool fsdp_gathers_bytes(int block) const { return units_.at(block).fp8; }

 private:
  struct FsdpParam {
    int op, w;
    int64_t rows, cols, chunk;  // chunk: rows per group rank
    int64_t in_shard;           // element offset of its chunk in the unit's shard
    int64_t in_unit;            // element offset of its padded rows in the unit's buffer
    bool fp8 = false;           // gathered in float8 (one byte an element)
    int64_t in_shard_b = 0, in_unit_b = 0;  // the same offsets in bytes
    int64_t in_bf16 = 0;        // element offset of its chunk in the bf16 copy-in (not fp8)
  };
  // The pre-all-gather cast in flight (fsdp_fp8_cast): its shard, max, scale and product.
  struct Fp8Cast {
    std::vector<float> x, scaled;
    float amax = 0, scale = 0;
    Tensor scale_t;
  };
  struct FsdpUnit {
    std::vector<FsdpParam> params;
    int64_t shard_off = 0, shard_n = 0;  // in the static shard; elements per rank
    bool fp8 = false;                    // some weights gathered in float8: a byte all-gather
    int64_t shard_bytes = 0, bf16_n = 0;  // bytes per rank; elements of its bf16 copy-in
    Fp8Cast cast;
    std::map<int, std::pair<Tensor, Tensor>> fp8_shards;  // per op: its e4m3 shard and scale
    Tensor grad;                         // the gradient shard, from the first micro-batch
    Tensor acc;                          // PP: the unsharded fp32 gradient of the step
    std::map<int, Tensor> op_grads;      // the ops' bf16 gradients of this micro-batch
  };
  void allocate_fsdp(const Allocate& alloc, uint64_t seed);
  void fsdp_all_gather_bytes(int block, const Tensor& input, const Tensor& flat);
  // The shard group's size (dp / dp_replicate x cp) and this rank's chunk index in it.
  int64_t fsdp_shards() const { return s_.setup.fsdp_shards(); }
  int64_t fsdp_index() const { return comm_.group_rank(DpGroup::kDense) % fsdp_shards(); }
  std::vector<FsdpUnit> units_;
  Tensor fsdp_params_, fsdp_m_, fsdp_v_;
  Tensor staging_;  // FSDP: the op's weight gradients while its backward runs (bf16)


  struct Member {
    int block, op, w;
    int64_t off, n;  // element offset in the group's flat space, elements
    Tensor weight;   // the static weight (ZeRO-0..2); unset under ZeRO-3
  };
  struct Group {
    DpGroup dp;  // the ranks its gradients are summed and its states sharded over
    Tensor grad, master, m, v, shard_weights;  // shard_weights: ZeRO-3's bf16 weights
    std::vector<Member> members;
    int64_t n = 0;
    // The owned elements [lo, hi) of the n, in blocks of `shard` per DP rank (the planner's
    // ceil(n / dp)); without ZeRO, all of them.
    int64_t shard = 0, lo = 0, hi = 0;
    // Per block: its range in the flat space, first element and count (blocks are contiguous).
    std::vector<std::pair<int64_t, int64_t>> blocks;
  };
  void allocate_group(Group& g, const std::string& name, const Allocate& alloc);
  // Block b's range in a group's flat space: first element, count.
  static std::pair<int64_t, int64_t> block_range(const Group& g, int block) {
    return g.blocks[static_cast<size_t>(block)];
  }
  // Block b's part of a bucket or gathered buffer for group g (dense first, then expert).
  Tensor block_part(const Tensor& buffer, int block, const Group& g) const;
  // The element range [lo, hi) of a member whose optimizer states this rank holds.
  static std::pair<int64_t, int64_t> held(const Group& g, const Member& m);
  // Points the block's weight (or gradient) views into a [dense | expert | copies] buffer.
  void bind_views(int block, const Tensor& buffer, bool grads);
  // A tied weight's copy: an op of `block` using the weight of dense member `member`. Under
  // ZeRO-2/3 it has its own place in the block's bucket and gathered buffer (as the planner counts
  // them), `at` elements in, after the block's own weights.
  struct Copy {
    int block, op, w;
    size_t member;
    int64_t at;
  };
  std::vector<Copy> copies_;

  const Schedule& s_;
  const StageProgram& p_;
  int64_t stage_, tp_rank_;
  Backend& be_;
  Communicator& comm_;
  std::vector<std::vector<std::vector<Tensor>>> weights_, wgrads_;  // [block][op][weight]
  std::map<std::string, std::pair<size_t, size_t>> tie_owner_;    // tie name -> (block, op)
  Group dense_{DpGroup::kDense}, expert_{DpGroup::kExpert};
};

}  // namespace np::exec

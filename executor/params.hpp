// A rank's parameters: its bf16 weights, the flat gradient buffers they accumulate into, and the
// optimizer states, as the contract's statics (planner/contract.hpp, point 1). Initial values,
// gradient synchronisation, the optimizer step and gradient capture all go through the backend
// and the communicator: nothing here touches device memory directly.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "executor/backend.hpp"
#include "planner/schedule.hpp"

namespace np::exec {

class ParamStore {
 public:
  // Allocates a static tensor (the runner binds its name to the plan's id).
  using Allocate = std::function<Tensor(const TensorType&, const std::string&, Category)>;

  ParamStore(const Schedule& s, int64_t stage, int64_t tp_rank, Backend& be, Communicator& comm);

  // Allocates and initialises every static tensor of the stage, in the contract's order.
  void allocate(const Allocate& alloc, uint64_t seed);
  // The weights and their gradient views of op `op` of block `block`, in op-table order.
  const std::vector<Tensor>& weights(int block, int op) const { return weights_[block][op]; }
  const std::vector<Tensor>& weight_grads(int block, int op) const { return wgrads_[block][op]; }

  // Sums partial gradients over TP and the tied embedding's over its two stages, then over the
  // data-parallel replicas: an all-reduce (ZeRO-0), or a reduce-scatter leaving this rank the sum
  // of the part of the buffer whose optimizer states it holds (ZeRO-1).
  void sync_gradients();
  // This rank's gradients in the global (unsharded) layout: elements other ranks hold are NaN.
  std::map<std::string, std::vector<float>> capture_gradients() const;
  // The optimizer update of step `step` (0-based), new bf16 weights, gradients zeroed. ZeRO-1:
  // this rank updates its part and the replicas all-gather the new bf16 weights.
  void optimizer_step(int step, float lr);

 private:
  struct Group {
    Tensor grad, master, m, v;
    std::vector<std::pair<Tensor, int64_t>> members;  // weight, element offset in the buffers
    int64_t n = 0;
    // ZeRO-1: the optimizer states hold elements [lo, hi) of the n, in blocks of `shard` per DP
    // rank (the planner's ceil(n / dp)); without ZeRO, all of them.
    int64_t shard = 0, lo = 0, hi = 0;
  };
  void allocate_group(Group& g, const std::string& name, const Allocate& alloc);
  Tensor grad_view(const Tensor& w) const;
  // The element range [lo, hi) of weight w whose optimizer states this rank holds.
  std::pair<int64_t, int64_t> held(const Tensor& w) const;

  const Schedule& s_;
  const StageProgram& p_;
  int64_t stage_, tp_rank_;
  Backend& be_;
  Communicator& comm_;
  std::vector<std::vector<std::vector<Tensor>>> weights_, wgrads_;  // [block][op][weight]
  std::map<std::string, std::pair<size_t, size_t>> tie_owner_;    // tie name -> (block, op)
  Group dense_, expert_;
};

}  // namespace np::exec

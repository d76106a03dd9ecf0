// What a rank holds besides the schedule's tensors: the runtime's overheads (CUDA context, NCCL,
// library workspaces) and the allocations a training framework
// makes that nanoplan's executors do not (Megatron-core's and Transformer Engine's buffers). Each
// is a named line of the estimate with its assumption, and says whether PyTorch's caching
// allocator holds it (so that torch.cuda.max_memory_allocated() counts it) or only the device.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/graph/graph.hpp"
#include "planner/inputs/spec.hpp"

namespace np {

struct OverheadLine {
  std::string name;
  int64_t bytes = 0;
  std::string assumption;
  // Held in PyTorch's caching allocator (counted by torch.cuda.max_memory_allocated()); false:
  // device memory outside it (the CUDA context, NCCL's buffers, the allocator's cached blocks).
  bool allocator = false;
  // The allocations the line sums, when it is more than one (the allocator rounds and places
  // each apart): empty means one of `bytes`.
  std::vector<int64_t> blocks;
};

// An allocator line's allocations: its blocks, else one of its bytes.
std::vector<int64_t> allocations_of(const OverheadLine& o);

// The blocks a pipeline stage holds, as the framework terms need them.
struct StageBlocks {
  const BlockGraph* layer = nullptr;  // the decoder layer's graph, when the stage has layers
  const BlockGraph* other_layer = nullptr;  // a mixed model's other kind of layer on the stage
  const BlockGraph* head = nullptr;   // the head block's graph, on the last stage
  bool embedding = false;             // the stage holds the embedding (the first stage)
  int64_t chunks = 1;                 // model chunks on the stage (interleaved: virtual stages)
  int64_t layers = 0;                 // decoder layers on the stage
};

// The framework's own allocations on a stage under the setup's implementation profile (megatron's
// and nanotron's): see runtime_terms.cpp for each term's source.
std::vector<OverheadLine> framework_lines(const ModelSpec& m, const TrainSpec& t,
                                          const RuntimeAssumptions& rt, const StageBlocks& b);

// Every line of a stage: the runtime's, then the framework's. (The caching allocator's line, its
// rounding and cached blocks, comes from replaying the stage's events: estimate.cpp.)
std::vector<OverheadLine> stage_overheads(const ModelSpec& m, const TrainSpec& t,
                                          const RuntimeAssumptions& rt, const StageBlocks& b);

// The bytes of every line of stage_overheads.
int64_t fixed_overhead_bytes(const ModelSpec& m, const TrainSpec& t, const RuntimeAssumptions& rt,
                             const StageBlocks& b);

}  // namespace np

// The backend interface: forward and backward of every OpKind, one dispatch switch per backend.
// A backend computes and allocates what its kernels need through the context; it never reads
// byte counts from a plan and never decides a policy. Free of Eigen and CUDA types.
#pragma once
#include <cstdint>
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "executor/comm/comm.hpp"
#include "executor/rng.hpp"
#include "executor/tensor.hpp"
#include "planner/graph/graph.hpp"
#include "planner/inputs/spec.hpp"

namespace np::exec {

// Which tensor an allocation is, so the runner can name and free it.
enum class AllocRole { kOutput, kGradInput, kWorkspace };

// Transformer Engine's float8 (te_fp8) on a rank: the small fp32 state TE keeps in its tensors
// and recipe, outside the planned memory (the estimate does not count it either):
// - each float8 tensor's reciprocal scale (Float8Tensor._scale_inv), by the tensor's address:
//   set where it is written, passed on by the all-gather, read by the linear that takes it;
// - under delayed scaling each (op, tensor role)'s amax history, one step long: a step's scales
//   come from the largest amax of its role in that op during the step before (1 at the first
//   step; margin 0), so that a recompute casts as its forward did. (TE rolls the history after
//   each micro-batch's forward; the executor once a step, the same bytes.)
struct TeFp8State {
  std::unordered_map<const void*, float> inv_scale;
  struct History {
    int step = -1;
    float amax = 0, previous = 0;
  };
  std::map<std::tuple<int, int, int>, History> history;
  // The scale of role `role` of op `op` of layer `layer` at `step`, recording this amax.
  float delayed_scale(int layer, int op, int role, int step, float amax, float fp8_max) {
    History& h = history[{layer, op, role}];
    if (h.step != step) h.previous = h.step >= 0 ? h.amax : 0.0f, h.amax = 0, h.step = step;
    h.amax = std::max(h.amax, amax);
    return h.previous > 0 ? fp8_max / h.previous : 1.0f;
  }
};

struct OpContext {
  const GraphOp* op = nullptr;
  const ModelSpec* model = nullptr;
  const TrainSpec* setup = nullptr;
  Communicator* comm = nullptr;  // collectives over the TP group
  int64_t tp_rank = 0;
  int layer = -1;     // global decoder-layer index; -1 for embedding and head
  int op_index = 0;   // index of op in its block graph
  int mb = 0;         // micro-batch
  uint64_t seed = 0;  // dropout and data seed of the run
  // Global index (within the micro-batch's s*b tokens, order pos*b + batch) of the first local row
  // of a sequence-sharded tensor: tp_rank * s*b/tp under SP, else 0.
  int64_t token_offset = 0;
  int64_t cp_rank = 0;  // context parallelism: which two chunks of each sequence this rank holds
  float loss_scale = 1.0f;  // d(step loss)/d(per-token loss): 1 / (tokens x micro-batches)
  // Allocates device-model memory through the rank's tracking allocator.
  std::function<Tensor(const TensorType&, AllocRole)> alloc;
  // A stepped op's kernel (planner/graph/ops.hpp, OpStep) calls this between its steps: what
  // the step before last used is freed, and what it allocates next belongs to the next step.
  std::function<void()> step;
  // A workspace that torchtitan's per-op checkpointing may keep for the recompute
  // (OpStep::sac_kept): in a recompute the runner returns the one the forward kept; otherwise, and
  // where unset, it is allocated as a workspace.
  std::function<Tensor(const TensorType&)> kept;
  // Per-op checkpointing's recompute of an op whose output the cache holds: only what runs before
  // the cache returns it (a float8 linear's casts) runs again, and the op makes no output.
  bool cached_output = false;
  int train_step = 0;               // the training step (0 first)
  TeFp8State* te_fp8 = nullptr;     // the rank's (absent in an op test's context)
};

// The scale of a float8 tensor of role `role` (0 input, 1 weight, 2 gradient) of the op whose
// amax (already all-reduced where te_reduces says) is `amax`: current scaling fp8_max / amax (1
// for a zero tensor), delayed scaling from the history (1 without one: an op test's context).
inline float te_scale(const OpContext& c, int role, float amax, float fp8_max) {
  if (c.op->attrs.fp8 != Fp8Recipe::kDelayed) return amax > 0 ? fp8_max / amax : 1.0f;
  if (!c.te_fp8) return 1.0f;
  return c.te_fp8->delayed_scale(c.layer, c.op_index, role, c.train_step, amax, fp8_max);
}
// Whether that amax is all-reduced over TP: always under delayed scaling (every rank's history
// the same), under current scaling where TE sets the amax reduction group (`shared`: the SP
// shard a LayerNorm-linear gathers, the row linear's SP output gradient).
inline bool te_reduces(const OpContext& c, bool shared) {
  return shared || c.op->attrs.fp8 == Fp8Recipe::kDelayed;
}

struct BackwardArgs {
  std::span<const Tensor> inputs;        // absent where the backward does not read them
  std::span<const Tensor> outputs;       // absent where the backward does not read them
  std::span<const Tensor> grad_outputs;  // absent where an output carries no gradient
  // For inputs that receive a gradient: present -> accumulate into it; absent -> allocate it
  // (AllocRole::kGradInput, the input's shape and dtype) and set it here.
  std::span<Tensor> grad_inputs;
  std::span<const Tensor> weights;       // the op's weights (bf16), in op-table order
  std::span<const Tensor> weight_grads;  // views into the gradient buffer: accumulate (+=)
};

// A rank's device memory. The tracking allocator is the only caller of allocate and release, so
// every device byte a run uses is counted; the runner moves data only through the copies.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Returns nullptr when the device has no room for `bytes` (the allocator then reports the
  // tensor, its size and the bytes in use).
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void fill_bytes(void* p, uint8_t value, int64_t bytes) = 0;
  virtual void copy_to_host(void* dst, const Tensor& src) = 0;
  virtual void copy_from_host(const Tensor& dst, const void* src) = 0;
  // Bytes in use on the whole device now (a GPU: cudaMemGetInfo's total - free), where the
  // memory can say; the allocator samples it after every allocation.
  virtual std::optional<int64_t> device_used() { return std::nullopt; }
  // Addresses that grow in place, for the caching allocator's expandable segments (PyTorch maps
  // pages into reserved addresses: cuMemAddressReserve, cuMemMap): reserve `bytes` of addresses,
  // then map and unmap byte ranges at offsets inside them. reserve_addresses returns nullptr
  // where this memory cannot (run then refuses --allocator expandable).
  virtual void* reserve_addresses(int64_t /*bytes*/) { return nullptr; }
  virtual bool map_addresses(void* /*base*/, int64_t /*offset*/, int64_t /*bytes*/) {
    return false;
  }
  virtual void unmap_addresses(void* /*base*/, int64_t /*offset*/, int64_t /*bytes*/) {}
  virtual void release_addresses(void* /*base*/, int64_t /*bytes*/) {}
};

// One optimizer update over a flat parameter group (the runner's dense or expert group).
struct OptimizerUpdate {
  Optimizer kind = Optimizer::kAdamW;
  Tensor grad, master, m, v;  // m and v: AdamW only
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  int step = 0;  // 0-based: the bias corrections use step + 1
};

// A buffer a backend's runtime needs besides the plan's tensors (a cuBLAS workspace): the rank
// allocates it through the tracking allocator, which reports it apart from the plan's accounting,
// as the estimate lists it among the runtime overheads.
struct RuntimeBuffer {
  std::string name;
  int64_t bytes = 0;
};

// A backend: the op kernels, and the device operations the runner needs around them (memory,
// filling, element copies between dtypes, the optimizer update, a sum for the loss readout).
class Backend : public DeviceMemory {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // The runtime buffers this backend needs, and where the rank placed buffer i (before any op).
  virtual std::vector<RuntimeBuffer> runtime_buffers() const { return {}; }
  virtual void use_runtime_buffer(size_t /*i*/, void* /*p*/) {}
  // Device memory the backend's runtime took as it started, each measured before and after its
  // creation (the CUDA context, the cuBLAS handle): the estimate's runtime overheads, measured.
  virtual std::vector<RuntimeBuffer> measured_overheads() const { return {}; }
  // Waits for the work enqueued so far (a GPU: the device), so that a step's wall time counts it.
  virtual void synchronize() {}
  // t[i] = value for every element (float dtypes).
  virtual void fill(const Tensor& t, float value) = 0;
  // dst[dst_offset + i] = src[src_offset + i] for i < n, converting between float dtypes.
  virtual void copy_elements(const Tensor& dst, int64_t dst_offset, const Tensor& src,
                             int64_t src_offset, int64_t n) = 0;
  // SGD: master -= lr * grad. AdamW (Loshchilov and Hutter 2019, with bias corrections): m, v,
  // then master. Reads grad in its own dtype; fp32 arithmetic.
  virtual void optimizer_update(const OptimizerUpdate& u) = 0;
  // The sum of an fp32 tensor's elements in index order, in double (the loss readout).
  virtual double sum(const Tensor& t) = 0;
  // Computes and returns the op's outputs (allocated with AllocRole::kOutput, in op-table order).
  // Forward workspaces are allocated with AllocRole::kWorkspace and returned after the outputs.
  virtual std::vector<Tensor> forward(const OpContext& ctx, std::span<const Tensor> inputs,
                                      std::span<const Tensor> weights) = 0;
  // Backward workspaces are allocated with AllocRole::kWorkspace; the runner frees them.
  virtual void backward(const OpContext& ctx, const BackwardArgs& args) = 0;
};

// The norms' epsilon (RMSNorm and LayerNorm), the same in every backend.
inline constexpr double kNormEps = 1e-5;

// Global index (within the micro-batch's s*b tokens) of the first row of a token tensor with
// `rows` rows: 0 when it holds the full sequence, else the context's sequence-shard offset.
inline int64_t first_token_row(const OpContext& ctx, int64_t rows) {
  return rows == ctx.setup->seq_len / ctx.setup->cp * ctx.setup->micro_batch ? 0
                                                                            : ctx.token_offset;
}

// The row of the whole micro-batch (order pos*b + batch) that local token row `row` is: the row
// itself without context parallelism; else local position u of CP rank c is in chunk c (u below
// half a chunk pair) or chunk 2 cp - 1 - c of the 2 cp chunks of s / (2 cp) positions.
inline int64_t global_token_row(const OpContext& ctx, int64_t row) {
  const TrainSpec& t = *ctx.setup;
  if (t.cp == 1) return row;
  int64_t b = t.micro_batch, u = row / b, half = t.seq_len / (2 * t.cp);
  int64_t chunk = u < half ? ctx.cp_rank : 2 * t.cp - 1 - ctx.cp_rank;
  return (chunk * half + u % half) * b + row % b;
}

}  // namespace np::exec

// The schedule: for every pipeline stage, the ordered program of one training step that every
// rank of that stage runs (forward ops per micro-batch, recompute segments, backward ops,
// collectives, pipeline send/recv, frees, optimizer step). It is the contract between the planner
// and the executors; simulate.hpp replays it for memory.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "planner/graph/graph.hpp"
#include "planner/graph/policy.hpp"
#include "planner/inputs/spec.hpp"

namespace np {

// Version 2: the norms' backward allocates its per-row statistics (a workspace version 1 lacked).
// Version 3: the MoE shared gate's backward allocates its per-row gate gradient.
// Version 4: the setup's implementation profile (impl).
// Version 5: the setup's cross_entropy_fusion; under megatron the padded vocabulary, the
// embedding's bf16 gradient workspace and Transformer Engine's loss (cross_entropy_te).
// Version 6: the setup's gradient_accumulation_fusion and dataloader_attention_mask; under
// megatron without the fusion each linear's backward allocates its bf16 weight gradient, and the
// native fused loss's backward an fp32 gradient buffer; Megatron's interleaved warm-up when m = pp.
// Version 7: the setup's fp8 and fp8_filter; a float8 linear's steps as kStep instructions.
inline constexpr int kScheduleFormatVersion = 7;

enum class Category : uint8_t { kWeight, kGradient, kOptimizer, kActivation, kTransient };
inline constexpr int kCategories = 5;
const char* name_of(Category c);

// What an allocation holds.
enum class ValueKind : uint8_t {
  kStatic,       // weights, gradient buffers, optimizer states: live for the whole step
  kValue,        // a forward output or block input
  kRecomputed,   // a forward output produced again by a recompute segment
  kGrad,         // gradient of an activation
  kWorkspace,    // scratch of one backward op
  kParamGather,  // ZeRO-3: the block's weights gathered for its forward or backward
  kGradBucket,   // ZeRO-2/3: the block's unsharded gradients before their reduce-scatter
  // FSDP2 (TrainSpec::fsdp; docs/fsdp.md): a unit's flat bf16 all-gather output (on the
  // all-gather copy-in stream), its fp32 reduce-scatter input, and the reduce-scatter's fp32
  // output shard (on the reduce-scatter stream), which becomes the sharded gradient. The unit's
  // unsharded weights are kParamGather, its unsharded bf16 gradients kGradBucket (one per op).
  kAllGatherBuffer,
  kReduceScatterInput,
  kGradShard,
  // FSDP2: the bf16 copy of this rank's shards, the all-gather's input; under the float8
  // all-gather (TrainSpec::fp8_all_gather) also each float8 weight's pre-all-gather cast (an
  // instruction per step, its op the linear's), its temporaries and its float8 shard.
  kAllGatherInput,
};
// The CUDA stream a tensor of this kind is allocated on (the caching allocator's pools are per
// stream): 1 FSDP's all-gather copy-in stream, 2 its reduce-scatter stream, 0 the compute stream.
int16_t stream_of(ValueKind k);
const char* name_of(ValueKind k);

struct ScheduleTensor {
  int64_t bytes = 0;
  int32_t block = -1;   // index into StageProgram::blocks; -1 for static tensors
  int32_t tensor = -1;  // graph tensor index; op index for workspaces; index into static_names
  int32_t mb = -1;      // micro-batch; -1 for static tensors
  Category category = Category::kTransient;
  ValueKind kind = ValueKind::kValue;
};

enum class InstrKind : uint8_t {
  kAlloc,         // allocate static tensors at the start of the step
  kLoad,          // load a micro-batch's token ids or targets
  kForward,       // forward of one op
  kRecompute,     // forward of one op again, inside a recompute segment
  kBackward,      // backward of one op (reads output grads and saved tensors, writes input grads)
  kSend,          // pipeline send (activation forward, gradient backward)
  kRecv,          // pipeline recv
  kGatherParams,  // ZeRO-3 all-gather of a block's weights
  kReduceGrads,   // ZeRO-2/3 reduce-scatter of a block's gradients
  kFree,          // drop a tensor (its last use was the instruction before)
  kOptimizerStep,
  // A further step of the op of the instruction before it (frees aside): a stepped op's
  // (ops.hpp, OpStep) temporaries and results; it reads that instruction's reads again.
  kStep,
};
const char* name_of(InstrKind k);

struct Instr {
  InstrKind kind;
  int32_t block = -1;  // index into StageProgram::blocks
  int32_t op = -1;     // op index in the block graph
  int32_t mb = -1;
  uint32_t begin = 0;  // reads then allocs, in StageProgram::pool
  uint32_t n_reads = 0;
  uint32_t n_allocs = 0;
};

struct StageBlock {
  BlockKind kind;
  int layer = -1;  // global decoder-layer index; -1 for embedding and head
  std::shared_ptr<const BlockGraph> graph;
  BlockPolicy policy;
  SavedSet saved;
  int chunk = 0;  // the stage's model chunk holding it (interleaved schedule; else 0)
};

struct StageProgram {
  int stage = 0;
  std::vector<StageBlock> blocks;  // forward order
  std::vector<std::string> static_names;
  std::vector<ScheduleTensor> tensors;
  std::vector<Instr> instrs;
  std::vector<int32_t> pool;

  std::span<const int32_t> reads(const Instr& i) const {
    return {pool.data() + i.begin, i.n_reads};
  }
  std::span<const int32_t> allocs(const Instr& i) const {
    return {pool.data() + i.begin + i.n_reads, i.n_allocs};
  }
  std::string tensor_name(int32_t id) const;     // e.g. "L12/mb3/attn.qkv", "grad:L12/mb3/x"
  std::string instr_name(const Instr& i) const;  // e.g. "backward L12/mb0 attn.core"
  int first_layer() const;
  int num_layers() const;
  std::vector<int> layers() const;  // global decoder-layer indices, block order
};

struct Schedule {
  ModelSpec model;
  TrainSpec setup;
  std::vector<StageProgram> stages;  // one per pipeline stage
};

// One pass of a micro-batch through one of a stage's model chunks (its only chunk, 0, unless the
// schedule is interleaved).
struct PipelinePass {
  bool forward = true;
  int mb = 0;
  int chunk = 0;  // local chunk: the stage's chunk v is the model's chunk v x pp + stage
  bool operator==(const PipelinePass&) const = default;
};
// The order of forward and backward passes on one stage. Interleaved (v chunks per stage, m a
// multiple of pp): Megatron's order; forward k runs micro-batch (k / (pp v)) pp + k mod pp on
// chunk (k mod pp v) / pp, backward k the same micro-batch on chunk v - 1 - (k mod pp v) / pp;
// stage s warms up with 2 (pp - s - 1) + (v - 1) pp forwards (at most all m v), then alternates
// forward and backward (Megatron-LM 23e00ed, megatron/core/pipeline_parallel/schedules.py,
// get_pp_rank_microbatches, L718-747, with microbatch_group_size_per_vp_stage = pp, its default;
// Megatron before mid-2024 warmed every forward up when m = pp, and no longer does).
std::vector<PipelinePass> pipeline_order(PpSchedule s, int64_t stage, int64_t pp, int64_t m,
                                         int64_t v = 1);
// Micro-batches whose activations are alive at once on a stage: 1F1B min(m, pp - stage), AFAB m;
// interleaved, the chunk passes alive at once over v, rounded up (whole-stage micro-batches, as
// reports show it; the stage solver takes each chunk's count at each step, chunk_loads).
int64_t in_flight(PpSchedule s, int64_t stage, int64_t pp, int64_t m, int64_t v = 1);
// The most chunk passes alive at once on a stage: m v under AFAB, interleaved
// min(m v, 2 (pp - s - 1) + (v - 1) pp + 1) (Korthikanti et al. 2022, section 4.2: on the first
// stage pp v + pp - 1 chunks of L / (pp v) layers, the activations of L (1 + (pp - 1) / (pp v))
// layers).
int64_t chunk_passes_in_flight(PpSchedule s, int64_t stage, int64_t pp, int64_t m, int64_t v = 1);

// The chunk passes alive on a stage at a step of its schedule that may set its peak: per local
// chunk, the passes whose forward has begun and whose backward has not ended, and the chunk whose
// pass runs then. A step's memory is linear in these counts (each chunk's kept bytes times its
// count, plus the running pass's transient), so a step is left out when another with the same
// running chunk has at least its counts, or when its counts lie at or under a segment between two
// others' (its peak is at most the larger of theirs). AFAB and 1F1B: the one step {in_flight}.
struct ChunkLoad {
  std::vector<int64_t> alive;  // per local chunk
  int running = 0;
  bool operator==(const ChunkLoad&) const = default;
};
std::vector<ChunkLoad> chunk_loads(PpSchedule s, int64_t stage, int64_t pp, int64_t m,
                                   int64_t v = 1);

// The setup whose schedule has the same per-stage memory peaks with fewer micro-batches: under
// 1F1B every micro-batch past pp + 1 repeats the steady state, so m is capped there; interleaved,
// at 2 pp: each step of a longer order has at most the passes of every chunk alive that some
// step within 2 pp micro-batches has, with the same chunk running (the steady state repeats with
// a period of pp v passes; tested for 3 and 4 pp, so any per-chunk plan peaks alike), and the
// schedules' simulated peaks agree (tested against 3, 4 and 6 pp).
TrainSpec simulation_setup(const TrainSpec& t);

// The layer count of each stage: the setup's stage_layers when given, else the contiguous
// partition balancing forward + backward FLOPs per stage (embedding on the first stage, head on
// the last). Interleaved: the sum of the stage's chunks.
std::vector<int64_t> partition_layers(const ModelSpec& m, const TrainSpec& t);
// The layer count of each of the model's pp x v chunks (chunk j on stage j mod pp), balanced by
// FLOPs as above (the embedding in chunk 0, the head in the last); partition_layers when v = 1.
std::vector<int64_t> chunk_layers(const ModelSpec& m, const TrainSpec& t);
// The global decoder-layer indices each stage holds, in its forward (block) order.
std::vector<std::vector<int>> stage_layer_lists(const ModelSpec& m, const TrainSpec& t);

// The static bytes (weights, gradient buffers, optimizer states) of a stage holding a given
// number of decoder layers, as its program allocates them; for partition searches.
class StageStatics {
 public:
  StageStatics(const ModelSpec& m, const TrainSpec& t);
  int64_t operator()(int stage, int layers) const;  // layers 0 .. layers - 1 (one kind of layer)
  int64_t operator()(int stage, const std::vector<int>& layers) const;  // these decoder layers
  // ZeRO's transient bytes per block kind on a stage, live through the block's backward: its
  // gathered bf16 weights (ZeRO-3) plus its unsharded gradient bucket (ZeRO-2/3), sized as the
  // program allocates them (0 for a block the stage does not hold).
  struct ZeroTransients {
    int64_t embedding = 0, layer = 0, head = 0;
    int64_t dense_layer = 0;  // a mixed model's dense layer (ModelSpec::dense_layers)
  };
  ZeroTransients zero_transients(int stage) const;

 private:
  ModelSpec m_;
  TrainSpec t_;
  std::shared_ptr<const BlockGraph> emb_, layer_, head_, dense_;
};

// Policies chosen block by block (the auto planner's plan): one per decoder layer, by global
// index; the embedding's and the head's when chosen too (else the setup's named policy).
struct BlockPolicies {
  std::vector<BlockPolicy> layers;
  std::optional<BlockPolicy> embedding, head;
};

// Builds every stage's program. Blocks take their policy from `policies` when given, else the
// setup's named policy. The setup must be valid.
// `peak_only`: under 1F1B, stage s replays only min(m, pp - s) micro-batches, its in-flight count
// (its warm-up and the first steady-state pair, with as many micro-batches alive as ever; its
// peak repeats after that). The stages then no longer exchange the same micro-batches, so such a
// schedule is for simulation only, never for an executor.
// `keep`: a schedule of the same model and setup whose stages `changed` does not mark are taken
// as they are (their policies unchanged); only the marked ones are built again.
Schedule build_schedule(const ModelSpec& m, const TrainSpec& t,
                        const BlockPolicies* policies = nullptr, bool peak_only = false,
                        const Schedule* keep = nullptr, const std::vector<bool>* changed = nullptr);

}  // namespace np

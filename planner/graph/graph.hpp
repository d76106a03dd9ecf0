// The per-rank DAG of one block (embedding, decoder layer, or final norm + LM head + loss) with
// TP/SP sharding already applied. Ops are stored in topological order; check_graph proves it.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "planner/graph/ops.hpp"
#include "planner/inputs/result.hpp"
#include "planner/inputs/spec.hpp"

namespace np {

enum class BlockKind { kEmbedding, kLayer, kHead };
const char* name_of(BlockKind kind);

struct GraphTensor {
  std::string name;
  TensorType type;
  int producer = -1;           // op index; -1 for block inputs
  std::vector<int> consumers;  // op indices, in order
};

struct GraphOp {
  OpKind kind;
  std::string name;  // e.g. "attn.qkv"
  OpAttrs attrs;
  std::vector<int> inputs;   // tensor indices
  std::vector<int> outputs;  // tensor indices
  std::vector<WeightShape> weights;
  bool expert_weights = false;  // weights sharded over ep instead of replicated over dp
  bool attention_core = false;  // Megatron's selective recompute re-runs these ops
  // Multi-token prediction (build_head): the depth whose module the op is in (1, 2, ...; 0: the
  // main model's), and whether it is in the part Megatron checkpoints under full recompute.
  int mtp_depth = 0;
  bool mtp_checkpointed = false;
  std::string
      fwd_collective;  // collective this op runs in forward ("all_gather", "all_to_all", ...)
  std::string
      bwd_collective;  // collective in its backward ("reduce_scatter", "all_reduce" for TP's f)
  bool tp_partial_weight_grads = false;  // replicated weights: all-reduce their grads over TP
  double flops = 0;                      // forward
  double bwd_flops = 0;
};

struct BlockGraph {
  BlockKind kind = BlockKind::kLayer;
  std::vector<GraphTensor> tensors;
  std::vector<GraphOp> ops;  // topological order
  std::vector<int> inputs;   // block inputs (hidden states, token ids, targets)
  int hidden_in = -1;        // residual stream entering the block (-1: none)
  int hidden_out = -1;       // residual stream leaving the block (-1: none)

  int64_t weight_elements(bool expert) const;
  double forward_flops() const;
  double backward_flops() const;
};

// The three kinds of block for one rank of the setup.
BlockGraph build_embedding(const ModelSpec& m, const TrainSpec& t);
BlockGraph build_layer(const ModelSpec& m, const TrainSpec& t);
// The head: the final norm, then (with multi-token prediction, mtp_depths > 0) each depth k as
// Megatron's MultiTokenPredictionLayer builds it (Megatron-LM d98e8a6, megatron/core/transformer/
// multi_token_prediction.py): the embedding (the embedding's weights) of the next tokens, its norm
// and a norm of the previous depth's output (the main model's normed hidden states for k = 1),
// their concatenation through eh_proj (column-parallel, its features gathered, then scattered to
// the sequence shard under SP), one decoder layer, a final norm, and the LM head (its weights) and
// loss weighted mtp_loss_scale / depths; then the LM head and loss of the main model.
BlockGraph build_head(const ModelSpec& m, const TrainSpec& t);
// Models whose decoder layers are of two kinds (ModelSpec::dense_layers): build_layer is the MoE
// layer and build_dense_layer the dense one, the same layer with the dense MLP of width ffn.
bool mixed_layers(const ModelSpec& m);
bool dense_layer(const ModelSpec& m, int64_t layer);  // a dense layer of a mixed model
BlockGraph build_dense_layer(const ModelSpec& m, const TrainSpec& t);
// Every setup field build_layer reads, as a string: two setups of one model with the same key
// build the same layer (the auto planner's frontier cache is keyed on it). Kept beside
// build_layer so that the two cannot drift apart.
std::string layer_graph_key(const TrainSpec& t);

// The block graphs of one setup, built once and shared by every block of that kind; dense_layer
// only for a mixed model.
struct BlockGraphs {
  BlockGraphs(const ModelSpec& m, const TrainSpec& t);
  std::shared_ptr<const BlockGraph> embedding, layer, head, dense_layer;
  std::vector<int64_t> dense_layers;  // the model's
  // The graph of a block: decoder layer `layer`'s for kLayer.
  const std::shared_ptr<const BlockGraph>& of(BlockKind kind, int64_t layer = -1) const;
};

// Graph invariants: a DAG (Boost.Graph topological sort), ops stored in topological order, each
// tensor produced once, op arities and shapes consistent with the op table.
std::optional<Error> check_graph(const BlockGraph& g);

// Whether each op's backward runs: an output of it carries a gradient from the block's output (or
// it has no gradient outputs at all: the loss). The schedule, the cost model and the option
// evaluation all use this rule.
std::vector<bool> backward_runs(const BlockGraph& g);
// Per tensor: some op's backward reads it (the op table's bwd_reads bits).
std::vector<bool> backward_reads(const BlockGraph& g);

// torchtitan's name of a decoder layer's or the head's op, less the "layers.N." prefix (attn.wq:
// attention.wq, mlp.w1: feed_forward.w1, lm_head: output).
std::string torchtitan_fqn(const std::string& name);

// Exact parameter count of the model: the blocks built at tp = pp = dp = ep = 1, tied weights
// once, without the multi-token prediction modules.
int64_t count_parameters(const ModelSpec& m);
// The weights that `depths` multi-token prediction modules add (the embedding and the LM head they
// use are the model's).
int64_t mtp_parameters(const ModelSpec& m, int64_t depths);

}  // namespace np

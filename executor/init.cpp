// Global-index mapping of sharded weights (embedding rows, column sections, row columns, experts)
// and the counter-based initial values.
#include "executor/init.hpp"

#include <cmath>

#include "executor/backend.hpp"

namespace np::exec {
namespace {

uint64_t hash_string(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Column-parallel row i of this rank -> global row, through the fused sections.
int64_t column_row(const OpAttrs& a, int64_t i, int64_t tp, int64_t tp_rank) {
  std::vector<int64_t> sections =
      a.sections.empty() ? std::vector<int64_t>{a.features} : a.sections;
  int64_t local_base = 0, global_base = 0;
  for (int64_t w : sections) {
    if (i < local_base + w) return global_base + tp_rank * w + (i - local_base);
    local_base += w;
    global_base += w * tp;
  }
  return -1;
}

}  // namespace

std::string weight_key(const StageBlock& block, const GraphOp& op, size_t w) {
  std::string suffix = op.weights.at(w).suffix;
  if (!op.attrs.tie.empty()) return op.attrs.tie + "." + suffix;  // one key for every holder
  std::string prefix =
      block.kind == BlockKind::kLayer ? "L" + std::to_string(block.layer) + "/" : "";
  return prefix + op.name + "." + suffix;
}

int64_t global_weight_index(const GraphOp& op, size_t w, int64_t i, const RankShards& at) {
  const WeightShape& ws = op.weights.at(w);
  const std::vector<int64_t>& shape = ws.shape;
  const int64_t tp = at.tp, tp_rank = at.tp_rank;
  // Experts: the rank's local experts follow those of the EP ranks before it.
  const int64_t expert_base = at.ep_rank * (shape.size() == 3 ? shape[0] : 0);
  switch (weight_shard(op.kind, ws.suffix)) {
    case Shard::kReplicated:
      return i;
    case Shard::kRows: {
      int64_t h = shape[1];
      return (tp_rank * shape[0] + i / h) * h + i % h;
    }
    case Shard::kSectionRows: {
      if (shape.size() == 1) return column_row(op.attrs, i, tp, tp_rank);  // the bias
      int64_t in = shape[1];
      return column_row(op.attrs, i / in, tp, tp_rank) * in + i % in;
    }
    case Shard::kColumns: {
      int64_t in = shape[1];
      return (i / in) * in * tp + tp_rank * in + i % in;
    }
    case Shard::kExpertSectionRows: {
      int64_t rows = shape[1], in = shape[2], e = expert_base + i / (rows * in),
              r = (i / in) % rows;
      return (e * rows * tp + column_row(op.attrs, r, tp, tp_rank)) * in + i % in;
    }
    case Shard::kExpertColumns: {
      int64_t rows = shape[1], in = shape[2], e = expert_base + i / (rows * in),
              r = (i / in) % rows;
      return (e * rows + r) * in * tp + tp_rank * in + i % in;
    }
  }
  return i;
}

void init_weight(const Tensor& t, const StageBlock& block, const GraphOp& op, size_t w,
                 const RankShards& at, uint64_t seed) {
  bool norm = is_norm(op.kind);
  bool bias = std::string(op.weights.at(w).suffix) == "bias";
  if (norm) {
    for (int64_t i = 0; i < t.numel(); ++i) store(t, i, bias ? 0.0f : 1.0f);
    return;
  }
  uint64_t stream = hash_string(weight_key(block, op, w));
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint64_t g = static_cast<uint64_t>(global_weight_index(op, w, i, at));
    float u1 = counter_uniform(seed, stream, 2 * g) + 1e-7f,
          u2 = counter_uniform(seed, stream, 2 * g + 1);
    float normal = std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
    store(t, i, 0.02f * normal);
  }
}

void fill_tokens(const Tensor& t, const std::string& which, int mb, int64_t vocab, uint64_t seed) {
  uint64_t stream = hash_string(which);
  int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    float u = counter_uniform(seed, stream, static_cast<uint64_t>(mb * n + i));
    t.as<int64_t>()[i] =
        std::min<int64_t>(vocab - 1, static_cast<int64_t>(u * static_cast<float>(vocab)));
  }
}

}  // namespace np::exec

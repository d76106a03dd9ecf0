// Builds the per-stage programs: static allocations, the pipeline order of micro-batch passes,
// forward / recompute / backward instructions per op, and frees at each tensor's last use.
#include "planner/schedule/schedule.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>
#include <unordered_map>

#include "planner/schedule/contract.hpp"
#include "planner/schedule/parallel.hpp"

namespace np {

const char* name_of(Category c) {
  constexpr const char* k[] = {"weights", "gradients", "optimizer", "activations", "transient"};
  return k[static_cast<int>(c)];
}
const char* name_of(ValueKind k) {
  constexpr const char* n[] = {"static",           "value",        "recomputed",
                               "grad",             "workspace",    "param_gather",
                               "grad_bucket",      "all_gather_buffer", "reduce_scatter_input",
                               "grad_shard",       "all_gather_input"};
  return n[static_cast<int>(k)];
}
// PyTorch 2.10, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py: foreach_all_gather
// allocates the flat output under `with torch.cuda.stream(all_gather_copy_in_stream)`;
// foreach_reduce allocates the reduce-scatter output under the reduce_scatter_stream (its input
// on the current stream).
int16_t stream_of(ValueKind k) {
  return k == ValueKind::kAllGatherBuffer || k == ValueKind::kAllGatherInput ? 1
         : k == ValueKind::kGradShard                                        ? 2
                                                                             : 0;
}
const char* name_of(InstrKind k) {
  constexpr const char* n[] = {"alloc",        "load", "forward",       "recompute",
                               "backward",     "send", "recv",          "gather_params",
                               "reduce_grads", "free", "optimizer_step", "step"};
  return n[static_cast<int>(k)];
}

std::vector<PipelinePass> pipeline_order(PpSchedule s, int64_t stage, int64_t pp, int64_t m,
                                         int64_t v) {
  std::vector<PipelinePass> order;
  if (s != PpSchedule::kInterleaved) v = 1;
  const int64_t total = m * v, group = pp * v;
  auto pass = [&](bool forward, int64_t k) {
    int64_t c = k % group / pp;
    return PipelinePass{forward, static_cast<int>(k / group * pp + k % pp),
                        static_cast<int>(forward ? c : v - 1 - c)};
  };
  int64_t warmup = s == PpSchedule::kAfab ? m
                   : s == PpSchedule::k1F1B
                       ? std::min(pp - stage - 1, m)
                       : std::min(total, 2 * (pp - stage - 1) + (v - 1) * pp);
  int64_t next_f = 0, next_b = 0;
  for (; next_f < warmup; ++next_f) order.push_back(pass(true, next_f));
  while (next_f < total) {
    order.push_back(pass(true, next_f++));
    order.push_back(pass(false, next_b++));
  }
  while (next_b < total) order.push_back(pass(false, next_b++));
  return order;
}

int64_t chunk_passes_in_flight(PpSchedule s, int64_t stage, int64_t pp, int64_t m, int64_t v) {
  if (s != PpSchedule::kInterleaved) return in_flight(s, stage, pp, m);
  // The warm-up's forwards and the first steady-state one.
  return std::min(m * v, 2 * (pp - stage - 1) + (v - 1) * pp + 1);
}

int64_t in_flight(PpSchedule s, int64_t stage, int64_t pp, int64_t m, int64_t v) {
  if (s == PpSchedule::kInterleaved)
    return (chunk_passes_in_flight(s, stage, pp, m, v) + v - 1) / v;
  return s == PpSchedule::kAfab ? m : std::min(m, pp - stage);
}

namespace {

// Whether `x` is at or under a point of the segment between a and b (every component).
bool under_segment(const std::vector<int64_t>& x, const std::vector<int64_t>& a,
                   const std::vector<int64_t>& b) {
  // x_c <= b_c + l (a_c - b_c) for some l in [0, 1]: each component bounds l from one side.
  double lo = 0, hi = 1;
  for (size_t c = 0; c < x.size(); ++c) {
    double slope = static_cast<double>(a[c] - b[c]), need = static_cast<double>(x[c] - b[c]);
    if (slope > 0)
      lo = std::max(lo, need / slope);
    else if (slope < 0)
      hi = std::min(hi, need / slope);
    else if (need > 0)
      return false;
  }
  return lo <= hi + 1e-12;
}

}  // namespace

std::vector<ChunkLoad> chunk_loads(PpSchedule s, int64_t stage, int64_t pp, int64_t m, int64_t v) {
  if (s != PpSchedule::kInterleaved) return {{{in_flight(s, stage, pp, m)}, 0}};
  std::vector<ChunkLoad> steps;
  std::vector<int64_t> alive(v, 0);
  for (PipelinePass p : pipeline_order(s, stage, pp, m, v)) {
    if (p.forward) ++alive[p.chunk];
    steps.push_back({alive, p.chunk});
    if (!p.forward) --alive[p.chunk];
  }
  std::sort(steps.begin(), steps.end(), [](const ChunkLoad& a, const ChunkLoad& b) {
    return std::tie(a.running, a.alive) < std::tie(b.running, b.alive);
  });
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  // One at a time, against the steps still kept (each left out is bounded by those that stay).
  for (size_t i = steps.size(); i-- > 0;) {
    bool redundant = false;
    for (size_t a = 0; a < steps.size() && !redundant; ++a) {
      if (a == i || steps[a].running != steps[i].running) continue;
      for (size_t b = a; b < steps.size() && !redundant; ++b)
        redundant = b != i && steps[b].running == steps[i].running &&
                    under_segment(steps[i].alive, steps[a].alive, steps[b].alive);
    }
    if (redundant) steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return steps;
}

TrainSpec simulation_setup(const TrainSpec& t) {
  TrainSpec s = t;
  if (t.pp_schedule == PpSchedule::k1F1B) s.microbatches = std::min(t.microbatches, t.pp + 1);
  if (t.pp_schedule == PpSchedule::kInterleaved)
    s.microbatches = std::min(t.microbatches, 2 * t.pp);
  return s;
}


namespace {
// The contiguous split of the layers into P parts balancing FLOPs (embedding in the first part,
// head in the last).
std::vector<int64_t> balanced_split(const ModelSpec& m, const TrainSpec& t, int64_t P) {
  BlockGraph layer = build_layer(m, t), emb = build_embedding(m, t), head = build_head(m, t);
  double c = layer.forward_flops() + layer.backward_flops();
  double first = emb.forward_flops() + emb.backward_flops();
  double last = head.forward_flops() + head.backward_flops();
  int64_t L = m.layers;
  auto extra = [&](int64_t s) { return (s == 0 ? first : 0.0) + (s == P - 1 ? last : 0.0); };
  auto capacity = [&](int64_t s, double bound) {
    return std::max<int64_t>(0, static_cast<int64_t>((bound - extra(s)) / c + 1e-9));
  };
  auto feasible = [&](double bound) {
    int64_t total = 0;
    for (int64_t s = 0; s < P; ++s) {
      if (capacity(s, bound) < 1) return false;
      total += std::min(capacity(s, bound), L);
    }
    return total >= L;
  };
  // The smallest bound on a stage's load (n layers plus its extras) that fits all layers, then
  // stages filled front to back up to it.
  std::vector<double> bounds;
  for (int64_t n = 1; n <= L; ++n)
    for (int64_t s : {int64_t{0}, P - 1, std::min<int64_t>(1, P - 1)})
      bounds.push_back(n * c + extra(s));
  std::sort(bounds.begin(), bounds.end());
  double bound = bounds.back();
  for (double b : bounds)
    if (feasible(b)) {
      bound = b;
      break;
    }
  // Every stage takes what the bound allows; the surplus comes off the most loaded stages (the
  // earliest first: under 1F1B they hold the most micro-batches), so the counts stay even.
  std::vector<int64_t> counts(P);
  int64_t surplus = -L;
  for (int64_t s = 0; s < P; ++s) surplus += counts[s] = std::min(capacity(s, bound), L);
  while (surplus-- > 0) {
    int64_t worst = -1;
    for (int64_t s = 0; s < P; ++s)
      if (counts[s] > 1 &&
          (worst < 0 || counts[s] * c + extra(s) > counts[worst] * c + extra(worst) + 1e-9))
        worst = s;
    --counts[worst];
  }
  return counts;
}

}  // namespace

std::vector<int64_t> chunk_layers(const ModelSpec& m, const TrainSpec& t) {
  if (t.pp_schedule != PpSchedule::kInterleaved || t.virtual_stages == 1)
    return partition_layers(m, t);
  return balanced_split(m, t, t.pp * t.virtual_stages);
}

std::vector<int64_t> partition_layers(const ModelSpec& m, const TrainSpec& t) {
  if (!t.stage_layers.empty()) return t.stage_layers;
  if (t.pp_schedule != PpSchedule::kInterleaved || t.virtual_stages == 1)
    return balanced_split(m, t, t.pp);
  std::vector<int64_t> chunks = chunk_layers(m, t), counts(t.pp, 0);
  for (size_t j = 0; j < chunks.size(); ++j) counts[j % t.pp] += chunks[j];
  return counts;
}

std::vector<std::vector<int>> stage_layer_lists(const ModelSpec& m, const TrainSpec& t) {
  std::vector<int64_t> chunks = chunk_layers(m, t);
  std::vector<std::vector<int>> out(t.pp);
  int first = 0;
  for (size_t j = 0; j < chunks.size(); ++j)
    for (int64_t l = 0; l < chunks[j]; ++l) out[j % t.pp].push_back(first++);
  return out;
}

namespace {

class ProgramBuilder {
 public:
  // `layers`: the stage's decoder layers by local chunk (one chunk unless interleaved).
  ProgramBuilder(const ModelSpec& m, const TrainSpec& t, int stage,
                 const std::vector<std::vector<int>>& layers, std::shared_ptr<const BlockGraph> emb,
                 std::shared_ptr<const BlockGraph> layer, std::shared_ptr<const BlockGraph> head,
                 const BlockPolicies* policies, int64_t microbatches,
                 std::shared_ptr<const BlockGraph> dense = nullptr)
      : m_(m), t_(t), policies_(policies), microbatches_(microbatches) {
    p_.stage = stage;
    const int chunks = static_cast<int>(layers.size());
    for (int c = 0; c < chunks; ++c) {
      chunk_begin_.push_back(static_cast<int>(p_.blocks.size()));
      if (stage == 0 && c == 0) add_block(BlockKind::kEmbedding, -1, emb, c);
      for (int l : layers[c])  // a mixed model's dense layers take the dense graph
        add_block(BlockKind::kLayer, l, dense && dense_layer(m, l) ? dense : layer, c);
      if (stage == t.pp - 1 && c == chunks - 1) add_block(BlockKind::kHead, -1, head, c);
    }
    chunk_begin_.push_back(static_cast<int>(p_.blocks.size()));
  }

  // The stage's static bytes alone (weights, gradient buffers, optimizer states).
  int64_t static_bytes() {
    emit_statics();
    int64_t n = 0;
    for (const ScheduleTensor& x : p_.tensors) n += x.bytes;
    // FSDP, for the solver (the program allocates these where they come): the gathered weights
    // kept from forward to backward, all live at the turn; and with more than one micro-batch
    // the fp32 gradient shards, made by the first micro-batch's backward and held to the
    // optimizer step, so live through every later forward. With one micro-batch a unit's shard
    // comes after its activations are freed; the simulation checks the plan.
    // Under PP the unsharded fp32 gradients accumulated over the micro-batches, from the first
    // backward to the step's reduce-scatters, count too (and the gradient shards, made after the
    // last backward, do not).
    if (t_.fsdp)
      for (size_t b = 0; b < p_.blocks.size(); ++b)
        n += (t_.microbatches > 1 && t_.pp == 1 ? fsdp_numel_[b] / t_.fsdp_shards() * 4 : 0) +
             (fsdp_holds(b) ? fsdp_gathered_[b] + fsdp_scale_bytes(b) : 0) +
             (t_.pp > 1 ? block_weight_bytes_[b] * 2 : 0);
    return n;
  }

  // ZeRO's transient bytes of the first block of each kind (what its backward holds).
  StageStatics::ZeroTransients zero_transients() {
    emit_statics();
    StageStatics::ZeroTransients z;
    // FSDP: a layer's neighbours in the backward, the unit after it (whose reduce-scatter input
    // is live) and the one before (whose all-gather is prefetched), are bounded by the largest
    // of the stage's layers and its head or embedding: one bound for every layer, tight at the
    // last layer's backward, where the peak usually is.
    // Per kind: the most elements of a unit, and the most bytes it gathers.
    int64_t layer = 0, emb = 0, head = 0, layer_g = 0, emb_g = 0, head_g = 0;
    for (size_t b = 0; b < p_.blocks.size(); ++b) {
      const BlockKind k = p_.blocks[b].kind;
      int64_t& n = k == BlockKind::kLayer ? layer : k == BlockKind::kEmbedding ? emb : head;
      int64_t& g = k == BlockKind::kLayer ? layer_g : k == BlockKind::kEmbedding ? emb_g : head_g;
      n = std::max(n, fsdp_numel_[b]);
      g = std::max(g, fsdp_gathered_[b]);
    }
    for (size_t b = p_.blocks.size(); b-- > 0;) {
      BlockKind k = p_.blocks[b].kind;
      bool dense = k == BlockKind::kLayer && dense_layer(m_, p_.blocks[b].layer);
      int64_t before = k == BlockKind::kEmbedding ? 0 : k == BlockKind::kHead ? layer_g
                                                                             : std::max(layer_g, emb_g);
      int64_t after = k == BlockKind::kHead ? 0 : k == BlockKind::kEmbedding ? layer
                                                                            : std::max(layer, head);
      (k == BlockKind::kEmbedding ? z.embedding
       : k == BlockKind::kHead    ? z.head
       : dense                    ? z.dense_layer
                                  : z.layer) =
          t_.fsdp ? fsdp_backward_bytes(b, before, after) : gather_bytes(b) + bucket_bytes(b);
    }
    return z;
  }

  StageProgram build() {
    emit_statics();
    // One slot per graph tensor of every block, per micro-batch in flight.
    value_offset_.assign(1, 0);
    for (const StageBlock& b : p_.blocks)
      value_offset_.push_back(value_offset_.back() + static_cast<int32_t>(b.graph->tensors.size()));
    values_.assign(static_cast<size_t>(microbatches_) * value_offset_.back(), -1);
    // Room for every micro-batch's forward, recompute and backward of each op up front (a hint:
    // growing these vectors by doubling was a tenth of a large plan's time).
    size_t ops = 0;
    for (const StageBlock& b : p_.blocks) ops += b.graph->ops.size();
    size_t per_step = static_cast<size_t>(microbatches_) * ops;
    p_.instrs.reserve(p_.instrs.size() + 3 * per_step + 16);
    p_.tensors.reserve(p_.tensors.size() + static_cast<size_t>(microbatches_) * 2 *
                                               static_cast<size_t>(value_offset_.back()));
    p_.pool.reserve(p_.pool.size() + 8 * per_step);
    fsdp_params_.assign(static_cast<size_t>(microbatches_) * p_.blocks.size(), -1);
    fsdp_grad_shards_.assign(p_.blocks.size(), -1);
    fsdp_unit_params_.assign(p_.blocks.size(), -1);
    fsdp_accumulated_.assign(p_.blocks.size(), -1);
    for (PipelinePass pass :
         pipeline_order(t_.pp_schedule, p_.stage, t_.pp, microbatches_, t_.virtual_stages))
      pass.forward ? forward_pass(pass.mb, pass.chunk) : backward_pass(pass.mb, pass.chunk);
    // FSDP under PP: after the last backward the stage reduces every unit's accumulated
    // gradients, in module order (PyTorch 2.10, torch/distributed/pipelining/stage.py
    // perform_reduce_grad: each FSDP state's post_backward with gradient sync on, then the
    // root's final callback).
    if (t_.fsdp && t_.pp > 1)
      for (int b = 0; b < static_cast<int>(p_.blocks.size()); ++b)
        fsdp_reduce(b, 0, fsdp_unit_params_[static_cast<size_t>(b)],
                    {fsdp_accumulated_[static_cast<size_t>(b)]},
                    b + 1 == static_cast<int>(p_.blocks.size()));
    begin(InstrKind::kOptimizerStep);
    for (int32_t id = 0; id < static_cast<int32_t>(p_.tensors.size()); ++id)
      if (p_.tensors[id].kind == ValueKind::kStatic) read(id);
    for (int32_t id : fsdp_grad_shards_)  // FSDP's gradient shards: stepped, then set to None
      if (id >= 0) read(id);
    insert_frees();
    return std::move(p_);
  }

 private:
  void add_block(BlockKind kind, int layer, std::shared_ptr<const BlockGraph> g, int chunk) {
    if (statics_only()) {  // the static bytes need the blocks' weights only
      p_.blocks.push_back({kind, layer, g, {}, {}, chunk});
      return;
    }
    StageBlock b{kind, layer, g, named_policy(*g, t_), {}, chunk};
    // --recompute-every: torchtitan's counter runs over the layers each rank builds, its model
    // chunks in order (a process-global count, activation_checkpoint.py _apply_layer_sac): the
    // stage's n-th layer (1-based) is checkpointed when n mod N = 0; without PP, layer l is.
    if (kind == BlockKind::kLayer) ++stage_layers_seen_;
    if (kind == BlockKind::kLayer && t_.recompute == Recompute::kFull &&
        stage_layers_seen_ % t_.recompute_every != 0) {
      TrainSpec none = t_;
      none.recompute = Recompute::kNone;
      b.policy = named_policy(*g, none);
    }
    if (policies_ && kind == BlockKind::kLayer) b.policy = policies_->layers.at(layer);
    if (policies_ && kind == BlockKind::kEmbedding && policies_->embedding)
      b.policy = *policies_->embedding;
    if (policies_ && kind == BlockKind::kHead && policies_->head) b.policy = *policies_->head;
    b.saved = saved_set(*g, b.policy);
    p_.blocks.push_back(std::move(b));
  }

  int32_t new_tensor(int64_t bytes, int32_t block, int32_t tensor, int32_t mb, Category c,
                     ValueKind k) {
    p_.tensors.push_back({bytes, block, tensor, mb, c, k});
    return static_cast<int32_t>(p_.tensors.size()) - 1;
  }
  int32_t new_static(std::string name, int64_t bytes, Category c) {
    p_.static_names.push_back(std::move(name));
    int32_t id = new_tensor(bytes, -1, static_cast<int32_t>(p_.static_names.size()) - 1, -1, c,
                            ValueKind::kStatic);
    alloc(id);
    return id;
  }

  // Instructions are built in order: begin(), then reads, then allocs.
  void begin(InstrKind k, int32_t block = -1, int32_t op = -1, int32_t mb = -1) {
    p_.instrs.push_back({k, block, op, mb, static_cast<uint32_t>(p_.pool.size()), 0, 0});
  }
  void read(int32_t id) {
    Instr& i = p_.instrs.back();
    p_.pool.insert(p_.pool.begin() + i.begin + i.n_reads, id);
    ++i.n_reads;
  }
  void alloc(int32_t id) {
    p_.pool.push_back(id);
    ++p_.instrs.back().n_allocs;
  }

  static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

  void emit_statics();
  void forward_pass(int mb, int chunk);
  void backward_pass(int mb, int chunk);
  int32_t forward_block(int b, int mb, int32_t x);
  int32_t backward_block(int b, int mb, int32_t grad_out);
  void run_ops_forward(int b, int mb, InstrKind kind, bool only_recomputed);
  int32_t gather_params(int b, int mb);
  int32_t fsdp_unshard(int b, int mb, bool forward);
  int32_t fsdp_all_gather(int b, int mb);
  void fsdp_reduce(int b, int mb, int32_t params, const std::vector<int32_t>& grads, bool last);
  void fsdp_accumulate(int b, int mb, const std::vector<int32_t>& grads);
  void insert_frees();

  // The instances of block b's graph tensors for micro-batch mb (-1: none yet).
  std::span<int32_t> values(int b, int mb) {
    return {values_.data() + static_cast<size_t>(mb) * value_offset_.back() + value_offset_[b],
            static_cast<size_t>(value_offset_[b + 1] - value_offset_[b])};
  }

  // A per-op table of block b's graph, forward or backward (`make` of the op's info, attrs and
  // input types), computed once per graph.
  template <typename T, typename F>
  const std::vector<T>& per_op(std::vector<std::pair<std::pair<const BlockGraph*, bool>,
                                                     std::vector<T>>>& cache,
                               int b, bool forward, F make) {
    const BlockGraph* g = p_.blocks[b].graph.get();
    for (auto& [key, table] : cache)
      if (key.first == g && key.second == forward) return table;
    std::vector<T> table;
    for (const GraphOp& op : g->ops) {
      std::vector<TensorType> in;
      for (int i : op.inputs) in.push_back(g->tensors[i].type);
      table.push_back(make(op_info(op.kind), op.attrs, in));
    }
    cache.emplace_back(std::make_pair(g, forward), std::move(table));
    return cache.back().second;
  }
  // Forward or backward workspace sizes per op, from the op table.
  const std::vector<std::vector<int64_t>>& workspace_bytes(int b, bool forward) {
    return per_op(workspace_cache_, b, forward,
                  [&](const OpInfo& info, const OpAttrs& a, const std::vector<TensorType>& in) {
                    std::vector<int64_t> bytes;
                    for (const TensorType& w :
                         forward ? forward_workspace(info, a, in) : info.bwd_workspace(a, in))
                      bytes.push_back(w.bytes());
                    return bytes;
                  });
  }
  // Forward or backward steps per op (ops.hpp, OpStep).
  const std::vector<std::vector<OpStep>>& steps_of(int b, bool forward) {
    return per_op(steps_cache_, b, forward,
                  [&](const OpInfo& info, const OpAttrs& a, const std::vector<TensorType>& in) {
                    return op_steps(info, a, in, forward);
                  });
  }
  // A stepped op's instructions: step 0 goes on in the instruction begun (its reads made), each
  // further step is a kStep instruction that reads those reads again (so they live to the op's
  // end) and then the earlier temporaries it uses; `results` allocates what a step's
  // OpStep::results names.
  // Under torchtitan's per-op checkpointing (caches_outputs) an op's forward keeps the
  // temporaries of OpStep::sac_kept (as activations, in sac_kept_) and its recompute (or its
  // casts' re-run, when its output is kept) reads them where it would allocate them (the cache
  // returns them), so they die at their last use there.
  // A backward's output gradients (`dropped`) are not read again from a step marked
  // OpStep::drops_grad_outputs on. `results` takes a step's kStep bits and its early outputs.
  template <typename F>
  void emit_steps(int32_t b, int32_t o, int32_t mb, const std::vector<OpStep>& steps, F&& results,
                  InstrKind pass = InstrKind::kBackward, const std::vector<int32_t>& dropped = {}) {
    const Instr first = p_.instrs.back();
    const std::vector<int32_t> op_reads(p_.pool.begin() + first.begin,
                                        p_.pool.begin() + first.begin + first.n_reads);
    bool drop = false;
    std::vector<int32_t> carried;  // outputs made early (OpStep::outputs): live to the op's end
    const StageBlock& blk = p_.blocks[static_cast<size_t>(b)];
    const bool cached = pass != InstrKind::kBackward && caches_outputs(blk.policy);
    std::vector<int32_t> none;
    std::vector<int32_t>& kept = cached ? sac_kept_[{b, mb, o}] : none;
    size_t next_kept = 0;
    std::vector<int32_t> temps;
    for (size_t k = 0; k < steps.size(); ++k) {
      drop = drop || steps[k].drops_grad_outputs;
      if (k > 0) {
        begin(InstrKind::kStep, b, o, mb);
        for (int32_t id : op_reads)
          if (!drop || std::find(dropped.begin(), dropped.end(), id) == dropped.end()) read(id);
        for (int32_t id : carried) read(id);
      }
      for (int r : steps[k].reads) read(temps.at(static_cast<size_t>(r)));
      const OpStep& st = steps[k];
      const size_t base = temps.size();
      auto is_kept = [&](size_t j) {  // temporary j of this step, by its index among the op's
        return cached && std::find(st.sac_kept.begin(), st.sac_kept.end(),
                                   static_cast<int>(base + j)) != st.sac_kept.end();
      };
      temps.resize(base + st.temps.size(), -1);
      if (pass == InstrKind::kRecompute)  // the cache's: read, not allocated
        for (size_t j = 0; j < st.temps.size(); ++j)
          if (is_kept(j)) read(temps[base + j] = kept.at(next_kept++));
      for (size_t j = 0; j < st.temps.size(); ++j) {
        if (temps[base + j] >= 0) continue;
        temps[base + j] = new_tensor(st.temps[j].bytes(), b, o, mb,
                                     is_kept(j) ? Category::kActivation : Category::kTransient,
                                     ValueKind::kWorkspace);
        alloc(temps[base + j]);
        if (is_kept(j)) kept.push_back(temps[base + j]);
      }
      if (st.results || !st.outputs.empty()) results(st.results, st.outputs);
      if (!st.outputs.empty())
        for (int32_t id : p_.allocs(p_.instrs.back()))
          if (p_.tensors[id].kind != ValueKind::kWorkspace) carried.push_back(id);
    }
    if (pass == InstrKind::kRecompute && cached) kept.clear();
  }

  const ModelSpec& m_;
  const TrainSpec& t_;
  const BlockPolicies* policies_;
  const int64_t microbatches_;  // replayed by this stage; 0: the static bytes only (StageStatics)
  bool statics_only() const { return microbatches_ == 0; }
  StageProgram p_;
  std::vector<int> chunk_begin_;  // chunk c's blocks: [chunk_begin_[c], chunk_begin_[c + 1])
  std::vector<int32_t> values_, value_offset_;  // see values()
  std::vector<int32_t> grads_;                  // backward_block's gradient instances
  std::vector<int64_t> block_weight_bytes_;     // per block: this rank's unsharded weight bytes
  // ZeRO-3: block b's bf16 weights, gathered for its forward and again for its backward.
  int64_t gather_bytes(size_t b) const { return t_.zero >= 3 ? block_weight_bytes_[b] : 0; }
  // ZeRO-2/3: block b's unsharded gradients, from its backward to their reduce-scatter.
  int64_t bucket_bytes(size_t b) const {
    return t_.zero >= 2 ? block_weight_bytes_[b] / 2 * dtype_bytes(t_.grad_dtype) : 0;
  }
  std::vector<std::pair<std::pair<const BlockGraph*, bool>, std::vector<std::vector<int64_t>>>>
      workspace_cache_;
  std::vector<std::pair<std::pair<const BlockGraph*, bool>, std::vector<std::vector<OpStep>>>>
      steps_cache_;
  // Per (block, micro-batch, op): the temporaries its forward kept for its recompute (emit_steps).
  std::map<std::tuple<int32_t, int32_t, int32_t>, std::vector<int32_t>> sac_kept_;

  // FSDP2 (TrainSpec::fsdp). Per block (one FSDP unit each): the elements of its weights, each
  // padded on dim 0 to a multiple of the shard group (FSDPParam: padded_sharded_param_size x
  // world size), as its all-gather output, unsharded weights and reduce-scatter input hold them.
  std::vector<int64_t> fsdp_numel_;
  // ... the bytes its all-gather output and unsharded weights hold: 2 per element, 1 for the
  // float8 weights of FSDP's float8 all-gather (their shard elements and linears in
  // fsdp_fp8_, in the unit's parameter order), whose 0-dim fp32 scales live as long.
  std::vector<int64_t> fsdp_gathered_;
  struct Fp8Shard {
    int op;
    int64_t elements;
  };
  std::vector<std::vector<Fp8Shard>> fsdp_fp8_;
  int64_t fsdp_scale_bytes(size_t b) const { return 4 * static_cast<int64_t>(fsdp_fp8_[b].size()); }
  // The float8 scales of an all-gather output, then of the unsharded weights copied from it.
  std::unordered_map<int32_t, std::vector<int32_t>> fsdp_scales_;
  void fsdp_reshard(int32_t params) {
    read(params);
    if (auto it = fsdp_scales_.find(params); it != fsdp_scales_.end())
      for (int32_t id : it->second) read(id);
  }
  // The unit's gathered weights are kept from its forward to its backward: under
  // reshard_after_forward false, and always for the final norm with the output layer (torchtitan
  // 238fa99, torchtitan/models/llama3/infra/parallelize.py apply_fsdp: reshard_after_forward =
  // (policy == "always") for [norm, output]; its backward follows its forward at once).
  // Under PP every unit is gathered once, at its first forward, and kept to the step's reduce
  // (torch.distributed.pipelining's backward_maybe_with_nosync: reshard_after_backward off until
  // the last; torchtitan's "default" reshard policy with PP: off).
  bool fsdp_keeps(size_t b) const {
    return t_.fsdp &&
           (!t_.reshard_after_forward || t_.pp > 1 || p_.blocks[b].kind == BlockKind::kHead);
  }
  // Kept through the whole step's forward-to-backward turn (the solver counts them static): the
  // decoder layers' and the embedding's; the head's forward is followed by its backward.
  bool fsdp_holds(size_t b) const {
    return fsdp_keeps(b) && (p_.blocks[b].kind != BlockKind::kHead || t_.pp > 1);
  }
  // The solver's bound on what unit b holds through its backward besides activations, with its
  // neighbours' units of `before` and `after` elements (docs/fsdp.md, "A unit's backward"): its
  // gathered weights (unless held: counted static), the next unit's prefetched all-gather
  // output, the previous unit's reduce-scatter input, its bf16 gradients; then its own
  // reduce-scatter input. `before` is in gathered bytes, `after` in elements.
  int64_t fsdp_backward_bytes(size_t b, int64_t before, int64_t after) const {
    int64_t n = fsdp_numel_[b];
    if (t_.pp > 1) return block_weight_bytes_[b];  // its bf16 gradients; the reduce comes later
    bool prefetch = t_.reshard_after_forward && before > 0;
    int64_t during = (fsdp_holds(b) ? 0 : fsdp_gathered_[b]) + (prefetch ? before : 0) +
                     4 * after + 2 * n;
    int64_t reducing = (prefetch ? before : 0) + 2 * n + 4 * n;
    return std::max(during, reducing);
  }
  int32_t fsdp_flat_ = -1;       // the forward's last all-gather output, freed at the next unshard
  int32_t fsdp_prefetched_ = -1;  // the backward's prefetched all-gather output ...
  int fsdp_prefetched_block_ = -1;  // ... of this block
  int32_t fsdp_rs_input_ = -1;   // the last reduce-scatter input, freed at the next one
  std::vector<int32_t> fsdp_params_;       // per micro-batch and block: weights kept to backward
  std::vector<int32_t> fsdp_grad_shards_;  // per block: the gradient shard, to the optimizer step
  int64_t stage_layers_seen_ = 0;          // decoder layers added so far (--recompute-every)
  std::vector<int32_t> fsdp_unit_params_;  // PP, per block: the weights gathered for the step
  std::vector<int32_t> fsdp_accumulated_;  // PP, per block: the unsharded fp32 gradients
};

void ProgramBuilder::emit_statics() {
  begin(InstrKind::kAlloc);
  int64_t dense = 0, expert = 0;
  std::vector<std::string> tied_seen;
  block_weight_bytes_.assign(p_.blocks.size(), 0);
  fsdp_numel_.assign(p_.blocks.size(), 0);
  fsdp_gathered_.assign(p_.blocks.size(), 0);
  fsdp_fp8_.assign(p_.blocks.size(), {});
  int64_t fsdp_shard = 0;  // this rank's padded shard elements of every parameter
  for (size_t b = 0; b < p_.blocks.size(); ++b) {
    const StageBlock& blk = p_.blocks[b];
    for (const GraphOp& op : blk.graph->ops) {
      // A tied weight is held once, but every block using it gathers it (ZeRO-3) and buckets
      // its gradient (ZeRO-2/3): the LM head needs the embedding table, and produces its
      // gradient, as the embedding does.
      bool again = false;
      if (!op.attrs.tie.empty()) {
        again = std::find(tied_seen.begin(), tied_seen.end(), op.attrs.tie) != tied_seen.end();
        if (!again) tied_seen.push_back(op.attrs.tie);
      }
      for (size_t w = 0; w < op.weights.size(); ++w) {
        int64_t n = op.weights[w].elements();
        block_weight_bytes_[b] += n * 2;
        if (t_.fsdp) {
          const std::vector<int64_t>& shape = op.weights[w].shape;
          int64_t rows = ceil_div(shape.front(), t_.fsdp_shards()) * t_.fsdp_shards();
          int64_t padded = n / shape.front() * rows;
          fsdp_numel_[b] += padded;
          // A float8 linear's weight (not its bias) under the float8 all-gather: one byte each.
          const bool fp8 = op.attrs.fp8_gathered_weight(w);
          fsdp_gathered_[b] += fp8 ? padded : 2 * padded;
          if (fp8)
            fsdp_fp8_[b].push_back({static_cast<int>(&op - blk.graph->ops.data()),
                                    padded / t_.fsdp_shards()});
          if (!again) fsdp_shard += padded / t_.fsdp_shards();
          continue;
        }
        if (again) continue;
        (op.expert_weights ? expert : dense) += n;
        if (t_.zero < 3)
          new_static(statics_only() ? std::string() : static_weight_name(blk, op, w), n * 2,
                     Category::kWeight);
      }
    }
  }
  if (t_.fsdp) {
    // FSDP2 keeps the sharded parameters in their own dtype, fp32, and the optimizer steps them:
    // no other master copy (PyTorch 2.10, torch/distributed/fsdp/_fully_shard/_fsdp_api.py,
    // MixedPrecisionPolicy); AdamW's states are zeros_like of each fp32 shard. The fp32
    // gradient shards come with the backward (fsdp_reduce).
    new_static("params (FSDP shard, fp32)", fsdp_shard * 4, Category::kWeight);
    if (t_.optimizer == Optimizer::kAdamW) {
      new_static("optimizer.exp_avg (FSDP shard, fp32)", fsdp_shard * 4, Category::kOptimizer);
      new_static("optimizer.exp_avg_sq (FSDP shard, fp32)", fsdp_shard * 4, Category::kOptimizer);
    }
    return;
  }
  // ZeRO shards over the data-parallel replicas of each parameter, CP ranks included (Megatron's
  // data-parallel + CP group): dp cp for dense, dp cp / ep for experts.
  struct Group {
    const char* name;
    int64_t n, shards;
  };
  for (Group g :
       {Group{"dense", dense, t_.dp * t_.cp}, Group{"expert", expert, t_.dp * t_.cp / t_.ep}}) {
    if (g.n == 0) continue;
    std::string s = g.name;
    if (t_.zero >= 3)
      new_static("weights." + s + " (ZeRO-3 shard, bf16)", ceil_div(g.n, g.shards) * 2,
                 Category::kWeight);
    int64_t grad_n = t_.zero >= 2 ? ceil_div(g.n, g.shards) : g.n;
    new_static("grad_buffer." + s + " (" + name_of(t_.grad_dtype) + ")",
               grad_n * dtype_bytes(t_.grad_dtype), Category::kGradient);
    int64_t opt_n = t_.zero >= 1 ? ceil_div(g.n, g.shards) : g.n;
    if (t_.optimizer != Optimizer::kNone)
      new_static("optimizer.master." + s + " (fp32)", opt_n * 4, Category::kOptimizer);
    if (t_.optimizer == Optimizer::kAdamW) {
      new_static("optimizer.exp_avg." + s + " (fp32)", opt_n * 4, Category::kOptimizer);
      new_static("optimizer.exp_avg_sq." + s + " (fp32)", opt_n * 4, Category::kOptimizer);
    }
  }
}

void ProgramBuilder::forward_pass(int mb, int chunk) {
  const int first = chunk_begin_[chunk], end = chunk_begin_[chunk + 1];
  int32_t x = -1;
  if (p_.blocks[first].kind != BlockKind::kEmbedding) {
    const BlockGraph& g = *p_.blocks[first].graph;
    begin(InstrKind::kRecv, first, -1, mb);
    x = new_tensor(g.tensors[g.hidden_in].type.bytes(), first, g.hidden_in, mb,
                   Category::kTransient, ValueKind::kValue);
    alloc(x);
  }
  for (int b = first; b < end; ++b) x = forward_block(b, mb, x);
  if (p_.blocks[end - 1].kind != BlockKind::kHead) {
    begin(InstrKind::kSend, end - 1, -1, mb);
    read(x);
  }
}

int32_t ProgramBuilder::gather_params(int b, int mb) {
  if (gather_bytes(b) == 0) return -1;
  begin(InstrKind::kGatherParams, b, -1, mb);
  int32_t id =
      new_tensor(gather_bytes(b), b, -1, mb, Category::kTransient, ValueKind::kParamGather);
  alloc(id);
  return id;
}

int32_t ProgramBuilder::forward_block(int b, int mb, int32_t x) {
  const StageBlock& blk = p_.blocks[b];
  const BlockGraph& g = *blk.graph;
  std::span<int32_t> v = values(b, mb);
  int32_t gathered = t_.fsdp ? fsdp_unshard(b, mb, true) : gather_params(b, mb);
  for (int input : g.inputs) {
    if (input == g.hidden_in) {
      v[input] = x;
      if (blk.saved.saved[input]) p_.tensors[x].category = Category::kActivation;
      continue;
    }
    begin(InstrKind::kLoad, b, -1, mb);
    v[input] = new_tensor(g.tensors[input].type.bytes(), b, input, mb,
                          blk.saved.saved[input] ? Category::kActivation : Category::kTransient,
                          ValueKind::kValue);
    alloc(v[input]);
  }
  run_ops_forward(b, mb, InstrKind::kForward, false);
  if (!fsdp_keeps(static_cast<size_t>(b))) {
    if (gathered >= 0) fsdp_reshard(gathered);  // resharded after the forward
  } else if (t_.pp == 1) {  // kept to its backward (under PP, for the step: fsdp_unit_params_)
    fsdp_params_[static_cast<size_t>(mb) * p_.blocks.size() + b] = gathered;
  }
  // FSDP: the root's post-forward frees the last all-gather output (PyTorch 2.10,
  // _fsdp_state.py _post_forward).
  if (t_.fsdp && b + 1 == chunk_begin_[static_cast<size_t>(blk.chunk) + 1] && fsdp_flat_ >= 0)
    read(std::exchange(fsdp_flat_, -1));
  return g.hidden_out >= 0 ? v[g.hidden_out] : -1;
}

void ProgramBuilder::run_ops_forward(int b, int mb, InstrKind kind, bool only_recomputed) {
  const StageBlock& blk = p_.blocks[b];
  const BlockGraph& g = *blk.graph;
  std::span<int32_t> v = values(b, mb);
  bool recompute = kind == InstrKind::kRecompute;
  // torchtitan's per-op checkpointing (caches_outputs): the recompute takes each kept op's stored
  // outputs as it passes the op, so they are read by the next op it re-runs (or its last).
  const bool pops = recompute && caches_outputs(blk.policy);
  std::vector<int32_t> popped;
  bool begun = false;
  for (size_t o = 0; o < g.ops.size(); ++o) {
    const GraphOp& op = g.ops[o];
    if (only_recomputed && !blk.policy.recompute[o]) {
      // A kept float8 linear: the recompute runs its casts again (the policy sees its mm, and
      // returns the cached output, only after them); no output, no GEMM.
      const std::vector<OpStep>& steps = steps_of(b, true)[o];
      if (pops && !steps.empty()) {
        begin(kind, b, static_cast<int32_t>(o), mb);
        begun = true;
        for (int in : op.inputs) read(v[in]);
        for (int32_t id : std::exchange(popped, {})) read(id);
        size_t casts = 0;
        while (casts < steps.size() && !steps[casts].results) ++casts;
        emit_steps(b, static_cast<int32_t>(o), mb,
                   std::vector<OpStep>(steps.begin(), steps.begin() + static_cast<long>(casts)),
                   [](unsigned, const std::vector<int>&) {}, kind);
      }
      if (pops)
        for (int out : op.outputs)
          if (blk.saved.saved[out]) popped.push_back(v[out]);
      continue;
    }
    begin(kind, b, static_cast<int32_t>(o), mb);
    begun = true;
    for (int in : op.inputs) read(v[in]);  // first: the executors take the op's inputs from them
    for (int32_t id : std::exchange(popped, {})) read(id);
    std::vector<char> made(op.outputs.size(), 0);
    // kStepResults: the outputs not made yet; `early`: these now (OpStep::outputs).
    auto outputs = [&](unsigned which, const std::vector<int>& early = {}) {
      for (size_t j = 0; j < op.outputs.size(); ++j) {
        const bool now = std::find(early.begin(), early.end(), static_cast<int>(j)) != early.end();
        if (made[j] || (!now && !(which & kStepResults))) continue;
        made[j] = 1;
        const int out = op.outputs[j];
        bool saved = !recompute && blk.saved.saved[out];
        v[out] = new_tensor(g.tensors[out].type.bytes(), b, out, mb,
                            saved ? Category::kActivation : Category::kTransient,
                            recompute ? ValueKind::kRecomputed : ValueKind::kValue);
        alloc(v[out]);
      }
    };
    if (const std::vector<OpStep>& steps = steps_of(b, true)[o]; !steps.empty()) {
      emit_steps(b, static_cast<int32_t>(o), mb, steps, outputs, kind);
      continue;
    }
    for (int64_t bytes : workspace_bytes(b, true)[o])
      alloc(new_tensor(bytes, b, static_cast<int32_t>(o), mb, Category::kTransient,
                       ValueKind::kWorkspace));
    outputs(kStepResults);
  }
  if (begun)
    for (int32_t id : popped) read(id);
}

void ProgramBuilder::backward_pass(int mb, int chunk) {
  const int first = chunk_begin_[chunk], last = chunk_begin_[chunk + 1] - 1;
  int32_t grad = -1;
  if (p_.blocks[last].kind != BlockKind::kHead) {
    const BlockGraph& g = *p_.blocks[last].graph;
    begin(InstrKind::kRecv, last, -1, mb);
    grad = new_tensor(g.tensors[g.hidden_out].type.bytes(), last, g.hidden_out, mb,
                      Category::kTransient, ValueKind::kGrad);
    alloc(grad);
  }
  for (int b = last; b >= first; --b) grad = backward_block(b, mb, grad);
  if (p_.blocks[first].kind != BlockKind::kEmbedding) {
    begin(InstrKind::kSend, first, -1, mb);
    read(grad);
  }
}

int32_t ProgramBuilder::backward_block(int b, int mb, int32_t grad_out) {
  const StageBlock& blk = p_.blocks[b];
  const BlockGraph& g = *blk.graph;
  std::span<int32_t> v = values(b, mb);
  std::vector<int32_t>& grads = grads_;
  grads.assign(g.tensors.size(), -1);
  if (g.hidden_out >= 0) grads[g.hidden_out] = grad_out;
  int32_t gathered = t_.fsdp ? fsdp_unshard(b, mb, false) : gather_params(b, mb);
  std::vector<int32_t> weight_grads;  // FSDP: the unit's unsharded bf16 gradients
  run_ops_forward(b, mb, InstrKind::kRecompute, true);
  int32_t bucket = -1;
  if (bucket_bytes(b) > 0) {
    begin(InstrKind::kAlloc, b, -1, mb);
    bucket = new_tensor(bucket_bytes(b), b, -1, mb, Category::kTransient, ValueKind::kGradBucket);
    alloc(bucket);
  }
  for (int o = static_cast<int>(g.ops.size()) - 1; o >= 0; --o) {
    const GraphOp& op = g.ops[o];
    const OpInfo& info = op_info(op.kind);
    bool live = info.grad_outputs == 0;
    for (size_t j = 0; j < op.outputs.size(); ++j)
      if ((info.grad_outputs >> j & 1u) && grads[op.outputs[j]] >= 0) live = true;
    if (!live) continue;
    begin(InstrKind::kBackward, b, o, mb);
    std::vector<int32_t> out_grads;
    for (size_t j = 0; j < op.outputs.size(); ++j) {
      if ((info.grad_outputs >> j & 1u) && grads[op.outputs[j]] >= 0) {
        read(grads[op.outputs[j]]);
        out_grads.push_back(grads[op.outputs[j]]);
      }
      if (info.bwd_reads_outputs >> j & 1u) read(v[op.outputs[j]]);
    }
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      if (info.bwd_reads_inputs >> k & 1u) read(v[op.inputs[k]]);
      if ((info.grad_inputs >> k & 1u) && grads[op.inputs[k]] >= 0) read(grads[op.inputs[k]]);
    }
    if (bucket >= 0 && !op.weights.empty()) read(bucket);
    auto results = [&](unsigned which, const std::vector<int>& = {}) {
      for (size_t k = 0; k < op.inputs.size() && (which & kStepResults); ++k) {
        int in_t = op.inputs[k];
        if (!(info.grad_inputs >> k & 1u) || grads[in_t] >= 0) continue;
        grads[in_t] = new_tensor(grad_bytes(g.tensors[in_t].type), b, in_t, mb,
                                 Category::kTransient, ValueKind::kGrad);
        alloc(grads[in_t]);
      }
      // FSDP: autograd's gradient of each weight, in bf16.
      if ((which & kStepWeightGrads) && t_.fsdp && !op.weights.empty()) {
        int64_t n = 0;
        for (const WeightShape& w : op.weights) n += w.elements();
        weight_grads.push_back(
            new_tensor(n * 2, b, -1, mb, Category::kTransient, ValueKind::kGradBucket));
        alloc(weight_grads.back());
      }
    };
    if (const std::vector<OpStep>& steps = steps_of(b, false)[o]; !steps.empty()) {
      emit_steps(b, o, mb, steps, results, InstrKind::kBackward, out_grads);
      continue;
    }
    for (int64_t bytes : workspace_bytes(b, false)[o])
      alloc(new_tensor(bytes, b, o, mb, Category::kTransient, ValueKind::kWorkspace));
    results(kStepResults | kStepWeightGrads);
  }
  if (t_.fsdp) {
    if (t_.pp > 1)
      fsdp_accumulate(b, mb, weight_grads);
    else
      fsdp_reduce(b, mb, gathered, weight_grads, b == 0);
    return g.hidden_in >= 0 ? grads[g.hidden_in] : -1;
  }
  if (bucket >= 0) {
    begin(InstrKind::kReduceGrads, b, -1, mb);
    read(bucket);
  }
  if (gathered >= 0) read(gathered);
  return g.hidden_in >= 0 ? grads[g.hidden_in] : -1;
}

// FSDP2's unshard of unit b (PyTorch 2.10, torch/distributed/fsdp/_fully_shard/
// _fsdp_param_group.py unshard, wait_for_unshard, _backward_prefetch; _fsdp_collectives.py
// foreach_all_gather, foreach_all_gather_copy_out): the bf16 shards all-gathered into one flat
// output on the copy-in stream, then copied out into each parameter's own unsharded tensor on
// the compute stream. In the forward the flat output lives until the next unit's copy-out frees
// it; in the backward it is freed after its own copy-out, and the unit run next in the backward
// is all-gathered at once (prefetched one ahead). Returns the unsharded weights.
int32_t ProgramBuilder::fsdp_unshard(int b, int mb, bool forward) {
  const size_t slot = static_cast<size_t>(mb) * p_.blocks.size() + static_cast<size_t>(b);
  const int64_t bytes = fsdp_gathered_[static_cast<size_t>(b)];
  if (t_.pp > 1 && fsdp_unit_params_[static_cast<size_t>(b)] >= 0)
    return fsdp_unit_params_[static_cast<size_t>(b)];  // gathered for the step already
  int32_t params = forward ? -1 : fsdp_params_[slot];
  if (params < 0) {
    int32_t flat = -1;
    if (!forward && fsdp_prefetched_block_ == b) {
      flat = std::exchange(fsdp_prefetched_, -1);
      fsdp_prefetched_block_ = -1;
    } else {
      flat = fsdp_all_gather(b, mb);
      if (forward && fsdp_flat_ >= 0) read(std::exchange(fsdp_flat_, -1));
    }
    begin(InstrKind::kGatherParams, b, -1, mb);  // the copy-out
    read(flat);
    params = new_tensor(bytes, b, -1, mb, Category::kTransient, ValueKind::kParamGather);
    alloc(params);
    if (auto it = fsdp_scales_.find(flat); it != fsdp_scales_.end()) {  // the float8 scales
      fsdp_scales_[params] = std::move(it->second);
      fsdp_scales_.erase(it);
    }
    if (forward) fsdp_flat_ = flat;  // else its last use was the copy-out
    if (t_.pp > 1) fsdp_unit_params_[static_cast<size_t>(b)] = params;
  }
  // The backward's prefetch: the unit before b in the chunk, when it was resharded.
  if (!forward && b > 0 && b - 1 >= chunk_begin_[static_cast<size_t>(p_.blocks[b].chunk)] &&
      !fsdp_keeps(static_cast<size_t>(b - 1))) {
    fsdp_prefetched_ = fsdp_all_gather(b - 1, mb);
    fsdp_prefetched_block_ = b - 1;
  }
  return params;
}

// Unit b's all-gather (foreach_all_gather, _get_param_all_gather_inputs), on the copy-in stream.
// First each float8 weight's fsdp_pre_all_gather, in parameter order (pytorch/ao 36027d8,
// torchao/float8/fsdp_utils.py, WeightWithDynamicFloat8CastTensor; float8_utils.py
// tensor_to_amax, float8_scaling_utils.py hp_tensor_to_float8_dynamic with reduce_amax), on its
// fp32 shard x, one instruction a step: |x| and its max; the max all-reduced over the shard group
// (a functional collective: a new 0-dim tensor); the fp32 scale; x times the scale (x is fp32:
// no copy); the clamp and the float8 shard. Then the other weights' bf16 copy
// (flat_foreach_copy_input), then the flat output every input is copied into (bytes when the
// dtypes differ); the inputs are dropped when the copy-in ends. The scales stay with the output,
// then with the unsharded weights (fsdp_scales_). The instruction that reads the output last
// frees it. Returns the output.
int32_t ProgramBuilder::fsdp_all_gather(int b, int mb) {
  const size_t u = static_cast<size_t>(b);
  const int64_t bytes = fsdp_gathered_[u];
  auto temp = [&](int op, int64_t n) {
    int32_t id = new_tensor(n, b, op, mb, Category::kTransient, ValueKind::kAllGatherInput);
    alloc(id);
    return id;
  };
  std::vector<int32_t> inputs, scales;
  int64_t fp8_bytes = 0;
  for (const Fp8Shard& f : fsdp_fp8_[u]) {
    begin(InstrKind::kGatherParams, b, f.op, mb);
    temp(f.op, 4 * f.elements);  // |x|: dies here
    int32_t amax = temp(f.op, 4);
    begin(InstrKind::kGatherParams, b, f.op, mb);
    read(amax);
    int32_t reduced = temp(f.op, 4);
    begin(InstrKind::kGatherParams, b, f.op, mb);
    read(reduced);
    scales.push_back(temp(f.op, 4));
    begin(InstrKind::kGatherParams, b, f.op, mb);
    read(scales.back());
    int32_t scaled = temp(f.op, 4 * f.elements);
    begin(InstrKind::kGatherParams, b, f.op, mb);
    read(scaled);
    temp(f.op, 4 * f.elements);  // the clamp
    inputs.push_back(temp(f.op, f.elements));
    fp8_bytes += f.elements;
  }
  if (int64_t rest = bytes / t_.fsdp_shards() - fp8_bytes; rest > 0) {
    begin(InstrKind::kGatherParams, b, -1, mb);
    inputs.push_back(temp(-1, rest));
  }
  begin(InstrKind::kGatherParams, b, -1, mb);
  for (int32_t id : inputs) read(id);
  int32_t flat = new_tensor(bytes, b, -1, mb, Category::kTransient, ValueKind::kAllGatherBuffer);
  alloc(flat);
  if (!scales.empty()) fsdp_scales_[flat] = std::move(scales);
  return flat;
}

// FSDP2's post-backward of unit b (PyTorch 2.10, _fsdp_param_group.py post_backward;
// _fsdp_collectives.py foreach_reduce): the unit resharded and the previous reduce-scatter's
// input freed; the bf16 gradients copied into one fp32 reduce-scatter input on the compute
// stream and freed; the reduce-scatter's output shard allocated on its stream. The first
// micro-batch's becomes the gradient (held to the optimizer step); a later one's is added into
// it and freed. The input is kept until the next unit's post-backward, or the root's at the end
// of the backward. HSDP's all-reduce over the replicas runs in place on the output.
void ProgramBuilder::fsdp_reduce(int b, int mb, int32_t params, const std::vector<int32_t>& grads,
                                 bool last) {
  const int64_t n = fsdp_numel_[static_cast<size_t>(b)];
  begin(InstrKind::kReduceGrads, b, -1, mb);
  fsdp_reshard(params);
  if (fsdp_rs_input_ >= 0) read(std::exchange(fsdp_rs_input_, -1));
  begin(InstrKind::kReduceGrads, b, -1, mb);
  for (int32_t id : grads) read(id);
  int32_t input = new_tensor(n * 4, b, -1, mb, Category::kTransient, ValueKind::kReduceScatterInput);
  alloc(input);
  begin(InstrKind::kReduceGrads, b, -1, mb);
  read(input);
  int32_t shard = new_tensor(n / t_.fsdp_shards() * 4, b, -1, mb,
                             mb == 0 ? Category::kGradient : Category::kTransient,
                             ValueKind::kGradShard);
  alloc(shard);
  if (mb == 0) fsdp_grad_shards_[static_cast<size_t>(b)] = shard;
  if (last) {
    read(input);  // the root's post-backward: the last reduce-scatter done
  } else {
    fsdp_rs_input_ = input;
  }
}

// FSDP2's post-backward without gradient sync (PP's micro-batches before the step's reduce:
// PyTorch 2.10, _fsdp_param_group.py post_backward with _reduce_grads off; _fsdp_param.py
// to_accumulated_grad_if_needed, accumulate_unsharded_grad_if_needed): the first micro-batch's
// bf16 gradients become one fp32 unsharded gradient per parameter (reduce_dtype), a later one's
// are added into it; the bf16 ones are freed.
void ProgramBuilder::fsdp_accumulate(int b, int mb, const std::vector<int32_t>& grads) {
  begin(InstrKind::kReduceGrads, b, -1, mb);
  for (int32_t id : grads) read(id);
  int32_t& acc = fsdp_accumulated_[static_cast<size_t>(b)];
  if (acc >= 0) {
    read(acc);
    return;
  }
  acc = new_tensor(block_weight_bytes_[static_cast<size_t>(b)] * 2, b, -1, mb,
                   Category::kGradient, ValueKind::kGradBucket);
  alloc(acc);
}

void ProgramBuilder::insert_frees() {
  constexpr int32_t kNever = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> last(p_.tensors.size(), kNever);
  for (int32_t i = 0; i < static_cast<int32_t>(p_.instrs.size()); ++i) {
    const Instr& in = p_.instrs[i];
    for (int32_t id : p_.reads(in)) last[id] = i;
    for (int32_t id : p_.allocs(in)) last[id] = i;
  }
  // Tensor ids grouped by the instruction after which they die (a counting sort, ids ascending).
  std::vector<int32_t> first(p_.instrs.size() + 1, 0), order(p_.tensors.size());
  for (int32_t id = 0; id < static_cast<int32_t>(p_.tensors.size()); ++id)
    if (p_.tensors[id].kind != ValueKind::kStatic) ++first[last[id] + 1];
  for (size_t i = 1; i < first.size(); ++i) first[i] += first[i - 1];
  std::vector<int32_t> fill(first.begin(), first.end() - 1);
  for (int32_t id = 0; id < static_cast<int32_t>(p_.tensors.size()); ++id)
    if (p_.tensors[id].kind != ValueKind::kStatic) order[fill[last[id]]++] = id;
  std::vector<Instr> out;
  std::vector<int32_t> pool;
  out.reserve(p_.instrs.size() * 2);
  pool.reserve(p_.pool.size() + p_.tensors.size());
  for (size_t i = 0; i < p_.instrs.size(); ++i) {
    Instr in = p_.instrs[i];
    auto span = std::span<const int32_t>(p_.pool.data() + in.begin, in.n_reads + in.n_allocs);
    in.begin = static_cast<uint32_t>(pool.size());
    pool.insert(pool.end(), span.begin(), span.end());
    out.push_back(in);
    for (int32_t k = first[i]; k < first[i + 1]; ++k) {
      int32_t id = order[k];
      const ScheduleTensor& t = p_.tensors[id];
      out.push_back(
          {InstrKind::kFree, t.block, -1, t.mb, static_cast<uint32_t>(pool.size()), 1, 0});
      pool.push_back(id);
    }
  }
  p_.instrs = std::move(out);
  p_.pool = std::move(pool);
}

}  // namespace

StageStatics::StageStatics(const ModelSpec& m, const TrainSpec& t)
    : m_(m),
      t_(t),
      emb_(std::make_shared<const BlockGraph>(build_embedding(m, t))),
      layer_(std::make_shared<const BlockGraph>(build_layer(m, t))),
      head_(std::make_shared<const BlockGraph>(build_head(m, t))),
      dense_(mixed_layers(m) ? std::make_shared<const BlockGraph>(build_dense_layer(m, t))
                             : nullptr) {}

int64_t StageStatics::operator()(int stage, int layers) const {
  std::vector<int> list;
  for (int l = 0; l < layers; ++l) list.push_back(l);
  return (*this)(stage, list);
}

int64_t StageStatics::operator()(int stage, const std::vector<int>& layers) const {
  return ProgramBuilder(m_, t_, stage, {layers}, emb_, layer_, head_, nullptr, 0, dense_)
      .static_bytes();
}

StageStatics::ZeroTransients StageStatics::zero_transients(int stage) const {
  if (t_.zero < 2 && !t_.fsdp) return {};  // nothing gathered or bucketed per block
  std::vector<int> layers{mixed_layers(m_) ? static_cast<int>(m_.dense_layers.front()) : 0};
  if (mixed_layers(m_))  // one layer of each kind: the first MoE layer too
    for (int l = 0; l < m_.layers; ++l)
      if (!dense_layer(m_, l)) {
        layers.push_back(l);
        break;
      }
  return ProgramBuilder(m_, t_, stage, {layers}, emb_, layer_, head_, nullptr, 0, dense_)
      .zero_transients();
}

Schedule build_schedule(const ModelSpec& m, const TrainSpec& t, const BlockPolicies* policies,
                        bool peak_only, const Schedule* keep, const std::vector<bool>* changed) {
  auto emb = std::make_shared<const BlockGraph>(build_embedding(m, t));
  auto layer = std::make_shared<const BlockGraph>(build_layer(m, t));
  auto head = std::make_shared<const BlockGraph>(build_head(m, t));
  auto dense = mixed_layers(m) ? std::make_shared<const BlockGraph>(build_dense_layer(m, t))
                               : nullptr;
  Schedule s{m, t, {}};
  // Each stage's layers by local chunk: chunk j of the model is stage j mod pp's chunk j / pp.
  std::vector<int64_t> counts = chunk_layers(m, t);
  std::vector<std::vector<std::vector<int>>> layers(t.pp);
  for (size_t j = 0, first = 0; j < counts.size(); first += counts[j++]) {
    std::vector<int>& chunk = layers[j % t.pp].emplace_back();
    for (int64_t l = 0; l < counts[j]; ++l) chunk.push_back(static_cast<int>(first + l));
  }
  // The stages' programs are independent: built in parallel (each reads the shared graphs and
  // writes its own program), the same programs in the same order.
  s.stages.resize(static_cast<size_t>(t.pp));
  auto build_stage = [&](int stage) {
    if (keep && changed && !(*changed)[static_cast<size_t>(stage)]) {
      s.stages[static_cast<size_t>(stage)] = keep->stages[static_cast<size_t>(stage)];
      return;
    }
    int64_t mbs = t.microbatches;
    // FSDP: one micro-batch more, whose forward meets the first one's gradient shards (pp 1)
    // or its accumulated fp32 gradients (under PP).
    if (peak_only && t.pp_schedule == PpSchedule::k1F1B)
      mbs = std::min(mbs, t.pp - stage + (t.fsdp ? 1 : 0));
    ProgramBuilder pb(m, t, stage, layers[stage], emb, layer, head, policies, mbs, dense);
    s.stages[static_cast<size_t>(stage)] = pb.build();
  };
  parallel_for(static_cast<size_t>(t.pp), [&](size_t stage) { build_stage(static_cast<int>(stage)); });
  return s;
}

}  // namespace np

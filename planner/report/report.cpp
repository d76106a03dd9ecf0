// Table and JSON output of estimates and schedules.
#include "planner/report/report.hpp"

#include <algorithm>
#include <cstdio>

#include "planner/schedule/plan_io.hpp"
#include "planner/inputs/units.hpp"

namespace np {

using nlohmann::json;

// The estimate's summary of the model: keys of the plan file's spec (one writer of a model's
// JSON, model_spec_to_json), with the parameter count the estimate made.
json model_to_json(const ModelSpec& m, int64_t parameters) {
  const json spec = model_spec_to_json(m);
  json j = {{"parameters", parameters}};
  for (const char* key : {"name", "display_name", "source", "hidden_size", "num_layers",
                          "num_heads", "num_kv_heads", "vocab_size"})
    j[key] = spec.at(key);
  if (m.moe) j["moe"] = {{"num_experts", spec["moe"]["num_experts"]}, {"top_k", spec["moe"]["top_k"]}};
  return j;
}

namespace {
int64_t cat(const StageEstimate& s, Category c) {
  return s.bytes[static_cast<int>(c)];
}

json stage_to_json(const Estimate& e, const StageEstimate& s) {
  json overheads = json::array();
  for (const OverheadLine& o : s.overheads)
    overheads.push_back({{"name", o.name},
                         {"bytes", o.bytes},
                         {"assumption", o.assumption},
                         {"in_allocator", o.allocator}});
  json layers = json::array();
  for (const LayerSaved& l : s.layers)
    layers.push_back({{"index", l.index}, {"policy", l.policy}, {"saved_bytes", l.saved_bytes}});
  json j = {{"pp_stage", s.stage},
            {"rank", s.first_rank},
            {"ranks_in_stage", e.setup.tp * e.setup.dp},
            {"first_layer", s.first_layer},
            {"num_layers", s.num_layers},
            {"layer_ranges", s.layer_ranges},
            {"in_flight_microbatches", s.in_flight},
            {"in_flight_chunk_passes", s.chunk_passes},
            {"parameter_bytes", cat(s, Category::kWeight)},
            {"gradient_bytes", cat(s, Category::kGradient)},
            {"optimizer_bytes", cat(s, Category::kOptimizer)},
            {"activation_bytes", cat(s, Category::kActivation)},
            {"transient_bytes", cat(s, Category::kTransient)},
            {"allocator_peak_bytes", s.allocator_peak},
            {"overhead_bytes", s.overhead_bytes},
            {"overheads", overheads},
            {"peak_bytes", s.peak_bytes},
            {"allocated_peak_bytes", s.allocated_peak},
            {"reserved_peak_bytes", s.reserved_peak},
            {"allocator_steps", s.allocator_steps},
            {"peak_at", s.peak_at},
            {"embedding_saved_bytes", s.embedding_saved},
            {"head_saved_bytes", s.head_saved},
            {"layers", layers}};
  if (!s.live_at_peak.empty()) {
    json live = json::array();
    for (const LiveTensor& t : s.live_at_peak)
      live.push_back({{"name", t.name}, {"bytes", t.bytes}, {"category", name_of(t.category)}});
    j["live_at_peak"] = live;
  }
  return j;
}
}  // namespace

json estimate_to_json(const Estimate& e) {
  json suggestions = json::array();
  for (const Suggestion& s : e.suggestions)
    suggestions.push_back({{"change", s.change},
                           {"note", s.note},
                           {"setup", setup_to_json(s.setup)},
                           {"peak_bytes", s.peak_bytes}});
  json ranks = json::array();
  for (const StageEstimate& s : e.stages) ranks.push_back(stage_to_json(e, s));
  return {{"nanoplan_version", 1},
          {"model", model_to_json(e.model, e.parameters)},
          {"setup", setup_to_json(e.setup)},
          {"budget_bytes", e.budget ? json(*e.budget + e.headroom) : json(nullptr)},
          {"headroom_bytes", e.budget ? json(e.headroom) : json(nullptr)},
          {"usable_bytes", e.budget ? json(*e.budget) : json(nullptr)},
          {"fits", e.fits},
          {"quantities",
           {{"peak_bytes",
             "device memory in use at the peak (what nvidia-smi shows): what the caching "
             "allocator reserves, the CUDA context and NCCL's buffers"},
            {"allocated_peak_bytes",
             "what torch.cuda.max_memory_allocated() reports: the schedule's tensors and the "
             "overhead lines with in_allocator true, as the allocator rounds its blocks; without "
             "the CUDA context"},
            {"reserved_peak_bytes",
             "what torch.cuda.max_memory_reserved() reports: the segments PyTorch's caching "
             "allocator holds at its steady state, replayed from the rank's allocations "
             "(allocator)"}}},
          {"allocator", {{"model", name_of(e.runtime.allocator.model)},
                         {"options", e.runtime.allocator.options}}},
          {"peak_bytes", e.peak_bytes},
          {"peak_rank", e.peak_rank},
          {"peak_stage", e.peak_stage},
          {"allocated_peak_bytes", e.allocated_peak_bytes},
          {"allocated_peak_stage", e.allocated_peak_stage},
          {"reserved_peak_bytes", e.reserved_peak_bytes},
          {"reserved_peak_stage", e.reserved_peak_stage},
          {"suggestions", suggestions},
          {"ranks", ranks}};
}

namespace {

std::string row(const std::string& label, int64_t bytes, const std::string& note = "") {
  char buf[512];
  std::snprintf(buf, sizeof buf, "  %-34s %20s %11.2f %11.2f  %s\n", label.c_str(),
                format_int(bytes).c_str(), static_cast<double>(bytes) / kGiB,
                static_cast<double>(bytes) / kGB, note.c_str());
  return buf;
}


// "ZeRO-1", or "FSDP2 over 8 (reshard after forward)", "HSDP 2 x 4 (...)".
std::string sharding_text(const TrainSpec& t) {
  if (!t.fsdp) return "ZeRO-" + std::to_string(t.zero);
  std::string how = t.reshard_after_forward ? "resharded after forward" : "kept from forward to backward";
  if (t.dp_replicate > 1)
    return "HSDP " + std::to_string(t.dp_replicate) + " replicas x " +
           std::to_string(t.fsdp_shards()) + " shards (" + how + ")";
  return "FSDP2 over " + std::to_string(t.fsdp_shards()) + " (" + how + ")";
}

std::string stage_breakdown(const Estimate& e, const StageEstimate& s) {
  std::string out;
  char title[128], head[256];
  std::snprintf(title, sizeof title, "rank %lld (pp stage %d, layers %s)",
                static_cast<long long>(s.first_rank), s.stage, s.layer_ranges.c_str());
  std::snprintf(head, sizeof head, "\nper-GPU memory of %-36s %13s %11s %11s\n", title, "bytes",
                "GiB", "GB");
  out += head;
  const TrainSpec& t = e.setup;
  if (t.fsdp) {
    const std::string shard = "FSDP shard over " + std::to_string(t.fsdp_shards());
    out += row("weights (fp32)", cat(s, Category::kWeight),
               shard + (t.fp8_all_gather
                            ? "; the gathered weights (float8 linears' in float8) are transient"
                            : "; the bf16 gathered weights are transient"));
    out += row("gradients (fp32)", cat(s, Category::kGradient),
               shard + ", those reduce-scattered by the peak");
    out += row(std::string("optimizer (") + name_of(t.optimizer) + ")", cat(s, Category::kOptimizer),
               t.optimizer == Optimizer::kAdamW ? "2 moments (the fp32 shard is the master), " + shard
                                                : "");
  } else {
    out += row("weights (bf16)", cat(s, Category::kWeight), t.zero >= 3 ? "ZeRO-3 shard" : "");
    out += row(std::string("gradients (") + name_of(t.grad_dtype) + ")",
               cat(s, Category::kGradient),
               t.zero >= 2 ? "ZeRO-" + std::to_string(t.zero) + " shard" : "");
    out += row(std::string("optimizer (") + name_of(t.optimizer) + ")",
               cat(s, Category::kOptimizer),
               t.optimizer == Optimizer::kAdamW
                   ? "fp32 master + 2 moments" + (t.zero >= 1
                                                      ? ", ZeRO-" + std::to_string(t.zero) + " shard"
                                                      : std::string())
                   : "");
  }
  out += row("activations (saved for backward)", cat(s, Category::kActivation),
             t.pp_schedule == PpSchedule::kInterleaved
                 ? std::to_string(s.chunk_passes) + " chunk passes in flight (" +
                       std::to_string(t.virtual_stages) + " chunks)"
                 : count_noun(s.in_flight, "micro-batch") + " in flight");
  out += row("transient at the peak", cat(s, Category::kTransient), "grads, recompute, buffers");
  for (const OverheadLine& o : s.overheads)
    out += row(o.name + (o.allocator ? " +" : ""), o.bytes, o.assumption);
  out += "  " + std::string(96, '-') + "\n";
  out += row("peak, device memory in use", s.peak_bytes, "at " + s.peak_at);
  out += row("peak allocated (PyTorch)", s.allocated_peak,
             "torch.cuda.max_memory_allocated(): the tensors above and the lines marked +");
  out += row("peak reserved (PyTorch)", s.reserved_peak,
             "torch.cuda.max_memory_reserved(): those and the allocator cache");
  return out;
}

std::string stage_table(const Estimate& e) {
  int w = 7;  // the layer column fits the longest range list (interleaved stages have several)
  for (const StageEstimate& s : e.stages) w = std::max(w, static_cast<int>(s.layer_ranges.size()));
  std::string out = "\nper pipeline stage (GiB):\n  stage  " + std::string("layers") +
                    std::string(static_cast<size_t>(w - 6), ' ') +
                    "   in-flight   weights     grads     optim   activ  transient  overhead      "
                    "peak\n";
  for (const StageEstimate& s : e.stages) {
    char buf[512];
    auto g = [&](Category c) { return static_cast<double>(cat(s, c)) / kGiB; };
    std::snprintf(
        buf, sizeof buf, "  %5d  %-*s %11lld %9.2f %9.2f %9.2f %7.2f %10.2f %9.2f %9.2f%s\n",
        s.stage, w, s.layer_ranges.c_str(),
        static_cast<long long>(e.setup.pp_schedule == PpSchedule::kInterleaved ? s.chunk_passes
                                                                               : s.in_flight),
        g(Category::kWeight), g(Category::kGradient),
        g(Category::kOptimizer), g(Category::kActivation), g(Category::kTransient),
        static_cast<double>(s.overhead_bytes) / kGiB, static_cast<double>(s.peak_bytes) / kGiB,
        s.stage == e.peak_stage ? "  <- peak" : "");
    out += buf;
  }
  return out;
}

std::string verdict(const Estimate& e) {
  if (!e.budget) return "\nno budget given (--budget or --gpu): nothing to compare against\n";
  int64_t b = *e.budget, given = b + e.headroom;
  std::string out = "\nbudget " + format_int(given) + " bytes = " + format_human(given);
  if (e.headroom > 0)
    out += ", less headroom " + format_gib(e.headroom) + " (--headroom) = " + format_gib(b) +
           " usable";
  out += ": ";
  if (e.fits) return out + "FITS, " + format_gib(b - e.peak_bytes) + " to spare\n";
  out += "DOES NOT FIT: the peak rank " + std::to_string(e.peak_rank) + " needs " +
         format_gib(e.peak_bytes - b) + " more\n";
  const StageEstimate& s = e.stages[e.peak_stage];
  std::vector<std::pair<int64_t, std::string>> parts;
  for (int c = 0; c < kCategories; ++c)
    parts.push_back({s.bytes[c], name_of(static_cast<Category>(c))});
  std::sort(parts.rbegin(), parts.rend());
  out += "  largest components: ";
  for (int i = 0; i < 3; ++i)
    out += (i ? ", " : "") + parts[i].second + " " + format_gib(parts[i].first);
  out += "\n";
  if (e.suggestions.empty())
    return out +
           "  no nearby setup fits (tried a higher ZeRO stage, more tp in place of dp, full "
           "recompute, a smaller micro-batch, more pp, ZeRO-1 over more dp)\n";
  out += "  nearest setups that fit (each estimated):\n";
  for (const Suggestion& sg : e.suggestions) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "    %-28s peak %s  (%s)\n", sg.change.c_str(),
                  format_gib(sg.peak_bytes).c_str(), sg.note.c_str());
    out += buf;
  }
  return out;
}

}  // namespace

// The block a live tensor belongs to: "L12/mb0" for a layer's tensors of micro-batch 0, "L12"
// for its weights, "head/mb0", or the tensor's own name for the stage's flat buffers.
std::string block_of(const std::string& name) {
  size_t colon = name.find(':'), slash = name.find('/');
  size_t start = colon != std::string::npos && (slash == std::string::npos || colon < slash) ? colon + 1 : 0;
  size_t first = name.find('/', start);
  if (first == std::string::npos) return name.substr(start);
  size_t second = name.find('/', first + 1);
  bool mb = name.compare(first + 1, 2, "mb") == 0 && second != std::string::npos;
  return name.substr(start, (mb ? second : first) - start);
}

// Live tensors at the peak grouped by category, then by block, largest first; every tensor with
// `verbose`.
std::string live_at_peak_table(const Estimate& e, const StageEstimate& s, bool verbose) {
  std::string out = "\nlive at the peak of rank " + std::to_string(e.peak_rank) + " (" +
                    s.peak_at + "): " + count_noun(static_cast<int64_t>(s.live_at_peak.size()), "tensor") +
                    ", by category and block, largest first" +
                    (verbose ? "" : " (--verbose lists every tensor)") + ":\n";
  struct Group {
    int64_t bytes = 0, tensors = 0;
    std::vector<std::pair<std::string, int64_t>> blocks;  // block, bytes
  };
  std::vector<Group> groups(kCategories);
  for (const LiveTensor& t : s.live_at_peak) {
    Group& g = groups[static_cast<int>(t.category)];
    g.bytes += t.bytes, ++g.tensors;
    std::string b = block_of(t.name);
    auto it = std::find_if(g.blocks.begin(), g.blocks.end(), [&](const auto& x) { return x.first == b; });
    if (it == g.blocks.end())
      g.blocks.push_back({b, t.bytes});
    else
      it->second += t.bytes;
  }
  std::vector<int> order;
  for (int c = 0; c < kCategories; ++c)
    if (groups[c].tensors > 0) order.push_back(c);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return groups[a].bytes > groups[b].bytes; });
  constexpr size_t kShown = 4;
  for (int c : order) {
    Group& g = groups[c];
    std::stable_sort(g.blocks.begin(), g.blocks.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    char buf[256];
    std::snprintf(buf, sizeof buf, "  %-12s %11s  %s in %s: ", name_of(static_cast<Category>(c)),
                  format_binary(g.bytes).c_str(), count_noun(g.tensors, "tensor").c_str(),
                  count_noun(static_cast<int64_t>(g.blocks.size()), "block").c_str());
    out += buf;
    for (size_t i = 0; i < g.blocks.size() && i < kShown; ++i)
      out += (i ? ", " : "") + g.blocks[i].first + " " + format_binary(g.blocks[i].second);
    if (g.blocks.size() > kShown) out += ", " + std::to_string(g.blocks.size() - kShown) + " more";
    out += "\n";
  }
  if (!verbose) return out;
  out += "  every tensor, largest first:\n";
  for (const LiveTensor& t : s.live_at_peak) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "    %-12s %20s  %s\n", name_of(t.category),
                  format_int(t.bytes).c_str(), t.name.c_str());
    out += buf;
  }
  return out;
}

std::string describe_setup(const TrainSpec& t) {
  std::string s = "tp " + std::to_string(t.tp) + (t.sp ? " (sp on)" : " (sp off)") +
                  (t.cp > 1 ? " x cp " + std::to_string(t.cp) : "") + " x pp " +
                  std::to_string(t.pp) + " x dp " + std::to_string(t.dp) + " = " +
                  count_noun(t.gpus(), "GPU");
  if (t.ep > 1) s += ", ep " + std::to_string(t.ep);
  if (t.moe_capacity_factor > 0) {
    char cf[48];
    std::snprintf(cf, sizeof cf, ", expert capacity factor %g", t.moe_capacity_factor);
    s += cf;
  }
  s += "; micro-batch " + std::to_string(t.micro_batch) + " x seq " + std::to_string(t.seq_len) +
       ", " + count_noun(t.microbatches, "micro-batch") + " per step, " +
       name_of(t.pp_schedule) +
       (t.pp_schedule == PpSchedule::kInterleaved
            ? " (" + std::to_string(t.virtual_stages) + " chunks per stage)"
            : std::string()) +
       "; " + name_of(t.attention) + " attention, " + name_of(t.impl) + " kernels" +
       (t.loss_fusion != LossFusion::kNone
            ? std::string(" (cross-entropy fusion ") + name_of(t.loss_fusion) + ")"
            : std::string()) +
       (t.grad_accum_fusion ? std::string() : std::string(", no gradient-accumulation fusion")) +
       (te_fp8(t) ? std::string(", float8 linears (Transformer Engine, ") +
                        (t.fp8 == Fp8Recipe::kDelayed ? "delayed" : "current") + " scaling" +
                        (t.fp8_param_gather ? ", float8 parameters)" : ")")
        : t.fp8 != Fp8Recipe::kNone
            ? std::string(", float8 linears (torchao, ") + name_of(t.fp8) + " scaling" +
                  (t.fp8_all_gather ? ", float8 all-gather)" : ")")
            : std::string()) +
       "\n       recompute " + name_of(t.recompute) +
       (t.recompute == Recompute::kFull && t.recompute_every > 1
            ? " of 1 layer in " + std::to_string(t.recompute_every) +
                  " (layers l with (l + 1) mod " + std::to_string(t.recompute_every) + " = 0)"
            : std::string()) +
       (t.recompute == Recompute::kSelective && t.attention == AttentionImpl::kFlash
            ? std::string(" (under flash attention it keeps what none keeps: the attention "
                          "scores are never stored)")
            : std::string()) +
       (t.recompute == Recompute::kAuto
            ? std::string(" (per layer, and per all-gather whether to gather again in backward)")
            : std::string(", tp_recompute_allgather ") +
                  (t.tp_recompute_allgather ? "true" : "false") +
                  (t.recompute == Recompute::kNone && t.sp && t.tp > 1 && t.tp_recompute_allgather
                       ? " (the all-gathers re-done in backward are the recompute time below)"
                       : "")) +
       "; grads " + name_of(t.grad_dtype) + "; " +
       name_of(t.optimizer) + ", " + sharding_text(t);
  return s;
}

std::string estimate_to_table(const Estimate& e, const std::string& requested, bool verbose) {
  std::string out = "nanoplan estimate: " + e.model.display_name + " (" + e.model.name;
  if (!requested.empty() && requested != e.model.name) out += ", resolved from '" + requested + "'";
  out += "), " + format_int(e.parameters) + " parameters\nsetup: " + describe_setup(e.setup) + "\n";
  // The verdict first, in one line; the breakdown and the details follow.
  if (e.budget)
    out += std::string("verdict: ") + (e.fits ? "FITS" : "DOES NOT FIT") + ", peak " +
           format_gib(e.peak_bytes) + " per GPU (rank " + std::to_string(e.peak_rank) + ") of " +
           format_gib(*e.budget) + " usable\n";
  out += stage_breakdown(e, e.stages[e.peak_stage]);
  if (e.stages.size() > 1) out += stage_table(e);
  const StageEstimate& s = e.stages[e.peak_stage];
  if (!s.layers.empty())
    out += "\nsaved for backward per layer per micro-batch: " +
           format_binary(s.layers.front().saved_bytes) + " (" +
           format_gb(s.layers.front().saved_bytes) + "; layer " +
           std::to_string(s.layers.front().index) + ", policy " +
           (s.layers.front().policy.rfind("custom", 0) == 0 ? std::string("custom, see the plan")
                                                             : s.layers.front().policy) +
           ")\n";
  out += verdict(e);
  if (!s.live_at_peak.empty()) out += live_at_peak_table(e, s, verbose);
  return out;
}

}  // namespace np

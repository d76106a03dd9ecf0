// What the user sees of an auto plan: the plan per stage, compressed; step time and recompute
// overhead against uniform settings; the nanotron and Megatron settings that come closest.
#include "planner/report/plan_report.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "planner/inputs/units.hpp"
#include "planner/recompute/solve_chunks.hpp"

namespace np {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Short labels of the plan's custom options: "c1", "c2", ... in order of first use (the legend
// spells them out); named policies keep their names.
using Labels = std::map<std::string, std::string>;
Labels custom_labels(const AutoPlan& p) {
  Labels labels;
  for (const BlockPolicy& b : p.layer_policies)
    if (b.name.rfind("custom", 0) == 0 && !labels.count(b.name))
      labels.emplace(b.name, "c" + std::to_string(labels.size() + 1));
  return labels;
}

// "layers 0-3 full, 4-9 none+regather, 10 c1", or by count when the runs are many:
// "layers 0-79: 44 x none+regather, 36 x full".
std::string compress(const AutoPlan& p, const StageProgram& s, const Labels& labels) {
  std::string out;
  const std::vector<int> layers = s.layers();  // several runs of indices when interleaved
  const int n = static_cast<int>(layers.size());
  auto label = [&](int layer) -> const std::string& {
    const std::string& name = p.layer_policies[layer].name;
    auto it = labels.find(name);
    return it == labels.end() ? name : it->second;
  };
  int runs = 0;
  std::vector<std::pair<std::string, int>> counts;
  for (int l = 0; l < n; ++l) {
    const std::string& name = label(layers[l]);
    runs += l == 0 || name != label(layers[l - 1]) || layers[l] != layers[l - 1] + 1;
    auto it =
        std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == name; });
    if (it == counts.end())
      counts.push_back({name, 1});
    else
      ++it->second;
  }
  if (runs > 4) {
    std::sort(counts.begin(), counts.end(),
              [](const auto& a, const auto& b) { return a.second > b.second; });
    out = "layers " + format_ranges(layers) + ": ";
    for (size_t i = 0; i < counts.size(); ++i)
      out += (i ? ", " : "") + std::to_string(counts[i].second) + " x " + counts[i].first;
    return out;
  }
  for (int l = 0; l < n;) {
    int r = l;
    const std::string& name = label(layers[l]);
    while (r + 1 < n && label(layers[r + 1]) == name && layers[r + 1] == layers[r] + 1) ++r;
    out += (out.empty() ? "layers " : ", ") + std::to_string(layers[l]) +
           (r > l ? "-" + std::to_string(layers[r]) : "") + " " + name;
    l = r + 1;
  }
  return out;
}

bool uniform(const AutoPlan& p, const std::string& a, const std::string& b = "") {
  for (const BlockPolicy& bp : p.layer_policies)
    if (bp.name != a && bp.name != b) return false;
  return true;
}

// Megatron's block method re-runs the first N layers of every stage in full and nothing else
// (of every chunk under the interleaved schedule: not mapped here).
int megatron_block_layers(const AutoPlan& p) {
  if (p.schedule.setup.pp_schedule == PpSchedule::kInterleaved) return -1;
  int n = -1;
  for (const StageProgram& s : p.schedule.stages) {
    const std::vector<int> layers = s.layers();
    int k = 0;
    while (k < s.num_layers() && p.layer_policies[layers[k]].name == "full") ++k;
    for (int l = k; l < s.num_layers(); ++l)
      if (p.layer_policies[layers[l]].name.rfind("none", 0) != 0) return -1;
    if (n >= 0 && n != k) return -1;
    n = k;
  }
  return n;
}

std::string equivalents(const AutoPlan& p, int64_t budget) {
  std::string out = "\nnanotron (closest):\n  parallelism:\n";
  bool regather_all = p.gathers == 0 || p.regathered == p.gathers;
  double slower = p.time_full ? p.time_full->seconds - p.time.seconds : 0;
  if (uniform(p, "none", "none+regather")) {
    out += "    recompute_layer: false\n    tp_recompute_allgather: " +
           std::string(regather_all ? "true" : "false") + "\n";
    if (!regather_all && p.regathered > 0)
      out += "  (the plan re-does " + std::to_string(p.regathered) + " of " +
             std::to_string(p.gathers) + " all-gathers; nanotron's flag is all or none)\n";
  } else if (uniform(p, "full")) {
    out += "    recompute_layer: true\n    tp_recompute_allgather: true\n";
  } else {
    bool full_fits = p.peak_full && *p.peak_full <= budget;
    out +=
        "    recompute_layer: " + std::string(full_fits ? "true" : "true  # does not fit either") +
        "\n    tp_recompute_allgather: true\n";
    out +=
        "  not expressible: nanotron recomputes every layer or none; recompute_layer: true costs " +
        fmt("%.3f", slower) + " s more per step (" + fmt("%.1f", 100 * slower / p.time.seconds) +
        "% slower)\n";
  }
  if (!p.schedule.setup.stage_layers.empty())
    out += "  layers per stage " + format_partition(p.schedule.setup.stage_layers) +
           ": not expressible; nanotron balances its stages by compute\n";
  out += "Megatron-LM (closest):\n  ";
  // Megatron's sequence-parallel linears keep the sequence shard and all-gather again in backward,
  // always: a plan keeping gathered tensors runs there with every all-gather re-done.
  const std::string regather_note =
      p.gathers > 0 && p.regathered < p.gathers
          ? "  not expressible: the plan keeps " + std::to_string(p.gathers - p.regathered) +
                " of " + std::to_string(p.gathers) +
                " all-gathered tensors; Megatron's sequence-parallel layers always all-gather "
                "again in backward (more time, less memory than the plan)\n"
          : "";
  int block = megatron_block_layers(p);
  if (uniform(p, "none", "none+regather"))
    out += "(no recompute flags)\n";
  else if (uniform(p, "selective", "selective+regather"))
    out += "--recompute-granularity selective\n";
  else if (block > 0)
    out += "--recompute-granularity full --recompute-method block --recompute-num-layers " +
           std::to_string(block) + "  (exact)\n";
  else
    out +=
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1\n  not "
        "expressible: Megatron's knobs are uniform per stage; full recompute of every layer "
        "costs " +
        fmt("%.3f", slower) + " s more per step\n";
  out += regather_note;
  const std::vector<int64_t>& split = p.schedule.setup.stage_layers;
  if (!split.empty()) {  // a searched partition
    bool middle_even = true;
    for (size_t i = 2; i + 1 < split.size(); ++i) middle_even &= split[i] == split[1];
    if (middle_even && split.size() > 2)
      out += "  --decoder-first-pipeline-num-layers " + std::to_string(split.front()) +
             " --decoder-last-pipeline-num-layers " + std::to_string(split.back()) +
             "  (the layers per stage)\n";
    else if (split.size() == 2)
      out += "  --decoder-first-pipeline-num-layers " + std::to_string(split.front()) +
             "  (the layers per stage)\n";
    else
      out += "  layers per stage " + format_partition(split) +
             ": not expressible; Megatron sets the first and last stages' layer counts only\n";
  }
  return out;
}

}  // namespace

// "2,654,208 recompute choices": every non-wasteful mask, the frontier exact over all of them.
std::string choices_searched(const LayerFrontier& f) {
  return format_int(static_cast<int64_t>(f.choices)) + " recompute choices";
}

std::string step_time_line(const StepTime& t) {
  double overhead = t.seconds > 0 ? t.recompute_seconds / t.seconds : 0;
  std::string on;
  if (!t.hardware.empty())
    on = ", on " + t.hardware + (t.hardware_origin.empty() ? "" : " (" + t.hardware_origin + ")");
  return "predicted step time (cost model) " + fmt("%.3f s", t.seconds) +
         ", recompute on the slowest stage " + fmt("%.3f s", t.recompute_seconds) + " (" +
         fmt("%.1f%%", 100 * overhead) + " of the step), MFU " + fmt("%.1f%%", 100 * t.mfu) +
         ", HFU " + fmt("%.1f%%", 100 * t.hfu) + on + (t.overlap.empty() ? "" : ", " + t.overlap) +
         "\n" + (t.efficiencies.empty() ? "" : "  efficiencies: " + t.efficiencies + "\n");
}

std::string auto_plan_table(const AutoPlan& p, int64_t budget, bool verbose) {
  std::string out =
      "\nrecompute plan (--recompute auto, cheapest that fits " + format_human(budget) + "):\n";
  const Labels labels = custom_labels(p);
  bool unproven = false;  // some interleaved stage's search stopped at its branch limit
  double worst_gap = 0;   // the largest share of such a stage's recompute it may save
  for (size_t i = 0; i < p.schedule.stages.size(); ++i) {
    const StageProgram& s = p.schedule.stages[i];
    const StagePlan& sp = p.stages[i];
    out += "  stage " + std::to_string(s.stage) + ": " + compress(p, s, labels);
    for (const StageBlock& b : s.blocks)
      if (b.kind == BlockKind::kHead) out += "; LM head " + b.policy.name;
    unproven = unproven || !sp.proven;
    if (sp.feasible) {
      out += "; peak " + format_binary(p.estimate.stages[i].peak_bytes);
      if (!sp.proven && sp.recompute > 0)
        worst_gap = std::max(worst_gap, (sp.recompute - sp.recompute_lower) / sp.recompute);
    } else {
      out += std::string("; DOES NOT FIT: the smallest ") + (sp.proven ? "achievable" : "found") +
             " peak is " + format_binary(sp.min_peak) + " (" + format_gb(sp.min_peak) + ")";
    }
    out += sp.proven ? "\n" : " *\n";
  }
  if (unproven)
    out += "  * the solver's search stopped at " + format_int(kChunkSearchBranches) +
           " branches before proving these stages best" +
           (worst_gap > 0 ? "; a cheaper plan would re-run at most " +
                                fmt("%.1f%%", 100 * worst_gap) + " less (per micro-batch)"
                          : "") +
           "\n";
  if (p.gathers > 0)
    out += "  " + std::to_string(p.regathered) + " of " + std::to_string(p.gathers) +
           " all-gathers re-done in backward\n";
  // The legend: what each short label re-runs, and the policy names' suffix.
  std::vector<std::pair<std::string, std::string>> legend(labels.size());
  for (const auto& [name, label] : labels)
    legend[std::stoul(label.substr(1)) - 1] = {label, name.substr(name.find(':') + 2)};
  bool any_regather = std::any_of(
      p.layer_policies.begin(), p.layer_policies.end(),
      [](const BlockPolicy& b) { return b.name.find("+regather") != std::string::npos; });
  if (!legend.empty() || any_regather) out += "  legend:\n";
  for (const auto& [label, what] : legend) out += "    " + label + " = " + what + "\n";
  if (any_regather)
    out +=
        "    +regather = the layer's all-gathers are done again in backward (the sequence shard "
        "is kept)\n";
  if (!p.schedule.setup.stage_layers.empty()) {
    TrainSpec balanced = p.schedule.setup;
    balanced.stage_layers.clear();
    out +=
        "  layers per stage " + format_partition(p.schedule.setup.stage_layers) +
        (p.partition_searched
             ? " (--partition auto: the split whose slowest stage is fastest; balanced by FLOPs: "
             : " (--partition; balanced by FLOPs: ") +
        format_partition(partition_layers(p.schedule.model, balanced)) + ")\n";
  }
  out += "\n" + step_time_line(p.time);
  // The uniform nanotron settings, each named by its flags (the setup's all-gather flag: under SP
  // it decides what "no recompute" keeps).
  const TrainSpec& t = p.schedule.setup;
  const std::string regather = t.sp ? std::string(", tp_recompute_allgather: ") +
                                          (t.tp_recompute_allgather ? "true" : "false")
                                    : "";
  auto compared = [&](const char* layer, const StepTime& time, int64_t peak) {
    double gain = time.seconds > 0 ? 100 * (time.seconds - p.time.seconds) / time.seconds : 0;
    std::string line = "  vs recompute_layer: " + std::string(layer) + regather + ": " +
                       fmt("%.3f s", time.seconds) + ", peak " + format_gib(peak) +
                       (peak <= budget ? " (fits)" : " (does not fit)");
    if (gain >= 0.05) line += "; the plan is " + fmt("%.1f%%", gain) + " faster";
    return line + "\n";
  };
  if (p.time_none) out += compared("false", *p.time_none, *p.peak_none);
  if (p.time_full) out += compared("true", *p.time_full, *p.peak_full);
  // torchtitan's own settings: its default under FSDP2 and, under its profile, per-op.
  auto torchtitan = [&](const std::string& setting, const StepTime& time, int64_t peak) {
    const double gain = 100 * (time.seconds - p.time.seconds) / time.seconds;
    out += "  vs torchtitan's selective_ac_option " + setting + ": " +
           fmt("%.3f s", time.seconds) + ", peak " + format_gib(peak) +
           (peak <= budget ? " (fits)" : " (does not fit)") +
           (gain >= 0.05 ? "; the plan is " + fmt("%.1f%%", gain) + " faster" : std::string()) +
           "\n";
  };
  if (p.time_every)
    torchtitan("\"" + std::to_string(p.every) + "\" (layers l with (l + 1) mod " +
                   std::to_string(p.every) + " = 0 in full)",
               *p.time_every, *p.peak_every);
  if (p.time_op) torchtitan("\"op\" (per-op, every layer)", *p.time_op, *p.peak_op);
  out += equivalents(p, budget);
  if (!verbose)
    return out + "\n(--verbose: the layer options the planner chose from, bytes and time)\n";
  out += "\nlayer options: " + std::to_string(p.frontier.options.size()) + " on the frontier of " +
         choices_searched(p.frontier) +
         " (kept / working bytes per micro-batch, recompute time; * a convex-hull vertex found "
         "by\n  the lambda-swept minimum cut; --format json lists them all):\n";
  for (size_t i = 0; i < p.frontier.options.size(); ++i) {
    size_t n = p.frontier.options.size();
    bool used = false;  // by an MoE layer, in a mixed model (the dense layers' are listed below)
    for (size_t l = 0; l < p.layer_policies.size(); ++l)
      used |= !dense_layer(p.schedule.model, static_cast<int64_t>(l)) &&
              p.layer_policies[l].name == p.option_names[i];
    bool named = false;
    for (const NamedPoint& np_ : p.frontier.named)
      named |= np_.on_frontier == static_cast<int>(i) || np_.dominated_by == static_cast<int>(i);
    if (n > 12 && !used && !named && i != 0 && i + 1 != n) continue;
    const LayerOption& o = p.frontier.options[i];
    char buf[512];
    std::snprintf(buf, sizeof buf, "  %2zu%s %12s  %12s  %9.3f ms  %s\n", i,
                  p.frontier.on_hull[i] ? "*" : " ", format_binary(o.kept_bytes).c_str(),
                  format_binary(o.working_bytes).c_str(), 1e3 * o.cost, p.option_names[i].c_str());
    out += buf;
  }
  for (const NamedPoint& n : p.frontier.named)
    out += "  " + n.name + ": " +
           (n.on_frontier >= 0 ? "on the frontier (option " + std::to_string(n.on_frontier) + ")"
                               : "dominated by option " + std::to_string(n.dominated_by)) +
           "\n";
  if (!p.dense_frontier.options.empty()) {  // a mixed model: the dense layers' own options
    out += "dense layer options (the MoE model's dense layers): " +
           std::to_string(p.dense_frontier.options.size()) + " on the frontier of " +
           choices_searched(p.dense_frontier) + ":\n";
    for (size_t i = 0; i < p.dense_frontier.options.size(); ++i) {
      const LayerOption& o = p.dense_frontier.options[i];
      char buf[512];
      std::snprintf(buf, sizeof buf, "  %2zu%s %12s  %12s  %9.3f ms  %s\n", i,
                    p.dense_frontier.on_hull[i] ? "*" : " ", format_binary(o.kept_bytes).c_str(),
                    format_binary(o.working_bytes).c_str(), 1e3 * o.cost,
                    p.dense_option_names[i].c_str());
      out += buf;
    }
  }
  return out;
}

nlohmann::json auto_plan_json(const AutoPlan& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (size_t i = 0; i < p.schedule.stages.size(); ++i) {
    const StageProgram& s = p.schedule.stages[i];
    nlohmann::json layers = nlohmann::json::array();
    for (const StageBlock& b : s.blocks)
      if (b.kind == BlockKind::kLayer)
        layers.push_back(
            {{"index", b.layer}, {"option", b.policy.name}, {"kept_bytes", b.saved.bytes}});
    nlohmann::json st = {{"stage", s.stage},
                         {"peak_bytes", p.estimate.stages[i].peak_bytes},
                         {"feasible", p.stages[i].feasible},
                         {"num_layers", s.num_layers()},
                         {"layers", layers}};
    for (const StageBlock& b : s.blocks)
      if (b.kind != BlockKind::kLayer)
        st[b.kind == BlockKind::kHead ? "head_option" : "embedding_option"] = b.policy.name;
    if (!p.stages[i].feasible) st["min_peak_bytes"] = p.stages[i].min_peak;
    st["proven"] = p.stages[i].proven;
    if (!p.stages[i].proven && p.stages[i].feasible) {
      st["recompute_seconds_per_microbatch"] = p.stages[i].recompute;
      st["recompute_seconds_lower_bound"] = p.stages[i].recompute_lower;
    }
    stages.push_back(st);
  }
  auto frontier_json = [](const LayerFrontier& f, const std::vector<std::string>& names) {
    nlohmann::json out = nlohmann::json::array();
    for (size_t i = 0; i < f.options.size(); ++i) {
      const LayerOption& o = f.options[i];
      out.push_back({{"option", names[i]},
                     {"kept_bytes", o.kept_bytes},
                     {"working_bytes", o.working_bytes},
                     {"recompute_seconds", o.cost},
                     {"hull_vertex", static_cast<bool>(f.on_hull[i])}});
    }
    return out;
  };
  nlohmann::json frontier = frontier_json(p.frontier, p.option_names);
  nlohmann::json j = {{"fits", p.fits},
                      {"step_seconds", p.time.seconds},
                      {"recompute_seconds", p.time.recompute_seconds},
                      {"pipeline_p2p_seconds", p.time.p2p_seconds},
                      {"hardware", p.time.hardware},
                      {"hardware_origin", p.time.hardware_origin},
                      {"efficiencies", p.time.efficiencies},
                      {"overlap", p.time.overlap},
                      {"mfu", p.time.mfu},
                      {"hfu", p.time.hfu},
                      {"per_stage", stages},
                      {"frontier", frontier},
                      {"all_gathers_redone", p.regathered},
                      {"all_gathers", p.gathers}};
  if (!p.dense_frontier.options.empty())  // a mixed model's dense layers
    j["dense_frontier"] = frontier_json(p.dense_frontier, p.dense_option_names);
  if (p.time_none) j["step_seconds_no_recompute"] = p.time_none->seconds;
  if (p.time_full) j["step_seconds_recompute_layer"] = p.time_full->seconds;
  if (p.time_every) {
    j["step_seconds_torchtitan_every_layers"] = p.time_every->seconds;
    j["peak_bytes_torchtitan_every_layers"] = *p.peak_every;
    j["torchtitan_every_layers"] = p.every;
  }
  if (p.time_op) {
    j["step_seconds_torchtitan_op"] = p.time_op->seconds;
    j["peak_bytes_torchtitan_op"] = *p.peak_op;
  }
  return j;
}

}  // namespace np

// Comparison of predicted and measured peaks, and its table and JSON forms.
#include "executor/compare.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "executor/params.hpp"
#include "planner/schedule/caching_allocator.hpp"
#include "planner/schedule/plan_io.hpp"
#include "planner/schedule/simulate.hpp"
#include "planner/inputs/units.hpp"

namespace np::exec {

namespace {

std::string describe(const StageProgram& p, const RankResult& r, const MemEvent* e) {
  if (!e) return "nothing";
  std::string name =
      e->tensor >= 0 ? p.tensor_name(e->tensor) : "unplanned " + r.unplanned.at(-e->tensor - 1);
  return std::string(e->alloc ? "alloc " : "free ") + name + " (" + format_int(e->bytes) + " B)";
}

// The first event of one step where measured and predicted differ, with the measured live set
// just before it.
std::optional<Divergence> first_divergence(const StageProgram& p, const RankResult& r, int step,
                                           const std::vector<MemEvent>& predicted,
                                           const std::vector<MemEvent>& measured,
                                           std::map<int32_t, int64_t>& live) {
  size_t n = std::max(predicted.size(), measured.size());
  for (size_t k = 0; k < n; ++k) {
    const MemEvent* pe = k < predicted.size() ? &predicted[k] : nullptr;
    const MemEvent* me = k < measured.size() ? &measured[k] : nullptr;
    if (pe && me && *pe == *me) {
      if (me->alloc)
        live[me->tensor] = me->bytes;
      else
        live.erase(me->tensor);
      continue;
    }
    Divergence d;
    d.step = step, d.event = k;
    d.instr = pe && me ? std::min(pe->instr, me->instr) : pe ? pe->instr : me->instr;
    d.instr_name = d.instr >= 0 ? p.instr_name(p.instrs.at(d.instr)) : "";
    d.predicted = describe(p, r, pe);
    d.measured = describe(p, r, me);
    for (auto [id, bytes] : live) {
      d.live.push_back({id >= 0 ? p.tensor_name(id) : "unplanned " + r.unplanned.at(-id - 1), bytes,
                        id >= 0 ? p.tensors[id].category : Category::kTransient});
      d.live_bytes += bytes;
    }
    std::stable_sort(d.live.begin(), d.live.end(),
                     [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
    return d;
  }
  return std::nullopt;
}

// The devices' level: ranks in groups of r.ranks_per_device share one; the fullest device counts.
std::optional<DeviceLevel> device_level(const RunComparison& c, const RunResult& r,
                                        const RuntimeAssumptions& rt) {
  if (r.ranks.empty() || !r.ranks.front().measured_device_peak) return std::nullopt;
  int64_t per = std::max<int64_t>(1, r.ranks_per_device);
  std::optional<DeviceLevel> best;
  for (size_t first = 0; first < c.ranks.size(); first += static_cast<size_t>(per)) {
    DeviceLevel d;
    size_t last = std::min(c.ranks.size(), first + static_cast<size_t>(per));
    for (size_t i = first; i < last; ++i) {
      const RankComparison& rc = c.ranks[i];
      d.reserved = rc.predicted_reserved.has_value();
      d.allocator_peaks += rc.predicted_reserved.value_or(rc.predicted);
      d.measured_reserved += rc.measured_reserved.value_or(0);
      d.measured = std::max(d.measured, r.ranks[i].measured_device_peak.value_or(0));
    }
    int64_t n = static_cast<int64_t>(last - first);
    d.context = rt.cuda_context_bytes;
    d.workspaces = n * rt.cublas_workspace_bytes;
    d.nccl = per == 1 && c.setup.tp > 1 ? rt.nccl_bytes_per_comm : 0;
    for (size_t i = first; i < last; ++i)
      for (const LiveAllocation& b : r.ranks[i].runtime_buffers)
        if (b.name == kFsdpStagingName) d.executor_buffers += b.bytes;
    d.predicted = d.allocator_peaks + d.context + d.workspaces + d.nccl + d.executor_buffers;
    if (!best || d.measured > best->measured) best = d;
  }
  best->measured_overheads = r.ranks.front().measured_overheads;
  return best;
}

}  // namespace

RunComparison compare(const Schedule& s, const RunResult& r, std::string title,
                      const RuntimeAssumptions& runtime, const HardwareModel* hardware) {
  RunComparison c{std::move(title), s.setup, {}, r.losses, true, std::nullopt, runtime};
  std::vector<SimResult> sims;
  for (const StageProgram& p : s.stages)
    sims.push_back(simulate(p, {.live_set = true, .events = true}));
  // Caching: each stage's events in the program's order (as the executor allocates), replayed
  // for as many steps as ran.
  const bool caching = !r.ranks.empty() && r.ranks.front().measured_reserved_peak.has_value();
  std::map<std::pair<int64_t, size_t>, AllocatorReplay> replays;  // (stage, steps)
  auto replay = [&](int64_t stage, size_t steps) -> const AllocatorReplay& {
    auto key = std::pair(stage, steps);
    auto it = replays.find(key);
    if (it != replays.end()) return it->second;
    SimResult natural = simulate(s.stages[static_cast<size_t>(stage)],
                                 {.events = true, .canonical = false});
    return replays
        .emplace(key, replay_exact_steps(natural.events, {}, runtime.allocator.config,
                                         static_cast<int>(std::max<size_t>(steps, 1))))
        .first->second;
  };
  for (const RankResult& rr : r.ranks) {
    const StageProgram& p = s.stages[rr.stage];
    const SimResult& sim = sims[rr.stage];
    RankComparison rc{rr.global_rank,
                      rr.stage,
                      rr.dp_rank,
                      rr.cp_rank,
                      rr.tp_rank,
                      sim.peak_bytes,
                      rr.measured_peak,
                      sim.at_peak,
                      rr.measured_at_peak,
                      sim.peak_instr >= 0 ? p.instr_name(p.instrs[sim.peak_instr]) : "",
                      {},
                      {},
                      rr.unplanned,
                      rr.runtime_buffers};
    // Steps after the first allocate no statics: they stay from step to step.
    std::vector<MemEvent> later;
    for (const MemEvent& e : sim.events)
      if (!(e.alloc && p.tensors[e.tensor].kind == ValueKind::kStatic)) later.push_back(e);
    std::map<int32_t, int64_t> live;
    for (size_t step = 0; step < rr.events.size() && !rc.divergence; ++step) {
      const std::vector<MemEvent>& predicted = step == 0 ? sim.events : later;
      rc.divergence =
          first_divergence(p, rr, static_cast<int>(step), predicted, rr.events[step], live);
      rc.events += rc.divergence ? rc.divergence->event : predicted.size();
    }
    if (rr.events.empty()) rc.divergence = Divergence{.predicted = "events", .measured = "none"};
    if (caching) {
      const AllocatorReplay& a = replay(rr.stage, rr.events.size());
      rc.predicted_reserved = a.max_reserved;
      rc.predicted_allocated_blocks = a.max_allocated;
      rc.measured_reserved = rr.measured_reserved_peak;
      rc.measured_allocated_blocks = rr.measured_allocated_blocks_peak;
    }
    if (!rc.equal()) {
      c.all_equal = false;
      for (int32_t id : sim.live_at_peak)
        rc.predicted_live.push_back(
            {p.tensor_name(id), p.tensors[id].bytes, p.tensors[id].category});
      std::stable_sort(rc.predicted_live.begin(), rc.predicted_live.end(),
                       [](auto& a, auto& b) { return a.bytes > b.bytes; });
      rc.measured_live = rr.live_at_peak;
    }
    c.ranks.push_back(std::move(rc));
  }
  c.device = device_level(c, r, runtime);
  for (const RankResult& rr : r.ranks)
    for (size_t i = 0; i < rr.step_seconds.size(); ++i) {
      if (c.step_seconds.size() <= i) c.step_seconds.push_back(0);
      c.step_seconds[i] = std::max(c.step_seconds[i], rr.step_seconds[i]);
    }
  if (hardware) {
    StepTime st = step_time(s, *hardware);
    c.predicted_step_seconds = st.seconds, c.predicted_recompute_seconds = st.recompute_seconds;
    c.hardware = hardware->name;
  }
  return c;
}

namespace {

std::string side_by_side(const RankComparison& r) {
  std::string out = "    live at the predicted peak (" + r.predicted_peak_at +
                    ")  |  live at the measured peak\n";
  size_t n = std::max(r.predicted_live.size(), r.measured_live.size());
  for (size_t i = 0; i < n; ++i) {
    char buf[512];
    std::string left = i < r.predicted_live.size()
                           ? format_int(r.predicted_live[i].bytes) + " " + r.predicted_live[i].name
                           : "";
    std::string right = i < r.measured_live.size()
                            ? format_int(r.measured_live[i].bytes) + " " + r.measured_live[i].name
                            : "";
    std::snprintf(buf, sizeof buf, "    %-60s | %s\n", left.c_str(), right.c_str());
    out += buf;
  }
  for (const std::string& u : r.unplanned) out += "    not in the plan: " + u + "\n";
  return out;
}

nlohmann::json runtime_json(const std::vector<LiveAllocation>& buffers) {
  nlohmann::json out = nlohmann::json::array();
  for (const LiveAllocation& b : buffers) out.push_back({{"name", b.name}, {"bytes", b.bytes}});
  return out;
}

std::string divergence_text(const RankComparison& r) {
  const Divergence& d = *r.divergence;
  std::string out = "    first divergence: step " + std::to_string(d.step + 1) + ", event " +
                    std::to_string(d.event) + ", instruction " + std::to_string(d.instr) + " '" +
                    d.instr_name + "'\n      predicted: " + d.predicted +
                    "\n      measured:  " + d.measured + "\n      live before it (measured, " +
                    std::to_string(d.live.size()) + " tensors, " + format_int(d.live_bytes) +
                    " B):";
  for (size_t i = 0; i < d.live.size() && i < 6; ++i)
    out += (i ? ", " : " ") + d.live[i].name + " " + format_int(d.live[i].bytes);
  if (d.live.size() > 6) out += ", ...";
  return out + "\n";
}

}  // namespace

std::string comparison_table(const RunComparison& c) {
  std::string out = c.title + "\n";
  const bool cp = c.setup.cp > 1;  // a CP column only where there is context parallelism
  out += std::string("  rank  stage  dp  ") + (cp ? "cp  " : "") +
         "tp   predicted peak B    measured peak B   difference   (the plan's tensors, no runtime "
         "overheads; weights / grads / optim / activ / transient, measured)\n";
  for (const RankComparison& r : c.ranks) {
    char buf[512];
    const auto& m = r.measured_at_peak;
    std::snprintf(
        buf, sizeof buf,
        "  %4lld  %5lld  %2lld  %s%2lld  %17s  %17s  %11s   %s / %s / %s / %s / %s%s\n",
        (long long)r.rank, (long long)r.stage, (long long)r.dp_rank,
        cp ? (std::string(r.cp_rank < 10 ? " " : "") + std::to_string(r.cp_rank) + "  ").c_str()
           : "",
        (long long)r.tp_rank, format_int(r.predicted).c_str(), format_int(r.measured).c_str(),
        format_int(r.difference()).c_str(), format_int(m[0]).c_str(), format_int(m[1]).c_str(),
        format_int(m[2]).c_str(), format_int(m[3]).c_str(), format_int(m[4]).c_str(),
        r.predicted_at_peak == r.measured_at_peak ? "" : "  (categories differ)");
    out += buf;
    if (r.measured_reserved) {
      std::snprintf(buf, sizeof buf,
                    "        reserved (caching allocator): predicted %s, measured %s; allocated "
                    "blocks: predicted %s, measured %s%s\n",
                    format_int(*r.predicted_reserved).c_str(),
                    format_int(*r.measured_reserved).c_str(),
                    format_int(*r.predicted_allocated_blocks).c_str(),
                    format_int(r.measured_allocated_blocks.value_or(0)).c_str(),
                    r.predicted_reserved == r.measured_reserved &&
                            r.predicted_allocated_blocks == r.measured_allocated_blocks
                        ? ""
                        : "  (DIFFER)");
      out += buf;
    }
    if (r.divergence) out += divergence_text(r);
    if (r.difference() != 0 || !r.unplanned.empty()) out += side_by_side(r);
  }
  // Runtime buffers, as rank 0 reports them (every rank of a backend allocates the same).
  if (!c.ranks.empty())
    for (const LiveAllocation& b : c.ranks.front().runtime_buffers)
      out += "  runtime buffer outside the plan, per rank: " + b.name + " " + format_int(b.bytes) +
             (b.name == kFsdpStagingName
                  ? " B (the executor's own, which PyTorch does not have: not in the estimate)\n"
                  : " B (the estimate counts it among the runtime overheads)\n");
  if (c.device) {
    const DeviceLevel& d = *c.device;
    char pct[32];
    std::snprintf(pct, sizeof pct, "%+.2f %%", 100.0 * d.error());
    out += "  device level (cudaMemGetInfo, the fullest device): predicted " +
           format_int(d.predicted) + " B = " +
           (d.reserved ? "reserved peaks (caching allocator) " : "allocator peaks ") +
           format_int(d.allocator_peaks) +
           " + CUDA context " + format_int(d.context) + " + cuBLAS workspaces " +
           format_int(d.workspaces) + (d.nccl ? " + NCCL " + format_int(d.nccl) : std::string()) +
           (d.executor_buffers ? " + the executor's FSDP staging " + format_int(d.executor_buffers)
                               : std::string()) +
           "; measured " + format_int(d.measured) + " B (" + pct + ")" +
           (d.reserved ? ", of it reserved by the allocator " + format_int(d.measured_reserved) +
                             " B"
                       : std::string()) +
           "\n";
    for (const LiveAllocation& o : d.measured_overheads)
      out += "  measured at start, rank 0: " + o.name + " " + format_int(o.bytes) + " B\n";
  }
  if (!c.step_seconds.empty()) {
    out += "  step time (wall, the slowest rank):";
    for (double t : c.step_seconds) {
      char buf[32];
      std::snprintf(buf, sizeof buf, " %.4f s", t);
      out += buf;
    }
    if (c.predicted_step_seconds) {
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "; the cost model predicts %.4f s (%.4f s of it recompute) on %s",
                    *c.predicted_step_seconds, *c.predicted_recompute_seconds, c.hardware.c_str());
      out += buf;
    }
    out += "\n";
  }
  out += "  loss per step:";
  for (double l : c.losses) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " %.6f", l);
    out += buf;
  }
  size_t events = 0;
  for (const RankComparison& r : c.ranks) events += r.events;
  out += c.all_equal ? "\n  predicted = measured on every rank: " + format_int(events) +
                           " allocation and release events, each equal\n"
                     : "\n  PREDICTED != MEASURED (see the divergence and live sets above)\n";
  return out;
}

nlohmann::json comparison_json(const RunComparison& c) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankComparison& r : c.ranks) {
    nlohmann::json cats = nlohmann::json::object();
    for (int k = 0; k < kCategories; ++k)
      cats[name_of(static_cast<Category>(k))] = {{"predicted", r.predicted_at_peak[k]},
                                                 {"measured", r.measured_at_peak[k]}};
    nlohmann::json j = {{"rank", r.rank},
                        {"pp_stage", r.stage},
                        {"dp_rank", r.dp_rank},
                        {"cp_rank", r.cp_rank},
                        {"tp_rank", r.tp_rank},
                        {"predicted_peak_bytes", r.predicted},
                        {"measured_peak_bytes", r.measured},
                        {"difference_bytes", r.difference()},
                        {"categories", cats},
                        {"unplanned", r.unplanned},
                        {"runtime_buffers", runtime_json(r.runtime_buffers)},
                        {"events_compared", r.events}};
    if (r.measured_reserved) {
      j["predicted_reserved_bytes"] = *r.predicted_reserved;
      j["measured_reserved_bytes"] = *r.measured_reserved;
      j["predicted_allocated_blocks_bytes"] = *r.predicted_allocated_blocks;
      j["measured_allocated_blocks_bytes"] = r.measured_allocated_blocks.value_or(0);
    }
    if (r.divergence) {
      const Divergence& d = *r.divergence;
      nlohmann::json live = nlohmann::json::array();
      for (const LiveAllocation& t : d.live) live.push_back({{"name", t.name}, {"bytes", t.bytes}});
      j["first_divergence"] = {{"step", d.step},
                               {"event", d.event},
                               {"instruction", d.instr},
                               {"instruction_name", d.instr_name},
                               {"predicted", d.predicted},
                               {"measured", d.measured},
                               {"live_bytes", d.live_bytes},
                               {"live", live}};
    }
    if (!r.predicted_live.empty() || !r.measured_live.empty()) {
      nlohmann::json pl = nlohmann::json::array(), ml = nlohmann::json::array();
      for (const LiveTensor& t : r.predicted_live)
        pl.push_back({{"name", t.name}, {"bytes", t.bytes}});
      for (const LiveAllocation& t : r.measured_live)
        ml.push_back({{"name", t.name}, {"bytes", t.bytes}});
      j["predicted_live_at_peak"] = pl;
      j["measured_live_at_peak"] = ml;
    }
    ranks.push_back(j);
  }
  nlohmann::json out = {
      {"title", c.title},
      {"setup", setup_to_json(c.setup)},
      {"ranks", ranks},
      {"loss", c.losses.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.losses.back())},
      {"losses", c.losses},
      {"steps", c.losses.size()},
      {"predicted_equals_measured", c.all_equal}};
  out["measured_step_seconds"] = c.step_seconds;
  if (c.predicted_step_seconds) {
    out["predicted_step_seconds"] = *c.predicted_step_seconds;
    out["predicted_recompute_seconds"] = *c.predicted_recompute_seconds;
    out["cost_model_gpu"] = c.hardware;
  }
  if (c.device) {
    const DeviceLevel& d = *c.device;
    out["predicted_device_peak_bytes"] = d.predicted;
    out["measured_device_peak_bytes"] = d.measured;
    if (d.reserved) out["measured_reserved_on_device_bytes"] = d.measured_reserved;
    out["device_prediction_terms"] = {{d.reserved ? "reserved_peaks" : "allocator_peaks",
                                       d.allocator_peaks},
                                      {"cuda_context", d.context},
                                      {"cublas_workspaces", d.workspaces},
                                      {"nccl", d.nccl},
                                      {"executor_buffers", d.executor_buffers}};
    out["measured_overheads"] = runtime_json(d.measured_overheads);
  }
  return out;
}

}  // namespace np::exec

// The HTML report (html_report.hpp): figures drawn as inline SVG here, so the file needs nothing
// but a browser.
#include "planner/report/html_report.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>

#include "planner/report/report.hpp"
#include "planner/inputs/units.hpp"

namespace np {
namespace {

// The binary unit whose figures suit a largest value: KiB, MiB or GiB (the memory of a tiny model
// on a GiB axis reads 0.0 everywhere).
struct AxisUnit {
  double bytes;
  const char* name;
};
AxisUnit axis_unit(double largest) {
  if (largest >= 4.0 * (1 << 30)) return {1.0 * (1 << 30), "GiB"};
  if (largest >= 4.0 * (1 << 20)) return {1.0 * (1 << 20), "MiB"};
  return {1024.0, "KiB"};
}


std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v, const char* f = "%.1f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

constexpr std::array<const char*, kCategories> kColors = {"#4e79a7", "#f28e2b", "#e15759",
                                                          "#76b7b2", "#59a14f"};

// Bytes by category after each event, at most `points` samples (each the event of the largest
// total in its bucket, so the peak survives).
struct Series {
  std::vector<std::array<double, kCategories>> stacks;  // cumulative tops per category
  std::vector<double> x;                                // event index
  double peak = 0, peak_x = 0;
  size_t events = 0;
};

Series series(const StageProgram& p, const std::vector<MemEvent>& events, size_t points) {
  Series s;
  s.events = events.size();
  std::array<int64_t, kCategories> live{};
  std::vector<std::pair<size_t, std::array<int64_t, kCategories>>> all;
  all.reserve(events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    const MemEvent& e = events[i];
    int c = e.tensor >= 0 && static_cast<size_t>(e.tensor) < p.tensors.size()
                ? static_cast<int>(p.tensors[e.tensor].category)
                : static_cast<int>(Category::kTransient);
    live[c] += e.alloc ? e.bytes : -e.bytes;
    all.push_back({i, live});
  }
  auto total = [](const std::array<int64_t, kCategories>& a) {
    int64_t t = 0;
    for (int64_t v : a) t += v;
    return t;
  };
  size_t bucket = std::max<size_t>(1, (all.size() + points - 1) / std::max<size_t>(1, points));
  for (size_t b = 0; b < all.size(); b += bucket) {
    size_t best = b;
    for (size_t i = b; i < std::min(all.size(), b + bucket); ++i)
      if (total(all[i].second) > total(all[best].second)) best = i;
    std::array<double, kCategories> top{};
    double acc = 0;
    for (int c = 0; c < kCategories; ++c) top[c] = acc += static_cast<double>(all[best].second[c]);
    s.stacks.push_back(top);
    s.x.push_back(static_cast<double>(all[best].first));
    if (acc > s.peak) s.peak = acc, s.peak_x = static_cast<double>(all[best].first);
  }
  return s;
}

// The memory of one stage's first rank over a step, stacked by category.
std::string memory_figure(const StageProgram& p, const StageEstimate& est,
                          std::optional<int64_t> budget, const std::vector<MemEvent>* measured,
                          const std::string& measured_by) {
  SimResult sim = simulate(p, {.events = true});
  Series pred = series(p, sim.events, 1200);
  std::optional<Series> meas;
  if (measured && !measured->empty()) meas = series(p, *measured, 1200);
  const double W = 960, H = 300, L = 70, B = 30, T = 12;
  double xmax = std::max<double>(1, static_cast<double>(pred.events));
  double ymax = std::max(pred.peak, meas ? meas->peak : 0.0);
  if (budget) ymax = std::max(ymax, static_cast<double>(*budget));
  ymax *= 1.08;
  auto X = [&](double x) { return L + (W - L - 10) * x / xmax; };
  auto Y = [&](double y) { return T + (H - T - B) * (1 - y / std::max(1.0, ymax)); };
  std::string svg = "<svg class=\"figure memory\" id=\"memory-stage-" + std::to_string(p.stage) +
                    "\" viewBox=\"0 0 " + num(W, "%.0f") + " " + num(H, "%.0f") +
                    "\" role=\"img\" aria-label=\"memory of pipeline stage " +
                    std::to_string(p.stage) + " over one step\">\n";
  // Stacked areas, top category first so lower ones paint over.
  for (int c = kCategories - 1; c >= 0; --c) {
    std::string pts;
    for (size_t i = 0; i < pred.x.size(); ++i)
      pts += num(X(pred.x[i]), "%.1f") + "," + num(Y(pred.stacks[i][c]), "%.1f") + " ";
    pts += num(X(pred.x.empty() ? 0 : pred.x.back()), "%.1f") + "," + num(Y(0), "%.1f") + " " +
           num(X(pred.x.empty() ? 0 : pred.x.front()), "%.1f") + "," + num(Y(0), "%.1f");
    svg += "<polygon points=\"" + pts + "\" fill=\"" + kColors[c] + "\" fill-opacity=\"0.85\"><title>" +
           name_of(static_cast<Category>(c)) + "</title></polygon>\n";
  }
  if (meas) {
    std::string pts;
    for (size_t i = 0; i < meas->x.size(); ++i)
      pts += num(X(meas->x[i]), "%.1f") + "," + num(Y(meas->stacks[i][kCategories - 1]), "%.1f") + " ";
    svg += "<polyline class=\"measured\" points=\"" + pts +
           "\" fill=\"none\" stroke=\"#000\" stroke-width=\"1.5\" stroke-dasharray=\"5 3\"><title>measured by " +
           esc(measured_by) + "</title></polyline>\n";
  }
  if (budget) {
    double y = Y(static_cast<double>(*budget));
    svg += "<line x1=\"" + num(L) + "\" x2=\"" + num(W - 10) + "\" y1=\"" + num(y) + "\" y2=\"" +
           num(y) + "\" stroke=\"#b00\" stroke-dasharray=\"2 2\"/><text x=\"" + num(W - 12) +
           "\" y=\"" + num(y - 4) + "\" text-anchor=\"end\" fill=\"#b00\">budget " +
           esc(format_gib(*budget)) + "</text>\n";
  }
  double px = X(pred.peak_x), py = Y(pred.peak);
  svg += "<line class=\"peak\" x1=\"" + num(px) + "\" x2=\"" + num(px) + "\" y1=\"" + num(py) +
         "\" y2=\"" + num(Y(0)) + "\" stroke=\"#000\"/><circle cx=\"" + num(px) + "\" cy=\"" +
         num(py) + "\" r=\"3\"/><text x=\"" + num(std::min(px + 4, W - 200)) + "\" y=\"" +
         num(py + 12) + "\">peak " + esc(format_gib(static_cast<int64_t>(pred.peak))) + " at " +
         esc(est.peak_at) + "</text>\n";
  const AxisUnit u = axis_unit(ymax);
  for (int k = 0; k <= 4; ++k) {  // y axis in the unit that suits the data
    double v = ymax * k / 4;
    svg += "<text x=\"" + num(L - 6) + "\" y=\"" + num(Y(v) + 4) + "\" text-anchor=\"end\">" +
           num(v / u.bytes) + "</text><line x1=\"" + num(L) + "\" x2=\"" + num(W - 10) + "\" y1=\"" +
           num(Y(v)) + "\" y2=\"" + num(Y(v)) + "\" stroke=\"#ddd\"/>\n";
  }
  svg += "<text x=\"12\" y=\"" + num(H / 2) + "\" transform=\"rotate(-90 12 " + num(H / 2) +
         ")\" text-anchor=\"middle\">" + u.name + "</text><text x=\"" + num((W + L) / 2) + "\" y=\"" +
         num(H - 6) + "\" text-anchor=\"middle\">allocations and releases of one step (" +
         std::to_string(pred.events) + " events)</text>\n</svg>\n";
  return svg;
}

std::string legend() {
  std::string out = "<p class=\"legend\">";
  for (int c = 0; c < kCategories; ++c)
    out += std::string("<span><i style=\"background:") + kColors[c] + "\"></i>" +
           name_of(static_cast<Category>(c)) + "</span> ";
  return out + "<span><i class=\"dash\"></i>measured (when a run is given)</span></p>\n";
}

// The plan per layer: one cell per decoder layer, coloured by its recompute option.
std::string plan_strip(const Schedule& s) {
  std::map<std::string, int> ids;
  std::vector<std::pair<int, std::string>> layers;  // layer, option
  for (const StageProgram& st : s.stages)
    for (const StageBlock& b : st.blocks)
      if (b.kind == BlockKind::kLayer) {
        ids.emplace(b.policy.name, static_cast<int>(ids.size()));
        layers.push_back({b.layer, b.policy.name});
      }
  std::sort(layers.begin(), layers.end());
  static const char* palette[] = {"#bab0ac", "#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                  "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"};
  const double W = 960, cell = std::min(24.0, (W - 20) / std::max<size_t>(1, layers.size()));
  std::string svg = "<svg class=\"figure strip\" id=\"plan-strip\" viewBox=\"0 0 " + num(W, "%.0f") +
                    " 60\" role=\"img\" aria-label=\"recompute option per layer\">\n";
  for (size_t i = 0; i < layers.size(); ++i) {
    int id = ids[layers[i].second] % 10;
    svg += "<rect x=\"" + num(10 + i * cell) + "\" y=\"8\" width=\"" + num(cell - 1) +
           "\" height=\"28\" fill=\"" + palette[id] + "\"><title>layer " +
           std::to_string(layers[i].first) + ": " + esc(layers[i].second) + "</title></rect>\n";
    if (layers[i].first % 10 == 0)
      svg += "<text x=\"" + num(10 + i * cell) + "\" y=\"52\">" + std::to_string(layers[i].first) + "</text>\n";
  }
  svg += "</svg>\n<ul class=\"options\">\n";
  std::vector<std::pair<int, std::string>> names;
  for (const auto& [n, id] : ids) names.push_back({id, n});
  std::sort(names.begin(), names.end());
  for (const auto& [id, n] : names)
    svg += std::string("<li><i style=\"background:") + palette[id % 10] + "\"></i>" + esc(n) + "</li>\n";
  return svg + "</ul>\n";
}

// The layer options on the frontier: kept bytes against recompute time, the chosen ones marked.
std::string frontier_figure(const AutoPlan& p) {
  const auto& opts = p.frontier.options;
  if (opts.empty()) return "";
  std::vector<bool> used(opts.size(), false);
  for (size_t l = 0; l < p.layer_policies.size(); ++l) {
    if (dense_layer(p.schedule.model, static_cast<int64_t>(l))) continue;  // the other frontier
    for (size_t o = 0; o < opts.size(); ++o)
      if (p.option_names[o] == p.layer_policies[l].name) used[o] = true;
  }
  double xmax = 1, ymax = 1e-6;
  for (const LayerOption& o : opts)
    xmax = std::max(xmax, static_cast<double>(o.kept_bytes)), ymax = std::max(ymax, o.cost);
  const double W = 960, H = 300, L = 70, B = 34, T = 12;
  auto X = [&](double x) { return L + (W - L - 20) * x / (xmax * 1.05); };
  auto Y = [&](double y) { return T + (H - T - B) * (1 - y / (ymax * 1.1)); };
  std::string svg = "<svg class=\"figure frontier\" id=\"frontier\" viewBox=\"0 0 960 300\" role=\"img\" "
                    "aria-label=\"layer options: kept bytes against recompute time\">\n";
  std::string path;
  for (size_t i = 0; i < opts.size(); ++i)
    path += (i ? " L" : "M") + num(X(static_cast<double>(opts[i].kept_bytes))) + " " + num(Y(opts[i].cost));
  svg += "<path d=\"" + path + "\" fill=\"none\" stroke=\"#888\"/>\n";
  for (size_t i = 0; i < opts.size(); ++i)
    svg += "<circle cx=\"" + num(X(static_cast<double>(opts[i].kept_bytes))) + "\" cy=\"" +
           num(Y(opts[i].cost)) + "\" r=\"" + (used[i] ? "6" : "3") + "\" fill=\"" +
           (used[i] ? "#e15759" : "#4e79a7") + "\"><title>option " + std::to_string(i) + ": " +
           esc(p.option_names[i]) + "; keeps " + esc(format_binary(opts[i].kept_bytes)) + ", re-runs " +
           num(1e3 * opts[i].cost, "%.3f") + " ms</title></circle>\n";
  const AxisUnit u = axis_unit(xmax * 1.05);
  // Time in ms, or in microseconds for layers that re-run in under a tenth of a millisecond.
  const bool us = ymax * 1.1 < 1e-4;
  for (int k = 0; k <= 4; ++k) {
    double v = ymax * 1.1 * k / 4, b = xmax * 1.05 * k / 4;
    svg += "<text x=\"" + num(L - 6) + "\" y=\"" + num(Y(v) + 4) + "\" text-anchor=\"end\">" +
           num((us ? 1e6 : 1e3) * v, "%.2f") + "</text><text x=\"" + num(X(b)) + "\" y=\"" +
           num(H - 18) + "\" text-anchor=\"middle\">" + num(b / u.bytes, "%.1f") + "</text>\n";
  }
  svg += "<text x=\"14\" y=\"150\" transform=\"rotate(-90 14 150)\" text-anchor=\"middle\">recompute " +
         std::string(us ? "us" : "ms") +
         " per layer and micro-batch</text><text x=\"515\" y=\"296\" text-anchor=\"middle\">kept " +
         u.name + " per layer and micro-batch (red: chosen)</text>\n</svg>\n";
  return svg;
}

// The GPU the times are of, where its figures come from, and what the times overlap.
std::string times_basis(const std::string& gpu, const std::string& origin,
                        const std::string& overlap, const std::string& efficiencies) {
  return "on " + esc(gpu) + (origin.empty() ? "" : " (" + esc(origin) + ")") + ", " +
         esc(overlap) + "; efficiencies: " + esc(efficiencies);
}

std::string sweep_section(const SweepReport& r, const SweepOptions& o) {
  std::string out = "<h2>Sweep</h2>\n<p>" + std::to_string(r.evaluated) + " setups on " +
                    std::to_string(o.gpus) + " GPUs, " + std::to_string(r.fitting.size()) +
                    " fit; the best by predicted throughput (cost model, " +
                    times_basis(o.hw.name, o.hw.origin, overlap_text(o.base),
                                efficiency_basis(o.hw, o.base.impl)) +
                    "):</p>\n";
  size_t n = std::min<size_t>(10, r.fitting.size());
  double best = n ? r.fitting[0].tokens_per_second : 1;
  out += "<table id=\"sweep\"><tr><th>rank</th><th>tp</th><th>cp</th><th>pp</th><th>schedule</th><th>dp</th>"
         "<th>ZeRO</th><th>mbs</th><th>m</th><th>step s</th><th>tokens/s</th><th></th><th>peak GiB</th>"
         "<th>recompute</th></tr>\n";
  for (size_t i = 0; i < n; ++i) {
    const SweepResult& x = r.fitting[i];
    const TrainSpec& t = x.setup;
    out += "<tr><td>" + std::to_string(i + 1) + "</td><td>" + std::to_string(t.tp) + "</td><td>" +
           std::to_string(t.cp) + "</td><td>" + std::to_string(t.pp) + "</td><td>" +
           name_of(t.pp_schedule) + "</td><td>" + std::to_string(t.dp) + "</td><td>" +
           std::to_string(t.zero) + "</td><td>" + std::to_string(t.micro_batch) + "</td><td>" +
           std::to_string(t.microbatches) + "</td><td>" + num(x.step_seconds, "%.3f") + "</td><td>" +
           num(x.tokens_per_second, "%.0f") + "</td><td><svg class=\"bar\" viewBox=\"0 0 100 10\"><rect width=\"" +
           num(100 * x.tokens_per_second / best) + "\" height=\"10\" fill=\"#59a14f\"/></svg></td><td>" +
           num(static_cast<double>(x.peak_bytes) / kGiB, "%.2f") + "</td><td>" + esc(x.recompute) +
           "</td></tr>\n";
  }
  return out + "</table>\n";
}

}  // namespace

std::string html_report(const ReportInput& in) {
  const Estimate& e = in.estimate;
  std::string title = "nanoplan report: " + e.model.display_name;
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + esc(title) +
      "</title>\n<style>\nbody{font:14px/1.4 sans-serif;margin:24px;max-width:1000px;color:#222}"
      "h1{font-size:20px}h2{font-size:16px;margin-top:28px}svg.figure{width:100%;height:auto;"
      "border:1px solid #eee}svg text{font:11px sans-serif}.legend span,.options li{margin-right:14px;"
      "display:inline-block}.legend i,.options i{display:inline-block;width:12px;height:12px;"
      "margin-right:4px;vertical-align:-2px}.legend i.dash{border-top:2px dashed #000;height:0}"
      ".options{list-style:none;padding:0}table{border-collapse:collapse}td,th{padding:2px 8px;"
      "text-align:right;border-bottom:1px solid #eee}svg.bar{width:100px;height:10px}"
      ".fits{color:#2a7}.nofit{color:#b00}code{background:#f4f4f4;padding:1px 4px}\n</style></head>\n<body>\n";
  out += "<h1>" + esc(title) + "</h1>\n<p>" + esc(describe_setup(e.setup)) + "</p>\n";
  if (!in.command.empty()) out += "<p><code>" + esc(in.command) + "</code></p>\n";
  out += "<p id=\"verdict\">peak per GPU <b>" + esc(format_human(e.peak_bytes)) + "</b> on rank " +
         std::to_string(e.peak_rank);
  if (e.budget)
    out += std::string("; budget ") + esc(format_human(*e.budget + e.headroom)) +
           (e.headroom ? ", less headroom " + esc(format_gib(e.headroom)) : std::string()) + ": " +
           (e.fits ? "<b class=\"fits\">FITS</b>" : "<b class=\"nofit\">DOES NOT FIT</b>");
  out += "</p>\n<h2>Memory over one step</h2>\n<p>The first rank of each pipeline stage, from the "
         "schedule's simulation: the plan's tensors (runtime overheads apart), stacked by category.</p>\n";
  out += legend();
  for (size_t i = 0; i < in.schedule.stages.size(); ++i) {
    const StageProgram& p = in.schedule.stages[i];
    out += "<h3>pipeline stage " + std::to_string(p.stage) + "</h3>\n";
    const std::vector<MemEvent>* measured =
        i < in.measured.size() ? &in.measured[i] : nullptr;
    out += memory_figure(p, e.stages[i],
                         e.budget ? std::optional<int64_t>(*e.budget) : std::nullopt, measured,
                         in.measured_by);
  }
  out += "<h2>The plan per layer</h2>\n" + plan_strip(in.schedule);
  if (in.plan) {
    out += "<h2>Layer options</h2>\n<p>Predicted step time (cost model) " +
           num(in.plan->time.seconds, "%.3f") + " s, recompute " +
           num(in.plan->time.recompute_seconds, "%.3f") + " s on the slowest stage; " +
           times_basis(in.plan->time.hardware, in.plan->time.hardware_origin,
                       in.plan->time.overlap, in.plan->time.efficiencies) +
           ".</p>\n" +
           frontier_figure(*in.plan);
  }
  if (in.sweep) out += sweep_section(*in.sweep, in.sweep_options);
  out += "<p><small>nanoplan; every figure in this file is drawn from the schedule and its "
         "simulation (and the run, where given).</small></p>\n</body></html>\n";
  return out;
}

}  // namespace np

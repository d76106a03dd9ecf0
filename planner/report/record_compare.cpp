// A run's memory record against the estimate (record_compare.hpp).
#include "planner/report/record_compare.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "planner/inputs/units.hpp"
#include "planner/schedule/plan_io.hpp"

namespace np {

namespace {
std::optional<double> error_of(const std::optional<int64_t>& measured, int64_t predicted) {
  if (!measured || *measured <= 0) return std::nullopt;
  return 100.0 * static_cast<double>(predicted - *measured) / static_cast<double>(*measured);
}
}  // namespace

std::optional<double> RecordRow::allocated_error() const {
  return error_of(measured_allocated, predicted_allocated);
}
std::optional<double> RecordRow::reserved_error() const {
  return error_of(measured_reserved, predicted_reserved);
}

namespace {
// The measured blocks and the predicted tensors, grouped by size, largest first.
std::vector<LiveSize> match_live(const std::vector<int64_t>& blocks, const StageEstimate& s,
                                 const AllocatorConfig& c) {
  std::map<int64_t, LiveSize, std::greater<>> by_size;
  for (int64_t b : blocks) {
    LiveSize& l = by_size[b];
    l.bytes = b;
    ++l.measured;
  }
  auto predict = [&](const std::string& name, int64_t bytes) {
    if (bytes <= 0) return;
    int64_t b = allocator_round_size(bytes, c);
    LiveSize& l = by_size[b];
    l.bytes = b;
    ++l.predicted;
    l.tensors.push_back(name);
  };
  for (const LiveTensor& t : s.live_at_peak) predict(t.name, t.bytes);
  for (const OverheadLine& o : s.overheads)
    if (o.allocator)
      for (int64_t b : allocations_of(o)) predict(o.name, b);
  std::vector<LiveSize> out;
  for (auto& [size, l] : by_size) out.push_back(std::move(l));
  return out;
}

std::string setup_degrees(const TrainSpec& t) {
  return "dp " + std::to_string(t.dp) + " pp " + std::to_string(t.pp) + " tp " +
         std::to_string(t.tp) + " cp " + std::to_string(t.cp);
}
}  // namespace

Result<RecordComparison> compare_records(const std::vector<MemoryRecord>& records,
                                         const Estimate& e) {
  const TrainSpec& t = e.setup;
  const int64_t world = t.gpus();
  RecordComparison c;
  for (const MemoryRecord& rec : records) {
    const std::string fmt = name_of(rec.format);
    if (std::find(c.formats.begin(), c.formats.end(), fmt) == c.formats.end())
      c.formats.push_back(fmt);
    bool csv_match = false;
    std::string csv_runs;
    for (const RecordRank& rr : rec.ranks) {
      if (rr.run) {  // nanotron's benchmark CSV: only the rows that ran this setup
        TrainSpec ran = t;
        ran.dp = rr.run->dp, ran.pp = rr.run->pp, ran.tp = rr.run->tp, ran.cp = rr.run->cp;
        if (ran.dp != t.dp || ran.pp != t.pp || ran.tp != t.tp || ran.cp != t.cp) {
          if (csv_runs.size() < 200)
            csv_runs += (csv_runs.empty() ? "" : "; ") + std::string("line ") +
                        std::to_string(rr.line) + ": " + setup_degrees(ran);
          continue;
        }
        csv_match = true;
      }
      RecordRow row;
      row.file = rec.file, row.format = rec.format;
      if (rr.rank >= 0) {
        // Megatron's default order and torchtitan's mesh: tp fastest, then cp, dp, pp.
        if (rr.rank >= world)
          return make_error(rec.file + ":" + std::to_string(rr.line) + ": rank " +
                            std::to_string(rr.rank) + " is beyond the setup's " +
                            count_noun(world, "GPU") + " (tp " + std::to_string(t.tp) + " x cp " +
                            std::to_string(t.cp) + " x dp " + std::to_string(t.dp) + " x pp " +
                            std::to_string(t.pp) + "); give the run's setup");
        row.rank = rr.rank;
        row.tp = rr.rank % t.tp, row.cp = rr.rank / t.tp % t.cp;
        row.dp = rr.rank / (t.tp * t.cp) % t.dp, row.pp = rr.rank / (t.tp * t.cp * t.dp);
      } else {
        // nanotron's coordinates (a group of one is not printed: 0), ordered (pp, dp, cp, tp).
        struct Coord {
          const char* name;
          std::optional<int64_t> v;
          int64_t degree;
        };
        for (Coord k : {Coord{"PP", rr.pp, t.pp}, Coord{"DP", rr.dp, t.dp}, Coord{"CP", rr.cp, t.cp},
                        Coord{"TP", rr.tp, t.tp}})
          if (k.v.value_or(0) >= k.degree)
            return make_error(rec.file + ":" + std::to_string(rr.line) + ": " + k.name + "=" +
                              std::to_string(*k.v) + " is beyond the setup's degree " +
                              std::to_string(k.degree) + "; give the run's setup");
        row.pp = rr.pp.value_or(0), row.dp = rr.dp.value_or(0), row.cp = rr.cp.value_or(0);
        row.tp = rr.tp.value_or(0);
        row.rank = ((row.pp * t.dp + row.dp) * t.cp + row.cp) * t.tp + row.tp;
      }
      const StageEstimate& s = e.stages.at(static_cast<size_t>(row.pp));
      row.measured_allocated = rr.max_allocated, row.measured_reserved = rr.max_reserved;
      row.measured_device = rr.device_used;
      row.predicted_allocated = s.allocated_peak, row.predicted_reserved = s.reserved_peak;
      if (rec.theoretical && row.pp == 0) row.theoretical = rec.theoretical->total;
      row.line = rr.line, row.context = rr.context;
      if (rec.format == RecordFormat::kSnapshot) {
        row.live = match_live(rr.live_blocks, s, e.runtime.allocator.config);
        row.predicted_peak_at = s.peak_at;
      }
      c.rows.push_back(std::move(row));
    }
    if (rec.format == RecordFormat::kNanotronCsv && !csv_match)
      return make_error(rec.file + ": no row ran the setup's " + setup_degrees(t) +
                        " (its rows: " + csv_runs + "); give the run's setup");
  }
  return c;
}

namespace {
// A snapshot row's blocks at the measured peak beside the predicted live tensors, by size: the
// 20 sizes of most bytes (measured or predicted), then the rest summed, then the totals.
std::string live_table(const RecordRow& r) {
  constexpr size_t kRows = 20;
  auto mib = [](int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(b) / kMiB);
    return std::string(buf);
  };
  auto gib = [](int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f GiB", static_cast<double>(b) / kGiB);
    return std::string(buf);
  };
  std::vector<const LiveSize*> rows;
  int64_t matched = 0, missed = 0, over = 0;
  for (const LiveSize& l : r.live) {
    rows.push_back(&l);
    int64_t both = std::min(l.measured, l.predicted);
    matched += both * l.bytes;
    missed += (l.measured - both) * l.bytes;
    over += (l.predicted - both) * l.bytes;
  }
  auto weight = [](const LiveSize* l) { return std::max(l->measured, l->predicted) * l->bytes; };
  std::stable_sort(rows.begin(), rows.end(),
                   [&](const LiveSize* a, const LiveSize* b) { return weight(a) > weight(b); });
  std::vector<const LiveSize*> shown(rows.begin(), rows.begin() + std::min(kRows, rows.size()));
  std::stable_sort(shown.begin(), shown.end(),
                   [](const LiveSize* a, const LiveSize* b) { return a->bytes > b->bytes; });
  std::string out = "\n  rank " + std::to_string(r.rank) + " (stage " + std::to_string(r.pp) +
                    "): the blocks live at the measured allocated peak (" + r.context +
                    ") beside the tensors live at the predicted peak" +
                    (r.predicted_peak_at.empty() ? "" : " (" + r.predicted_peak_at + ")") +
                    ", by block size\n";
  char buf[1024];
  std::snprintf(buf, sizeof buf, "  %12s %9s %9s  %s\n", "block MiB", "measured", "predicted",
                "predicted tensors");
  out += buf;
  for (const LiveSize* l : shown) {
    // The names in order, a repeated one (an overhead line's blocks) once with its count.
    std::vector<std::pair<std::string, int64_t>> named;
    for (const std::string& n : l->tensors)
      if (!named.empty() && named.back().first == n) ++named.back().second;
      else named.emplace_back(n, 1);
    std::string names;
    for (size_t i = 0; i < named.size() && i < 3; ++i)
      names += (i ? ", " : "") + named[i].first +
               (named[i].second > 1 ? " x" + std::to_string(named[i].second) : "");
    if (named.size() > 3) {
      int64_t rest = 0;
      for (size_t i = 3; i < named.size(); ++i) rest += named[i].second;
      names += ", +" + std::to_string(rest) + " more";
    }
    std::snprintf(buf, sizeof buf, "  %12s %9lld %9lld  %s\n", mib(l->bytes).c_str(),
                  (long long)l->measured, (long long)l->predicted, names.c_str());
    out += buf;
  }
  if (rows.size() > shown.size()) {
    int64_t m = 0, p = 0;
    for (size_t i = shown.size(); i < rows.size(); ++i)
      m += rows[i]->measured * rows[i]->bytes, p += rows[i]->predicted * rows[i]->bytes;
    out += "  " + std::to_string(rows.size() - shown.size()) + " more sizes: " + gib(m) +
           " measured, " + gib(p) + " predicted\n";
  }
  out += "  matched by size " + gib(matched) + "; measured only " + gib(missed) +
         " (the prediction misses); predicted only " + gib(over) + " (it over-counts)\n";
  return out;
}
}  // namespace

std::string record_table(const RecordComparison& c, const Estimate& e) {
  auto gib = [](const std::optional<int64_t>& b) {
    if (!b) return std::string("-");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(*b) / kGiB);
    return std::string(buf);
  };
  auto pct = [](const std::optional<double>& p) {
    if (!p) return std::string("-");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%+.2f %%", *p);
    return std::string(buf);
  };
  bool theoretical = false;
  for (const RecordRow& r : c.rows) theoretical = theoretical || r.theoretical.has_value();
  std::string out = "nanoplan compare: " +
                    count_noun(static_cast<int64_t>(c.rows.size()), "rank") +
                    " recorded, against the estimate of " + e.model.name + " on " +
                    count_noun(e.setup.gpus(), "GPU") + " (tp " + std::to_string(e.setup.tp) +
                    " x cp " + std::to_string(e.setup.cp) + " x dp " + std::to_string(e.setup.dp) +
                    " x pp " + std::to_string(e.setup.pp) + "), allocator " +
                    name_of(e.runtime.allocator.model) + "\n";
  out += "  GiB (2^30 bytes); predicted: torch.cuda.max_memory_allocated() and "
         "max_memory_reserved() as the estimate gives them, without the CUDA context or NCCL\n";
  char head[512];
  std::snprintf(head, sizeof head, "  %5s %5s %3s %3s %3s  %12s %10s %9s  %12s %10s %9s%s  %s\n",
                "rank", "stage", "dp", "cp", "tp", "max alloc", "predicted", "error",
                "max reserved", "predicted", "error", theoretical ? "  Megatron's" : "",
                "from");
  out += head;
  for (const RecordRow& r : c.rows) {
    char buf[768];
    std::string from = r.file + (r.line > 0 ? ":" + std::to_string(r.line) : "") +
                       (r.context.empty() ? "" : " " + r.context);
    std::snprintf(buf, sizeof buf,
                  "  %5lld %5lld %3lld %3lld %3lld  %12s %10s %9s  %12s %10s %9s%s  %s\n",
                  (long long)r.rank, (long long)r.pp, (long long)r.dp, (long long)r.cp,
                  (long long)r.tp, gib(r.measured_allocated).c_str(),
                  gib(r.predicted_allocated).c_str(), pct(r.allocated_error()).c_str(),
                  gib(r.measured_reserved).c_str(), gib(r.predicted_reserved).c_str(),
                  pct(r.reserved_error()).c_str(),
                  theoretical ? ("  " + std::string(11 - std::min<size_t>(11, gib(r.theoretical).size()), ' ') +
                                 gib(r.theoretical)).c_str()
                              : "",
                  from.c_str());
    out += buf;
  }
  if (theoretical)
    out += "  Megatron's: its own estimate (\"Theoretical memory footprints\", total), for rank 0's "
           "stage\n";
  for (const RecordRow& r : c.rows)
    if (!r.live.empty()) out += live_table(r);
  return out;
}

nlohmann::json record_json(const RecordComparison& c, const Estimate& e) {
  auto opt = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  nlohmann::json ranks = nlohmann::json::array();
  for (const RecordRow& r : c.rows) {
    ranks.push_back({{"rank", r.rank},
                     {"pp_stage", r.pp},
                     {"dp_rank", r.dp},
                     {"cp_rank", r.cp},
                     {"tp_rank", r.tp},
                     {"file", r.file},
                     {"line", r.line > 0 ? nlohmann::json(r.line) : nlohmann::json(nullptr)},
                     {"context", r.context},
                     {"measured",
                      {{"max_allocated_bytes", opt(r.measured_allocated)},
                       {"max_reserved_bytes", opt(r.measured_reserved)},
                       {"device_used_bytes", opt(r.measured_device)}}},
                     {"predicted",
                      {{"peak_bytes", r.predicted_allocated},
                       {"reserved_bytes", r.predicted_reserved}}},
                     {"framework_estimate_bytes", opt(r.theoretical)},
                     {"error_percent", opt(r.allocated_error())},
                     {"reserved_error_percent", opt(r.reserved_error())}});
    if (r.format != RecordFormat::kSnapshot) continue;
    nlohmann::json live = nlohmann::json::array();
    for (const LiveSize& l : r.live)
      live.push_back({{"block_bytes", l.bytes},
                      {"measured", l.measured},
                      {"predicted", l.predicted},
                      {"predicted_tensors", l.tensors}});
    ranks.back()["live_at_peak"] = live;
    ranks.back()["predicted_peak_at"] = r.predicted_peak_at;
  }
  std::string format;
  for (const std::string& f : c.formats) format += (format.empty() ? "" : ",") + f;
  return {{"nanoplan_version", 1},
          {"format", format},
          {"setup", setup_to_json(e.setup)},
          {"allocator", name_of(e.runtime.allocator.model)},
          {"ranks", ranks}};
}

}  // namespace np

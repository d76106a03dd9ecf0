// A run's memory record against the estimate (record_compare.hpp).
#include "planner/report/record_compare.hpp"

#include <algorithm>
#include <cstdio>

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

Result<RecordComparison> compare_records(const std::vector<MemoryRecord>& records,
                                         const Estimate& e) {
  const TrainSpec& t = e.setup;
  const int64_t world = t.gpus();
  RecordComparison c;
  for (const MemoryRecord& rec : records) {
    const std::string fmt = name_of(rec.format);
    if (std::find(c.formats.begin(), c.formats.end(), fmt) == c.formats.end())
      c.formats.push_back(fmt);
    for (const RecordRank& rr : rec.ranks) {
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
      c.rows.push_back(std::move(row));
    }
  }
  return c;
}

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
  std::string out = "nanoplan compare: " + std::to_string(c.rows.size()) +
                    " ranks recorded, against the estimate of " + e.model.name + " on " +
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
    std::string from = r.file + ":" + std::to_string(r.line) +
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
  return out;
}

nlohmann::json record_json(const RecordComparison& c, const Estimate& e) {
  auto opt = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  nlohmann::json ranks = nlohmann::json::array();
  for (const RecordRow& r : c.rows)
    ranks.push_back({{"rank", r.rank},
                     {"pp_stage", r.pp},
                     {"dp_rank", r.dp},
                     {"cp_rank", r.cp},
                     {"tp_rank", r.tp},
                     {"file", r.file},
                     {"line", r.line},
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
  std::string format;
  for (const std::string& f : c.formats) format += (format.empty() ? "" : ",") + f;
  return {{"nanoplan_version", 1},
          {"format", format},
          {"setup", setup_to_json(e.setup)},
          {"allocator", name_of(e.runtime.allocator.model)},
          {"ranks", ranks}};
}

}  // namespace np

// Reading a run's memory record (memory_record.hpp). The lines are as the frameworks print them:
// - Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553: megatron/training/utils/common_utils.py,
//   report_memory, L313-334 ("MB" = 1024 * 1024 bytes, two decimals; printed where the
//   data-parallel rank is 0), called as report_memory(f'(after {iteration} iterations)') in
//   megatron/training/training.py L3684-3700; megatron/training/theoretical_memory_usage.py
//   L481-484 (NUM_BYTES_IN_MEGABYTE = 1024 * 1024, L9). Older Megatron printed the same fields
//   with Python's full float repr.
// - nanotron 2411b022a75fb7f7561a1bb4166706da5e1b76de: src/nanotron/logging/base.py, log_memory,
//   L282-294 (MiB, then reset_peak_memory_stats), its formatter L320-395 (ANSI codes, "%(asctime)s
//   [%(levelname)s|EP=|CP=|DP=|PP=|TP=|node]: ", each rank shown only when its group is larger
//   than 1, each line of a message prefixed); src/nanotron/trainer.py L1140-1145 ("[After model
//   building] ... Peak allocated: ..."); global ranks ordered (ep, pp, dp, cp, tp), tp fastest
//   (src/nanotron/parallel/context.py L62-70).
// - torchtitan b5bcd76c66d0acb1a08b176d9639425bc55e0b2a: torchtitan/components/metrics.py L527-536
//   ("memory: {max_reserved_gib:5.2f}GiB({pct:.2f}%)", reserved_bytes.all.peak in GiB, L61-70).
// - nanotron's benchmark CSV, same commit: src/nanotron/helpers.py, create_table_log L622-669
//   ("Mem Alloc (GB)" = max_memory_allocated() / 1024**3 and "Mem Res (GB)" likewise, ".2f";
//   the dp, pp, tp, cp columns), write_to_csv L690-764 (Python's csv.writer, the header when
//   the file is new, a row per run), written by world rank 0 only (L792-793).
// - The snapshot's file name: torchtitan's tools/profiler.py L31-34 and L87-93 (same commit),
//   "{rank:06d}_step_{step}.pickle" under "step_{step:012d}"; earlier torchtitan and many
//   scripts wrote "rank{rank}_memory_snapshot.pickle".
#include "planner/inputs/memory_record.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>

#include "planner/inputs/memory_snapshot.hpp"
#include "planner/inputs/units.hpp"

namespace np {
namespace {

constexpr size_t kMaxLine = 4096;
constexpr char kFormats[] =
    "Megatron-LM's report_memory lines, nanotron's log_memory lines or benchmark CSV, "
    "torchtitan's metrics lines, a PyTorch memory snapshot";

// Drops ANSI colour sequences (ESC [ ... m) and a carriage return at the end.
std::string plain(std::string_view line) {
  std::string out;
  out.reserve(line.size());
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\x1b' && i + 1 < line.size() && line[i + 1] == '[') {
      size_t m = line.find('m', i);
      if (m != std::string_view::npos) {
        i = m;
        continue;
      }
    }
    if (line[i] != '\r') out += line[i];
  }
  return out;
}

// A decimal number of `unit` bytes (as Python prints a float), in bytes; nullopt when not one.
std::optional<int64_t> to_bytes(const std::string& text, double unit) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v < 0 ||
      v * unit > 9.0e18)
    return std::nullopt;
  return static_cast<int64_t>(std::llround(v * unit));
}

struct Reader {
  std::string file;
  MemoryRecord record;
  std::optional<RecordFormat> format;
  std::map<int64_t, RecordRank> ranks;
  std::optional<Error> error;
  // nanotron: the last message line per logger prefix (what a memory line reports on).
  std::map<std::string, std::string> last_message;

  void bad(int line, const std::string& why) {
    if (!error)
      error = make_error(file + ":" + std::to_string(line) + ": " + why);
  }
  bool is(RecordFormat f) {
    if (format && *format != f) return false;  // one format per file: the first found
    format = f;
    return true;
  }
  // Keeps the largest figures of `rank`, and the line of the largest max allocated (or reserved).
  void take(int line, RecordRank r) {
    auto [it, fresh] = ranks.emplace(r.rank, r);
    RecordRank& k = it->second;
    if (fresh) {
      k.line = line;
      return;
    }
    auto more = [](const std::optional<int64_t>& a, const std::optional<int64_t>& b) {
      return a && (!b || *a > *b);
    };
    bool peak = r.max_allocated ? more(r.max_allocated, k.max_allocated)
                                : more(r.max_reserved, k.max_reserved);
    if (peak) k.line = line, k.context = r.context;
    if (more(r.max_allocated, k.max_allocated)) k.max_allocated = r.max_allocated;
    if (more(r.max_reserved, k.max_reserved)) k.max_reserved = r.max_reserved;
    if (more(r.device_used, k.device_used)) k.device_used = r.device_used;
  }

  // Each format found by its fixed words first, then its fields read by patterns with no
  // unbounded repetition of arbitrary text (lines are at most kMaxLine characters).
  void line(int n, const std::string& text) {
    static const std::regex megatron_fields(
        R"(^ \| allocated: ([^ |]+) \| max allocated: ([^ |]+) \| reserved: ([^ |]+) \| max reserved: ([^ |]+)(?: \| total device memory used: ([^ |]+))?)");
    static const std::regex theoretical(
        R"(^Theoretical memory footprints: weight and optimizer=([^ ,]+) MB, activation=([^ ,]+) MB, total=([^ ,]+) MB)");
    static const std::regex nanotron(
        R"(^Memory usage: *([0-9.]+) *MiB\.? *Peak allocated:? *([0-9.]+) *MiB\.? *Peak reserved: *([0-9.]+) *MiB)");
    static const std::regex level(R"(^\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL))");
    static const std::regex titan(R"(^memory: *([0-9.]+) *GiB\()");
    std::smatch m;
    constexpr double MiB = 1 << 20, GiB = 1 << 30;
    auto after = [&](size_t at) { return text.substr(at); };
    // Megatron: "[Rank R] NAME memory (MB) | allocated: ...".
    if (size_t mb = text.find(" memory (MB)"); mb != std::string::npos) {
      size_t open = text.rfind("[Rank ", mb);
      size_t close = open == std::string::npos ? open : text.find("] ", open);
      std::string fields = after(mb + 12);
      if (close != std::string::npos && close < mb && std::regex_search(fields, m, megatron_fields)) {
        if (!is(RecordFormat::kMegatron)) return;
        RecordRank r;
        std::optional<int64_t> rank = to_bytes(text.substr(open + 6, close - open - 6), 1);
        r.max_allocated = to_bytes(m[2].str(), MiB);
        r.max_reserved = to_bytes(m[4].str(), MiB);
        if (m[5].matched) r.device_used = to_bytes(m[5].str(), MiB);
        if (!rank || !r.max_allocated || !r.max_reserved || (m[5].matched && !r.device_used))
          return bad(n, "a report_memory line with a value that is not a number of MB");
        r.rank = *rank;
        r.context = text.substr(close + 2, mb - close - 2);
        return take(n, r);
      }
    }
    if (size_t at = text.find("Theoretical memory footprints"); at != std::string::npos) {
      std::string rest = after(at);
      if (std::regex_search(rest, m, theoretical)) {
        std::optional<int64_t> w = to_bytes(m[1].str(), MiB), a = to_bytes(m[2].str(), MiB),
                               t = to_bytes(m[3].str(), MiB);
        if (!w || !a || !t) return bad(n, "a theoretical-memory line that is not in MB");
        record.theoretical = TheoreticalMemory{*w, *a, *t};
        return;
      }
    }
    // nanotron: "[LEVEL|DP=..|PP=..|TP=..|node]: message".
    std::string ranks, message;
    for (size_t at = text.find('['); at != std::string::npos; at = text.find('[', at + 1)) {
      std::string from = after(at);
      size_t end = from.find("]:");
      if (end != std::string::npos && std::regex_search(from, level)) {
        size_t bar = from.find('|');
        ranks = bar < end ? from.substr(bar, end - bar) : "";
        message = from.substr(std::min(from.size(), end + 2));
        while (!message.empty() && message.front() == ' ') message.erase(0, 1);
        break;
      }
    }
    if (size_t at = text.find("Memory usage:"); at != std::string::npos) {
      std::string rest = after(at);
      if (std::regex_search(rest, m, nanotron)) {
        if (!is(RecordFormat::kNanotron)) return;
        RecordRank r;
        r.max_allocated = to_bytes(m[2].str(), MiB);
        r.max_reserved = to_bytes(m[3].str(), MiB);
        if (!r.max_allocated || !r.max_reserved)
          return bad(n, "a nanotron memory line with a value that is not a number of MiB");
        auto coord = [&](const std::string& key) -> std::optional<int64_t> {
          size_t k = ranks.find("|" + key + "=");
          if (k == std::string::npos) return std::nullopt;
          size_t from = k + key.size() + 2;
          size_t to = ranks.find('|', from);
          return to_bytes(ranks.substr(from, to == std::string::npos ? to : to - from), 1);
        };
        r.pp = coord("PP"), r.dp = coord("DP"), r.cp = coord("CP"), r.tp = coord("TP");
        if (r.pp.value_or(0) >= 4096 || r.dp.value_or(0) >= 4096 || r.cp.value_or(0) >= 4096 ||
            r.tp.value_or(0) >= 4096)
          return bad(n, "a rank coordinate of 4096 or more");
        size_t bracket = text.find("[After");
        r.context = bracket != std::string::npos
                        ? text.substr(bracket, text.find(']', bracket) - bracket + 1)
                        : last_message[ranks];
        // Keyed by its coordinates while reading (the global rank needs the setup's degrees).
        r.rank = -(1 + (((r.pp.value_or(0) * 4096 + r.dp.value_or(0)) * 4096 + r.cp.value_or(0)) *
                            4096 +
                        r.tp.value_or(0)));
        return take(n, r);
      }
    }
    if (!message.empty()) last_message[ranks] = message;
    // torchtitan: "step: N  loss: ...  memory: X GiB(Y%)  ...", "[rankN]:" from torchrun.
    size_t step = text.find("step:"), mem = text.find("memory:");
    if (step != std::string::npos && mem != std::string::npos && step < mem) {
      std::string rest = after(mem);
      if (std::regex_search(rest, m, titan)) {
        if (!is(RecordFormat::kTorchtitan)) return;
        RecordRank r;
        r.max_reserved = to_bytes(m[1].str(), GiB);
        if (!r.max_reserved) return bad(n, "a torchtitan metrics line whose memory is not GiB");
        r.rank = 0;
        if (size_t k = text.find("[rank"); k != std::string::npos && k < step) {
          size_t close = text.find("]:", k);
          std::optional<int64_t> rank =
              close == std::string::npos ? std::nullopt : to_bytes(text.substr(k + 5, close - k - 5), 1);
          if (!rank) return bad(n, "a torchrun rank prefix that is not [rankN]:");
          r.rank = *rank;
        }
        size_t digits = step + 5;
        while (digits < text.size() && text[digits] == ' ') ++digits;
        size_t stop = digits;
        while (stop < text.size() && std::isdigit(static_cast<unsigned char>(text[stop]))) ++stop;
        r.context = "step " + text.substr(digits, stop - digits);
        return take(n, r);
      }
    }
  }
};


// One CSV line as Python's csv.writer writes it: fields split at commas, a quoted field's
// doubled quotes undone. nullopt when a quote is left open.
std::optional<std::vector<std::string>> csv_fields(std::string_view line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char ch = line[i];
    if (quoted) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') out.back() += '"', ++i;
      else if (ch == '"') quoted = false;
      else out.back() += ch;
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      out.emplace_back();
    } else if (ch != '\r') {
      out.back() += ch;
    }
  }
  if (quoted) return std::nullopt;
  return out;
}

// nanotron's benchmark CSV: the header, then one row per run (world rank 0's figures).
Result<MemoryRecord> read_benchmark_csv(const std::string& file, std::string_view text) {
  MemoryRecord rec;
  rec.format = RecordFormat::kNanotronCsv;
  rec.file = file;
  std::vector<std::string> header;
  std::map<std::string, size_t> column;
  int n = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    ++n;
    if (line.empty() || line == "\r") continue;
    auto where = [&](const std::string& why) { return make_error(file + ":" + std::to_string(n) + ": " + why); };
    if (line.size() > kMaxLine) return where("a row longer than 4096 characters");
    std::optional<std::vector<std::string>> fields = csv_fields(line);
    if (!fields) return where("a quoted field left open");
    if (header.empty()) {
      header = *fields;
      for (size_t i = 0; i < header.size(); ++i) column.emplace(header[i], i);
      continue;
    }
    if (fields->size() != header.size())
      return where("a row of " + std::to_string(fields->size()) + " fields under a header of " +
                   std::to_string(header.size()));
    auto field = [&](const char* name) -> std::optional<std::string> {
      auto it = column.find(name);
      if (it == column.end()) return std::nullopt;
      return (*fields)[it->second];
    };
    RecordRank r;
    r.rank = 0;
    r.line = n;
    r.max_allocated = to_bytes(field("Mem Alloc (GB)").value_or(""), 1 << 30);
    r.max_reserved = to_bytes(field("Mem Res (GB)").value_or(""), 1 << 30);
    if (!r.max_allocated || !r.max_reserved)
      return where("\"Mem Alloc (GB)\" and \"Mem Res (GB)\" must be numbers of GiB");
    RecordRank::Degrees d;
    for (auto [name, slot] : {std::pair{"dp", &d.dp}, std::pair{"pp", &d.pp},
                              std::pair{"tp", &d.tp}, std::pair{"cp", &d.cp}}) {
      std::optional<std::string> v = field(name);
      if (!v) {
        if (std::string(name) == "cp") continue;  // older nanotron: no context parallelism
        return where(std::string("no \"") + name + "\" column (valid: nanotron's benchmark CSV)");
      }
      std::optional<int64_t> k = to_bytes(*v, 1);
      if (!k || *k < 1 || *k > 1 << 20)
        return where(std::string("\"") + name + "\" is " + quote_input(*v) +
                     ", not a parallel degree of at least 1");
      *slot = *k;
    }
    r.run = d;
    std::string name = field("name").value_or(""), job = field("job_id").value_or("");
    r.context = "run " + (name.empty() ? std::string("?") : name) +
                (job.empty() || job == "N/A" ? "" : " (job " + job + ")");
    rec.ranks.push_back(std::move(r));
  }
  if (rec.ranks.empty()) return make_error(file + ": a benchmark CSV with no row of figures");
  return rec;
}

// The rank of a snapshot's file: torchtitan's "000003_step_10.pickle", or "rank3" anywhere in
// the name; nullopt when the name gives none.
std::optional<int64_t> rank_of_snapshot(std::string_view path) {
  std::string_view base = path.substr(path.find_last_of('/') == std::string_view::npos
                                          ? 0
                                          : path.find_last_of('/') + 1);
  auto digits = [](std::string_view s) {
    size_t k = 0;
    while (k < s.size() && k < 9 && std::isdigit(static_cast<unsigned char>(s[k]))) ++k;
    return k;
  };
  if (size_t k = digits(base); k > 0 && base.substr(k).starts_with("_step_"))
    return std::stoll(std::string(base.substr(0, k)));
  for (size_t at = base.find("rank"); at != std::string_view::npos; at = base.find("rank", at + 1))
    if (size_t k = digits(base.substr(at + 4)); k > 0)
      return std::stoll(std::string(base.substr(at + 4, k)));
  return std::nullopt;
}

Result<MemoryRecord> read_snapshot_record(const std::string& file, std::string_view data) {
  Result<MemorySnapshot> s = read_memory_snapshot(file, data);
  if (!s) return s.error();
  MemoryRecord rec;
  rec.format = RecordFormat::kSnapshot;
  rec.file = file;
  RecordRank r;
  std::optional<int64_t> rank = rank_of_snapshot(file);
  r.rank = rank.value_or(0);
  r.max_allocated = s->max_allocated, r.max_reserved = s->max_reserved;
  r.line = 0;
  r.context = s->trace_entries == 0
                  ? std::string("the snapshot's blocks (no trace recorded)")
                  : "trace entry " + std::to_string(s->peak_after) + " of " +
                        std::to_string(s->trace_entries);
  if (!rank) r.context += ", rank 0 assumed (the file name gives none)";
  r.live_blocks = std::move(s->live_at_peak);
  rec.ranks.push_back(std::move(r));
  return rec;
}

}  // namespace

const char* name_of(RecordFormat f) {
  switch (f) {
    case RecordFormat::kMegatron: return "megatron-report-memory";
    case RecordFormat::kNanotron: return "nanotron-log-memory";
    case RecordFormat::kTorchtitan: return "torchtitan-metrics";
    case RecordFormat::kNanotronCsv: return "nanotron-benchmark-csv";
    case RecordFormat::kSnapshot: return "pytorch-memory-snapshot";
  }
  return "?";
}

Result<MemoryRecord> read_memory_record(std::string_view file, std::string_view text) {
  // A pickle starts with its PROTO opcode (protocol 2 and later).
  if (!text.empty() && static_cast<uint8_t>(text[0]) == 0x80)
    return read_snapshot_record(std::string(file), text);
  {
    std::string_view first = text.substr(0, std::min(text.find('\n'), kMaxLine + 1));
    if (first.find("Mem Alloc (GB)") != std::string_view::npos &&
        first.find("Mem Res (GB)") != std::string_view::npos)
      return read_benchmark_csv(std::string(file), text);
  }
  Reader r;
  r.file = std::string(file);
  int n = 0;
  for (size_t at = 0; at <= text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    ++n;
    // Longer lines (a config dump) are no memory line of any format.
    if (end - at <= kMaxLine) r.line(n, plain(text.substr(at, end - at)));
    if (r.error) return *r.error;
    at = end + 1;
  }
  if (!r.format)
    return make_error(r.file + ": no memory lines (valid: " + kFormats + ")");
  r.record.format = *r.format;
  r.record.file = r.file;
  for (auto& [rank, rr] : r.ranks) {
    if (r.record.format == RecordFormat::kNanotron) rr.rank = -1;  // its coordinates say
    r.record.ranks.push_back(rr);
  }
  return r.record;
}

}  // namespace np

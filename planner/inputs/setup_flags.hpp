// The setup flags of estimate, plan, report and run (--tp, --pp-schedule, --recompute, ...) as one
// table: the CLI registers them from it, and the setup they give, a config's setup with the given
// ones applied over it, the plan-file conflict check and the sweep's reproduce commands all read
// it, so a flag is added in one place. Also the budget and headroom texts.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "planner/inputs/result.hpp"
#include "planner/inputs/spec.hpp"

namespace np {

struct SetupFlag {
  std::string_view name;  // "--tp"
  std::string_view help;
  // The text the flag has until given, shown in --help; "" where the default depends on other
  // flags (--microbatches: pp) or is none (--recompute: auto with a budget, else none).
  std::string_view default_text;
  bool count = false;  // a whole number within [lo, hi], checked as it is parsed
  int64_t lo = 1, hi = std::numeric_limits<int64_t>::max();
  // Copies the TrainSpec fields this flag sets from `from` to `to`.
  void (*copy)(TrainSpec& to, const TrainSpec& from) = nullptr;
  // The flag's value for `t` in a command that reproduces it, or "" where the command leaves
  // the flag out (its default for the rest of `t`, or --recompute, which the budget decides).
  std::string (*write)(const TrainSpec& t) = nullptr;
  // A switch that may be given alone ("--fsdp"): the value it then has; "" where a value is needed.
  std::string_view alone;
};

// Every setup flag, in the order of --help and of reproduce commands.
const std::vector<SetupFlag>& setup_flags();

// The setup flags as typed: each one's text (its default text until given), and the flags given.
struct SetupText {
  SetupText();
  void set(std::string_view flag, std::string text);  // as given on the command line
  const std::string& operator[](std::string_view flag) const;
  bool given(std::string_view flag) const { return given_.count(std::string(flag)) > 0; }

 private:
  std::map<std::string, std::string, std::less<>> text_;
  std::set<std::string> given_;
};

// A whole number for a flag within [lo, hi]: the error names the flag, the value and what is
// valid (listing the values where there are at most five).
Result<int64_t> parse_count_flag(std::string_view flag, std::string_view text, int64_t lo,
                                 int64_t hi);

// A real number in [0, most] for a flag: the error names the flag, the value and `valid`.
Result<double> parse_real_flag(std::string_view flag, const std::string& text, double most,
                               std::string_view valid);

// The setup the flags give. `budgeted`: a budget or a GPU was given, which makes --recompute
// auto the default (and allows it).
Result<TrainSpec> setup_from_flags(const SetupText& s, bool budgeted);

// A config's setup with every setup flag given in `s` applied over it. The recompute policy is
// the flag's, else the config's when it set one (`config_sets_recompute`), else the flags'
// default. A config's stage split is dropped when --pp or the schedule is given without
// --partition (it was for its own pipeline).
Result<TrainSpec> override_setup(const TrainSpec& config, bool config_sets_recompute,
                                 const SetupText& s, bool budgeted);

// " --tp 8 --pp 2 ...": the setup flags that reproduce `t` (with the model and budget flags),
// in table order.
std::string setup_command_flags(const TrainSpec& t);

// Where a model and its setup come from: --model (a catalog name or alias, or a model file), or a
// nanotron config, which names the model itself; --megatron-args over the flags' setup; the
// setup flags over a config's setup.
struct SetupSources {
  std::string model, nanotron_config, megatron_args;
  std::string models_dir;  // the model catalog
  std::string torchtitan_config;
  int64_t gpus = 0;  // --gpus: the world size a torchtitan config's shard degree -1 takes
};
struct ResolvedSetup {
  ModelSpec model;
  TrainSpec setup;
};
// The model and the validated setup. `say` receives each line for the user as it comes (a
// config's notes; a warning for a sequence past the model's trained positions), so that notes
// reach the user even when a later check fails.
Result<ResolvedSetup> resolve_setup(const SetupSources& src, const SetupText& s, bool budgeted,
                                    const std::function<void(const std::string&)>& say);

// --budget: bytes (80GB, 80GiB, 85899345920); under 1 MiB is refused as a budget that lost its
// unit.
Result<int64_t> parse_budget(const std::string& text);
// --headroom: the bytes of `budget` kept free, as a percentage in [0, 50] ("3%") or bytes below
// the budget ("2GiB"); a bare number other than 0 is refused as ambiguous.
Result<int64_t> parse_headroom(const std::string& text, int64_t budget);

}  // namespace np

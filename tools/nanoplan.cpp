// nanoplan CLI: estimate, plan, sweep, report, run, models, gpus. It parses flags, resolves names,
// reads configs, runs the planner, prints results, and maps errors to the exit codes the README
// states (2 for bad input).
//
// Built twice (tools/CMakeLists.txt): `nanoplan`, the planner and this CLI only, which starts in
// milliseconds and loads no CUDA, MPI or executor library; and `nanoplan-executor`
// (NANOPLAN_EXECUTOR), the same CLI with the executor. `nanoplan run` and `nanoplan report --run`
// hand their whole command line over to nanoplan-executor beside the binary (exec_executor), which
// parses it again and runs it; it opens the CUDA backend module only for --backend cuda|auto.
#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstring>
#include <sstream>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <type_traits>

#if defined(NANOPLAN_EXECUTOR)  // nanoplan-executor: the CLI with the executor (tools/CMakeLists.txt)
#include "executor/comm/inproc.hpp"
#include "executor/compare.hpp"
#include "executor/backend_choice.hpp"
#include "executor/scenario_run.hpp"
#include "executor/record.hpp"
#include "executor/runner.hpp"
#include "executor/cuda/module.hpp"
#if defined(NANOPLAN_HAVE_MPI)
#include "executor/comm/mpi.hpp"
#endif
#endif
#include "planner/recompute/autoplan.hpp"
#include "planner/report/plan_report.hpp"
#include "planner/inputs/configs.hpp"
#include "planner/inputs/setup_flags.hpp"
#include "planner/report/html_report.hpp"
#include "planner/inputs/read_file.hpp"
#include "planner/inputs/catalog.hpp"
#include "planner/schedule/estimate.hpp"
#include "planner/graph/graph.hpp"
#include "planner/schedule/plan_io.hpp"
#include "planner/report/record_compare.hpp"
#include "planner/report/report.hpp"
#include "planner/inputs/scenario.hpp"
#include "planner/recompute/sweep.hpp"
#include "planner/inputs/units.hpp"
#include "planner/schedule/contract.hpp"
#include "planner/report/emit_config.hpp"

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitCheckFailed = 1;  // predicted != measured, or a scenario check failed
constexpr int kExitOutOfMemory = 3;  // --enforce-budget stopped a rank
constexpr int kExitRunFailed = 4;    // the executor itself failed (a bug, or host memory)

struct Flags {
  std::string model, format = "table";
  np::SetupText setup;  // the setup flags (planner/inputs/setup_flags.hpp), as typed
  std::string budget, gpu, output, models_dir, cuda_context, cublas_workspace, te_workspace,
      nccl_buffers, allocator = "caching", allocator_conf, allocator_slack;
  std::string headroom = "3%";  // of the budget, or bytes
  std::string nanotron_config, megatron_args, torchtitan_config, emit;
  std::vector<std::string> logs;  // compare
  // report
  bool report_run = false;
  int64_t sweep_gpus = 0;
  std::string command_line;
  std::string sweep_schedules = "afab";  // sweep: pipeline schedules to try
  std::string sweep_virtual = "1";        // sweep: chunk counts to try
  std::string sweep_cp = "1";             // sweep: context-parallel degrees to try
  std::string sweep_ep;                   // sweep: expert-parallel degrees ("": MoE's all)
  bool explain_peak = false, verbose = false;
  // run
  std::string plan_path, scenario, backend = "cpu", enforce_budget, record;
  int steps = 1;
  int64_t seed = 1234;
  bool check_plan = false;
  // sweep
  int64_t gpus = 0;
  std::optional<int64_t> global_batch;  // default: 4 x gpus
  int top = 10;
  // calibrate
  std::string calibrate_name, gemm_shapes, attention_shapes, copy_bytes = "1GiB";
  std::string collective_bytes = "64KiB,1MiB,16MiB,128MiB,512MiB";
  std::optional<int64_t> calibrate_ranks;  // default: every GPU of the machine
  int64_t head_dim = 128;
  int repetitions = 10;
};

// Under mpirun: this process's rank (errors every process meets are printed by process 0 only).
int g_mpi_rank = 0;

[[noreturn]] void die(const std::string& message) {
  if (g_mpi_rank == 0) std::fprintf(stderr, "nanoplan: error: %s\n", message.c_str());
  std::exit(kExitBadInput);
}

// Writes `text` to `path` whole or not at all (a temporary file beside it, then renamed).
void write_whole(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    if (!out.flush()) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      die("cannot write " + path + " (" + tmp + ")");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) die("cannot write " + path + ": " + ec.message());
}

template <typename T>
T check(np::Result<T> r) {
  if (!r) die(r.error().message);
  return std::move(*r);
}

// The model catalog: --models-dir, $NANOPLAN_MODELS_DIR, the installed catalog beside the binary
// (<prefix>/bin/nanoplan -> <prefix>/share/nanoplan/models, cmake --install), else the source
// tree's models/.
std::string models_dir(const Flags& f) {
  if (!f.models_dir.empty()) return f.models_dir;
  if (const char* env = std::getenv("NANOPLAN_MODELS_DIR")) return env;
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && exe.parent_path().filename() == NANOPLAN_INSTALL_BINDIR) {
    std::filesystem::path installed =
        exe.parent_path().parent_path() / NANOPLAN_INSTALL_DATADIR / "nanoplan" / "models";
    if (std::filesystem::is_directory(installed, ec)) return installed.string();
  }
  return std::string(NANOPLAN_SOURCE_DIR) + "/models";
}

constexpr int64_t kNoBound = std::numeric_limits<int64_t>::max();

// An integer flag: a whole decimal number without wrap (np::parse_integer), within [lo, hi] where
// the flag has its own bounds (the setup's are validate_setup's); the error names the flag, the
// value and what is valid.
// An integer flag: a whole decimal number without wrap within [lo, hi] where the flag has its own
// bounds (np::parse_count_flag names the flag, the value and what is valid).
template <typename T>
CLI::Option* add_int(CLI::App* app, const std::string& name, T& target, const std::string& desc,
                     int64_t lo = -kNoBound - 1, int64_t hi = kNoBound) {
  auto set = [&target, name, lo, hi](const std::string& v) {
    target = static_cast<T>(check(np::parse_count_flag(name, v, lo, hi)));
  };
  CLI::Option* o = app->add_option_function<std::string>(name, set, desc);
  if constexpr (std::is_integral_v<T>) o->default_str(std::to_string(target));
  return o;
}

// A setup flag of the table (np::setup_flags), into f.setup; `help` replaces the table's where a
// subcommand reads the flag its own way.
CLI::Option* add_setup_flag(CLI::App* app, Flags& f, const np::SetupFlag& s,
                            const std::string& help = "") {
  std::string name(s.name);
  auto set = [&f, name, count = s.count, lo = s.lo, hi = s.hi,
              alone = std::string(s.alone)](const std::string& v) {
    if (count) check(np::parse_count_flag(name, v, lo, hi));
    // Given alone, CLI11 hands a flag-like option "true".
    f.setup.set(name, !alone.empty() && (v.empty() || v == "true") ? alone : v);
  };
  CLI::Option* o =
      app->add_option_function<std::string>(name, set, help.empty() ? std::string(s.help) : help);
  if (!s.alone.empty()) o->expected(0)->expected(0, 1);  // flag-like, with an optional value
  if (!s.default_text.empty()) o->default_str(std::string(s.default_text));
  return o;
}

const np::SetupFlag& setup_flag(std::string_view name) {
  for (const np::SetupFlag& s : np::setup_flags())
    if (s.name == name) return s;
  throw std::logic_error("not a setup flag: " + std::string(name));
}

// The allocator model of the estimate (every command that estimates).
void add_allocator_flags(CLI::App* app, Flags& f) {
  app->add_option("--allocator", f.allocator,
                  "what allocates the tensors: caching (PyTorch's caching allocator, replayed), "
                  "expandable (the same with expandable_segments:True), exact (one allocation "
                  "per tensor)")
      ->capture_default_str();
  app->add_option("--allocator-conf", f.allocator_conf,
                  "PYTORCH_CUDA_ALLOC_CONF-style options of the caching allocator, e.g. "
                  "max_split_size_mb:128,roundup_power2_divisions:4");
}

void add_headroom_flag(CLI::App* app, Flags& f) {
  app->add_option("--headroom", f.headroom,
                  "bytes of the budget kept free, as bytes (2GiB) or a percentage of the budget "
                  "(0% plans to the last byte). Default 3%: the runtime and allocator overheads "
                  "are estimated, but the driver's own reservations, buffers created lazily and "
                  "the caching allocator's rounding vary by a few percent between runs")
      ->capture_default_str();
}

// The setup flags of estimate, plan and run (--model is checked by resolve: a config may name the
// model instead).
// The setup flags every setup subcommand takes, and the output flags of those that use them
// (--emit: estimate and plan; --format: estimate and run; --explain-peak, --verbose: estimate).
void add_setup_flags(CLI::App* app, Flags& f) {
  const std::string cmd = app->get_name();
  app->add_option("--model", f.model,
                  "model name or alias (nanoplan models), or a path to a .toml or config.json");
  app->add_option("--nanotron-config", f.nanotron_config,
                  "a nanotron training config (YAML): the model (model.model_config), "
                  "parallelism, tokens and optimizer settings; flags given too override it");
  app->add_option("--torchtitan-config", f.torchtitan_config,
                  "a torchtitan job file (TOML): the model ([model] name and flavor), FSDP2 and "
                  "the parallel degrees, batch, sequence, activation checkpointing; flags given "
                  "too override it");
  add_int(app, "--gpus", f.gpus,
          "the job's world size, which a torchtitan config's data_parallel_shard_degree -1 "
          "takes (with --torchtitan-config)",
          1, 1 << 20);
  app->add_option("--megatron-args", f.megatron_args,
                  "Megatron-LM arguments, quoted: parallel sizes, batch, --seq-length, recompute "
                  "flags (the model comes from --model; shape flags are checked against it; "
                  "--dp gives the data-parallel degree the global batch is over)");
  if (cmd == "estimate" || cmd == "plan")
    app->add_option("--emit", f.emit,
                    "print the plan's closest config instead of the report: nanotron (a YAML "
                    "fragment), megatron (flags) or torchtitan (job-file TOML sections)");
  for (const np::SetupFlag& s : np::setup_flags()) add_setup_flag(app, f, s);
  app->add_option("--budget", f.budget,
                  "bytes per GPU: 80GB (10^9), 80GiB (2^30), 85899345920, \"80 GB\"");
  add_headroom_flag(app, f);
  app->add_option(
      "--gpu", f.gpu,
      "GPU (nanoplan gpus): h100, h200, a100-80gb, b200, ..., or a GPU file (FILE.toml, one "
      "[[gpu]] table in the schema of models/gpus/gpus.toml); its cost model, and its memory as "
      "the budget unless --budget gives one");
  if (cmd == "estimate" || cmd == "run")
    app->add_option("--format", f.format, "table, json")->capture_default_str();
  if (cmd == "estimate") {
    app->add_flag("--explain-peak", f.explain_peak,
                  "the live tensors at the peak, by category and block");
    app->add_flag("--verbose", f.verbose,
                  "details: every live tensor with --explain-peak, the layer options of an auto "
                  "plan");
  }
  app->add_option("--cuda-context", f.cuda_context,
                  "assumed CUDA context bytes per GPU (default 512MiB)");
  app->add_option("--cublas-workspace", f.cublas_workspace,
                  "assumed cuBLAS workspace bytes of PyTorch (default 32MiB)");
  app->add_option("--te-workspace", f.te_workspace,
                  "Transformer Engine's cuBLAS workspace bytes, --impl megatron (default "
                  "32MiB + 1KiB: sm_90 and later; 4MiB before)");
  app->add_option("--nccl-buffers", f.nccl_buffers,
                  "assumed NCCL buffer bytes per communicator (default 64MiB)");
  add_allocator_flags(app, f);
  // Replaced by the replay (--allocator); named so that old command lines get a clear error.
  app->add_option("--allocator-slack", f.allocator_slack)->group("");
  app->add_option("--models-dir", f.models_dir,
                  "model catalog folder (default: the source tree's models/)");
}

// An option given with an empty value ("--budget ''") is refused, never read as "not given".
void refuse_empty_values(const CLI::App* sub) {
  for (const CLI::Option* o : sub->get_options()) {
    if (o->count() == 0 || o->get_expected_max() == 0) continue;  // not given, or a switch
    for (const std::string& v : o->results())
      if (v.find_first_not_of(" \t") == std::string::npos)
        die("empty value for " + o->get_name() + " (valid: " + o->get_description() + ")");
  }
}

// A budget was given (--budget, or --gpu's memory): --recompute auto is then the default.
bool budgeted(const Flags& f) { return !f.budget.empty() || !f.gpu.empty(); }

np::TrainSpec make_setup(const Flags& f) { return check(np::setup_from_flags(f.setup, budgeted(f))); }

// The auto planner's options from the flags.
np::AutoPlanOptions plan_options(const Flags& f) {
  return {.search_partition = f.setup["--partition"] == "auto"};
}

np::RuntimeAssumptions make_runtime(const Flags& f) {
  np::RuntimeAssumptions rt;
  auto bytes = [](const std::string& flag, const std::string& v, int64_t& out) {
    if (v.empty()) return;
    np::Result<int64_t> r = np::parse_bytes(v, /*allow_zero=*/true);
    if (!r) die(flag + ": " + r.error().message);
    out = *r;
  };
  bytes("--cuda-context", f.cuda_context, rt.cuda_context_bytes);
  bytes("--cublas-workspace", f.cublas_workspace, rt.cublas_workspace_bytes);
  bytes("--te-workspace", f.te_workspace, rt.te_workspace_bytes);
  bytes("--nccl-buffers", f.nccl_buffers, rt.nccl_bytes_per_comm);
  if (!f.allocator_slack.empty())
    die("--allocator-slack is gone: the estimate replays PyTorch's caching allocator instead "
        "(valid: --allocator caching|expandable|exact, --allocator-conf OPTIONS)");
  rt.allocator = check(np::parse_allocator_choice(f.allocator, f.allocator_conf));
  return rt;
}

// The budget as given (--budget, or --gpu's memory).
std::optional<int64_t> given_budget(const Flags& f) {
  if (!f.budget.empty()) return check(np::parse_budget(f.budget));
  if (f.gpu.empty()) return std::nullopt;
  return check(np::gpu_from_arg(models_dir(f) + "/gpus/gpus.toml", f.gpu)).memory_bytes;
}

int64_t headroom_bytes(const Flags& f, int64_t budget) {
  return check(np::parse_headroom(f.headroom, budget));
}

// The bytes a plan must fit: the budget less the headroom.
std::optional<int64_t> make_budget(const Flags& f) {
  std::optional<int64_t> b = given_budget(f);
  if (!b) return b;
  return *b - headroom_bytes(f, *b);
}

// The headroom taken from the budget, 0 without one (for the reports).
int64_t headroom_of(const Flags& f) {
  std::optional<int64_t> b = given_budget(f);
  return b ? headroom_bytes(f, *b) : 0;
}

// The GPU the times are of: --gpu's, else the catalog's H100 SXM (default_hardware's figures,
// with its efficiencies), from the model catalog's GPU file, or the source tree's when a
// --models-dir holds models only.
np::HardwareModel make_hardware(const Flags& f) {
  std::string catalog = models_dir(f) + "/gpus/gpus.toml";
  if (f.gpu.empty()) {
    const np::HardwareModel fallback = np::default_hardware();
    std::error_code ec;
    std::vector<np::GpuSpec> gpus;
    if (std::filesystem::exists(catalog, ec)) gpus = check(np::load_gpu_catalog(catalog));
    if (std::none_of(gpus.begin(), gpus.end(),
                     [&](const np::GpuSpec& g) { return g.name == fallback.name; }))
      gpus = check(
          np::load_gpu_catalog(std::string(NANOPLAN_SOURCE_DIR) + "/models/gpus/gpus.toml"));
    np::HardwareModel hw = np::hardware_model(check(np::resolve_gpu(gpus, fallback.name)));
    hw.origin = fallback.origin;
    return hw;
  }
  np::HardwareModel hw = np::hardware_model(check(np::gpu_from_arg(catalog, f.gpu)));
  if (np::is_gpu_file(f.gpu)) hw.origin = "from " + f.gpu;
  return hw;
}

// What planning needs from the flags besides the model and setup.
np::PlanInputs plan_inputs(const Flags& f) {
  return {make_runtime(f), make_budget(f), headroom_of(f), make_hardware(f), plan_options(f)};
}

struct Resolved {
  np::ModelSpec model;
  np::TrainSpec setup;
};

Resolved resolve(const Flags& f) {
  if (f.format != "table" && f.format != "json")
    die("invalid --format " + np::quote_input(f.format) + " (valid: table, json)");
  if (!f.emit.empty() && f.emit != "nanotron" && f.emit != "megatron" && f.emit != "torchtitan")
    die("invalid --emit " + np::quote_input(f.emit) + " (valid: nanotron, megatron, torchtitan)");
  np::ResolvedSetup r = check(np::resolve_setup(
      {f.model, f.nanotron_config, f.megatron_args, models_dir(f), f.torchtitan_config, f.gpus},
      f.setup, budgeted(f),
      [](const std::string& line) { std::cerr << "nanoplan: " << line << "\n"; }));
  // Float8 needs the GPU's float8 tensor cores (the catalog read only when it matters).
  if (r.setup.fp8 != np::Fp8Recipe::kNone)
    if (auto e = np::check_fp8_gpu(r.setup, make_hardware(f))) die(e->message);
  if (r.model.moe && !r.model.dense_layers.empty() && f.setup["--partition"] == "auto" &&
      r.setup.recompute == np::Recompute::kAuto)
    die(r.model.name + " has dense and MoE layers, which --partition auto does not search yet "
        "(valid: --partition balanced, or layer counts)");
  return {std::move(r.model), std::move(r.setup)};
}

// --emit: the plan's closest nanotron YAML or Megatron flags, on stdout. Under a budget the plan
// is estimated first: a config for a setup that does not fit says so in its first line, and the
// command says so on stderr.
int emit_config(const Flags& f, const Resolved& r) {
  np::PlanInputs in = plan_inputs(f);
  np::PlannedSetup p = np::plan_setup(r.model, r.setup, in);
  const std::optional<int64_t>& budget = in.budget;
  std::string warning;
  if (budget) {
    const np::Estimate& e = p.estimate;
    if (!e.fits)
      warning = std::string("DOES NOT FIT: ") +
                (r.setup.recompute == np::Recompute::kAuto ? "the smallest peak nanoplan finds is "
                                                          : "the peak of this setup is ") +
                np::format_gib(e.peak_bytes) +
                " (rank " + std::to_string(e.peak_rank) + ") of " + np::format_gib(*budget) +
                " usable; this config runs out of memory";
  }
  if (!warning.empty()) std::cout << "# " << warning << "\n";
  std::cout << (f.emit == "nanotron"     ? np::emit_nanotron(p.schedule)
                : f.emit == "torchtitan" ? np::emit_torchtitan(p.schedule)
                                         : np::emit_megatron(p.schedule));
  if (!warning.empty()) std::cerr << "nanoplan: the emitted config " << warning << "\n";
  return 0;
}

int run_estimate_auto(const Flags& f, const Resolved& r, int64_t budget) {
  np::RuntimeAssumptions rt = make_runtime(f);
  np::HardwareModel hw = make_hardware(f);
  // The report needs the simulation's schedule only (peaks repeat past its micro-batches; the
  // step time counts all of the setup's): no schedule of every micro-batch is built.
  np::AutoPlanOptions options = plan_options(f);
  options.full_schedule = false;
  np::AutoPlan plan = np::auto_plan(r.model, r.setup, rt, budget, hw, options);
  if (f.explain_peak)
    plan.estimate = np::estimate_schedule(
        plan.schedule, rt, {.budget = budget, .suggestions = false, .explain_peak = true});
  plan.estimate.fits = plan.fits;
  plan.estimate.headroom = headroom_of(f);
  if (!plan.fits)
    plan.estimate.suggestions = np::auto_suggestions(r.model, r.setup, rt, budget, hw);
  if (f.format == "json") {
    nlohmann::json j = np::estimate_to_json(plan.estimate);
    j["plan"] = np::auto_plan_json(plan);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << np::estimate_to_table(plan.estimate, f.model, f.verbose)
              << np::auto_plan_table(plan, budget, f.verbose);
  }
  return 0;
}

// nanoplan compare: every log read first (bad input before any output), then the estimate of
// the setup given, then the rows.
int run_compare(const Flags& f) {
  std::vector<np::MemoryRecord> records;
  for (const std::string& path : f.logs) {
    std::string text = check(np::read_text_file(path, "log"));
    records.push_back(check(np::read_memory_record(path, text)));
  }
  Resolved r = resolve(f);
  np::PlanInputs in = plan_inputs(f);
  // The live tensors at each stage's peak too, for a snapshot's blocks.
  np::Estimate e = np::estimate_schedule(np::plan_setup(r.model, r.setup, in).schedule, in.rt,
                                         {.budget = in.budget, .suggestions = false,
                                          .explain_peak = true});
  np::RecordComparison c = check(np::compare_records(records, e));
  if (f.format == "json")
    std::cout << np::record_json(c, e).dump(2) << "\n";
  else
    std::cout << np::record_table(c, e);
  return 0;
}

int run_estimate(const Flags& f) {
  Resolved r = resolve(f);
  if (!f.emit.empty()) return emit_config(f, r);
  if (r.setup.recompute == np::Recompute::kAuto) return run_estimate_auto(f, r, *make_budget(f));
  np::EstimateOptions opt{
      .budget = make_budget(f), .suggestions = true, .explain_peak = f.explain_peak};
  np::Estimate e = np::estimate(r.model, r.setup, make_runtime(f), opt);
  e.headroom = headroom_of(f);
  np::HardwareModel hw = make_hardware(f);
  np::StepTime time = np::named_step_time(r.model, r.setup, hw);
  if (f.format == "json") {
    nlohmann::json j = np::estimate_to_json(e);
    j["step_time"] = {{"seconds", time.seconds},
                      {"recompute_seconds", time.recompute_seconds},
                      {"pipeline_p2p_seconds", time.p2p_seconds},
                      {"mfu", time.mfu},
                      {"hfu", time.hfu},
                      {"tokens_per_second", time.tokens_per_second},
                      {"hardware", hw.name},
                      {"hardware_origin", hw.origin},
                      {"efficiencies", time.efficiencies},
                      {"overlap", time.overlap},
                      {"source", "cost model (planner/recompute/cost.hpp), not a measurement"}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << np::estimate_to_table(e, f.model, f.verbose) << "\n"
              << np::step_time_line(time);
  }
  return 0;
}

int run_plan(const Flags& f) {
  Resolved r = resolve(f);
  if (!f.emit.empty()) return emit_config(f, r);
  np::PlannedSetup planned = np::plan_setup(r.model, r.setup, plan_inputs(f));
  const np::Schedule& s = planned.schedule;
  for (const np::StageProgram& p : s.stages)
    if (auto e = np::check_program(p)) die("internal: " + e->message);
  if (f.output.empty() || f.output == "-") {
    std::cout << np::schedule_to_json(s).dump() << "\n";
    return 0;
  }
  if (auto e = np::write_plan(s, f.output)) die(e->message);
  const np::Estimate& e = planned.estimate;
  // Two peaks, said apart: the GPU's (the estimate's, with the runtime overheads) and the
  // allocator tensors' alone (what `run` measures and compares).
  int64_t overheads = 0;
  for (const np::OverheadLine& o : e.stages[e.peak_stage].overheads) overheads += o.bytes;
  std::fprintf(stderr,
               "nanoplan: wrote %s (%s); peak per GPU %s on rank %lld: the plan's tensors %s "
               "(what run compares) + runtime overheads %s\n",
               f.output.c_str(),
               np::count_noun(static_cast<int64_t>(s.stages.size()), "stage program").c_str(),
               np::format_human(e.peak_bytes).c_str(), static_cast<long long>(e.peak_rank),
               np::format_binary(e.peak_bytes - overheads).c_str(),
               np::format_binary(overheads).c_str());
  return 0;
}

int run_models(const Flags& f) {
  auto catalog = check(np::load_model_catalog(models_dir(f)));
  std::printf("%-20s %20s  %-6s %s\n", "model", "parameters", "kind", "aliases");
  for (const np::ModelSpec& m : catalog) {
    std::string aliases;
    for (const std::string& a : m.aliases) aliases += (aliases.empty() ? "" : ", ") + a;
    std::printf("%-20s %20s  %-6s %s\n", m.name.c_str(),
                np::format_int(np::count_parameters(m)).c_str(), m.moe ? "moe" : "dense",
                aliases.c_str());
  }
  return 0;
}

int run_gpus(const Flags& f) {
  auto gpus = check(np::load_gpu_catalog(models_dir(f) + "/gpus/gpus.toml"));
  // Efficiencies ([gpu.perf], docs/step-times.md): measured on this GPU, derived from another
  // device's measurements (the estimate's efficiencies line says how), or the generic figures.
  std::printf("%-16s %18s %12s  %-12s %s\n", "gpu", "memory bytes", "GiB", "efficiencies",
              "aliases");
  for (const np::GpuSpec& g : gpus) {
    std::string aliases;
    for (const std::string& a : g.aliases) aliases += (aliases.empty() ? "" : ", ") + a;
    const np::GpuPerf& p = g.perf;
    const bool any = !p.gemm.empty() || !p.attention.empty() || p.memory_bytes_per_s > 0 ||
                     !p.nvlink.empty();
    const char* eff = !any                                           ? "generic"
                      : p.from.empty() && p.measured_on.empty() ? "measured"
                                                                 : "derived";
    std::printf("%-16s %18s %12.2f  %-12s %s\n", g.name.c_str(),
                np::format_int(g.memory_bytes).c_str(),
                static_cast<double>(g.memory_bytes) / np::kGiB, eff, aliases.c_str());
  }
  return 0;
}


#if defined(NANOPLAN_EXECUTOR)
using Executor = np::exec::Executor;

// "AxBxC,..." as lists of `n` positive integers each.
template <size_t N>
std::vector<std::array<int64_t, N>> shape_list(const std::string& flag, const std::string& text,
                                               const char* form) {
  std::vector<std::array<int64_t, N>> out;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    std::array<int64_t, N> v{};
    std::stringstream dims(item);
    size_t i = 0;
    for (std::string d; std::getline(dims, d, 'x'); ++i) {
      np::Result<int64_t> x = np::parse_integer(d);
      if (!x || *x < 1 || *x > (1 << 20) || i >= N)
        die(flag + ": " + np::quote_input(item) + " is not " + form + " (sizes 1 to 1,048,576)");
      v[i] = *x;
    }
    if (i != N) die(flag + ": " + np::quote_input(item) + " is not " + form);
    out.push_back(v);
  }
  if (out.empty()) die(flag + ": give at least one shape, " + form);
  return out;
}

// nanoplan calibrate: the CUDA backend's microbenchmarks on this machine's GPU (executor/cuda/
// calibrate.hpp), written as a GPU file in the catalog's schema: the named GPU's datasheet
// figures, and [gpu.perf] measured here.
int run_calibrate(const Flags& f) {
  if (f.gpu.empty())
    die("calibrate needs --gpu NAME: the catalog GPU (or GPU file) whose datasheet figures the "
        "measured rates are fractions of (nanoplan gpus lists them)");
  const np::GpuSpec gpu = check(np::gpu_from_arg(models_dir(f) + "/gpus/gpus.toml", f.gpu));
  np::cuda::CalibrateOptions o;
  if (!f.gemm_shapes.empty())
    o.gemm = shape_list<3>("--gemm-shapes", f.gemm_shapes, "MxNxK");
  else
    for (int64_t m : {1024, 4096, 16384})
      for (int64_t n : {1024, 4096, 16384})
        for (int64_t k : {1024, 4096, 16384}) o.gemm.push_back({m, n, k});
  if (!f.attention_shapes.empty())
    o.attention = shape_list<2>("--attention-shapes", f.attention_shapes, "SEQxHEADS");
  else
    for (int64_t s : {1024, 4096, 16384})
      for (int64_t h : {4, 8, 16, 32, 64}) o.attention.push_back({s, h});
  o.head_dim = f.head_dim;
  o.copy_bytes = check(np::parse_bytes(f.copy_bytes));
  if (o.copy_bytes < 1) die("--copy-bytes must be at least 1 byte");
  o.repetitions = f.repetitions;
  const std::string name = f.calibrate_name.empty() ? gpu.name + "-calibrated" : f.calibrate_name;
  np::cuda::CollectiveOptions co;
  co.repetitions = f.repetitions;
  {
    std::stringstream items(f.collective_bytes);
    for (std::string item; std::getline(items, item, ',');) {
      np::Result<int64_t> b = np::parse_bytes(item);
      if (!b || *b < 1 || *b > (int64_t{1} << 40))
        die("invalid --collective-bytes " + np::quote_input(item) +
            " (valid: sizes such as 1MiB,16MiB, each from 1 byte to 1 TiB)");
      co.bytes.push_back(*b);
    }
    if (co.bytes.empty()) die("invalid --collective-bytes '' (valid: sizes such as 1MiB,16MiB)");
  }

  np::Result<const np::cuda::Module*> module = np::cuda::load_module();
  if (!module) die("calibrate: " + module.error().message);
  const np::cuda::Module& m = **module;
  np::cuda::GpuProbe probe = m.probe_gpus();
  if (probe.count == 0) die("calibrate: no GPU: " + probe.why);
  // The collectives' ranks: one per GPU (the emulation's are threads on its one device).
  co.ranks = static_cast<int>(f.calibrate_ranks.value_or(probe.count));
  if (f.calibrate_ranks && co.ranks > probe.count && !m.emulated)
    die("invalid --ranks " + std::to_string(co.ranks) + " (valid: 1 to the " +
        std::to_string(probe.count) + " GPUs of this machine, one per rank)");
  for (int64_t& b : co.bytes)  // whole bf16 elements per rank
    b = std::max<int64_t>(1, b / (2 * co.ranks)) * 2 * co.ranks;
  m.select_device(0);
  np::Result<np::cuda::Calibration> r = m.calibrate(o);
  if (!r) {
    std::fprintf(stderr, "nanoplan: %s\n", r.error().message.c_str());
    return kExitRunFailed;
  }
  np::cuda::Calibration c = *r;
  std::vector<np::cuda::CalibratedCollective> collectives;
  if (co.ranks < 2) {
    c.notes.push_back("NVLink collectives not measured: one GPU (--ranks 2 or more measures "
                      "them); the catalog's or the generic figures stand");
  } else if (!m.calibrate_collectives) {
    c.notes.push_back("NVLink collectives not measured: the CUDA module was built without NCCL; "
                      "the catalog's or the generic figures stand");
  } else {
    np::Result<std::vector<np::cuda::CalibratedCollective>> cr = m.calibrate_collectives(co);
    if (!cr) {
      std::fprintf(stderr, "nanoplan: %s\n", cr.error().message.c_str());
      return kExitRunFailed;
    }
    collectives = *cr;
    m.select_device(0);
  }
  std::time_t now = std::time(nullptr);
  char day[32];
  std::strftime(day, sizeof day, "%Y-%m-%d", std::gmtime(&now));
  const double peak = gpu.bf16_dense_flops;
  auto num = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.6g", x);
    return std::string(b);
  };
  std::string t = "# Written by `nanoplan calibrate --gpu " + f.gpu + "` (nanoplan " +
                  NANOPLAN_VERSION + "), " + day + ",\n# on " + c.device +
                  ".\n# For --gpu FILE: " + gpu.name +
                  "'s datasheet figures from the catalog, [gpu.perf] measured here\n# "
                  "(docs/step-times.md). cudaMemGetInfo's total: " +
                  np::format_int(c.memory_bytes) + " bytes.\n";
  for (const std::string& n : c.notes) t += "# " + n + "\n";
  t += "[[gpu]]\nname = \"" + name + "\"\ndisplay_name = \"" +
       (gpu.display_name.empty() ? gpu.name : gpu.display_name) + " (calibrated)\"\n";
  if (!gpu.source.empty()) t += "source = " + nlohmann::json(gpu.source).dump() + "\n";
  t += "memory_bytes = " + std::to_string(gpu.memory_bytes) + "\nbf16_dense_flops = " + num(peak) +
       "\nhbm_bytes_per_s = " + num(gpu.hbm_bytes_per_s) +
       "\nnvlink_bytes_per_s = " + num(gpu.nvlink_bytes_per_s) +
       (gpu.sm_count > 0 ? "\nsm_count = " + std::to_string(gpu.sm_count) : std::string()) +
       "\n[gpu.perf]\n";
  t += "source = " + nlohmann::json("nanoplan calibrate on " + c.device + ", " + day).dump() +
       "\ngemm = [\n";
  // Efficiencies within the schema's bounds: a GEMM at most the datasheet peak, attention (the
  // full s^2 count of a causal kernel) at most twice it.
  for (const np::cuda::CalibratedGemm& g : c.gemm)
    t += "  [" + std::to_string(g.m) + ", " + std::to_string(g.n) + ", " + std::to_string(g.k) +
         ", " + num(std::clamp(g.flops_per_s / peak, 1e-9, 1.0)) + "],\n";
  t += "]\nattention = [\n";
  for (const np::cuda::CalibratedAttention& a : c.attention)
    t += "  [" + std::to_string(a.seq) + ", " + std::to_string(a.heads) + ", " +
         num(std::clamp(a.forward_flops_per_s / peak, 1e-9, 2.0)) + ", " +
         num(std::clamp(a.backward_flops_per_s / peak, 1e-9, 2.0)) + "],\n";
  t += "]\n";
  if (c.copy_bytes_per_s > 0) t += "memory_bytes_per_s = " + num(c.copy_bytes_per_s) + "\n";
  t += "kernel_overhead_s = " + num(std::clamp(c.kernel_overhead_s, 1e-9, 1e-3)) + "\n";
  // NVLink: the collectives measured here ([bus bytes/s, latency per ring step, 0], fitted to
  // the sizes below), and the catalog's rows for the kinds not measured.
  std::string measured_text;
  for (const np::cuda::CalibratedCollective& k : collectives) {
    t += "# " + k.kind + " over " + std::to_string(k.ranks) + " ranks:";
    for (const auto& [bytes, s] : k.seconds)
      t += " " + np::format_int(bytes) + " B " + num(s * 1e6) + " us;";
    t += "\n";
  }
  if (!collectives.empty())
    measured_text = "nanoplan calibrate on " + c.device + ", NCCL over " +
                    std::to_string(co.ranks) + " ranks, " + day;
  std::vector<std::string> rows;
  for (const char* kind : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"}) {
    auto measured = std::find_if(collectives.begin(), collectives.end(),
                                 [&](const auto& k) { return k.kind == kind; });
    if (measured != collectives.end()) {
      rows.push_back(std::string(kind) + " = [" + num(measured->bus_bytes_per_s) + ", " +
                     num(measured->step_latency_s) + ", 0]");
    } else if (const np::CollectivePerf* p = gpu.perf.collective(kind)) {
      rows.push_back(std::string(kind) + " = [" + num(p->bus_bytes_per_s) + ", " +
                     num(p->step_latency_s) + ", " + num(p->call_latency_s) + "]");
    }
  }
  if (!rows.empty()) {
    std::string catalog =
        gpu.perf.nvlink_source.empty() ? gpu.perf.source : gpu.perf.nvlink_source;
    std::string source = measured_text.empty() ? catalog
                         : gpu.perf.nvlink.empty()
                             ? measured_text
                             : measured_text + "; the kinds not measured: " + catalog;
    t += "nvlink_source = " + nlohmann::json(source).dump() + "\n[gpu.perf.nvlink]\n";
    for (const std::string& row : rows) t += row + "\n";
  }
  write_whole(f.output, t);
  // The file must load as --gpu FILE does.
  check(np::gpu_from_arg(models_dir(f) + "/gpus/gpus.toml", f.output));
  std::string measured_collectives =
      collectives.empty() ? std::string()
                          : ", NCCL collectives over " + std::to_string(co.ranks) + " ranks";
  std::printf("calibrated %s as %s: %zu GEMM shapes, %zu attention shapes%s%s; wrote %s\n",
              c.device.c_str(), name.c_str(), c.gemm.size(), c.attention.size(),
              c.copy_bytes_per_s > 0 ? ", a copy" : "", measured_collectives.c_str(),
              f.output.c_str());
  for (const std::string& n : c.notes) std::printf("  %s\n", n.c_str());
  return 0;
}

// --backend (executor/backend_choice.hpp); auto's fallback to the CPU executor is said on stderr.
Executor executor_for(const Flags& f) {
  Executor ex = check(np::exec::choose_executor(f.backend));
  if (!ex.fallback.empty())
    std::fprintf(stderr, "nanoplan: --backend auto: the CPU executor (%s)\n", ex.fallback.c_str());
  return ex;
}

np::exec::RunOptions run_options(const Flags& f, const Executor& ex) {
  np::exec::RunOptions o;
  o.device_memory = ex.device;
  o.steps = f.steps;
  o.seed = static_cast<uint64_t>(f.seed);
  if (!f.enforce_budget.empty()) {
    np::Result<int64_t> b = np::parse_bytes(f.enforce_budget);
    if (!b) die("--enforce-budget: " + b.error().message);
    o.enforce_budget = *b;
  }
  o.allocator = make_runtime(f).allocator;
  return o;
}

// The comparison of a run, with the cost model's step time beside the measured one on a GPU.
np::exec::RunComparison compare_run(const np::Schedule& s, const np::exec::RunResult& r,
                                    const std::string& title, const Flags& f, const Executor& ex) {
  std::optional<np::HardwareModel> hw;
  if (ex.device) hw = make_hardware(f);
  return np::exec::compare(s, r, title, make_runtime(f), hw ? &*hw : nullptr);
}

// run --record FILE: the run's memory record in Megatron-LM's report_memory form, for compare.
void write_record(const np::exec::RunResult& r, const Flags& f) {
  if (f.record.empty()) return;
  write_whole(f.record, np::exec::megatron_memory_record(r, f.steps));
  std::fprintf(stderr, "nanoplan: wrote %s (report_memory lines of %s; nanoplan compare --log %s "
               "with the same setup reads them)\n",
               f.record.c_str(),
               np::count_noun(static_cast<int64_t>(r.ranks.size()), "rank").c_str(),
               f.record.c_str());
}

// Prints a comparison as --format says; returns the exit code of its verdict.
int print_comparison(const np::exec::RunComparison& c, const Flags& f) {
  if (f.format == "json")
    std::cout << np::exec::comparison_json(c).dump(2) << "\n";
  else
    std::cout << np::exec::comparison_table(c);
  std::cout.flush();
  return c.all_equal ? 0 : kExitCheckFailed;
}

#if defined(NANOPLAN_HAVE_MPI)
// Under mpirun: this process runs its rank; process 0 prints the comparison of every rank, and
// every process exits with its verdict.
int run_one_mpi(const np::Schedule& s, const Flags& f, const std::string& title) {
  Executor ex = executor_for(f);
  np::exec::mpi::CommWrap wrap;
  if (ex.device && ex.cuda->make_nccl_comm)  // TP collectives through NCCL; pipeline on MPI
    wrap = ex.cuda->make_nccl_comm;
  auto r = np::exec::mpi::run_schedule(s, ex.backend, run_options(f, ex), ex.transfer, wrap);
  if (!r) die(r.error().message);
  int code = 0;
  if (r->has_value()) write_record(**r, f);
  if (r->has_value())
    code = print_comparison(
        compare_run(
            s, **r,
            title + " (" + std::to_string(s.setup.gpus()) + " MPI processes)",
            f, ex),
        f);
  return np::exec::mpi::broadcast_exit_code(code);
}
#endif

// Runs one schedule and prints the comparison; returns the exit code.
int run_one(const np::Schedule& s, const Flags& f, const std::string& title) {
  for (const np::StageProgram& p : s.stages)
    if (auto e = np::check_program(p)) die("--check-plan: " + e->message);
  if (f.check_plan) {  // static: no executor resources, any plan size
    size_t n = 0, t = 0;
    for (const np::StageProgram& p : s.stages) n += p.instrs.size(), t += p.tensors.size();
    std::printf(
        "plan OK: %s, %zu instructions, %zu tensors; every byte count matches its shape, every "
        "instruction but the frees matches the setup's schedule, every backward read is kept or "
        "recomputed\n",
        np::count_noun(static_cast<int64_t>(s.stages.size()), "stage program").c_str(), n, t);
    return 0;
  }
#if defined(NANOPLAN_HAVE_MPI)
  if (np::exec::mpi::launched()) return run_one_mpi(s, f, title);
#endif
  Executor ex = executor_for(f);
  if (auto e = np::exec::check_runnable(s, !ex.device)) die(e->message);
  if (!ex.device)
    if (auto e = np::exec::check_host_memory(s)) {  // the executor's limit: exit 4
      std::fprintf(stderr, "nanoplan: error: %s\n", e->message.c_str());
      return kExitRunFailed;
    }
  auto r = np::exec::run_schedule(s, ex.backend, run_options(f, ex), ex.world);
  if (!r) {
    std::fprintf(stderr, "nanoplan: %s\n", r.error().message.c_str());
    return kExitRunFailed;
  }
  if (r->out_of_memory) {
    const np::exec::OutOfBudget& oom = *r->out_of_memory;
    std::fprintf(stderr, "nanoplan: rank %lld: %s\n", static_cast<long long>(r->oom_rank),
                 oom.what());
    if (f.format == "json")
      std::cout << nlohmann::json{{"out_of_memory",
                                   {{"rank", r->oom_rank},
                                    {"tensor", oom.tensor},
                                    {"bytes", oom.bytes},
                                    {"in_use_bytes", oom.in_use},
                                    {"budget_bytes", oom.budget}}}}
                       .dump(2)
                << "\n";
    return kExitOutOfMemory;
  }
  write_record(*r, f);
  return print_comparison(compare_run(s, *r, title, f, ex), f);
}

int run_scenario(const Flags& f) {
#if defined(NANOPLAN_HAVE_MPI)
  if (np::exec::mpi::launched())
    die("--scenario runs its matrix in one process; under mpirun, run a plan or a setup");
#endif
  auto catalog = check(np::load_model_catalog(models_dir(f)));
  np::Scenario sc =
      check(np::load_scenario(check(np::find_scenario(f.scenario, models_dir(f))), catalog));
  Executor ex = executor_for(f);
  std::optional<np::HardwareModel> hw;
  if (ex.device) hw = make_hardware(f);
  int failed = 0;
  nlohmann::json all = nlohmann::json::array();
  auto started = [&] {
    if (f.format != "json")
      std::printf("scenario %s: %zu setups (%zu invalid combinations skipped)\n", sc.name.c_str(),
                  sc.matrix.size(), sc.skipped.size());
  };
  auto each = [&](const np::exec::ScenarioCase& k) {
    const np::exec::RunComparison& c = k.comparison;
    bool ok = k.why.empty();
    if (f.format == "json") {
      nlohmann::json j = np::exec::comparison_json(c);
      j["passed"] = ok;
      j["why"] = k.why;
      all.push_back(j);
      return;
    }
    long long most = 0;
    for (const auto& rk : c.ranks) most = std::max(most, std::llabs(rk.difference()));
    std::printf("  %-4s %-62s loss %.4f -> %.4f  max |measured - predicted| %lld B%s%s\n",
                ok ? "ok" : "FAIL", np::describe_short(k.setup).c_str(),
                c.losses.empty() ? 0.0 : c.losses.front(),
                c.losses.empty() ? 0.0 : c.losses.back(), most, ok ? "" : "  ", k.why.c_str());
    if (!c.all_equal) std::printf("%s", np::exec::comparison_table(c).c_str());
  };
  np::exec::ScenarioResult res = np::exec::run_scenario(sc, ex, run_options(f, ex), make_runtime(f),
                                                        hw ? &*hw : nullptr, started, each);
  std::string where = np::describe_short(res.stopped_at);
  switch (res.stop) {
    case np::exec::ScenarioStop::kNone:
      break;
    case np::exec::ScenarioStop::kRefused:
      die(f.scenario + ": " + where + ": " + res.message);
    case np::exec::ScenarioStop::kHostMemory:  // the executor's limit: exit 4
      std::fprintf(stderr, "nanoplan: error: %s: %s: %s\n", f.scenario.c_str(), where.c_str(),
                   res.message.c_str());
      return kExitRunFailed;
    case np::exec::ScenarioStop::kRunFailed:
      std::fprintf(stderr, "nanoplan: %s: %s\n", where.c_str(), res.message.c_str());
      return kExitRunFailed;
    case np::exec::ScenarioStop::kOutOfMemory:
      std::fprintf(stderr, "nanoplan: %s: %s\n", where.c_str(), res.message.c_str());
      return kExitOutOfMemory;
  }
  failed = res.failed;
  if (f.format == "json")
    std::cout << nlohmann::json{{"scenario", sc.name}, {"runs", all}, {"failed", failed}}.dump(2)
              << "\n";
  else
    std::printf("%d of %zu setups failed\n", failed, sc.matrix.size());
  return failed ? kExitCheckFailed : 0;
}

int run_run(const Flags& f, CLI::App* app) {
  bool setup = (!f.model.empty() || !f.nanotron_config.empty() || !f.torchtitan_config.empty()) &&
               f.plan_path.empty();
  int sources = !f.plan_path.empty() + !f.scenario.empty() + setup;
  if (sources != 1)
    die("run needs exactly one of: a plan file, --model (or --nanotron-config) with setup flags, "
        "or --scenario FILE");
  if (!f.scenario.empty()) {
    if (!f.record.empty())
      die("--record writes one run's record: give a plan file or a setup, not --scenario");
    return run_scenario(f);
  }
  if (!f.record.empty()) {  // a path that cannot be written is refused before the run
    std::ofstream probe(f.record + ".tmp", std::ios::binary);
    if (!probe) die("cannot write --record " + f.record + " (" + f.record + ".tmp)");
    probe.close();
    std::error_code ignored;
    std::filesystem::remove(f.record + ".tmp", ignored);
  }
  if (f.plan_path.empty()) {
    Resolved r = resolve(f);
    np::Schedule s = np::plan_setup(r.model, r.setup, plan_inputs(f)).schedule;
    return run_one(s, f, "run: " + r.model.name + ", " + np::describe_short(r.setup));
  }
  std::vector<std::string> setup_given;
  for (const np::SetupFlag& sf : np::setup_flags()) setup_given.emplace_back(sf.name);
  setup_given.insert(setup_given.end(),
                     {"--nanotron-config", "--megatron-args", "--torchtitan-config", "--gpus"});
  for (const std::string& flag : setup_given)
    if (app->count(flag) > 0)
      die(flag +
          " conflicts with a plan file: the setup comes from the plan (re-run nanoplan plan to "
          "change it)");
  np::Schedule s = check(np::load_plan(f.plan_path));
  // The plan's model against the catalog: the one named by --model, else the catalog entry of
  // the plan's model name (if it is a catalog model).
  auto catalog = check(np::load_model_catalog(models_dir(f)));
  std::optional<np::ModelSpec> named;
  if (!f.model.empty()) named = check(np::resolve_model(catalog, f.model));
  for (const np::ModelSpec& m : catalog)
    if (!named && m.name == s.model.name) named = m;
  if (named)
    if (auto e = np::check_plan_model(s.model, *named,
                                      f.model.empty() ? "the catalog's" : "the model's"))
      die(f.plan_path + ": " + e->message);
  return run_one(
      s, f, "run: " + f.plan_path + " (" + s.model.name + ", " + np::describe_short(s.setup) + ")");
}

#endif  // NANOPLAN_EXECUTOR

#if !defined(NANOPLAN_EXECUTOR)
// run, and report --run: this whole command line, handed to nanoplan-executor beside this binary
// (the same CLI with the executor), which parses it again. Under mpirun the process stays the same,
// so each rank's process becomes its executor process.
[[noreturn]] void exec_executor(char** argv) {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::filesystem::path executor = exe.parent_path() / "nanoplan-executor";
  if (ec || access(executor.c_str(), X_OK) != 0)
    die("this command runs the executor, nanoplan-executor, which is not built beside " +
        (ec ? std::string("this binary") : exe.string()) +
        " (build it: tools/build --target nanoplan-executor; tools/nanoplan builds it for run)");
  execv(executor.c_str(), argv);
  die("cannot start " + executor.string() + ": " + std::strerror(errno));
}
#endif

// A word as a POSIX shell reads it back: as is when plain, else in single quotes.
std::string shell_word(const std::string& w) {
  bool plain = !w.empty() && std::all_of(w.begin(), w.end(), [](unsigned char c) {
    return std::isalnum(c) || std::strchr("._-/%+:=,", c);
  });
  if (plain) return w;
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The sweep's options from the flags (sweep, and report --sweep-gpus).
np::SweepOptions make_sweep_options(const Flags& f) {
  Flags g = f;
  g.setup.set("--recompute", "auto");
  g.setup.set("--partition", "balanced");  // the sweep searches per setup when asked
  // --pp-schedule: one schedule or a list (afab,1f1b); estimate's default, afab, when not given.
  std::vector<np::PpSchedule> schedules;
  const std::string& list = f.sweep_schedules;
  for (size_t at = 0; at <= list.size();) {
    size_t comma = std::min(list.find(',', at), list.size());
    np::PpSchedule s =
        check(np::parse_enum<np::PpSchedule>("--pp-schedule", list.substr(at, comma - at)));
    if (s == np::PpSchedule::kInterleaved)
      die("invalid --pp-schedule interleaved for sweep (valid: afab, 1f1b, or both as afab,1f1b; "
          "--virtual-stages 1,2,4 adds the interleaved schedule)");
    if (std::find(schedules.begin(), schedules.end(), s) == schedules.end()) schedules.push_back(s);
    at = comma + 1;
  }
  g.setup.set("--pp-schedule", np::name_of(schedules.front()));
  np::SweepOptions o;
  o.schedules = schedules;
  o.gpus = f.gpus, o.budget = *make_budget(f), o.global_batch = f.global_batch.value_or(0);
  o.headroom = headroom_of(f);
  o.model_arg = shell_word(f.model);
  // --budget sets the budget; --gpu the cost model, and the budget when --budget is not given.
  o.budget_flags = (f.budget.empty() ? std::string() : "--budget " + shell_word(f.budget)) +
                   (f.gpu.empty() || f.budget.empty() ? "" : " ") +
                   (f.gpu.empty() ? std::string() : "--gpu " + shell_word(f.gpu));
  if (f.headroom != "3%") o.budget_flags += " --headroom " + shell_word(f.headroom);
  if (f.allocator != "caching") o.budget_flags += " --allocator " + shell_word(f.allocator);
  if (!f.allocator_conf.empty()) o.budget_flags += " --allocator-conf " + shell_word(f.allocator_conf);
  o.base = make_setup(g);
  if (o.base.tp_comm_overlap && o.base.impl != np::Impl::kMegatron)  // else every TP setup fails
    die("--tp-comm-overlap on is Transformer Engine's under Megatron and needs --impl megatron; "
        "use --tp-comm-overlap off");
  // Float8 whose recipe the profile has not: every setup would fail.
  if (auto e = np::check_fp8_profile(o.base)) die(e->message);
  o.runtime = make_runtime(f);
  o.hw = make_hardware(f);
  if (auto e = np::check_fp8_gpu(o.base, o.hw)) die(e->message);
  o.search_partition = f.setup["--partition"] == "auto";
  // A comma-separated list of degrees from 1 to `most`, or the one-line error naming the flag.
  auto degrees = [](const char* flag, const std::string& text, const std::string& what,
                    int64_t most) {
    const std::string valid = what + " from 1 to " + std::to_string(most) + ", such as 1,2,4";
    std::vector<int64_t> out = check(np::parse_count_list(flag, text, valid));
    for (int64_t d : out)
      if (d < 1 || d > most)
        die(std::string("invalid ") + flag + " " + np::quote_input(text) + " (valid: " + valid + ")");
    return out;
  };
  o.virtual_stages = degrees("--virtual-stages", f.sweep_virtual, "chunk counts", 64);
  o.context_parallel = degrees("--cp", f.sweep_cp, "context-parallel degrees", 64);
  if (!f.sweep_ep.empty())
    o.expert_parallel = degrees("--ep", f.sweep_ep, "expert-parallel degrees", 1024);
  return o;
}

int run_sweep(const Flags& f) {
  if (f.budget.empty() && f.gpu.empty()) die("sweep needs a budget: give --budget or --gpu");
  if (f.format != "table" && f.format != "json" && f.format != "csv")
    die("invalid --format " + np::quote_input(f.format) + " (valid: table, json, csv)");
  if (f.setup["--partition"] != "balanced" && f.setup["--partition"] != "auto")
    die("invalid --partition " + np::quote_input(f.setup["--partition"]) +
        " for sweep (valid: balanced, auto; layer counts depend on pp)");
  auto catalog = check(np::load_model_catalog(models_dir(f)));
  np::ModelSpec m = check(np::resolve_model(catalog, f.model));
  if (m.moe && !m.dense_layers.empty() && f.setup["--partition"] == "auto")
    die(m.name + " has dense and MoE layers, which --partition auto does not search yet (valid: "
        "--partition balanced)");
  np::SweepOptions o = make_sweep_options(f);
  for (int64_t ep : o.expert_parallel)
    if (ep > 1 && !m.moe)
      die("invalid --ep " + np::quote_input(f.sweep_ep) + ": " + m.name +
          " has no experts (valid: 1, or an MoE model)");
  bool tty = isatty(fileno(stderr)) && f.format == "table";
  auto progress = [&](size_t done, size_t total) {
    if (!tty) return;
    int width = 40, filled = static_cast<int>(width * done / std::max<size_t>(1, total));
    std::fprintf(stderr, "\r  [%s%s] %zu/%zu setups", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), done, total);
    if (done == total) std::fprintf(stderr, "\n");
  };
  np::SweepReport r = np::sweep(m, o, progress);
  if (f.format == "json")
    std::cout << np::sweep_json(r, m, o, static_cast<size_t>(f.top)).dump(2) << "\n";
  else if (f.format == "csv")
    std::cout << np::sweep_csv(r, o, static_cast<size_t>(f.top));
  else
    std::cout << np::sweep_table(r, m, o, static_cast<size_t>(f.top));
  return 0;
}

// report: the HTML file of a setup's plan (html_report.hpp), written whole or not at all.
int run_report(const Flags& f) {
  if (f.output.empty() || f.output == "-")
    die("report needs -o FILE.html (one self-contained file)");
  Resolved r = resolve(f);
  np::PlanInputs planning = plan_inputs(f);
  const std::optional<int64_t>& budget = planning.budget;
  np::ReportInput in;
  in.command = f.command_line;
  np::PlannedSetup planned = np::plan_setup(r.model, r.setup, planning);  // planned once
  in.plan = std::move(planned.plan);
  in.schedule = std::move(planned.schedule);
  in.estimate = std::move(planned.estimate);
#if defined(NANOPLAN_EXECUTOR)  // else main handed report --run to nanoplan-executor
  if (f.report_run) {
    Executor ex = executor_for(f);
    if (auto e = np::exec::check_runnable(in.schedule, !ex.device)) die("--run: " + e->message);
    np::exec::RunOptions o = run_options(f, ex);
    o.steps = 1;
    auto run = np::exec::run_schedule(in.schedule, ex.backend, o, ex.world);
    if (!run) die("--run: " + run.error().message);
    in.measured.resize(in.schedule.stages.size());
    for (const np::exec::RankResult& rr : run->ranks)
      if (rr.tp_rank == 0 && rr.dp_rank == 0 && rr.cp_rank == 0 && !rr.events.empty())
        in.measured.at(static_cast<size_t>(rr.stage)) = rr.events.front();
    in.measured_by = ex.device ? "the CUDA executor" : "the CPU executor";
  }
#endif
  if (f.sweep_gpus > 0) {
    if (!budget) die("report --sweep-gpus needs a budget: give --budget or --gpu");
    Flags g = f;
    g.gpus = f.sweep_gpus, g.model = r.model.name;
    g.sweep_schedules = f.setup["--pp-schedule"];  // the report's own schedule
    in.sweep_options = make_sweep_options(g);
    in.sweep = np::sweep(r.model, in.sweep_options);
  }
  std::string html = np::html_report(in);
  write_whole(f.output, html);
  std::fprintf(stderr, "nanoplan: wrote %s (%s)\n", f.output.c_str(),
               np::format_binary(static_cast<int64_t>(html.size())).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
#if !defined(NANOPLAN_EXECUTOR)
  // A short-lived planner process: freed schedule programs stay in the heap for the next one
  // instead of going back to the kernel and faulting in again (a sixth of a 405B plan's time);
  // the executor's large tensors keep glibc's defaults.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
#if defined(NANOPLAN_EXECUTOR) && defined(NANOPLAN_HAVE_MPI)
  if (np::exec::mpi::launched()) {  // one process per rank: only process 0 prints results
    g_mpi_rank = np::exec::mpi::init(&argc, &argv).rank;
    std::atexit([] { np::exec::mpi::finalize(); });
    if (g_mpi_rank != 0 && !std::freopen("/dev/null", "w", stdout)) return kExitRunFailed;
  }
#endif
  CLI::App app{"nanoplan: does a training setup fit in GPU memory, and what should be recomputed"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("nanoplan ") + NANOPLAN_VERSION + " (plan format " +
                                        std::to_string(np::kScheduleFormatVersion) + ")");
  Flags f;
  const std::string commands[] = {"estimate", "plan",      "run",    "compare", "sweep",
                                  "report",   "calibrate", "models", "gpus"};
  if (argc > 1 && argv[1][0] != '-' &&
      std::find(std::begin(commands), std::end(commands), argv[1]) == std::end(commands))
    die("unknown subcommand " + np::quote_input(argv[1]) +
        " (valid: estimate, plan, run, compare, sweep, report, calibrate, models, gpus)");
  for (int i = 0; i < argc; ++i)
    f.command_line += (i ? " " : "") + shell_word(i == 0 ? std::string("nanoplan") : argv[i]);
  CLI::App* est = app.add_subcommand("estimate", "per-GPU memory breakdown of a training setup");
  add_setup_flags(est, f);
  CLI::App* plan =
      app.add_subcommand("plan", "write the schedule (what to keep, drop, recompute) as JSON");
  add_setup_flags(plan, f);
  plan->add_option("-o,--output", f.output, "output file (default: stdout)");
  CLI::App* cmp = app.add_subcommand(
      "compare", "a training run's own memory record (Megatron-LM, nanotron, torchtitan logs, "
                 "a PyTorch memory snapshot) beside the estimate of its setup, per rank");
  add_setup_flags(cmp, f);
  cmp->add_option("--log", f.logs,
                  "a run's record (repeat for several), found by content: Megatron-LM's "
                  "report_memory lines, nanotron's log_memory lines or benchmark CSV, torchtitan's "
                  "metrics lines, torch.cuda.memory._dump_snapshot()'s pickle")
      ->required();
  cmp->add_option("--format", f.format, "table, json")->capture_default_str();
  CLI::App* rep = app.add_subcommand(
      "report", "write one self-contained HTML file: memory over the step, the plan per layer, "
                "the layer options, the sweep");
  add_setup_flags(rep, f);
  rep->add_option("-o,--output", f.output, "the HTML file to write")->required();
  rep->add_flag("--run", f.report_run,
                "run the plan on the CPU executor and draw the measured memory too (small models)");
  add_int(rep, "--sweep-gpus", f.sweep_gpus, "also sweep setups on this many GPUs", 1, 1 << 20);
  rep->add_option("--backend", f.backend, "cpu (the --run executor)")->capture_default_str();
  CLI::App* run = app.add_subcommand(
      "run",
      "execute a plan (or a setup, or a scenario) and compare predicted with measured peak memory");
  add_setup_flags(run, f);
  run->add_option("plan", f.plan_path, "plan file written by nanoplan plan");
  run->add_option("--scenario", f.scenario,
                  "scenario file (scenarios/*.toml): run its whole setup matrix");
  run->add_option("--backend", f.backend,
                  "cpu (the reference executor), cuda, auto (cuda when a GPU can run the step, "
                  "else cpu)")
      ->capture_default_str();
  add_int(run, "--steps", f.steps, "training steps to run", 1, 1'000'000);
  add_int(run, "--seed", f.seed, "seed of weights, data and dropout", 0, kNoBound);
  run->add_flag("--check-plan", f.check_plan,
                "only check the plan: every backward read kept or recomputed");
  run->add_option("--record", f.record,
                  "write the run's memory record to FILE, as Megatron-LM's report_memory lines "
                  "(one per rank), for nanoplan compare --log FILE");
  run->add_option("--enforce-budget", f.enforce_budget,
                  "refuse allocations past this many bytes per rank (exit 3)");
  CLI::App* sw = app.add_subcommand("sweep",
                                    "search tp, pp, dp, ZeRO stage and micro-batch, each with its "
                                    "optimal recompute plan; rank by throughput");
  sw->add_option("--model", f.model, "model name or alias, or a path")->required();
  add_int(sw, "--gpus", f.gpus, "GPUs to use (tp x pp x dp)", 1, 1 << 20)->required();
  sw->add_option("--budget", f.budget, "bytes per GPU: 80GB, 80GiB, ...");
  sw->add_option("--gpu", f.gpu,
                 "GPU (nanoplan gpus), or a GPU file (FILE.toml, one [[gpu]] table): the cost "
                 "model, and the budget unless --budget gives one");
  add_headroom_flag(sw, f);
  add_allocator_flags(sw, f);
  add_setup_flag(sw, f, setup_flag("--seq-len"), "sequence length");
  add_int(sw, "--global-batch", f.global_batch, "sequences per optimizer step (default 4 x gpus)",
          1, 1 << 30);
  sw->add_option("--pp-schedule", f.sweep_schedules,
                 "schedules to try: afab (the default, as estimate's), 1f1b, or afab,1f1b")
      ->capture_default_str();
  sw->add_option("--ep", f.sweep_ep,
                 "expert-parallel degrees to try for an MoE model, e.g. 1,2,4 (default: every power "
                 "of two that divides its experts)");
  sw->add_option("--cp", f.sweep_cp,
                 "context-parallel degrees to try, e.g. 1,2,4 (long sequences: each sequence split "
                 "over cp ranks)")
      ->capture_default_str();
  sw->add_option("--virtual-stages", f.sweep_virtual,
                 "chunks per pipeline stage to try, e.g. 1,2,4: 1 is --pp-schedule, more the "
                 "interleaved schedule")
      ->capture_default_str();
  add_setup_flag(sw, f, setup_flag("--attention"), "flash, eager");
  add_setup_flag(sw, f, setup_flag("--impl"), "nanotron, megatron, fused, hf");
  add_setup_flag(sw, f, setup_flag("--overlap-grad-reduce"),
                 "on, off: Megatron's overlapped DP gradient reduction (step time only)");
  add_setup_flag(sw, f, setup_flag("--overlap-param-gather"),
                 "on, off: Megatron's overlapped parameter gather, for the setups with --zero 1 "
                 "or more (step time only)");
  add_setup_flag(sw, f, setup_flag("--tp-comm-overlap"),
                 "on, off: Transformer Engine's TP communication overlap (userbuffers), for the "
                 "setups with --tp 2 or more (--impl megatron)");
  add_setup_flag(sw, f, setup_flag("--partition"),
                 "layers per stage: balanced (by FLOPs), auto (searched for every setup)");
  add_setup_flag(sw, f, setup_flag("--fp8"),
                 "none, delayed, tensorwise, rowwise, rowwise_with_gw_hp: float8 linears in every "
                 "setup (Transformer Engine's under --impl megatron, torchao's under --impl "
                 "torchtitan --fsdp); setups whose sizes the recipe refuses are skipped");
  add_setup_flag(sw, f, setup_flag("--fsdp"),
                 "FSDP2 in place of the ZeRO stages (docs/fsdp.md): every setup shards with "
                 "FSDP2 over its dp (resharding after forward without PP, keeping the units "
                 "under PP)");
  add_int(sw, "--top", f.top, "setups to show", 1, 1'000'000);
  sw->add_option("--format", f.format, "table, json, csv")->capture_default_str();
  sw->add_option("--models-dir", f.models_dir, "model catalog folder");
  CLI::App* cal = app.add_subcommand(
      "calibrate",
      "measure this machine's GPU (GEMMs, attention, a copy) into a GPU file for --gpu FILE");
  cal->add_option("--gpu", f.gpu,
                  "the catalog GPU (or GPU file) whose datasheet figures the rates are fractions "
                  "of")
      ->required();
  cal->add_option("-o,--output", f.output, "the GPU file to write (TOML)")->required();
  cal->add_option("--name", f.calibrate_name, "the written GPU's name (default: GPU-calibrated)");
  cal->add_option("--gemm-shapes", f.gemm_shapes,
                  "GEMMs to time, MxNxK,... (an MxN output over K; default: 1024, 4096 and "
                  "16384 in each dimension)");
  cal->add_option("--attention-shapes", f.attention_shapes,
                  "flash attention to time, SEQxHEADS,... (batch 1; default: seq 1024, 4096, "
                  "16384 x heads 4 to 64)");
  add_int(cal, "--head-dim", f.head_dim, "attention head dimension", 1, 1024);
  cal->add_option("--copy-bytes", f.copy_bytes, "bytes of the device copy")->capture_default_str();
  add_int(cal, "--repetitions", f.repetitions, "timed repetitions per figure (the median)", 1,
          1000);
  add_int(cal, "--ranks", f.calibrate_ranks,
          "GPUs the NCCL collectives run over, one rank each (default: every GPU of the machine; "
          "1 measures none)",
          1, 1024);
  cal->add_option("--collective-bytes", f.collective_bytes,
                  "collective sizes to time: the full tensor (all-reduce, all-gather, "
                  "reduce-scatter), what each rank sends (all-to-all, point-to-point)")
      ->capture_default_str();
  cal->add_option("--models-dir", f.models_dir, "model catalog folder");
  CLI::App* models = app.add_subcommand("models", "list the model catalog with parameter counts");
  models->add_option("--models-dir", f.models_dir, "model catalog folder");
  CLI::App* gpus = app.add_subcommand("gpus", "list the GPU catalog");
  gpus->add_option("--models-dir", f.models_dir, "model catalog folder");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // CLI11's own words, said as nanoplan says things: the arguments it did not expect (it lists
    // them last first), a second subcommand, a missing required option.
    std::string what = e.what(), cmd = "nanoplan";
    for (CLI::App* sub : app.get_subcommands()) cmd += " " + sub->get_name();
    for (const char* lead : {"The following arguments were not expected: ",
                             "The following argument was not expected: "})
      if (what.rfind(lead, 0) == 0) {
        std::vector<std::string> words;
        std::istringstream in(what.substr(std::strlen(lead)));
        for (std::string w; in >> w;) words.insert(words.begin(), w);
        std::string list;
        for (const std::string& w : words) list += (list.empty() ? "" : " ") + w;
        die("unexpected argument" + std::string(words.size() > 1 ? "s" : "") + " for " + cmd +
            ": " + np::quote_input(list) + "; see " + cmd + " --help");
      }
    if (what.find("subcommand") != std::string::npos || what.find("At Most 1") != std::string::npos)
      die("give one subcommand (valid: estimate, plan, run, compare, sweep, report, calibrate, "
          "models, gpus); see nanoplan --help");
    if (what.find(" is required") != std::string::npos)
      die(what + " for " + cmd + "; see " + cmd + " --help");
    die(what + "; see " + cmd + " --help");
  }
  for (CLI::App* sub : app.get_subcommands()) refuse_empty_values(sub);
  try {
    if (est->parsed()) return run_estimate(f);
    if (plan->parsed()) return run_plan(f);
    if (cmp->parsed()) return run_compare(f);
#if defined(NANOPLAN_EXECUTOR)
    if (run->parsed()) return run_run(f, run);
    if (cal->parsed()) return run_calibrate(f);
#else
    if (run->parsed() || cal->parsed() || (rep->parsed() && f.report_run)) exec_executor(argv);
#endif
    if (rep->parsed()) return run_report(f);
    if (sw->parsed()) return run_sweep(f);
    if (models->parsed()) return run_models(f);
    return run_gpus(f);
  } catch (const std::overflow_error& e) {
    die(std::string("too large to count in 64-bit bytes: ") + e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nanoplan: internal error: %s\n", e.what());
    return kExitRunFailed;
  }
}

// Scenario files: parsing, the setup matrix, validation of every combination.
#include "planner/inputs/scenario.hpp"

#include <filesystem>

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>

#include "planner/inputs/catalog.hpp"
#include "planner/inputs/read_file.hpp"
#include "planner/inputs/toml_model.hpp"

namespace np {
namespace {

Result<TrainSpec> read_setup(const toml::table& t, const std::string& path) {
  TomlReader r(t, path, "setup.");
  r.only({"tp", "pp", "dp", "cp", "ep", "zero", "seq_len", "micro_batch", "microbatches", "sp",
          "tp_recompute_allgather", "pp_schedule", "virtual_stages", "attention", "impl",
          "recompute", "optimizer", "grad_accum_dtype", "moe_capacity_factor",
          "cross_entropy_fusion", "gradient_accumulation_fusion", "fsdp",
          "reshard_after_forward", "dp_replicate", "recompute_every", "fp8", "fp8_all_gather"});
  TrainSpec s;
  s.tp = r.integer_in("tp", 1, 4096, s.tp), s.pp = r.integer_in("pp", 1, 4096, s.pp);
  s.dp = r.integer_in("dp", 1, 1 << 20, s.dp);
  s.cp = r.integer_in("cp", 1, 4096, s.cp);
  s.ep = r.integer_in("ep", 1, 4096, s.ep);
  s.moe_capacity_factor = r.number("moe_capacity_factor", 0.0);
  s.zero = static_cast<int>(r.integer_in("zero", 0, 3, s.zero));
  s.seq_len = r.integer_in("seq_len", 1, int64_t{1} << 24, s.seq_len);
  s.micro_batch = r.integer_in("micro_batch", 1, int64_t{1} << 24, s.micro_batch);
  s.microbatches = r.integer_in("microbatches", 1, 65536, s.microbatches);
  s.sp = r.boolean("sp", s.tp > 1);
  s.tp_recompute_allgather = r.boolean("tp_recompute_allgather", true);
  s.pp_schedule = r.choice("pp_schedule", PpSchedule::kAfab);
  // The interleaved schedule's chunks per stage (a matrix's interleaved rows take it; default 2).
  s.virtual_stages =
      r.integer_in("virtual_stages", 1, 4096, s.pp_schedule == PpSchedule::kInterleaved ? 2 : 1);
  s.attention = r.choice("attention", AttentionImpl::kFlash);
  s.impl = r.choice("impl", Impl::kNanotron);
  s.recompute = r.choice("recompute", Recompute::kNone);
  s.optimizer = r.choice("optimizer", Optimizer::kAdamW);
  s.grad_dtype = r.choice("grad_accum_dtype", Dtype::kFp32);
  s.loss_fusion = r.choice("cross_entropy_fusion", LossFusion::kNone);
  s.grad_accum_fusion = r.boolean("gradient_accumulation_fusion", true);
  s.fsdp = r.boolean("fsdp", false);
  s.reshard_after_forward = r.boolean("reshard_after_forward", true);
  s.dp_replicate = r.integer_in("dp_replicate", 1, 1 << 20, 1);
  s.recompute_every = r.integer_in("recompute_every", 1, 1 << 20, 1);
  s.fp8 = r.choice("fp8", Fp8Recipe::kNone);
  s.fp8_all_gather = r.boolean("fp8_all_gather", false);
  if (auto e = r.error()) return *e;
  return s;
}

template <typename E>
Result<std::vector<E>> enums(TomlReader& r, const char* key, E fallback) {
  std::vector<E> out;
  for (const std::string& text : r.list<std::string>(key, name_of(fallback))) {
    if (r.error()) return *r.error();
    Result<E> e = parse_enum<E>(std::string("matrix.") + key, text);
    if (!e) return make_error(r.where(key) + ": " + e.error().message);
    out.push_back(*e);
  }
  if (r.error()) return *r.error();
  return out;
}

Result<std::vector<TrainSpec>> expand(const Scenario& sc, const toml::table* m,
                                      std::vector<std::string>& skipped) {
  static const toml::table empty;
  TomlReader r(m ? *m : empty, sc.path, "matrix.");
  r.only({"tp", "pp", "dp", "cp", "ep", "zero", "sp", "pp_schedule", "recompute", "attention",
          "impl", "tp_recompute_allgather", "reshard_after_forward", "dp_replicate",
          "recompute_every", "fp8", "fp8_all_gather"});
  std::vector<int64_t> tps = r.list<int64_t>("tp", sc.base.tp),
                       pps = r.list<int64_t>("pp", sc.base.pp);
  std::vector<int64_t> replicates = r.list<int64_t>("dp_replicate", sc.base.dp_replicate),
                       everys = r.list<int64_t>("recompute_every", sc.base.recompute_every);
  std::vector<int64_t> dps = r.list<int64_t>("dp", sc.base.dp),
                       zeros = r.list<int64_t>("zero", sc.base.zero),
                       cps = r.list<int64_t>("cp", sc.base.cp),
                       eps = r.list<int64_t>("ep", sc.base.ep);
  std::vector<bool> sps = r.list<bool>("sp", sc.base.sp),
                    regathers =
                        r.list<bool>("tp_recompute_allgather", sc.base.tp_recompute_allgather),
                    reshards = r.list<bool>("reshard_after_forward", sc.base.reshard_after_forward),
                    fp8_gathers = r.list<bool>("fp8_all_gather", sc.base.fp8_all_gather);
  if (auto e = r.error()) return *e;
  auto scheds = enums(r, "pp_schedule", sc.base.pp_schedule);
  if (!scheds) return scheds.error();
  auto recs = enums(r, "recompute", sc.base.recompute);
  if (!recs) return recs.error();
  auto atts = enums(r, "attention", sc.base.attention);
  if (!atts) return atts.error();
  auto impls = enums(r, "impl", sc.base.impl);
  if (!impls) return impls.error();
  auto fp8s = enums(r, "fp8", sc.base.fp8);
  if (!fp8s) return fp8s.error();
  size_t combinations = tps.size() * pps.size() * dps.size() * cps.size() * eps.size() *
                        zeros.size() * sps.size() * regathers.size() * scheds->size() *
                        recs->size() * atts->size() * impls->size() * reshards.size() *
                        replicates.size() * everys.size() * fp8s->size() * fp8_gathers.size();
  if (combinations > 16384)
    return make_error(sc.path + ": [matrix] spans " + std::to_string(combinations) +
                      " combinations (valid: at most 16,384)");
  std::vector<TrainSpec> out;
  for (int64_t tp : tps)
    for (int64_t pp : pps)
      for (int64_t dp : dps)
        for (int64_t cp : cps)
          for (int64_t ep : eps)
            for (int64_t zero : zeros)
              for (bool sp : sps)
                for (PpSchedule sched : *scheds)
                  for (Recompute rec : *recs)
                    for (AttentionImpl att : *atts)
                      for (Impl impl : *impls)
                        for (bool rg : regathers)
                        for (bool reshard : reshards)
                        for (int64_t replicate : replicates)
                        for (int64_t every : everys)
                        for (Fp8Recipe fp8 : *fp8s)
                        for (bool fp8_gather : fp8_gathers) {
                          if (!sp && !rg)
                            continue;  // without SP there is no all-gather to keep: a duplicate
                          TrainSpec t = sc.base;
                          t.reshard_after_forward = reshard, t.dp_replicate = replicate;
                          t.recompute_every = every, t.fp8 = fp8, t.fp8_all_gather = fp8_gather;
                          t.tp = tp, t.pp = pp, t.sp = sp, t.tp_recompute_allgather = rg;
                          t.dp = dp, t.cp = cp, t.ep = ep;
                          t.zero = static_cast<int>(std::clamp<int64_t>(zero, -1, 4));
                          t.pp_schedule = sched, t.recompute = rec, t.attention = att;
                          t.impl = impl;
                          // setup.virtual_stages (default 2) is the interleaved rows' chunk count
                          t.virtual_stages = sched != PpSchedule::kInterleaved
                                                 ? 1
                                                 : std::max<int64_t>(2, sc.base.virtual_stages);
                          if (auto e = validate_setup(sc.model, t)) {
                            skipped.push_back(describe_short(t) + ": " + e->message);
                            continue;
                          }
                          out.push_back(t);
                        }
  return out;
}

}  // namespace

std::string describe_short(const TrainSpec& t) {
  return "tp " + std::to_string(t.tp) + (t.cp > 1 ? " cp " + std::to_string(t.cp) : "") + " pp " +
         std::to_string(t.pp) +
         (t.dp > 1 ? " dp " + std::to_string(t.dp) +
                         (t.fsdp ? std::string(" fsdp") +
                                       (t.dp_replicate > 1
                                            ? " x" + std::to_string(t.dp_replicate) + " replicas"
                                            : "") +
                                       (t.reshard_after_forward ? "" : " keep")
                                 : " zero " + std::to_string(t.zero))
                   : "") +
         (t.ep > 1 ? " ep " + std::to_string(t.ep) : "") + " sp " + (t.sp ? "on" : "off") + " " +
         name_of(t.pp_schedule) +
         (t.pp_schedule == PpSchedule::kInterleaved ? " x" + std::to_string(t.virtual_stages)
                                                    : "") +
         " recompute " + name_of(t.recompute) +
         (t.recompute_every > 1 ? " every " + std::to_string(t.recompute_every) : "") +
         (t.sp && !t.tp_recompute_allgather ? " keep-gathered" : "") + " " + name_of(t.attention) +
         (t.impl != Impl::kNanotron ? std::string(" ") + name_of(t.impl) : "") +
         (t.fp8 != Fp8Recipe::kNone ? std::string(" fp8 ") + name_of(t.fp8) : "") +
         (t.fp8_all_gather ? " all-gathered" : "");
}

Result<std::string> find_scenario(const std::string& name, const std::string& models_dir) {
  if (name.ends_with(".toml") || name.find('/') != std::string::npos) return name;
  std::filesystem::path models(models_dir);
  if (!models.has_filename()) models = models.parent_path();  // "dir/models/"
  std::filesystem::path dir = models.parent_path() / "scenarios";
  std::error_code ec;
  if (std::filesystem::exists(dir / (name + ".toml"), ec)) return (dir / (name + ".toml")).string();
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".toml") found.push_back(e.path().stem().string());
  std::sort(found.begin(), found.end());
  std::string names;
  for (const std::string& n : found) names += (names.empty() ? "" : ", ") + n;
  return make_error("unknown scenario " + quote_input(name) + " (valid: " +
                    (names.empty() ? std::string("a scenario file") : names) +
                    ", or a path to a .toml)");
}

Result<Scenario> load_scenario(const std::string& path, const std::vector<ModelSpec>& models) {
  Result<std::string> text = read_text_file(path, "scenario");
  if (!text) return text.error();
  return scenario_from_text(*text, path, models);
}

Result<Scenario> scenario_from_text(const std::string& text, const std::string& path,
                                    const std::vector<ModelSpec>& models) {
  Result<toml::table> parsed = parse_toml_text(text, path);
  if (!parsed) return parsed.error();
  const toml::table& doc = *parsed;
  TomlReader r(doc, path);
  r.only({"name", "description", "steps", "model", "setup", "matrix", "expect"});
  Scenario sc;
  sc.path = path;
  sc.name = r.string("name");
  sc.description = r.string("description", "");
  sc.steps = static_cast<int>(r.integer_in("steps", 1, 100000, 1));
  const toml::table* setup = r.table("setup");
  const toml::table* matrix = r.table("matrix");
  const toml::table* expect = r.table("expect");
  if (auto e = r.error()) return *e;
  if (const toml::node* n = doc.get("model"); n && n->is_string()) {
    auto m = resolve_model(models, *n->value<std::string>());
    if (!m) return make_error(r.where("model") + ": model: " + m.error().message);
    sc.model = *m;
  } else if (n && n->is_table()) {
    auto m = model_from_table(*n->as_table(), path);  // its errors carry the file and line
    if (!m) return m.error();
    sc.model = *m;
  } else if (n) {
    return make_error(r.where("model") +
                      ": model: expected a catalog name or a [model] table, got " + shown(*n));
  } else {
    return make_error(path + ": missing 'model' (a catalog name, or an inline [model] table)");
  }
  static const toml::table empty;
  Result<TrainSpec> base = read_setup(setup ? *setup : empty, path);
  if (!base) return base.error();
  sc.base = *base;
  if (expect) {
    TomlReader e(*expect, path, "expect.");
    e.only({"predicted_equals_measured", "first_loss_rel_ln_vocab", "loss_decreases"});
    sc.expect.predicted_equals_measured = e.boolean("predicted_equals_measured", true);
    sc.expect.first_loss_rel_ln_vocab = e.number("first_loss_rel_ln_vocab", 0.0);
    sc.expect.loss_decreases = e.boolean("loss_decreases", false);
    if (auto err = e.error()) return *err;
    double rel = sc.expect.first_loss_rel_ln_vocab;
    if (expect->get("first_loss_rel_ln_vocab") && !(rel > 0 && rel <= 1))
      return make_error(e.where("first_loss_rel_ln_vocab") +
                        ": expect.first_loss_rel_ln_vocab: expected a fraction in (0, 1] (omit the "
                        "key to skip the check), got " +
                        shown(*expect->get("first_loss_rel_ln_vocab")));
  }
  auto m = expand(sc, matrix, sc.skipped);
  if (!m) return m.error();
  sc.matrix = std::move(*m);
  if (sc.matrix.empty())
    return make_error(path + ": no valid setup in the matrix (" +
                      (sc.skipped.empty() ? std::string("empty") : sc.skipped.front()) + ")");
  return sc;
}

std::string scenario_failures(const Scenario& sc, const TrainSpec& t,
                              bool predicted_equals_measured, const std::vector<double>& losses) {
  std::string why;
  double ln_v = std::log(static_cast<double>(padded_vocab(sc.model, t)));
  if (sc.expect.predicted_equals_measured && !predicted_equals_measured)
    why += "predicted != measured; ";
  if (sc.expect.first_loss_rel_ln_vocab > 0 && !losses.empty() &&
      std::abs(losses.front() - ln_v) > sc.expect.first_loss_rel_ln_vocab * ln_v)
    why += "first loss " + std::to_string(losses.front()) + " is not within " +
           std::to_string(sc.expect.first_loss_rel_ln_vocab * 100) +
           "% of ln(vocab) = " + std::to_string(ln_v) + "; ";
  if (sc.expect.loss_decreases && losses.size() > 1 && !(losses.back() < losses.front()))
    why += "loss did not decrease; ";
  return why;
}

}  // namespace np

// Scenario files: parsing, the setup matrix, validation of every combination.
#include "planner/scenario.hpp"

#include <cmath>

#include <toml++/toml.h>

#include "planner/catalog.hpp"
#include "planner/toml_model.hpp"

namespace np {
namespace {

template <typename T>
std::vector<T> list_of(const toml::table& m, const char* key, T fallback) {
  std::vector<T> out;
  if (const toml::array* a = m.get_as<toml::array>(key)) {
    for (const toml::node& n : *a)
      if (auto v = n.value<T>()) out.push_back(*v);
  }
  if (out.empty()) out.push_back(fallback);
  return out;
}

Error at(const std::string& path, const toml::node* n, const std::string& what) {
  std::string line = n ? ":" + std::to_string(n->source().begin.line) : "";
  return make_error(path + line + ": " + what);
}

Result<TrainSpec> read_setup(const toml::table& t, const std::string& path) {
  TrainSpec s;
  auto integer = [&](const char* key, int64_t& out) {
    if (auto v = t[key].value<int64_t>()) out = *v;
  };
  integer("tp", s.tp), integer("pp", s.pp), integer("seq_len", s.seq_len);
  integer("micro_batch", s.micro_batch), integer("microbatches", s.microbatches);
  s.sp = t["sp"].value_or(s.tp > 1);
  s.tp_recompute_allgather = t["tp_recompute_allgather"].value_or(true);
  struct Choice {
    const char* key;
    std::string value;
  };
  for (Choice c :
       {Choice{"pp_schedule", t["pp_schedule"].value_or(std::string("afab"))},
        Choice{"attention", t["attention"].value_or(std::string("flash"))},
        Choice{"recompute", t["recompute"].value_or(std::string("none"))},
        Choice{"optimizer", t["optimizer"].value_or(std::string("adamw"))},
        Choice{"grad_accum_dtype", t["grad_accum_dtype"].value_or(std::string("fp32"))}}) {
    std::string key = c.key;
    auto fail = [&](const Error& e) { return at(path, t.get(c.key), e.message); };
    if (key == "pp_schedule") {
      auto r = parse_enum<PpSchedule>(key, c.value);
      if (!r) return fail(r.error());
      s.pp_schedule = *r;
    }
    if (key == "attention") {
      auto r = parse_enum<AttentionImpl>(key, c.value);
      if (!r) return fail(r.error());
      s.attention = *r;
    }
    if (key == "recompute") {
      auto r = parse_enum<Recompute>(key, c.value);
      if (!r) return fail(r.error());
      s.recompute = *r;
    }
    if (key == "optimizer") {
      auto r = parse_enum<Optimizer>(key, c.value);
      if (!r) return fail(r.error());
      s.optimizer = *r;
    }
    if (key == "grad_accum_dtype") {
      auto r = parse_enum<Dtype>(key, c.value);
      if (!r) return fail(r.error());
      s.grad_dtype = *r;
    }
  }
  return s;
}

Result<std::vector<TrainSpec>> expand(const Scenario& sc, const toml::table* m,
                                      std::vector<std::string>& skipped) {
  static const toml::table empty;
  const toml::table& mt = m ? *m : empty;
  std::vector<TrainSpec> out;
  for (int64_t tp : list_of<int64_t>(mt, "tp", sc.base.tp))
    for (int64_t pp : list_of<int64_t>(mt, "pp", sc.base.pp))
      for (bool sp : list_of<bool>(mt, "sp", sc.base.sp))
        for (const std::string& sched :
             list_of<std::string>(mt, "pp_schedule", name_of(sc.base.pp_schedule)))
          for (const std::string& rec :
               list_of<std::string>(mt, "recompute", name_of(sc.base.recompute)))
            for (const std::string& att :
                 list_of<std::string>(mt, "attention", name_of(sc.base.attention)))
              for (bool rg :
                   list_of<bool>(mt, "tp_recompute_allgather", sc.base.tp_recompute_allgather)) {
                if (!sp && !rg) continue;  // without SP there is no all-gather to keep: a duplicate
                TrainSpec t = sc.base;
                t.tp = tp, t.pp = pp, t.sp = sp, t.tp_recompute_allgather = rg;
                auto s = parse_enum<PpSchedule>("pp_schedule", sched);
                auto r = parse_enum<Recompute>("recompute", rec);
                auto a = parse_enum<AttentionImpl>("attention", att);
                if (!s || !r || !a)
                  return make_error(sc.path + ": [matrix]: " +
                                    (!s   ? s.error()
                                     : !r ? r.error()
                                          : a.error())
                                        .message);
                t.pp_schedule = *s, t.recompute = *r, t.attention = *a;
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
  return "tp " + std::to_string(t.tp) + " pp " + std::to_string(t.pp) + " sp " +
         (t.sp ? "on" : "off") + " " + name_of(t.pp_schedule) + " recompute " +
         name_of(t.recompute) + (t.sp && !t.tp_recompute_allgather ? " keep-gathered" : "") + " " +
         name_of(t.attention);
}

Result<Scenario> load_scenario(const std::string& path, const std::vector<ModelSpec>& models) {
  toml::table doc;
  try {
    doc = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::string desc(e.description());
    if (desc.find("File could not be opened") != std::string::npos)
      return make_error("cannot read scenario " + path + ": no such file or not readable");
    return make_error(path + ":" + std::to_string(e.source().begin.line) +
                      ": malformed TOML: " + desc);
  }
  Scenario sc;
  sc.path = path;
  sc.name = doc["name"].value_or(std::string());
  if (sc.name.empty()) return at(path, nullptr, "missing required key 'name'");
  sc.description = doc["description"].value_or(std::string());
  sc.steps = static_cast<int>(doc["steps"].value_or(int64_t{1}));
  if (sc.steps < 1) return at(path, doc.get("steps"), "'steps' must be a positive integer");
  if (auto name = doc["model"].value<std::string>()) {
    auto m = resolve_model(models, *name);
    if (!m) return at(path, doc.get("model"), m.error().message);
    sc.model = *m;
  } else if (const toml::table* mt = doc["model"].as_table()) {
    auto m = model_from_table(*mt, path);
    if (!m) return at(path, doc.get("model"), m.error().message);
    sc.model = *m;
  } else {
    return at(path, nullptr, "missing 'model' (a catalog name, or an inline [model] table)");
  }
  static const toml::table empty;
  Result<TrainSpec> base =
      read_setup(doc["setup"].as_table() ? *doc["setup"].as_table() : empty, path);
  if (!base) return base.error();
  sc.base = *base;
  if (const toml::table* e = doc["expect"].as_table()) {
    sc.expect.predicted_equals_measured = (*e)["predicted_equals_measured"].value_or(true);
    sc.expect.first_loss_rel_ln_vocab = (*e)["first_loss_rel_ln_vocab"].value_or(0.0);
    sc.expect.loss_decreases = (*e)["loss_decreases"].value_or(false);
  }
  auto matrix = expand(sc, doc["matrix"].as_table(), sc.skipped);
  if (!matrix) return matrix.error();
  sc.matrix = std::move(*matrix);
  if (sc.matrix.empty())
    return at(path, nullptr,
              "no valid setup in the matrix (" +
                  (sc.skipped.empty() ? std::string("empty") : sc.skipped.front()) + ")");
  return sc;
}

std::string scenario_failures(const Scenario& sc, bool predicted_equals_measured,
                              const std::vector<double>& losses) {
  std::string why;
  double ln_v = std::log(static_cast<double>(sc.model.vocab));
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

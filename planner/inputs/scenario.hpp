// Scenarios: named end-to-end cases (scenarios/*.toml): a model (inline or from the catalog), a
// base setup, a matrix of setups to run, and what must hold for each run.
#pragma once
#include <string>
#include <vector>

#include "planner/inputs/result.hpp"
#include "planner/inputs/spec.hpp"

namespace np {

struct ScenarioExpect {
  bool predicted_equals_measured = true;  // per rank, to the byte
  double first_loss_rel_ln_vocab = 0;     // |loss_0 - ln(vocab)| <= this x ln(vocab); 0: unchecked
  bool loss_decreases = false;            // last step's loss below the first's
};

struct Scenario {
  std::string name, description, path;
  ModelSpec model;
  TrainSpec base;
  int steps = 1;
  ScenarioExpect expect;
  std::vector<TrainSpec>
      matrix;  // the base setup varied over the [matrix] lists; invalid ones dropped
  std::vector<std::string> skipped;  // why each dropped combination is invalid
};

// Why one run `t` of a scenario's matrix fails its [expect] checks, given whether predicted
// equalled measured on every rank and the losses per step: "" when it passes, else the failed
// checks, each ending in "; ". The first loss is held to ln of the vocabulary the LM head holds
// (padded_vocab: megatron pads it to 128 x tp).
std::string scenario_failures(const Scenario& sc, const TrainSpec& t,
                              bool predicted_equals_measured, const std::vector<double>& losses);

// A scenario as the user names it: a path (with '/' or ending in .toml) as given, else NAME.toml
// in the scenarios/ folder beside the model catalog `models_dir`; an unknown name is refused with
// the names there.
Result<std::string> find_scenario(const std::string& name, const std::string& models_dir);

// `models` resolves `model = "name"`; an inline [model] table uses the catalog schema.
Result<Scenario> load_scenario(const std::string& path, const std::vector<ModelSpec>& models);
// The same from text already read (`path` names it in errors): what the fuzz target calls.
Result<Scenario> scenario_from_text(const std::string& text, const std::string& path,
                                    const std::vector<ModelSpec>& models);

// One line: "tp 2 pp 4 sp on 1f1b recompute full flash".
std::string describe_short(const TrainSpec& t);

}  // namespace np

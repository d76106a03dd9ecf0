// Shared test helpers: the model catalog of the source tree, loaded once.
#pragma once
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "planner/inputs/catalog.hpp"
#include "planner/inputs/scenario.hpp"

namespace np::testing {

// The source tree: NANOPLAN_SOURCE_DIR in the environment (test binaries carried to another
// machine, as tools/device_check does), else where this build was configured.
inline std::string source_dir() {
  if (const char* env = std::getenv("NANOPLAN_SOURCE_DIR")) return env;
  return NANOPLAN_SOURCE_DIR;
}

inline const std::vector<ModelSpec>& catalog() {
  static const std::vector<ModelSpec> models = [] {
    auto r = load_model_catalog(source_dir() + "/models");
    if (!r) throw std::runtime_error(r.error().message);
    return *r;
  }();
  return models;
}

inline ModelSpec model(const std::string& name) {
  auto r = resolve_model(catalog(), name);
  if (!r) throw std::runtime_error(r.error().message);
  return *r;
}

// A scenario of the source tree's scenarios/ folder, by name ("tiny-llama").
inline Scenario scenario(const std::string& name) {
  auto s = load_scenario(source_dir() + "/scenarios/" + name + ".toml", catalog());
  if (!s) throw std::runtime_error(s.error().message);
  return *s;
}

// GoogleTest parameter names from strings: "gpt3-175b" -> "gpt3_175b".
struct ParamName {
  template <typename Info>
  std::string operator()(const Info& info) const {
    std::string n = info.param;
    for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    return n;
  }
};

// The setup is refused in one line that names `fix`.
inline void refused(const ModelSpec& m, const TrainSpec& t, const std::string& fix) {
  auto e = validate_setup(m, t);
  ASSERT_TRUE(e) << fix;
  EXPECT_EQ(e->message.find('\n'), std::string::npos) << e->message;
  EXPECT_NE(e->message.find(fix), std::string::npos) << e->message;
}

inline std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

}  // namespace np::testing

// Internal: a model from a parsed TOML table of the catalog schema (a catalog file, or a
// scenario's inline [model]); errors carry the file and the line of the offending key.
#pragma once
#include <toml++/toml.h>

#include <string>

#include "planner/result.hpp"
#include "planner/spec.hpp"

namespace np {

Result<ModelSpec> model_from_table(const toml::table& table, const std::string& path);

}  // namespace np

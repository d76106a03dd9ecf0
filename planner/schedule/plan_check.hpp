// A plan read from a file checked against the schedule nanoplan builds for it, and the byte counts
// of a setup read from a file checked before any graph is built (plan_check.cpp).
#pragma once
#include <optional>

#include "planner/inputs/result.hpp"
#include "planner/schedule/schedule.hpp"

namespace np {

// Whether every tensor and weight of the setup has a byte count that fits in 63 bits; checked
// with overflow-safe arithmetic before any graph is built from numbers read from a file.
std::optional<Error> check_sizes(const ModelSpec& m, const TrainSpec& t);

// A plan read from a file, against the schedule nanoplan builds for its model, setup and block
// policies: each stage's blocks and layers, micro-batch indices, each block's kept tensors, every
// tensor's identity and bytes, every instruction except the frees, and check_program. Where the
// frees are placed is left to the executor, which compares them with its own lifetimes. Errors
// name the plan's path, e.g. "stages[1].tensors[57].bytes".
std::optional<Error> check_plan(const Schedule& plan);

}  // namespace np

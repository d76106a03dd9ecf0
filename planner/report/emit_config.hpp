// A plan's closest framework configs (--emit, and the estimate's closing lines): the nanotron
// YAML fragment and the Megatron-LM flags that come nearest to what the plan keeps and recomputes.
#pragma once
#include <string>

#include "planner/schedule/schedule.hpp"

namespace np {

// The plan's closest nanotron settings: a YAML fragment (parallelism, tokens, optimizer), with a
// comment where the plan is not expressible (per-layer choices, interleaving, context
// parallelism) saying what the fragment does instead.
std::string emit_nanotron(const Schedule& s);
// The plan's closest Megatron-LM flags, one line, then comments: per-module recompute
// (--recompute-modules) where the plan recomputes whole modules, the block method where it
// recomputes the first N layers of each stage, else the closest that recomputes more.
std::string emit_megatron(const Schedule& s);
// The plan's closest torchtitan job-file sections ([training], [parallelism],
// [activation_checkpoint]; torchtitan_config reads them back), with comments on what torchtitan
// cannot express: per-layer recompute sets other than every Nth layer become the closest that
// recomputes at least as much.
std::string emit_torchtitan(const Schedule& s);

}  // namespace np

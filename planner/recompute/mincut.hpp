// The convex hull of a layer's (bytes kept, recompute cost) trade-off by a lambda-swept minimum
// cut (Boost.Graph max-flow): for a given lambda, min over recompute masks of cost + lambda x kept
// is a minimum s-t cut of a small graph, and sweeping lambda between hull vertices finds them all.
// The exact frontier (frontier.hpp) fills the points between; tests check the two agree.
#pragma once
#include <vector>

#include "planner/recompute/frontier.hpp"

namespace np {

// The mask minimising cost + lambda x kept bytes (lambda in cost units per byte).
std::vector<bool> min_cut_mask(const BlockGraph& g, const std::vector<double>& op_cost,
                               double lambda);

// The vertices of the lower convex hull of (kept bytes, cost) over all masks, kept descending.
std::vector<LayerOption> min_cut_hull(const BlockGraph& g, const std::vector<double>& op_cost);

// The least bytes any recompute mask of the block keeps (the hull's last vertex, without the
// costs): a lower bound of every option's kept bytes, for proving that nothing fits.
int64_t least_kept_bytes(const BlockGraph& g);

}  // namespace np

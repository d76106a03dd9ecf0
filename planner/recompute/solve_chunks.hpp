// The stage solver for stages of several model chunks (the interleaved schedule): exact search
// over the chunks' Pareto choices (solve_chunks.cpp).
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "planner/recompute/solve.hpp"

namespace np {

// A stage whose layers form several model chunks (the interleaved schedule). Chunk c runs its
// blocks in order: the embedding (first stage, chunk 0), its layers, the head (last stage, last
// chunk). Per pass it keeps K_c, its blocks' kept bytes, and while one of its passes runs it
// adds E_c = max over its blocks b of (w_b - k_b - Q_b), Q_b the kept bytes of the blocks after
// b (freed before b's backward; the running pass's forward reaches the same sum). At each step
// of the schedule that may set the peak (chunk_loads), with a_c passes of chunk c alive and
// chunk r running,
//   peak = base + sum_c a_c K_c + E_r,
// and the stage's peak is the largest over those steps. Every step has at least one pass of its
// running chunk alive. One chunk without an embedding, a head of kept 0 and working `extra`, and
// one step {f} is StageProblem's model.
struct ChunkedStageProblem {
  struct Chunk {
    StageOption before, after;  // the embedding's and the head's kept and working bytes (or 0)
    std::vector<std::vector<StageOption>> layers;  // per layer in forward order: its options
    // Optional: pareto_choices of `layers` alone (extra 0, one pass, a budget no smaller than
    // the room base leaves), when already known (chunks of equal layers share them); computed
    // when null.
    std::shared_ptr<const std::vector<ParetoChoice>> choices;
  };
  int64_t budget = 0;  // bytes for the whole stage
  int64_t base = 0;    // static bytes
  std::vector<Chunk> chunks;
  std::vector<ChunkLoad> loads;
};

struct ChunkedSolution {
  bool feasible = false;
  double cost = 0;
  std::vector<std::vector<int>> choice;  // per chunk, option index per layer
  int64_t peak = 0;                      // model peak of the choice
  // False when the search stopped at its branch limit: the choice is then the best found, and
  // no choice within the budget costs less than `lower` (the least peak: none peaks lower than
  // `lower_peak`).
  bool proven = true;
  double lower = 0;
  int64_t lower_peak = 0;
};

// Branches the chunk search visits before it stops with the best choice found (about 0.1 s);
// stages of many small chunks (10 chunks of one layer) can need more to prove the optimum.
constexpr int64_t kChunkSearchBranches = 200'000;

int64_t model_peak(const ChunkedStageProblem& p, const std::vector<std::vector<int>>& choice);
// The cheapest choice within the budget, exactly: each chunk's Pareto choices, then a depth-first
// search over the chunks, cut by each step's least completion and by a Lagrangian bound on cost.
// With `below`, only a choice costing less than it is wanted.
ChunkedSolution solve_chunked_stage(const ChunkedStageProblem& p,
                                    double below = std::numeric_limits<double>::infinity(),
                                    int64_t branches = kChunkSearchBranches);
// Exhaustive search (the test oracle; small instances only).
ChunkedSolution brute_force_chunked_stage(const ChunkedStageProblem& p);
// The smallest achievable model peak, and a choice reaching it.
ChunkedSolution min_peak_chunked_solution(const ChunkedStageProblem& p,
                                          int64_t branches = kChunkSearchBranches);

}  // namespace np

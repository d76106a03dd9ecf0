// The stage solver against exhaustive search on random instances, its monotonicity in the budget,
// and the layer frontier against brute force over every subset of ops.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <tuple>

#include "planner/recompute/frontier.hpp"
#include "planner/recompute/mincut.hpp"
#include "planner/schedule/schedule.hpp"
#include "planner/schedule/simulate.hpp"
#include "planner/recompute/solve.hpp"
#include "planner/recompute/solve_chunks.hpp"
#include "test_util.hpp"

namespace np {
namespace {

// Random heterogeneous stages: 1-4 layers with 2-6 options each; pp 1-8 gives the in-flight count
// of stage s under 1F1B, min(m, pp - s). Costs are integers so sums are exact in any order.
// `count` options: kept bytes in [1, kept_max], working = kept + [0, extra_max], integer cost in
// [0, cost_max].
std::vector<StageOption> random_options(std::mt19937_64& rng, int count, int kept_max,
                                        int extra_max, int cost_max) {
  std::uniform_int_distribution<int> kept(1, kept_max), extra(0, extra_max), cost(0, cost_max);
  std::vector<StageOption> opts;
  for (int o = 0; o < count; ++o) {
    int64_t kb = kept(rng);
    opts.push_back({kb, kb + extra(rng), static_cast<double>(cost(rng))});
  }
  return opts;
}

// Makes p a stage of n layers sharing `opts` (the stages the auto planner builds), with a budget
// drawn from [base, base + f x per_layer x n + slack].
void share_options(std::mt19937_64& rng, StageProblem& p, int n, std::vector<StageOption> opts,
                   int64_t per_layer, int64_t slack) {
  p.layers.assign(n, opts);
  p.budget = std::uniform_int_distribution<int64_t>(
      p.base, p.base + p.in_flight * per_layer * n + slack)(rng);
}

StageProblem random_problem(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> layers(1, 4), options(2, 6), pp(1, 8);
  StageProblem p;
  int stages = pp(rng);
  p.in_flight =
      std::min<int64_t>(4, stages - std::uniform_int_distribution<int>(0, stages - 1)(rng));
  p.base = std::uniform_int_distribution<int>(0, 50)(rng);
  p.extra = std::uniform_int_distribution<int>(0, 30)(rng);
  int n = layers(rng);
  for (int l = 0; l < n; ++l) p.layers.push_back(random_options(rng, options(rng), 40, 60, 20));
  int64_t lo = p.base, hi = p.base + p.in_flight * 40 * n + 100;
  p.budget = std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  return p;
}

// Solves `p` both ways; fails the test when they disagree on feasibility or on the optimal cost
// (zero gap). Returns whether the instance is feasible.
bool matches_brute_force(const StageProblem& p, int instance) {
  StageSolution dp = solve_stage(p), bf = brute_force_stage(p);
  EXPECT_EQ(dp.feasible, bf.feasible) << "instance " << instance;
  if (!bf.feasible || !dp.feasible) return false;
  EXPECT_EQ(dp.cost, bf.cost) << "instance " << instance;
  EXPECT_LE(dp.peak, p.budget);
  return true;
}

TEST(Solver, MatchesExhaustiveSearchOnRandomInstances) {
  std::mt19937_64 rng(20261130);
  int feasible = 0, infeasible = 0;
  for (int i = 0; i < 2000; ++i) {
    StageProblem p = random_problem(rng);
    StageSolution dp = solve_stage(p), bf = brute_force_stage(p);
    ASSERT_EQ(dp.feasible, bf.feasible) << "instance " << i;
    if (!bf.feasible) {
      ++infeasible;
      continue;
    }
    ++feasible;
    EXPECT_EQ(dp.cost, bf.cost) << "instance " << i;  // zero gap
    EXPECT_LE(dp.peak, p.budget);
    EXPECT_EQ(dp.peak, model_peak(p, dp.choice));
  }
  EXPECT_GT(feasible, 500);
  EXPECT_GT(infeasible, 50);
}

// A mixed model's stages: runs of identical layers of two kinds (dense, then MoE), 1-4 each, which
// the programme takes run by run (each run's Pareto choices as one layer). The cheapest choice,
// the minimum peak and the Pareto choices must still be the exhaustive search's.
TEST(Solver, RunsOfIdenticalLayersMatchExhaustiveSearch) {
  std::mt19937_64 rng(20261206);
  std::uniform_int_distribution<int> run(1, 4), options(2, 5);
  int feasible = 0;
  for (int i = 0; i < 600; ++i) {
    StageProblem p = random_problem(rng);
    std::vector<StageOption> dense = random_options(rng, options(rng), 40, 60, 20),
                             moe = random_options(rng, options(rng), 40, 60, 20);
    p.layers.assign(static_cast<size_t>(run(rng)), dense);
    p.layers.insert(p.layers.end(), static_cast<size_t>(run(rng)), moe);
    if (i % 4 == 0) p.layers.push_back(dense);  // a third run
    p.budget = std::uniform_int_distribution<int64_t>(
        p.base, p.base + p.in_flight * 40 * static_cast<int64_t>(p.layers.size()) + 100)(rng);
    feasible += matches_brute_force(p, i);
    const int64_t least = min_stage_peak(p);
    StageProblem at = p;
    at.budget = least;
    EXPECT_TRUE(brute_force_stage(at).feasible) << "instance " << i;
    at.budget = least - 1;
    EXPECT_FALSE(brute_force_stage(at).feasible) << "instance " << i;
    for (const ParetoChoice& c : pareto_choices(p)) {  // each a real choice, at its figures
      ASSERT_EQ(c.choice.size(), p.layers.size()) << "instance " << i;
      EXPECT_LE(model_peak(p, c.choice), p.budget) << "instance " << i;
    }
  }
  EXPECT_GT(feasible, 200);
}

// Stages whose layers share one option list take the programme over option groups (with its

// A stage whose longest run (2-6 layers, past the run-by-run programme's limit) has other layers
// before and after it, of two other kinds: the group programme over the run with its bounds
// shifted by each pairing of the others' Pareto choices must still find the exhaustive optimum.
TEST(Solver, LongestRunAmongOtherLayersMatchesExhaustiveSearch) {
  std::mt19937_64 rng(20261207);
  std::uniform_int_distribution<int> before(0, 3), run(2, 6), after(0, 2), options(2, 3);
  int feasible = 0, with_both = 0;
  for (int i = 0; i < 500; ++i) {
    StageProblem p = random_problem(rng);
    std::vector<StageOption> dense = random_options(rng, options(rng), 40, 60, 20),
                             moe = random_options(rng, options(rng), 40, 60, 20),
                             last = random_options(rng, options(rng), 40, 60, 20);
    const int nb = before(rng), nr = run(rng), na = after(rng);
    p.layers.assign(static_cast<size_t>(nb), dense);
    p.layers.insert(p.layers.end(), static_cast<size_t>(nr), moe);
    for (int l = 0; l < na; ++l) p.layers.push_back(l % 2 ? dense : last);
    p.budget = std::uniform_int_distribution<int64_t>(
        p.base, p.base + p.in_flight * 40 * static_cast<int64_t>(p.layers.size()) + 100)(rng);
    const bool fits = matches_brute_force(p, i);
    feasible += fits;
    with_both += fits && nb > 0 && na > 0;
  }
  EXPECT_GT(feasible, 150);
  EXPECT_GT(with_both, 30);
}
// convex-envelope lower bounds and seeded upper bound); it must still find the exhaustive optimum.
TEST(Solver, UniformLayersMatchExhaustiveSearch) {
  std::mt19937_64 rng(99);
  int feasible = 0;
  for (int i = 0; i < 1500; ++i) {
    StageProblem p = random_problem(rng);
    share_options(rng, p, std::uniform_int_distribution<int>(1, 6)(rng), p.layers.front(), 40, 100);
    feasible += matches_brute_force(p, i);
  }
  EXPECT_GT(feasible, 400);
}

// Stages with more than 8 options first solve the envelope's vertices alone for an upper bound; the
// result must still be the exhaustive optimum.
TEST(Solver, ManyOptionsMatchExhaustiveSearch) {
  std::mt19937_64 rng(4242);
  int feasible = 0;
  for (int i = 0; i < 400; ++i) {
    StageProblem p = random_problem(rng);
    std::vector<StageOption> opts =
        random_options(rng, std::uniform_int_distribution<int>(9, 14)(rng), 40, 60, 20);
    share_options(rng, p, std::uniform_int_distribution<int>(1, 4)(rng), opts, 40, 100);
    feasible += matches_brute_force(p, i);
  }
  EXPECT_GT(feasible, 100);
}

// Stages whose layers share one option list (every stage the auto planner builds) take the
// programme over option groups. Small instances against exhaustive search; large ones (up to 40
// layers, 30 options, 1-4 micro-batches in flight, beyond brute force) against the general
// programme over layers, also exact.
TEST(Solver, GroupProgrammeMatchesExhaustiveSearchAndTheGeneralProgramme) {
  std::mt19937_64 rng(5150);
  int feasible = 0;
  for (int i = 0; i < 600; ++i) {
    StageProblem p = random_problem(rng);
    p.in_flight = 1;  // the case with its own staircase
    share_options(rng, p, std::uniform_int_distribution<int>(1, 6)(rng), p.layers.front(), 40, 100);
    feasible += matches_brute_force(p, i);
  }
  EXPECT_GT(feasible, 250);
  int by_flight[5] = {};
  for (int i = 0; i < 300; ++i) {
    StageProblem p = random_problem(rng);
    p.in_flight = std::uniform_int_distribution<int>(1, 4)(rng);
    std::vector<StageOption> opts =
        random_options(rng, std::uniform_int_distribution<int>(2, 30)(rng), 400, 600, 50);
    share_options(rng, p, std::uniform_int_distribution<int>(5, 40)(rng), opts, 400, 600);
    StageSolution fast = solve_stage(p), general = solve_stage_programme(p);
    ASSERT_EQ(fast.feasible, general.feasible) << "instance " << i;
    if (!fast.feasible) continue;
    ++by_flight[p.in_flight];
    EXPECT_EQ(fast.cost, general.cost) << "instance " << i;
    EXPECT_LE(fast.peak, p.budget);
    EXPECT_EQ(fast.peak, model_peak(p, fast.choice));
  }
  for (int f = 1; f <= 4; ++f) EXPECT_GT(by_flight[f], 15) << f << " in flight";
}

// One cache of run tables for many stages: the same option list with its working bytes shifted
// by a constant (the head's and ZeRO's terms), other budgets and in-flight counts, and a stage
// with a run among other layers. Each cached solve equals the solve with its own tables.
TEST(Solver, CachedRunTablesGiveTheSameChoices) {
  std::mt19937_64 rng(4242);
  RunTablesCache cache;
  int feasible = 0;
  for (int i = 0; i < 300; ++i) {
    std::vector<StageOption> opts =
        random_options(rng, std::uniform_int_distribution<int>(2, 30)(rng), 400, 600, 50);
    for (int j = 0; j < 4; ++j) {
      StageProblem p = random_problem(rng);
      p.in_flight = std::uniform_int_distribution<int>(1, 4)(rng);
      std::vector<StageOption> shifted = opts;
      const int64_t by = std::uniform_int_distribution<int64_t>(0, 150)(rng);
      for (StageOption& o : shifted) o.working += by;
      const int layers = std::uniform_int_distribution<int>(2, 6)(rng);
      p.budget = std::uniform_int_distribution<int64_t>(
          p.base, p.base + p.in_flight * 400 * layers + 700)(rng);
      if (j == 3) {  // a first layer of its own before the run
        std::vector<StageOption> first = p.layers.front();
        p.layers.assign(static_cast<size_t>(layers), shifted);
        p.layers.front() = first;
      } else {
        p.layers.assign(static_cast<size_t>(layers), shifted);
      }
      StageSolution cached = solve_stage(p, std::numeric_limits<double>::infinity(), &cache);
      StageSolution own = solve_stage(p);
      ASSERT_EQ(cached.feasible, own.feasible) << "instance " << i << "." << j;
      if (!own.feasible) continue;
      ++feasible;
      EXPECT_EQ(cached.cost, own.cost) << "instance " << i << "." << j;
      EXPECT_EQ(cached.peak, model_peak(p, cached.choice));
      EXPECT_LE(cached.peak, p.budget);
    }
  }
  EXPECT_GT(feasible, 300);
}

// With a bound, the solver returns only a cheaper choice: none at the optimum's cost, the optimum
// just above it (integer costs: 0.5 above is strictly between the optimum and the next cost).
TEST(Solver, BelowABound) {
  std::mt19937_64 rng(808);
  int checked = 0;
  for (int i = 0; i < 400; ++i) {
    StageProblem p = random_problem(rng);
    if (i % 2) {  // every layer with the first one's options
      std::vector<StageOption> front = p.layers.front();
      p.layers.assign(std::uniform_int_distribution<int>(1, 8)(rng), front);
    }
    StageSolution best = solve_stage(p);
    if (!best.feasible) {
      EXPECT_FALSE(solve_stage(p, 1e9).feasible);
      continue;
    }
    ++checked;
    EXPECT_FALSE(solve_stage(p, best.cost).feasible) << "instance " << i;
    StageSolution above = solve_stage(p, best.cost + 0.5);
    ASSERT_TRUE(above.feasible) << "instance " << i;
    EXPECT_EQ(above.cost, best.cost);
  }
  EXPECT_GT(checked, 100);
}

TEST(Solver, LargerBudgetNeverSlower) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    StageProblem p = random_problem(rng);
    double last = std::numeric_limits<double>::infinity();
    for (int64_t b = p.base; b <= p.base + p.in_flight * 200 + 200; b += 7) {
      p.budget = b;
      StageSolution s = solve_stage(p);
      if (!s.feasible) continue;
      EXPECT_LE(s.cost, last);
      EXPECT_LE(s.peak, b);
      last = s.cost;
    }
  }
}

TEST(Solver, MinimumPeakIsTheFirstFeasibleBudget) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200; ++i) {
    StageProblem p = random_problem(rng);
    int64_t m = min_stage_peak(p);
    p.budget = m;
    EXPECT_TRUE(solve_stage(p).feasible);
    p.budget = m - 1;
    EXPECT_FALSE(brute_force_stage(p).feasible);
  }
}

// A random stage of 2-3 chunks, 1-2 layers each (at most 5), on the steps of a real interleaved
// order (pp 2-4, a random stage, m = 2 pp): an embedding block before chunk 0's layers or a
// head block after the last chunk's, sometimes; layers sharing one option list, sometimes.
ChunkedStageProblem random_chunked(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> chunks(2, 3), layers(1, 2), options(2, 4), pp(2, 4);
  ChunkedStageProblem p;
  int v = chunks(rng), stages = pp(rng);
  int stage = std::uniform_int_distribution<int>(0, stages - 1)(rng);
  p.loads = chunk_loads(PpSchedule::kInterleaved, stage, stages, 2 * stages, v);
  p.base = std::uniform_int_distribution<int>(0, 50)(rng);
  std::vector<StageOption> shared = random_options(rng, options(rng), 40, 60, 20);
  bool alike = rng() % 2;
  int total = 0;
  for (int c = 0; c < v; ++c) {
    ChunkedStageProblem::Chunk ch;
    int n = std::min(layers(rng), 5 - total - (v - c - 1));
    total += n;
    for (int l = 0; l < n; ++l)
      ch.layers.push_back(alike ? shared : random_options(rng, options(rng), 40, 60, 20));
    p.chunks.push_back(std::move(ch));
  }
  int edge = std::uniform_int_distribution<int>(0, 2)(rng);  // none, embedding, head
  if (edge > 0) {
    int64_t kept = std::uniform_int_distribution<int>(1, 30)(rng);
    StageOption block{kept, kept + std::uniform_int_distribution<int>(0, 80)(rng), 0};
    (edge == 1 ? p.chunks.front().before : p.chunks.back().after) = block;
  }
  int64_t most = 0;
  for (const ChunkLoad& l : p.loads) {
    int64_t passes = 0;
    for (int64_t a : l.alive) passes += a;
    most = std::max(most, passes);
  }
  p.budget = std::uniform_int_distribution<int64_t>(p.base, p.base + most * 40 * 2 + 150)(rng);
  return p;
}

// pareto_choices against every choice: the (kept, kept + transient, cost) triples it returns are
// exactly those of the choices no other beats on all three (within the budget), for stages of
// alike layers (the programme over option groups) and of different ones (over layers), each
// triple's choice giving it.
TEST(Solver, ParetoChoicesAreEveryUnbeatenChoice) {
  std::mt19937_64 rng(404);
  int alike = 0;
  for (int i = 0; i < 400; ++i) {
    StageProblem p = random_problem(rng);
    if (i % 2) {
      std::vector<StageOption> front = p.layers.front();
      p.layers.assign(std::uniform_int_distribution<int>(1, 5)(rng), front);
      ++alike;
    }
    if (i % 3 == 0) p.budget = std::numeric_limits<int64_t>::max() / 8;
    using T = std::tuple<int64_t, int64_t, double>;
    std::vector<T> every;
    std::vector<int> c(p.layers.size(), 0);
    while (true) {
      int64_t kept = 0, e = p.extra, q = 0;
      double cost = 0;
      for (size_t l = 0; l < c.size(); ++l)
        kept += p.layers[l][c[l]].kept, cost += p.layers[l][c[l]].cost;
      for (size_t l = c.size(); l-- > 0;) {
        e = std::max(e, p.layers[l][c[l]].working - p.layers[l][c[l]].kept - q);
        q += p.layers[l][c[l]].kept;
      }
      if (p.base + p.in_flight * kept + e <= p.budget) every.push_back({kept, kept + e, cost});
      size_t l = 0;
      while (l < c.size() && ++c[l] == static_cast<int>(p.layers[l].size())) c[l++] = 0;
      if (l == c.size()) break;
    }
    std::set<T> want;
    for (const T& x : every) {
      bool beaten = false;
      for (const T& y : every)
        beaten = beaten || (y != x && std::get<0>(y) <= std::get<0>(x) &&
                            std::get<1>(y) <= std::get<1>(x) && std::get<2>(y) <= std::get<2>(x));
      if (!beaten) want.insert(x);
    }
    std::set<T> got;
    for (const ParetoChoice& pc : pareto_choices(p)) {
      got.insert({pc.kept, pc.kept + pc.transient, pc.cost});
      // The choice behind it has those numbers.
      ChunkedStageProblem one;
      one.base = 0, one.budget = 0;
      one.chunks.push_back({{}, {0, p.extra, 0}, p.layers, nullptr});
      one.loads = {{{1}, 0}};
      EXPECT_EQ(model_peak(one, {pc.choice}), pc.kept + pc.transient) << "instance " << i;
    }
    EXPECT_EQ(got, want) << "instance " << i;
  }
  EXPECT_GT(alike, 150);
}

// The least model peak over every choice.
int64_t brute_force_min_peak(const ChunkedStageProblem& p) {
  std::vector<std::vector<int>> c;
  for (const auto& ch : p.chunks) c.emplace_back(ch.layers.size(), 0);
  int64_t least = std::numeric_limits<int64_t>::max();
  while (true) {
    least = std::min(least, model_peak(p, c));
    size_t k = 0, l = 0;  // the next choice, odometer-wise over (chunk, layer)
    for (; k < c.size(); ++k, l = 0) {
      for (; l < c[k].size(); ++l) {
        if (++c[k][l] < static_cast<int>(p.chunks[k].layers[l].size())) break;
        c[k][l] = 0;
      }
      if (l < c[k].size()) break;
    }
    if (k == c.size()) return least;
  }
}

// The interleaved stage solver against exhaustive search: the same feasibility and optimal cost
// (integer costs: zero gap), the model peak within the budget, the least peak found exactly, and
// a bound below the optimum leaving nothing.
TEST(Solver, ChunkedMatchesExhaustiveSearch) {
  std::mt19937_64 rng(2026);
  int feasible = 0;
  for (int i = 0; i < 800; ++i) {
    ChunkedStageProblem p = random_chunked(rng);
    ChunkedSolution dp = solve_chunked_stage(p), bf = brute_force_chunked_stage(p);
    ASSERT_EQ(dp.feasible, bf.feasible) << "instance " << i;
    if (i % 8 == 0) {
      EXPECT_EQ(min_peak_chunked_solution(p).peak, brute_force_min_peak(p)) << "instance " << i;
    }
    if (!bf.feasible) continue;
    ++feasible;
    EXPECT_EQ(dp.cost, bf.cost) << "instance " << i;
    EXPECT_LE(dp.peak, p.budget);
    EXPECT_EQ(dp.peak, model_peak(p, dp.choice));
    EXPECT_FALSE(solve_chunked_stage(p, bf.cost).feasible) << "instance " << i;
  }
  EXPECT_GT(feasible, 300);
}

// Stopped at a branch limit, the search still answers soundly: a choice within the budget (or
// none) that costs no less than the optimum, a lower bound no greater than it, and proven only
// when it is the optimum; the least peak likewise.
TEST(Solver, ChunkedSearchStopsSoundlyAtItsBranchLimit) {
  std::mt19937_64 rng(515);
  int stopped = 0, stopped_peak = 0;
  for (int i = 0; i < 600; ++i) {
    ChunkedStageProblem p = random_chunked(rng);
    ChunkedSolution bf = brute_force_chunked_stage(p);
    ChunkedSolution cut = solve_chunked_stage(p, std::numeric_limits<double>::infinity(), 1);
    if (cut.feasible) {
      ASSERT_TRUE(bf.feasible) << "instance " << i;
      EXPECT_LE(cut.peak, p.budget);
      EXPECT_EQ(cut.peak, model_peak(p, cut.choice));
      EXPECT_GE(cut.cost, bf.cost) << "instance " << i;
    }
    if (cut.proven) {
      EXPECT_EQ(cut.feasible, bf.feasible) << "instance " << i;
      if (bf.feasible) {
        EXPECT_EQ(cut.cost, bf.cost) << "instance " << i;
      }
    } else {
      ++stopped;
      if (bf.feasible) {
        EXPECT_LE(cut.lower, bf.cost * (1 + 1e-12)) << "instance " << i;
      }
    }
    ChunkedSolution least = min_peak_chunked_solution(p, 1);
    const int64_t truth = brute_force_min_peak(p);
    EXPECT_GE(least.peak, truth);
    EXPECT_LE(least.lower_peak, truth);
    if (least.proven) {
      EXPECT_EQ(least.peak, truth) << "instance " << i;
    } else {
      ++stopped_peak;
    }
  }
  EXPECT_GT(stopped, 30);
  EXPECT_GT(stopped_peak, 30);
}

// One chunk on one step {f} is the stage model: the same optimum as solve_stage.
TEST(Solver, OneChunkIsTheStageModel) {
  std::mt19937_64 rng(77);
  for (int i = 0; i < 300; ++i) {
    StageProblem p = random_problem(rng);
    ChunkedStageProblem q;
    q.budget = p.budget, q.base = p.base;
    q.chunks.push_back({{}, {0, p.extra, 0}, p.layers, nullptr});
    q.loads = {{{p.in_flight}, 0}};
    StageSolution a = solve_stage(p);
    ChunkedSolution b = solve_chunked_stage(q);
    ASSERT_EQ(a.feasible, b.feasible) << "instance " << i;
    if (!a.feasible) continue;
    EXPECT_EQ(a.cost, b.cost) << "instance " << i;
    EXPECT_EQ(a.peak, model_peak(q, b.choice));
  }
}

std::vector<double> flops_cost(const BlockGraph& g) {
  std::vector<double> c;
  for (const GraphOp& op : g.ops) c.push_back(op.flops + 1.0);  // + 1: no op is free to re-run
  return c;
}

// The frontier over non-wasteful masks equals the frontier over all 2^ops masks.
TEST(Frontier, MatchesBruteForceOverEverySubset) {
  int checked = 0;
  for (const char* name : {"llama-2-7b", "gpt-22b", "qwen2.5-7b"})
    for (AttentionImpl att : {AttentionImpl::kFlash, AttentionImpl::kEager})
      for (bool sp : {false, true}) {
        TrainSpec t;
        t.tp = 2, t.sp = sp, t.seq_len = 256, t.attention = att;
        BlockGraph g = build_layer(testing::model(name), t);
        ASSERT_LE(g.ops.size(), 19u) << name << ": too many ops for the 2^ops oracle";
        ++checked;
        std::vector<double> c = flops_cost(g);
        auto fast = pareto_frontier(enumerate_options(g, c)),
             slow = pareto_frontier(enumerate_all_subsets(g, c));
        ASSERT_EQ(fast.size(), slow.size()) << name;
        for (size_t i = 0; i < fast.size(); ++i) {
          EXPECT_EQ(fast[i].kept_bytes, slow[i].kept_bytes) << name << " point " << i;
          EXPECT_EQ(fast[i].working_bytes, slow[i].working_bytes) << name << " point " << i;
          EXPECT_EQ(fast[i].cost, slow[i].cost) << name << " point " << i;
        }
      }
  EXPECT_EQ(checked, 12);
  // The profiles' layers (kept statistics, the unfused GLU, Hugging Face's norm, repeat_kv and
  // fp32 softmax): the same equality.
  for (Impl impl : {Impl::kNanotron, Impl::kHf})
    for (AttentionImpl att : {AttentionImpl::kFlash, AttentionImpl::kEager}) {
      TrainSpec t;
      t.tp = 2, t.sp = true, t.seq_len = 256, t.attention = att, t.impl = impl;
      BlockGraph g = build_layer(testing::model("llama-3.1-8b"), t);
      ASSERT_LE(g.ops.size(), 19u) << name_of(impl) << ": too many ops for the 2^ops oracle";
      std::vector<double> c = flops_cost(g);
      auto fast = pareto_frontier(enumerate_options(g, c)),
           slow = pareto_frontier(enumerate_all_subsets(g, c));
      ASSERT_EQ(fast.size(), slow.size()) << name_of(impl);
      for (size_t i = 0; i < fast.size(); ++i) {
        EXPECT_EQ(fast[i].kept_bytes, slow[i].kept_bytes) << name_of(impl) << " point " << i;
        EXPECT_EQ(fast[i].working_bytes, slow[i].working_bytes) << name_of(impl) << " point " << i;
        EXPECT_EQ(fast[i].cost, slow[i].cost) << name_of(impl) << " point " << i;
      }
    }
}

// Lower convex hull of (kept, cost) over a set of options: the vertices, kept descending.
std::vector<std::pair<int64_t, double>> lower_hull(const std::vector<LayerOption>& all) {
  std::vector<std::pair<int64_t, double>> pts;
  for (const LayerOption& o : all) pts.push_back({o.kept_bytes, o.cost});
  std::sort(pts.begin(), pts.end());  // kept ascending
  std::vector<std::pair<int64_t, double>> h;
  for (auto p : pts) {
    if (!h.empty() && p.first == h.back().first) continue;  // equal kept: the cheaper sorted first
    if (!h.empty() && p.second >= h.back().second) continue;
    while (h.size() >= 2) {
      // Drop the middle point when it is not below the segment (collinear within 1e-9, as the
      // min-cut sweep treats it).
      auto [x0, y0] = h[h.size() - 2];
      auto [x1, y1] = h.back();
      double line =
          y0 + (p.second - y0) * static_cast<double>(x1 - x0) / static_cast<double>(p.first - x0);
      if (y1 >= line - 1e-9 * std::max(1.0, std::abs(line)))
        h.pop_back();
      else
        break;
    }
    h.push_back(p);
  }
  std::reverse(h.begin(), h.end());
  return h;
}

// The lambda-swept minimum cut (Boost max-flow) finds exactly the convex hull of the exhaustive
// enumeration, on the real layer graphs (dense and MoE, flash and eager, SP on and off).
TEST(MinCut, HullEqualsTheEnumeratedHull) {
  for (const char* name : {"llama-3.1-70b", "gpt-22b", "mixtral-8x7b"})
    for (AttentionImpl att : {AttentionImpl::kFlash, AttentionImpl::kEager})
      for (bool sp : {false, true}) {
        TrainSpec t;
        t.tp = 8, t.sp = sp, t.seq_len = 1024, t.attention = att;
        if (std::string(name) == "mixtral-8x7b" && !sp) continue;
        BlockGraph g = build_layer(testing::model(name), t);
        std::vector<double> c = flops_cost(g);
        auto cut = min_cut_hull(g, c);
        auto ref = lower_hull(enumerate_options(g, c));
        ASSERT_EQ(cut.size(), ref.size()) << name << " " << name_of(att) << " sp " << sp;
        for (size_t i = 0; i < ref.size(); ++i) {
          EXPECT_EQ(cut[i].kept_bytes, ref[i].first) << name << " vertex " << i;
          EXPECT_NEAR(cut[i].cost, ref[i].second, 1e-9 * std::max(1.0, ref[i].second))
              << name << " vertex " << i;
        }
      }
}

// The option evaluation agrees with the schedule's simulation: a one-layer, one-micro-batch stage
// under each named policy peaks at the static bytes plus ... the layer's working set is visible as
// the activation + transient high-water mark of the program minus the embedding and head parts.
TEST(Frontier, NamedPoliciesLandOnOrUnderTheFrontier) {
  TrainSpec t;
  t.tp = 8, t.sp = true, t.seq_len = 4096;
  BlockGraph g = build_layer(testing::model("llama-3.1-70b"), t);
  LayerFrontier lf = layer_frontier(g, t, flops_cost(g));
  ASSERT_GE(lf.options.size(), 3u);
  ASSERT_EQ(lf.named.size(), 5u);
  for (const NamedPoint& p : lf.named) {
    EXPECT_TRUE(p.on_frontier >= 0 || p.dominated_by >= 0) << p.name;
  }
  // Full recompute keeps only the (sequence-sharded) layer input: 2 sbh / t.
  const NamedPoint& full = lf.named.back();
  EXPECT_EQ(full.option.kept_bytes, 4096LL / 8 * 8192 * 2);
  // The frontier's cheapest point is no recompute at all, its leanest keeps only the input.
  EXPECT_EQ(lf.options.front().cost, 0.0);
  EXPECT_EQ(lf.options.back().kept_bytes, full.option.kept_bytes);
}

// Megatron's mla_up_proj on an MLA layer is reported against the frontier; it keeps less than no
// recompute (the query, key and value rows and the up-projections' gathered inputs dropped) at a
// cost, and it lands on or under the frontier.
TEST(Frontier, MegatronMlaUpProjIsPlaced) {
  TrainSpec t;
  t.tp = 2, t.sp = true, t.seq_len = 1024, t.impl = Impl::kMegatron;
  BlockGraph g = build_dense_layer(testing::model("deepseek-v2-lite"), t);
  LayerFrontier lf = layer_frontier(g, t, flops_cost(g));
  const NamedPoint& up = lf.named.back();
  ASSERT_EQ(up.name, "Megatron's mla_up_proj");
  EXPECT_TRUE(up.on_frontier >= 0 || up.dominated_by >= 0);
  EXPECT_LT(up.option.kept_bytes, lf.named.front().option.kept_bytes);
  EXPECT_GT(up.option.cost, 0);
  std::vector<bool> mask = mla_up_proj_mask(g);
  int rerun = 0;
  for (size_t i = 0; i < g.ops.size(); ++i) rerun += mask[i];
  EXPECT_EQ(rerun, 6);  // q.all_gather, q, kv_norm, kv_up.all_gather, kv_up, rope: q_lora 0
  EXPECT_TRUE(mla_up_proj_mask(build_layer(testing::model("llama-3.1-8b"), t)).empty());
}

// The frontier found by the layer's halves against the frontier of every non-wasteful mask, on
// dense, MoE and MLA layers, flash and eager attention, with and without SP, each profile: the
// same count of choices and the same points (kept and working bytes exactly; the recompute time,
// a sum of the same op times in another grouping, within rounding), each mask evaluated again.
TEST(Frontier, HalvesFindTheExhaustiveFrontier) {
  struct Case {
    const char* model;
    bool dense;
    int64_t tp;
    AttentionImpl att = AttentionImpl::kFlash;
    Impl impl = Impl::kMegatron;
  };
  for (Case c : {Case{"deepseek-v2-lite", true, 2}, Case{"deepseek-v2-lite", true, 1},
                 Case{"llama-3.1-70b", false, 8}, Case{"llama-3.1-70b", false, 1, AttentionImpl::kEager},
                 Case{"llama-3.1-8b", false, 2, AttentionImpl::kFlash, Impl::kHf},
                 Case{"llama-3.1-8b", false, 2, AttentionImpl::kEager, Impl::kNanotron},
                 Case{"qwen3-30b-a3b", false, 1}, Case{"qwen3-8b", false, 4},
                 Case{"mixtral-8x7b", false, 2}, Case{"gpt-22b", false, 2}}) {
    for (bool regather : {true, false}) {
      TrainSpec t;
      t.tp = c.tp, t.sp = c.tp > 1, t.seq_len = 1024, t.attention = c.att, t.impl = c.impl;
      t.tp_recompute_allgather = regather;
      const ModelSpec m = testing::model(c.model);
      BlockGraph g = c.dense ? build_dense_layer(m, t) : build_layer(m, t);
      std::vector<double> cost = flops_cost(g);
      LayerFrontier split = layer_frontier(g, t, cost);
      std::vector<LayerOption> all = enumerate_options(g, cost);
      std::erase_if(all, [&](const LayerOption& o) {
        for (size_t i = 0; i < g.ops.size(); ++i)
          if (!regather && o.recompute[i] && g.ops[i].kind == OpKind::kAllGather) return true;
        return false;
      });
      EXPECT_EQ(split.choices, all.size()) << c.model << " tp " << c.tp;
      EXPECT_LT(split.evaluated, all.size()) << c.model;
      std::vector<LayerOption> exact = pareto_frontier(std::move(all));
      ASSERT_EQ(split.options.size(), exact.size()) << c.model << " tp " << c.tp;
      for (size_t i = 0; i < exact.size(); ++i) {
        EXPECT_EQ(split.options[i].kept_bytes, exact[i].kept_bytes) << c.model << " " << i;
        EXPECT_EQ(split.options[i].working_bytes, exact[i].working_bytes) << c.model << " " << i;
        EXPECT_NEAR(split.options[i].cost, exact[i].cost, 1e-12 * exact[i].cost) << c.model;
        const LayerOption again = evaluate_option(g, split.options[i].recompute, cost);
        EXPECT_EQ(again.kept_bytes, split.options[i].kept_bytes);
        EXPECT_EQ(again.working_bytes, split.options[i].working_bytes);
      }
    }
  }
}

// least_kept_bytes and least_working_bytes, what proves a setup cannot fit before its frontier is
// found (cannot_fit): the first is the least any non-wasteful mask keeps (never above one, which
// could wrongly refuse a setup; equal to the least, so as tight as the layer allows), the second
// at or below every mask's working bytes.
TEST(Frontier, LeastKeptIsTheLeastAnyMaskKeeps) {
  struct Case {
    const char* model;
    bool dense;
    int64_t tp;
  };
  for (Case c : {Case{"deepseek-v2-lite", true, 2}, Case{"llama-3.1-8b", false, 1},
                 Case{"llama-3.1-70b", false, 8}, Case{"qwen3-30b-a3b", false, 1},
                 Case{"mixtral-8x7b", false, 2}, Case{"gpt-22b", false, 2}}) {
    TrainSpec t;
    t.tp = c.tp, t.sp = c.tp > 1, t.seq_len = 1024;
    const ModelSpec m = testing::model(c.model);
    const BlockGraph g = c.dense ? build_dense_layer(m, t) : build_layer(m, t);
    int64_t least = std::numeric_limits<int64_t>::max(),
            least_working = std::numeric_limits<int64_t>::max();
    for (const LayerOption& o : enumerate_options(g, flops_cost(g))) {
      least = std::min(least, o.kept_bytes);
      least_working = std::min(least_working, o.working_bytes);
    }
    EXPECT_EQ(least_kept_bytes(g), least) << c.model << " tp " << c.tp;
    // The forward's floor: at or below every mask's working bytes, and more than any one tensor.
    EXPECT_LE(least_working_bytes(g), least_working) << c.model << " tp " << c.tp;
    int64_t largest = 0;
    for (const GraphTensor& x : g.tensors) largest = std::max(largest, x.type.bytes());
    EXPECT_GT(least_working_bytes(g), largest) << c.model << " tp " << c.tp;
  }
}

// The decomposition itself: for masks of these layers (random ones of every density: it holds
// for wasteful masks too), the working bytes the halves' figures add up to are the whole
// evaluation's.
TEST(Frontier, HalvesFiguresAddUpForEveryMask) {
  std::mt19937_64 rng(20261206);
  size_t masks = 0;
  for (const char* name : {"deepseek-v2-lite", "deepseek-v3", "qwen3-30b-a3b", "llama-3.1-8b"})
    for (int64_t tp : {1, 2}) {
      TrainSpec t;
      t.tp = tp, t.sp = tp > 1, t.seq_len = 512;
      const ModelSpec m = testing::model(name);
      for (bool dense : {false, true}) {
        if (dense && !mixed_layers(m)) continue;
        BlockGraph g = dense ? build_dense_layer(m, t) : build_layer(m, t);
        std::vector<double> cost = flops_cost(g);
        for (int i = 0; i < 4000; ++i) {
          std::bernoulli_distribution on(0.05 + 0.9 * (i % 10) / 9.0);
          std::vector<bool> mask(g.ops.size());
          for (size_t o = 0; o < mask.size(); ++o) mask[o] = on(rng);
          std::optional<int64_t> w = working_by_halves(g, mask);
          ASSERT_TRUE(w.has_value()) << name;
          ASSERT_EQ(*w, evaluate_option(g, mask, cost).working_bytes)
              << name << " tp " << tp << " mask " << i;
          ++masks;
        }
      }
    }
  EXPECT_EQ(masks, 48000u);
  TrainSpec t;  // a block without halves
  BlockGraph head = build_head(testing::model("llama-3.1-8b"), t);
  EXPECT_FALSE(working_by_halves(head, std::vector<bool>(head.ops.size(), false)).has_value());
}

}  // namespace
}  // namespace np

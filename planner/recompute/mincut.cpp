// Minimum-cut construction. Nodes: one per op (r_o: the op is re-run) and one per tensor (y_t:
// the tensor must exist at backward time). Source side means 1.
//   r_o = 1 costs c_o                              edge r_o -> sink, capacity c_o
//   an op re-run needs its inputs: r_o => y_in     edge r_o -> y_in, infinite
//   backward reads t: y_t = 1                      edge source -> y_t, infinite
//   y_t = 1 and its producer not re-run: keep it   edge y_t -> r_producer, capacity lambda x bytes
//   (a block input has no producer: y_t -> sink, capacity lambda x bytes)
// A cut pays exactly cost + lambda x kept for the mask read off the source side.
#include "planner/recompute/mincut.hpp"

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/boykov_kolmogorov_max_flow.hpp>
#include <queue>

namespace np {
namespace {

using Traits = boost::adjacency_list_traits<boost::vecS, boost::vecS, boost::directedS>;
using FlowGraph = boost::adjacency_list<
    boost::vecS, boost::vecS, boost::directedS,
    boost::property<boost::vertex_index_t, long,
                    boost::property<boost::vertex_color_t, boost::default_color_type,
                                    boost::property<boost::vertex_distance_t, long,
                                                    boost::property<boost::vertex_predecessor_t,
                                                                    Traits::edge_descriptor>>>>,
    boost::property<
        boost::edge_capacity_t, double,
        boost::property<boost::edge_residual_capacity_t, double,
                        boost::property<boost::edge_reverse_t, Traits::edge_descriptor>>>>;

constexpr double kInfinite = 1e30;

void add_edge(FlowGraph& fg, int u, int v, double cap) {
  auto cap_map = boost::get(boost::edge_capacity, fg);
  auto rev = boost::get(boost::edge_reverse, fg);
  auto e = boost::add_edge(u, v, fg).first, r = boost::add_edge(v, u, fg).first;
  cap_map[e] = cap, cap_map[r] = 0;
  rev[e] = r, rev[r] = e;
}

}  // namespace

std::vector<bool> min_cut_mask(const BlockGraph& g, const std::vector<double>& op_cost,
                               double lambda) {
  const int n_ops = static_cast<int>(g.ops.size()), n_t = static_cast<int>(g.tensors.size());
  const int source = n_ops + n_t, sink = source + 1;
  FlowGraph fg(sink + 1);
  const std::vector<bool> needed = backward_reads(g);
  for (int o = 0; o < n_ops; ++o) {
    add_edge(fg, o, sink, op_cost[o]);
    for (int t : g.ops[o].inputs) add_edge(fg, o, n_ops + t, kInfinite);
  }
  for (int t = 0; t < n_t; ++t) {
    if (needed[t]) add_edge(fg, source, n_ops + t, kInfinite);
    double keep = lambda * static_cast<double>(g.tensors[t].type.bytes());
    int producer = g.tensors[t].producer;
    add_edge(fg, n_ops + t, producer >= 0 ? producer : sink, keep);
  }
  boost::boykov_kolmogorov_max_flow(fg, source, sink);
  // The source side: vertices reachable from the source through edges with residual capacity.
  auto res = boost::get(boost::edge_residual_capacity, fg);
  std::vector<bool> seen(sink + 1, false);
  std::queue<int> q;
  q.push(source);
  seen[source] = true;
  while (!q.empty()) {
    int u = q.front();
    q.pop();
    for (auto [e, end] = boost::out_edges(u, fg); e != end; ++e) {
      int v = static_cast<int>(boost::target(*e, fg));
      if (!seen[v] && res[*e] > 1e-12 * std::max(1.0, boost::get(boost::edge_capacity, fg)[*e]))
        seen[v] = true, q.push(v);
    }
  }
  std::vector<bool> mask(n_ops);
  for (int o = 0; o < n_ops; ++o) mask[o] = seen[o];
  return mask;
}

std::vector<LayerOption> min_cut_hull(const BlockGraph& g, const std::vector<double>& op_cost) {
  auto solve = [&](double lambda) {
    return evaluate_option(g, min_cut_mask(g, op_cost, lambda), op_cost);
  };
  // Endpoints: the cheapest mask keeping the least among the cheapest (lambda tiny), and the mask
  // keeping the least (lambda huge).
  double total = 1;
  for (double c : op_cost) total += c;
  int64_t bytes = 1;
  for (const GraphTensor& t : g.tensors) bytes += t.type.bytes();
  LayerOption left = solve(1e-6 * 1e-6 / static_cast<double>(bytes) * total);
  LayerOption right = solve(1e6 * total);
  std::vector<LayerOption> hull{left};
  // Between two vertices a and b, the lambda at which they tie; a new vertex shows up strictly
  // below the segment.
  std::vector<std::pair<LayerOption, LayerOption>> todo{{left, right}};
  std::vector<LayerOption> found;
  while (!todo.empty()) {
    auto [a, b] = todo.back();
    todo.pop_back();
    if (a.kept_bytes <= b.kept_bytes) continue;
    double lambda = (b.cost - a.cost) / static_cast<double>(a.kept_bytes - b.kept_bytes);
    LayerOption m = solve(lambda);
    double on_line = a.cost + lambda * static_cast<double>(a.kept_bytes);
    double value = m.cost + lambda * static_cast<double>(m.kept_bytes);
    if (value < on_line * (1 - 1e-9) - 1e-15 && m.kept_bytes < a.kept_bytes &&
        m.kept_bytes > b.kept_bytes) {
      found.push_back(m);
      todo.push_back({a, m});
      todo.push_back({m, b});
    }
  }
  hull.insert(hull.end(), found.begin(), found.end());
  if (right.kept_bytes != left.kept_bytes) hull.push_back(right);
  std::sort(hull.begin(), hull.end(),
            [](const LayerOption& x, const LayerOption& y) { return x.kept_bytes > y.kept_bytes; });
  return hull;
}

int64_t least_kept_bytes(const BlockGraph& g) {
  // With every re-run free, the cut pays the kept bytes alone (integral capacities: exact).
  const std::vector<double> free(g.ops.size(), 0.0);
  return evaluate_option(g, min_cut_mask(g, free, 1.0), free).kept_bytes;
}

}  // namespace np

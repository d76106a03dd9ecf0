// Prints the cost model against published measurements (planner/recompute/published.hpp) as a table:
// paper, table, what, published, predicted, error. Usage: cost_check [--markdown]
#include <cmath>
#include <cstdio>
#include <cstring>

#include "planner/inputs/catalog.hpp"
#include "planner/recompute/published.hpp"

int main(int argc, char** argv) {
  bool markdown = argc > 1 && std::strcmp(argv[1], "--markdown") == 0;
  const std::string dir = NANOPLAN_SOURCE_DIR "/models";
  auto models = np::load_model_catalog(dir);
  auto gpus = np::load_gpu_catalog(dir + "/gpus/gpus.toml");
  if (!models || !gpus) {
    std::fprintf(stderr, "cost_check: %s\n",
                 (!models ? models.error() : gpus.error()).message.c_str());
    return 2;
  }
  auto model = [&](const char* n) { return *np::resolve_model(*models, n); };
  np::Catalogs c{model("gpt-22b"), model("gpt3-175b"), model("gpt-530b"), model("gpt-1t"),
                 np::hardware_model(*np::resolve_gpu(*gpus, "a100-80gb"))};
  double worst = 0, sum = 0;
  std::vector<np::PublishedCheck> checks = np::published_checks(c);
  if (markdown)
    std::printf("| source | what | published | predicted | error | beyond the bound |\n"
                "|---|---|---:|---:|---:|---|\n");
  for (const np::PublishedCheck& k : checks) {
    if (markdown)
      std::printf("| %s, %s | %s | %.2f %s | %.2f %s | %+.1f %% | %s |\n", k.paper.c_str(),
                  k.table.c_str(), k.what.c_str(), k.published, k.unit.c_str(), k.predicted,
                  k.unit.c_str(), 100 * k.error(), k.outside_bound.c_str());
    else
      std::printf("%-24s %-8s %-58s %10.2f %10.2f %-16s %+7.1f%%\n", k.paper.c_str(),
                  k.table.c_str(), k.what.c_str(), k.published, k.predicted, k.unit.c_str(),
                  100 * k.error());
    worst = std::max(worst, std::abs(k.error()));
    sum += std::abs(k.error());
  }
  std::printf("%zu checks: mean |error| %.1f %%, worst %.1f %%\n", checks.size(),
              100 * sum / static_cast<double>(checks.size()), 100 * worst);
  return 0;
}

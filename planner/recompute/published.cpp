// The cost model against published measurements (published.hpp): the setups of two papers, their
// figures as printed, and the model's predictions for the same setups.
#include "planner/recompute/published.hpp"

#include <cmath>

#include "planner/recompute/autoplan.hpp"
#include "planner/graph/policy.hpp"

namespace np {
namespace {

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
// arXiv:2205.05198, section 6: Selene, 8 A100 80GB per node over NVLink/NVSwitch, 8 x 200 Gb/s
// HDR InfiniBand per node; TP 8, s = 2048, v = 51200, no data parallelism.
constexpr const char* kKorthikanti = "Korthikanti et al. 2022";
// Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM", arXiv:2104.04473, section 5: the same Selene nodes, s = 2048, v = 51200, full
// activation recomputation, the interleaved schedule.
constexpr const char* kNarayanan = "Narayanan et al. 2021";

// Selene's network: 8 x 200 Gb/s HCAs for 8 GPUs, 25 GB/s per GPU across nodes.
HardwareModel selene(const HardwareModel& a100) {
  HardwareModel hw = a100;
  hw.inter_node_bytes_per_s = 25e9;
  return hw;
}

TrainSpec megatron_setup(int64_t tp, int64_t pp, int64_t dp, int64_t mbs, int64_t m, bool sp,
                         Recompute r) {
  TrainSpec t;
  t.tp = tp, t.pp = pp, t.dp = dp, t.sp = sp;
  t.seq_len = 2048, t.micro_batch = mbs, t.microbatches = m;
  t.attention = AttentionImpl::kEager;  // Megatron's fused softmax, not flash attention (2021-22)
  t.pp_schedule = pp > 1 ? PpSchedule::k1F1B : PpSchedule::kAfab;
  t.recompute = r;
  t.p2p_scatter_gather = true;  // Megatron-LM of 2021-22 (Narayanan et al. 2021, section 4.1)
  return t;
}

// A GPT-3-style model of Narayanan et al.'s Table 1 (heads, hidden, layers), built like the
// catalog's gpt-22b (LayerNorm, GeLU MLP of 4h, learned positions, biases, tied embeddings).
ModelSpec gpt(const ModelSpec& like, int64_t heads, int64_t hidden, int64_t layers) {
  ModelSpec m = like;
  m.name = "gpt-" + std::to_string(hidden) + "x" + std::to_string(layers);
  m.display_name = m.name;
  m.heads = m.kv_heads = heads, m.hidden = hidden, m.layers = layers;
  m.head_dim = hidden / heads, m.ffn = 4 * hidden;
  m.expected_parameters.reset();
  return m;
}

}  // namespace

std::vector<PublishedCheck> published_checks(const Catalogs& c) {
  std::vector<PublishedCheck> out;
  const HardwareModel hw = selene(c.a100);

  // Table 4: one layer of the 22B model (mbs 4), forward and backward in ms (backward including
  // the recompute).
  struct LayerRow {
    const char* experiment;
    bool sp;
    Recompute r;
    double fwd, bwd;
  };
  for (const LayerRow& row : {LayerRow{"no recompute", false, Recompute::kNone, 7.7, 11.9},
                              {"sequence parallelism", true, Recompute::kNone, 7.2, 11.8},
                              {"full recompute", false, Recompute::kFull, 7.7, 19.5},
                              {"selective recompute", false, Recompute::kSelective, 7.7, 13.2},
                              {"selective + sequence parallelism", true, Recompute::kSelective, 7.2,
                               13.1}}) {
    TrainSpec t = megatron_setup(8, 1, 1, 4, 1, row.sp, row.r);
    BlockGraph g = build_layer(c.gpt_22b, t);
    BlockPolicy p = named_policy(g, t);
    BlockTime bt = block_seconds(g, hw, t);
    double rec = recompute_seconds(g, p.recompute, hw, t);
    std::string what = std::string("22B layer, ") + row.experiment;
    out.push_back({kKorthikanti, "Table 4", what + ": forward", "ms", row.fwd, 1e3 * bt.forward});
    out.push_back(
        {kKorthikanti, "Table 4", what + ": backward", "ms", row.bwd, 1e3 * (bt.backward + rec)});
  }

  // Table 5: iteration time (s) with full recompute and with the paper's sequence parallelism +
  // selective recompute; setups of Table 3 (the interleaved schedule with 3 chunks for 175B and
  // 530B, section 6).
  struct StepRow {
    const ModelSpec* m;
    const char* name;
    int64_t pp, mbs, batch, chunks;
    double full, selective;
  };
  for (const StepRow& row : {StepRow{&c.gpt_22b, "22B", 1, 4, 4, 1, 1.42, 1.10},
                             {&c.gpt_175b, "175B", 8, 1, 64, 3, 18.13, 13.75},
                             {&c.gpt_530b, "530B", 35, 1, 280, 3, 49.05, 37.83},
                             {&c.gpt_1t, "1T", 64, 1, 512, 1, 94.42, 71.49}}) {
    for (bool present : {false, true}) {
      TrainSpec t = megatron_setup(8, row.pp, 1, row.mbs, row.batch / row.mbs, present,
                                   present ? Recompute::kSelective : Recompute::kFull);
      if (row.chunks > 1) t.pp_schedule = PpSchedule::kInterleaved, t.virtual_stages = row.chunks;
      out.push_back({kKorthikanti, "Table 5",
                     std::string(row.name) + " iteration, " +
                         (present ? "sequence parallelism + selective" : "full recompute"),
                     "s", present ? row.selective : row.full,
                     named_step_time(*row.m, t, hw).seconds});
    }
  }

  // Table 1: achieved teraFLOP/s per GPU, counting the recompute's forward as the paper's
  // equation (3) does: F = 96 B s l h^2 (1 + s / 6h + V / 16 l h) per iteration. The paper does
  // not state the micro-batch size or the chunks per stage: micro-batch 1 and 2 chunks where the
  // layers allow (else 1F1B) are assumed.
  // The A100's GEMM table (models/gpus/gpus.toml) is cuBLAS of 2025, measured on the PCIe card
  // and scaled to the SXM4; the paper's Megatron-LM of 2021 ran the CUDA 11 cuBLAS and unfused
  // kernels, and it states neither the micro-batch size nor the chunks per stage (1 and 2 are
  // assumed). The largest pipelined models come out too fast by more than the bound.
  const char* kOlderStack =
      "too fast on the largest pipelined models: the GEMM table is today's cuBLAS (A100 PCIe, "
      "scaled to the SXM4), the paper's 2021 stack reached less, and its micro-batch size and "
      "chunks per stage are not stated (1 and 2 assumed)";
  struct FlopsRow {
    int64_t heads, hidden, layers, tp, pp, gpus, batch;
    double tflops;
    const char* outside = "";
  };
  for (const FlopsRow& row : {FlopsRow{24, 2304, 24, 1, 1, 32, 512, 137},
                              {32, 3072, 30, 2, 1, 64, 512, 138},
                              {32, 4096, 36, 4, 1, 128, 512, 142},
                              {48, 6144, 40, 8, 1, 256, 1024, 135},
                              {64, 8192, 48, 8, 2, 512, 1536, 138},
                              {80, 10240, 60, 8, 4, 1024, 1792, 140},
                              {96, 12288, 80, 8, 8, 1536, 2304, 148},
                              {128, 16384, 96, 8, 16, 1920, 2160, 155, kOlderStack},
                              {128, 20480, 105, 8, 35, 2520, 2520, 163},
                              {160, 25600, 128, 8, 64, 3072, 3072, 163, kOlderStack}}) {
    ModelSpec m = gpt(c.gpt_22b, row.heads, row.hidden, row.layers);
    const int64_t dp = row.gpus / (row.tp * row.pp), micro = row.batch / dp;
    TrainSpec t = megatron_setup(row.tp, row.pp, dp, 1, micro, row.tp > 1, Recompute::kFull);
    if (row.pp > 1 && row.layers % (2 * row.pp) == 0 && micro % row.pp == 0)
      t.pp_schedule = PpSchedule::kInterleaved, t.virtual_stages = 2;
    double s = 2048, h = static_cast<double>(row.hidden), l = static_cast<double>(row.layers);
    double flops = 96.0 * static_cast<double>(row.batch) * s * l * h * h *
                   (1 + s / (6 * h) + 51200.0 / (16 * l * h));
    double seconds = named_step_time(m, t, hw).seconds;
    char what[96];
    std::snprintf(what, sizeof what, "GPT %.1fB (h %lld, %lld layers) on %lld GPUs",
                  static_cast<double>(count_parameters(m)) / 1e9,
                  static_cast<long long>(row.hidden), static_cast<long long>(row.layers),
                  static_cast<long long>(row.gpus));
    out.push_back({kNarayanan, "Table 1", what, "TFLOP/s per GPU", row.tflops,
                   flops / (seconds * static_cast<double>(row.gpus)) / 1e12, row.outside});
  }
  return out;
}

double PublishedCheck::error() const {
  return (predicted - published) / published;
}

}  // namespace np

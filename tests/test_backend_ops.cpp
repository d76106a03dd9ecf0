// The backend-ops test, in the manner of ggml's test-backend-ops: every op of the block graphs of
// small models with odd sizes (hidden 24 and 40; sequence 7, 9 and 10; micro-batch 3; vocabulary
// 37, or 19 per rank at tp 2; 6 query heads over 2 KV heads, 5 over 5; 5 experts top 2, with and
// without a capacity), under every implementation profile, runs forward and backward on the CUDA
// backend (emulated) and on the CPU reference with the same inputs, weights and gradients, and
// their results must agree. One test per profile and op kind (BackendOps/Ops.CudaMatchesCpu/
// megatron_cross_entropy_te), so that a kind the CUDA backend cannot run fails by name.
//
// Inputs and gradients are the CPU reference's run of the whole block (random weights and block
// inputs; forward, then backward from a random gradient of the block's output), so routing,
// probabilities, token ids and the gradients' causal zeros are what a run feeds each op, and each
// backward gets what the schedule gives it: the gradients of its outputs that later ops made, and
// an input's gradient to accumulate into where a later consumer made it first. Weight gradients
// start random and are accumulated into. Each rank of a tp 2 setup runs on its own thread, the CPU
// reference's collectives on host memory and the CUDA backend's on device memory (virtual ranks),
// as in a run.
//
// Agreement: every output, input gradient and weight gradient (and its increment) within a
// relative error in the 2-norm of 1e-2, as the kernel tests' bf16 bound (the largest seen is 4e-3:
// the backends round in different orders, and the CUDA backend's tensor-core products take bf16
// operands), a NaN anywhere failing (every allocation starts as NaN); integer outputs (routing
// indices, dropout masks) exactly; and both backends allocate the same outputs, workspaces and
// gradients, role by role, in the same order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "executor/fp8.hpp"
#include "executor/comm/inproc.hpp"
#include "executor/cpu/cpu_backend.hpp"
#include "executor/cuda/cuda_backend.hpp"
#include "executor/cuda/transfer.hpp"
#include "planner/graph/graph.hpp"

namespace np::exec {
namespace {

constexpr double kTolerance = 1e-2;
constexpr int64_t kMaxTp = 2;  // the setups' largest tp: one CUDA backend per rank

// Op kinds the test cannot run on the CUDA backend, each with the reason. Every other kind must
// occur in some profile's graphs below, and is compared there.
const std::map<OpKind, const char*>& exceptions() {
  static const std::map<OpKind, const char*> e = {
      {OpKind::kCpGatherKv,
       "context parallelism runs on the CPU executor only: exec::check_runnable refuses cp > 1 "
       "for the CUDA backend, which has no kernel for it"},
      {OpKind::kFlashAttentionCp,
       "context parallelism runs on the CPU executor only: exec::check_runnable refuses cp > 1 "
       "for the CUDA backend, which has no kernel for it"},
  };
  return e;
}

// ---- the models and setups ----------------------------------------------------------------------

ModelSpec llama(int64_t vocab) {
  ModelSpec m;
  m.name = "ops-llama";
  m.hidden = 24, m.ffn = 20, m.layers = 2, m.heads = 6, m.kv_heads = 2, m.head_dim = 4;
  m.vocab = vocab, m.max_positions = 16;
  return m;
}

// LayerNorm, GeLU, learned positions, biases, tied embeddings, dropout.
ModelSpec gpt(int64_t vocab, int64_t heads) {
  ModelSpec m;
  m.name = "ops-gpt";
  m.hidden = 40, m.ffn = 36, m.layers = 2, m.heads = heads, m.kv_heads = heads,
  m.head_dim = 40 / heads;
  m.vocab = vocab, m.max_positions = 16;
  m.norm = Norm::kLayer, m.activation = Activation::kGelu, m.position = PosEmb::kLearned;
  m.qkv_bias = m.linear_bias = m.tie_embeddings = true;
  m.dropout = 0.1;
  return m;
}

// Five experts, top 2; with a gated shared expert, or without one.
ModelSpec moe(int64_t vocab, bool shared) {
  ModelSpec m = llama(vocab);
  m.name = "ops-moe";
  m.moe = MoeSpec{5, 2, 10, shared ? 14 : 0, shared};
  return m;
}

// DeepSeek-V3's routing (sigmoid scores, the expert bias's scratch, the best 2 of 3 groups of 2
// experts, scaled weights), or Qwen1.5-MoE's (the top-2 of the softmax over all, unnormalised).
ModelSpec moe_routed(int64_t vocab, bool deepseek) {
  ModelSpec m = llama(vocab);
  m.name = "ops-moe-routed";
  m.moe = MoeSpec{6, 2, 10, deepseek ? 14 : 0, false, deepseek};
  m.moe->router = deepseek ? RouterSpec{.sigmoid = true, .groups = 3, .topk_groups = 2,
                                        .scaling = 2.5}
                           : RouterSpec{.normalize = false};
  return m;
}

// Multi-head latent attention (DeepSeek's): 6 heads of q/k 4 content + 2 RoPE features and v 4
// (below q/k's 6: the CUDA attention reads v zero-padded), a kv latent of 8 and a q latent of 10
// or a direct q projection.
ModelSpec mla(int64_t vocab, bool q_latent) {
  ModelSpec m = llama(vocab);
  m.name = "ops-mla";
  m.kv_heads = m.heads, m.head_dim = 6;
  m.mla = MlaSpec{q_latent ? 10 : 0, 8, 4, 2, 4};
  return m;
}

// Multi-token prediction: two depths (the embedding's and the LM head's weights shared, a
// concatenation, eh_proj's features gathered and, under SP, scattered), on MLA.
ModelSpec mtp(int64_t vocab) {
  ModelSpec m = mla(vocab, false);
  m.name = "ops-mtp";
  m.mtp_layers = 2;
  return m;
}

// Qwen3's attention: q/k norms, head_dim 6 apart from hidden / heads = 4.
ModelSpec qwen3(int64_t vocab) {
  ModelSpec m = llama(vocab);
  m.name = "ops-qwen3";
  m.head_dim = 6, m.qk_norm = true;
  return m;
}

struct Config {
  std::string label;
  ModelSpec model;
  TrainSpec train;
};

std::vector<Config> setups(Impl impl) {
  auto train = [impl](int64_t tp, bool sp, int64_t seq, AttentionImpl attention) {
    TrainSpec t;
    t.tp = tp, t.sp = sp, t.seq_len = seq, t.micro_batch = 3, t.attention = attention;
    t.impl = impl;
    if (impl == Impl::kMegatron) t.vocab_multiple = 1;  // the vocabulary unpadded: odd shards
    return t;
  };
  const auto flash = AttentionImpl::kFlash, eager = AttentionImpl::kEager;
  if (impl == Impl::kTorchtitan) {  // its Llama 3 and Qwen3 code: flash, TP with SP
    std::vector<Config> s = {
        {"llama tp 1 flash", llama(37), train(1, false, 7, flash)},
        {"llama tp 2 sp flash", llama(38), train(2, true, 10, flash)},
        {"qwen3 tp 1 flash", qwen3(37), train(1, false, 7, flash)},
        {"qwen3 tp 2 sp flash", qwen3(38), train(2, true, 10, flash)},
    };
    // torchao's float8 linears: every dimension a multiple of 16 (so each linear and the LM head
    // convert), under FSDP (the ops are the same at dp 1).
    ModelSpec m16 = llama(48);
    m16.hidden = 32, m16.ffn = 48, m16.heads = 4, m16.kv_heads = 2, m16.head_dim = 8;
    for (Fp8Recipe r : {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise, Fp8Recipe::kRowwiseGwHp}) {
      s.push_back({std::string("llama16 fp8 ") + name_of(r) + " tp 1", m16, train(1, false, 7, flash)});
      s.back().train.fsdp = true, s.back().train.fp8 = r;
      s.back().train.pp_schedule = PpSchedule::k1F1B;
    }
    // torchao's float8 TP: the float8 all-gathers, the column and row linears' kinds.
    s.push_back({"llama16 fp8 tensorwise tp 2 sp", m16, train(2, true, 10, flash)});
    s.back().train.fsdp = true, s.back().train.fp8 = Fp8Recipe::kTensorwise;
    s.back().train.pp_schedule = PpSchedule::k1F1B;
    for (Config& x : s) x.label = "torchtitan " + x.label;
    return s;
  }
  // tp 2: a vocabulary of 38 (19 rows per rank); sp: 10 positions, so that tp divides s x b.
  std::vector<Config> s = {
      {"llama tp 1 flash", llama(37), train(1, false, 7, flash)},
      {"llama tp 1 eager", llama(37), train(1, false, 7, eager)},
      {"llama tp 2 sp flash", llama(38), train(2, true, 10, flash)},
      {"llama tp 2 eager", llama(38), train(2, false, 7, eager)},
      {"gpt tp 1 flash", gpt(37, 5), train(1, false, 9, flash)},
      {"gpt tp 1 eager", gpt(37, 5), train(1, false, 9, eager)},
      {"gpt tp 2 sp eager", gpt(38, 4), train(2, true, 10, eager)},
      {"moe tp 1", moe(37, true), train(1, false, 7, flash)},
      {"moe tp 2 sp", moe(38, true), train(2, true, 10, flash)},
      {"moe capacity 1 tp 1", moe(37, false), train(1, false, 9, flash)},
  };
  s.back().train.moe_capacity_factor = 1.0;
  s.push_back({"deepseek routing tp 2 sp", moe_routed(38, true), train(2, true, 10, flash)});
  s.push_back({"qwen1.5-moe routing tp 1", moe_routed(37, false), train(1, false, 7, flash)});
  s.push_back({"mla q latent tp 1 flash", mla(37, true), train(1, false, 7, flash)});
  s.push_back({"mla q latent tp 2 sp eager", mla(38, true), train(2, true, 10, eager)});
  s.push_back({"mla direct q tp 2 flash", mla(38, false), train(2, false, 7, flash)});
  s.push_back({"mla direct q tp 2 sp flash", mla(38, false), train(2, true, 10, flash)});
  s.push_back({"mtp tp 2 flash", mtp(38), train(2, false, 7, flash)});
  s.push_back({"mtp tp 2 sp flash", mtp(38), train(2, true, 10, flash)});
  s.push_back({"qwen3 tp 1 flash", qwen3(37), train(1, false, 7, flash)});
  s.push_back({"qwen3 tp 2 sp eager", qwen3(38), train(2, true, 10, eager)});
  if (impl == Impl::kMegatron) {  // the fused losses, and each weight gradient whole in bf16 first
    s.push_back({"llama tp 1 native loss, no gradient fusion", llama(37), train(1, false, 7, flash)});
    s.back().train.loss_fusion = LossFusion::kNative, s.back().train.grad_accum_fusion = false;
    s.push_back({"gpt tp 2 sp te loss, no gradient fusion", gpt(38, 4), train(2, true, 10, flash)});
    s.back().train.loss_fusion = LossFusion::kTe, s.back().train.grad_accum_fusion = false;
    s.push_back({"moe tp 1 te loss", moe(37, true), train(1, false, 9, eager)});
    s.back().train.loss_fusion = LossFusion::kTe;
    // Transformer Engine's float8 linears: features multiples of 16 per rank, 8 tokens a rank
    // at least (3 sequences of 8 or 16); RMSNorm and LayerNorm (with biases) writing float8.
    ModelSpec l16 = llama(48), g16 = gpt(48, 2);
    l16.hidden = 32, l16.ffn = 64, l16.heads = 4, l16.kv_heads = 2, l16.head_dim = 8;
    g16.hidden = 32, g16.ffn = 64, g16.head_dim = 16;
    for (auto [label, m, tp, sp, r] :
         {std::tuple<const char*, ModelSpec, int64_t, bool, Fp8Recipe>{
              "llama16 te fp8 delayed tp 1", l16, 1, false, Fp8Recipe::kDelayed},
          {"llama16 te fp8 tensorwise tp 2 sp", l16, 2, true, Fp8Recipe::kTensorwise},
          {"gpt16 te fp8 delayed tp 2 sp", g16, 2, true, Fp8Recipe::kDelayed},
          {"gpt16 te fp8 tensorwise tp 2", g16, 2, false, Fp8Recipe::kTensorwise}}) {
      s.push_back({label, m, train(tp, sp, tp > 1 && sp ? 16 : 8, flash)});
      s.back().train.fp8 = r;
    }
  }
  for (Config& x : s) x.label = std::string(name_of(impl)) + " " + x.label;
  return s;
}

constexpr BlockKind kBlocks[] = {BlockKind::kEmbedding, BlockKind::kLayer, BlockKind::kHead};

// The (profile, op kind) pairs whose kind occurs in some block graph of the profile's setups.
struct Pair {
  Impl impl;
  OpKind kind;
};

void PrintTo(const Pair& p, std::ostream* os) { *os << name_of(p.impl) << " " << name_of(p.kind); }

std::vector<Pair> pairs() {
  std::vector<Pair> out;
  for (Impl impl : {Impl::kNanotron, Impl::kMegatron, Impl::kFused, Impl::kHf, Impl::kTorchtitan}) {
    std::set<OpKind> kinds;
    for (const Config& s : setups(impl)) {
      if (validate_setup(s.model, s.train)) continue;  // reported by SetupsAreValid
      BlockGraphs graphs(s.model, s.train);
      for (BlockKind b : kBlocks)
        for (const GraphOp& op : graphs.of(b)->ops) kinds.insert(op.kind);
    }
    for (OpKind k : kinds) out.push_back({impl, k});
  }
  return out;
}

// ---- memory, values and comparison --------------------------------------------------------------

// One backend's memory for a stretch of the test: every allocation starts as 0xFF bytes (NaN in
// bf16 and fp32), so an element never written fails the comparison; released at the end.
class Memory {
 public:
  explicit Memory(Backend& be) : be_(be) {}
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  ~Memory() {
    for (void* p : blocks_) be_.release(p);
  }
  Tensor make(const TensorType& t) {
    void* p = be_.allocate(std::max<int64_t>(t.bytes(), 1));
    if (!p) throw std::runtime_error("out of memory");
    blocks_.push_back(p);
    be_.fill_bytes(p, 0xFF, t.bytes());
    return {p, t};
  }
  Tensor copy_of(const Tensor& host) {
    Tensor t = make(host.type);
    be_.copy_from_host(t, host.data);
    return t;
  }
  // The kernels' allocations, logged per role in order.
  std::function<Tensor(const TensorType&, AllocRole)> allocator() {
    return [this](const TensorType& t, AllocRole r) {
      log[static_cast<int>(r)].push_back(t);
      return make(t);
    };
  }
  std::vector<TensorType> log[3];

 private:
  Backend& be_;
  std::vector<void*> blocks_;
};

bool is_fp8(Dtype d) { return d == Dtype::kFp8E4m3 || d == Dtype::kFp8E5m2; }

std::vector<double> read(Backend& be, const Tensor& t) {
  std::vector<uint64_t> raw(static_cast<size_t>((t.bytes() + 7) / 8));
  be.copy_to_host(raw.data(), t);
  Tensor h{raw.data(), t.type};
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[i] = t.type.dtype == Dtype::kU8    ? h.as<uint8_t>()[i]
           : t.type.dtype == Dtype::kI64 ? static_cast<double>(h.as<int64_t>()[i])
           : is_fp8(t.type.dtype)        ? fp8_to_f32(h.as<uint8_t>()[i], t.type.dtype)
                                         : load(h, i);
  return v;
}

// Relative error of a against the reference b in the 2-norm (b zero: a's norm); a NaN in either
// is infinite.
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    d += (a[i] - b[i]) * (a[i] - b[i]), n += b[i] * b[i];
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

std::string str(const TensorType& t) {
  std::string s = std::string(name_of(t.dtype)) + "{";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? "," : "") + std::to_string(t.shape[i]);
  return s + "}";
}

// The CUDA backend's tensor `got` against the CPU reference's `want`: floats within the
// tolerance, integers exactly.
void expect_match(Backend& gpu, const Tensor& got, Backend& cpu, const Tensor& want,
                  const std::string& what) {
  ASSERT_TRUE(got) << what << ": the CUDA backend produced none";
  ASSERT_TRUE(want) << what << ": the CPU reference produced none";
  ASSERT_EQ(str(got.type), str(want.type)) << what;
  std::vector<double> a = read(gpu, got), b = read(cpu, want);
  // Integers exactly; float8 codes too (both backends cast the same values alike).
  if (want.type.dtype == Dtype::kU8 || want.type.dtype == Dtype::kI64 || is_fp8(want.type.dtype)) {
    EXPECT_EQ(a, b) << what;
    return;
  }
  EXPECT_LE(relative_error(a, b), kTolerance) << what;
}

void expect_same_allocations(const Memory& gpu, const Memory& cpu, const std::string& what) {
  constexpr const char* roles[] = {"outputs", "input gradients", "workspaces"};
  for (int r = 0; r < 3; ++r) {
    std::string g, c;
    for (const TensorType& t : gpu.log[r]) g += str(t) + " ";
    for (const TensorType& t : cpu.log[r]) c += str(t) + " ";
    EXPECT_EQ(g, c) << what << ": " << roles[r] << " allocated (CUDA, CPU reference)";
  }
}

// Values drawn from a seed of their own, the same on every rank and for both backends.
class Values {
 public:
  explicit Values(uint64_t seed) : g_(seed) {}
  // A host tensor of uniform values in [lo, hi) (integers in [0, hi)).
  Tensor host(const TensorType& t, double lo, double hi) {
    store_.emplace_back(static_cast<size_t>((t.bytes() + 7) / 8));
    Tensor h{store_.back().data(), t};
    for (int64_t i = 0; i < t.elements(); ++i) {
      if (t.dtype == Dtype::kI64)
        h.as<int64_t>()[i] = std::uniform_int_distribution<int64_t>(0, static_cast<int64_t>(hi) - 1)(g_);
      else
        store(h, i, static_cast<float>(std::uniform_real_distribution<double>(lo, hi)(g_)));
    }
    return h;
  }

 private:
  std::mt19937_64 g_;
  std::vector<std::vector<uint64_t>> store_;
};

// A seed per block, op (-1: the block's inputs) and purpose.
uint64_t seed_of(BlockKind b, int op, int purpose) {
  return 1000003ull * static_cast<uint64_t>(b) + 1009ull * static_cast<uint64_t>(op + 1) +
         static_cast<uint64_t>(purpose);
}

// Weights: norms' scales in [0.5, 1.5), everything else in [-0.5, 0.5).
std::vector<Tensor> weights_of(const GraphOp& op, Values& v) {
  std::vector<Tensor> w;
  for (const WeightShape& s : op.weights) {
    bool scale = is_norm(op.kind) && std::string(s.suffix) == "weight";
    w.push_back(v.host({s.shape, Dtype::kBf16}, scale ? 0.5 : -0.5, scale ? 1.5 : 0.5));
  }
  return w;
}

// ---- one rank --------------------------------------------------------------------------------------

// The CUDA backend of each rank, made once (with its cuBLAS workspace from its own memory, as a
// run gives it) and shared by the tests; the workspaces go back after the last test, as a run
// returns them (before exit, while the CUDA runtime is still there).
struct CudaRank {
  std::unique_ptr<Backend> backend;
  std::vector<void*> buffers;
};
std::mutex cuda_ranks_mu;
CudaRank cuda_ranks[kMaxTp];

Backend& cuda_backend(int64_t rank) {
  std::lock_guard<std::mutex> lock(cuda_ranks_mu);
  CudaRank& r = cuda_ranks[rank];
  if (!r.backend) {
    r.backend = cuda::make_cuda_backend();
    std::vector<RuntimeBuffer> b = r.backend->runtime_buffers();
    for (size_t i = 0; i < b.size(); ++i) {
      r.buffers.push_back(r.backend->allocate(b[i].bytes));
      r.backend->use_runtime_buffer(i, r.buffers.back());
    }
  }
  return *r.backend;
}

class ReleaseCudaRanks : public ::testing::Environment {
 public:
  void TearDown() override {
    for (CudaRank& r : cuda_ranks) {
      for (void* p : r.buffers) r.backend->release(p);
      r.buffers.clear();
      r.backend.reset();
    }
  }
};
const ::testing::Environment* const release_cuda_ranks =
    ::testing::AddGlobalTestEnvironment(new ReleaseCudaRanks);

class Rank {
 public:
  Rank(const Config& s, int64_t rank, Communicator& cpu_comm, Communicator& gpu_comm)
      : s_(s), rank_(rank), cpu_comm_(cpu_comm), gpu_comm_(gpu_comm), gpu_(cuda_backend(rank)) {}

  // Runs the block on the CPU reference, then compares each distinct op of `kind`. Returns how
  // many ops it compared.
  int compare_block(const BlockGraph& g, OpKind kind) {
    BlockRun r(*cpu_);
    run_block(g, r);
    std::set<std::string> seen;
    int compared = 0;
    for (size_t o = 0; o < g.ops.size(); ++o) {
      if (g.ops[o].kind != kind || !seen.insert(signature(g, static_cast<int>(o), r)).second)
        continue;
      compare_op(g, static_cast<int>(o), r);
      ++compared;
    }
    return compared;
  }

 private:
  // The CPU reference's run of a block from random weights and block inputs: every tensor's
  // value and gradient, and the gradients each op's backward was given.
  struct BlockRun {
    explicit BlockRun(Backend& cpu) : mem(cpu) {}
    Memory mem;
    std::vector<Tensor> values, grads;         // per tensor
    std::vector<std::vector<Tensor>> weights;  // per op
    std::vector<bool> runs;                    // per op: its backward runs
    // Per op and input: the input's gradient as it was before the op's backward, which
    // accumulated into it (absent: the backward allocated it).
    std::vector<std::vector<Tensor>> given;
  };

  // Forward, then backward as a schedule runs it (planner/schedule/contract.hpp, point 3): ops in
  // reverse order, each given the gradients of its outputs that later ops' backwards (or the next
  // block's, for the block's output) made, and accumulating into an input's gradient where a
  // later consumer made it first.
  void run_block(const BlockGraph& g, BlockRun& r) {
    const int n = static_cast<int>(g.ops.size());
    r.values.resize(g.tensors.size()), r.grads.resize(g.tensors.size());
    r.weights.resize(n), r.given.resize(n);
    r.runs = backward_runs(g);
    for (int t : g.inputs) {
      const GraphTensor& x = g.tensors[t];
      Values v(seed_of(g.kind, -1, t));
      bool ids = x.type.dtype == Dtype::kI64;  // token ids and targets
      r.values[t] = r.mem.copy_of(v.host(x.type, -1, ids ? s_.model.vocab : 1));
    }
    for (int o = 0; o < n; ++o) {
      const GraphOp& op = g.ops[o];
      Values v(seed_of(g.kind, o, 0));
      for (const Tensor& w : weights_of(op, v)) r.weights[o].push_back(r.mem.copy_of(w));
      std::vector<Tensor> in;
      for (int t : op.inputs) in.push_back(r.values[t]);
      std::vector<Tensor> out = cpu_->forward(context(g, o, &cpu_comm_, r.mem), in, r.weights[o]);
      for (size_t j = 0; j < op.outputs.size(); ++j) r.values[op.outputs[j]] = out.at(j);
    }
    if (g.hidden_out >= 0) {
      Values v(seed_of(g.kind, n, 0));
      r.grads[g.hidden_out] = r.mem.copy_of(v.host(g.tensors[g.hidden_out].type, -1, 1));
    }
    for (int o = n - 1; o >= 0; --o) {
      if (!r.runs[o]) continue;
      const GraphOp& op = g.ops[o];
      const OpInfo& info = op_info(op.kind);
      size_t n_in = op.inputs.size(), n_out = op.outputs.size();
      std::vector<Tensor> in(n_in), out(n_out), go(n_out), gi(n_in), wg;
      r.given[o].resize(n_in);
      for (size_t k = 0; k < n_in; ++k) {
        int t = op.inputs[k];
        if (info.bwd_reads_inputs >> k & 1u) in[k] = r.values[t];
        if ((info.grad_inputs >> k & 1u) && r.grads[t])
          r.given[o][k] = r.mem.copy_of(r.grads[t]), gi[k] = r.grads[t];
      }
      for (size_t j = 0; j < n_out; ++j) {
        if (info.bwd_reads_outputs >> j & 1u) out[j] = r.values[op.outputs[j]];
        if (info.grad_outputs >> j & 1u) go[j] = r.grads[op.outputs[j]];
      }
      for (const WeightShape& w : op.weights) {
        wg.push_back(r.mem.make({w.shape, s_.train.grad_dtype}));
        cpu_->fill(wg.back(), 0.0f);
      }
      cpu_->backward(context(g, o, &cpu_comm_, r.mem), {in, out, go, gi, r.weights[o], wg});
      for (size_t k = 0; k < n_in; ++k)
        if (info.grad_inputs >> k & 1u) r.grads[op.inputs[k]] = gi[k];
    }
  }

  // What an op instance's kernels see: two with the same signature run alike.
  static std::string signature(const BlockGraph& g, int o, const BlockRun& r) {
    const GraphOp& op = g.ops[o];
    const OpAttrs& a = op.attrs;
    std::string s = std::to_string(a.features) + "/" + std::to_string(a.rows) + "/" +
                    std::to_string(a.group) + "/" + std::to_string(a.batch) + "/" +
                    std::to_string(a.seq) + "/" + std::to_string(a.heads) + "/" +
                    std::to_string(a.kv_heads) + "/" + std::to_string(a.head_dim) + "/" +
                    std::to_string(a.experts) + "/" + std::to_string(a.top_k) + "/" +
                    std::to_string(a.capacity) + "/" + std::to_string(a.bias) +
                    std::to_string(a.fp32_copy) + std::to_string(a.fp32_grad) +
                    std::to_string(a.dense_wgrad) + " " + op.bwd_collective + " " +
                    std::to_string(r.runs[o]);
    for (int t : op.inputs) s += " " + str(g.tensors[t].type);
    for (const WeightShape& w : op.weights) s += " " + std::string(w.suffix);
    for (int t : op.outputs) s += r.grads[t] ? " g" : " -";
    for (const Tensor& t : r.given[o]) s += t ? " a" : " -";
    return s;
  }

  OpContext context(const BlockGraph& g, int o, Communicator* comm, Memory& mem) const {
    const TrainSpec& t = s_.train;
    OpContext ctx;
    ctx.op = &g.ops[o], ctx.model = &s_.model, ctx.setup = &t, ctx.comm = comm;
    ctx.tp_rank = rank_, ctx.layer = g.kind == BlockKind::kLayer ? 1 : -1, ctx.op_index = o;
    ctx.mb = 1, ctx.seed = 77;
    ctx.token_offset = t.sp ? rank_ * (t.seq_len * t.micro_batch / t.tp) : 0;
    ctx.loss_scale = static_cast<float>(1.0 / static_cast<double>(t.seq_len * t.micro_batch));
    ctx.alloc = mem.allocator();
    return ctx;
  }

  // The op's forward and backward on both backends, from the block run's inputs and gradients
  // (the CPU reference's memory is host memory: its tensors are the copies' sources).
  void compare_op(const BlockGraph& g, int o, const BlockRun& r) {
    const GraphOp& op = g.ops[o];
    const OpInfo& info = op_info(op.kind);
    const std::string where = s_.label + ", rank " + std::to_string(rank_) + ", " +
                              name_of(g.kind) + " op " + op.name + " (" + info.name + ")";
    Memory cm(*cpu_), gm(gpu_);
    std::vector<Tensor> cin, gin, gw;
    for (int t : op.inputs) cin.push_back(r.values[t]), gin.push_back(gm.copy_of(r.values[t]));
    for (const Tensor& w : r.weights[o]) gw.push_back(gm.copy_of(w));

    std::vector<Tensor> cout = cpu_->forward(context(g, o, &cpu_comm_, cm), cin, r.weights[o]);
    std::vector<Tensor> gout = gpu_.forward(context(g, o, &gpu_comm_, gm), gin, gw);
    expect_same_allocations(gm, cm, where + " forward");
    // Thrown, not asserted: a rank leaving early would leave the others in a collective.
    if (gout.size() < op.outputs.size() || cout.size() < op.outputs.size())
      throw std::runtime_error(where + ": fewer outputs than the op table's");
    for (size_t j = 0; j < op.outputs.size(); ++j)
      expect_match(gpu_, gout[j], *cpu_, cout[j], where + " output " + std::to_string(j));
    if (!r.runs[o]) return;

    // The backward reads what the op table says, each backend its own outputs.
    for (auto& l : cm.log) l.clear();
    for (auto& l : gm.log) l.clear();
    size_t n_in = op.inputs.size(), n_out = op.outputs.size();
    std::vector<Tensor> c_in(n_in), g_in(n_in), c_out(n_out), g_out(n_out), c_go(n_out),
        g_go(n_out), c_gi(n_in), g_gi(n_in), c_wg, g_wg;
    for (size_t k = 0; k < n_in; ++k) {
      if (info.bwd_reads_inputs >> k & 1u) c_in[k] = cin[k], g_in[k] = gin[k];
      if (const Tensor& given = r.given[o][k]) c_gi[k] = cm.copy_of(given), g_gi[k] = gm.copy_of(given);
    }
    for (size_t j = 0; j < n_out; ++j) {
      if (info.bwd_reads_outputs >> j & 1u) c_out[j] = cout[j], g_out[j] = gout[j];
      const Tensor& grad = r.grads[op.outputs[j]];
      if ((info.grad_outputs >> j & 1u) && grad) c_go[j] = cm.copy_of(grad), g_go[j] = gm.copy_of(grad);
    }
    // Weight gradients start random: the backward adds into them.
    Values v(seed_of(g.kind, o, 1));
    std::vector<std::vector<double>> start;
    for (const WeightShape& s : op.weights) {
      Tensor h = v.host({s.shape, s_.train.grad_dtype}, -1, 1);
      c_wg.push_back(cm.copy_of(h)), g_wg.push_back(gm.copy_of(h));
      start.push_back(read(*cpu_, c_wg.back()));
    }
    cpu_->backward(context(g, o, &cpu_comm_, cm), {c_in, c_out, c_go, c_gi, r.weights[o], c_wg});
    gpu_.backward(context(g, o, &gpu_comm_, gm), {g_in, g_out, g_go, g_gi, gw, g_wg});
    expect_same_allocations(gm, cm, where + " backward");
    for (size_t k = 0; k < n_in; ++k)
      if (info.grad_inputs >> k & 1u)
        expect_match(gpu_, g_gi[k], *cpu_, c_gi[k],
                     where + " gradient of input " + std::to_string(k) +
                         (r.given[o][k] ? " (accumulated)" : ""));
    // Weight gradients: the sums, and the increments alone (which the sums could hide).
    for (size_t w = 0; w < op.weights.size(); ++w) {
      std::string what = where + " gradient of " + op.weights[w].suffix;
      expect_match(gpu_, g_wg[w], *cpu_, c_wg[w], what);
      std::vector<double> a = read(gpu_, g_wg[w]), b = read(*cpu_, c_wg[w]);
      for (size_t i = 0; i < a.size(); ++i) a[i] -= start[w][i], b[i] -= start[w][i];
      EXPECT_LE(relative_error(a, b), kTolerance) << what << ", increment";
    }
  }

  const Config& s_;
  int64_t rank_;
  Communicator& cpu_comm_;
  Communicator& gpu_comm_;
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
  Backend& gpu_;
};

// Runs the setup's ranks on threads; returns how many op instances of `kind` it compared (every
// rank compares the same ones).
int compare_setup(const Config& s, OpKind kind) {
  const int64_t tp = s.train.tp;
  BlockGraphs graphs(s.model, s.train);
  bool has = false;
  for (BlockKind b : kBlocks)
    for (const GraphOp& op : graphs.of(b)->ops) has |= op.kind == kind;
  if (!has) return 0;
  InProcessWorld cpu_world(tp, 1);
  std::unique_ptr<CommWorld> gpu_world = cuda::virtual_rank_world()(tp, 1, 1, 1, 1);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(tp));
  std::vector<int> compared(static_cast<size_t>(tp), 0);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      try {
        Rank rank(s, r, cpu_world.comm(0, 0, r), gpu_world->comm(0, 0, r));
        for (BlockKind b : kBlocks) compared[r] += rank.compare_block(*graphs.of(b), kind);
      } catch (...) {  // release the other ranks from their collectives
        errors[r] = std::current_exception();
        cpu_world.abort(0, 0, r);
        gpu_world->abort(0, 0, r);
      }
    });
  for (std::thread& t : threads) t.join();
  for (int64_t r = 0; r < tp; ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const RunAborted&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << s.label << ", rank " << r << ": " << e.what();
    }
  }
  return compared[0];
}

// ---- the tests -------------------------------------------------------------------------------------

class Ops : public ::testing::TestWithParam<Pair> {};

TEST_P(Ops, CudaMatchesCpu) {
  const auto [impl, kind] = GetParam();
  int compared = 0;
  for (const Config& s : setups(impl))  // an invalid one fails SetupsAreValid
    if (!validate_setup(s.model, s.train)) compared += compare_setup(s, kind);
  EXPECT_GT(compared, 0) << "no " << name_of(kind) << " op was compared";
}

std::string pair_name(const ::testing::TestParamInfo<Pair>& p) {
  return std::string(name_of(p.param.impl)) + "_" + name_of(p.param.kind);
}

INSTANTIATE_TEST_SUITE_P(BackendOps, Ops, ::testing::ValuesIn(pairs()), pair_name);

TEST(BackendOps, SetupsAreValid) {
  for (Impl impl : {Impl::kNanotron, Impl::kMegatron, Impl::kFused, Impl::kHf, Impl::kTorchtitan})
    for (const Config& s : setups(impl)) {
      std::optional<Error> e = validate_setup(s.model, s.train);
      EXPECT_FALSE(e) << s.label << ": " << (e ? e->message : "");
    }
}

// Every op kind is compared under some profile or excepted with its reason, never both.
TEST(BackendOps, EveryOpKindIsComparedOrExcepted) {
  std::set<OpKind> compared;
  for (const Pair& p : pairs()) compared.insert(p.kind);
  for (int k = 0; k < static_cast<int>(OpKind::kCount); ++k) {
    auto kind = static_cast<OpKind>(k);
    bool excepted = exceptions().count(kind) > 0;
    EXPECT_TRUE(compared.count(kind) || excepted)
        << name_of(kind) << " occurs in no block graph of the setups here and is not excepted: "
        << "add a setup whose graphs have it (and a CUDA kernel), or an exception with the reason";
    EXPECT_FALSE(compared.count(kind) && excepted)
        << name_of(kind) << " is compared: remove its exception";
  }
}

// The excepted kinds are refused by the CUDA backend, as their reasons say: a kernel for one
// fails this, so that its exception goes and a setup compares it.
TEST(BackendOps, ExceptedKindsAreRefused) {
  ModelSpec m = llama(37);
  TrainSpec t;
  for (const auto& [kind, why] : exceptions()) {
    GraphOp op{kind, name_of(kind)};
    Memory mem(cuda_backend(0));
    OpContext ctx;
    ctx.op = &op, ctx.model = &m, ctx.setup = &t, ctx.alloc = mem.allocator();
    auto refuses = [&](auto&& call) {
      try {
        call();
      } catch (const std::exception& e) {
        return std::string(e.what()).find("not written for the CUDA backend") != std::string::npos;
      }
      return false;
    };
    EXPECT_TRUE(refuses([&] { cuda_backend(0).forward(ctx, {}, {}); })) << name_of(kind) << ": " << why;
    EXPECT_TRUE(refuses([&] { cuda_backend(0).backward(ctx, {}); })) << name_of(kind) << ": " << why;
  }
}

}  // namespace
}  // namespace np::exec

// Op tests of the CPU reference backend (executor/cpu): every OpKind on small odd shapes, b 3 x s 5
// (T 15 rows), hidden 11, heads 3 with kv_heads 1 (GQA), head_dim 6, ffn 13, vocab 17, 5 experts
// top 2 (expert 3 receives no token).
//
// Gradients (Gradients/*): on make_cpu_backend_fp32_activations(), the same kernels with the
// tensors the op table stores in bf16 held in fp32, central finite differences of
// L = sum_i r_i out_i (r random, |r| in [0.5, 1]; for the loss, loss_scale x the sum of per-token
// losses), Richardson-extrapolated from steps 1e-2 and 5e-3, must match the backward within
// 1e-3 x max|grad| + 1e-5 absolute, for every float input with a grad bit and every weight.
// Backward also accumulates: preset input and weight gradients end bitwise as preset +
// contribution. bf16 (Bf16/*): fed the same bf16-representable values, every bf16 output and input
// gradient of make_cpu_backend() is bitwise f32_to_bf16 of the fp32 variant's (one rounding), fp32
// outputs and weight gradients are bitwise equal; allocations (role, shape, dtype, order) are the
// op table's; forward and backward are bitwise deterministic. Forward values (Reference/*) match
// naive double-precision references within 2e-5 relative. Every allocation is poisoned with 0xFF
// bytes (NaN for bf16/fp32, 255 for u8, -1 for i64), so an element never written shows up.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <thread>

#include "executor/cpu/cpu_backend.hpp"
#include "executor/fp8.hpp"
#include "executor/cpu/kernels.hpp"

namespace np::exec {
namespace {

constexpr int64_t B = 3, S = 5, T = B * S, H = 11, HQ = 3, HKV = 1, D = 6, F = 13, V = 17, E = 5,
                  K = 2;
constexpr int64_t QKV = (HQ + 2 * HKV) * D;

// The attention ops' attributes at the sizes above.
OpAttrs attention_attrs() {
  return {.batch = B, .seq = S, .heads = HQ, .kv_heads = HKV, .head_dim = D};
}
constexpr double kDropout = 0.2;
using Vec = std::vector<double>;

double bf(double x) {
  return bf16_to_f32(f32_to_bf16(static_cast<float>(x)));
}
bool is_float(Dtype d) {
  return d == Dtype::kBf16 || d == Dtype::kFp32;
}
bool bit(unsigned mask, int i) {
  return (mask >> i) & 1u;
}
std::string str(const TensorType& t) {
  std::string s = std::string(name_of(t.dtype)) + "{";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? "," : "") + std::to_string(t.shape[i]);
  return s + "}";
}
bool same(const TensorType& a, const TensorType& b) {
  return a.shape == b.shape && a.dtype == b.dtype;
}

// A tensor's values with its op-table type; integers are held as doubles.
struct Val {
  TensorType type;
  Vec v;
};

Val val(std::vector<int64_t> shape, Dtype dtype, Vec v) {
  Val x;
  x.type.shape = std::move(shape), x.type.dtype = dtype, x.v = std::move(v);
  return x;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(g_);
  }
  int64_t integer(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(g_);
  }
  Val floats(TensorType t, double lo = -1, double hi = 1) {
    Val x{t, Vec(t.elements())};
    for (double& v : x.v) v = bf(uniform(lo, hi));
    return x;
  }
  Vec signs(int64_t n) {  // |r| in [0.5, 1], never 0, bf16-representable
    Vec r(n);
    for (double& v : r) v = bf((integer(0, 1) ? 1 : -1) * uniform(0.5, 1.0));
    return r;
  }
  std::mt19937_64& engine() { return g_; }

 private:
  std::mt19937_64 g_;
};

// Memory of the tests and of the backend's allocations: every block starts as 0xFF bytes.
class Arena {
 public:
  struct Rec {
    TensorType type;
    AllocRole role;
  };
  Tensor make(const TensorType& t) {
    blocks_.emplace_back(std::max<int64_t>(1, (t.bytes() + 7) / 8), ~0ull);
    return {blocks_.back().data(), t};
  }
  Tensor alloc(const TensorType& t, AllocRole role) {
    log.push_back({t, role});
    return make(t);
  }
  std::vector<Rec> log;

 private:
  std::deque<std::vector<uint64_t>> blocks_;
};

void fill(const Tensor& t, const Vec& v) {
  ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (is_float(t.type.dtype))
      store(t, i, static_cast<float>(v[i]));
    else if (t.type.dtype == Dtype::kU8)
      t.as<uint8_t>()[i] = static_cast<uint8_t>(v[i]);
    else if (t.type.dtype == Dtype::kFp8E4m3 || t.type.dtype == Dtype::kFp8E5m2)
      t.as<uint8_t>()[i] = f32_to_fp8(static_cast<float>(v[i]), t.type.dtype);
    else
      t.as<int64_t>()[i] = static_cast<int64_t>(v[i]);
  }
}

Vec read(const Tensor& t) {
  Vec v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (is_float(t.type.dtype))
      v[i] = load(t, i);
    else if (t.type.dtype == Dtype::kU8)
      v[i] = t.as<uint8_t>()[i];
    else
      v[i] = static_cast<double>(t.as<int64_t>()[i]);
  }
  return v;
}

uint64_t bits(const Tensor& t, int64_t i) {
  switch (t.type.dtype) {
    case Dtype::kBf16:
      return t.as<uint16_t>()[i];
    case Dtype::kFp32: {
      uint32_t u;
      std::memcpy(&u, t.as<float>() + i, 4);
      return u;
    }
    case Dtype::kU8:
    case Dtype::kFp8E4m3:
    case Dtype::kFp8E5m2:
      return t.as<uint8_t>()[i];
    case Dtype::kI64:
      return static_cast<uint64_t>(t.as<int64_t>()[i]);
  }
  return 0;
}

// bf16 tensor == one rounding of the fp32 tensor; other dtypes: bitwise equal.
void expect_rounded(const Tensor& b, const Tensor& f, const std::string& what) {
  ASSERT_EQ(b.numel(), f.numel()) << what;
  int64_t bad = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    uint64_t want = b.type.dtype == Dtype::kBf16 && f.type.dtype == Dtype::kFp32
                        ? f32_to_bf16(f.as<float>()[i])
                        : bits(f, i);
    if (bits(b, i) != want && bad++ == 0)
      ADD_FAILURE() << what << ": element " << i << " is not the rounded fp32 value";
  }
  EXPECT_EQ(bad, 0) << what;
}

void expect_bitwise(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  ASSERT_EQ(a.type.dtype, b.type.dtype) << what;
  EXPECT_EQ(std::memcmp(a.data, b.data, a.bytes()), 0) << what << " differs bitwise";
}

void expect_written(const Tensor& t, const std::string& what) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    bool ok = is_float(t.type.dtype)       ? !std::isnan(load(t, i))
              : t.type.dtype == Dtype::kU8 ? t.as<uint8_t>()[i] <= 1
                                           : t.as<int64_t>()[i] >= 0;
    if (!ok) {
      ADD_FAILURE() << what << ": element " << i << " was never written (poison)";
      return;
    }
  }
}

double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

double max_diff(const Vec& a, const Vec& b) {  // infinite when either holds a NaN
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::abs(a[i] - b[i]);
    m = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(m, d);
  }
  return m;
}

// ---- communicators
// -------------------------------------------------------------------------------

// tp = 1: every collective is the identity.
class IdentityComm final : public Communicator {
 public:
  int64_t tp_rank() const override { return 0; }
  int64_t tp_size() const override { return 1; }
  void all_gather(const Tensor& in, const Tensor& out) override { copy(in, out); }
  void reduce_scatter(const Tensor& in, const Tensor& out) override { copy(in, out); }
  void all_reduce(const Tensor&) override { ++calls; }
  void all_reduce_max(const Tensor&) override { ++calls; }
  void send(const Tensor&, int64_t, int64_t) override { throw std::logic_error("no pipeline"); }
  void recv(const Tensor&, int64_t, int64_t) override { throw std::logic_error("no pipeline"); }
  void all_reduce_with(const Tensor&, int64_t) override { throw std::logic_error("no pipeline"); }
  int calls = 0;

 private:
  void copy(const Tensor& in, const Tensor& out) {
    ++calls;
    if (in.bytes() != out.bytes() || in.type.dtype != out.type.dtype)
      throw std::logic_error("identity collective: sizes differ");
    std::memcpy(out.data, in.data, in.bytes());
  }
};

// tp ranks as threads: publish a pointer, barrier, read the peers; sums in rank order in fp32.
class ThreadComm final : public Communicator {
 public:
  struct Group {
    explicit Group(int64_t n) : n(n), sync(n), slots(n) {}
    int64_t n;
    std::barrier<> sync;
    std::vector<const void*> slots;
  };
  ThreadComm(Group& g, int64_t r) : g_(g), r_(r) {}
  int64_t tp_rank() const override { return r_; }
  int64_t tp_size() const override { return g_.n; }
  void all_gather(const Tensor& in, const Tensor& out) override {
    publish(in.data);
    for (int64_t q = 0; q < g_.n; ++q)
      std::memcpy(out.as<char>() + q * in.bytes(), g_.slots[q], in.bytes());
    g_.sync.arrive_and_wait();
  }
  void reduce_scatter(const Tensor& in, const Tensor& out) override {
    publish(in.data);
    for (int64_t i = 0, n = out.numel(); i < n; ++i) store(out, i, sum(in.type, r_ * n + i));
    g_.sync.arrive_and_wait();
  }
  void all_reduce(const Tensor& t) override {
    publish(t.data);
    std::vector<float> s(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) s[i] = sum(t.type, i);
    g_.sync.arrive_and_wait();
    for (int64_t i = 0; i < t.numel(); ++i) store(t, i, s[i]);
    g_.sync.arrive_and_wait();
  }
  void all_reduce_max(const Tensor& t) override {
    publish(t.data);
    std::vector<float> m(t.numel(), -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < t.numel(); ++i)
      for (int64_t q = 0; q < g_.n; ++q)
        m[i] = std::max(m[i], load(Tensor{const_cast<void*>(g_.slots[q]), t.type}, i));
    g_.sync.arrive_and_wait();
    for (int64_t i = 0; i < t.numel(); ++i) store(t, i, m[i]);
    g_.sync.arrive_and_wait();
  }
  void send(const Tensor&, int64_t, int64_t) override { throw std::logic_error("no pipeline"); }
  void recv(const Tensor&, int64_t, int64_t) override { throw std::logic_error("no pipeline"); }
  void all_reduce_with(const Tensor&, int64_t) override { throw std::logic_error("no pipeline"); }

 private:
  void publish(const void* p) {
    g_.slots[r_] = p;
    g_.sync.arrive_and_wait();
  }
  float sum(const TensorType& type, int64_t i) const {
    float s = 0;
    for (int64_t q = 0; q < g_.n; ++q) s += load(Tensor{const_cast<void*>(g_.slots[q]), type}, i);
    return s;
  }
  Group& g_;
  int64_t r_;
};

template <typename Fn>
void on_ranks(int64_t n, Fn fn) {
  ThreadComm::Group group(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ThreadComm comm(group, r);
      try {
        fn(r, comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// ---- cases and the executor of one op instance --------------------------------------------------

ModelSpec test_model() {
  ModelSpec m;
  m.name = "tiny";
  m.hidden = H, m.ffn = F, m.layers = 2, m.heads = HQ, m.kv_heads = HKV, m.head_dim = D;
  m.vocab = V, m.max_positions = 8, m.dropout = kDropout;
  m.moe = MoeSpec{E, K, F, 0, false};
  return m;
}

TrainSpec test_setup() {
  TrainSpec t;
  t.micro_batch = B, t.seq_len = S;
  return t;
}

struct Case {
  std::string label;
  OpKind kind;
  OpAttrs attrs;
  std::vector<Val> inputs, weights;
  std::string bwd_collective;
};

std::vector<TensorType> types_of(const std::vector<Val>& vs) {
  std::vector<TensorType> t;
  for (const Val& v : vs) t.push_back(v.type);
  return t;
}

// One backend variant plus the context of one op instance; tensors it makes live as long as it.
struct Exec {
  struct Call {
    Arena arena;
    std::vector<Tensor> outs, grad_inputs;
  };

  Exec(const Case& c, bool fp32)
      : c(c), fp32(fp32), be(fp32 ? make_cpu_backend_fp32_activations() : make_cpu_backend()) {
    op.kind = c.kind, op.name = "attn." + c.label, op.attrs = c.attrs,
    op.bwd_collective = c.bwd_collective;
    auto in = types_of(c.inputs);
    op.weights = op_info(c.kind).weights(c.attrs, in);
  }
  TensorType mode(TensorType t) const {
    if (fp32 && t.dtype == Dtype::kBf16) t.dtype = Dtype::kFp32;
    return t;
  }
  Tensor tensor(const Val& v) {
    Tensor t = mem.make(mode(v.type));
    fill(t, v.v);
    return t;
  }
  std::vector<Tensor> tensors(const std::vector<Val>& vs) {
    std::vector<Tensor> ts;
    for (const Val& v : vs) ts.push_back(tensor(v));
    return ts;
  }
  std::vector<Tensor> zero_weight_grads(Dtype dtype = Dtype::kFp32) {
    std::vector<Tensor> g;
    for (const WeightShape& w : op.weights) {
      g.push_back(mem.make({w.shape, dtype}));
      fill(g.back(), Vec(w.elements(), 0.0));
    }
    return g;
  }
  OpContext context(Arena& a) {
    OpContext ctx;
    ctx.op = &op, ctx.model = &model, ctx.setup = &setup, ctx.comm = comm;
    ctx.tp_rank = tp_rank, ctx.layer = layer, ctx.mb = mb, ctx.seed = seed;
    ctx.token_offset = token_offset, ctx.loss_scale = loss_scale;
    ctx.alloc = [&a](const TensorType& t, AllocRole r) { return a.alloc(t, r); };
    return ctx;
  }
  std::unique_ptr<Call> forward(std::span<const Tensor> in, std::span<const Tensor> w) {
    auto call = std::make_unique<Call>();
    call->outs = be->forward(context(call->arena), in, w);
    return call;
  }
  // Passes only what the op table says the backward reads; grad_inputs: present entries accumulate.
  std::unique_ptr<Call> backward(std::span<const Tensor> in, std::span<const Tensor> outs,
                                 std::span<const Tensor> grad_outs, std::vector<Tensor> grad_inputs,
                                 std::span<const Tensor> w, std::span<const Tensor> wg) {
    const OpInfo& info = op_info(c.kind);
    auto call = std::make_unique<Call>();
    std::vector<Tensor> bi(info.num_inputs), bo(info.num_outputs), bg(info.num_outputs);
    for (int k = 0; k < info.num_inputs; ++k)
      if (bit(info.bwd_reads_inputs, k)) bi[k] = in[k];
    for (int j = 0; j < info.num_outputs; ++j) {
      if (bit(info.bwd_reads_outputs, j)) bo[j] = outs[j];
      if (bit(info.grad_outputs, j)) bg[j] = grad_outs[j];
    }
    call->grad_inputs = std::move(grad_inputs);
    call->grad_inputs.resize(info.num_inputs);
    BackwardArgs args;
    args.inputs = bi, args.outputs = bo, args.grad_outputs = bg,
    args.grad_inputs = call->grad_inputs;
    args.weights = w, args.weight_grads = wg;
    be->backward(context(call->arena), args);
    return call;
  }

  const Case& c;
  bool fp32;
  std::unique_ptr<Backend> be;
  GraphOp op;
  ModelSpec model = test_model();
  TrainSpec setup = test_setup();
  IdentityComm identity;
  Communicator* comm = &identity;
  int64_t tp_rank = 0, token_offset = 0;
  int layer = 3, mb = 1;
  uint64_t seed = 42;
  float loss_scale = 0.37f;
  Arena mem;
};

// Routing indices: per token K distinct experts out of {0, 1, 2, 4}; expert 3 gets no token.
Val routing_indices(Rng& rng, int64_t tokens) {
  Val v = val({tokens, K}, Dtype::kI64, Vec{});
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int64_t> e = {0, 1, 2, 4};
    std::shuffle(e.begin(), e.end(), rng.engine());
    for (int64_t j = 0; j < K; ++j) v.v.push_back(static_cast<double>(e[j]));
  }
  return v;
}

Val integers(Rng& rng, std::vector<int64_t> shape, int64_t hi) {
  Val v{{std::move(shape), Dtype::kI64}, {}};
  for (int64_t i = 0; i < v.type.elements(); ++i)
    v.v.push_back(static_cast<double>(rng.integer(0, hi - 1)));
  return v;
}

std::vector<Case> all_cases() {
  Rng rng(2024);
  std::vector<Case> cs;
  auto act = [&](std::vector<int64_t> shape, double lo = -1, double hi = 1) {
    return rng.floats({std::move(shape), Dtype::kBf16}, lo, hi);
  };
  auto add = [&](std::string label, OpKind kind, OpAttrs a, std::vector<Val> in, double wlo = -0.5,
                 double whi = 0.5, std::string bwd = "") {
    Case c{std::move(label), kind, a, std::move(in), {}, std::move(bwd)};
    for (const WeightShape& w : op_info(kind).weights(a, types_of(c.inputs)))
      c.weights.push_back(rng.floats({w.shape, Dtype::kBf16}, wlo, whi));
    cs.push_back(std::move(c));
  };
  const OpAttrs core = attention_attrs();
  OpAttrs moe{.features = F, .group = 1, .experts = E, .top_k = K};
  add("embedding", OpKind::kEmbedding, {.features = H, .rows = V}, {integers(rng, {T}, V)});
  // Megatron's: the table's gradient whole in bf16 (a workspace), then added into the buffer.
  add("embedding_dense_wgrad", OpKind::kEmbedding, {.features = H, .rows = V, .dense_wgrad = true},
      {integers(rng, {T}, V)});
  add("pos_embedding", OpKind::kPosEmbedding, {.features = H, .rows = 8}, {act({T, H})});
  add("rmsnorm", OpKind::kRmsNorm, {}, {act({T, H})}, 0.5, 1.5);
  add("layernorm", OpKind::kLayerNorm, {}, {act({T, H})}, 0.5, 1.5);
  add("rmsnorm_stats", OpKind::kRmsNormStats, {}, {act({T, H})}, 0.5, 1.5);
  add("layernorm_stats", OpKind::kLayerNormStats, {}, {act({T, H})}, 0.5, 1.5);
  add("rmsnorm_hf", OpKind::kRmsNormHf, {}, {act({T, H})}, 0.5, 1.5);
  add("all_gather", OpKind::kAllGather, {.group = 1}, {act({T, H})});
  add("all_gather_fp32", OpKind::kAllGather, {.group = 1}, {rng.floats({{T, K}, Dtype::kFp32})});
  add("reduce_scatter", OpKind::kReduceScatter, {.group = 1}, {act({T, H})});
  add("all_reduce", OpKind::kAllReduce, {.group = 1}, {act({T, H})});
  // Multi-token prediction's concatenation, and its TP gather and scatter at one rank (tp 2
  // below, CpuTensorParallel.MtpGatherAndScatter).
  add("concat", OpKind::kConcat, {.features = H}, {act({T, H}), act({T, F})});
  add("gather_features", OpKind::kGatherFeatures, {.group = 1}, {act({T, H})});
  add("scatter_rows", OpKind::kScatterRows, {.group = 1}, {act({T, H})});
  add("column_linear", OpKind::kColumnLinear, {.features = F, .bias = true}, {act({T, H})});
  add("column_linear_all_reduce", OpKind::kColumnLinear, {.features = F}, {act({T, H})}, -0.5, 0.5,
      "all_reduce");
  add("row_linear", OpKind::kRowLinear, {.features = H, .bias = true}, {act({T, F})});
  // Megatron without gradient-accumulation fusion: the weight gradient whole in bf16 (a
  // workspace), then added into the buffer; the bias gradient straight into its buffer.
  add("column_linear_dense_wgrad", OpKind::kColumnLinear,
      {.features = F, .bias = true, .dense_wgrad = true}, {act({T, H})});
  add("row_linear_dense_wgrad", OpKind::kRowLinear, {.features = H, .dense_wgrad = true},
      {act({T, F})});
  add("rope", OpKind::kRope, {}, {act({T, QKV})});
  add("qk_norm", OpKind::kQkNorm, core, {act({T, QKV})}, 0.5, 1.5);
  add("qk_norm_hf", OpKind::kQkNormHf, core, {act({T, QKV})}, 0.5, 1.5);
  add("flash_attention", OpKind::kFlashAttention, core, {act({T, QKV})});
  OpAttrs gqa2{.batch = B,
               .seq = S,
               .heads = 4,
               .kv_heads = 2,
               .head_dim = 4};  // q heads 0,1 -> kv 0; 2,3 -> kv 1
  add("flash_attention_gqa2", OpKind::kFlashAttention, gqa2, {act({T, (4 + 2 * 2) * 4})});
  // Context parallelism with one CP rank (the multi-rank exchange runs in the executor tests):
  // the K/V columns taken out, and attention of the queries against a separate K/V input.
  OpAttrs cp1 = gqa2;
  cp1.group = 1;
  add("cp_gather_kv_gqa2", OpKind::kCpGatherKv, cp1, {act({T, (4 + 2 * 2) * 4})});
  add("flash_attention_cp_gqa2", OpKind::kFlashAttentionCp, cp1,
      {act({T, (4 + 2 * 2) * 4}), act({T, 2 * 2 * 4})});
  add("attn_scores_gqa2", OpKind::kAttnScores, gqa2, {act({T, (4 + 2 * 2) * 4})});
  add("attn_context_gqa2", OpKind::kAttnContext, gqa2,
      {act({B, 4, S, S}, 0, 1), act({T, (4 + 2 * 2) * 4})});
  // MLA's geometry: 2 heads of q/k 6 (2 content + 4 RoPE) and v 3, every head its own k and v.
  OpAttrs mla{.batch = B, .seq = S, .heads = 2, .kv_heads = 2, .head_dim = 6, .v_head_dim = 3,
              .rope_dim = 4};
  add("linear", OpKind::kLinear, {.features = F}, {act({T, H})});
  add("mla_rope", OpKind::kMlaRope, mla, {act({T, 2 * 6}), act({T, 2 * (2 + 3)}), act({T, 4})});
  add("mla_rope_all_reduce", OpKind::kMlaRope, mla,
      {act({T, 2 * 6}), act({T, 2 * (2 + 3)}), act({T, 4})}, -0.5, 0.5, "all_reduce");
  add("flash_attention_mla", OpKind::kFlashAttention, mla, {act({T, 4 * 6 + 2 * 3})});
  add("attn_scores_mla", OpKind::kAttnScores, mla, {act({T, 4 * 6 + 2 * 3})});
  add("attn_context_mla", OpKind::kAttnContext, mla,
      {act({B, 2, S, S}, 0, 1), act({T, 4 * 6 + 2 * 3})});
  add("attn_scores", OpKind::kAttnScores, core, {act({T, QKV})});
  add("softmax", OpKind::kSoftmax, core, {act({B, HQ, S, S}, -2, 2)});
  add("softmax_fp32", OpKind::kSoftmaxFp32, core, {act({B, HQ, S, S}, -2, 2)});
  add("repeat_kv_gqa2", OpKind::kRepeatKv, gqa2, {act({T, (4 + 2 * 2) * 4})});
  add("attn_context", OpKind::kAttnContext, core, {act({B, HQ, S, S}, 0, 1), act({T, QKV})});
  // The torchtitan profile's: RoPE of separate q and k over adjacent feature pairs, SDPA on
  // separate q, k and v (GQA 3:1 and 2:1), silu and the product as their own ops.
  add("rope_qk", OpKind::kRopeQk, {.head_dim = D}, {act({T, HQ * D}), act({T, HKV * D})});
  add("sdpa", OpKind::kSdpa, core, {act({T, HQ * D}), act({T, HKV * D}), act({T, HKV * D})});
  add("sdpa_gqa2", OpKind::kSdpa, gqa2, {act({T, 4 * 4}), act({T, 2 * 4}), act({T, 2 * 4})});
  add("silu", OpKind::kSilu, {}, {act({T, F}, -3, 3)});
  // torchtitan's qwen3: nn.RMSNorm(head_dim) on q's heads, and its rotate-half RoPE of q and k.
  add("head_rmsnorm", OpKind::kHeadRmsNorm, {.heads = HQ, .head_dim = D}, {act({T, HQ * D})}, 0.5,
      1.5);
  add("rope_half_qk", OpKind::kRopeHalfQk, {.head_dim = D}, {act({T, HQ * D}), act({T, HKV * D})});
  add("mul", OpKind::kMul, {}, {act({T, F}, -2, 2), act({T, F}, -2, 2)});
  add("dropout", OpKind::kDropout, {}, {act({T, H})});
  add("dropout_probs", OpKind::kDropout, core, {act({B, HQ, S, S}, 0, 1)});
  add("swiglu", OpKind::kSwiGlu, {}, {act({T, 2 * F}, -2, 2)});
  add("glu_act", OpKind::kGluAct, {}, {act({T, 2 * F}, -2, 2)});
  add("glu_mul", OpKind::kGluMul, {}, {act({T, F}, -1, 1), act({T, 2 * F}, -2, 2)});
  add("gelu", OpKind::kGelu, {}, {act({T, F}, -3, 3)});
  add("add", OpKind::kAdd, {}, {act({T, H}), act({T, H})});
  add("router", OpKind::kRouter, {.features = E}, {act({T, H})});
  {  // distinct logits, gaps >= 0.25 (far beyond the finite-difference steps)
    Val l = val({T, E}, Dtype::kFp32, Vec{});
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int> p(E);
      std::iota(p.begin(), p.end(), 0);
      std::shuffle(p.begin(), p.end(), rng.engine());
      for (int64_t e = 0; e < E; ++e) l.v.push_back(bf(0.3 * p[e] - 0.6 + rng.uniform(0, 0.05)));
    }
    add("topk", OpKind::kTopK, {.top_k = K}, {l});
  }
  // DeepSeek's and Qwen2-MoE's routing: the scores (sigmoid, softmax over all), then the top-k
  // of them, with groups, the expert bias's scratch and a scaling, or unnormalised.
  add("route_scores_sigmoid", OpKind::kRouteScores, {.router = {.sigmoid = true}},
      {rng.floats({{T, E}, Dtype::kFp32}, -3, 3)});
  add("route_scores_softmax", OpKind::kRouteScores, {.router = {.normalize = false}},
      {rng.floats({{T, E}, Dtype::kFp32}, -3, 3)});
  {  // distinct scores in (0, 1), gaps >= 0.1 (beyond the finite-difference steps); 8 experts
    const int64_t n = 8;
    Val s = val({T, n}, Dtype::kFp32, Vec{});
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int> p(n);
      std::iota(p.begin(), p.end(), 0);
      std::shuffle(p.begin(), p.end(), rng.engine());
      for (int64_t e = 0; e < n; ++e) s.v.push_back(0.1 * p[e] + 0.1 + rng.uniform(0, 0.03));
    }
    add("route_topk_groups_bias_scaled", OpKind::kRouteTopK,
        {.top_k = K, .router = {.sigmoid = true, .groups = 4, .topk_groups = 2, .scaling = 2.5},
         .bias = true},
        {s});
    add("route_topk_unnormalized", OpKind::kRouteTopK,
        {.top_k = K + 1, .router = {.normalize = false}}, {s});
  }
  Val idx = routing_indices(rng, T);
  Val probs = rng.floats({{T, K}, Dtype::kFp32}, 0.1, 0.9);
  add("moe_dispatch", OpKind::kMoeDispatch, moe, {act({T, H}), idx});
  add("expert_column", OpKind::kExpertColumn, moe, {act({T * K, H}), idx});
  OpAttrs down = moe;
  down.features = H;
  add("expert_row", OpKind::kExpertRow, down, {act({T * K, F}), idx});
  add("moe_combine", OpKind::kMoeCombine, down, {act({T * K, H}), probs, idx});
  // With a capacity of 5 slots per expert: 30 choices over experts {0, 1, 2, 4} overflow (about
  // 7.5 each), so choices are dropped; 25 rows, expert 3's and the unfilled slots padding.
  constexpr int64_t C = 5;
  OpAttrs capped = moe;
  capped.capacity = C;
  add("moe_dispatch_capacity", OpKind::kMoeDispatch, capped, {act({T, H}), idx});
  add("expert_column_capacity", OpKind::kExpertColumn, capped, {act({E * C, H}), idx});
  capped.features = H;
  add("expert_row_capacity", OpKind::kExpertRow, capped, {act({E * C, F}), idx});
  add("moe_combine_capacity", OpKind::kMoeCombine, capped, {act({E * C, H}), probs, idx});
  add("shared_gate", OpKind::kSharedGate, {}, {act({T, H}), act({T, H})});
  add("cross_entropy", OpKind::kCrossEntropy, {}, {act({T, V}, -2, 2), integers(rng, {T}, V)});
  add("cross_entropy_fp32_copy", OpKind::kCrossEntropy, {.fp32_copy = true},
      {act({T, V}, -2, 2), integers(rng, {T}, V)});
  // Megatron's native fused loss: the gradient formed in an fp32 workspace, then cast.
  add("cross_entropy_fp32_grad", OpKind::kCrossEntropy, {.fp32_grad = true},
      {act({T, V}, -2, 2), integers(rng, {T}, V)});
  add("cross_entropy_te", OpKind::kCrossEntropyTe, {}, {act({T, V}, -2, 2), integers(rng, {T}, V)});
  add("cast_fp32", OpKind::kCastFp32, {}, {act({T, V}, -2, 2)});
  add("log_softmax_loss", OpKind::kLogSoftmaxLoss, {},
      {rng.floats({{T, V}, Dtype::kFp32}, -2, 2), integers(rng, {T}, V), act({T, V}, -2, 2)});
  return cs;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = all_cases();
  return c;
}

// ---- naive double-precision references of the forward outputs
// ------------------------------------

// The rows of the dispatched tensor: each row's expert and its (token, choice), t = -1 for a
// padding slot. Dropless: experts ascending, then (t, j) ascending. Capacity C: expert e's C slots
// at rows e C .., filled by its choices in token order, the rest dropped.
struct DispatchRow {
  int64_t expert, t = -1, j = -1;
};
std::vector<DispatchRow> dispatch_rows(const Val& idx, int64_t capacity) {
  std::vector<DispatchRow> rows;
  const int64_t tokens = idx.type.shape[0];
  if (capacity == 0) {
    for (int64_t e = 0; e < E; ++e)
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t j = 0; j < K; ++j)
          if (idx.v[t * K + j] == e) rows.push_back({e, t, j});
    return rows;
  }
  for (int64_t r = 0; r < E * capacity; ++r) rows.push_back({r / capacity});
  std::vector<int64_t> used(E, 0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < K; ++j) {
      auto e = static_cast<int64_t>(idx.v[t * K + j]);
      if (used[e] < capacity) rows[e * capacity + used[e]++] = {e, t, j};
    }
  return rows;
}

Vec linear_ref(const Vec& x, int64_t rows, int64_t in, const Vec& w, int64_t out, const Vec* bias) {
  Vec y(rows * out);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t f = 0; f < out; ++f) {
      double s = bias ? (*bias)[f] : 0.0;
      for (int64_t c = 0; c < in; ++c) s += x[t * in + c] * w[f * in + c];
      y[t * out + f] = s;
    }
  return y;
}

double sigmoid(double z) {
  return 1.0 / (1.0 + std::exp(-z));
}

std::vector<Vec> reference(const Case& c, Exec& ex) {
  const auto& in = c.inputs;
  const auto& w = c.weights;
  auto x = [&](int k) -> const Vec& { return in[k].v; };
  // Attention geometry from the attrs (a case may use other heads than the model's).
  // The values' head dim dv: MLA's v_head_dim, else head_dim.
  int64_t hq = c.attrs.heads, hkv = c.attrs.kv_heads, hd = c.attrs.head_dim,
          dv = c.attrs.v_head_dim > 0 ? c.attrs.v_head_dim : hd, wq = (hq + hkv) * hd + hkv * dv;
  auto q = [&](const Vec& a, int64_t t, int64_t h, int64_t d) { return a[t * wq + h * hd + d]; };
  auto k_ = [&](const Vec& a, int64_t t, int64_t h, int64_t d) {
    return a[t * wq + (hq + h / (hq / hkv)) * hd + d];
  };
  auto v_ = [&](const Vec& a, int64_t t, int64_t h, int64_t d) {
    return a[t * wq + (hq + hkv) * hd + h / (hq / hkv) * dv + d];
  };
  double scale = hd > 0 ? 1.0 / std::sqrt(double(hd)) : 0.0;
  switch (c.kind) {
    case OpKind::kEmbedding: {
      Vec o(T * H);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < H; ++d) o[t * H + d] = w[0].v[int64_t(x(0)[t]) * H + d];
      return {o};
    }
    case OpKind::kPosEmbedding: {
      Vec o = x(0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < H; ++d) o[t * H + d] += w[0].v[(t / B) * H + d];
      return {o};
    }
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm:
    case OpKind::kRmsNormStats:
    case OpKind::kLayerNormStats:
    case OpKind::kRmsNormHf: {
      Vec o(T * H), mean(T), rstd(T);
      bool ln = c.kind == OpKind::kLayerNorm || c.kind == OpKind::kLayerNormStats;
      for (int64_t t = 0; t < T; ++t) {
        double mu = 0, var = 0;
        for (int64_t d = 0; d < H; ++d) mu += ln ? x(0)[t * H + d] / H : 0.0;
        for (int64_t d = 0; d < H; ++d) var += (x(0)[t * H + d] - mu) * (x(0)[t * H + d] - mu) / H;
        mean[t] = mu, rstd[t] = 1.0 / std::sqrt(var + 1e-5);
        for (int64_t d = 0; d < H; ++d)
          o[t * H + d] = (x(0)[t * H + d] - mu) * rstd[t] * w[0].v[d] + (ln ? w[1].v[d] : 0.0);
      }
      if (c.kind == OpKind::kRmsNormStats) return {o, rstd};
      if (c.kind == OpKind::kRmsNormHf) {  // y, fp32(x), 1/rms, the normalized x
        Vec n(T * H);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < H; ++d) n[t * H + d] = x(0)[t * H + d] * rstd[t];
        return {o, x(0), rstd, n};
      }
      if (c.kind == OpKind::kLayerNormStats) return {o, mean, rstd};
      return {o};
    }
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllReduce:
    case OpKind::kGatherFeatures:
    case OpKind::kScatterRows:
      return {x(0)};
    case OpKind::kConcat: {
      const int64_t a = c.attrs.features, b = c.inputs[1].type.shape[1];
      Vec o(T * (a + b));
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < a; ++j) o[t * (a + b) + j] = x(0)[t * a + j];
        for (int64_t j = 0; j < b; ++j) o[t * (a + b) + a + j] = x(1)[t * b + j];
      }
      return {o};
    }
    case OpKind::kCpGatherKv: {
      int64_t w2 = 2 * hkv * hd;
      Vec o(T * w2);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < w2; ++k) o[t * w2 + k] = x(0)[t * wq + hq * hd + k];
      return {o};
    }
    case OpKind::kFlashAttentionCp: {  // flash attention of [q of input 0 | k, v of input 1]
      Case f = c;
      f.kind = OpKind::kFlashAttention;
      Vec comb(T * wq);
      int64_t w2 = 2 * hkv * hd;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < wq; ++k)
          comb[t * wq + k] = k < hq * hd ? x(0)[t * wq + k] : x(1)[t * w2 + k - hq * hd];
      f.inputs = {Val{in[0].type, comb}};
      return reference(f, ex);
    }
    case OpKind::kColumnLinear:
    case OpKind::kRowLinear:
    case OpKind::kLinear:
    case OpKind::kRouter: {
      int64_t n = in[0].type.shape[1], out = c.attrs.features;
      return {linear_ref(x(0), T, n, w[0].v, out, w.size() > 1 ? &w[1].v : nullptr)};
    }
    case OpKind::kQkNorm:
    case OpKind::kQkNormHf: {  // each q and k head normalised over head_dim; v as it is
      Vec o = x(0), rstd(T * (hq + hkv));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < hq + hkv; ++h) {
          double ss = 0;
          for (int64_t d = 0; d < hd; ++d) {
            double v = x(0)[t * wq + h * hd + d];
            ss += v * v;
          }
          double r = 1.0 / std::sqrt(ss / hd + 1e-5);
          rstd[t * (hq + hkv) + h] = r;
          for (int64_t d = 0; d < hd; ++d)
            o[t * wq + h * hd + d] = x(0)[t * wq + h * hd + d] * r * w[h < hq ? 0 : 1].v[d];
        }
      if (c.kind == OpKind::kQkNorm) return {o, rstd};
      // PyTorch ops: the q and k columns in fp32, 1/rms per head, the normalized columns.
      const int64_t width = (hq + hkv) * hd;
      Vec a(T * width), n(T * width);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < width; ++i) {
          a[t * width + i] = x(0)[t * wq + i];
          n[t * width + i] = a[t * width + i] * rstd[t * (hq + hkv) + i / hd];
        }
      return {o, a, rstd, n};
    }
    case OpKind::kRope: {
      Vec o = x(0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < HQ + HKV; ++h)
          for (int64_t i = 0; i < D / 2; ++i) {
            double a = double(t / B) / std::pow(10000.0, 2.0 * i / D);
            double re = x(0)[t * QKV + h * D + i], im = x(0)[t * QKV + h * D + i + D / 2];
            o[t * QKV + h * D + i] = re * std::cos(a) - im * std::sin(a);
            o[t * QKV + h * D + i + D / 2] = re * std::sin(a) + im * std::cos(a);
          }
      return {o};
    }
    case OpKind::kFlashAttention:
    case OpKind::kAttnScores:
    case OpKind::kSoftmax:
    case OpKind::kSoftmaxFp32:
    case OpKind::kAttnContext: {
      const Vec& a = c.kind == OpKind::kAttnContext ? x(1) : x(0);
      Vec ctx(T * hq * dv, 0.0), lse(B * hq * S), sc(B * hq * S * S, 0.0), pr(B * hq * S * S, 0.0);
      for (int64_t bi = 0; bi < B; ++bi)
        for (int64_t h = 0; h < hq; ++h)
          for (int64_t i = 0; i < S; ++i) {
            int64_t row = (bi * hq + h) * S + i;
            if (c.kind == OpKind::kSoftmax || c.kind == OpKind::kSoftmaxFp32) {
              for (int64_t j = 0; j <= i; ++j) sc[row * S + j] = x(0)[row * S + j];
            } else {
              for (int64_t j = 0; j <= i; ++j)
                for (int64_t d = 0; d < hd; ++d)
                  sc[row * S + j] += q(a, i * B + bi, h, d) * k_(a, j * B + bi, h, d);
            }
            double m = -1e300, z = 0;
            for (int64_t j = 0; j <= i; ++j) m = std::max(m, scale * sc[row * S + j]);
            for (int64_t j = 0; j <= i; ++j) z += std::exp(scale * sc[row * S + j] - m);
            lse[row] = m + std::log(z);
            for (int64_t j = 0; j <= i; ++j) {
              pr[row * S + j] = std::exp(scale * sc[row * S + j] - m) / z;
              if (c.kind != OpKind::kFlashAttention && c.kind != OpKind::kAttnContext) continue;
              double p = c.kind == OpKind::kAttnContext ? x(0)[row * S + j] : pr[row * S + j];
              for (int64_t d = 0; d < dv; ++d)
                ctx[(i * B + bi) * hq * dv + h * dv + d] += p * v_(a, j * B + bi, h, d);
            }
          }
      if (c.kind == OpKind::kFlashAttention) return {ctx, lse};
      if (c.kind == OpKind::kAttnScores) return {sc};
      if (c.kind == OpKind::kSoftmax) return {pr};
      if (c.kind == OpKind::kSoftmaxFp32) return {pr, pr};
      return {ctx};
    }
    case OpKind::kRepeatKv: {
      Vec o(T * 3 * hq * hd);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < hq; ++h)
          for (int64_t d = 0; d < hd; ++d) {
            o[t * 3 * hq * hd + h * hd + d] = q(x(0), t, h, d);
            o[t * 3 * hq * hd + (hq + h) * hd + d] = k_(x(0), t, h, d);
            o[t * 3 * hq * hd + (2 * hq + h) * hd + d] = v_(x(0), t, h, d);
          }
      return {o};
    }
    case OpKind::kDropout: {  // at tp = 1 without SP the global index is the flat index
      Arena a;
      OpContext ctx = ex.context(a);
      uint64_t stream =
          dropout_stream(ctx) ^ (static_cast<uint64_t>(ctx.mb) * 0x9E3779B97F4A7C15ull);
      Vec o(x(0).size()), mask(x(0).size());
      for (size_t i = 0; i < o.size(); ++i) {
        mask[i] = counter_uniform(ctx.seed, stream, i) >= static_cast<float>(kDropout);
        o[i] = mask[i] ? x(0)[i] / (1.0 - kDropout) : 0.0;
      }
      return {o, mask};
    }
    case OpKind::kSwiGlu: {
      Vec o(T * F);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t f = 0; f < F; ++f) {
          double g = x(0)[t * 2 * F + f];
          o[t * F + f] = g * sigmoid(g) * x(0)[t * 2 * F + F + f];
        }
      return {o};
    }
    case OpKind::kGluAct: {
      Vec o(T * F);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t f = 0; f < F; ++f) {
          double g = x(0)[t * 2 * F + f];
          o[t * F + f] = g * sigmoid(g);
        }
      return {o};
    }
    case OpKind::kGluMul: {
      Vec o(T * F);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t f = 0; f < F; ++f) o[t * F + f] = x(0)[t * F + f] * x(1)[t * 2 * F + F + f];
      return {o};
    }
    case OpKind::kRopeQk: {  // pairs (2i, 2i + 1) of each head rotated by pos x 10000^(-2i/D)
      std::vector<Vec> o{x(0), x(1)};
      for (int k = 0; k < 2; ++k) {
        const int64_t w = in[k].type.shape[1];
        for (int64_t t = 0; t < T; ++t)
          for (int64_t c = 0; c < w; c += 2) {
            double a = double(t / B) / std::pow(10000.0, 2.0 * ((c % hd) / 2) / hd);
            double re = x(k)[t * w + c], im = x(k)[t * w + c + 1];
            o[k][t * w + c] = re * std::cos(a) - im * std::sin(a);
            o[k][t * w + c + 1] = re * std::sin(a) + im * std::cos(a);
          }
      }
      return o;
    }
    case OpKind::kSdpa: {  // flash attention of [q | k | v] side by side
      Case f = c;
      f.kind = OpKind::kFlashAttention;
      const int64_t a = hq * hd, b = hkv * hd, v = hkv * dv;
      Vec comb(T * wq);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < wq; ++j)
          comb[t * wq + j] = j < a       ? x(0)[t * a + j]
                             : j < a + b ? x(1)[t * b + j - a]
                                         : x(2)[t * v + j - a - b];
      f.inputs = {Val{{{T, wq}, Dtype::kBf16}, comb}};
      return reference(f, ex);
    }
    case OpKind::kHeadRmsNorm: {  // each head of hd features normalised, one weight for all
      const int64_t w0 = in[0].type.shape[1], heads = w0 / hd;
      Vec o = x(0), rstd(T * heads);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < heads; ++h) {
          double ss = 0;
          for (int64_t d = 0; d < hd; ++d) ss += x(0)[t * w0 + h * hd + d] * x(0)[t * w0 + h * hd + d];
          double r = 1.0 / std::sqrt(ss / hd + 1e-5);
          rstd[t * heads + h] = r;
          for (int64_t d = 0; d < hd; ++d)
            o[t * w0 + h * hd + d] = x(0)[t * w0 + h * hd + d] * r * w[0].v[d];
        }
      return {o, rstd};
    }
    case OpKind::kRopeHalfQk: {  // features i and i + hd / 2 of each head rotated
      std::vector<Vec> o{x(0), x(1)};
      for (int k = 0; k < 2; ++k) {
        const int64_t w0 = in[k].type.shape[1];
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < w0 / hd; ++h)
            for (int64_t i = 0; i < hd / 2; ++i) {
              double a = double(t / B) / std::pow(10000.0, 2.0 * i / hd);
              double re = x(k)[t * w0 + h * hd + i], im = x(k)[t * w0 + h * hd + i + hd / 2];
              o[k][t * w0 + h * hd + i] = re * std::cos(a) - im * std::sin(a);
              o[k][t * w0 + h * hd + i + hd / 2] = re * std::sin(a) + im * std::cos(a);
            }
      }
      return o;
    }
    case OpKind::kSilu: {
      Vec o(x(0).size());
      for (size_t i = 0; i < o.size(); ++i) o[i] = x(0)[i] / (1 + std::exp(-x(0)[i]));
      return {o};
    }
    case OpKind::kMul: {
      Vec o(x(0).size());
      for (size_t i = 0; i < o.size(); ++i) o[i] = x(0)[i] * x(1)[i];
      return {o};
    }
    case OpKind::kGelu: {
      Vec o(x(0).size());
      for (size_t i = 0; i < o.size(); ++i) {
        double v = x(0)[i];
        o[i] =
            0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
      }
      return {o};
    }
    case OpKind::kAdd: {
      Vec o(x(0).size());
      for (size_t i = 0; i < o.size(); ++i) o[i] = x(0)[i] + x(1)[i];
      return {o};
    }
    case OpKind::kTopK: {
      Vec p(T * K), id(T * K);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int64_t> e(E);
        std::iota(e.begin(), e.end(), 0);
        std::stable_sort(e.begin(), e.end(),
                         [&](int64_t a, int64_t b) { return x(0)[t * E + a] > x(0)[t * E + b]; });
        double z = 0;
        for (int64_t j = 0; j < K; ++j) z += std::exp(x(0)[t * E + e[j]]);
        for (int64_t j = 0; j < K; ++j)
          p[t * K + j] = std::exp(x(0)[t * E + e[j]]) / z, id[t * K + j] = double(e[j]);
      }
      return {p, id};
    }
    case OpKind::kRouteScores: {
      int64_t n = in[0].type.shape[1];
      Vec o(T * n);
      for (int64_t t = 0; t < T; ++t) {
        double z = 0;
        for (int64_t e = 0; e < n; ++e) z += std::exp(x(0)[t * n + e]);
        for (int64_t e = 0; e < n; ++e)
          o[t * n + e] = c.attrs.router.sigmoid ? sigmoid(x(0)[t * n + e])
                                                : std::exp(x(0)[t * n + e]) / z;
      }
      return {o};
    }
    case OpKind::kRouteTopK: {  // groups scored by their top k / topk_groups; no bias values
      const RouterSpec& r = c.attrs.router;
      int64_t n = in[0].type.shape[1], k = c.attrs.top_k, per = n / r.groups;
      Vec p(T * k), id(T * k);
      for (int64_t t = 0; t < T; ++t) {
        auto s = [&](int64_t e) { return x(0)[t * n + e]; };
        std::vector<double> group(r.groups);
        for (int64_t g = 0; g < r.groups; ++g) {
          std::vector<double> v;
          for (int64_t e = g * per; e < (g + 1) * per; ++e) v.push_back(s(e));
          std::sort(v.rbegin(), v.rend());
          for (int64_t j = 0; j < k / r.topk_groups; ++j) group[g] += v[j];
        }
        std::vector<int64_t> gs(r.groups), es;
        std::iota(gs.begin(), gs.end(), 0);
        std::stable_sort(gs.begin(), gs.end(), [&](int64_t a, int64_t b) { return group[a] > group[b]; });
        for (int64_t e = 0; e < n; ++e)
          if (std::find(gs.begin(), gs.begin() + r.topk_groups, e / per) != gs.begin() + r.topk_groups)
            es.push_back(e);
        std::stable_sort(es.begin(), es.end(), [&](int64_t a, int64_t b) { return s(a) > s(b); });
        double z = 1e-20;
        for (int64_t j = 0; j < k; ++j) z += s(es[j]);
        for (int64_t j = 0; j < k; ++j)
          p[t * k + j] = (r.normalize ? s(es[j]) / z : s(es[j])) * r.scaling,
                    id[t * k + j] = double(es[j]);
      }
      return {p, id};
    }
    case OpKind::kMoeDispatch:
    case OpKind::kExpertColumn:
    case OpKind::kExpertRow:
    case OpKind::kMoeCombine: {
      const Val& idx = c.kind == OpKind::kMoeCombine ? in[2] : in[1];
      auto rows = dispatch_rows(idx, c.attrs.capacity);
      int64_t n = in[0].type.shape[1];
      if (c.kind == OpKind::kMoeDispatch) {
        Vec o;
        for (auto [e, t, j] : rows)
          for (int64_t d = 0; d < n; ++d) o.push_back(t < 0 ? 0.0 : x(0)[t * n + d]);
        return {o};
      }
      if (c.kind == OpKind::kMoeCombine) {
        Vec o(T * n, 0.0);
        for (size_t r = 0; r < rows.size(); ++r) {
          auto [e, t, j] = rows[r];
          if (t < 0) continue;
          for (int64_t d = 0; d < n; ++d) o[t * n + d] += x(1)[t * K + j] * x(0)[r * n + d];
        }
        return {o};
      }
      int64_t out = c.attrs.features;
      Vec o(rows.size() * out);
      for (size_t r = 0; r < rows.size(); ++r) {
        int64_t e = rows[r].expert;
        for (int64_t f = 0; f < out; ++f) {
          double s = 0;
          for (int64_t d = 0; d < n; ++d) s += x(0)[r * n + d] * w[0].v[(e * out + f) * n + d];
          o[r * out + f] = s;
        }
      }
      return {o};
    }
    case OpKind::kSharedGate: {
      Vec o(T * H);
      for (int64_t t = 0; t < T; ++t) {
        double z = 0;
        for (int64_t d = 0; d < H; ++d) z += x(0)[t * H + d] * w[0].v[d];
        for (int64_t d = 0; d < H; ++d) o[t * H + d] = sigmoid(z) * x(1)[t * H + d];
      }
      return {o};
    }
    case OpKind::kCastFp32:
      return {x(0)};
    case OpKind::kCrossEntropy:
    case OpKind::kLogSoftmaxLoss: {
      int64_t v = in[0].type.shape[1];
      Vec loss(T), sm(T * v);
      for (int64_t t = 0; t < T; ++t) {
        double m = -1e300, z = 0;
        for (int64_t j = 0; j < v; ++j) m = std::max(m, x(0)[t * v + j]);
        for (int64_t j = 0; j < v; ++j) z += std::exp(x(0)[t * v + j] - m);
        loss[t] = std::log(z) + m - x(0)[t * v + int64_t(x(1)[t])];
        for (int64_t j = 0; j < v; ++j) sm[t * v + j] = std::exp(x(0)[t * v + j] - m) / z;
      }
      if (c.kind == OpKind::kLogSoftmaxLoss)
        for (size_t e = 0; e < sm.size(); ++e) sm[e] = std::log(sm[e]);
      return {loss, sm};
    }
    case OpKind::kCrossEntropyTe: {  // the loss and each row's max and log-sum-exp
      int64_t v = in[0].type.shape[1];
      Vec loss(T), stats(2 * T);
      for (int64_t t = 0; t < T; ++t) {
        double m = -1e300, z = 0;
        for (int64_t j = 0; j < v; ++j) m = std::max(m, x(0)[t * v + j]);
        for (int64_t j = 0; j < v; ++j) z += std::exp(x(0)[t * v + j] - m);
        loss[t] = std::log(z) + m - x(0)[t * v + int64_t(x(1)[t])];
        stats[2 * t] = m, stats[2 * t + 1] = std::log(z);
      }
      return {loss, stats};
    }
    case OpKind::kMlaRope: {  // [q | k | v]: q's last r features rotated, k = [content | pe]
      const int64_t r = c.attrs.rope_dim, dn = hd - r, width = hq * (2 * hd + dv);
      Vec o(T * width);
      auto rot = [&](double re, double im, int64_t t, int64_t i, bool second) {
        double a = double(t / B) / std::pow(10000.0, 2.0 * i / r);
        return second ? re * std::sin(a) + im * std::cos(a) : re * std::cos(a) - im * std::sin(a);
      };
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < hq; ++h) {
          const int64_t qc = t * width + h * hd, kc = t * width + hq * hd + h * hd;
          const double* qi = &x(0)[t * hq * hd + h * hd];
          const double* pe = &x(2)[t * r];
          for (int64_t d = 0; d < dn; ++d) {
            o[qc + d] = qi[d];
            o[kc + d] = x(1)[t * hq * (dn + dv) + h * dn + d];
          }
          for (int64_t i = 0; i < r / 2; ++i) {
            o[qc + dn + i] = rot(qi[dn + i], qi[dn + i + r / 2], t, i, false);
            o[qc + dn + i + r / 2] = rot(qi[dn + i], qi[dn + i + r / 2], t, i, true);
            o[kc + dn + i] = rot(pe[i], pe[i + r / 2], t, i, false);
            o[kc + dn + i + r / 2] = rot(pe[i], pe[i + r / 2], t, i, true);
          }
          const int64_t v_in = t * hq * (dn + dv) + hq * dn + h * dv;  // v's column in kv
          for (int64_t d = 0; d < dv; ++d) o[t * width + 2 * hq * hd + h * dv + d] = x(1)[v_in + d];
        }
      return {o};
    }
    case OpKind::kCount:
      break;
  }
  return {};
}

// ---- the per-case checks
// -------------------------------------------------------------------------

class CpuOp : public ::testing::TestWithParam<size_t> {
 protected:
  const Case& c() const { return cases()[GetParam()]; }
};

TEST_P(CpuOp, Reference) {
  const Case& c = this->c();
  Exec ex(c, true);
  auto in = ex.tensors(c.inputs), w = ex.tensors(c.weights);
  auto f = ex.forward(in, w);
  std::vector<Vec> ref = reference(c, ex);
  ASSERT_FALSE(ref.empty());
  for (size_t j = 0; j < ref.size(); ++j) {
    Vec got = read(f->outs.at(j));
    ASSERT_EQ(got.size(), ref[j].size()) << "output " << j;
    EXPECT_LE(max_diff(got, ref[j]), 2e-5 * std::max(1.0, max_abs(ref[j]))) << "output " << j;
  }
}

TEST_P(CpuOp, Gradients) {
  const Case& c = this->c();
  const OpInfo& info = op_info(c.kind);
  Exec ex(c, true);
  auto in = ex.tensors(c.inputs), w = ex.tensors(c.weights);
  auto base = ex.forward(in, w);
  Rng rng(7 + GetParam());
  std::vector<Vec> r(info.num_outputs);
  std::vector<Tensor> go(info.num_outputs);
  for (int j = 0; j < info.num_outputs; ++j)
    if (bit(info.grad_outputs, j)) {
      r[j] = rng.signs(base->outs[j].numel());
      go[j] = ex.tensor({base->outs[j].type, r[j]});
    }
  auto L = [&] {
    auto f = ex.forward(in, w);
    double s = 0;
    if (info.grad_outputs == 0) {  // the loss is the root: L = loss_scale x sum of per-token losses
      for (double v : read(f->outs[0])) s += ex.loss_scale * v;
    }
    for (int j = 0; j < info.num_outputs; ++j)
      if (bit(info.grad_outputs, j)) {
        Vec o = read(f->outs[j]);
        for (size_t i = 0; i < o.size(); ++i) s += r[j][i] * o[i];
      }
    return s;
  };
  auto wg = ex.zero_weight_grads();
  auto g1 = ex.backward(in, base->outs, go, {}, w, wg);
  for (int k = 0; k < info.num_inputs; ++k) {
    if (!bit(info.grad_inputs, k)) {
      EXPECT_FALSE(g1->grad_inputs[k]) << "input " << k << " has no grad bit";
      continue;
    }
    ASSERT_TRUE(g1->grad_inputs[k]) << "input " << k;
    EXPECT_TRUE(same(g1->grad_inputs[k].type, in[k].type)) << str(g1->grad_inputs[k].type);
    expect_written(g1->grad_inputs[k], "grad input");
  }
  auto numeric = [&](const Tensor& t, int64_t i) {
    float x0 = load(t, i);
    auto d = [&](double h) {
      float xp = static_cast<float>(x0 + h), xm = static_cast<float>(x0 - h);
      store(t, i, xp);
      double lp = L();
      store(t, i, xm);
      double lm = L();
      store(t, i, x0);
      return (lp - lm) / (double(xp) - double(xm));
    };
    return (4 * d(5e-3) - d(1e-2)) / 3;
  };
  auto compare = [&](const std::string& what, const Tensor& t, const Vec& analytic) {
    Vec num(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) num[i] = numeric(t, i);
    double scale = max_abs(analytic);
    EXPECT_GT(scale, 0.0) << what << ": an all-zero gradient checks nothing";
    EXPECT_LE(max_diff(num, analytic), 1e-3 * scale + 1e-5)
        << what << " (max |grad| " << scale << ")";
  };
  for (int k = 0; k < info.num_inputs; ++k)
    if (bit(info.grad_inputs, k) && is_float(in[k].type.dtype))
      compare("input " + std::to_string(k), in[k], read(g1->grad_inputs[k]));
  for (size_t m = 0; m < w.size(); ++m) compare("weight " + std::to_string(m), w[m], read(wg[m]));

  // Accumulation: preset gradients end as preset + the same contribution, nothing is allocated.
  std::vector<Tensor> preset(info.num_inputs);
  std::vector<Vec> pv(info.num_inputs);
  for (int k = 0; k < info.num_inputs; ++k)
    if (bit(info.grad_inputs, k)) {
      pv[k] = rng.signs(in[k].numel());
      preset[k] = ex.tensor({in[k].type, pv[k]});
    }
  auto wg2 = ex.zero_weight_grads();
  std::vector<Vec> pw;
  for (const Tensor& t : wg2) {
    pw.push_back(rng.signs(t.numel()));
    fill(t, pw.back());
  }
  auto g2 = ex.backward(in, base->outs, go, preset, w, wg2);
  for (const Arena::Rec& rec : g2->arena.log)
    EXPECT_NE(rec.role, AllocRole::kGradInput) << "allocated a present gradient";
  for (int k = 0; k < info.num_inputs; ++k) {
    if (!bit(info.grad_inputs, k)) continue;
    ASSERT_EQ(g2->grad_inputs[k].data, preset[k].data);
    for (int64_t i = 0; i < in[k].numel(); ++i)
      ASSERT_EQ(load(preset[k], i), static_cast<float>(pv[k][i]) + load(g1->grad_inputs[k], i))
          << "input " << k << " element " << i;
  }
  for (size_t m = 0; m < wg2.size(); ++m)
    for (int64_t i = 0; i < wg2[m].numel(); ++i)
      ASSERT_EQ(load(wg2[m], i), static_cast<float>(pw[m][i]) + load(wg[m], i))
          << "weight " << m << " element " << i;
}

TEST_P(CpuOp, Bf16RoundsOnceAllocatesTheTableAndIsDeterministic) {
  const Case& c = this->c();
  const OpInfo& info = op_info(c.kind);
  auto in_types = types_of(c.inputs);
  Exec hb(c, false), hf(c, true);
  auto in_b = hb.tensors(c.inputs), w_b = hb.tensors(c.weights);
  auto in_f = hf.tensors(c.inputs), w_f = hf.tensors(c.weights);
  auto fb = hb.forward(in_b, w_b), ff = hf.forward(in_f, w_f);

  // Forward allocations: the outputs, then the forward workspaces, exactly as the op table says.
  std::vector<TensorType> want = info.infer(c.attrs, in_types);
  std::vector<TensorType> ws = forward_workspace(info, c.attrs, in_types);
  ASSERT_EQ(fb->outs.size(), want.size() + ws.size());
  ASSERT_EQ(fb->arena.log.size(), want.size() + ws.size());
  for (size_t j = 0; j < fb->outs.size(); ++j) {
    const TensorType& t = j < want.size() ? want[j] : ws[j - want.size()];
    AllocRole role = j < want.size() ? AllocRole::kOutput : AllocRole::kWorkspace;
    EXPECT_TRUE(same(fb->outs[j].type, t))
        << "result " << j << ": " << str(fb->outs[j].type) << " vs " << str(t);
    EXPECT_TRUE(same(fb->arena.log[j].type, t) && fb->arena.log[j].role == role)
        << "allocation " << j;
    expect_written(fb->outs[j], "forward result " + std::to_string(j));
    if (c.kind == OpKind::kQkNormHf && j == 0) {
      // As rmsnorm_hf's: the q and k columns of y round twice, round(w round(x r)); v is x's.
      const OpAttrs& at = c.attrs;
      const int64_t width = (at.heads + at.kv_heads) * at.head_dim,
                    row = (at.heads + 2 * at.kv_heads) * at.head_dim;
      Vec cst = read(fb->outs[3]), y = read(fb->outs[0]), x0 = read(in_b[0]);
      const Vec wq = read(w_b[0]), wk = read(w_b[1]);
      for (size_t e = 0; e < y.size(); ++e) {
        const int64_t t = static_cast<int64_t>(e) / row, i = static_cast<int64_t>(e) % row;
        if (i >= width) {
          ASSERT_EQ(y[e], x0[e]) << "qk_norm_hf v " << e;
          continue;
        }
        const Vec& wv = i / at.head_dim < at.heads ? wq : wk;
        ASSERT_EQ(y[e], bf16_bits_to_f32(f32_to_bf16_bits(
                            static_cast<float>(wv[i % at.head_dim] * cst[t * width + i]))))
            << "qk_norm_hf output " << e;
      }
      continue;
    }
    if (c.kind == OpKind::kRmsNormHf && j == 0) {
      // PyTorch's order rounds twice, as Hugging Face's norm does: y = round(w x round(x r)).
      Vec cst = read(fb->outs[3]), wv = read(w_b[0]), y = read(fb->outs[0]);
      for (size_t e = 0; e < y.size(); ++e)
        ASSERT_EQ(y[e], bf16_bits_to_f32(
                            f32_to_bf16_bits(static_cast<float>(wv[e % wv.size()] * cst[e]))))
            << "rmsnorm_hf output " << e;
      continue;
    }
    expect_rounded(fb->outs[j], ff->outs[j], "forward result " + std::to_string(j));
  }
  auto fb2 = hb.forward(in_b, w_b);
  for (size_t j = 0; j < fb->outs.size(); ++j)
    expect_bitwise(fb->outs[j], fb2->outs[j], "recomputed forward result");

  // Backward from the bf16 forward's outputs, the same values in both variants.
  Rng rng(11 + GetParam());
  std::vector<Tensor> go_b(info.num_outputs), go_f(info.num_outputs), out_f;
  for (int j = 0; j < info.num_outputs; ++j) {
    Val o{fb->outs[j].type, read(fb->outs[j])};
    out_f.push_back(hf.tensor(o));
    if (bit(info.grad_outputs, j)) {
      Val g{fb->outs[j].type, rng.signs(fb->outs[j].numel())};
      go_b[j] = hb.tensor(g), go_f[j] = hf.tensor(g);
    }
  }
  auto wg_b = hb.zero_weight_grads(), wg_f = hf.zero_weight_grads(), wg_b2 = hb.zero_weight_grads();
  auto bb = hb.backward(in_b, fb->outs, go_b, {}, w_b, wg_b);
  auto bf_ = hf.backward(in_f, out_f, go_f, {}, w_f, wg_f);
  auto bb2 = hb.backward(in_b, fb->outs, go_b, {}, w_b, wg_b2);
  std::vector<TensorType> grads, bws = info.bwd_workspace(c.attrs, in_types), got_grads, got_ws;
  for (int k = 0; k < info.num_inputs; ++k)
    if (bit(info.grad_inputs, k)) grads.push_back(in_types[k]);
  for (const Arena::Rec& rec : bb->arena.log) {
    ASSERT_NE(rec.role, AllocRole::kOutput) << "backward allocated an output";
    (rec.role == AllocRole::kGradInput ? got_grads : got_ws).push_back(rec.type);
  }
  ASSERT_EQ(got_grads.size(), grads.size());
  for (size_t i = 0; i < grads.size(); ++i)
    EXPECT_TRUE(same(got_grads[i], grads[i])) << str(got_grads[i]) << " vs " << str(grads[i]);
  ASSERT_EQ(got_ws.size(), bws.size());
  for (size_t i = 0; i < bws.size(); ++i)
    EXPECT_TRUE(same(got_ws[i], bws[i])) << str(got_ws[i]) << " vs " << str(bws[i]);
  for (int k = 0; k < info.num_inputs; ++k) {
    if (!bit(info.grad_inputs, k)) continue;
    ASSERT_TRUE(bb->grad_inputs[k] && bf_->grad_inputs[k]);
    expect_written(bb->grad_inputs[k], "grad input");
    expect_rounded(bb->grad_inputs[k], bf_->grad_inputs[k], "grad input " + std::to_string(k));
    expect_bitwise(bb->grad_inputs[k], bb2->grad_inputs[k], "recomputed grad input");
  }
  for (size_t m = 0; m < wg_b.size(); ++m) {
    expect_bitwise(wg_b[m], wg_b2[m], "recomputed weight gradient");
    if (!c.attrs.dense_wgrad || m > 0) {  // m > 0: a linear's bias, added straight in
      expect_bitwise(wg_b[m], wg_f[m], "weight gradient (fp32 buffer)");
      continue;
    }
    // Made whole in bf16 first: the buffer holds the fp32 gradient rounded once to bf16.
    for (int64_t i = 0; i < wg_b[m].numel(); ++i)
      ASSERT_EQ(load(wg_b[m], i), bf16_bits_to_f32(f32_to_bf16_bits(load(wg_f[m], i))))
          << "dense weight gradient element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CpuOp, ::testing::Range<size_t>(0, cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& p) {
                           return cases()[p.param].label;
                         });

// ---- dispatch
// ------------------------------------------------------------------------------------

// torchao's float8 TP kinds and Transformer Engine's float8 linears, outside cases(): a float8
// cast has no finite-difference gradient. CpuTensorParallel.Float8TensorParallelIsTheWholeTensors
// Cast tests torchao's against the float8 linear, value for value; test_te_fp8.cpp runs TE's.
const std::vector<Case>& float8_tp_cases() {
  static const std::vector<Case> c = [] {
    Rng rng(31);
    OpAttrs a{.features = 16, .group = 1};
    a.fp8 = Fp8Recipe::kTensorwise;
    Val x = rng.floats({{8, 32}, Dtype::kBf16}), w = rng.floats({{16, 32}, Dtype::kBf16}, -0.5, 0.5);
    Val x8 = val({8, 32}, Dtype::kFp8E4m3, Vec(8 * 32, 1.0)), s = val({}, Dtype::kFp32, {0.5});
    // Transformer Engine's float8 linears (te_fp8; run end to end in test_te_fp8.cpp).
    OpAttrs te{.features = 16, .group = 1};
    te.fp8 = Fp8Recipe::kDelayed;
    return std::vector<Case>{{"fp8_all_gather", OpKind::kFp8AllGather, a, {x}, {}, ""},
                             {"fp8_column_linear", OpKind::kFp8ColumnLinear, a, {x8, s}, {w}, ""},
                             {"fp8_row_linear", OpKind::kFp8RowLinear, a, {x}, {w}, ""},
                             {"te_column_linear", OpKind::kTeColumnLinear, te, {x8}, {w}, ""},
                             {"te_row_linear", OpKind::kTeRowLinear, te, {x}, {w}, ""}};
  }();
  return c;
}

TEST(CpuBackend, EveryOpKindHasACaseAndADispatchEntry) {
  for (int k = 0; k < static_cast<int>(OpKind::kCount); ++k) {
    auto kind = static_cast<OpKind>(k);
    auto is = [&](const Case& c) { return c.kind == kind; };
    auto it = std::find_if(cases().begin(), cases().end(), is);
    if (it == cases().end()) it = std::find_if(float8_tp_cases().begin(), float8_tp_cases().end(), is);
    ASSERT_NE(it, float8_tp_cases().end()) << name_of(kind) << " has no test case";
    Exec ex(*it, false);
    auto in = ex.tensors(it->inputs), w = ex.tensors(it->weights);
    EXPECT_NO_THROW(ex.forward(in, w)) << name_of(kind);
  }
  Exec ex(cases()[0], false);
  ex.op.kind = OpKind::kCount;
  EXPECT_THROW(ex.forward({}, {}), std::exception);
  EXPECT_STREQ(make_cpu_backend()->name(), "cpu");
}

// ---- attention: flash against the eager chain
// ----------------------------------------------------

struct AttentionRun {
  Vec ctx, dqkv;
};

AttentionRun run_flash(const Val& qkv, const Val& dctx, bool fp32) {
  const OpAttrs core = attention_attrs();
  Case c{"flash", OpKind::kFlashAttention, core, {qkv}, {}, ""};
  Exec ex(c, fp32);
  auto in = ex.tensors(c.inputs);
  auto f = ex.forward(in, {});
  std::vector<Tensor> go = {ex.tensor(dctx), Tensor{}};
  auto b = ex.backward(in, f->outs, go, {}, {}, {});
  return {read(f->outs[0]), read(b->grad_inputs[0])};
}

AttentionRun run_eager(const Val& qkv, const Val& dctx, bool fp32) {
  const OpAttrs core = attention_attrs();
  Case cs{"scores", OpKind::kAttnScores, core, {qkv}, {}, ""};
  Exec es(cs, fp32);
  auto x = es.tensors(cs.inputs);
  auto s = es.forward(x, {});
  Case cp{"softmax", OpKind::kSoftmax, core, {{s->outs[0].type, read(s->outs[0])}}, {}, ""};
  Exec ep(cp, fp32);
  auto sx = ep.tensors(cp.inputs);
  auto p = ep.forward(sx, {});
  Case cc{"context", OpKind::kAttnContext, core, {{p->outs[0].type, read(p->outs[0])}, qkv}, {},
          ""};
  Exec ec(cc, fp32);
  auto cx = ec.tensors(cc.inputs);
  auto o = ec.forward(cx, {});
  std::vector<Tensor> g = {ec.tensor(dctx)};
  auto bc = ec.backward(cx, o->outs, g, {}, {}, {});  // grads of probs and of qkv (v part)
  std::vector<Tensor> gp = {ep.tensor({bc->grad_inputs[0].type, read(bc->grad_inputs[0])})};
  std::vector<Tensor> po = {ep.tensor({p->outs[0].type, read(p->outs[0])})};
  auto bp = ep.backward(sx, po, gp, {}, {}, {});
  std::vector<Tensor> gs = {es.tensor({bp->grad_inputs[0].type, read(bp->grad_inputs[0])})};
  std::vector<Tensor> acc = {es.tensor({bc->grad_inputs[1].type, read(bc->grad_inputs[1])})};
  auto bs = es.backward(x, s->outs, gs, acc, {}, {});  // accumulates the q, k parts into the v part
  return {read(o->outs[0]), read(bs->grad_inputs[0])};
}

double correlation(const Vec& a, const Vec& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  return ab / std::sqrt(aa * bb);
}

TEST(CpuAttention, FlashMatchesEager) {
  Rng rng(5);
  Val qkv = rng.floats({{T, QKV}, Dtype::kBf16}, -1.5, 1.5);
  Val dctx = rng.floats({{T, HQ * D}, Dtype::kBf16});
  // fp32 storage: the same math up to fp32 rounding.
  AttentionRun f32 = run_flash(qkv, dctx, true), e32 = run_eager(qkv, dctx, true);
  EXPECT_LE(max_diff(f32.ctx, e32.ctx), 1e-5 * max_abs(e32.ctx));
  EXPECT_LE(max_diff(f32.dqkv, e32.dqkv), 1e-5 * max_abs(e32.dqkv));
  // bf16 storage: the eager chain rounds scores, probs and their gradients to bf16 (2^-8 relative
  // each), so the two agree to a few percent of the largest element, with correlation > 0.999.
  AttentionRun fb = run_flash(qkv, dctx, false), eb = run_eager(qkv, dctx, false);
  EXPECT_LE(max_diff(fb.ctx, eb.ctx), 3e-2 * max_abs(eb.ctx));
  EXPECT_LE(max_diff(fb.dqkv, eb.dqkv), 5e-2 * max_abs(eb.dqkv));
  EXPECT_GT(correlation(fb.ctx, eb.ctx), 0.999);
  EXPECT_GT(correlation(fb.dqkv, eb.dqkv), 0.999);
}

// ---- dropout
// ---------------------------------------------------------------------------------------

struct Masked {
  Vec out, mask;
};

Masked run_dropout(const Case& c, std::function<void(Exec&)> tweak = nullptr) {
  Exec ex(c, false);
  if (tweak) tweak(ex);
  auto in = ex.tensors(c.inputs);
  auto f = ex.forward(in, {});
  return {read(f->outs[0]), read(f->outs[1])};
}

TEST(CpuDropout, MaskRateDeterminismAndStreams) {
  Rng rng(3);
  Case c{"big", OpKind::kDropout, {}, {rng.floats({{512, 64}, Dtype::kBf16})}, {}, ""};
  Masked a = run_dropout(c), b = run_dropout(c);
  double kept = std::accumulate(a.mask.begin(), a.mask.end(), 0.0) / a.mask.size();
  EXPECT_NEAR(kept, 1 - kDropout, 0.01);  // 32768 draws: sigma 0.0022
  EXPECT_EQ(a.mask, b.mask);
  EXPECT_EQ(a.out, b.out);
  auto differs = [&](const Masked& m) {
    double d = 0;
    for (size_t i = 0; i < m.mask.size(); ++i) d += m.mask[i] != a.mask[i];
    return d / m.mask.size();  // about 2 p (1 - p) = 0.32 for independent masks
  };
  EXPECT_GT(differs(run_dropout(c, [](Exec& e) { e.mb = 2; })), 0.25);
  EXPECT_GT(differs(run_dropout(c, [](Exec& e) { e.layer = 4; })), 0.25);
  EXPECT_GT(differs(run_dropout(c, [](Exec& e) { e.seed = 43; })), 0.25);
  EXPECT_GT(differs(run_dropout(c, [](Exec& e) { e.op.name = "mlp.dropout"; })), 0.25);
}

// The mask bit of an element depends on its global position only, not on the TP rank or SP shard.
TEST(CpuDropout, IndependentOfTensorParallelShards) {
  Rng rng(4);
  int64_t hq = 4, s = 6;
  Case full{"probs", OpKind::kDropout, {}, {rng.floats({{2, hq, s, s}, Dtype::kBf16})}, {}, ""};
  Masked ref = run_dropout(full);
  for (int64_t r = 0; r < 2; ++r) {  // heads split over tp = 2
    Val part = val({2, hq / 2, s, s}, Dtype::kBf16, Vec{});
    for (int64_t bi = 0; bi < 2; ++bi)
      for (int64_t h = 0; h < hq / 2; ++h)
        for (int64_t i = 0; i < s * s; ++i)
          part.v.push_back(full.inputs[0].v[((bi * hq + r * hq / 2 + h) * s * s) + i]);
    Case c{"probs", OpKind::kDropout, {}, {part}, {}, ""};
    Masked m = run_dropout(c, [&](Exec& e) { e.setup.tp = 2, e.tp_rank = r; });
    for (int64_t bi = 0; bi < 2; ++bi)
      for (int64_t h = 0; h < hq / 2; ++h)
        for (int64_t i = 0; i < s * s; ++i)
          ASSERT_EQ(m.mask[(bi * hq / 2 + h) * s * s + i],
                    ref.mask[(bi * hq + r * hq / 2 + h) * s * s + i]);
  }
  // Sequence shards (SP): rows [token_offset, token_offset + T/3) of the full tensor.
  Case rows{"hidden", OpKind::kDropout, {}, {rng.floats({{T, H}, Dtype::kBf16})}, {}, ""};
  Masked all = run_dropout(rows);
  for (int64_t r = 0; r < 3; ++r) {
    Val part = val({T / 3, H}, Dtype::kBf16,
                   Vec(rows.inputs[0].v.begin() + r * (T / 3) * H,
                       rows.inputs[0].v.begin() + (r + 1) * (T / 3) * H));
    Case c{"hidden", OpKind::kDropout, {}, {part}, {}, ""};
    Masked m = run_dropout(c, [&](Exec& e) {
      e.setup.tp = 3, e.setup.sp = true, e.tp_rank = r, e.token_offset = r * (T / 3);
    });
    EXPECT_EQ(m.mask,
              Vec(all.mask.begin() + r * (T / 3) * H, all.mask.begin() + (r + 1) * (T / 3) * H))
        << "shard " << r;
    EXPECT_EQ(m.out,
              Vec(all.out.begin() + r * (T / 3) * H, all.out.begin() + (r + 1) * (T / 3) * H))
        << "shard " << r;
  }
}

TEST(CpuRng, CounterUniformAndStreams) {
  double sum = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    float u = counter_uniform(1, 2, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
  EXPECT_EQ(counter_uniform(9, 8, 7), counter_uniform(9, 8, 7));
  EXPECT_NE(counter_uniform(9, 8, 7), counter_uniform(9, 8, 6));
  GraphOp a, b;
  a.name = "attn.dropout", b.name = "mlp.dropout";
  OpContext ca, cb;
  ca.op = &a, cb.op = &b, ca.layer = cb.layer = 0;
  EXPECT_NE(dropout_stream(ca), dropout_stream(cb));
  OpContext cl = ca;
  cl.layer = 1;
  EXPECT_NE(dropout_stream(ca), dropout_stream(cl));
  OpContext cm = ca;
  cm.mb = 5, cm.tp_rank = 1;  // neither the micro-batch nor the rank enters the stream
  EXPECT_EQ(dropout_stream(ca), dropout_stream(cm));
}

// ---- routing, vocab and bias details
// ---------------------------------------------------------------

TEST(CpuMoe, TopKTiesPickTheLowerExpert) {
  Val l = val({2, 4}, Dtype::kFp32, Vec{0.5, 1.0, 1.0, 1.0, 2.0, 0.0, 2.0, -1.0});
  Case c{"ties", OpKind::kTopK, {.top_k = 2}, {l}, {}, ""};
  Exec ex(c, false);
  auto in = ex.tensors(c.inputs);
  auto f = ex.forward(in, {});
  EXPECT_EQ(read(f->outs[1]), (Vec{1, 2, 0, 2}));
  EXPECT_EQ(read(f->outs[0]), (Vec{0.5, 0.5, 0.5, 0.5}));
}

// DeepSeek-V3's choice by hand: 4 groups of 2, each scored by its best expert (top_k 2 over 2
// groups), the bias choosing but not weighting.
TEST(CpuMoe, RouteChooseGroupsAndBias) {
  const float s[] = {0.9f, 0.1f, 0.5f, 0.6f, 0.2f, 0.3f, 0.8f, 0.05f};
  const float bias[] = {0, 0, 0, 0, 0.5f, 0.5f, 0, 0};
  const RouterSpec r{.sigmoid = true, .groups = 4, .topk_groups = 2, .scaling = 2.5};
  int64_t chosen[2];
  float mask[8];
  // Without the bias the groups score 0.9, 0.6, 0.3, 0.8: groups 0 and 3, experts 0 and 6.
  cpu::route_choose(s, nullptr, 8, 2, r, chosen, mask);
  EXPECT_EQ(std::vector<int64_t>(chosen, chosen + 2), (std::vector<int64_t>{0, 6}));
  EXPECT_EQ(std::vector<float>(mask, mask + 8), (std::vector<float>{1, 1, 0, 0, 0, 0, 1, 1}));
  // With it, c = 0.9 0.1 0.5 0.6 0.7 0.8 0.8 0.05: groups 0 (0.9) and 2 (0.8, tied with group 3:
  // the lower), experts 0 (0.9) and 5 (0.8).
  cpu::route_choose(s, bias, 8, 2, r, chosen, mask);
  EXPECT_EQ(std::vector<int64_t>(chosen, chosen + 2), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(std::vector<float>(mask, mask + 8), (std::vector<float>{1, 1, 0, 0, 1, 1, 0, 0}));
  // One group of all: the plain top-2 of c.
  cpu::route_choose(s, bias, 8, 2, RouterSpec{}, chosen);
  EXPECT_EQ(std::vector<int64_t>(chosen, chosen + 2), (std::vector<int64_t>{0, 5}));
  // top_k 3 over 2 groups: each group scored by its best 3 / 2 = 1 (rounded down, as Megatron's
  // group_limited_topk): groups 0 and 3 again, and the top 3 of their experts 0, 1, 6, 7.
  int64_t three[3];
  cpu::route_choose(s, nullptr, 8, 3, r, three, mask);
  EXPECT_EQ(std::vector<int64_t>(three, three + 3), (std::vector<int64_t>{0, 6, 1}));
  EXPECT_EQ(std::vector<float>(mask, mask + 8), (std::vector<float>{1, 1, 0, 0, 0, 0, 1, 1}));
}

// The top-k's weights are the scores, not the biased ones: with the groups above, experts 0 and
// 6 weigh 0.9 / 1.7 and 0.8 / 1.7, times 2.5.
TEST(CpuMoe, RouteTopKWeightsAreTheChosenScoresRenormalisedAndScaled) {
  Val s = val({1, 8}, Dtype::kFp32, Vec{0.9, 0.1, 0.5, 0.6, 0.2, 0.3, 0.8, 0.05});
  Case c{"deepseek",
         OpKind::kRouteTopK,
         {.top_k = 2,
          .router = {.sigmoid = true, .groups = 4, .topk_groups = 2, .scaling = 2.5},
          .bias = true},
         {s},
         {},
         ""};
  Exec ex(c, false);
  auto in = ex.tensors(c.inputs);
  auto f = ex.forward(in, {});
  EXPECT_EQ(read(f->outs[1]), (Vec{0, 6}));
  Vec p = read(f->outs[0]);
  EXPECT_NEAR(p[0], 2.5 * 0.9 / 1.7, 1e-6);
  EXPECT_NEAR(p[1], 2.5 * 0.8 / 1.7, 1e-6);
  EXPECT_EQ(f->outs.size(), 5u) << "probs, indices and the three scratch tensors";
}

// The capacity cases drop choices (else their references test no dropping), and a token whose
// choices were all dropped gets no expert output: the combine's row is zero.
TEST(CpuMoe, CapacityDropsChoicesBeyondItInTokenOrder) {
  const Case& c = *std::find_if(cases().begin(), cases().end(),
                                [](const Case& x) { return x.label == "moe_combine_capacity"; });
  auto rows = dispatch_rows(c.inputs[2], c.attrs.capacity);
  int64_t kept =
      std::count_if(rows.begin(), rows.end(), [](const DispatchRow& r) { return r.t >= 0; });
  EXPECT_LT(kept, T * K);
  EXPECT_GT(kept, 0);
  // The first choices in token order are the ones kept: every expert's slots are full or all of
  // its choices fit.
  std::vector<int64_t> last_kept(E, -1);
  for (const DispatchRow& r : rows)
    if (r.t >= 0) last_kept[r.expert] = std::max(last_kept[r.expert], r.t * K + r.j);
  for (int64_t i = 0; i < T * K; ++i) {
    auto e = static_cast<int64_t>(c.inputs[2].v[i]);
    bool is_kept = std::any_of(rows.begin(), rows.end(), [&](const DispatchRow& r) {
      return r.t * K + r.j == i && r.t >= 0;
    });
    EXPECT_EQ(is_kept, i <= last_kept[e]) << "choice " << i;
  }
  Exec ex(c, false);
  auto in = ex.tensors(c.inputs);
  Vec out = read(ex.forward(in, {})->outs[0]);
  for (int64_t t = 0; t < T; ++t) {
    bool any =
        std::any_of(rows.begin(), rows.end(), [&](const DispatchRow& r) { return r.t == t; });
    if (any) continue;
    for (int64_t d = 0; d < H; ++d) EXPECT_EQ(out[t * H + d], 0.0) << "token " << t;
  }
}

// Vocab-parallel embedding: each rank writes the rows of its shard and zeros elsewhere; the ranks'
// outputs sum to the unsharded lookup. Weight gradients land in the owning shard's rows.
TEST(CpuVocab, EmbeddingShardsSumToTheFullLookup) {
  Rng rng(6);
  int64_t vocab = 18;
  Val ids = integers(rng, {T}, vocab), table = rng.floats({{vocab, H}, Dtype::kBf16});
  Case full{"embed", OpKind::kEmbedding, {.features = H, .rows = vocab}, {ids}, {table}, ""};
  Exec ef(full, false);
  auto fin = ef.tensors(full.inputs), fw = ef.tensors(full.weights);
  Vec want = read(ef.forward(fin, fw)->outs[0]), sum(T * H, 0.0);
  for (int64_t r = 0; r < 2; ++r) {
    Val shard = val(
        {vocab / 2, H}, Dtype::kBf16,
        Vec(table.v.begin() + r * (vocab / 2) * H, table.v.begin() + (r + 1) * (vocab / 2) * H));
    Case c{"embed", OpKind::kEmbedding, {.features = H, .rows = vocab / 2}, {ids}, {shard}, ""};
    Exec ex(c, false);
    ex.setup.tp = 2, ex.tp_rank = r;
    auto in = ex.tensors(c.inputs), w = ex.tensors(c.weights);
    auto f = ex.forward(in, w);
    Vec o = read(f->outs[0]);
    for (int64_t i = 0; i < T * H; ++i) sum[i] += o[i];
    std::vector<Tensor> g = {ex.tensor({f->outs[0].type, Vec(T * H, 1.0)})};
    auto wg = ex.zero_weight_grads();
    ex.backward(in, f->outs, g, {}, w, wg);
    Vec dw = read(wg[0]);
    for (int64_t row = 0; row < vocab / 2; ++row) {
      double n = std::count(ids.v.begin(), ids.v.end(), double(r * (vocab / 2) + row));
      for (int64_t d = 0; d < H; ++d)
        ASSERT_EQ(dw[row * H + d], n) << "rank " << r << " row " << row;
    }
  }
  EXPECT_EQ(sum, want);
}

TEST(CpuLinear, RowLinearBiasOnlyOnRankZeroGradOnEveryRank) {
  const Case& c = *std::find_if(cases().begin(), cases().end(),
                                [](const Case& x) { return x.label == "row_linear"; });
  Vec out[2], db[2];
  for (int64_t r = 0; r < 2; ++r) {
    Exec ex(c, true);
    ex.setup.tp = 2, ex.tp_rank = r;
    auto in = ex.tensors(c.inputs), w = ex.tensors(c.weights);
    auto f = ex.forward(in, w);
    out[r] = read(f->outs[0]);
    std::vector<Tensor> g = {ex.tensor({f->outs[0].type, Vec(T * H, 1.0)})};
    auto wg = ex.zero_weight_grads();
    ex.backward(in, f->outs, g, {}, w, wg);
    db[r] = read(wg[1]);
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < H; ++d)
      EXPECT_NEAR(out[0][t * H + d] - out[1][t * H + d], c.weights[1].v[d], 1e-5);
  EXPECT_EQ(db[0], Vec(H, double(T)));
  EXPECT_EQ(db[1], Vec(H, double(T)));
}

TEST(CpuLinear, Bf16WeightGradientsRoundOnce) {
  const Case& c = *std::find_if(cases().begin(), cases().end(),
                                [](const Case& x) { return x.label == "column_linear"; });
  Exec ex(c, false);
  auto in = ex.tensors(c.inputs), w = ex.tensors(c.weights);
  auto f = ex.forward(in, w);
  Rng rng(8);
  std::vector<Tensor> g = {ex.tensor({f->outs[0].type, rng.signs(f->outs[0].numel())})};
  auto w32 = ex.zero_weight_grads(Dtype::kFp32), w16 = ex.zero_weight_grads(Dtype::kBf16);
  std::vector<Vec> preset;
  for (const Tensor& t : w16) {
    preset.push_back(rng.signs(t.numel()));
    fill(t, preset.back());
  }
  ex.backward(in, f->outs, g, {}, w, w32);
  ex.backward(in, f->outs, g, {}, w, w16);
  for (size_t m = 0; m < w16.size(); ++m)
    for (int64_t i = 0; i < w16[m].numel(); ++i)
      ASSERT_EQ(w16[m].as<uint16_t>()[i],
                f32_to_bf16(static_cast<float>(preset[m][i]) + w32[m].as<float>()[i]));
}

// ---- tp = 2 with threads as ranks
// ------------------------------------------------------------------

// Vocab-parallel cross-entropy over two shards equals the unsharded loss.
TEST(CpuTensorParallel, CrossEntropyOverTwoVocabShards) {
  Rng rng(9);
  int64_t vocab = 18;
  Val logits = rng.floats({{T, vocab}, Dtype::kBf16}, -3, 3), targets = integers(rng, {T}, vocab);
  Case full{"loss", OpKind::kCrossEntropy, {}, {logits, targets}, {}, ""};
  Exec ef(full, false);
  auto fin = ef.tensors(full.inputs);
  auto ff = ef.forward(fin, {});
  std::vector<Tensor> none(2);
  auto fb = ef.backward(fin, ff->outs, none, {}, {}, {});
  Vec loss = read(ff->outs[0]), sm = read(ff->outs[1]), grad = read(fb->grad_inputs[0]);
  Vec rl[2], rs[2], rg[2];
  on_ranks(2, [&](int64_t r, Communicator& comm) {
    Val part = val({T, vocab / 2}, Dtype::kBf16, Vec{});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < vocab / 2; ++j)
        part.v.push_back(logits.v[t * vocab + r * (vocab / 2) + j]);
    Case c{"loss", OpKind::kCrossEntropy, {}, {part, targets}, {}, ""};
    Exec ex(c, false);
    ex.setup.tp = 2, ex.tp_rank = r, ex.comm = &comm;
    auto in = ex.tensors(c.inputs);
    auto f = ex.forward(in, {});
    std::vector<Tensor> no(2);
    auto b = ex.backward(in, f->outs, no, {}, {}, {});
    rl[r] = read(f->outs[0]), rs[r] = read(f->outs[1]), rg[r] = read(b->grad_inputs[0]);
  });
  EXPECT_EQ(rl[0], rl[1]) << "every rank has bitwise the same loss";
  EXPECT_LE(max_diff(rl[0], loss), 1e-6 * max_abs(loss));
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < vocab / 2; ++j) {
        int64_t full_i = t * vocab + r * (vocab / 2) + j, i = t * (vocab / 2) + j;
        EXPECT_NEAR(rs[r][i], sm[full_i], 1e-6);
        EXPECT_NEAR(rg[r][i], grad[full_i],
                    1e-2 * std::abs(grad[full_i]) + 1e-7);  // bf16: 2^-8 relative
      }
}

// Plain TP (no SP): the column-parallel linear all-reduces its input gradient (Megatron's f),
// before adding it into an existing gradient.
TEST(CpuTensorParallel, ColumnLinearAllReducesItsInputGradient) {
  Rng rng(10);
  Val x = rng.floats({{T, H}, Dtype::kBf16}), w = rng.floats({{2 * F, H}, Dtype::kBf16}, -0.5, 0.5);
  Val g = rng.floats({{T, 2 * F}, Dtype::kBf16}), preset = rng.floats({{T, H}, Dtype::kBf16});
  Case full{"qkv", OpKind::kColumnLinear, {.features = 2 * F}, {x}, {w}, ""};
  Exec ef(full, true);
  auto fin = ef.tensors(full.inputs), fw = ef.tensors(full.weights);
  auto ff = ef.forward(fin, fw);
  std::vector<Tensor> fg = {ef.tensor(g)};
  auto wg = ef.zero_weight_grads();
  Vec want = read(ef.backward(fin, ff->outs, fg, {}, fw, wg)->grad_inputs[0]);
  Vec got[2], acc[2];
  on_ranks(2, [&](int64_t r, Communicator& comm) {
    Val wr = val({F, H}, Dtype::kBf16, Vec(w.v.begin() + r * F * H, w.v.begin() + (r + 1) * F * H));
    Val gr = val({T, F}, Dtype::kBf16, Vec{});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < F; ++j) gr.v.push_back(g.v[t * 2 * F + r * F + j]);
    Case c{"qkv", OpKind::kColumnLinear, {.features = F}, {x}, {wr}, "all_reduce"};
    Exec ex(c, true);
    ex.setup.tp = 2, ex.tp_rank = r, ex.comm = &comm;
    auto in = ex.tensors(c.inputs), wt = ex.tensors(c.weights);
    auto f = ex.forward(in, wt);
    std::vector<Tensor> go = {ex.tensor(gr)};
    auto wgr = ex.zero_weight_grads();
    got[r] = read(ex.backward(in, f->outs, go, {}, wt, wgr)->grad_inputs[0]);
    std::vector<Tensor> pre = {ex.tensor(preset)};
    acc[r] = read(ex.backward(in, f->outs, go, pre, wt, wgr)->grad_inputs[0]);
  });
  EXPECT_EQ(got[0], got[1]);
  EXPECT_LE(max_diff(got[0], want), 1e-5 * max_abs(want));
  for (int64_t i = 0; i < T * H; ++i)
    ASSERT_EQ(acc[0][i], double(static_cast<float>(preset.v[i]) + static_cast<float>(got[0][i])));
}

// One op at TP rank r of 2 on `in`, forward and (output gradient `grad`) backward.
void run_tp2(OpKind kind, const Val& in, const Val& grad, Vec& out, Vec& gin, int64_t r,
             Communicator& comm) {
  Case c{"c", kind, {.group = 2}, {in}, {}, ""};
  Exec ex(c, true);
  ex.setup.tp = 2, ex.tp_rank = r, ex.comm = &comm;
  auto t = ex.tensors(c.inputs);
  auto f = ex.forward(t, {});
  out = read(f->outs[0]);
  std::vector<Tensor> g = {ex.tensor(grad)};
  gin = read(ex.backward(t, f->outs, g, {}, {}, {})->grad_inputs[0]);
}

// All-gather / reduce-scatter / all-reduce as ops at tp = 2, forward and backward.
TEST(CpuTensorParallel, CollectiveOpsAndTheirConjugates) {
  Rng rng(12);
  int64_t rows = 4;
  Val xs[2] = {rng.floats({{rows, H}, Dtype::kBf16}), rng.floats({{rows, H}, Dtype::kBf16})};
  Val ys[2] = {rng.floats({{2 * rows, H}, Dtype::kBf16}),
               rng.floats({{2 * rows, H}, Dtype::kBf16})};
  Vec ag[2], agb[2], rs[2], rsb[2], ar[2], arb[2], idx[2];
  on_ranks(2, [&](int64_t r, Communicator& comm) {
    auto run = [&](OpKind kind, const Val& in, const Val& grad, Vec& out, Vec& gin) {
      run_tp2(kind, in, grad, out, gin, r, comm);
    };
    run(OpKind::kAllGather, xs[r], ys[r], ag[r], agb[r]);
    run(OpKind::kReduceScatter, ys[r], xs[r], rs[r], rsb[r]);
    run(OpKind::kAllReduce, xs[r], xs[1 - r], ar[r], arb[r]);
    // MoE routing indices travel as i64 (forward only: they carry no gradient).
    Case c{"idx",        OpKind::kAllGather,
           {.group = 2}, {val({2, K}, Dtype::kI64, Vec{double(r), 1, 2, double(4 - r)})},
           {},           ""};
    Exec ex(c, false);
    ex.setup.tp = 2, ex.tp_rank = r, ex.comm = &comm;
    auto t = ex.tensors(c.inputs);
    idx[r] = read(ex.forward(t, {})->outs[0]);
  });
  for (int64_t r = 0; r < 2; ++r) EXPECT_EQ(idx[r], (Vec{0, 1, 2, 4, 1, 1, 2, 3}));
  Vec cat = xs[0].v;
  cat.insert(cat.end(), xs[1].v.begin(), xs[1].v.end());
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_EQ(ag[r], cat);
    EXPECT_EQ(rsb[r], cat);
    EXPECT_EQ(arb[r], xs[1 - r].v);  // identity backward
    for (int64_t i = 0; i < rows * H; ++i) {
      double block = double(float(ys[0].v[r * rows * H + i]) + float(ys[1].v[r * rows * H + i]));
      EXPECT_EQ(rs[r][i], block);
      EXPECT_EQ(agb[r][i], block);
      EXPECT_EQ(ar[r][i], double(float(xs[0].v[i]) + float(xs[1].v[i])));
    }
  }
}

// Multi-token prediction's TP data movement at tp = 2: the features gathered side by side in rank
// order (backward: this rank's columns), and this rank's rows (backward: the rows all-gathered).
TEST(CpuTensorParallel, MtpGatherAndScatter) {
  Rng rng(31);
  const int64_t rows = 4;
  Val xs[2] = {rng.floats({{rows, H}, Dtype::kBf16}), rng.floats({{rows, H}, Dtype::kBf16})};
  Val gs[2] = {rng.floats({{rows, 2 * H}, Dtype::kBf16}),
               rng.floats({{rows, 2 * H}, Dtype::kBf16})};
  Val hs[2] = {rng.floats({{rows / 2, H}, Dtype::kBf16}),
               rng.floats({{rows / 2, H}, Dtype::kBf16})};
  Vec gf[2], gfb[2], sr[2], srb[2];
  on_ranks(2, [&](int64_t r, Communicator& comm) {
    auto run = [&](OpKind kind, const Val& in, const Val& grad, Vec& out, Vec& gin) {
      run_tp2(kind, in, grad, out, gin, r, comm);
    };
    run(OpKind::kGatherFeatures, xs[r], gs[r], gf[r], gfb[r]);
    run(OpKind::kScatterRows, xs[r], hs[r], sr[r], srb[r]);
  });
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t j = 0; j < H; ++j) {
        for (int64_t q = 0; q < 2; ++q)
          EXPECT_EQ(gf[r][t * 2 * H + q * H + j], xs[q].v[t * H + j]);
        EXPECT_EQ(gfb[r][t * H + j], gs[r].v[t * 2 * H + r * H + j]);
        // rank r's rows of its own input; the gradient's rows are rank t / 2's
        if (t < rows / 2) EXPECT_EQ(sr[r][t * H + j], xs[r].v[(r * rows / 2 + t) * H + j]);
        EXPECT_EQ(srb[r][t * H + j], hs[t / 2].v[(t % 2) * H + j]);
      }
}


// torchao's Float8Linear on the CPU: what the kernel allocates, step by step, is what the op
// table's steps say (planner/graph/float8.cpp), its results in the step that names them; its
// output and gradients are the bf16 linear's within float8's precision (relative L2 error under
// 10 % for the e4m3 forward, 20 % for the backward's e5m2 gradients; rowwise_with_gw_hp's weight
// gradient, a bf16 GEMM, within bf16's: 1 %).
TEST(Float8Linear, AllocatesAsItsStepsAndComputesWithinFloat8Precision) {
  const int64_t R = 24, K = 32, N = 48;
  for (Fp8Recipe r : {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise, Fp8Recipe::kRowwiseGwHp}) {
    Rng rng(11);
    Case c{"fp8", OpKind::kColumnLinear, {.features = N}, {rng.floats({{R, K}, Dtype::kBf16})},
           {rng.floats({{N, K}, Dtype::kBf16}, -0.2, 0.2)}, ""};
    c.attrs.fp8 = r;
    Exec ex(c, false);
    auto in = ex.tensors(c.inputs), w = ex.tensors(c.weights);
    // Each step's allocations, as bytes.
    std::vector<std::vector<int64_t>> got(1);
    Arena arena;
    OpContext ctx = ex.context(arena);
    ctx.alloc = [&](const TensorType& t, AllocRole role) {
      got.back().push_back(t.bytes());
      return arena.alloc(t, role);
    };
    ctx.step = [&] { got.emplace_back(); };
    std::vector<Tensor> y = ex.be->forward(ctx, in, w);
    std::vector<TensorType> types = {c.inputs[0].type};
    auto want = [&](bool forward, int64_t results) {
      std::vector<std::vector<int64_t>> out;
      for (const OpStep& st : op_steps(op_info(c.kind), c.attrs, types, forward)) {
        out.emplace_back();
        for (const TensorType& t : st.temps) out.back().push_back(t.bytes());
        if (st.results & kStepResults) out.back().push_back(results);
      }
      return out;
    };
    EXPECT_EQ(got, want(true, 2 * R * N)) << name_of(r);
    // Against the exact product of the same bf16 values.
    auto rel = [](const Vec& a, const Vec& b) {
      double e = 0, n = 0;
      for (size_t i = 0; i < a.size(); ++i) e += (a[i] - b[i]) * (a[i] - b[i]), n += b[i] * b[i];
      return std::sqrt(e / n);
    };
    const Vec& x = c.inputs[0].v;
    const Vec& W = c.weights[0].v;
    Vec exact(R * N, 0.0);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k) exact[i * N + j] += x[i * K + k] * W[j * K + k];
    EXPECT_LT(rel(read(y[0]), exact), 0.1) << name_of(r);
    EXPECT_GT(rel(read(y[0]), exact), 0.0) << name_of(r);
    // Backward: the input gradient allocated in its step, the weight gradient added into a buffer.
    Vec g = rng.floats({{R, N}, Dtype::kBf16}).v;
    Tensor gt = ex.tensor({{{R, N}, Dtype::kBf16}, g});
    std::vector<Tensor> gin(1), wg = ex.zero_weight_grads();
    std::vector<Tensor> gout = {gt}, outs(1);
    got.assign(1, {});
    ex.be->backward(ctx, {in, outs, gout, gin, w, wg});
    EXPECT_EQ(got, want(false, 2 * R * K)) << name_of(r);
    Vec dx(R * K, 0.0), dw(N * K, 0.0);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k) {
          dx[i * K + k] += g[i * N + j] * W[j * K + k];
          dw[j * K + k] += g[i * N + j] * x[i * K + k];
        }
    EXPECT_LT(rel(read(gin[0]), dx), 0.2) << name_of(r);
    EXPECT_LT(rel(read(wg[0]), dw), r == Fp8Recipe::kRowwiseGwHp ? 0.01 : 0.2) << name_of(r);
    EXPECT_GT(rel(read(wg[0]), dw), r == Fp8Recipe::kRowwiseGwHp ? 0.0 : 0.01) << name_of(r);
  }
}

// torchao's float8 TP at tp 2 against the tp 1 float8 linear on the same values. The maxima are
// all-reduced, so every cast is the whole tensor's: the column side (the float8 all-gather, then
// the column linear on a weight row block) makes exactly the output's column block, the weight
// gradient's row block, and an input gradient whose sum over the ranks is tp 1's within bf16;
// the row side (the linear on a column block of its input and weight, reduce-scattered) makes
// the output's row block within bf16 (its sum splits over the ranks), and exactly the input
// gradient's and the weight gradient's column blocks (their sums run over the output features
// and the rows, as at tp 1).
TEST(CpuTensorParallel, Float8TensorParallelIsTheWholeTensorsCast) {
  const int64_t R = 8, K = 32, N = 32;
  Rng rng(21);
  Val x = rng.floats({{R, K}, Dtype::kBf16}), w = rng.floats({{N, K}, Dtype::kBf16}, -0.5, 0.5);
  Val g = rng.floats({{R, N}, Dtype::kBf16});
  auto tp1 = [&](OpKind kind) {
    Case c{"fp8", kind, {.features = N}, {x}, {w}, ""};
    c.attrs.fp8 = Fp8Recipe::kTensorwise;
    Exec ex(c, false);
    auto in = ex.tensors(c.inputs), wt = ex.tensors(c.weights);
    auto f = ex.forward(in, wt);
    std::vector<Tensor> go = {ex.tensor(g)};
    auto wg = ex.zero_weight_grads();
    Vec dx = read(ex.backward(in, f->outs, go, {}, wt, wg)->grad_inputs[0]);
    return std::array<Vec, 3>{read(f->outs[0]), dx, read(wg[0])};
  };
  auto rows = [](const Val& v, int64_t r, int64_t n) {  // row block r of n
    const int64_t c = v.type.shape[1], m = v.type.shape[0] / n;
    return val({m, c}, v.type.dtype, Vec(v.v.begin() + r * m * c, v.v.begin() + (r + 1) * m * c));
  };
  auto cols = [](const Val& v, int64_t r, int64_t n) {  // column block r of n
    const int64_t m = v.type.shape[0], c = v.type.shape[1] / n;
    Val out = val({m, c}, v.type.dtype, Vec{});
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < c; ++j) out.v.push_back(v.v[i * v.type.shape[1] + r * c + j]);
    return out;
  };
  auto vcols = [](const Vec& v, int64_t m, int64_t c, int64_t r, int64_t n) {
    Vec out;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < c / n; ++j) out.push_back(v[i * c + r * (c / n) + j]);
    return out;
  };
  // Column side.
  std::array<Vec, 3> col = tp1(OpKind::kColumnLinear);
  Vec y[2], dx[2], dw[2];
  on_ranks(2, [&](int64_t r, Communicator& comm) {
    Case gc{"gather", OpKind::kFp8AllGather, {.group = 2}, {rows(x, r, 2)}, {}, ""};
    gc.attrs.fp8 = Fp8Recipe::kTensorwise;
    Exec eg(gc, false);
    eg.setup.tp = 2, eg.tp_rank = r, eg.comm = &comm;
    auto gin = eg.tensors(gc.inputs);
    auto gathered = eg.forward(gin, {});
    Case lc{"fp8", OpKind::kFp8ColumnLinear, {.features = N / 2},
            {val({R, K}, Dtype::kFp8E4m3, Vec{}), val({}, Dtype::kFp32, Vec{})},
            {rows(w, r, 2)}, ""};
    lc.attrs.fp8 = Fp8Recipe::kTensorwise;
    Exec el(lc, false);
    el.setup.tp = 2, el.tp_rank = r, el.comm = &comm;
    auto wt = el.tensors(lc.weights);
    auto f = el.forward(gathered->outs, wt);
    std::vector<Tensor> go = {el.tensor(cols(g, r, 2))};
    auto wg = el.zero_weight_grads();
    dx[r] = read(el.backward(gathered->outs, f->outs, go, {}, wt, wg)->grad_inputs[0]);
    y[r] = read(f->outs[0]), dw[r] = read(wg[0]);
  });
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_EQ(y[r], vcols(col[0], R, N, r, 2)) << r;
    EXPECT_EQ(dw[r], Vec(col[2].begin() + r * (N / 2) * K, col[2].begin() + (r + 1) * (N / 2) * K));
  }
  Vec sum(dx[0].size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = dx[0][i] + dx[1][i];
  EXPECT_LE(max_diff(sum, col[1]), 1e-2 * max_abs(col[1]));
  EXPECT_GT(max_diff(col[0], Vec(col[0].size(), 0.0)), 0.0);
  // Row side.
  std::array<Vec, 3> row = tp1(OpKind::kRowLinear);
  on_ranks(2, [&](int64_t r, Communicator& comm) {
    Case c{"fp8", OpKind::kFp8RowLinear, {.features = N, .group = 2}, {cols(x, r, 2)},
           {cols(w, r, 2)}, ""};
    c.attrs.fp8 = Fp8Recipe::kTensorwise;
    Exec ex(c, false);
    ex.setup.tp = 2, ex.tp_rank = r, ex.comm = &comm;
    auto in = ex.tensors(c.inputs), wt = ex.tensors(c.weights);
    auto f = ex.forward(in, wt);
    std::vector<Tensor> go = {ex.tensor(rows(g, r, 2)), Tensor{}, Tensor{}};
    auto wg = ex.zero_weight_grads();
    dx[r] = read(ex.backward(in, f->outs, go, {}, wt, wg)->grad_inputs[0]);
    y[r] = read(f->outs[0]), dw[r] = read(wg[0]);
  });
  for (int64_t r = 0; r < 2; ++r) {
    Vec want(row[0].begin() + r * (R / 2) * N, row[0].begin() + (r + 1) * (R / 2) * N);
    EXPECT_LE(max_diff(y[r], want), 1e-2 * max_abs(want)) << r;
    EXPECT_EQ(dx[r], vcols(row[1], R, K, r, 2)) << r;
    EXPECT_EQ(dw[r], vcols(row[2], N, K, r, 2)) << r;
  }
}

}  // namespace
}  // namespace np::exec

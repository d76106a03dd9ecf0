// Names of the spec enums and the validation of model and setup.
#include "planner/inputs/spec.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <iterator>
#include <tuple>
#include <utility>

#include "planner/inputs/units.hpp"

namespace np {

int64_t dtype_bytes(Dtype d) {
  switch (d) {
    case Dtype::kBf16:
      return 2;
    case Dtype::kFp32:
      return 4;
    case Dtype::kU8:
    case Dtype::kFp8E4m3:
    case Dtype::kFp8E5m2:
      return 1;
    case Dtype::kI64:
      return 8;
  }
  return 0;
}

const char* name_of(Dtype d) {
  constexpr const char* k[] = {"bf16", "fp32", "u8", "i64", "float8_e4m3fn", "float8_e5m2"};
  return k[static_cast<int>(d)];
}
const char* name_of(Fp8Recipe r) {
  constexpr const char* k[] = {"none", "tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed"};
  return k[static_cast<int>(r)];
}
bool float8_tp(const TrainSpec& t) {
  return t.fp8 == Fp8Recipe::kTensorwise && t.impl == Impl::kTorchtitan && t.tp > 1;
}

bool te_fp8(const TrainSpec& t) {
  return t.fp8 != Fp8Recipe::kNone && t.impl == Impl::kMegatron;
}

bool float8_linear(const TrainSpec& t, const std::string& fqn, int64_t in, int64_t out) {
  if (t.fp8 == Fp8Recipe::kNone || t.impl != Impl::kTorchtitan) return false;
  if (in % 16 != 0 || out % 16 != 0) return false;
  bool automatic = false;
  for (const std::string& f : t.fp8_filter) {
    if (f == kFp8AutoFilter) automatic = true;
    else if (fqn.find(f) != std::string::npos) return false;
  }
  if (!automatic) return true;
  // torchao 36027d8, torchao/float8/float8_linear_utils.py, _auto_filter_for_tensorwise and
  // _auto_filter_for_rowwise (N, K = weight.shape, the whole weight's: torchtitan converts before
  // it shards): the shapes whose float8 GEMMs torchao's H100 tables show slower than bf16 stay bf16.
  const int64_t K = in, N = out;
  if (t.fp8 == Fp8Recipe::kTensorwise) return !(K <= 4096 && N <= 1024);
  return !(N <= 2048 || K <= 1024 || (N <= 4096 && K <= 2048));
}

const char* name_of(Norm n) {
  return n == Norm::kRms ? "rmsnorm" : "layernorm";
}
const char* name_of(Activation a) {
  return a == Activation::kSwiGlu ? "swiglu" : "gelu";
}
const char* name_of(PosEmb p) {
  return p == PosEmb::kRope ? "rope" : "learned";
}
const char* name_of(PpSchedule s) {
  constexpr const char* k[] = {"1f1b", "afab", "interleaved"};
  return k[static_cast<int>(s)];
}
const char* name_of(AttentionImpl a) {
  return a == AttentionImpl::kFlash ? "flash" : "eager";
}
const char* name_of(Impl i) {
  constexpr const char* k[] = {"nanotron", "megatron", "fused", "hf", "torchtitan"};
  return k[static_cast<int>(i)];
}
const char* name_of(Optimizer o) {
  constexpr const char* k[] = {"adamw", "sgd", "none"};
  return k[static_cast<int>(o)];
}
const char* name_of(LossFusion l) {
  constexpr const char* k[] = {"none", "native", "te"};
  return k[static_cast<int>(l)];
}
const char* name_of(Recompute r) {
  constexpr const char* k[] = {"none", "selective", "full", "auto", "selective-op"};
  return k[static_cast<int>(r)];
}

namespace {
template <typename E, size_t N>
Result<E> pick(std::string_view flag, std::string_view text, const std::array<E, N>& all) {
  std::string valid;
  for (E e : all) {
    if (text == name_of(e)) return e;
    valid += (valid.empty() ? "" : ", ") + std::string(name_of(e));
  }
  return make_error("invalid " + std::string(flag) + " " + quote_input(text) + " (valid: " + valid +
                    ")");
}
}  // namespace

template <>
Result<PpSchedule> parse_enum(std::string_view f, std::string_view t) {
  return pick(f, t, std::array{PpSchedule::k1F1B, PpSchedule::kAfab, PpSchedule::kInterleaved});
}
template <>
Result<AttentionImpl> parse_enum(std::string_view f, std::string_view t) {
  return pick(f, t, std::array{AttentionImpl::kFlash, AttentionImpl::kEager});
}
template <>
Result<Impl> parse_enum(std::string_view f, std::string_view t) {
  return pick(f, t,
              std::array{Impl::kNanotron, Impl::kMegatron, Impl::kFused, Impl::kHf,
                         Impl::kTorchtitan});
}
template <>
Result<Fp8Recipe> parse_enum(std::string_view f, std::string_view t) {
  return pick(f, t,
              std::array{Fp8Recipe::kNone, Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise,
                         Fp8Recipe::kRowwiseGwHp, Fp8Recipe::kDelayed});
}
template <>
Result<LossFusion> parse_enum(std::string_view f, std::string_view t) {
  return pick(f, t, std::array{LossFusion::kNone, LossFusion::kNative, LossFusion::kTe});
}
template <>
Result<Optimizer> parse_enum(std::string_view f, std::string_view t) {
  return pick(f, t, std::array{Optimizer::kAdamW, Optimizer::kSgd, Optimizer::kNone});
}
template <>
Result<Recompute> parse_enum(std::string_view f, std::string_view t) {
  return pick(
      f, t,
      std::array{Recompute::kNone, Recompute::kSelective, Recompute::kSelectiveOp,
                 Recompute::kFull, Recompute::kAuto});
}
template <>
Result<Dtype> parse_enum(std::string_view f, std::string_view t) {
  return pick(f, t, std::array{Dtype::kBf16, Dtype::kFp32});
}
template <>
Result<Norm> parse_enum(std::string_view f, std::string_view t) {
  return pick(f, t, std::array{Norm::kRms, Norm::kLayer});
}
template <>
Result<Activation> parse_enum(std::string_view f, std::string_view t) {
  return pick(f, t, std::array{Activation::kSwiGlu, Activation::kGelu});
}
template <>
Result<PosEmb> parse_enum(std::string_view f, std::string_view t) {
  return pick(f, t, std::array{PosEmb::kRope, PosEmb::kLearned});
}

namespace {
std::string str(int64_t v) {
  return std::to_string(v);
}
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
constexpr double kMaxCapacityFactor = 64;
constexpr int64_t kMaxMtpDepths = 16;

std::optional<Error> fail(std::string message) {
  return make_error(std::move(message));
}

std::optional<Error> check_tp(const ModelSpec& m, const TrainSpec& t) {
  auto divides = [&](int64_t what, const char* name) -> std::optional<Error> {
    if (what % t.tp == 0) return std::nullopt;
    return fail("--tp " + str(t.tp) + " does not divide " + name + " " + str(what) + " of " +
                m.name + "; valid tp values divide heads " + str(m.heads) + ", kv heads " +
                str(m.kv_heads) + ", FFN and vocab");
  };
  if (m.kv_heads < t.tp)
    return fail("--tp " + str(t.tp) + " exceeds the " + str(m.kv_heads) + " kv heads of " + m.name +
                " (nanotron requires kv_heads >= tp); use --tp <= " + str(m.kv_heads));
  if (auto e = divides(m.heads, "heads")) return e;
  if (auto e = divides(m.kv_heads, "kv heads")) return e;
  if (auto e = divides(m.ffn, "FFN size")) return e;
  if (m.moe) {
    if (auto e = divides(m.moe->expert_ffn, "expert FFN size")) return e;
    if (auto e = divides(m.moe->shared_ffn, "shared-expert FFN size")) return e;
  }
  if (t.impl == Impl::kMegatron) return std::nullopt;  // padded to a multiple of 128 tp
  return divides(m.vocab, "vocab size");
}

}  // namespace

int64_t mtp_depths(const ModelSpec& m, const TrainSpec& t) {
  return t.mtp_layers >= 0 ? t.mtp_layers : m.mtp_layers;
}

int64_t padded_vocab(const ModelSpec& m, const TrainSpec& t) {
  if (t.impl != Impl::kMegatron) return m.vocab;
  int64_t multiple = t.vocab_multiple * t.tp;
  return (m.vocab + multiple - 1) / multiple * multiple;
}

namespace {

std::optional<Error> check_positive(const TrainSpec& t) {
  const std::pair<const char*, int64_t> sizes[] = {{"--tp", t.tp},
                                                   {"--pp", t.pp},
                                                   {"--dp", t.dp},
                                                   {"--ep", t.ep},
                                                   {"--cp", t.cp},
                                                   {"--micro-batch", t.micro_batch},
                                                   {"--seq-len", t.seq_len},
                                                   {"--microbatches", t.microbatches},
                                                   {"--virtual-stages", t.virtual_stages}};
  for (auto [flag, v] : sizes)
    if (v <= 0) return fail(std::string(flag) + " must be a positive integer, got " + str(v));
  if (t.zero < 0 || t.zero > 3)
    return fail("--zero " + str(t.zero) + " is invalid (valid: 0, 1, 2, 3)");
  // Limits that keep every byte count well inside 64 bits and the schedule simulable.
  if (t.seq_len > (int64_t{1} << 24) / t.micro_batch)
    return fail("--seq-len " + str(t.seq_len) + " x --micro-batch " + str(t.micro_batch) +
                " is more than 16,777,216 tokens per micro-batch (valid: at most 16,777,216)");
  if (t.microbatches > 65536)
    return fail("--microbatches " + str(t.microbatches) + " is too many (valid: at most 65,536)");
  const std::pair<const char*, int64_t> degrees[] = {
      {"--tp", t.tp}, {"--pp", t.pp}, {"--ep", t.ep},
      {"--dp", t.dp}, {"--cp", t.cp}, {"--virtual-stages", t.virtual_stages}};
  for (auto [flag, v] : degrees) {
    int64_t most = std::string(flag) == "--dp" ? (1 << 20) : 4096;
    if (v > most)
      return fail(std::string(flag) + " " + str(v) + " is out of range (valid: at most " +
                  str(most) + ")");
  }
  return std::nullopt;
}

// FSDP2 (torchtitan's rules where it has them: torchtitan/distributed/parallel_dims.py).
std::optional<Error> check_fsdp(const TrainSpec& t) {
  if (t.dp_replicate < 1 || t.dp_replicate > t.dp || t.dp % t.dp_replicate != 0)
    return fail("--dp-replicate " + str(t.dp_replicate) + " must divide --dp " + str(t.dp) +
                " (HSDP: dp = replicas x shards; valid: a divisor of " + str(t.dp) + ")");
  if (!t.fsdp) {
    if (t.dp_replicate != 1)
      return fail("--dp-replicate " + str(t.dp_replicate) +
                  " is HSDP's replica degree and needs --fsdp (use --dp-replicate 1)");
    if (!t.reshard_after_forward)
      return fail("--reshard-after-forward off is FSDP's and needs --fsdp");
    return std::nullopt;
  }
  if (t.zero != 0)
    return fail("--fsdp conflicts with --zero " + str(t.zero) +
                " (FSDP2 shards the parameters, gradients and optimizer states itself); use "
                "--zero 0");
  if (t.pp == 1 && t.pp_schedule != PpSchedule::k1F1B && t.microbatches > 1)
    return fail(std::string("--fsdp runs each micro-batch's forward and backward in turn, as "
                            "torchtitan does; --pp-schedule ") +
                name_of(t.pp_schedule) + " holds every micro-batch's activations (use "
                "--pp-schedule 1f1b)");
  if (t.grad_dtype != Dtype::kFp32)
    return fail("--fsdp reduces gradients in fp32 into fp32 shards (torchtitan's "
                "mixed_precision_reduce takes float32 only); use --grad-accum-dtype fp32");
  if (t.pp_schedule == PpSchedule::kInterleaved)
    return fail("--fsdp with --pp-schedule interleaved is not modelled yet (torch.distributed."
                "pipelining gathers every chunk's units ahead and reduces each chunk after its own "
                "last backward); use --pp-schedule 1f1b or afab");
  if (t.pp > 1 && t.reshard_after_forward)
    return fail("--fsdp with --pp " + str(t.pp) +
                " keeps each unit's weights gathered from its first forward to the step's "
                "reduce (torchtitan's default with PP); --reshard-after-forward on is not "
                "modelled there (use --reshard-after-forward off)");
  if (t.ep > 1)
    return fail("--fsdp with --ep " + str(t.ep) +
                " is not modelled yet (torchtitan shards experts over their own mesh); use --ep 1");
  return std::nullopt;
}

std::optional<Error> check_conflicts(const ModelSpec& m, const TrainSpec& t) {
  if (t.sp && t.tp == 1)
    return fail(
        "--sp on needs --tp > 1 (sequence parallelism shards over the TP group); use --sp off or "
        "raise --tp");
  if (t.zero >= 2 && t.pp > 1)
    return fail("--zero " + str(t.zero) + " conflicts with --pp " + str(t.pp) +
                " (ZeRO-2/3 shard gradients that pipeline micro-batches keep accumulating); use "
                "--zero 0 or 1 with pp > 1");
  if (t.zero >= 1 && t.dp * t.cp == 1 && t.optimizer != Optimizer::kNone)
    return fail("--zero " + str(t.zero) +
                " shards over data parallelism (and context parallelism) and needs --dp > 1 or "
                "--cp > 1 (use --zero 0 with --dp 1)");
  if (t.zero >= 1 && t.optimizer == Optimizer::kNone)
    return fail("--zero " + str(t.zero) +
                " conflicts with --optimizer none (no optimizer states to shard); use --zero 0 or "
                "pick an optimizer");
  if (auto e = check_fsdp(t)) return e;
  if (t.recompute_every < 1 || t.recompute_every > (1 << 20))
    return fail("--recompute-every " + str(t.recompute_every) +
                " is out of range (valid: 1 to 1,048,576)");
  if (t.recompute_every > 1 && t.recompute != Recompute::kFull)
    return fail("--recompute-every " + str(t.recompute_every) + " picks the layers of --recompute "
                "full; got --recompute " + name_of(t.recompute) +
                " (use --recompute full, or --recompute-every 1)");
  if (m.moe && t.tp > 1 && !t.sp)
    return fail("MoE model " + m.name + " with --tp " + str(t.tp) +
                " needs --sp on (as Megatron requires: the router works on sequence shards)");
  if (m.mla && t.cp > 1)
    return fail("--cp " + str(t.cp) + ": context parallelism of multi-head latent attention (" +
                m.name + ") is not modelled yet; use --cp 1");
  if (t.ep > 1 && !m.moe)
    return fail("--ep " + str(t.ep) + " needs an MoE model; " + m.name + " is dense (use --ep 1)");
  return std::nullopt;
}

// The interleaved schedule's rules (Megatron's): v >= 2 chunks per stage over pp >= 2 stages, a
// layer per chunk, m a multiple of pp, layers balanced over the chunks.
std::optional<Error> check_interleaved(const ModelSpec& m, const TrainSpec& t) {
  const int64_t v = t.virtual_stages;
  if (t.pp_schedule != PpSchedule::kInterleaved) {
    if (v != 1)
      return fail("--virtual-stages " + str(v) +
                  " needs --pp-schedule interleaved (1f1b and afab "
                  "run one chunk per stage); use --virtual-stages 1 or --pp-schedule interleaved");
    return std::nullopt;
  }
  if (t.pp < 2)
    return fail("--pp-schedule interleaved needs --pp >= 2 (got --pp " + str(t.pp) +
                "); use --pp-schedule 1f1b or raise --pp");
  if (v < 2)
    return fail(
        "--pp-schedule interleaved needs --virtual-stages >= 2 (with 1 it is 1f1b); use "
        "--virtual-stages 2 or more");
  if (t.pp * v > m.layers)
    return fail("--pp " + str(t.pp) + " x --virtual-stages " + str(v) + " = " + str(t.pp * v) +
                " chunks exceed the " + str(m.layers) + " layers of " + m.name +
                " (valid: pp x virtual stages <= " + str(m.layers) + ")");
  if (t.microbatches % t.pp != 0)
    return fail("--microbatches " + str(t.microbatches) + " is not a multiple of --pp " +
                str(t.pp) + " under the interleaved schedule (as Megatron requires); use " +
                str((t.microbatches + t.pp - 1) / t.pp * t.pp));
  if (!t.stage_layers.empty())
    return fail(
        "--partition lists layers per stage, but the interleaved schedule splits the "
        "layers into pp x virtual stages balanced chunks; use --partition balanced");
  return std::nullopt;
}

std::optional<Error> check_moe(const ModelSpec& m, const TrainSpec& t) {
  const double cf = t.moe_capacity_factor;
  if (!(cf == 0 || (cf > 0 && cf <= kMaxCapacityFactor)))
    return fail("--moe-capacity-factor " + num(cf) +
                " is invalid (valid: 0 for dropless routing, or a factor in (0, 64])");
  if (cf > 0 && !m.moe)
    return fail("--moe-capacity-factor needs an MoE model; " + m.name +
                " is dense (leave it at 0)");
  if (!m.moe) return std::nullopt;
  if (m.moe->num_experts % t.ep != 0)
    return fail("--ep " + str(t.ep) + " does not divide the " + str(m.moe->num_experts) +
                " experts of " + m.name + "; valid ep values divide the expert count");
  if (t.dp % t.ep != 0)
    return fail(
        "--ep " + str(t.ep) + " does not divide --dp " + str(t.dp) +
        " (expert parallelism is carved out of data parallelism); use an ep that divides dp");
  return std::nullopt;
}
}  // namespace

bool is_model_name(std::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' &&
        c != '+' && c != '/')
      return false;
  return true;
}

std::optional<Error> validate_model(const ModelSpec& m) {
  // Names and display names appear in every message and table: plain printable ASCII only.
  if (!is_model_name(m.name))
    return fail("model name " + quote_input(m.name) +
                " is invalid (valid: 1 to 128 letters, digits, '.', '_', '-', '+', '/')");
  for (const std::string& a : m.aliases)
    if (!is_model_name(a))
      return fail("model " + m.name + ": alias " + quote_input(a) +
                  " is invalid (valid: 1 to 128 letters, digits, '.', '_', '-', '+', '/')");
  if (m.display_name.size() > 128 ||
      std::any_of(m.display_name.begin(), m.display_name.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f;
      }))
    return fail("model " + m.name + ": display_name " + quote_input(m.display_name) +
                " is invalid (valid: up to 128 printable ASCII characters)");
  const std::pair<const char*, int64_t> sizes[] = {
      {"hidden_size", m.hidden},    {"intermediate_size", m.ffn},
      {"num_layers", m.layers},     {"num_heads", m.heads},
      {"num_kv_heads", m.kv_heads}, {"head_dim", m.head_dim},
      {"vocab_size", m.vocab},      {"max_position_embeddings", m.max_positions}};
  for (auto [key, v] : sizes)
    if (v <= 0)
      return fail("model " + m.name + ": " + key + " must be a positive integer, got " + str(v));
  const std::pair<const char*, int64_t> limits[] = {{"hidden_size", 1 << 20},
                                                    {"intermediate_size", 1 << 22},
                                                    {"num_layers", 10000},
                                                    {"num_heads", 1 << 16},
                                                    {"head_dim", 1 << 16},
                                                    {"vocab_size", 1 << 24},
                                                    {"max_position_embeddings", 1 << 24}};
  const int64_t values[] = {m.hidden,   m.ffn,   m.layers,       m.heads,
                            m.head_dim, m.vocab, m.max_positions};
  for (size_t i = 0; i < std::size(limits); ++i)
    if (values[i] > limits[i].second)
      return fail("model " + m.name + ": " + limits[i].first + " " + str(values[i]) +
                  " is out of range (valid: at most " + str(limits[i].second) + ")");
  if (m.heads % m.kv_heads != 0)
    return fail("model " + m.name + ": num_heads " + str(m.heads) +
                " is not a multiple of num_kv_heads " + str(m.kv_heads));
  if (m.dropout < 0.0 || m.dropout >= 1.0)
    return fail("model " + m.name + ": dropout must be in [0, 1), got " +
                std::to_string(m.dropout));
  if (m.moe) {
    const MoeSpec& e = *m.moe;
    if (e.num_experts <= 0 || e.top_k <= 0 || e.expert_ffn <= 0 || e.shared_ffn < 0)
      return fail("model " + m.name +
                  ": [moe] needs positive num_experts, top_k and expert_intermediate_size");
    if (e.top_k > e.num_experts)
      return fail("model " + m.name + ": [moe] top_k " + str(e.top_k) + " exceeds num_experts " +
                  str(e.num_experts));
    const RouterSpec& r = e.router;
    if (r.groups < 1 || r.groups > e.num_experts || e.num_experts % r.groups != 0)
      return fail("model " + m.name + ": [moe] groups " + str(r.groups) +
                  " must divide num_experts " + str(e.num_experts) + " (valid: 1 for none)");
    // Each group is scored by the sum of its top_k / topk_groups best scores, rounded down
    // (Megatron-LM's group_limited_topk, megatron/core/transformer/moe/moe_utils.py at 23e00ed:
    // topk(topk // group_topk)), so top_k need not be a multiple of topk_groups.
    if (r.topk_groups < 1 || r.topk_groups > r.groups || r.topk_groups > e.top_k ||
        e.top_k > r.topk_groups * (e.num_experts / r.groups))
      return fail("model " + m.name + ": [moe] topk_groups " + str(r.topk_groups) +
                  " must be in [1, groups " + str(r.groups) + "], at most top_k " +
                  str(e.top_k) + ", and leave top_k experts in the chosen groups");
    if (!(r.scaling > 0.0 && r.scaling <= 1e6))
      return fail("model " + m.name + ": [moe] routed_scaling_factor " + std::to_string(r.scaling) +
                  " is out of range (valid: (0, 1e6])");
  }
  if (m.mla) {
    const MlaSpec& a = *m.mla;
    const std::pair<const char*, int64_t> mla[] = {{"q_lora_rank", a.q_lora_rank},
                                                   {"kv_lora_rank", a.kv_lora_rank},
                                                   {"qk_nope_head_dim", a.qk_nope_head_dim},
                                                   {"qk_rope_head_dim", a.qk_rope_head_dim},
                                                   {"v_head_dim", a.v_head_dim}};
    for (auto [key, v] : mla)
      if (v < (key == mla[0].first ? 0 : 1) || v > (1 << 16))
        return fail("model " + m.name + ": [mla] " + key + " " + str(v) +
                    " is out of range (valid: 1 to 65536" +
                    (key == mla[0].first ? "; 0 for a direct q projection)" : ")"));
    if (a.qk_rope_head_dim % 2 != 0)
      return fail("model " + m.name + ": [mla] qk_rope_head_dim " + str(a.qk_rope_head_dim) +
                  " must be even (RoPE rotates pairs)");
    if (m.head_dim != a.qk_nope_head_dim + a.qk_rope_head_dim || m.kv_heads != m.heads)
      return fail("model " + m.name + ": [mla] needs head_dim = qk_nope_head_dim + " +
                  "qk_rope_head_dim (" + str(a.qk_nope_head_dim + a.qk_rope_head_dim) +
                  ") and num_kv_heads = num_heads");
    if (m.position != PosEmb::kRope || m.qkv_bias || m.qk_norm)
      return fail("model " + m.name +
                  ": [mla] has its own RoPE part and norms (valid: position_embedding = "
                  "\"rope\", qkv_bias = false, qk_norm = false)");
  }
  if (m.mtp_layers < 0 || m.mtp_layers > kMaxMtpDepths)
    return fail("model " + m.name + ": mtp_layers " + str(m.mtp_layers) + " is out of range (valid: 0 to " +
                str(kMaxMtpDepths) + ")");
  if (!m.dense_layers.empty()) {
    if (!m.moe)
      return fail("model " + m.name + ": dense_layers needs [moe] (the other layers' MLP)");
    for (size_t i = 0; i < m.dense_layers.size(); ++i)
      if (m.dense_layers[i] < 0 || m.dense_layers[i] >= m.layers ||
          (i > 0 && m.dense_layers[i] <= m.dense_layers[i - 1]))
        return fail("model " + m.name +
                    ": dense_layers must be ascending layer indices from 0 to " +
                    str(m.layers - 1) + ", got " + str(m.dense_layers[i]));
    if (static_cast<int64_t>(m.dense_layers.size()) == m.layers)
      return fail("model " + m.name + ": dense_layers lists every layer; drop [moe] instead");
  }
  return std::nullopt;
}

std::optional<Error> check_fp8_profile(const TrainSpec& t) {
  if (t.fp8 == Fp8Recipe::kNone) return std::nullopt;
  const std::string fp8 = std::string("--fp8 ") + name_of(t.fp8);
  const bool te = t.fp8 == Fp8Recipe::kDelayed || t.fp8 == Fp8Recipe::kTensorwise;
  if (t.impl == Impl::kMegatron && !te)
    return fail(fp8 + " under --impl megatron: Transformer Engine's recipes modelled are "
                      "delayed and tensorwise (Megatron's --fp8-recipe); use one of them, or "
                      "--impl torchtitan for torchao's " + name_of(t.fp8));
  if (t.impl == Impl::kTorchtitan && t.fp8 == Fp8Recipe::kDelayed)
    return fail("--fp8 delayed is Transformer Engine's recipe, under --impl megatron; "
                "torchao's recipes: tensorwise, rowwise, rowwise_with_gw_hp");
  if (t.impl != Impl::kMegatron && t.impl != Impl::kTorchtitan)
    return fail(fp8 + ": float8 linears are modelled as torchao's and Transformer Engine's; "
                      "use --impl torchtitan (torchao: tensorwise, rowwise, rowwise_with_gw_hp) "
                      "or --impl megatron (TE: delayed, tensorwise), or --fp8 none");
  return std::nullopt;
}

std::optional<Error> validate_setup(const ModelSpec& m, const TrainSpec& t) {
  if (auto e = check_positive(t)) return e;
  if (auto e = check_conflicts(m, t)) return e;
  if (auto e = check_tp(m, t)) return e;
  if (auto e = check_moe(m, t)) return e;
  if (mtp_depths(m, t) > kMaxMtpDepths)
    return fail("--mtp-layers " + str(mtp_depths(m, t)) + " is too many (valid: 0 to " +
                str(kMaxMtpDepths) + ")");
  if (mtp_depths(m, t) > 0 && m.position == PosEmb::kLearned)
    return fail(m.name + " has learned position embeddings, which multi-token prediction does "
                "not model (valid: --mtp-layers 0)");
  if (!(t.mtp_loss_scale >= 0 && t.mtp_loss_scale <= 1e3))
    return fail("the MTP loss scale " + num(t.mtp_loss_scale) + " is out of range (valid: 0 "
                "to 1000)");
  if (!t.stage_layers.empty()) {
    int64_t sum = 0;
    for (int64_t n : t.stage_layers) {
      if (n < 1)
        return fail("--partition gives a stage " + str(n) +
                    " layers (valid: at least 1 layer per stage)");
      sum += n;
    }
    if (static_cast<int64_t>(t.stage_layers.size()) != t.pp)
      return fail("--partition lists " + str(static_cast<int64_t>(t.stage_layers.size())) +
                  " stages for --pp " + str(t.pp) + " (valid: one layer count per stage)");
    if (sum != m.layers)
      return fail("--partition places " + str(sum) + " layers, but " + m.name + " has " +
                  str(m.layers) + " (valid: counts that sum to " + str(m.layers) + ")");
  }
  int64_t most = (m.layers + t.pp - 1) / t.pp;
  for (int64_t n : t.stage_layers) most = std::max(most, n);
  if (t.pp_schedule == PpSchedule::kAfab && t.pp <= m.layers && t.microbatches * most > (1 << 18))
    return fail("--microbatches " + str(t.microbatches) +
                " is too many to simulate under AFAB (valid: micro-batches x layers per stage at "
                "most 262,144; 1F1B has no such limit)");
  if (t.pp > m.layers)
    return fail("--pp " + str(t.pp) + " exceeds the " + str(m.layers) + " layers of " + m.name +
                "; use --pp <= " + str(m.layers));
  if (t.cp > 1 && t.seq_len % (2 * t.cp) != 0)
    return fail("--seq-len " + str(t.seq_len) + " is not divisible by 2 x --cp " + str(t.cp) +
                " (context parallelism splits each sequence into 2 cp load-balanced chunks); use a "
                "multiple of " +
                str(2 * t.cp));
  if (t.loss_fusion != LossFusion::kNone && t.impl != Impl::kMegatron)
    return fail(std::string("--cross-entropy-fusion ") + name_of(t.loss_fusion) +
                " is Megatron's and needs --impl megatron; use --cross-entropy-fusion none");
  if (t.vocab_multiple < 1 || t.vocab_multiple > (1 << 20))
    return fail("--make-vocab-size-divisible-by " + str(t.vocab_multiple) +
                " is out of range (valid: 1 to 1,048,576)");
  if (t.vocab_multiple != 128 && t.impl != Impl::kMegatron)
    return fail("--make-vocab-size-divisible-by is Megatron's and needs --impl megatron (the other "
                "profiles hold the vocabulary unpadded)");
  // Megatron's validate_args (megatron/training/arguments.py, 307dcf3): the parameter gather
  // overlaps only with the distributed optimizer and with the gradient reduction overlapped.
  if (t.overlap_param_gather && t.zero < 1)
    return fail("--overlap-param-gather on needs --zero 1 or more (Megatron's distributed "
                "optimizer); use --overlap-param-gather off");
  if (t.overlap_param_gather && !t.overlap_grad_reduce)
    return fail("--overlap-param-gather on needs --overlap-grad-reduce on, as Megatron requires");
  // Megatron's validate_args (megatron/training/arguments.py at NVIDIA/Megatron-LM d98e8a6, L1441):
  // "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is
  // enabled"; the userbuffers are Transformer Engine's.
  if (t.tp_comm_overlap && t.impl != Impl::kMegatron)
    return fail("--tp-comm-overlap on is Transformer Engine's under Megatron and needs --impl "
                "megatron; use --tp-comm-overlap off");
  if (t.tp_comm_overlap && (!t.sp || t.tp < 2))
    return fail("--tp-comm-overlap on needs --tp 2 or more and --sp on, as Megatron requires; "
                "use --tp-comm-overlap off");
  if (!t.dataloader_mask && t.impl != Impl::kMegatron)
    return fail("--dataloader-attention-mask off is Megatron's and needs --impl megatron; use "
                "--dataloader-attention-mask on");
  if (!t.grad_accum_fusion && t.impl != Impl::kMegatron)
    return fail("--gradient-accumulation-fusion off is Megatron's and needs --impl megatron; use "
                "--gradient-accumulation-fusion on");
  if (t.cp > 1 && t.impl == Impl::kHf)
    return fail("--cp " + str(t.cp) +
                " needs --impl nanotron, megatron or fused (Hugging Face's Llama has no context "
                "parallelism)");
  if (t.impl == Impl::kTorchtitan) {
    // The profile is torchtitan's Llama 3 and dense Qwen3 (graph.cpp, titan_attention): its
    // other models' code (deepseek_v3's MLA, the MoE layers) is not in it yet.
    std::string what = m.mla        ? "multi-head latent attention"
                       : m.moe      ? "MoE layers"
                       : m.norm != Norm::kRms ? "LayerNorm"
                       : m.activation != Activation::kSwiGlu ? "a GeLU MLP"
                       : m.position != PosEmb::kRope ? "learned positions"
                       : m.dropout > 0 ? "dropout"
                                       : "";
    if (!what.empty())
      return fail("--impl torchtitan is torchtitan's Llama 3 and Qwen3 code, and " + m.name +
                  " has " + what +
                  " (valid: a dense Llama- or Qwen3-style model; use --impl fused, nanotron, "
                  "megatron or hf)");
    if (t.attention != AttentionImpl::kFlash || t.cp > 1)
      return fail("--impl torchtitan runs SDPA's flash kernel at --cp 1 (its context parallelism "
                  "is not modelled); use --attention flash --cp 1, or --impl fused or nanotron");
    if (t.tp > 1 && !t.sp)
      return fail("--impl torchtitan runs tensor parallelism with sequence parallelism, as "
                  "torchtitan does; use --sp on");
  }
  if (t.fp8 == Fp8Recipe::kNone && !t.fp8_filter.empty())
    return fail("--fp8-filter names the linears --fp8 keeps in bf16; add --fp8 tensorwise or "
                "rowwise, or drop --fp8-filter");
  if (t.fp8_all_gather && t.fp8 != Fp8Recipe::kTensorwise)
    return fail(std::string("--fp8-all-gather casts the float8 linears' weight shards before "
                            "FSDP's all-gather, which torchao does for the tensorwise recipe only") +
                (t.fp8 == Fp8Recipe::kNone ? "; add --fp8 tensorwise" : "; use --fp8 tensorwise") +
                ", or drop --fp8-all-gather");
  if (t.fp8_all_gather && (!t.fsdp || t.fsdp_shards() == 1))
    return fail("--fp8-all-gather is FSDP's float8 all-gather and needs a shard group: add --fsdp "
                "with dp / --dp-replicate above 1, or drop --fp8-all-gather (torchtitan turns it "
                "off without one)");
  if (t.fp8_param_gather && !te_fp8(t))
    return fail("--fp8-param-gather keeps Transformer Engine's linears' weights in float8, under "
                "--impl megatron with --fp8 delayed or tensorwise; add those, or drop "
                "--fp8-param-gather");
  if (t.fp8_param_gather && t.zero < 1 && t.dp * t.cp > 1)
    return fail("--fp8-param-gather needs Megatron's distributed optimizer (its arguments.py "
                "asserts it): add --zero 1, or drop --fp8-param-gather");
  if (te_fp8(t)) {
    // Transformer Engine's float8 linears in Megatron's TE layer spec (te_fp8; ops.hpp).
    std::string fp8 = std::string("--fp8 ") + name_of(t.fp8);
    if (auto e = check_fp8_profile(t)) return e;
    if (m.moe)
      return fail(fp8 + " with an MoE model under --impl megatron (Transformer Engine's grouped "
                        "expert linears in float8) is not modelled; use --fp8 none");
    if (m.mla)
      return fail(fp8 + " with multi-head latent attention under --impl megatron (its TE "
                        "linears in float8) is not modelled; use --fp8 none");
    if (t.fsdp)
      return fail(fp8 + " under --impl megatron is modelled with Megatron's data parallelism; "
                        "drop --fsdp, or use --impl torchtitan");
    if (t.tp_comm_overlap)
      return fail(fp8 + " with --tp-comm-overlap (Transformer Engine's userbuffers holding "
                        "float8) is not modelled; use --tp-comm-overlap off");
    if (t.sp && t.tp > 1 && !t.tp_recompute_allgather)
      return fail(fp8 + " under SP: Transformer Engine keeps each LayerNorm-linear's float8 "
                        "shard and all-gathers it again in backward; use --tp-recompute-allgather "
                        "on");
    if (!t.fp8_filter.empty())
      return fail("--fp8-filter is torchtitan's (filter_fqns); Megatron's float8 covers every "
                  "TE linear of the decoder layers: drop --fp8-filter");
    // assert_dim_for_fp8_exec (NVIDIA/TransformerEngine d0067d0, pytorch/utils.py): each GEMM
    // input's rows a multiple of 8 and its features of 16.
    const int64_t rows = t.seq_len / t.cp * t.micro_batch / (t.sp ? t.tp : 1);
    const int64_t q = m.heads * m.head_dim / t.tp, kv = m.kv_heads * m.head_dim / t.tp;
    const int64_t ffn = m.ffn / t.tp;
    for (auto [what, n, mult] :
         {std::tuple<const char*, int64_t, int64_t>{"tokens per rank", rows, 8},
          {"hidden", m.hidden, 16},
          {"qkv output features per rank", q + 2 * kv, 8},
          {"attention output features per rank", q, 16},
          {"FFN features per rank", ffn, 16}})
      if (n % mult != 0)
        return fail(fp8 + ": Transformer Engine's float8 GEMMs need " + what + " (" + str(n) +
                    ") a multiple of " + str(mult) + "; use --fp8 none or change the sizes");
  } else if (t.fp8 != Fp8Recipe::kNone) {
    // torchao's Float8Linear as torchtitan converts the linears (float8_linear, above).
    std::string fp8 = std::string("--fp8 ") + name_of(t.fp8);
    if (auto e = check_fp8_profile(t)) return e;
    if (!t.fsdp)
      return fail(fp8 + " is modelled under FSDP2, torchtitan's data parallelism; add --fsdp, "
                        "or use --fp8 none");
    // torchtitan 238fa99, models/llama3/infra/parallelize.py: float8 all-gathers under TP for
    // the tensorwise recipe only; rowwise recipes run plain TP with float8 linears on DTensor
    // shards (their maxima over split dimensions reduced across TP: fp8_max_over_tp).
    if (float8_tp(t)) {
      if (t.recompute == Recompute::kSelectiveOp)
        return fail("--recompute selective-op with torchao's float8 tensor parallelism (what its "
                    "policy keeps of the float8 all-gathers) is not modelled; use --recompute "
                    "none or full (with --recompute-every), or --tp 1");
      // Float8ColwiseParallel and Float8RowwiseParallel (torchao 36027d8,
      // float8_tensor_parallel.py, _apply) raise unless the module is a Float8Linear.
      const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
      for (auto [fqn, in, out] :
           {std::tuple<const char*, int64_t, int64_t>{"attention.wq", m.hidden, q},
            {"attention.wk", m.hidden, kv},
            {"attention.wv", m.hidden, kv},
            {"attention.wo", q, m.hidden},
            {"feed_forward.w1", m.hidden, m.ffn},
            {"feed_forward.w3", m.hidden, m.ffn},
            {"feed_forward.w2", m.ffn, m.hidden}})
        if (!float8_linear(t, fqn, in, out))
          return fail(std::string(fqn) + " stays bf16 under " + fp8 + " (a dimension not a "
                      "multiple of 16, or a filter), and torchao's float8 TP takes only float8 "
                      "linears (Float8ColwiseParallel raises); drop the filter on it, or use "
                      "--tp 1");
    }
    // torchao 36027d8, float8_linear_utils.py, _auto_filter_for_recipe: NotImplementedError.
    if (t.fp8 == Fp8Recipe::kRowwiseGwHp &&
        std::find(t.fp8_filter.begin(), t.fp8_filter.end(), kFp8AutoFilter) !=
            t.fp8_filter.end())
      return fail("--fp8-filter auto_filter_small_kn has no rule for rowwise_with_gw_hp (torchao "
                  "raises NotImplementedError); name the modules to keep in bf16, or use --fp8 "
                  "tensorwise or rowwise");
    for (const std::string& f : t.fp8_filter)
      if (f.find("layers") != std::string::npos)
        return fail("the float8 filter " + quote_input(f) +
                    " names layers by index, and nanoplan's decoder layers share one graph; "
                    "name a module of every layer (valid: e.g. attention.wq, feed_forward.w2, "
                    "output)");
  }
  if (t.cp > 1 && t.attention != AttentionImpl::kFlash)
    return fail("--cp " + str(t.cp) +
                " needs --attention flash (context parallelism exchanges "
                "K/V inside the fused attention kernel, as Megatron's does)");
  if (t.sp && (t.seq_len / t.cp) % t.tp != 0)
    return fail("--seq-len " + str(t.seq_len) + (t.cp > 1 ? " / --cp " + str(t.cp) : "") +
                " is not divisible by --tp " + str(t.tp) +
                " under sequence parallelism; use a multiple of " + str(t.tp * t.cp) +
                " or --sp off");
  if (t.pp_schedule == PpSchedule::k1F1B && t.microbatches < t.pp - 1)
    return fail(
        "--microbatches " + str(t.microbatches) + " is fewer than pp - 1 = " + str(t.pp - 1) +
        " under 1F1B (nanotron requires M >= pp - 1); use --microbatches >= " + str(t.pp - 1) +
        " or --pp-schedule afab");
  if (auto e = check_interleaved(m, t)) return e;
  if (m.position == PosEmb::kLearned && t.seq_len > m.max_positions)
    return fail("--seq-len " + str(t.seq_len) + " exceeds the " + str(m.max_positions) +
                " learned positions of " + m.name + "; use --seq-len <= " + str(m.max_positions));
  return std::nullopt;
}

std::string format_partition(const std::vector<int64_t>& counts) {
  std::string s;
  for (int64_t n : counts) s += (s.empty() ? "" : ",") + std::to_string(n);
  return s;
}

Result<std::vector<int64_t>> parse_partition(std::string_view text) {
  return parse_count_list("--partition", text,
                          "balanced, auto, or layer counts such as 21,20,20,19");
}

Result<std::vector<int64_t>> parse_count_list(std::string_view flag, std::string_view text,
                                              std::string_view valid) {
  auto bad = [&] {
    return make_error("invalid " + std::string(flag) + " " + quote_input(text) +
                      " (valid: " + std::string(valid) + ")");
  };
  std::vector<int64_t> counts;
  size_t start = 0;
  while (true) {
    size_t end = std::min(text.find(',', start), text.size());
    std::string_view item = text.substr(start, end - start);
    int64_t n = 0;
    if (item.empty() || item.size() > 9) return bad();  // layer counts below 10^9
    for (char c : item) {
      if (c < '0' || c > '9') return bad();
      n = n * 10 + (c - '0');
    }
    counts.push_back(n);
    if (end == text.size()) break;
    start = end + 1;
  }
  return counts;
}

}  // namespace np

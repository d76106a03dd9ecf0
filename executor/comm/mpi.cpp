// One process per rank over MPI (mpi.hpp): the communicator, the per-process runner, and the binary
// form in which each process's report travels to process 0.
#include "executor/comm/mpi.hpp"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <string>
#include <type_traits>
#include <vector>

namespace np::exec::mpi {
namespace {

bool g_initialized = false;

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("MPI: " + what);
}

void ok(int rc, const char* call) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    fail(std::string(call) + " failed: " + std::string(text, static_cast<size_t>(len)));
  }
}

int count_of(int64_t bytes) {
  if (bytes > INT_MAX) fail("a message of " + std::to_string(bytes) + " bytes exceeds MPI's int count");
  return static_cast<int>(bytes);
}

// Collectives as in the in-process world: every rank gathers the group's buffers (host staging,
// outside the device accounting, as NCCL's buffers are) and sums them in rank order in fp32.
class MpiComm final : public Communicator {
 public:
  // dp_rank, dp: in the DP group of dp x cp ranks (replica x cp + CP rank).
  struct Groups {
    MPI_Comm tp, dp, cp, expert_dp, ep;
  };
  MpiComm(Groups groups, int64_t rank, int64_t tp, int64_t dp_rank, int64_t dp, int64_t cp,
          int64_t ep, std::shared_ptr<Transfer> t)
      : group_(groups.tp),
        dp_group_(groups.dp),
        cp_group_(groups.cp),
        expert_dp_group_(groups.expert_dp),
        ep_group_(groups.ep),
        rank_(rank),
        tp_(tp),
        dp_rank_(dp_rank),
        dp_(dp),
        cp_(cp),
        ep_(ep),
        transfer_(std::move(t)) {}
  int64_t tp_rank() const override { return rank_; }
  int64_t tp_size() const override { return tp_; }
  int64_t dp_rank() const override { return dp_rank_; }
  int64_t dp_size() const override { return dp_; }
  int64_t cp_rank() const override { return dp_rank_ % cp_; }
  int64_t cp_size() const override { return cp_; }
  int64_t ep_size() const override { return ep_; }

  void ep_all_to_all(const Tensor& in, const Tensor& out) override {
    if (in.bytes() != out.bytes() || in.bytes() % ep_ != 0)
      fail("ep_all_to_all: input and output must be the same ep row blocks");
    std::vector<unsigned char> mine = to_host(in), got(static_cast<size_t>(in.bytes()));
    int n = count_of(in.bytes() / ep_);
    ok(MPI_Alltoall(mine.data(), n, MPI_BYTE, got.data(), n, MPI_BYTE, ep_group_), "MPI_Alltoall");
    transfer_->copy(out.data, got.data(), out.bytes());
  }

  void cp_all_gather(const Tensor& in, const Tensor& out) override {
    if (out.bytes() != in.bytes() * cp_) fail("cp_all_gather: output must be cp x the input");
    std::vector<unsigned char> mine = to_host(in), all(static_cast<size_t>(out.bytes()));
    gather_on(cp_group_, mine, all);
    transfer_->copy(out.data, all.data(), out.bytes());
  }

  void cp_reduce_scatter(const Tensor& in, const Tensor& out) override {
    if (in.bytes() != out.bytes() * cp_ || in.type.dtype != out.type.dtype)
      fail("cp_reduce_scatter: input must be cp x the output");
    std::vector<unsigned char> mine = to_host(in), all(static_cast<size_t>(in.bytes() * cp_));
    gather_on(cp_group_, mine, all);
    std::vector<const void*> ins;
    for (int64_t q = 0; q < cp_; ++q) ins.push_back(all.data() + q * in.bytes());
    std::vector<unsigned char> result(static_cast<size_t>(out.bytes()));
    host_->sum(Tensor{result.data(), out.type}, 0, ins, cp_rank() * out.numel(), out.numel());
    transfer_->copy(out.data, result.data(), out.bytes());
  }

  // The DP collectives gather the whole tensor from every replica (host staging) and keep the
  // in-process world's arithmetic on the owned ranges.
  void dp_reduce_scatter(DpGroup g, const Tensor& t, int64_t first, int64_t shard) override {
    const int64_t size = group_size(g), me = group_rank(g);
    if (size == 1) return;
    std::vector<unsigned char> mine = to_host(t), all(static_cast<size_t>(t.bytes() * size));
    gather_on(dp_comm(g), mine, all);
    auto [lo, hi] = dp_owned(t, first, shard, me);
    if (hi <= lo) return;
    std::vector<const void*> ins;
    for (int64_t q = 0; q < size; ++q) ins.push_back(all.data() + q * t.bytes());
    host_->sum(Tensor{mine.data(), t.type}, lo, ins, lo, hi - lo);
    int64_t elem = dtype_bytes(t.type.dtype);
    transfer_->copy(t.as<unsigned char>() + lo * elem, mine.data() + lo * elem, (hi - lo) * elem);
  }

  void dp_reduce_scatter_into(DpGroup g, const Tensor& t, int64_t first, int64_t shard,
                              const Tensor& into) override {
    const int64_t size = group_size(g), me = group_rank(g);
    std::vector<unsigned char> mine = to_host(t), all(static_cast<size_t>(t.bytes() * size));
    gather_on(dp_comm(g), mine, all);
    auto [lo, hi] = dp_owned(t, first, shard, me);
    if (hi <= lo) return;
    int64_t e = dtype_bytes(t.type.dtype), at = first + lo - me * shard;
    std::vector<unsigned char> acc = to_host(into);
    std::vector<const void*> ins{acc.data() + at * e};
    for (int64_t q = 0; q < size; ++q) ins.push_back(all.data() + q * t.bytes() + lo * e);
    host_->sum(Tensor{acc.data(), into.type}, at, ins, 0, hi - lo);
    transfer_->copy(into.as<unsigned char>() + at * e, acc.data() + at * e, (hi - lo) * e);
  }

  void dp_all_gather(DpGroup g, const Tensor& t, int64_t first, int64_t shard) override {
    const int64_t size = group_size(g), me = group_rank(g);
    if (size == 1) return;
    std::vector<unsigned char> mine = to_host(t), all(static_cast<size_t>(t.bytes() * size));
    gather_on(dp_comm(g), mine, all);
    int64_t elem = dtype_bytes(t.type.dtype);
    for (int64_t q = 0; q < size; ++q) {
      auto [lo, hi] = dp_owned(t, first, shard, q);
      if (q == me || hi <= lo) continue;
      transfer_->copy(t.as<unsigned char>() + lo * elem, all.data() + q * t.bytes() + lo * elem,
                      (hi - lo) * elem);
    }
  }

  void dp_all_gather_blocks(DpGroup g, const Tensor& t, int64_t shard, int64_t span) override {
    const int64_t size = group_size(g), me = group_rank(g);
    if (size == 1) return;
    std::vector<unsigned char> mine = to_host(t), all(static_cast<size_t>(t.bytes() * size));
    gather_on(dp_comm(g), mine, all);
    const int64_t e = dtype_bytes(t.type.dtype), base = me / span * span;
    for (int64_t q = base; q < base + span; ++q) {
      if (q == me) continue;
      const int64_t at = q % span * shard * e;
      transfer_->copy(t.as<unsigned char>() + at, all.data() + q * t.bytes() + at, shard * e);
    }
  }

  void dp_reduce_scatter_blocks_into(DpGroup g, const Tensor& t, int64_t shard, int64_t span,
                                     const Tensor& into) override {
    const int64_t size = group_size(g), me = group_rank(g);
    std::vector<unsigned char> mine = to_host(t), all(static_cast<size_t>(t.bytes() * size));
    gather_on(dp_comm(g), mine, all);
    const int64_t at = me % span * shard * dtype_bytes(t.type.dtype);
    std::vector<unsigned char> acc = to_host(into);
    std::vector<const void*> ins{acc.data()};
    for (int64_t q = 0; q < size; ++q) ins.push_back(all.data() + q * t.bytes() + at);
    host_->sum(Tensor{acc.data(), into.type}, 0, ins, 0, shard);
    transfer_->copy(into.data, acc.data(), into.bytes());
  }

  void dp_all_reduce_max(DpGroup g, const Tensor& t) override {
    if (t.type.dtype != Dtype::kFp32) fail("dp_all_reduce_max: fp32 only");
    const int64_t size = group_size(g);
    if (size == 1) return;
    std::vector<unsigned char> mine = to_host(t), all(static_cast<size_t>(t.bytes() * size));
    gather_on(dp_comm(g), mine, all);
    const float* a = reinterpret_cast<const float*>(all.data());
    float* m = reinterpret_cast<float*>(mine.data());
    for (int64_t i = 0; i < t.numel(); ++i)
      for (int64_t q = 0; q < size; ++q) m[i] = std::max(m[i], a[q * t.numel() + i]);
    transfer_->copy(t.data, mine.data(), t.bytes());
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    if (out.bytes() != in.bytes() * tp_) fail("all_gather: output must be tp x the input");
    std::vector<unsigned char> mine = to_host(in), all(static_cast<size_t>(out.bytes()));
    gather(mine, all);
    transfer_->copy(out.data, all.data(), out.bytes());
  }

  void reduce_scatter(const Tensor& in, const Tensor& out) override {
    if (in.bytes() != out.bytes() * tp_ || in.type.dtype != out.type.dtype)
      fail("reduce_scatter: input must be tp x the output");
    std::vector<unsigned char> mine = to_host(in), all(static_cast<size_t>(in.bytes() * tp_));
    gather(mine, all);
    std::vector<unsigned char> result(static_cast<size_t>(out.bytes()));
    sum(all, in, rank_ * out.numel(), Tensor{result.data(), out.type});
    transfer_->copy(out.data, result.data(), out.bytes());
  }

  void all_reduce(const Tensor& t) override {
    std::vector<unsigned char> mine = to_host(t), all(static_cast<size_t>(t.bytes() * tp_));
    gather(mine, all);
    sum(all, t, 0, Tensor{mine.data(), t.type});
    transfer_->copy(t.data, mine.data(), t.bytes());
  }
  void all_reduce_max(const Tensor& t) override {
    if (t.type.dtype != Dtype::kFp32) fail("all_reduce_max: fp32 only");
    std::vector<unsigned char> mine = to_host(t), all(static_cast<size_t>(t.bytes() * tp_));
    gather(mine, all);
    const float* a = reinterpret_cast<const float*>(all.data());
    float* m = reinterpret_cast<float*>(mine.data());
    for (int64_t i = 0; i < t.numel(); ++i)
      for (int64_t q = 0; q < tp_; ++q) m[i] = std::max(m[i], a[q * t.numel() + i]);
    transfer_->copy(t.data, mine.data(), t.bytes());
  }

  // Non-blocking sends of a copy (as the in-process mailboxes): both pipeline neighbours may send
  // before either receives.
  void send(const Tensor& t, int64_t stage, int64_t tag) override {
    reap();
    pending_.emplace_back();
    Pending& p = pending_.back();
    p.bytes = to_host(t);
    ok(MPI_Isend(p.bytes.data(), count_of(t.bytes()), MPI_BYTE, peer(stage), pipeline_tag(tag),
                 MPI_COMM_WORLD, &p.request),
       "MPI_Isend");
  }

  void recv(const Tensor& t, int64_t stage, int64_t tag) override {
    std::vector<unsigned char> h(static_cast<size_t>(t.bytes()));
    MPI_Status status;
    ok(MPI_Recv(h.data(), count_of(t.bytes()), MPI_BYTE, peer(stage), pipeline_tag(tag),
                MPI_COMM_WORLD, &status),
       "MPI_Recv");
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (got != t.bytes()) fail("recv: message size differs from the receive buffer");
    transfer_->copy(t.data, h.data(), t.bytes());
  }

  void all_reduce_with(const Tensor& t, int64_t stage) override {
    std::vector<unsigned char> mine = to_host(t), other(static_cast<size_t>(t.bytes()));
    ok(MPI_Sendrecv(mine.data(), count_of(t.bytes()), MPI_BYTE, peer(stage), kPairTag, other.data(),
                    count_of(t.bytes()), MPI_BYTE, peer(stage), kPairTag, MPI_COMM_WORLD,
                    MPI_STATUS_IGNORE),
       "MPI_Sendrecv");
    add_elements(Tensor{mine.data(), t.type}, Tensor{other.data(), t.type});
    transfer_->copy(t.data, mine.data(), t.bytes());
  }

  // Waits for the sends still in flight.
  void finish() {
    for (Pending& p : pending_) ok(MPI_Wait(&p.request, MPI_STATUS_IGNORE), "MPI_Wait");
    pending_.clear();
  }

 private:
  static constexpr int kPairTag = 1, kPipelineTag = 2;  // pipeline: 2 + the schedule's tag
  // MPI guarantees tags up to 32767: 2 x (pp x chunks) schedule tags fit within it.
  int pipeline_tag(int64_t tag) const {
    if (tag < 0 || tag > 32767 - kPipelineTag) fail("pipeline tag out of MPI's range");
    return static_cast<int>(kPipelineTag + tag);
  }
  struct Pending {
    MPI_Request request;
    std::vector<unsigned char> bytes;
  };
  int peer(int64_t stage) const {
    return static_cast<int>((stage * dp_ + dp_rank_) * tp_ + rank_);  // dp_: dp x cp ranks
  }
  MPI_Comm dp_comm(DpGroup g) const {
    return g == DpGroup::kDense || ep_ == 1 ? dp_group_ : expert_dp_group_;
  }
  static void gather_on(MPI_Comm comm, const std::vector<unsigned char>& mine,
                        std::vector<unsigned char>& all) {
    int n = count_of(static_cast<int64_t>(mine.size()));
    ok(MPI_Allgather(mine.data(), n, MPI_BYTE, all.data(), n, MPI_BYTE, comm), "MPI_Allgather");
  }
  std::vector<unsigned char> to_host(const Tensor& t) {
    std::vector<unsigned char> h(static_cast<size_t>(t.bytes()));
    transfer_->copy(h.data(), t.data, t.bytes());
    return h;
  }
  void gather(const std::vector<unsigned char>& mine, std::vector<unsigned char>& all) {
    int n = count_of(static_cast<int64_t>(mine.size()));
    ok(MPI_Allgather(mine.data(), n, MPI_BYTE, all.data(), n, MPI_BYTE, group_), "MPI_Allgather");
  }
  // out[i] = the sum over q in rank order of element offset + i of rank q's buffer in `all`
  // (each like.bytes() long): the in-process world's host arithmetic.
  void sum(const std::vector<unsigned char>& all, const Tensor& like, int64_t offset,
           const Tensor& out) {
    std::vector<const void*> ins;
    for (int64_t q = 0; q < tp_; ++q) ins.push_back(all.data() + q * like.bytes());
    host_->sum(out, 0, ins, offset, out.numel());
  }
  void reap() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      ok(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      it = done ? pending_.erase(it) : std::next(it);
    }
  }

  MPI_Comm group_, dp_group_, cp_group_, expert_dp_group_, ep_group_;
  int64_t rank_, tp_, dp_rank_, dp_, cp_, ep_;
  std::shared_ptr<Transfer> transfer_;
  std::shared_ptr<Transfer> host_ = host_transfer();
  std::list<Pending> pending_;  // a list: the requests' buffers must not move
};

// ---- a rank's report as bytes ---------------------------------------------------------------------

class Writer {
 public:
  template <typename T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    pod(static_cast<uint64_t>(s.size()));
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    pod(static_cast<uint64_t>(v.size()));
    for (const T& x : v) pod(x);
  }
  std::vector<unsigned char> bytes;
};

class Reader {
 public:
  Reader(const unsigned char* p, size_t n) : p_(p), end_(p + n) {}
  template <typename T>
  T pod() {
    if (static_cast<size_t>(end_ - p_) < sizeof(T)) fail("a rank's report is truncated");
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string str() {
    auto n = pod<uint64_t>();
    if (static_cast<uint64_t>(end_ - p_) < n) fail("a rank's report is truncated");
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> vec() {
    auto n = pod<uint64_t>();
    if (n > static_cast<uint64_t>(end_ - p_) / sizeof(T)) fail("a rank's report is truncated");
    std::vector<T> v(n);
    for (T& x : v) x = pod<T>();
    return v;
  }

 private:
  const unsigned char* p_;
  const unsigned char* end_;
};

void put(Writer& w, const std::vector<LiveAllocation>& v) {
  w.pod(static_cast<uint64_t>(v.size()));
  for (const LiveAllocation& a : v) w.str(a.name), w.pod(a.bytes), w.pod(a.category);
}
std::vector<LiveAllocation> get_live(Reader& r) {
  std::vector<LiveAllocation> v(r.pod<uint64_t>());
  for (LiveAllocation& a : v) a.name = r.str(), a.bytes = r.pod<int64_t>(), a.category = r.pod<Category>();
  return v;
}

std::vector<unsigned char> encode(const RankRun& run) {
  Writer w;
  const RankResult& m = run.memory;
  w.pod(m.stage), w.pod(m.dp_rank), w.pod(m.cp_rank), w.pod(m.tp_rank), w.pod(m.global_rank),
      w.pod(m.measured_peak);
  w.pod(m.measured_at_peak);
  put(w, m.live_at_peak);
  w.vec(m.timeline);
  w.pod(static_cast<uint64_t>(m.events.size()));
  for (const auto& step : m.events) w.vec(step);
  w.pod(static_cast<uint64_t>(m.unplanned.size()));
  for (const std::string& u : m.unplanned) w.str(u);
  put(w, m.runtime_buffers);
  w.pod(m.measured_device_peak.has_value()), w.pod(m.measured_device_peak.value_or(0));
  w.pod(m.measured_reserved_peak.has_value()), w.pod(m.measured_reserved_peak.value_or(0));
  w.pod(m.measured_allocated_blocks_peak.value_or(0));
  w.pod(m.measured_in_use_at_end);
  w.pod(m.measured_reserved_at_end.value_or(0)), w.pod(m.measured_allocated_blocks_at_end.value_or(0));
  put(w, m.measured_overheads);
  w.vec(m.step_seconds);
  w.vec(run.losses);
  w.pod(static_cast<uint64_t>(run.grads.size()));
  for (const auto& [key, g] : run.grads) w.str(key), w.vec(g);
  w.pod(static_cast<uint64_t>(run.forward_runs.size()));
  for (const auto& [key, n] : run.forward_runs) w.pod(key), w.pod(n);
  w.pod(static_cast<uint64_t>(run.profile.size()));
  for (const auto& [key, sec] : run.profile) w.str(key), w.pod(sec);
  return std::move(w.bytes);
}

RankRun decode(const unsigned char* p, size_t n) {
  Reader r(p, n);
  RankRun run;
  RankResult& m = run.memory;
  m.stage = r.pod<int64_t>(), m.dp_rank = r.pod<int64_t>(), m.cp_rank = r.pod<int64_t>();
  m.tp_rank = r.pod<int64_t>();
  m.global_rank = r.pod<int64_t>();
  m.measured_peak = r.pod<int64_t>();
  m.measured_at_peak = r.pod<std::array<int64_t, kCategories>>();
  m.live_at_peak = get_live(r);
  m.timeline = r.vec<int64_t>();
  m.events.resize(r.pod<uint64_t>());
  for (auto& step : m.events) step = r.vec<MemEvent>();
  m.unplanned.resize(r.pod<uint64_t>());
  for (std::string& u : m.unplanned) u = r.str();
  m.runtime_buffers = get_live(r);
  bool has_device = r.pod<bool>();
  int64_t device_peak = r.pod<int64_t>();
  if (has_device) m.measured_device_peak = device_peak;
  bool has_reserved = r.pod<bool>();
  int64_t reserved = r.pod<int64_t>(), blocks = r.pod<int64_t>();
  if (has_reserved) m.measured_reserved_peak = reserved, m.measured_allocated_blocks_peak = blocks;
  m.measured_in_use_at_end = r.pod<int64_t>();
  int64_t reserved_end = r.pod<int64_t>(), blocks_end = r.pod<int64_t>();
  if (has_reserved)
    m.measured_reserved_at_end = reserved_end, m.measured_allocated_blocks_at_end = blocks_end;
  m.measured_overheads = get_live(r);
  m.step_seconds = r.vec<double>();
  run.losses = r.vec<double>();
  for (auto k = r.pod<uint64_t>(); k > 0; --k) {
    std::string key = r.str();
    run.grads[key] = r.vec<float>();
  }
  for (auto k = r.pod<uint64_t>(); k > 0; --k) {
    auto key = r.pod<std::array<int, 3>>();
    run.forward_runs[key] = r.pod<int>();
  }
  for (auto k = r.pod<uint64_t>(); k > 0; --k) {
    std::string key = r.str();
    run.profile[key] = r.pod<double>();
  }
  return run;
}

}  // namespace

bool launched() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"})
    if (const char* v = std::getenv(var)) return std::atoi(v) > 1;
  return false;
}

Process init(int* argc, char*** argv) {
  if (!g_initialized) {
    int provided = 0;
    ok(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    g_initialized = true;
  }
  Process p;
  MPI_Comm_rank(MPI_COMM_WORLD, &p.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p.size);
  return p;
}

void finalize() {
  if (g_initialized) MPI_Finalize();
  g_initialized = false;
}

int broadcast_exit_code(int code) {
  MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return code;
}

Result<std::optional<RunResult>> run_schedule(const Schedule& s, const BackendFactory& backend,
                                              const RunOptions& options,
                                              std::shared_ptr<Transfer> transfer,
                                              const CommWrap& wrap) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const TrainSpec& t = s.setup;
  const int64_t ranks = t.gpus();
  if (size != ranks)
    return make_error("this plan has tp x cp x pp x dp = " + std::to_string(ranks) +
                      " ranks; start it with mpirun -n " + std::to_string(ranks) + " (got " +
                      std::to_string(size) + " processes)");
  if (auto e = check_runnable(s, !options.device_memory)) return *e;
  if (!options.device_memory)
    if (auto e = check_host_memory(s)) return *e;
  // Process p: stage p / (dp cp tp), DP rank d = (p / tp) mod (dp cp) (replica d / cp, CP rank
  // d mod cp), TP rank p mod tp.
  const int64_t replicas = t.dp * t.cp;
  int64_t stage = rank / (replicas * t.tp), d = rank / t.tp % replicas, r = rank % t.tp;
  // The expert DP group: the same EP rank (replica mod ep) of every block of ep replicas, ranked
  // (replica / ep) x cp + CP rank; the EP group: one block's ep replicas of a CP rank.
  const int64_t replica = d / t.cp, c = d % t.cp;
  auto split = [](int64_t color, int64_t key, MPI_Comm* out) {
    ok(MPI_Comm_split(MPI_COMM_WORLD, static_cast<int>(color), static_cast<int>(key), out),
       "MPI_Comm_split");
  };
  MpiComm::Groups g{};
  split(stage * replicas + d, r, &g.tp);
  split(stage * t.tp + r, d, &g.dp);
  split((stage * t.dp + replica) * t.tp + r, c, &g.cp);
  split((stage * t.tp + r) * t.ep + replica % t.ep, replica / t.ep * t.cp + c, &g.expert_dp);
  split(((stage * (t.dp / t.ep) + replica / t.ep) * t.cp + c) * t.tp + r, replica % t.ep, &g.ep);
  MPI_Comm group = g.tp;
  RankRun run;
  {
    MpiComm comm(g, r, t.tp, d, replicas, t.cp, t.ep, std::move(transfer));
    try {
      std::unique_ptr<Communicator> wrapped;
      if (wrap)
        wrapped = wrap(comm, [group](void* data, int bytes) {
          ok(MPI_Bcast(data, bytes, MPI_BYTE, 0, group), "MPI_Bcast");
        });
      std::unique_ptr<Backend> be = backend();
      run = run_rank(s, stage, *be, wrapped ? *wrapped : comm, options);
      comm.finish();
    } catch (const OutOfBudget& e) {
      std::fprintf(stderr, "nanoplan: rank %d: %s\n", rank, e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 3);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nanoplan: run failed on rank %d (pp stage %lld): %s\n", rank,
                   static_cast<long long>(stage), e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 4);
    }
  }
  for (MPI_Comm* each : {&g.tp, &g.dp, &g.cp, &g.expert_dp, &g.ep}) MPI_Comm_free(each);
  // Every report to process 0.
  std::vector<unsigned char> mine = encode(run);
  int n = count_of(static_cast<int64_t>(mine.size()));
  std::vector<int> sizes(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  ok(MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Gather");
  int64_t total = 0;
  for (int p = 0; p < size; ++p) offsets[p] = count_of(total), total += sizes[p];
  std::vector<unsigned char> all(rank == 0 ? static_cast<size_t>(total) : 0);
  ok(MPI_Gatherv(mine.data(), n, MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE, 0,
                 MPI_COMM_WORLD),
     "MPI_Gatherv");
  if (rank != 0) return std::optional<RunResult>{};
  RunResult result;
  for (int p = 0; p < size; ++p)
    merge_rank(result, decode(all.data() + offsets[p], static_cast<size_t>(sizes[p])));
  finish_merge(result);
  return std::optional<RunResult>{std::move(result)};
}

}  // namespace np::exec::mpi

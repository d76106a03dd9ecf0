// Threads-as-ranks collectives: each rank publishes a pointer, a barrier, then every rank reads
// what it needs straight from its peers' buffers. Sums run in rank order in fp32 (bitwise the same
// on every rank); nothing is allocated except the p2p message copies.
#include "executor/comm/inproc.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace np::exec {

class InProcessComm final : public Communicator {
 public:
  InProcessComm(InProcessWorld& w, int64_t stage, int64_t dp_rank, int64_t rank)
      : w_(w), stage_(stage), dp_rank_(dp_rank), rank_(rank) {}
  int64_t tp_rank() const override { return rank_; }
  int64_t tp_size() const override { return w_.tp_; }
  int64_t dp_rank() const override { return dp_rank_; }
  int64_t dp_size() const override { return w_.dp_; }
  int64_t cp_rank() const override { return dp_rank_ % w_.cp_; }
  int64_t cp_size() const override { return w_.cp_; }

  void cp_all_gather(const Tensor& in, const Tensor& out) override {
    check(out.bytes() == in.bytes() * w_.cp_, "cp_all_gather: output must be cp x the input");
    publish_to(cp_group(), cp_rank(), in.data);
    for (int64_t q = 0; q < w_.cp_; ++q)
      w_.transfer_->copy(out.as<unsigned char>() + q * in.bytes(), cp_group().slots[q], in.bytes());
    wait_on(cp_group());
  }

  void cp_reduce_scatter(const Tensor& in, const Tensor& out) override {
    check(in.bytes() == out.bytes() * w_.cp_ && in.type.dtype == out.type.dtype,
          "cp_reduce_scatter: input must be cp x the output");
    publish_to(cp_group(), cp_rank(), in.data);
    w_.transfer_->sum(out, 0, cp_group().slots, cp_rank() * out.numel(), out.numel());
    wait_on(cp_group());
  }

  void dp_reduce_scatter(DpGroup which, const Tensor& t, int64_t first, int64_t shard) override {
    Member m = member(which);
    if (m.size == 1) return;
    publish_to(m.group, m.rank, t.data);
    auto [lo, hi] = dp_owned(t, first, shard, m.rank);
    if (hi > lo) w_.transfer_->sum(t, lo, m.group.slots, lo, hi - lo);
    wait_on(m.group);
  }

  void dp_reduce_scatter_into(DpGroup which, const Tensor& t, int64_t first, int64_t shard,
                              const Tensor& into) override {
    Member m = member(which);
    publish_to(m.group, m.rank, t.data);
    auto [lo, hi] = dp_owned(t, first, shard, m.rank);
    if (hi > lo) {
      int64_t e = dtype_bytes(t.type.dtype), at = first + lo - m.rank * shard;
      std::vector<const void*> ins{into.as<unsigned char>() + at * e};
      for (const void* p : m.group.slots) ins.push_back(static_cast<const unsigned char*>(p) + lo * e);
      w_.transfer_->sum(into, at, ins, 0, hi - lo);
    }
    wait_on(m.group);
  }

  void dp_all_gather(DpGroup which, const Tensor& t, int64_t first, int64_t shard) override {
    Member m = member(which);
    if (m.size == 1) return;
    publish_to(m.group, m.rank, t.data);
    int64_t elem = dtype_bytes(t.type.dtype);
    for (int64_t q = 0; q < m.size; ++q) {
      auto [lo, hi] = dp_owned(t, first, shard, q);
      if (q == m.rank || hi <= lo) continue;
      w_.transfer_->copy(t.as<unsigned char>() + lo * elem,
                         static_cast<const unsigned char*>(m.group.slots[q]) + lo * elem,
                         (hi - lo) * elem);
    }
    wait_on(m.group);
  }

  void dp_all_gather_blocks(DpGroup which, const Tensor& t, int64_t shard, int64_t span) override {
    Member m = member(which);
    if (m.size == 1) return;
    publish_to(m.group, m.rank, t.data);
    const int64_t e = dtype_bytes(t.type.dtype), base = m.rank / span * span;
    for (int64_t q = base; q < base + span; ++q) {
      if (q == m.rank) continue;
      const int64_t at = q % span * shard * e;
      w_.transfer_->copy(t.as<unsigned char>() + at,
                         static_cast<const unsigned char*>(m.group.slots[q]) + at, shard * e);
    }
    wait_on(m.group);
  }

  void dp_reduce_scatter_blocks_into(DpGroup which, const Tensor& t, int64_t shard, int64_t span,
                                     const Tensor& into) override {
    Member m = member(which);
    publish_to(m.group, m.rank, t.data);
    const int64_t at = m.rank % span * shard * dtype_bytes(t.type.dtype);
    std::vector<const void*> ins{into.data};
    for (const void* p : m.group.slots) ins.push_back(static_cast<const unsigned char*>(p) + at);
    w_.transfer_->sum(into, 0, ins, 0, shard);
    wait_on(m.group);
  }

  // Every rank reads the group's tensors before any writes its own.
  void dp_all_reduce_max(DpGroup which, const Tensor& t) override {
    check(t.type.dtype == Dtype::kFp32, "dp_all_reduce_max: fp32 only");
    Member m = member(which);
    if (m.size == 1) return;
    publish_to(m.group, m.rank, t.data);
    const size_t n = static_cast<size_t>(t.numel());
    std::vector<float> most(n, -std::numeric_limits<float>::infinity()), got(n);
    for (int64_t q = 0; q < m.size; ++q) {
      w_.transfer_->copy(got.data(), m.group.slots[q], t.bytes());
      for (size_t i = 0; i < n; ++i) most[i] = std::max(most[i], got[i]);
    }
    wait_on(m.group);
    w_.transfer_->copy(t.data, most.data(), t.bytes());
  }

  int64_t ep_size() const override { return w_.ep_; }

  void ep_all_to_all(const Tensor& in, const Tensor& out) override {
    check(in.bytes() == out.bytes() && in.bytes() % w_.ep_ == 0,
          "ep_all_to_all: input and output must be the same ep row blocks");
    int64_t block = in.bytes() / w_.ep_, me = ep_rank();
    publish_to(ep_group(), me, in.data);
    for (int64_t q = 0; q < w_.ep_; ++q)
      w_.transfer_->copy(out.as<unsigned char>() + q * block,
                         static_cast<const unsigned char*>(ep_group().slots[q]) + me * block, block);
    wait_on(ep_group());
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    check(out.bytes() == in.bytes() * w_.tp_, "all_gather: output must be tp x the input");
    w_.transfer_->check_collective_buffer(in.data, "all_gather's input");
    w_.transfer_->check_collective_buffer(out.data, "all_gather's output");
    publish(in.data);
    for (int64_t q = 0; q < w_.tp_; ++q)
      w_.transfer_->copy(out.as<unsigned char>() + q * in.bytes(), group().slots[q], in.bytes());
    wait();
  }

  void reduce_scatter(const Tensor& in, const Tensor& out) override {
    check(in.bytes() == out.bytes() * w_.tp_ && in.type.dtype == out.type.dtype,
          "reduce_scatter: input must be tp x the output");
    w_.transfer_->check_collective_buffer(in.data, "reduce_scatter's input");
    w_.transfer_->check_collective_buffer(out.data, "reduce_scatter's output");
    publish(in.data);
    w_.transfer_->sum(out, 0, group().slots, rank_ * out.numel(), out.numel());
    wait();
  }

  void all_reduce(const Tensor& t) override { reduce_in_place(t, false); }
  void all_reduce_max(const Tensor& t) override {
    check(t.type.dtype == Dtype::kFp32, "all_reduce_max: fp32 only");
    reduce_in_place(t, true);
  }

  // t = the sum (or the maximum) over the TP ranks of t.
  void reduce_in_place(const Tensor& t, bool max) {
    w_.transfer_->check_collective_buffer(t.data, max ? "all_reduce_max's tensor"
                                                      : "all_reduce's tensor");
    publish(t.data);
    // Phase 1: rank r reduces chunk r of every buffer into its own chunk r (no rank reads
    // another's own chunk); phase 2: copies the other chunks from their owners.
    int64_t n = t.numel(), chunk = (n + w_.tp_ - 1) / w_.tp_;
    int64_t lo = std::min(n, rank_ * chunk), hi = std::min(n, lo + chunk);
    if (max)
      w_.transfer_->max(t, lo, group().slots, lo, hi - lo);
    else
      w_.transfer_->sum(t, lo, group().slots, lo, hi - lo);
    wait();
    int64_t elem = dtype_bytes(t.type.dtype);
    for (int64_t q = 0; q < w_.tp_; ++q) {
      if (q == rank_) continue;
      int64_t qlo = std::min(n, q * chunk), qhi = std::min(n, qlo + chunk);
      w_.transfer_->copy(t.as<unsigned char>() + qlo * elem,
                         static_cast<const unsigned char*>(group().slots[q]) + qlo * elem,
                         (qhi - qlo) * elem);
    }
    wait();
  }

  // Pipeline messages travel through host memory (outside every rank's device accounting).
  void send(const Tensor& t, int64_t stage, int64_t tag) override {
    post(to_host(t), stage, kPipelineChannel + tag);
  }

  void recv(const Tensor& t, int64_t stage, int64_t tag) override {
    std::vector<unsigned char> msg = take(stage, kPipelineChannel + tag);
    check(static_cast<int64_t>(msg.size()) == t.bytes(),
          "recv: message size differs from the receive buffer");
    w_.transfer_->copy(t.data, msg.data(), t.bytes());
  }

  // Its own channel: a pipeline message still unread between the two stages is never taken for it.
  void all_reduce_with(const Tensor& t, int64_t peer) override {
    post(to_host(t), peer, kPairChannel);
    std::vector<unsigned char> msg = take(peer, kPairChannel), mine = to_host(t);
    check(static_cast<int64_t>(msg.size()) == t.bytes(),
          "all_reduce_with: the peer's tensor differs in size");
    add_elements(Tensor{mine.data(), t.type}, Tensor{msg.data(), t.type});
    w_.transfer_->copy(t.data, mine.data(), t.bytes());
  }

 private:
  InProcessWorld::Group& group() { return *w_.groups_[stage_ * w_.dp_ + dp_rank_]; }
  InProcessWorld::Group& dp_group() { return *w_.dp_groups_[stage_ * w_.tp_ + rank_]; }
  // A parameter group's DP group (its rendezvous, this rank's place, its size); with ep = 1 the
  // experts' is the dense one.
  struct Member {
    InProcessWorld::Group& group;
    int64_t rank, size;
  };
  Member member(DpGroup which) {
    if (which == DpGroup::kDense || w_.ep_ == 1) return {dp_group(), dp_rank_, w_.dp_};
    return {*w_.expert_groups_[(stage_ * w_.tp_ + rank_) * w_.ep_ + ep_rank()], group_rank(which),
            w_.dp_ / w_.ep_};
  }
  InProcessWorld::Group& ep_group() { return *w_.ep_groups_[w_.ep_group_index(stage_, dp_rank_, rank_)]; }
  InProcessWorld::Group& cp_group() {
    return *w_.cp_groups_[(stage_ * (w_.dp_ / w_.cp_) + dp_rank_ / w_.cp_) * w_.tp_ + rank_];
  }
  // Rendezvous of a DP or CP group: this rank's pointer in its slot, then the group's barrier.
  void publish_to(InProcessWorld::Group& g, int64_t slot, const void* p) {
    g.slots[slot] = p;
    wait_on(g);
  }
  void wait_on(InProcessWorld::Group& g) {
    g.sync.arrive_and_wait();
    if (w_.aborted_) throw RunAborted();
  }
  std::vector<unsigned char> to_host(const Tensor& t) {
    std::vector<unsigned char> h(static_cast<size_t>(t.bytes()));
    w_.transfer_->copy(h.data(), t.data, t.bytes());
    return h;
  }
  static constexpr int64_t kPairChannel = 0, kPipelineChannel = 1;  // pipeline: 1 + tag
  void post(std::vector<unsigned char> msg, int64_t to, int64_t channel) {
    auto& box = w_.mailbox(stage_, to, dp_rank_ * w_.tp_ + rank_, channel);
    {
      std::lock_guard lock(box.mu);
      box.messages.push_back(std::move(msg));
    }
    box.cv.notify_all();
  }
  std::vector<unsigned char> take(int64_t from, int64_t channel) {
    auto& box = w_.mailbox(from, stage_, dp_rank_ * w_.tp_ + rank_, channel);
    std::unique_lock lock(box.mu);
    box.cv.wait(lock, [&] { return !box.messages.empty() || w_.aborted_; });
    if (box.messages.empty()) throw RunAborted();
    std::vector<unsigned char> msg = std::move(box.messages.front());
    box.messages.pop_front();
    return msg;
  }
  void publish(const void* p) {
    group().slots[rank_] = p;
    wait();
  }
  void wait() {
    group().sync.arrive_and_wait();
    if (w_.aborted_) throw RunAborted();
  }
  static void check(bool ok, const char* what) {
    if (!ok) throw std::logic_error(what);
  }

  InProcessWorld& w_;
  int64_t stage_, dp_rank_, rank_;
};

namespace {
class HostTransfer final : public Transfer {
 public:
  void copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void sum(const Tensor& out, int64_t out_offset, const std::vector<const void*>& ins,
           int64_t in_offset, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      float s = 0;
      for (const void* p : ins) s += load(Tensor{const_cast<void*>(p), out.type}, in_offset + i);
      store(out, out_offset + i, s);
    }
  }
  void max(const Tensor& out, int64_t out_offset, const std::vector<const void*>& ins,
           int64_t in_offset, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (const void* p : ins)
        m = std::max(m, load(Tensor{const_cast<void*>(p), out.type}, in_offset + i));
      store(out, out_offset + i, m);
    }
  }
};
}  // namespace

std::shared_ptr<Transfer> host_transfer() {
  return std::make_shared<HostTransfer>();
}

void add_elements(const Tensor& into, const Tensor& other) {
  for (int64_t i = 0; i < into.numel(); ++i) store(into, i, load(into, i) + load(other, i));
}

InProcessWorld::InProcessWorld(int64_t tp, int64_t pp, int64_t dp, int64_t cp, int64_t ep,
                               std::shared_ptr<Transfer> transfer)
    : tp_(tp), pp_(pp), dp_(dp * cp), cp_(cp), ep_(ep), transfer_(std::move(transfer)) {
  if (ep < 1 || dp % ep != 0) throw std::invalid_argument("InProcessWorld: ep must divide dp");
  for (int64_t s = 0; s < pp; ++s) {
    for (int64_t d = 0; d < dp_; ++d) {
      groups_.push_back(std::make_unique<Group>(tp));
      for (int64_t r = 0; r < tp; ++r)
        comms_.push_back(std::make_unique<InProcessComm>(*this, s, d, r));
    }
    for (int64_t r = 0; r < tp; ++r) dp_groups_.push_back(std::make_unique<Group>(dp_));
    for (int64_t k = 0; k < dp * tp; ++k) cp_groups_.push_back(std::make_unique<Group>(cp));
    for (int64_t k = 0; k < tp * ep; ++k) expert_groups_.push_back(std::make_unique<Group>(dp_ / ep));
    for (int64_t k = 0; k < dp_ / ep * tp; ++k) ep_groups_.push_back(std::make_unique<Group>(ep));
  }
}

Communicator& InProcessWorld::comm(int64_t stage, int64_t dp_rank, int64_t tp_rank) {
  return *comms_.at((stage * dp_ + dp_rank) * tp_ + tp_rank);
}

void InProcessWorld::abort(int64_t stage, int64_t dp_rank, int64_t tp_rank) {
  aborted_ = true;
  groups_.at(stage * dp_ + dp_rank)->sync.arrive_and_drop();
  dp_groups_.at(stage * tp_ + tp_rank)->sync.arrive_and_drop();
  cp_groups_.at((stage * (dp_ / cp_) + dp_rank / cp_) * tp_ + tp_rank)->sync.arrive_and_drop();
  expert_groups_.at((stage * tp_ + tp_rank) * ep_ + dp_rank / cp_ % ep_)->sync.arrive_and_drop();
  ep_groups_.at(ep_group_index(stage, dp_rank, tp_rank))->sync.arrive_and_drop();
  std::lock_guard lock(boxes_mu_);
  for (auto& [key, box] : boxes_) {
    std::lock_guard box_lock(box->mu);
    box->cv.notify_all();
  }
}

int64_t InProcessWorld::ep_group_index(int64_t stage, int64_t dp_rank, int64_t tp_rank) const {
  int64_t replica = dp_rank / cp_, blocks = dp_ / cp_ / ep_;  // EP groups per stage and CP rank
  return ((stage * blocks + replica / ep_) * cp_ + dp_rank % cp_) * tp_ + tp_rank;
}

InProcessWorld::Mailbox& InProcessWorld::mailbox(int64_t from, int64_t to, int64_t rank,
                                                 int64_t channel) {
  std::lock_guard lock(boxes_mu_);
  auto& box = boxes_[{from, to, rank, channel}];
  if (!box) box = std::make_unique<Mailbox>();
  return *box;
}

}  // namespace np::exec

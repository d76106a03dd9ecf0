// In-process communicators: every rank is a thread of one process. A World holds, per pipeline
// stage, the TP group's rendezvous, and the point-to-point mailboxes between stages. Its Transfer
// moves and sums the ranks' bytes: in host memory for the CPU executor, in device memory for
// virtual ranks of the CUDA backend sharing one GPU (executor/cuda/transfer.hpp).
#pragma once
#include <atomic>
#include <barrier>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "executor/comm/comm.hpp"

namespace np::exec {

// How an in-process world moves and sums its ranks' tensor bytes.
class Transfer {
 public:
  virtual ~Transfer() = default;
  // bytes from src to dst; either may be host memory or the backend's. Complete when it returns.
  virtual void copy(void* dst, const void* src, int64_t bytes) = 0;
  // out[out_offset + i] = the sum over q, in order and in fp32, of element in_offset + i of ins[q]
  // (tensors of out's dtype), for i < n; out may be one of ins (each element read before it is
  // written). Complete when it returns.
  virtual void sum(const Tensor& out, int64_t out_offset, const std::vector<const void*>& ins,
                   int64_t in_offset, int64_t n) = 0;
  // The same with the maximum in place of the sum.
  virtual void max(const Tensor& out, int64_t out_offset, const std::vector<const void*>& ins,
                   int64_t in_offset, int64_t n) = 0;
  // Refuses a collective's buffer that is not the backend's memory, as NCCL does (its buffers
  // are device memory); the host transfer takes any.
  virtual void check_collective_buffer(const void* p, const char* what) const {
    (void)p, (void)what;
  }
};
// Host memory: memcpy and a loop.
std::shared_ptr<Transfer> host_transfer();
// into[i] += other[i] in fp32, rounded to into's dtype: the pair exchange's sum, bitwise the same
// on both sides (host memory).
void add_elements(const Tensor& into, const Tensor& other);

class InProcessWorld final : public CommWorld {
 public:
  // dp x cp replicas per stage (DP rank d x cp + c), each a TP group; ep divides dp.
  InProcessWorld(int64_t tp, int64_t pp, int64_t dp = 1, int64_t cp = 1, int64_t ep = 1,
                 std::shared_ptr<Transfer> transfer = host_transfer());
  // The communicator of (stage, dp_rank, tp_rank); owned by the world.
  Communicator& comm(int64_t stage, int64_t dp_rank, int64_t tp_rank) override;
  // Releases the rank's TP and DP peers from any rendezvous and wakes every receiver.
  void abort(int64_t stage, int64_t dp_rank, int64_t tp_rank) override;

 private:
  friend class InProcessComm;
  struct Group {
    explicit Group(int64_t n) : sync(n), slots(n, nullptr) {}
    std::barrier<> sync;
    std::vector<const void*> slots;
  };
  struct Mailbox {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::vector<unsigned char>> messages;
  };
  // Messages from stage `from` to stage `to` of replica rank `rank` (dp_rank x tp + tp_rank) on
  // one channel (pair, or pipeline + tag).
  Mailbox& mailbox(int64_t from, int64_t to, int64_t rank, int64_t channel);

  // The EP group of a rank: per (stage, block of ep replicas, CP rank, TP rank).
  int64_t ep_group_index(int64_t stage, int64_t dp_rank, int64_t tp_rank) const;

  int64_t tp_, pp_, dp_, cp_, ep_;  // dp_: dp x cp ranks per DP group
  std::shared_ptr<Transfer> transfer_;
  std::atomic<bool> aborted_{false};
  std::vector<std::unique_ptr<Group>> groups_;     // TP groups: per (stage, dp rank)
  std::vector<std::unique_ptr<Group>> dp_groups_;  // DP groups: per (stage, tp rank)
  std::vector<std::unique_ptr<Group>> cp_groups_;  // CP groups: per (stage, replica, tp rank)
  std::vector<std::unique_ptr<Group>> expert_groups_;  // expert DP: per (stage, tp rank, EP rank)
  std::vector<std::unique_ptr<Group>> ep_groups_;      // EP: ep_group_index
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::mutex boxes_mu_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::unique_ptr<Mailbox>> boxes_;
};

}  // namespace np::exec

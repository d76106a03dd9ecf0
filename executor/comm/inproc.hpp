// In-process communicators: every rank is a thread of one process. A World holds, per pipeline
// stage, the TP group's rendezvous, and the point-to-point mailboxes between stages.
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

class InProcessWorld final : public CommWorld {
 public:
  InProcessWorld(int64_t tp, int64_t pp);
  // The communicator of (stage, tp_rank); owned by the world.
  Communicator& comm(int64_t stage, int64_t tp_rank) override;
  // Releases the TP peers of `stage` from any rendezvous and wakes every receiver.
  void abort(int64_t stage) override;

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
  Mailbox& mailbox(int64_t from, int64_t to, int64_t tp_rank);

  int64_t tp_, pp_;
  std::atomic<bool> aborted_{false};
  std::vector<std::unique_ptr<Group>> groups_;  // per stage
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::mutex boxes_mu_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<Mailbox>> boxes_;
};

}  // namespace np::exec

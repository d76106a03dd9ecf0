// `nanoplan calibrate`'s collectives (calibrate.hpp): NCCL over the ranks of one process, a thread
// per rank, each on its device.
#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(NANOPLAN_CUDA_EMULATION)
#include "executor/cuda/emu/nccl_emu.hpp"
#else
#include <nccl.h>
#endif

#include "executor/cuda/calibrate.hpp"
#include "executor/cuda/common.cuh"
#include "executor/cuda/timing.hpp"

namespace np::cuda {
namespace {

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

constexpr const char* kKinds[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                  "p2p"};
constexpr size_t kKindCount = sizeof kKinds / sizeof kKinds[0];

}  // namespace

// Fits t = a x + c, x = twice (g - 1) / g bytes, minimising the squared errors relative to each t
// (so the small sizes decide the latency and the large ones the bandwidth).
void fit_collective(CalibratedCollective& c) {
  const double g = c.ranks, twice = c.kind == "all_reduce" ? 2.0 : 1.0;
  // A point-to-point message moves its bytes once, and its intercept is one message's latency.
  const bool p2p = c.kind == "p2p";
  const double share = p2p ? 1.0 : twice * (g - 1) / g, steps = p2p ? 1.0 : twice * (g - 1);
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [bytes, t] : c.seconds) {
    double x = share * static_cast<double>(bytes), w = 1.0 / (t * t);
    sw += w, sx += w * x, sy += w * t, sxx += w * x * x, sxy += w * x * t;
  }
  double det = sw * sxx - sx * sx;
  double a = det > 0 ? (sw * sxy - sx * sy) / det : 0, b = det > 0 ? (sy - a * sx) / sw : 0;
  if (a <= 0) {  // one size, or times that do not grow with it (the emulation): no latency
    a = 0;
    for (const auto& [bytes, t] : c.seconds)
      a = std::max(a, t / (share * static_cast<double>(bytes)));
    b = 0;
  }
  c.bus_bytes_per_s = 1.0 / a;
  c.step_latency_s = std::max(0.0, b) / steps;
}

Result<std::vector<CalibratedCollective>> calibrate_collectives(const CollectiveOptions& o) {
  if (o.ranks < 2 || o.bytes.empty())
    return make_error("calibrate: collectives need 2 or more ranks and one size or more");
  const int n = o.ranks;
  const int64_t most = *std::max_element(o.bytes.begin(), o.bytes.end());
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    return make_error(std::string("calibrate: ncclGetUniqueId: ") + ncclGetErrorString(r));
  std::vector<CalibratedCollective> out;
  for (const char* k : kKinds) out.push_back({k, n, {}, 0, 0});
  std::mutex mu;
  std::string error;
  auto rank = [&](int r) {
    ncclComm_t comm = nullptr;
    try {
#if !defined(NANOPLAN_CUDA_EMULATION)
      NP_CUDA_CHECK(cudaSetDevice(r));
#endif
      nccl_check(ncclCommInitRank(&comm, n, id, r), "ncclCommInitRank");
      DeviceBuffer send({most / 2}, Dtype::kBf16, 100 + r), recv({most / 2}, Dtype::kBf16, 200 + r);
      const int next = (r + 1) % n, prev = (r + n - 1) % n;  // point-to-point's peers
      for (size_t kind = 0; kind < kKindCount; ++kind)
        for (int64_t bytes : o.bytes) {
          const size_t full = static_cast<size_t>(bytes / 2), part = full / n;
          std::function<void()> call;
          if (kind == 0)
            call = [&] {
              nccl_check(ncclAllReduce(recv.t.data, recv.t.data, full, ncclBfloat16, ncclSum, comm,
                                       nullptr),
                         "ncclAllReduce");
            };
          else if (kind == 1)
            call = [&] {
              nccl_check(ncclAllGather(send.t.data, recv.t.data, part, ncclBfloat16, comm, nullptr),
                         "ncclAllGather");
            };
          else if (kind == 2)
            call = [&] {
              nccl_check(ncclReduceScatter(send.t.data, recv.t.data, part, ncclBfloat16, ncclSum,
                                           comm, nullptr),
                         "ncclReduceScatter");
            };
          else if (kind == 3)  // nccl-tests' alltoall_perf: a send and a receive per peer, grouped
            call = [&] {
              const auto* in = static_cast<const char*>(send.t.data);
              auto* out = static_cast<char*>(recv.t.data);
              const size_t chunk = part * 2;  // bytes to each peer
              nccl_check(ncclGroupStart(), "ncclGroupStart");
              for (int p = 0; p < n; ++p) {
                nccl_check(ncclSend(in + p * chunk, part, ncclBfloat16, p, comm, nullptr),
                           "ncclSend");
                nccl_check(ncclRecv(out + p * chunk, part, ncclBfloat16, p, comm, nullptr),
                           "ncclRecv");
              }
              nccl_check(ncclGroupEnd(), "ncclGroupEnd");
            };
          else  // nccl-tests' sendrecv_perf: the whole size to the next rank, from the previous
            call = [&] {
              nccl_check(ncclGroupStart(), "ncclGroupStart");
              nccl_check(ncclSend(send.t.data, full, ncclBfloat16, next, comm, nullptr),
                         "ncclSend");
              nccl_check(ncclRecv(recv.t.data, full, ncclBfloat16, prev, comm, nullptr),
                         "ncclRecv");
              nccl_check(ncclGroupEnd(), "ncclGroupEnd");
            };
          double s = std::max(1e-9, 1e-3 * median_ms(call, o.warmup, o.repetitions));
          if (r == 0) out[kind].seconds.push_back({bytes, s});
        }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (error.empty()) error = e.what();
    }
    if (comm) ncclCommDestroy(comm);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(rank, r);
  for (std::thread& t : threads) t.join();
  if (!error.empty()) return make_error("calibrate: collectives: " + error);
  for (CalibratedCollective& c : out) fit_collective(c);
  return out;
}

}  // namespace np::cuda

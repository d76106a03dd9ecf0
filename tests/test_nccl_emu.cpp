// The NCCL emulation (executor/cuda/emu/nccl_emu.hpp) and, over it, the CUDA backend's NCCL
// communicator (executor/cuda/nccl.cu), which CI could not compile before: ranks are threads, and
// NCCL's rules (device buffers of the call's size, the same call on every rank, collective
// initialisation, group semantics) are refused as NCCL refuses them.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "executor/bf16.hpp"
#include "executor/comm/inproc.hpp"
#include "executor/cuda/emu/nccl_emu.hpp"
#include "executor/cuda/calibrate.hpp"
#include "executor/cuda/nccl.hpp"

namespace np {
namespace {

// Runs body(rank) on n threads and waits for them.
void on_ranks(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

// A device buffer holding `values`, and back.
template <typename T>
T* device(const std::vector<T>& values) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, values.size() * sizeof(T)), cudaSuccess);
  cudaMemcpy(p, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> host(const T* p, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

// n communicators of one id, made by n threads (the initialisation is collective).
std::vector<ncclComm_t> clique(int n) {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  on_ranks(n, [&](int r) { EXPECT_EQ(ncclCommInitRank(&comms[r], n, id, r), ncclSuccess); });
  return comms;
}

TEST(NcclEmulation, CollectivesOverThreadRanks) {
  constexpr int n = 4;
  std::vector<ncclComm_t> comms = clique(n);
  on_ranks(n, [&](int r) {
    ncclComm_t c = comms[r];
    int count = 0, rank = -1;
    EXPECT_EQ(ncclCommCount(c, &count), ncclSuccess);
    EXPECT_EQ(ncclCommUserRank(c, &rank), ncclSuccess);
    EXPECT_EQ(count, n);
    EXPECT_EQ(rank, r);
    // All-gather: rank r sends {10 r, 10 r + 1, 10 r + 2}.
    float* send = device<float>({10.f * r, 10.f * r + 1, 10.f * r + 2});
    float* recv = device<float>(std::vector<float>(3 * n, -1));
    ASSERT_EQ(ncclAllGather(send, recv, 3, ncclFloat32, c, nullptr), ncclSuccess);
    std::vector<float> want;
    for (int s = 0; s < n; ++s) want.insert(want.end(), {10.f * s, 10.f * s + 1, 10.f * s + 2});
    EXPECT_EQ(host(recv, 3 * n), want);
    // All-reduce in place, sum and max: rank r holds {r, -r}.
    float* x = device<float>({1.f * r, -1.f * r});
    ASSERT_EQ(ncclAllReduce(x, x, 2, ncclFloat32, ncclSum, c, nullptr), ncclSuccess);
    EXPECT_EQ(host(x, 2), (std::vector<float>{6, -6}));
    float* y = device<float>({1.f * r, -1.f * r});
    ASSERT_EQ(ncclAllReduce(y, y, 2, ncclFloat32, ncclMax, c, nullptr), ncclSuccess);
    EXPECT_EQ(host(y, 2), (std::vector<float>{3, 0}));
    // Reduce-scatter of int64: rank r gets block r of the sum of every rank's {0..7} + r.
    std::vector<int64_t> mine(2 * n);
    for (int i = 0; i < 2 * n; ++i) mine[i] = i + r;
    int64_t* z = device(mine);
    int64_t* out = device<int64_t>({0, 0});
    ASSERT_EQ(ncclReduceScatter(z, out, 2, ncclInt64, ncclSum, c, nullptr), ncclSuccess);
    EXPECT_EQ(host(out, 2), (std::vector<int64_t>{4 * (2 * r) + 6, 4 * (2 * r + 1) + 6}));
    for (void* p : std::vector<void*>{send, recv, x, y, z, out}) cudaFree(p);
  });
  // bf16 sums round after each addition in rank order: 256 + 1 + 1 + 1 is 256 in bf16 (each
  // 257 rounds back to 256), where a sum in fp32 rounded once would give 260.
  on_ranks(n, [&](int r) {
    uint16_t v = f32_to_bf16_bits(r == 0 ? 256.f : 1.f);
    uint16_t* b = device<uint16_t>({v});
    ASSERT_EQ(ncclAllReduce(b, b, 1, ncclBfloat16, ncclSum, comms[r], nullptr), ncclSuccess);
    EXPECT_EQ(bf16_bits_to_f32(host(b, 1)[0]), 256.f);
    cudaFree(b);
  });
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(NcclEmulation, RefusesHostBuffersShortBuffersAndMismatchedCalls) {
  std::vector<ncclComm_t> one = clique(1);
  std::vector<float> on_host(4);
  float* d = device<float>({1, 2, 3, 4});
  // NCCL's buffers are device memory, of the call's size.
  EXPECT_EQ(ncclAllReduce(on_host.data(), on_host.data(), 4, ncclFloat32, ncclSum, one[0], nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(d, d, 5, ncclFloat32, ncclSum, one[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, one[0], nullptr), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(d, d, 4, ncclFloat16, ncclSum, one[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDestroy(one[0]), ncclSuccess);
  cudaFree(d);
  // Initialisation: a rank in range, each rank once, every rank of the same size.
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  ncclComm_t c = nullptr;
  EXPECT_EQ(ncclCommInitRank(&c, 2, id, 2), ncclInvalidArgument);
  std::vector<ncclComm_t> two(2, nullptr);
  on_ranks(2, [&](int r) { EXPECT_EQ(ncclCommInitRank(&two[r], 2, id, r), ncclSuccess); });
  ncclComm_t dup = nullptr;
  EXPECT_EQ(ncclCommInitRank(&dup, 2, id, 0), ncclInvalidUsage);  // rank 0 is taken
  EXPECT_EQ(ncclCommInitRank(&dup, 3, id, 2), ncclInvalidUsage);  // the id's size is 2
  EXPECT_EQ(dup, nullptr);
  // Every rank makes the same call: counts that differ fail on both ranks.
  on_ranks(2, [&](int r) {
    float* x = device<float>({1, 2, 3});
    EXPECT_EQ(ncclAllReduce(x, x, r == 0 ? 2 : 3, ncclFloat32, ncclSum, two[r], nullptr),
              ncclInvalidUsage);
    // ... and the communicator goes on with the next call.
    EXPECT_EQ(ncclAllReduce(x, x, 3, ncclFloat32, ncclSum, two[r], nullptr), ncclSuccess);
    EXPECT_EQ(host(x, 3), (std::vector<float>{2, 4, 6}));
    cudaFree(x);
  });
  for (ncclComm_t k : two) ncclCommDestroy(k);
}

TEST(NcclEmulation, GroupCallsRunAtTheOutermostGroupEnd) {
  std::vector<ncclComm_t> comms = clique(2);
  on_ranks(2, [&](int r) {
    float* a = device<float>({1.f + r});
    float* b = device<float>({10.f * (r + 1)});
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(a, a, 1, ncclFloat32, ncclSum, comms[r], nullptr), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);  // inner: nothing runs yet
    EXPECT_EQ(host(a, 1)[0], 1.f + r);
    ASSERT_EQ(ncclAllReduce(b, b, 1, ncclFloat32, ncclMax, comms[r], nullptr), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    EXPECT_EQ(host(a, 1)[0], 3.f);
    EXPECT_EQ(host(b, 1)[0], 20.f);
    cudaFree(a), cudaFree(b);
  });
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // no group open
  for (ncclComm_t c : comms) ncclCommDestroy(c);
}

// Point to point: each send is matched by its peer's receive, in order; grouped, every rank may
// send to and receive from every other (an all-to-all) without waiting for the others first;
// the buffers, peers and matching counts as NCCL requires.
TEST(NcclEmulation, SendsMeetTheirPeersReceives) {
  constexpr int n = 3;
  std::vector<ncclComm_t> comms = clique(n);
  on_ranks(n, [&](int r) {
    ncclComm_t c = comms[r];
    // A chain outside any group: 0 sends to 1, which receives and sends to 2.
    float* x = device<float>({10.f * (r + 1), 0.5f});
    float* y = device<float>({0.f, 0.f});
    if (r == 0) EXPECT_EQ(ncclSend(x, 2, ncclFloat32, 1, c, nullptr), ncclSuccess);
    if (r == 1) {
      EXPECT_EQ(ncclRecv(y, 2, ncclFloat32, 0, c, nullptr), ncclSuccess);
      EXPECT_EQ(host(y, 2), (std::vector<float>{10.f, 0.5f}));
      EXPECT_EQ(ncclSend(x, 1, ncclFloat32, 2, c, nullptr), ncclSuccess);
    }
    if (r == 2) {
      EXPECT_EQ(ncclRecv(y, 1, ncclFloat32, 1, c, nullptr), ncclSuccess);
      EXPECT_EQ(host(y, 1)[0], 20.f);
    }
    // An all-to-all: rank r sends 100 r + p to each p (itself included), in one group.
    std::vector<float> mine(n);
    for (int p = 0; p < n; ++p) mine[p] = 100.f * r + p;
    float* in = device<float>(mine);
    float* out = device<float>(std::vector<float>(n, -1.f));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int p = 0; p < n; ++p) {
      ASSERT_EQ(ncclSend(in + p, 1, ncclFloat32, p, c, nullptr), ncclSuccess);
      ASSERT_EQ(ncclRecv(out + p, 1, ncclFloat32, p, c, nullptr), ncclSuccess);
    }
    EXPECT_EQ(host(out, n), std::vector<float>(n, -1.f));  // queued until the group ends
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    std::vector<float> want(n);
    for (int p = 0; p < n; ++p) want[p] = 100.f * p + r;
    EXPECT_EQ(host(out, n), want);
    // Two messages to one peer arrive in the order they were sent.
    if (r == 0) {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      ASSERT_EQ(ncclSend(in, 1, ncclFloat32, 2, c, nullptr), ncclSuccess);
      ASSERT_EQ(ncclSend(in + 2, 1, ncclFloat32, 2, c, nullptr), ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    }
    if (r == 2) {
      EXPECT_EQ(ncclRecv(y, 1, ncclFloat32, 0, c, nullptr), ncclSuccess);
      EXPECT_EQ(ncclRecv(y + 1, 1, ncclFloat32, 0, c, nullptr), ncclSuccess);
      EXPECT_EQ(host(y, 2), (std::vector<float>{0.f, 2.f}));
    }
    // Refused before anything moves: a host buffer, a peer out of range, a short buffer.
    float h = 0;
    EXPECT_EQ(ncclSend(&h, 1, ncclFloat32, (r + 1) % n, c, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclRecv(y, 1, ncclFloat32, n, c, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclSend(x, 3, ncclFloat32, (r + 1) % n, c, nullptr), ncclInvalidArgument);
    // A receive whose count is not the send's: both sides told.
    if (r == 0) EXPECT_EQ(ncclSend(x, 2, ncclFloat32, 1, c, nullptr), ncclInvalidUsage);
    if (r == 1) EXPECT_EQ(ncclRecv(y, 1, ncclFloat32, 0, c, nullptr), ncclInvalidUsage);
    cudaFree(x), cudaFree(y), cudaFree(in), cudaFree(out);
  });
  for (ncclComm_t c : comms) ncclCommDestroy(c);
}

// The backend's NCCL communicator (nccl.cu) over the emulation: the TP group's collectives on
// device tensors, NCCL's memory measured around its initialisation, and a host tensor refused
// as NCCL refuses it (the cross-entropy's host vector was such a defect).
TEST(NcclComm, TheTpCollectivesRunOverNccl) {
  constexpr int n = 4;
  exec::InProcessWorld world(n, 1);
  std::barrier<> sync(n);
  std::vector<unsigned char> shared;
  on_ranks(n, [&](int r) {
    exec::Communicator& mpi = world.comm(0, 0, r);
    auto broadcast = [&](void* data, int bytes) {  // from the TP group's rank 0
      auto* p = static_cast<unsigned char*>(data);
      if (r == 0) shared.assign(p, p + bytes);
      sync.arrive_and_wait();
      if (r != 0) std::memcpy(data, shared.data(), static_cast<size_t>(bytes));
      sync.arrive_and_wait();
    };
    std::unique_ptr<exec::Communicator> c = cuda::make_nccl_comm(mpi, broadcast);
    sync.arrive_and_wait();  // every rank's measurement taken before any allocates again
    EXPECT_EQ(c->tp_rank(), r);
    EXPECT_EQ(c->tp_size(), n);
    auto overheads = c->measured_overheads();
    ASSERT_EQ(overheads.size(), 1u);  // this rank's buffers, and maybe its peers' taken meanwhile
    EXPECT_GE(overheads[0].second, static_cast<int64_t>(emu::kNcclCommBytes));
    EXPECT_EQ(overheads[0].second % static_cast<int64_t>(emu::kNcclCommBytes), 0);
    exec::Tensor in{device<float>({1.f * r, 2.f * r}), {{1, 2}, Dtype::kFp32}};
    exec::Tensor out{device<float>(std::vector<float>(2 * n)), {{n, 2}, Dtype::kFp32}};
    c->all_gather(in, out);
    EXPECT_EQ(host(out.as<float>(), 4), (std::vector<float>{0, 0, 1, 2}));
    c->reduce_scatter(out, in);  // every rank's gathered rows summed: n x row r
    EXPECT_EQ(host(in.as<float>(), 2), (std::vector<float>{4.f * r, 8.f * r}));
    c->all_reduce_max(in);
    EXPECT_EQ(host(in.as<float>(), 2), (std::vector<float>{12, 24}));
    std::vector<float> on_host(2);
    exec::Tensor h{on_host.data(), {{1, 2}, Dtype::kFp32}};
    EXPECT_THROW(c->all_reduce(h), std::runtime_error);
    sync.arrive_and_wait();  // no rank leaves while another still calls
    cudaFree(in.data), cudaFree(out.data);
  });
}

// nanoplan calibrate's collectives over the emulation: every kind at every size, on 3 ranks; and
// the fit recovers the cost model's bandwidth and ring-step latency from times that follow it
// (nccl-tests' H100 figures: 360 GB/s, 5 us per step).
TEST(CalibrateCollectives, TimesEveryKindAndFitsTheCostModelsForm) {
  cuda::CollectiveOptions o;
  o.ranks = 3, o.bytes = {6 * 1024, 6 * 65536}, o.warmup = 1, o.repetitions = 2;
  Result<std::vector<cuda::CalibratedCollective>> r = cuda::calibrate_collectives(o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 5u);
  EXPECT_EQ((*r)[3].kind, "all_to_all");
  EXPECT_EQ((*r)[4].kind, "p2p");
  for (const cuda::CalibratedCollective& c : *r) {
    EXPECT_EQ(c.ranks, 3);
    ASSERT_EQ(c.seconds.size(), 2u) << c.kind;
    EXPECT_EQ(c.seconds[1].first, 6 * 65536) << c.kind;
    EXPECT_GT(c.bus_bytes_per_s, 0) << c.kind;
    EXPECT_TRUE(std::isfinite(c.bus_bytes_per_s) && c.step_latency_s >= 0) << c.kind;
  }
  EXPECT_FALSE(cuda::calibrate_collectives({1, {1024}, 1, 1}).ok());

  for (const char* kind : {"all_reduce", "all_gather"}) {
    cuda::CalibratedCollective c{kind, 8, {}, 0, 0};
    const double twice = std::string(kind) == "all_reduce" ? 2 : 1;
    for (int64_t bytes : {int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 24, int64_t{1} << 29})
      c.seconds.push_back(
          {bytes, twice * (7.0 / 8 * static_cast<double>(bytes) / 360e9 + 7 * 5e-6)});
    cuda::fit_collective(c);
    EXPECT_NEAR(c.bus_bytes_per_s, 360e9, 360e9 * 1e-6) << kind;
    EXPECT_NEAR(c.step_latency_s, 5e-6, 5e-12) << kind;
  }
  // A point-to-point message: its bytes once, one latency (pipeline_p2p_seconds's form).
  cuda::CalibratedCollective p2p{"p2p", 8, {}, 0, 0};
  for (int64_t bytes : {int64_t{1} << 16, int64_t{1} << 22, int64_t{1} << 28})
    p2p.seconds.push_back({bytes, static_cast<double>(bytes) / 300e9 + 8e-6});
  cuda::fit_collective(p2p);
  EXPECT_NEAR(p2p.bus_bytes_per_s, 300e9, 300e9 * 1e-6);
  EXPECT_NEAR(p2p.step_latency_s, 8e-6, 8e-12);
  cuda::CalibratedCollective flat{"reduce_scatter", 2, {{1024, 1e-3}, {4096, 1e-3}}, 0, 0};
  cuda::fit_collective(flat);  // no growth with size: the slowest rate, no latency
  EXPECT_DOUBLE_EQ(flat.bus_bytes_per_s, 0.5 * 1024 / 1e-3);
  EXPECT_EQ(flat.step_latency_s, 0);
}

}  // namespace
}  // namespace np

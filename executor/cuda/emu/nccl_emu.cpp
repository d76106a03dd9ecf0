// The NCCL emulation (nccl_emu.hpp): communicators whose ranks are threads, meeting per call.
#include "executor/cuda/emu/nccl_emu.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "executor/bf16.hpp"

namespace {

enum class Kind { kAllGather, kReduceScatter, kAllReduce };

// One rank's call, as it was made.
struct Call {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;  // all-gather: per rank sent; reduce-scatter: per rank received; all-reduce: all
  ncclDataType_t type;
  ncclRedOp_t op;
  bool operator==(const Call& o) const {
    return kind == o.kind && count == o.count && type == o.type && op == o.op;
  }
};

// The ranks' calls of one sequence number; the last rank to arrive runs the collective.
struct Round {
  std::vector<Call> calls;
  int arrived = 0, left = 0;
  bool done = false;
  ncclResult_t result = ncclSuccess;
};

// A send's data, taken when it is posted, until the receive that matches it.
struct Message {
  std::vector<unsigned char> data;
  size_t count = 0;
  ncclDataType_t type = ncclInt8;
  bool consumed = false;
  ncclResult_t result = ncclSuccess;  // the receive's verdict, which the send reports too
};

struct Clique {
  int nranks = 0, joined = 0, destroyed = 0;
  std::vector<bool> taken;
  std::map<uint64_t, Round> rounds;
  // Posted sends not yet received, by (sender, receiver), in the order they were made.
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Message>>> mail;
  std::mutex mu;
  std::condition_variable cv;
};

std::mutex registry_mu;
std::map<std::string, std::shared_ptr<Clique>> registry;  // by unique id

}  // namespace

struct np_emu_nccl_comm {
  std::shared_ptr<Clique> clique;
  std::string id;
  int rank = 0;
  uint64_t next = 0;  // this rank's next sequence number
  void* buffers = nullptr;
};

namespace {

// How long a rank waits for the others before the call fails (a missing rank is a hang on a
// GPU; here it is an error).
constexpr auto kPatience = std::chrono::seconds(60);

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
  }
}
bool known_type(ncclDataType_t t) { return t >= ncclInt8 && t <= ncclBfloat16; }

// The element `i` of a buffer of type `t` as a double, and back (the types nanoplan moves are
// exact in a double: bf16, fp32, 64-bit integers within 2^53, bytes).
double load(const unsigned char* p, ncclDataType_t t, size_t i) {
  switch (t) {
    case ncclInt8: return reinterpret_cast<const int8_t*>(p)[i];
    case ncclUint8: return p[i];
    case ncclInt32: return reinterpret_cast<const int32_t*>(p)[i];
    case ncclUint32: return reinterpret_cast<const uint32_t*>(p)[i];
    case ncclInt64: return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
    case ncclUint64: return static_cast<double>(reinterpret_cast<const uint64_t*>(p)[i]);
    case ncclFloat32: return reinterpret_cast<const float*>(p)[i];
    case ncclFloat64: return reinterpret_cast<const double*>(p)[i];
    case ncclBfloat16: return np::bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
    default: return 0;  // fp16: refused before
  }
}
void store(unsigned char* p, ncclDataType_t t, size_t i, double v) {
  switch (t) {
    case ncclInt8: reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case ncclUint8: p[i] = static_cast<unsigned char>(v); break;
    case ncclInt32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case ncclUint32: reinterpret_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v); break;
    case ncclInt64: reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case ncclUint64: reinterpret_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v); break;
    case ncclFloat32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); break;
    case ncclFloat64: reinterpret_cast<double*>(p)[i] = v; break;
    case ncclBfloat16:
      reinterpret_cast<uint16_t*>(p)[i] = np::f32_to_bf16_bits(static_cast<float>(v));
      break;
    default: break;
  }
}
// One step of a reduction in the type's own arithmetic: floats round to their type each step.
double combine(double a, double b, ncclRedOp_t op, ncclDataType_t t) {
  double r = op == ncclMax ? std::max(a, b) : op == ncclMin ? std::min(a, b)
             : op == ncclProd ? a * b
                              : a + b;
  if (t == ncclFloat32) return static_cast<float>(r);
  if (t == ncclBfloat16) return np::bf16_bits_to_f32(np::f32_to_bf16_bits(static_cast<float>(r)));
  return r;
}

// A buffer is device memory holding at least `bytes`.
bool device_buffer(const void* p, size_t bytes) {
  std::optional<size_t> left = np::emu::device_bytes_from(p);
  return left && *left >= bytes;
}

// This rank's arguments, checked before it meets the others.
ncclResult_t check(const Call& c, int nranks) {
  if (!known_type(c.type) || c.type == ncclFloat16) return ncclInvalidArgument;
  if (c.kind != Kind::kAllGather && (c.op < ncclSum || c.op > ncclMin)) return ncclInvalidArgument;
  const size_t e = type_bytes(c.type), n = static_cast<size_t>(nranks);
  size_t in = c.count * e, out = c.count * e;
  if (c.kind == Kind::kAllGather) out *= n;
  if (c.kind == Kind::kReduceScatter) in *= n;
  if (c.count > 0 && (!device_buffer(c.send, in) || !device_buffer(c.recv, out)))
    return ncclInvalidArgument;
  return ncclSuccess;
}

// Runs the collective over every rank's call (the caller holds the clique's lock). Inputs are
// read whole before any output is written, so in-place calls are exact.
void run(const std::vector<Call>& calls) {
  const Call& c = calls[0];
  const size_t n = calls.size(), e = type_bytes(c.type);
  const size_t in_count = c.kind == Kind::kReduceScatter ? c.count * n : c.count;
  std::vector<std::vector<unsigned char>> in(n);
  for (size_t r = 0; r < n; ++r) {
    in[r].resize(in_count * e);
    if (!in[r].empty()) std::memcpy(in[r].data(), calls[r].send, in[r].size());
  }
  if (c.kind == Kind::kAllGather) {
    for (size_t r = 0; r < n; ++r)
      for (size_t s = 0; s < n; ++s)
        std::memcpy(static_cast<unsigned char*>(calls[r].recv) + s * c.count * e, in[s].data(),
                    c.count * e);
    return;
  }
  std::vector<double> sum(in_count);
  for (size_t i = 0; i < in_count; ++i) {
    double v = load(in[0].data(), c.type, i);
    for (size_t r = 1; r < n; ++r) v = combine(v, load(in[r].data(), c.type, i), c.op, c.type);
    sum[i] = v;
  }
  for (size_t r = 0; r < n; ++r) {
    auto* out = static_cast<unsigned char*>(calls[r].recv);
    const size_t first = c.kind == Kind::kReduceScatter ? r * c.count : 0;
    for (size_t i = 0; i < c.count; ++i) store(out, c.type, i, sum[first + i]);
  }
}

// This rank's call meets the others' of the same sequence number.
ncclResult_t meet(ncclComm_t comm, const Call& call) {
  if (!comm || !comm->clique) return ncclInvalidArgument;
  if (ncclResult_t r = check(call, comm->clique->nranks); r != ncclSuccess) return r;
  Clique& q = *comm->clique;
  std::unique_lock<std::mutex> lock(q.mu);
  Round& round = q.rounds[comm->next];
  const uint64_t seq = comm->next++;
  if (round.calls.empty()) round.calls.resize(static_cast<size_t>(q.nranks));
  round.calls[static_cast<size_t>(comm->rank)] = call;
  if (++round.arrived == q.nranks) {
    bool same = std::all_of(round.calls.begin(), round.calls.end(),
                            [&](const Call& c) { return c == round.calls[0]; });
    if (same)
      run(round.calls);
    else
      round.result = ncclInvalidUsage;
    round.done = true;
    q.cv.notify_all();
  } else if (!q.cv.wait_for(lock, kPatience, [&] { return round.done; })) {
    return ncclRemoteError;  // the others never came
  }
  ncclResult_t result = round.result;
  if (++round.left == q.nranks) q.rounds.erase(seq);
  return result;
}

// A point-to-point half: this rank's send to `peer`, or its receive from it.
struct PeerOp {
  bool send = true;
  void* buffer = nullptr;  // read by a send, written by a receive
  size_t count = 0;
  ncclDataType_t type = ncclInt8;
  int peer = 0;
};

ncclResult_t check(ncclComm_t comm, const PeerOp& op) {
  if (!comm || !comm->clique) return ncclInvalidArgument;
  if (!known_type(op.type) || op.type == ncclFloat16) return ncclInvalidArgument;
  if (op.peer < 0 || op.peer >= comm->clique->nranks) return ncclInvalidArgument;
  if (op.count > 0 && !device_buffer(op.buffer, op.count * type_bytes(op.type)))
    return ncclInvalidArgument;
  return ncclSuccess;
}

// Posts a send: its data is taken now, and the peer's matching receive copies it out.
std::shared_ptr<Message> post(ncclComm_t comm, const PeerOp& op) {
  auto m = std::make_shared<Message>();
  m->count = op.count, m->type = op.type;
  m->data.resize(op.count * type_bytes(op.type));
  if (!m->data.empty()) std::memcpy(m->data.data(), op.buffer, m->data.size());
  Clique& q = *comm->clique;
  std::lock_guard<std::mutex> lock(q.mu);
  q.mail[{comm->rank, op.peer}].push_back(m);
  q.cv.notify_all();
  return m;
}

// Waits until a posted send has been received.
ncclResult_t delivered(ncclComm_t comm, const std::shared_ptr<Message>& m) {
  Clique& q = *comm->clique;
  std::unique_lock<std::mutex> lock(q.mu);
  if (!q.cv.wait_for(lock, kPatience, [&] { return m->consumed; })) return ncclRemoteError;
  return m->result;
}

// Receives the peer's next send to this rank.
ncclResult_t receive(ncclComm_t comm, const PeerOp& op) {
  Clique& q = *comm->clique;
  std::unique_lock<std::mutex> lock(q.mu);
  auto& queue = q.mail[{op.peer, comm->rank}];
  if (!q.cv.wait_for(lock, kPatience, [&] { return !queue.empty(); })) return ncclRemoteError;
  std::shared_ptr<Message> m = queue.front();
  queue.pop_front();
  if (m->count != op.count || m->type != op.type)
    m->result = ncclInvalidUsage;
  else if (!m->data.empty())
    std::memcpy(op.buffer, m->data.data(), m->data.size());
  m->consumed = true;
  q.cv.notify_all();
  return m->result;
}

// Calls made between ncclGroupStart and ncclGroupEnd, per thread: a collective, or a
// point-to-point half.
struct Queued {
  ncclComm_t comm = nullptr;
  bool collective = true;
  Call call{};
  PeerOp peer{};
};
thread_local int group_depth = 0;
thread_local std::vector<Queued> group_calls;

ncclResult_t issue(ncclComm_t comm, const Call& call) {
  if (group_depth == 0) return meet(comm, call);
  if (!comm || !comm->clique) return ncclInvalidArgument;
  if (ncclResult_t r = check(call, comm->clique->nranks); r != ncclSuccess) return r;
  group_calls.push_back({comm, true, call, {}});
  return ncclSuccess;
}

ncclResult_t issue(ncclComm_t comm, const PeerOp& op) {
  if (ncclResult_t r = check(comm, op); r != ncclSuccess) return r;
  if (group_depth > 0) {
    group_calls.push_back({comm, false, {}, op});
    return ncclSuccess;
  }
  if (!op.send) return receive(comm, op);
  return delivered(comm, post(comm, op));
}

std::atomic<uint64_t> next_id{1};

}  // namespace

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  std::memset(id->internal, 0, sizeof id->internal);
  const std::string s = "np-emu-nccl-" + std::to_string(next_id++);
  std::memcpy(id->internal, s.data(), s.size());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  const std::string key(id.internal, strnlen(id.internal, sizeof id.internal));
  if (key.empty()) return ncclInvalidArgument;
  std::shared_ptr<Clique> q;
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    std::shared_ptr<Clique>& slot = registry[key];
    if (!slot) {
      slot = std::make_shared<Clique>();
      slot->nranks = nranks;
      slot->taken.assign(static_cast<size_t>(nranks), false);
    }
    q = slot;
  }
  std::unique_lock<std::mutex> lock(q->mu);
  if (q->nranks != nranks || q->taken[static_cast<size_t>(rank)]) return ncclInvalidUsage;
  q->taken[static_cast<size_t>(rank)] = true;
  ++q->joined;
  q->cv.notify_all();
  if (!q->cv.wait_for(lock, kPatience, [&] { return q->joined == q->nranks; }))
    return ncclRemoteError;
  lock.unlock();
  auto c = std::make_unique<np_emu_nccl_comm>();
  c->clique = q, c->id = key, c->rank = rank;
  if (cudaMalloc(&c->buffers, np::emu::kNcclCommBytes) != cudaSuccess)
    return ncclUnhandledCudaError;
  *comm = c.release();
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  cudaFree(comm->buffers);
  {
    std::lock_guard<std::mutex> lock(comm->clique->mu);
    if (++comm->clique->destroyed == comm->clique->nranks) {
      std::lock_guard<std::mutex> reg(registry_mu);
      registry.erase(comm->id);
    }
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->clique->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t) {
  return issue(comm, {Kind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t) {
  return issue(comm, {Kind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op});
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t) {
  return issue(comm, {Kind::kAllReduce, sendbuff, recvbuff, count, datatype, op});
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  std::vector<Queued> calls;
  calls.swap(group_calls);
  ncclResult_t result = ncclSuccess;
  auto keep = [&result](ncclResult_t r) {
    if (r != ncclSuccess && result == ncclSuccess) result = r;
  };
  // Every send first, then the collectives and receives in order, then the sends' delivery.
  std::vector<std::pair<ncclComm_t, std::shared_ptr<Message>>> sent;
  for (const Queued& c : calls)
    if (!c.collective && c.peer.send) sent.emplace_back(c.comm, post(c.comm, c.peer));
  for (const Queued& c : calls) {
    if (c.collective)
      keep(meet(c.comm, c.call));
    else if (!c.peer.send)
      keep(receive(c.comm, c.peer));
  }
  for (const auto& [comm, m] : sent) keep(delivered(comm, m));
  return result;
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t) {
  return issue(comm, PeerOp{true, const_cast<void*>(sendbuff), count, datatype, peer});
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t) {
  return issue(comm, PeerOp{false, recvbuff, count, datatype, peer});
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

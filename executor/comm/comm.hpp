// The communicator interface of one rank: collectives over its TP group and its data-parallel
// group, and point-to-point transfers to its pipeline neighbours. Implementations: in-process
// threads (comm/inproc.hpp), MPI processes (comm/mpi.hpp), and NCCL for the TP collectives of one
// process per GPU (cuda/nccl.cu). Collectives are deterministic: reductions sum in rank order, in fp32, and every rank
// gets bitwise the same result. None of them allocates device memory: they write into the tensors
// they are given (staging of their own, like NCCL's buffers, is on the estimate's NCCL line).
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "executor/tensor.hpp"

namespace np::exec {

// The data-parallel group a parameter group's gradients and ZeRO shards span: the dense weights'
// (every replica and CP rank: dp x cp ranks) or the experts' (the ranks holding the same experts:
// dp x cp / ep).
enum class DpGroup { kDense, kExpert };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int64_t tp_rank() const = 0;
  virtual int64_t tp_size() const = 0;
  // out = concat over TP ranks of in along dim 0; out has tp_size() x in's rows.
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;
  // out = this rank's row block of the sum over TP ranks of in; in has tp_size() x out's rows.
  virtual void reduce_scatter(const Tensor& in, const Tensor& out) = 0;
  // t = sum over TP ranks of t, in place.
  virtual void all_reduce(const Tensor& t) = 0;
  // t = the element-wise maximum over TP ranks of t (fp32), in place: Megatron's
  // all_reduce(op=MAX) of the logits' row maxima in its vocab-parallel cross-entropy.
  virtual void all_reduce_max(const Tensor& t) = 0;
  // Pipeline transfers to the rank of the same TP index on pipeline stage `stage`. A receive
  // takes the oldest message of its tag from that stage (tags >= 0: the interleaved schedule's
  // chunks and directions share one pair of stages; each tag's messages keep their order).
  virtual void send(const Tensor& t, int64_t stage, int64_t tag) = 0;
  virtual void recv(const Tensor& t, int64_t stage, int64_t tag) = 0;
  // t = t + the same tensor of the rank with this TP index on pipeline stage `peer`; both ranks
  // call it and get bitwise the same sum (tied embeddings: the first and the last stage).
  virtual void all_reduce_with(const Tensor& t, int64_t peer) = 0;

  // The context-parallel group: the ranks of this stage, data replica and TP index, one per
  // sequence part (rank c holds chunks c and 2 cp - 1 - c). Along dim 0, in CP rank order:
  // out = the concatenation of every rank's in; out = this rank's block of the sum (fp32, in
  // rank order) of every rank's in.
  virtual int64_t cp_rank() const { return 0; }
  virtual int64_t cp_size() const { return 1; }
  virtual void cp_all_gather(const Tensor& in, const Tensor& out);
  virtual void cp_reduce_scatter(const Tensor& in, const Tensor& out);

  // The data-parallel group: the ranks of this pipeline stage and TP index, one per replica and
  // CP rank (dp x cp of them: gradients are summed and ZeRO shards over all of them; DP rank
  // d x cp + c).
  // The expert group (DpGroup::kExpert) is its ranks of the same EP rank: dp x cp / ep of them,
  // rank (d / ep) x cp + c for replica d and CP rank c; with ep = 1 the DP group itself.
  // Element i of t stands at index first + i of a flat buffer split over the group in blocks of
  // `shard` elements, block q owned by group rank q (ZeRO's partition of the gradient buffer).
  // Defaults: one replica (no data-parallel group), where the DP collectives leave t as it is.
  virtual int64_t dp_rank() const { return 0; }
  virtual int64_t dp_size() const { return 1; }
  int64_t group_rank(DpGroup g) const {
    return g == DpGroup::kDense ? dp_rank()
                                : dp_rank() / cp_size() / ep_size() * cp_size() + cp_rank();
  }
  int64_t group_size(DpGroup g) const {
    return g == DpGroup::kDense ? dp_size() : dp_size() / ep_size();
  }
  // The elements this rank owns become their sum over the group (fp32, in rank order); the
  // others keep their values (a reduce-scatter in place).
  virtual void dp_reduce_scatter(DpGroup g, const Tensor& t, int64_t first, int64_t shard);
  // ZeRO-2/3's bucket reduction: `into` holds this rank's block of the flat buffer (elements
  // group_rank x shard onwards); each owned element of t is summed over the group (fp32: into's
  // value first, then the ranks in order) into its place in `into`. t is left as it was.
  virtual void dp_reduce_scatter_into(DpGroup g, const Tensor& t, int64_t first, int64_t shard,
                                      const Tensor& into);
  // Every rank's owned elements are copied to the same elements of every other rank (an
  // all-gather in place).
  virtual void dp_all_gather(DpGroup g, const Tensor& t, int64_t first, int64_t shard);
  // FSDP2's collectives over shard groups of `span` consecutive group ranks (HSDP's replicas
  // each shard over their own span ranks; span = the group size without HSDP). t holds span
  // blocks of `shard` elements; group rank q's own block is q mod span.
  // dp_all_gather_blocks: every rank takes the blocks of its shard group's ranks (an all-gather
  // in place). dp_reduce_scatter_blocks_into: `into` (shard elements) += block (rank mod span)
  // of t summed over every rank of the group, in rank order, in fp32 (the shard group's
  // reduce-scatter and the replicas' all-reduce at once).
  virtual void dp_all_gather_blocks(DpGroup g, const Tensor& t, int64_t shard, int64_t span);
  virtual void dp_reduce_scatter_blocks_into(DpGroup g, const Tensor& t, int64_t shard,
                                             int64_t span, const Tensor& into);
  // t = the element-wise maximum over the group of t (fp32), in place: torchao's amax all-reduce
  // before FSDP's float8 all-gather (a shard group's; HSDP's replicas hold the same values).
  virtual void dp_all_reduce_max(DpGroup g, const Tensor& t);
  // t = its sum over the group: the reduce-scatter and the all-gather over blocks of
  // ceil(n / size) elements, so ZeRO-0 and ZeRO-1 sum bitwise alike.
  void dp_all_reduce(DpGroup g, const Tensor& t) {
    if (group_size(g) == 1) return;
    int64_t shard = (t.numel() + group_size(g) - 1) / group_size(g);
    dp_reduce_scatter(g, t, 0, shard);
    dp_all_gather(g, t, 0, shard);
  }

  // The expert-parallel group: the ep replicas (d / ep) x ep .. + ep - 1 of this stage, CP rank
  // and TP index; EP rank d mod ep holds experts [ep_rank x E / ep, (ep_rank + 1) x E / ep).
  // all_to_all: in and out are ep equal row blocks; out's block q is block ep_rank() of rank q's
  // in (the MoE dispatch and combine). Default: one EP rank, a copy.
  int64_t ep_rank() const { return dp_rank() / cp_size() % ep_size(); }
  virtual int64_t ep_size() const { return 1; }
  virtual void ep_all_to_all(const Tensor& in, const Tensor& out);
  // Device memory the communicator took as it started, measured (NCCL's buffers): name, bytes.
  virtual std::vector<std::pair<std::string, int64_t>> measured_overheads() const { return {}; }
};

// The local element range [lo, hi) of t that DP rank q owns (t's element i is element first + i
// of the flat buffer, split in blocks of `shard` elements).
inline std::pair<int64_t, int64_t> dp_owned(const Tensor& t, int64_t first, int64_t shard,
                                            int64_t q) {
  auto clamp = [&](int64_t x) { return x < 0 ? 0 : x > t.numel() ? t.numel() : x; };
  return {clamp(q * shard - first), clamp((q + 1) * shard - first)};
}

// One replica: the reduce-scatter and the all-gather leave t as it is; the bucket reduction has
// no group to sum over and needs the implementation's arithmetic.
inline void Communicator::dp_reduce_scatter(DpGroup g, const Tensor&, int64_t, int64_t) {
  if (group_size(g) != 1)
    throw std::logic_error("dp_reduce_scatter: this communicator has no data-parallel group");
}
inline void Communicator::dp_all_gather_blocks(DpGroup g, const Tensor&, int64_t, int64_t) {
  if (group_size(g) != 1)
    throw std::logic_error("dp_all_gather_blocks: this communicator has no data-parallel group");
}
inline void Communicator::dp_reduce_scatter_blocks_into(DpGroup, const Tensor&, int64_t, int64_t,
                                                        const Tensor&) {
  throw std::logic_error("dp_reduce_scatter_blocks_into: this communicator has no arithmetic");
}
inline void Communicator::dp_all_reduce_max(DpGroup g, const Tensor&) {
  if (group_size(g) != 1)
    throw std::logic_error("dp_all_reduce_max: this communicator has no data-parallel group");
}
inline void Communicator::dp_all_gather(DpGroup g, const Tensor&, int64_t, int64_t) {
  if (group_size(g) != 1)
    throw std::logic_error("dp_all_gather: this communicator has no data-parallel group");
}
inline void Communicator::dp_reduce_scatter_into(DpGroup, const Tensor&, int64_t, int64_t,
                                                 const Tensor&) {
  throw std::logic_error("dp_reduce_scatter_into: this communicator has no data-parallel group");
}
inline void Communicator::ep_all_to_all(const Tensor& in, const Tensor& out) {
  if (ep_size() != 1 || in.bytes() != out.bytes())
    throw std::logic_error("ep_all_to_all: this communicator has no expert-parallel group");
  std::memcpy(out.data, in.data, static_cast<size_t>(in.bytes()));
}

// Without context parallelism (one CP rank) the CP collectives are copies.
inline void Communicator::cp_all_gather(const Tensor& in, const Tensor& out) {
  if (cp_size() != 1 || in.bytes() != out.bytes())
    throw std::logic_error("cp_all_gather: this communicator has no context-parallel group");
  std::memcpy(out.data, in.data, static_cast<size_t>(in.bytes()));
}
inline void Communicator::cp_reduce_scatter(const Tensor& in, const Tensor& out) {
  cp_all_gather(in, out);
}

// Thrown inside the other ranks' communication calls after one rank aborted the run.
struct RunAborted : std::runtime_error {
  RunAborted() : std::runtime_error("run aborted by another rank") {}
};

// The communicators of one run, one per (pipeline stage, DP rank, TP rank).
class CommWorld {
 public:
  virtual ~CommWorld() = default;
  virtual Communicator& comm(int64_t stage, int64_t dp_rank, int64_t tp_rank) = 0;
  // Called by a failing rank: releases its peers from any collective or receive; their calls
  // then throw RunAborted.
  virtual void abort(int64_t stage, int64_t dp_rank, int64_t tp_rank) = 0;
};

// dp: data replicas; the world's DP groups have dp x cp ranks (comm()'s dp_rank: d x cp + c);
// ep divides dp (EP rank d mod ep).
using CommWorldFactory = std::function<std::unique_ptr<CommWorld>(int64_t tp, int64_t pp,
                                                                  int64_t dp, int64_t cp, int64_t ep)>;

}  // namespace np::exec

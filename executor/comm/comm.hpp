// The communicator interface of one rank: collectives over its TP group and point-to-point
// transfers to its pipeline neighbours. Implementations: in-process threads (comm/inproc.hpp);
// NCCL later. Collectives are deterministic: reductions sum in rank order, in fp32, and every rank
// gets bitwise the same result. None of them allocates: they write into the tensors they are given.
#pragma once
#include <cstdint>

#include "executor/tensor.hpp"

namespace np::exec {

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
  // Pipeline transfers to the rank of the same TP index on pipeline stage `stage`.
  virtual void send(const Tensor& t, int64_t stage) = 0;
  virtual void recv(const Tensor& t, int64_t stage) = 0;
  virtual void barrier() = 0;  // the TP group
};

}  // namespace np::exec

// The NCCL communicator (nccl.hpp). Every call enqueues on the default stream (the CUDA backend's)
// and waits for it, as the in-process collectives complete before they return.
#if defined(NANOPLAN_CUDA_EMULATION)
#include "executor/cuda/emu/nccl_emu.hpp"  // CI runs this file over the NCCL emulation
#else
#include <nccl.h>
#endif

#include "executor/cuda/common.cuh"
#include "executor/cuda/nccl.hpp"

#define NP_NCCL_CHECK(stmt)                                                                  \
  do {                                                                                       \
    ncclResult_t np_nr_ = (stmt);                                                            \
    if (np_nr_ != ncclSuccess)                                                               \
      ::np::cuda::cuda_failure(#stmt, __FILE__, __LINE__, ncclGetErrorString(np_nr_));       \
  } while (0)

namespace np::cuda {
namespace {

ncclDataType_t nccl_type(const Tensor& t) {
  switch (t.type.dtype) {
    case Dtype::kBf16: return ncclBfloat16;
    case Dtype::kFp32: return ncclFloat32;
    case Dtype::kI64: return ncclInt64;
    default: return ncclUint8;
  }
}
size_t nccl_count(const Tensor& t) {
  return nccl_type(t) == ncclUint8 ? static_cast<size_t>(t.bytes()) : static_cast<size_t>(t.numel());
}

class NcclComm final : public exec::Communicator {
 public:
  NcclComm(exec::Communicator& mpi, const std::function<void(void*, int)>& broadcast) : mpi_(mpi) {
    ncclUniqueId id;
    if (mpi.tp_rank() == 0) NP_NCCL_CHECK(ncclGetUniqueId(&id));
    broadcast(&id, static_cast<int>(sizeof id));
    size_t free_before = 0, free_after = 0, total = 0;
    NP_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
    NP_NCCL_CHECK(ncclCommInitRank(&comm_, static_cast<int>(mpi.tp_size()), id,
                                   static_cast<int>(mpi.tp_rank())));
    NP_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    buffers_ = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after);
  }
  std::vector<std::pair<std::string, int64_t>> measured_overheads() const override {
    return {{"NCCL communicator (its buffers, measured around ncclCommInitRank)", buffers_}};
  }
  ~NcclComm() override { ncclCommDestroy(comm_); }
  int64_t tp_rank() const override { return mpi_.tp_rank(); }
  int64_t tp_size() const override { return mpi_.tp_size(); }

  void all_gather(const Tensor& in, const Tensor& out) override {
    need(out.bytes() == in.bytes() * tp_size(), "nccl all_gather: output must be tp x the input");
    NP_NCCL_CHECK(ncclAllGather(in.data, out.data, nccl_count(in), nccl_type(in), comm_, nullptr));
    done();
  }
  void reduce_scatter(const Tensor& in, const Tensor& out) override {
    need(in.bytes() == out.bytes() * tp_size() && in.type.dtype == out.type.dtype,
         "nccl reduce_scatter: input must be tp x the output");
    NP_NCCL_CHECK(ncclReduceScatter(in.data, out.data, nccl_count(out), nccl_type(out), ncclSum, comm_,
                                    nullptr));
    done();
  }
  void all_reduce(const Tensor& t) override {
    NP_NCCL_CHECK(ncclAllReduce(t.data, t.data, nccl_count(t), nccl_type(t), ncclSum, comm_, nullptr));
    done();
  }
  void all_reduce_max(const Tensor& t) override {
    NP_NCCL_CHECK(
        ncclAllReduce(t.data, t.data, nccl_count(t), nccl_type(t), ncclMax, comm_, nullptr));
    done();
  }
  void send(const Tensor& t, int64_t stage, int64_t tag) override { mpi_.send(t, stage, tag); }
  void recv(const Tensor& t, int64_t stage, int64_t tag) override { mpi_.recv(t, stage, tag); }
  void all_reduce_with(const Tensor& t, int64_t peer) override { mpi_.all_reduce_with(t, peer); }
  // The data- and context-parallel collectives stay on MPI (host staging, the in-process
  // arithmetic).
  int64_t cp_rank() const override { return mpi_.cp_rank(); }
  int64_t cp_size() const override { return mpi_.cp_size(); }
  void cp_all_gather(const Tensor& in, const Tensor& out) override { mpi_.cp_all_gather(in, out); }
  void cp_reduce_scatter(const Tensor& in, const Tensor& out) override {
    mpi_.cp_reduce_scatter(in, out);
  }
  int64_t dp_rank() const override { return mpi_.dp_rank(); }
  int64_t dp_size() const override { return mpi_.dp_size(); }
  void dp_reduce_scatter(exec::DpGroup g, const Tensor& t, int64_t first, int64_t shard) override {
    mpi_.dp_reduce_scatter(g, t, first, shard);
  }
  void dp_all_gather(exec::DpGroup g, const Tensor& t, int64_t first, int64_t shard) override {
    mpi_.dp_all_gather(g, t, first, shard);
  }
  void dp_all_reduce_max(exec::DpGroup g, const Tensor& t) override { mpi_.dp_all_reduce_max(g, t); }
  void dp_all_gather_blocks(exec::DpGroup g, const Tensor& t, int64_t shard, int64_t span) override {
    mpi_.dp_all_gather_blocks(g, t, shard, span);
  }
  void dp_reduce_scatter_blocks_into(exec::DpGroup g, const Tensor& t, int64_t shard, int64_t span,
                                     const Tensor& into) override {
    mpi_.dp_reduce_scatter_blocks_into(g, t, shard, span, into);
  }
  void dp_reduce_scatter_into(exec::DpGroup g, const Tensor& t, int64_t first, int64_t shard,
                              const Tensor& into) override {
    mpi_.dp_reduce_scatter_into(g, t, first, shard, into);
  }
  int64_t ep_size() const override { return mpi_.ep_size(); }
  void ep_all_to_all(const Tensor& in, const Tensor& out) override { mpi_.ep_all_to_all(in, out); }

 private:
  static void done() { NP_CUDA_CHECK(cudaStreamSynchronize(nullptr)); }
  exec::Communicator& mpi_;
  ncclComm_t comm_ = nullptr;
  int64_t buffers_ = 0;
};

}  // namespace

std::unique_ptr<exec::Communicator> make_nccl_comm(exec::Communicator& mpi,
                                                   const std::function<void(void*, int)>& broadcast) {
  return std::make_unique<NcclComm>(mpi, broadcast);
}

}  // namespace np::cuda

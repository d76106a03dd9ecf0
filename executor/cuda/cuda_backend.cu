// The CUDA backend: device memory on cudaMalloc, and op dispatch onto the ops of ops.hpp. Forward
// and backward are one switch each over every OpKind, each case one call, with no default case,
// so that a new kind without a kernel is a compiler warning (-Wswitch).
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/cuda/cuda_backend.hpp"
#include "executor/cuda/ops.hpp"
#if !defined(NANOPLAN_CUDA_EMULATION)
// The driver's types; its functions come through cudaGetDriverEntryPointByVersion.
#include <cuda.h>
#endif

namespace np::cuda {
namespace {

using exec::BackwardArgs;
using exec::OpContext;

// Segments that grow in place (the caching allocator's expandable segments) on the driver's
// virtual memory calls, as PyTorch's ExpandableSegment does (c10/cuda/CUDACachingAllocator.cpp at
// pytorch/pytorch b944315b93d36f842ef94d67a041371993234a74): cuMemAddressReserve for the
// addresses; to grow, one cuMemCreate handle per page, each cuMemMap'd, then one cuMemSetAccess
// over the new range; to shrink, a stream synchronization (cuMemUnmap does not wait for kernels),
// then cuMemUnmap and cuMemRelease per page; every page unmapped before cuMemAddressFree. A page
// here is the driver's granularity (2 MiB on Hopper), which divides the allocator's 2 MiB and
// 20 MiB pages (PyTorch's handles are those pages; the physical bytes are the same). The
// functions come through cudaGetDriverEntryPointByVersion, so the module links no libcuda; where
// one is missing, reserve() returns nullptr and run refuses --allocator expandable.
class VirtualMemory {
 public:
  VirtualMemory() {
    ok_ = load("cuMemGetAllocationGranularity", granularity_fn_) &&
          load("cuMemAddressReserve", reserve_fn_) && load("cuMemAddressFree", address_free_fn_) &&
          load("cuMemCreate", create_fn_) && load("cuMemRelease", release_fn_) &&
          load("cuMemMap", map_fn_) && load("cuMemSetAccess", access_fn_) &&
          load("cuMemUnmap", unmap_fn_);
    if (!ok_) return;
    int device = 0;
    NP_CUDA_CHECK(cudaGetDevice(&device));
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device;
    access_.location = prop_.location;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    size_t g = 0;
    ok_ = granularity_fn_(&g, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS && g > 0;
    page_ = static_cast<int64_t>(g);
  }

  void* reserve(int64_t bytes) {
    CUdeviceptr p = 0;
    if (!ok_ || bytes % page_ != 0 ||
        reserve_fn_(&p, static_cast<size_t>(bytes), 0, 0, 0) != CUDA_SUCCESS)
      return nullptr;
    return reinterpret_cast<void*>(p);
  }
  // False when the device has no room (what was mapped of the range is given back).
  bool map(void* base, int64_t offset, int64_t bytes) {
    if (!ok_ || offset % page_ != 0 || bytes % page_ != 0) return false;
    const CUdeviceptr at = reinterpret_cast<CUdeviceptr>(base) + static_cast<CUdeviceptr>(offset);
    for (int64_t done = 0; done < bytes; done += page_) {
      CUmemGenericAllocationHandle h = 0;
      CUresult r = create_fn_(&h, static_cast<size_t>(page_), &prop_, 0);
      if (r == CUDA_SUCCESS) {
        r = map_fn_(at + done, static_cast<size_t>(page_), 0, h, 0);
        if (r != CUDA_SUCCESS) check(release_fn_(h), "cuMemRelease");
      }
      if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        unmap_pages(at, done);
        return false;
      }
      check(r, "cuMemCreate/cuMemMap");
      pages_[at + done] = h;
    }
    check(access_fn_(at, static_cast<size_t>(bytes), &access_, 1), "cuMemSetAccess");
    return true;
  }
  void unmap(void* base, int64_t offset, int64_t bytes) {
    NP_CUDA_CHECK(cudaDeviceSynchronize());
    unmap_pages(reinterpret_cast<CUdeviceptr>(base) + static_cast<CUdeviceptr>(offset), bytes);
  }
  void release(void* base, int64_t bytes) {
    const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(base);
    NP_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto it = pages_.lower_bound(p); it != pages_.end() && it->first < p + bytes;) {
      check(unmap_fn_(it->first, static_cast<size_t>(page_)), "cuMemUnmap");
      check(release_fn_(it->second), "cuMemRelease");
      it = pages_.erase(it);
    }
    check(address_free_fn_(p, static_cast<size_t>(bytes)), "cuMemAddressFree");
  }

 private:
  template <typename Fn>
  static bool load(const char* name, Fn& fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess || !p) {
      cudaGetLastError();
      return false;
    }
    fn = reinterpret_cast<Fn>(p);
    return true;
  }
  static void check(CUresult r, const char* call) {
    if (r != CUDA_SUCCESS)
      cuda_failure(call, __FILE__, __LINE__, "driver error " + std::to_string(static_cast<int>(r)));
  }
  void unmap_pages(CUdeviceptr at, int64_t bytes) {
    for (CUdeviceptr p = at; p < at + static_cast<CUdeviceptr>(bytes); p += page_) {
      auto it = pages_.find(p);
      if (it == pages_.end()) throw std::logic_error("cuda backend: unmap of a page not mapped");
      check(unmap_fn_(p, static_cast<size_t>(page_)), "cuMemUnmap");
      check(release_fn_(it->second), "cuMemRelease");
      pages_.erase(it);
    }
  }

  bool ok_ = false;
  int64_t page_ = 0;
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
  std::map<CUdeviceptr, CUmemGenericAllocationHandle> pages_;  // mapped pages by address
  CUresult (*granularity_fn_)(size_t*, const CUmemAllocationProp*,
                              CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*reserve_fn_)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free_fn_)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create_fn_)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                         unsigned long long) = nullptr;
  CUresult (*release_fn_)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map_fn_)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                      unsigned long long) = nullptr;
  CUresult (*access_fn_)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*unmap_fn_)(CUdeviceptr, size_t) = nullptr;
};

class CudaBackend final : public exec::Backend {
 public:
  // The context first (cudaFree(0) creates it), then the cuBLAS handle, each measured.
  CudaBackend() {
    NP_CUDA_CHECK(cudaFree(nullptr));
    int64_t at_start = used_now();
    NP_CUBLAS_CHECK(cublasCreate(&blas_));
    overheads_ = {{"device memory in use as this rank's backend started (the CUDA context, and "
                   "anything else on the device)",
                   at_start},
                  {"cuBLAS handle", std::max<int64_t>(0, used_now() - at_start)}};
    NP_CUDA_CHECK(cudaStreamCreate(&stream_));
    // The stream before the workspace (use_runtime_buffer): setting a stream resets the workspace
    // (linear.cu, use_stream).
    NP_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
  }
  ~CudaBackend() override {
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "cuda"; }

  // cuBLAS's workspace, set explicitly so that its bytes come through the tracking allocator
  // (never cuBLAS's own cudaMalloc): the estimate's assumed size (RuntimeAssumptions).
  std::vector<exec::RuntimeBuffer> runtime_buffers() const override {
    return {{"cuBLAS workspace", kWorkspaceBytes}};
  }
  void use_runtime_buffer(size_t i, void* p) override {
    if (i != 0) throw std::logic_error("cuda backend: it has one runtime buffer");
    NP_CUBLAS_CHECK(cublasSetWorkspace(blas_, p, static_cast<size_t>(kWorkspaceBytes)));
  }

  // ---- device memory ----
  void* allocate(int64_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(bytes)) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error: the allocator reports the refusal
      return nullptr;
    }
    return p;
  }
  void release(void* p) override { NP_CUDA_CHECK(cudaFree(p)); }
  void* reserve_addresses(int64_t bytes) override { return vm().reserve(bytes); }
  bool map_addresses(void* base, int64_t offset, int64_t bytes) override {
    return vm().map(base, offset, bytes);
  }
  void unmap_addresses(void* base, int64_t offset, int64_t bytes) override {
    vm().unmap(base, offset, bytes);
  }
  void release_addresses(void* base, int64_t bytes) override { vm().release(base, bytes); }
  std::optional<int64_t> device_used() override { return used_now(); }
  std::vector<exec::RuntimeBuffer> measured_overheads() const override { return overheads_; }
  void synchronize() override { NP_CUDA_CHECK(cudaDeviceSynchronize()); }
  void fill_bytes(void* p, uint8_t value, int64_t bytes) override {
    NP_CUDA_CHECK(cudaMemset(p, value, static_cast<size_t>(bytes)));
  }
  void copy_to_host(void* dst, const Tensor& src) override {
    NP_CUDA_CHECK(cudaMemcpy(dst, src.data, static_cast<size_t>(src.bytes()), cudaMemcpyDeviceToHost));
  }
  void copy_from_host(const Tensor& dst, const void* src) override {
    NP_CUDA_CHECK(cudaMemcpy(dst.data, src, static_cast<size_t>(dst.bytes()), cudaMemcpyHostToDevice));
  }

  // ---- device operations around the ops ----
  void fill(const Tensor& t, float value) override { cuda::fill(t, value, stream_); }
  void copy_elements(const Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,
                     int64_t n) override {
    cuda::copy_elements(dst, dst_offset, src, src_offset, n, stream_);
  }
  void optimizer_update(const exec::OptimizerUpdate& u) override {
    if (u.kind == Optimizer::kNone) return;
    if (u.kind == Optimizer::kSgd) return sgd_step(u.grad, u.master, u.lr, stream_);
    adamw_step(u.grad, u.master, u.m, u.v, u.lr, u.beta1, u.beta2, u.eps, u.weight_decay, u.step,
               stream_);
  }
  // In index order, in double, on the host (the loss readout: one fp32 per token).
  double sum(const Tensor& t) override {
    std::vector<uint8_t> host(static_cast<size_t>(t.bytes()));
    copy_to_host(host.data(), t);
    Tensor h{host.data(), t.type};
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += exec::load(h, i);
    return s;
  }

  // ---- ops ----
  std::vector<Tensor> forward(const OpContext& c, std::span<const Tensor> in,
                              std::span<const Tensor> w) override {
    const Fwd e{c, blas_, stream_};
    switch (c.op->kind) {
      case OpKind::kEmbedding:
        return embedding_fwd(e, in, w);
      case OpKind::kPosEmbedding:
        return pos_embedding_fwd(e, in, w);
      case OpKind::kRmsNorm:
        return rmsnorm_fwd(e, in, w);
      case OpKind::kRmsNormStats:
        return rmsnorm_stats_fwd(e, in, w);
      case OpKind::kLayerNorm:
        return layernorm_fwd(e, in, w);
      case OpKind::kLayerNormStats:
        return layernorm_stats_fwd(e, in, w);
      case OpKind::kRmsNormHf:
        return rmsnorm_hf_fwd(e, in, w);
      case OpKind::kRepeatKv:
        return repeat_kv_fwd(e, in, w);
      case OpKind::kSoftmaxFp32:
        return softmax_fp32_fwd(e, in, w);
      case OpKind::kAllGather:
        return all_gather_fwd(e, in, w);
      case OpKind::kReduceScatter:
        return reduce_scatter_fwd(e, in, w);
      case OpKind::kAllReduce:
        return all_reduce_fwd(e, in, w);
      case OpKind::kColumnLinear:
      case OpKind::kRowLinear:
        if (c.op->attrs.fp8 != Fp8Recipe::kNone) return float8_linear_fwd(e, in, w);
        return linear_fwd(e, in, w);
      case OpKind::kLinear:
        return linear_fwd(e, in, w);
      case OpKind::kRope:
        return rope_fwd(e, in, w);
      case OpKind::kMlaRope:
        return mla_rope_fwd(e, in, w);
      case OpKind::kQkNorm:
        return qk_norm_fwd(e, in, w);
      case OpKind::kQkNormHf:
        return qk_norm_hf_fwd(e, in, w);
      case OpKind::kFlashAttention:
        return flash_attention_fwd(e, in, w);
      case OpKind::kAttnScores:
        return attn_scores_fwd(e, in, w);
      case OpKind::kAttnContext:
        return attn_context_fwd(e, in, w);
      case OpKind::kSoftmax:
        return softmax_fwd(e, in, w);
      case OpKind::kDropout:
        return dropout_fwd(e, in, w);
      case OpKind::kSwiGlu:
      case OpKind::kGluAct:
        return glu_fwd(e, in, w);
      case OpKind::kGluMul:
        return glu_mul_fwd(e, in, w);
      case OpKind::kGelu:
        return gelu_fwd(e, in, w);
      case OpKind::kAdd:
        return add_fwd(e, in, w);
      case OpKind::kConcat:
        return concat_fwd(e, in, w);
      case OpKind::kGatherFeatures:
        return gather_features_fwd(e, in, w);
      case OpKind::kScatterRows:
        return scatter_rows_fwd(e, in, w);
      case OpKind::kRouter:
        return router_fwd(e, in, w);
      case OpKind::kTopK:
        return topk_fwd(e, in, w);
      case OpKind::kRouteScores:
        return route_scores_fwd(e, in, w);
      case OpKind::kRouteTopK:
        return route_topk_fwd(e, in, w);
      case OpKind::kMoeDispatch:
        return moe_dispatch_fwd(e, in, w);
      case OpKind::kExpertColumn:
      case OpKind::kExpertRow:
        return expert_fwd(e, in, w);
      case OpKind::kMoeCombine:
        return moe_combine_fwd(e, in, w);
      case OpKind::kSharedGate:
        return shared_gate_fwd(e, in, w);
      case OpKind::kCastFp32:
        return cast_fp32_fwd(e, in, w);
      case OpKind::kLogSoftmaxLoss:
        return log_softmax_loss_fwd(e, in, w);
      case OpKind::kCrossEntropy:
        return cross_entropy_fwd(e, in, w);
      case OpKind::kCrossEntropyTe:
        return cross_entropy_te_fwd(e, in, w);
      // Context parallelism runs on the CPU executor (exec::check_runnable refuses cp > 1 here).
      case OpKind::kSilu:
        return silu_fwd(e, in, w);
      case OpKind::kMul:
        return mul_fwd(e, in, w);
      case OpKind::kHeadRmsNorm:
        return head_rmsnorm_fwd(e, in, w);
      case OpKind::kRopeQk:
        return rope_qk_fwd(e, in, w);
      case OpKind::kRopeHalfQk:
        return rope_half_qk_fwd(e, in, w);
      case OpKind::kSdpa:
        return sdpa_fwd(e, in, w);
      case OpKind::kFp8AllGather:
        return fp8_all_gather_fwd(e, in, w);
      case OpKind::kFp8ColumnLinear:
        return fp8_column_linear_fwd(e, in, w);
      case OpKind::kFp8RowLinear:
        return fp8_row_linear_fwd(e, in, w);
      case OpKind::kTeColumnLinear:
        return te_column_linear_fwd(e, in, w);
      case OpKind::kTeRowLinear:
        return te_row_linear_fwd(e, in, w);
      case OpKind::kCpGatherKv:
      case OpKind::kFlashAttentionCp:
      case OpKind::kCount:
        break;
    }
    unsupported(c, "not written for the CUDA backend yet");
  }

  void backward(const OpContext& c, const BackwardArgs& a) override {
    const Bwd e{{c, blas_, stream_}, a};
    switch (c.op->kind) {
      case OpKind::kEmbedding:
        return embedding_bwd(e);
      case OpKind::kPosEmbedding:
        return pos_embedding_bwd(e);
      case OpKind::kRmsNorm:
      case OpKind::kRmsNormStats:
        return rmsnorm_bwd(e);
      case OpKind::kRmsNormHf:
        return rmsnorm_hf_bwd(e);
      case OpKind::kRepeatKv:
        return repeat_kv_bwd(e);
      case OpKind::kSoftmaxFp32:
        return softmax_fp32_bwd(e);
      case OpKind::kLayerNorm:
      case OpKind::kLayerNormStats:
        return layernorm_bwd(e);
      case OpKind::kAllGather:
      case OpKind::kReduceScatter:
        return gather_scatter_bwd(e);
      case OpKind::kAllReduce:
        return all_reduce_bwd(e);
      case OpKind::kColumnLinear:
      case OpKind::kRowLinear:
        if (c.op->attrs.fp8 != Fp8Recipe::kNone) return float8_linear_bwd(e);
        return linear_bwd(e);
      case OpKind::kLinear:
        return linear_bwd(e);
      case OpKind::kRope:
        return rope_bwd(e);
      case OpKind::kMlaRope:
        return mla_rope_bwd(e);
      case OpKind::kQkNorm:
        return qk_norm_bwd(e);
      case OpKind::kQkNormHf:
        return qk_norm_hf_bwd(e);
      case OpKind::kFlashAttention:
        return flash_attention_bwd(e);
      case OpKind::kAttnScores:
        return attn_scores_bwd(e);
      case OpKind::kAttnContext:
        return attn_context_bwd(e);
      case OpKind::kSoftmax:
        return softmax_bwd(e);
      case OpKind::kDropout:
        return dropout_bwd(e);
      case OpKind::kSwiGlu:
      case OpKind::kGluAct:
        return glu_bwd(e);
      case OpKind::kGluMul:
        return glu_mul_bwd(e);
      case OpKind::kGelu:
        return gelu_bwd(e);
      case OpKind::kAdd:
        return add_bwd(e);
      case OpKind::kConcat:
        return concat_bwd(e);
      case OpKind::kGatherFeatures:
        return gather_features_bwd(e);
      case OpKind::kScatterRows:
        return scatter_rows_bwd(e);
      case OpKind::kRouter:
        return router_bwd(e);
      case OpKind::kTopK:
        return topk_bwd(e);
      case OpKind::kRouteScores:
        return route_scores_bwd(e);
      case OpKind::kRouteTopK:
        return route_topk_bwd(e);
      case OpKind::kMoeDispatch:
        return moe_dispatch_bwd(e);
      case OpKind::kExpertColumn:
      case OpKind::kExpertRow:
        return expert_bwd(e);
      case OpKind::kMoeCombine:
        return moe_combine_bwd(e);
      case OpKind::kSharedGate:
        return shared_gate_bwd(e);
      case OpKind::kCastFp32:
        return cast_fp32_bwd(e);
      case OpKind::kCrossEntropyTe:
        return cross_entropy_te_bwd(e);
      case OpKind::kCrossEntropy:
      case OpKind::kLogSoftmaxLoss:
        return cross_entropy_bwd(e);
      case OpKind::kSilu:
        return silu_bwd(e);
      case OpKind::kMul:
        return mul_bwd(e);
      case OpKind::kHeadRmsNorm:
        return head_rmsnorm_bwd(e);
      case OpKind::kRopeQk:
        return rope_qk_bwd(e);
      case OpKind::kRopeHalfQk:
        return rope_half_qk_bwd(e);
      case OpKind::kSdpa:
        return sdpa_bwd(e);
      case OpKind::kFp8AllGather:
        return gather_scatter_bwd(e);
      case OpKind::kFp8ColumnLinear:
        return fp8_column_linear_bwd(e);
      case OpKind::kFp8RowLinear:
        return fp8_row_linear_bwd(e);
      case OpKind::kTeColumnLinear:
        return te_column_linear_bwd(e);
      case OpKind::kTeRowLinear:
        return te_row_linear_bwd(e);
      case OpKind::kCpGatherKv:  // context parallelism: the CPU executor's
      case OpKind::kFlashAttentionCp:
      case OpKind::kCount:
        break;
    }
    unsupported(c, "not written for the CUDA backend yet");
  }

 private:
  static constexpr int64_t kWorkspaceBytes = RuntimeAssumptions{}.cublas_workspace_bytes;
  static int64_t used_now() {
    size_t free_bytes = 0, total = 0;
    NP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return static_cast<int64_t>(total - free_bytes);
  }

  // On first use: the driver's functions are looked up only for --allocator expandable.
  VirtualMemory& vm() {
    if (!vm_) vm_ = std::make_unique<VirtualMemory>();
    return *vm_;
  }

  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<VirtualMemory> vm_;
  // This rank's own stream, a blocking one: the synchronous copies (on the legacy default stream)
  // and the virtual ranks' collectives wait for its work, so virtual ranks sharing a GPU each
  // issue in order on their own stream.
  cudaStream_t stream_ = nullptr;
  std::vector<exec::RuntimeBuffer> overheads_;
};

}  // namespace

std::unique_ptr<exec::Backend> make_cuda_backend() {
  return std::make_unique<CudaBackend>();
}

}  // namespace np::cuda

// The runtime's overheads and the framework terms of the estimate (runtime_terms.hpp).
//
// Megatron's terms follow Megatron-LM core_r0.14.0 (commit 23e00ed0963c35382dfe8a5a94fb3cda4d21e133)
// with Transformer Engine 2.11 (commit c188b533c); paths below are in those trees.
#include "planner/schedule/runtime_terms.hpp"

#include <algorithm>
#include <utility>

#include "planner/inputs/units.hpp"

namespace np {
namespace {

// The 2-D weight shapes of the GEMMs whose weight gradient Megatron accumulates straight into its
// fp32 main_grad (gradient-accumulation fusion, on by default): Transformer Engine's linears in
// the layer (qkv, proj, fc1, fc2; MLA's down-projections, TE Linears) and Megatron's own output
// layer. The experts' grouped linears
// (transformer_engine/pytorch/module/grouped_linear.py L488-494) get them too; they are not
// counted here yet.
void fused_wgrad_shapes(const BlockGraph& g, std::vector<std::pair<int64_t, int64_t>>& shapes) {
  for (const GraphOp& op : g.ops) {
    if (op.kind != OpKind::kColumnLinear && op.kind != OpKind::kRowLinear &&
        op.kind != OpKind::kLinear && op.kind != OpKind::kTeColumnLinear &&
        op.kind != OpKind::kTeRowLinear)
      continue;
    for (const WeightShape& w : op.weights)
      if (w.shape.size() == 2 && std::string_view(w.suffix) == "weight")
        shapes.emplace_back(w.shape[0], w.shape[1]);
  }
}

// nanotron's, at commit 2411b022a75fb7f7561a1bb4166706da5e1b76de with flash-attn 2.6.3 (nanotron
// pins flash-attn >= 2.5, < 2.7).
std::vector<OverheadLine> nanotron_lines(const ModelSpec& m, const TrainSpec& t,
                                         const StageBlocks& b) {
  std::vector<OverheadLine> out;
  // Sequence parallelism with tp_recompute_allgather: the column-parallel linears all-gather
  // their input into one process-wide MemoryBuffer (src/nanotron/parallel/utils.py L13-27; used
  // by src/nanotron/parallel/tensor_parallel/functional.py L271-274, L392-408, L486-498), which
  // only grows and is never freed: bf16 [s, b, h], shared by qkv, gate_up and the LM head. The
  // schedule's gathered tensors still count while they are in use (over by one such buffer at
  // those instants: the safe side).
  if (t.sp && t.tp > 1 && t.tp_recompute_allgather && (b.layer || b.head))
    out.push_back({"TP all-gather buffer", t.seq_len / t.cp * t.micro_batch * m.hidden * 2,
                   "nanotron's MemoryBuffer for the column-parallel all-gathers (tp_recompute_"
                   "allgather), bf16 [s, b, h], kept",
                   true});
  // flash-attn's RotaryEmbedding, one per attention layer (src/nanotron/models/llama.py
  // L414-416), keeps its cos and sin tables, bf16 [s, head_dim / 2] each, as attributes for the
  // run (flash_attn/layers/rotary.py L356-401).
  if (m.position == PosEmb::kRope && b.layers > 0)
    out.push_back({"RoPE cos/sin caches", b.layers * t.seq_len * m.head_dim * 2,
                   count_noun(b.layers, "layer") +
                       " x bf16 cos and sin [s, head_dim/2] (flash-attn's RotaryEmbedding)",
                   true, std::vector<int64_t>(2 * b.layers, t.seq_len * m.head_dim)});
  return out;
}
}  // namespace

std::vector<OverheadLine> framework_lines(const ModelSpec& m, const TrainSpec& t,
                                          const RuntimeAssumptions& rt, const StageBlocks& b) {
  if (t.impl == Impl::kNanotron) return nanotron_lines(m, t, b);
  std::vector<OverheadLine> out;
  if (t.impl != Impl::kMegatron) return out;
  // Transformer Engine's dummy weight gradients. With gradient-accumulation fusion the weight
  // gradient GEMM adds into main_grad, and autograd is handed a placeholder: TE's
  // get_dummy_wgrad (transformer_engine/pytorch/module/base.py, _dummy_wgrads, L64-92) creates
  // one bf16 tensor per distinct (rows, cols, dtype) with torch.empty and keeps it for the rest
  // of the run. Its linears return it (module/layernorm_linear.py L1002-1008, module/linear.py
  // L953-959), and so does Megatron's output layer when TE is installed
  // (megatron/core/tensor_parallel/layers.py L52, L580-600). Layers of one shape share them.
  // Without the fusion (--gradient-accumulation-fusion off) TE returns the real gradient, which
  // the op table holds as each linear's backward workspace (dense_wgrad), and makes no dummy.
  std::vector<std::pair<int64_t, int64_t>> shapes;
  if (b.layer && t.grad_accum_fusion) fused_wgrad_shapes(*b.layer, shapes);
  if (b.other_layer && t.grad_accum_fusion) fused_wgrad_shapes(*b.other_layer, shapes);
  if (b.head && t.grad_accum_fusion) fused_wgrad_shapes(*b.head, shapes);
  std::sort(shapes.begin(), shapes.end());
  shapes.erase(std::unique(shapes.begin(), shapes.end()), shapes.end());
  int64_t dummy = 0;
  std::vector<int64_t> dummies;
  for (auto [rows, cols] : shapes) dummies.push_back(rows * cols * 2), dummy += dummies.back();
  if (dummy > 0)
    out.push_back({"TE dummy weight gradients", dummy,
                   count_noun(static_cast<int64_t>(shapes.size()), "distinct weight shape") +
                       " x 1 bf16 placeholder each, kept for the run (Transformer Engine's "
                       "get_dummy_wgrad under gradient-accumulation fusion)",
                   true, dummies});
  // Transformer Engine's float8 weight copies (te_fp8). Each float8 linear casts its bf16 weight
  // into a workspace it keeps in the module (_fp8_workspaces["weight"]), updated in place on
  // each step's first micro-batch and reused by the others: Megatron passes is_first_microbatch
  // (cache_name "weight" unless it is None, layernorm_linear.py and linear.py at
  // NVIDIA/TransformerEngine d0067d0; quantize_weight in module/base.py). The workspace is made
  // with both usages in the forward (rowwise, and columnwise for the input gradient's GEMM),
  // which on Hopper is the data and its transpose (Float8Quantizer / Float8CurrentScaling-
  // Quantizer.inner_tensor_specs, tensor/float8_tensor.py): two uint8 tensors of the weight's
  // elements, kept for the run. Not counted: each one's fp32 scale_inv and the recipe's
  // scale and amax tensors (a few fp32 per linear). Under --fp8-param-gather the weights are
  // float8 already (is_weight_param_quantized): no copies; the weights line holds their data and
  // transposes (TrainSpec::fp8_param_gather).
  if (te_fp8(t) && !t.fp8_param_gather) {
    std::vector<int64_t> copies;
    auto add = [&](const BlockGraph* g, int64_t times) {
      if (!g) return;
      for (int64_t k = 0; k < times; ++k)
        for (const GraphOp& op : g->ops)
          if (op.kind == OpKind::kTeColumnLinear || op.kind == OpKind::kTeRowLinear)
            copies.insert(copies.end(), 2, op.weights.at(0).elements());
    };
    add(b.layer, b.layers);
    add(b.head, 1);  // multi-token prediction's decoder layers
    int64_t bytes = 0;
    for (int64_t c : copies) bytes += c;
    if (bytes > 0)
      out.push_back({"TE fp8 weight copies", bytes,
                     count_noun(static_cast<int64_t>(copies.size() / 2), "float8 linear") +
                         " x (e4m3 weight + its transpose), cached across micro-batches "
                         "(Transformer Engine's weight workspaces; Hopper's layouts)",
                     true, copies});
  }
  // TE's cuBLAS workspace: one uint8 torch.empty per device, cached for the run
  // (transformer_engine/pytorch/cpp_extensions/gemm.py L31-46: 32 MiB + 1 KiB from compute
  // capability 9.0 on, 4 MiB before).
  out.push_back({"TE cuBLAS workspace", rt.te_workspace_bytes,
                 format_binary(rt.te_workspace_bytes) +
                     " (Transformer Engine's, sm_90 and later; --te-workspace)",
                 true});
  // Transformer Engine's userbuffers under --tp-comm-overlap, on every rank. Megatron
  // creates them once (_initialize_tp_communicators, megatron/training/initialize.py at
  // NVIDIA/Megatron-LM d98e8a6: shape [s * b / cp, hidden], bf16 without fp8) through TE's
  // initialize_ub (transformer_engine/pytorch/module/base.py at NVIDIA/TransformerEngine
  // d0067d0), which makes one communication buffer per overlapped GEMM: 12 (4 ring-exchange,
  // 2 pipelined, 4 bulk, 2 external; ring-exchange reduce-scatters would hold (2 tp - 1) / tp of
  // it, and Megatron's defaults have none). Each buffer, and the communicator's region 0 (one
  // per process: LOCALSIZE = 4 x (NVTE_REG0_OFFSET + NVTE_REG0_FLAGS) = 3,223,808 B from
  // userbuffers.h), is allocated by register_user_buffer_collective with cuMemCreate, rounded
  // up to the multicast granularity, here assumed 2 MiB (common/comm_gemm_overlap/userbuffers/
  // userbuffers-host.cpp). The communicator also takes send_id (world ints), recv_id
  // (32 x world ints) and 2 x 64 KiB of flags with cudaMalloc. All of it is device memory
  // outside PyTorch's allocator. The GEMMs that overlap use their own cuBLAS workspace,
  // 3 streams x the workspace (get_cublas_workspace with ub, cpp_extensions/gemm.py,
  // _NUM_MAX_UB_STREAMS = 3), a torch.empty kept for the run.
  if (t.tp_comm_overlap) {
    constexpr int64_t kGranule = 2 << 20, kRegion0 = 3'223'808, kBuffers = 12;
    auto granules = [](int64_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; };
    const int64_t buffer = t.seq_len * t.micro_batch / t.cp * m.hidden * 2;
    const int64_t world = t.tp * t.cp * t.dp * t.pp;
    const int64_t small = world * 4 + 32 * world * 4 + 2 * 65'536;
    const int64_t total = kBuffers * granules(buffer) + granules(kRegion0) + small;
    out.push_back({"TE userbuffers", total,
                   "--tp-comm-overlap: 12 bf16 [s*b/cp, h] buffers + the communicator's flags, "
                   "each rounded to 2 MiB (Transformer Engine's initialize_ub)",
                   false});
    out.push_back({"TE userbuffers cuBLAS workspace", 3 * rt.te_workspace_bytes,
                   "--tp-comm-overlap: 3 streams x " + format_binary(rt.te_workspace_bytes) +
                       " (Transformer Engine's workspace for the overlapped GEMMs)",
                   true});
  }
  // The output layer's sequence-parallel all-gather goes into Megatron's global memory buffer
  // (megatron/core/tensor_parallel/layers.py L474 and L511, GlobalMemoryBuffer in
  // megatron/core/utils.py), which is kept and only grows: bf16 [s / cp, b, h].
  if (b.head && t.sp && t.tp > 1)
    out.push_back({"SP all-gather buffer", t.seq_len / t.cp * t.micro_batch * m.hidden * 2,
                   "Megatron's global memory buffer for the output layer's sequence-parallel "
                   "all-gather, bf16 [s/cp, b, h], kept",
                   true});
  // The dataloader's causal mask (TrainSpec::dataloader_mask), alive during each micro-batch's
  // forward on the stages that load a batch. Counted at the peak: over by its size when the peak
  // falls in a backward (the safe side).
  if (t.dataloader_mask && (b.embedding || b.head))
    out.push_back({"dataloader attention mask", t.micro_batch * (t.seq_len / t.cp) * t.seq_len,
                   "bool [b, 1, s/cp, s] on the first and last stages during each forward "
                   "(Megatron's --create-attention-mask-in-dataloader, its default; "
                   "--dataloader-attention-mask off)",
                   true});
  // RotaryEmbedding.forward is lru_cache'd (megatron/core/models/common/embeddings/
  // rotary_pos_embedding.py L150): fp32 [s / cp, 1, 1, head_dim] per model chunk, kept.
  if (m.position == PosEmb::kRope)
    out.push_back({"RoPE frequency cache", b.chunks * t.seq_len / t.cp * m.head_dim * 4,
                   count_noun(b.chunks, "model chunk") +
                       " x fp32 [s/cp, head_dim] (Megatron's lru_cache'd rotary table)",
                   true, std::vector<int64_t>(b.chunks, t.seq_len / t.cp * m.head_dim * 4)});
  return out;
}

std::vector<int64_t> allocations_of(const OverheadLine& o) {
  return o.blocks.empty() ? std::vector<int64_t>{o.bytes} : o.blocks;
}

std::vector<OverheadLine> stage_overheads(const ModelSpec& m, const TrainSpec& t,
                                          const RuntimeAssumptions& rt, const StageBlocks& b) {
  int comms = t.communicators();
  std::vector<OverheadLine> out{
      {"CUDA context", rt.cuda_context_bytes,
       "context + loaded module images, assumed " + format_binary(rt.cuda_context_bytes) +
           " (--cuda-context)",
       false},
      // PyTorch allocates its cuBLAS workspaces through the caching allocator, one per (cuBLAS
      // handle, stream), and takes handles from a thread-local pool (pytorch/pytorch
      // 26a39059ec580351411f180816c47e2ef5134ae1, aten/src/ATen/cuda/CublasHandlePool.cpp,
      // setWorkspaceForHandle and getNewWorkspace). The forward's GEMMs run on the Python
      // thread and the backward's on the autograd engine's worker thread for the device
      // (torch/csrc/autograd/engine.cpp, Note [Allocating GPUs to autograd threads]): two
      // handles on one stream, two workspaces, kept for the run.
      {"cuBLAS workspaces", 2 * rt.cublas_workspace_bytes,
       "PyTorch's: forward and autograd threads x 1 compute stream x " +
           format_binary(rt.cublas_workspace_bytes) +
           " (its Hopper default, 8.125 MiB on other GPUs; --cublas-workspace)",
       true, {rt.cublas_workspace_bytes, rt.cublas_workspace_bytes}},
      {"NCCL buffers", comms * rt.nccl_bytes_per_comm,
       count_noun(comms, "communicator") + " (tp/cp/dp/pp/ep > 1) x " +
           format_binary(rt.nccl_bytes_per_comm) + " (--nccl-buffers)",
       false},
  };
  for (OverheadLine& f : framework_lines(m, t, rt, b)) out.push_back(std::move(f));
  return out;
}

int64_t fixed_overhead_bytes(const ModelSpec& m, const TrainSpec& t, const RuntimeAssumptions& rt,
                             const StageBlocks& b) {
  int64_t n = 0;
  for (const OverheadLine& o : stage_overheads(m, t, rt, b)) n += o.bytes;
  return n;
}

}  // namespace np

#!/usr/bin/env python3
"""Checks nanoplan's byte accounting against PyTorch's own, per implementation profile.

For each profile (--impl) it builds a small Llama (embedding, decoder layers, final norm, LM head,
loss) in PyTorch on the CPU, bf16, the way that profile's framework builds it, and measures:
  - per layer: the bytes autograd saves for backward (saved_tensors_hooks; each storage once, so a
    view keeps its whole parent; parameters are not counted);
  - the step peak: the most bytes allocated at once during forward and backward above what was
    allocated before (parameters and gradient buffers), from the profiler's memory events.
It runs `nanoplan estimate --format json` on the same model and setup and prints both, with the
differences. Optional: nothing else in the repository needs PyTorch (docs/estimate.md, "Implementation
profiles", gives the install command and the last table).

What the frameworks' CUDA kernels keep, reproduced here with autograd Functions that save the
same tensors (their sources: flash-attn's layer_norm_fn and flash_attn_varlen_func for nanotron;
apex's FusedRMSNormAffineFunction and the fused SwiGLU for Megatron):
  nanotron  norms keep x and the fp32 1/rms per row; attention keeps q, k, v (one tensor), out and
            the fp32 log-sum-exp; the GLU is act(gate) * up on views of gate_up; the loss casts the
            logits to fp32, subtracts the row maxima out of place and keeps the softmax.
  megatron  as nanotron's norms and attention; fused SwiGLU keeps gate_up only; the loss works in
            place on one fp32 copy of the logits.
  fused     norms keep x only (statistics recomputed in backward); fused SwiGLU; in-place loss.
  hf        Hugging Face transformers' Llama as its source writes it, in PyTorch's own ops
            (LlamaRMSNorm, rotate-half RoPE, repeat_kv, eager attention with the fp32 softmax,
            act_fn(gate_proj(x)) * up_proj(x), logits.float() and F.cross_entropy); eager only.
Weight gradients are accumulated into preallocated buffers inside the backward (Megatron's
gradient-accumulation fusion; nanoplan's executor does the same), so no weight gradient is a
transient.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile
except ImportError:
    sys.exit("torch_check: PyTorch is not installed (docs/estimate.md, \"Implementation profiles\": "
             "python3 -m pip install torch)")

DT = torch.bfloat16
PROFILES = ("nanotron", "megatron", "fused", "hf")


# ---- the ops, as each framework's kernels save them -------------------------------------------

class RmsNorm(torch.autograd.Function):
    """y = x * rsqrt(mean(x^2) + eps) * w; keeps x and, with `stats`, the fp32 1/rms per row."""

    @staticmethod
    def forward(ctx, x, w, main_grad, stats):
        xf = x.float()
        r = torch.rsqrt(xf.pow(2).mean(-1) + 1e-5)
        y = (xf * r[:, None] * w.float()).to(x.dtype)
        ctx.stats = stats
        ctx.main_grad = main_grad
        ctx.save_for_backward(x, w, r) if stats else ctx.save_for_backward(x, w)
        return y

    @staticmethod
    def backward(ctx, g):
        if ctx.stats:
            x, w, r = ctx.saved_tensors
        else:
            x, w = ctx.saved_tensors
        xf, gf = x.float(), g.float() * w.float()
        if not ctx.stats:
            r = torch.rsqrt(xf.pow(2).mean(-1) + 1e-5)
        k = (gf * xf).mean(-1) * r.pow(3)
        ctx.main_grad += (g.float() * xf * r[:, None]).sum(0).to(ctx.main_grad.dtype)
        return (gf * r[:, None] - xf * k[:, None]).to(x.dtype), None, None, None


class Linear(torch.autograd.Function):
    """y = x W^T; keeps x; dW accumulated into the weight's gradient buffer."""

    @staticmethod
    def forward(ctx, x, w, main_grad):
        ctx.save_for_backward(x, w)
        ctx.main_grad = main_grad
        return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        ctx.main_grad.addmm_(g.t(), x)
        return g @ w, None, None


class Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, w, main_grad):
        ctx.save_for_backward(ids)
        ctx.main_grad = main_grad
        return w[ids]

    @staticmethod
    def backward(ctx, g):
        (ids,) = ctx.saved_tensors
        ctx.main_grad.index_add_(0, ids, g)
        return None, None, None


def rope_tables(seq, d):
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


class Rope(torch.autograd.Function):
    """Rotate-half RoPE on the q and k heads of [q | k | v] rows (b-major tokens); keeps nothing."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, heads, batch, d):
        ctx.args = (cos, sin, heads, batch, d)
        return Rope.apply_(qkv, cos, sin, heads, batch, d, 1.0)

    @staticmethod
    def apply_(qkv, cos, sin, heads, batch, d, sign):
        out = qkv.clone()
        t = qkv.shape[0]
        x = qkv[:, : heads * d].float().view(batch, t // batch, heads, d)
        half = d // 2
        c, s = cos[None, :, None, :], sign * sin[None, :, None, :]
        x0, x1 = x[..., :half], x[..., half:]
        rot = torch.cat([x0 * c - x1 * s, x1 * c + x0 * s], -1)
        out[:, : heads * d] = rot.view(t, heads * d).to(qkv.dtype)
        return out

    @staticmethod
    def backward(ctx, g):
        cos, sin, heads, batch, d = ctx.args
        return Rope.apply_(g, cos, sin, heads, batch, d, -1.0), None, None, None, None, None


def split_qkv(qkv, hq, hkv, d, batch):
    """q, and k and v repeated to the hq query heads, of [q | k | v] rows (b-major), as (b, h, s, d)."""
    t = qkv.shape[0]
    x = qkv.view(batch, t // batch, hq + 2 * hkv, d)
    q = x[:, :, :hq].permute(0, 2, 1, 3)
    k = x[:, :, hq : hq + hkv].repeat_interleave(hq // hkv, 2).permute(0, 2, 1, 3)
    v = x[:, :, hq + hkv :].repeat_interleave(hq // hkv, 2).permute(0, 2, 1, 3)
    return q, k, v


class FlashAttention(torch.autograd.Function):
    """Causal GQA attention that keeps what flash-attn keeps: q, k, v (here one [q | k | v]
    tensor), the output and the fp32 log-sum-exp; the backward recomputes the scores per
    sequence."""

    @staticmethod
    def forward(ctx, qkv, hq, hkv, d, batch):
        t = qkv.shape[0]
        s = t // batch
        q, k, v = split_qkv(qkv, hq, hkv, d, batch)
        scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        scores.masked_fill_(mask, float("-inf"))
        lse = torch.logsumexp(scores, -1)
        out = (torch.exp(scores - lse[..., None]) @ v.float()).to(qkv.dtype)
        del scores
        out = out.permute(0, 2, 1, 3).reshape(t, hq * d)
        ctx.meta = (hq, hkv, d, batch)
        ctx.save_for_backward(qkv, out, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        qkv, out, lse = ctx.saved_tensors
        hq, hkv, d, batch = ctx.meta
        with torch.enable_grad():
            x = qkv.detach().requires_grad_()
            q, k, v = split_qkv(x, hq, hkv, d, batch)
            s = q.shape[2]
            scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
            o = (torch.softmax(scores, -1) @ v.float()).to(qkv.dtype)
            o = o.permute(0, 2, 1, 3).reshape(qkv.shape[0], hq * d)
            (dx,) = torch.autograd.grad(o, x, g)
        return dx, None, None, None, None


class FusedSwiGlu(torch.autograd.Function):
    """silu(gate) * up of [gate | up] in one kernel: keeps gate_up only."""

    @staticmethod
    def forward(ctx, gu):
        ctx.save_for_backward(gu)
        g, u = gu.float().chunk(2, -1)
        return (F.silu(g) * u).to(gu.dtype)

    @staticmethod
    def backward(ctx, dy):
        (gu,) = ctx.saved_tensors
        g, u = gu.float().chunk(2, -1)
        s = torch.sigmoid(g)
        d = dy.float()
        return torch.cat([d * u * s * (1 + g * (1 - s)), d * g * s], -1).to(gu.dtype)


class ShardedCrossEntropy(torch.autograd.Function):
    """Per-token loss of fp32 logits; keeps the softmax. Out of place (nanotron: logits - max is a
    new buffer) or in place on its input (Megatron)."""

    @staticmethod
    def forward(ctx, logits, target, in_place):
        mx = logits.max(-1).values
        z = logits.sub_(mx[:, None]) if in_place else logits - mx[:, None]
        mask = torch.zeros(z.shape[0], dtype=torch.bool)  # one vocab shard: no target masked
        predicted = z.gather(1, target[:, None]).squeeze(1)
        z.exp_()
        total = z.sum(-1)
        loss = torch.log(total) - predicted
        z.div_(total[:, None])
        ctx.save_for_backward(z, mask, target)
        return loss

    @staticmethod
    def backward(ctx, g):
        sm, _, target = ctx.saved_tensors
        grad = sm
        grad.scatter_add_(1, target[:, None], -torch.ones(target.shape[0], 1))
        grad.mul_(g[:, None])
        return grad, None, None


# ---- the model ------------------------------------------------------------------------------

class Model:
    def __init__(self, a, impl):
        torch.manual_seed(0)
        h, f, hq, hkv, d, v = a.hidden, a.ffn, a.heads, a.kv_heads, a.hidden // a.heads, a.vocab
        self.a, self.impl, self.d = a, impl, d
        self.stats = impl != "fused"

        def p(*shape, scale=0.02):
            return (torch.randn(*shape) * scale).to(DT)

        self.params = {"embed": p(v, h), "final_norm": torch.ones(h, dtype=DT), "lm_head": p(v, h)}
        for l in range(a.layers):
            self.params.update({
                f"{l}.attn_norm": torch.ones(h, dtype=DT), f"{l}.qkv": p((hq + 2 * hkv) * d, h),
                f"{l}.out": p(h, hq * d), f"{l}.mlp_norm": torch.ones(h, dtype=DT),
                f"{l}.gate_up": p(2 * f, h), f"{l}.down": p(h, f)})
        self.grads = {k: torch.zeros_like(w) for k, w in self.params.items()}
        self.cos, self.sin = rope_tables(a.seq_len, d)
        if impl == "hf":  # the norms' weights are leaves, so that w * x keeps x (as nn.Parameter)
            for k, w in self.params.items():
                if k.endswith("norm"):
                    w.requires_grad_()

    def lin(self, x, name):
        return Linear.apply(x, self.params[name], self.grads[name])

    def norm(self, x, name):
        if self.impl == "hf":  # LlamaRMSNorm.forward
            hidden = x.to(torch.float32)
            variance = hidden.pow(2).mean(-1, keepdim=True)
            hidden = hidden * torch.rsqrt(variance + 1e-5)
            return self.params[name] * hidden.to(x.dtype)
        return RmsNorm.apply(x, self.params[name], self.grads[name], self.stats)

    def hf_attention(self, x, l):
        """LlamaAttention with eager_attention_forward; rows b-major."""
        a, d = self.a, self.d
        b, s = a.micro_batch, a.seq_len
        w = self.params[f"{l}.qkv"]
        hq, hkv = a.heads, a.kv_heads
        g = self.grads[f"{l}.qkv"]
        q = Linear.apply(x, w[: hq * d], g[: hq * d]).view(b, s, hq, d).transpose(1, 2)
        k = Linear.apply(x, w[hq * d : (hq + hkv) * d], g[hq * d : (hq + hkv) * d])
        v = Linear.apply(x, w[(hq + hkv) * d :], g[(hq + hkv) * d :])
        k = k.view(b, s, hkv, d).transpose(1, 2)
        v = v.view(b, s, hkv, d).transpose(1, 2)
        cos, sin = self.hf_cos[:, None], self.hf_sin[:, None]

        def rotate_half(t):
            return torch.cat((-t[..., d // 2 :], t[..., : d // 2]), dim=-1)

        q = (q * cos) + (rotate_half(q) * sin)
        k = (k * cos) + (rotate_half(k) * sin)

        def repeat_kv(t):
            return t[:, :, None, :, :].expand(b, hkv, hq // hkv, s, d).reshape(b, hq, s, d)

        k, v = repeat_kv(k), repeat_kv(v)
        weights = torch.matmul(q, k.transpose(2, 3)) * d**-0.5
        weights = weights + self.hf_mask
        weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
        weights = F.dropout(weights, p=0.0, training=True)
        out = torch.matmul(weights, v).transpose(1, 2).contiguous().reshape(b * s, hq * d)
        return self.lin(out, f"{l}.out")

    def layer(self, x, l):
        a, d = self.a, self.d
        if self.impl == "hf":  # LlamaDecoderLayer with LlamaMLP (gate_proj and up_proj apart)
            x1 = x + self.hf_attention(self.norm(x, f"{l}.attn_norm"), l)
            n = self.norm(x1, f"{l}.mlp_norm")
            w, g, f = self.params[f"{l}.gate_up"], self.grads[f"{l}.gate_up"], a.ffn
            gate, up = Linear.apply(n, w[:f], g[:f]), Linear.apply(n, w[f:], g[f:])
            return x1 + self.lin(F.silu(gate) * up, f"{l}.down")
        qkv = self.lin(self.norm(x, f"{l}.attn_norm"), f"{l}.qkv")
        qkv = Rope.apply(qkv, self.cos, self.sin, a.heads + a.kv_heads, a.micro_batch, d)
        ctx = FlashAttention.apply(qkv, a.heads, a.kv_heads, d, a.micro_batch)
        x1 = x + self.lin(ctx, f"{l}.out")
        gu = self.lin(self.norm(x1, f"{l}.mlp_norm"), f"{l}.gate_up")
        if self.impl == "nanotron":  # act(gate) * up on views of gate_up (nanotron's MLP)
            gate, up = gu.split(a.ffn, -1)
            y = F.silu(gate) * up
        else:
            y = FusedSwiGlu.apply(gu)
        return x1 + self.lin(y, f"{l}.down")

    def head(self, x, target):
        logits = self.lin(self.norm(x, "final_norm"), "lm_head")
        if self.impl == "hf":  # ForCausalLMLoss: an fp32 copy, then F.cross_entropy
            return F.cross_entropy(logits.float(), target, reduction="mean")
        fp32 = logits.float()  # both casts keep the bf16 logits alive until the loss returns
        loss = ShardedCrossEntropy.apply(fp32, target, self.impl != "nanotron")
        return loss.mean()


def storage_key(t):
    return t.untyped_storage().data_ptr()


def measure(a, impl):
    m = Model(a, impl)
    torch.manual_seed(1)
    b, s = a.micro_batch, a.seq_len
    ids = torch.randint(0, a.vocab, (b * s,))  # token rows b-major: sequence i is rows [i s, (i+1) s)
    target = torch.randint(0, a.vocab, (b * s,))
    params = {storage_key(w) for w in list(m.params.values()) + list(m.grads.values())}
    per_layer = []

    def saved_bytes(fn):
        seen = {}

        def pack(t):
            k = storage_key(t)
            if k not in params:
                seen[k] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fn()
        return out, sum(seen.values())

    if impl == "hf":  # LlamaModel's rotary tables (b, s, d) and 4-D causal mask, made per forward
        pos = torch.arange(s, dtype=torch.float32)
        inv = 1.0 / (10000.0 ** (torch.arange(0, m.d, 2, dtype=torch.float32) / m.d))
        emb = torch.cat([pos[:, None] * inv[None, :]] * 2, dim=-1)
        mask = torch.full((s, s), torch.finfo(DT).min, dtype=DT).triu(1)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if impl == "hf":
            m.hf_cos = emb.cos().to(DT).expand(b, s, m.d).contiguous()
            m.hf_sin = emb.sin().to(DT).expand(b, s, m.d).contiguous()
            m.hf_mask = mask.expand(b, 1, s, s).contiguous()
        x = Embedding.apply(ids, m.params["embed"], m.grads["embed"])
        x.requires_grad_()
        for l in range(a.layers):
            x, n = saved_bytes(lambda: m.layer(x, l))
            per_layer.append(n)
        if impl == "hf":  # LlamaModel.forward returns: its tables and mask go
            del m.hf_mask
        loss = m.head(x, target)
        del x  # the model's output goes with its forward (only what autograd saved stays)
        loss.backward()
        del loss
        if impl == "hf":
            del m.hf_cos, m.hf_sin
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    live = peak = 0
    for _, n in events:
        live += n
        peak = max(peak, live)
    return per_layer, peak


def estimate(a, impl, nanoplan):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "torch-check.toml")
        with open(path, "w") as f:
            f.write(f'name = "torch-check"\nsource = "tools/torch_check.py"\n'
                    f"hidden_size = {a.hidden}\nintermediate_size = {a.ffn}\n"
                    f"num_layers = {a.layers}\nnum_heads = {a.heads}\nnum_kv_heads = {a.kv_heads}\n"
                    f"vocab_size = {a.vocab}\nmax_position_embeddings = {a.seq_len}\n"
                    'norm = "rmsnorm"\nactivation = "swiglu"\nposition_embedding = "rope"\n')
        cmd = [nanoplan, "estimate", "--model", path, "--micro-batch", str(a.micro_batch),
               "--seq-len", str(a.seq_len), "--impl", impl, "--optimizer", "none",
               "--attention", "eager" if impl == "hf" else "flash",
               "--grad-accum-dtype", "bf16", "--format", "json"]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    r = json.loads(out)["ranks"][0]
    dynamic = r["allocator_peak_bytes"] - r["parameter_bytes"] - r["gradient_bytes"]
    return [l["saved_bytes"] for l in r["layers"]], dynamic, r["peak_at"]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", default=",".join(PROFILES), help="profiles to check, comma-separated")
    p.add_argument("--nanoplan", default=os.path.join(root, "build", "tools", "nanoplan"))
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=2816)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=2)
    a = p.parse_args()
    impls = a.impl.split(",")
    for i in impls:
        if i not in PROFILES:
            print(f"torch_check: invalid --impl {i!r} (valid: {', '.join(PROFILES)})", file=sys.stderr)
            return 2
    if not os.access(a.nanoplan, os.X_OK):
        print(f"torch_check: no nanoplan at {a.nanoplan} (build it, or give --nanoplan)", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, CPU, bf16; h {a.hidden}, heads {a.heads}/{a.kv_heads}, "
          f"ffn {a.ffn}, vocab {a.vocab}, {a.layers} layers, seq {a.seq_len} x micro-batch {a.micro_batch}, tp 1")
    print(f"{'profile':<9} {'layer: PyTorch':>15} {'nanoplan':>12} {'diff':>8}   "
          f"{'step peak: PyTorch':>19} {'nanoplan':>12} {'diff':>8}")
    worst = 0.0
    for impl in impls:
        layers, peak = measure(a, impl)
        want, dyn, at = estimate(a, impl, a.nanoplan)
        dl = max(abs(x - y) / y for x, y in zip(layers, want))
        dp = (peak - dyn) / dyn
        worst = max(worst, dl)
        print(f"{impl:<9} {layers[0]:>15,} {want[0]:>12,} {100 * dl:>7.3f}%   "
              f"{peak:>19,} {dyn:>12,} {100 * dp:>+7.2f}%   (nanoplan's peak: {at})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

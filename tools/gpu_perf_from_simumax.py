#!/usr/bin/env python3
"""A GPU's measured efficiencies, from a SimuMax system file, as nanoplan's [gpu.perf] table.

SimuMax (github.com/MooreThreads/SimuMax) ships "system" files whose figures its microbenchmarks
measured on a GPU (simu_tools/efficency_test/): cuBLAS/Transformer Engine GEMMs by shape,
Transformer Engine's fused attention by shape, and NCCL collectives. This prints them in the
schema of models/gpus/gpus.toml (docs/step-times.md, "GPU efficiencies"):

  tools/gpu_perf_from_simumax.py SYSTEM.json --source "TEXT" [--nvlink]

- gemm: [m, n, k, efficiency] per shape, the product's output m x n over a contraction of k,
  efficiency the fraction of the file's peak (matmul.tflops). SimuMax names each shape by its
  m, k, n and layout (TN forward, NN the input gradient, NT the weight gradient); shapes measured
  in several layouts or output dtypes are averaged.
- attention: [seq, heads, forward, backward] for batch 1 and the standard head layout (q and v
  head dims equal, q/k/v contiguous; key/value head counts averaged): the fraction of peak with the causal kernel's work counted
  as the full s^2 product, 4 s^2 h d forward and 2.5 times that backward
  (test_fa_efficiency.py's convention, kept as is).
- memory_bytes_per_s: bandwidth.default's efficient_factor x gbps, gbps in GiB/s as SimuMax
  counts it (config.py, compute_mem_access_time).
- nvlink (with --nvlink): per collective [bus bytes/s, latency per ring step (s), latency per
  call (s)] of high_intra_node: efficient_factor x gbps GiB/s, latency_us, fixed_latency_us
  (config.py, compute_net_op_time: size x scale x (n + offset) / n / (gbps x eff) +
  latency_us x (n + offset) x scale + fixed_latency_us).

Python's standard library only.
"""
import argparse
import json
import re
import sys
from collections import defaultdict

GIB = 2**30


def fields(key):
    return dict(re.findall(r"(\w+)=([\w.]+)", key))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("system")
    ap.add_argument("--source", required=True, help="where the file is, with its commit")
    ap.add_argument("--nvlink", action="store_true", help="also the NVLink collectives")
    a = ap.parse_args()
    with open(a.system) as f:
        s = json.load(f)
    op = s["accelerator"]["op"]

    gemm = defaultdict(list)
    for key, eff in op["matmul"].get("accurate_efficient_factor", {}).items():
        x = fields(key)
        if x.get("b", "1") != "1":
            continue
        gemm[(int(x["m"]), int(x["n"]), int(x["k"]))].append(eff)
    attention = defaultdict(lambda: defaultdict(list))
    for direction in ("sdp_fwd", "sdp_bwd"):
        for key, eff in op[direction].get("accurate_efficient_factor", {}).items():
            x = fields(key)
            if (x["batch"] != "1" or x["qk_head_dim"] != x["v_head_dim"]
                    or x.get("qkv_contiguous") != "True"):
                continue
            attention[(int(x["seq_len"]), int(x["head_num"]))][direction].append(eff)

    print("[gpu.perf]")
    print(f'source = "{a.source}"')
    print("gemm = [")
    for (m, n, k), effs in sorted(gemm.items()):
        print(f"  [{m}, {n}, {k}, {sum(effs) / len(effs):.4f}],")
    print("]")
    print("attention = [")
    for (seq, heads), e in sorted(attention.items()):
        if e["sdp_fwd"] and e["sdp_bwd"]:
            f, b = (sum(e[d]) / len(e[d]) for d in ("sdp_fwd", "sdp_bwd"))
            print(f"  [{seq}, {heads}, {f:.4f}, {b:.4f}],")
    print("]")
    bw = s["accelerator"]["bandwidth"]["default"]
    print(f"memory_bytes_per_s = {bw['efficient_factor'] * bw['gbps'] * GIB:.4g}")
    if a.nvlink:
        net = s["networks"]["high_intra_node"]
        print("[gpu.perf.nvlink]")
        for ours, theirs in (("all_reduce", "all_reduce"), ("all_gather", "all_gather"),
                             ("reduce_scatter", "reduce_scatter"), ("all_to_all", "all2all"),
                             ("p2p", "p2p")):
            o = net["op"][theirs]
            eff = o.get("efficient_factor") or net["bandwidth"]["efficient_factor"]
            step = o.get("latency_us", net["bandwidth"]["latency_us"])
            fixed = o.get("fixed_latency_us") or 0.0
            print(f"{ours} = [{eff * net['bandwidth']['gbps'] * GIB:.4g}, {step * 1e-6:.4g}, "
                  f"{fixed * 1e-6:.4g}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())

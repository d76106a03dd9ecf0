#!/usr/bin/env python3
"""Writes the record fixtures that are not text a log prints: a PyTorch memory snapshot and a
nanotron benchmark CSV. The committed files are this script's output; tests/cli_compare.sh runs it
again and checks that nothing changed.

Usage: python3 tests/data/records/make_records.py [OUT_DIR]   (default: this script's directory)

000000_step_1.pickle: the pickle torch.cuda.memory._dump_snapshot() writes, in the structure
torch/cuda/memory.py's _snapshot documents (pytorch/pytorch
00b65a04a2d30e498eedcb1e3476abd547f428f1): a dict of "segments" (device, address, total_size,
stream, segment_type, allocated_size, active_size, requested_size, blocks: size, requested_size,
address, state, frames), "device_traces" (per device, entries: action, addr, size, stream,
frames, device_free) and "allocator_settings". The name is torchtitan's
("{rank:06d}_step_{step}.pickle", torchtitan b5bcd76c, torchtitan/tools/profiler.py L87-93), so
it is rank 0's. pickle.dump at protocol 4, as torch.cuda.memory._dump_snapshot does through
pickle.dump(s, f) on Python 3.8 and later.

The allocations are a training step of rank 0 of llama-3.1-8b --tp 2 --pp 2 --dp 2
--microbatches 2 --pp-schedule 1f1b --seq-len 2048 (stage 0, layers 0-16), with sizes taken from
nanoplan's prediction for that setup, and a few changed on purpose so that the comparison has
something to show: per layer and micro-batch one more 8 MiB tensor than predicted, a 256 KiB
tensor in place of the predicted 128 KiB one, one cuBLAS workspace, not two. The figures are
invented, not measured. The allocator here is a simplification of PyTorch's: sizes rounded to 512
bytes, requests of 1 MiB or less packed into 2 MiB small segments, larger ones in a segment of
their own rounded up to 2 MiB, a freed block reused only by a request of its exact size. Memory
history starts after the model and optimizer are built (the trace is a window), and the snapshot
is taken after the step.

nanotron_benchmark.csv: the CSV nanotron's write_to_csv appends to (nanotron 2411b022,
src/nanotron/helpers.py: the columns of create_table_log L622-669, Python's csv.writer L690-764,
the header when the file is new), one row per run; the figures are invented.
"""
import csv
import os
import pickle
import sys

MiB = 1 << 20
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))


def round512(n):
    return max(512, (n + 511) // 512 * 512)


class Allocator:
    """The simplified caching allocator above, recording its actions as PyTorch's trace does."""

    def __init__(self):
        self.segments = []  # dicts: address, total_size, segment_type, blocks (address -> block)
        self.trace = None  # None: memory history not recorded yet
        self.next_address = 0x7F0000000000
        self.frame = [{"filename": "train.py", "line": 42, "name": "train_step"}]
        self.device_free = 80 * 10**9
        # What the allocator's counters saw, for the tests: allocated and reserved bytes, their
        # largest while history was recorded, and the block sizes live at that allocated peak.
        self.allocated = self.reserved = self.max_allocated = self.max_reserved = 0
        self.live_at_peak = []

    def count(self, allocated, reserved):
        self.allocated += allocated
        self.reserved += reserved
        if self.trace is None:
            return
        self.max_reserved = max(self.max_reserved, self.reserved)
        if self.allocated > self.max_allocated:
            self.max_allocated = self.allocated
            self.live_at_peak = sorted((b["size"] for s in self.segments
                                        for b in s["blocks"].values()
                                        if b["state"] == "active_allocated"), reverse=True)

    def record(self, action, addr, size):
        if self.trace is not None:
            self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                               "frames": self.frame, "device_free": self.device_free})

    def new_segment(self, size, kind):
        seg = {"address": self.next_address, "total_size": size, "segment_type": kind, "blocks": {}}
        self.next_address += size + 2 * MiB
        self.segments.append(seg)
        self.device_free -= size
        self.record("segment_alloc", seg["address"], size)
        self.count(0, size)
        return seg

    def malloc(self, requested):
        size = round512(requested)
        for seg in self.segments:  # a cached block of the same size
            for b in seg["blocks"].values():
                if b["state"] == "inactive" and b["size"] == size:
                    b["state"], b["requested_size"] = "active_allocated", requested
                    self.record("alloc", b["address"], requested)
                    self.count(size, 0)
                    return b["address"]
        if size <= MiB:  # the small pool: the end of the last small segment, else a new one
            seg = next((s for s in reversed(self.segments) if s["segment_type"] == "small"), None)
            used = sum(b["size"] for b in seg["blocks"].values()) if seg else 0
            if seg is None or used + size > seg["total_size"]:
                seg, used = self.new_segment(2 * MiB, "small"), 0
            addr = seg["address"] + used
        else:
            seg = self.new_segment((size + 2 * MiB - 1) // (2 * MiB) * (2 * MiB), "large")
            addr = seg["address"]
        seg["blocks"][addr] = {"address": addr, "size": size, "requested_size": requested,
                               "state": "active_allocated"}
        self.record("alloc", addr, requested)
        self.count(size, 0)
        return addr

    def free(self, addr):
        for seg in self.segments:
            if addr in seg["blocks"]:
                b = seg["blocks"][addr]
                b["state"] = "inactive"
                self.record("free_requested", addr, b["requested_size"])
                self.record("free_completed", addr, b["requested_size"])
                self.count(-b["size"], 0)
                return
        raise KeyError(addr)

    def snapshot(self):
        segments = []
        for seg in self.segments:
            blocks = []
            end = seg["address"]
            for addr in sorted(seg["blocks"]):
                b = seg["blocks"][addr]
                blocks.append({"size": b["size"], "requested_size": b["requested_size"],
                               "address": addr, "state": b["state"],
                               "frames": self.frame if b["state"] != "inactive" else []})
                end = addr + b["size"]
            rest = seg["address"] + seg["total_size"] - end
            if rest > 0:
                blocks.append({"size": rest, "requested_size": 0, "address": end,
                               "state": "inactive", "frames": []})
            active = sum(b["size"] for b in blocks if b["state"] != "inactive")
            segments.append({"device": 0, "address": seg["address"],
                             "total_size": seg["total_size"], "stream": 0,
                             "segment_type": seg["segment_type"], "allocated_size": active,
                             "active_size": active,
                             "requested_size": sum(b["requested_size"] for b in blocks),
                             "blocks": blocks})
        return {"segments": segments, "device_traces": [self.trace],
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                       "garbage_collection_threshold": 0.0,
                                       "expandable_segments": False,
                                       "roundup_power2_divisions": {}}}


def snapshot():
    a = Allocator()
    layers, microbatches = 17, 2
    # The model and the optimizer (rank 0: the embedding and layers 0-16), before the history.
    a.malloc(525_336_576)  # embed.tokens.weight
    for _ in range(layers):
        for size in (25_165_824, 16_777_216, 117_440_512, 58_720_256, 8192, 8192):
            a.malloc(size)  # qkv, out, gate_up, down, the two norms
    for _ in range(4):
        a.malloc(8_466_759_680)  # the fp32 gradient buffer, master weights, exp_avg, exp_avg_sq
    a.malloc(33_554_432)  # a cuBLAS workspace
    a.malloc(16_777_216)  # the TP all-gather buffer
    a.trace = []  # torch.cuda.memory._record_memory_history() from here
    a.max_allocated, a.max_reserved = a.allocated, a.reserved

    saved = {}
    for mb in range(microbatches):  # 1F1B at stage 0 of 2: two forwards, then the backwards
        for layer in range(layers):
            sizes = [8_388_608] * 6 + [12_582_912, 58_720_256, 29_360_128, 29_360_128,
                                       4096, 4096, 262_144]
            saved[(mb, layer)] = [a.malloc(s) for s in sizes]
    for mb in range(microbatches):
        for layer in reversed(range(layers)):
            grads = [a.malloc(s) for s in (58_720_256, 29_360_128, 29_360_128, 8_388_608)]
            for addr in saved.pop((mb, layer)):
                a.free(addr)
            for addr in grads:
                a.free(addr)
    a.record("snapshot", 0, 0)
    return a


def write_csv(path):
    header = ["job_id", "name", "nodes", "seq_len", "mbs", "batch_accum", "gbs", "mTFLOPs",
              "hTFLOPs", "tok/s/gpu", "Mem Alloc (GB)", "Mem Res (GB)", "dp", "pp", "tp", "cp",
              "ep", "pp_engine", "tp_mode", "tp_async_comm", "recompute_layer", "hidden_size",
              "hidden_act", "num_layers", "num_heads", "num_kv_heads", "max_pos", "vocab_size",
              "tie_word_embeddings", "dtype", "zero_stage", "ddp_bucket_cap_mb",
              "accumulate_grad_in_fp32", "Total Params", "Local Params"]
    common = ["2048", "1", "2", "{gbs}", "{mt}", "{ht}", "{tok}", "{alloc}", "{res}", "{dp}", "{pp}",
              "{tp}", "1", "1", "{engine}", "REDUCE_SCATTER", "True", "False", "4096", "silu",
              "32", "32", "8", "131072", "128256", "False", "torch.bfloat16", "0", "25", "True",
              "8.03B", "{local}"]
    runs = [
        ("14001", "llama8b, tp2 pp2 dp2", dict(mt="301.20", ht="301.20", tok="3902.11",
                                               alloc="42.87", res="45.10", gbs=4, dp=2, pp=2, tp=2,
                                               engine="1f1b", local="2.12B")),
        ("14002", "llama8b tp8", dict(mt="280.51", ht="280.51", tok="3640.00", alloc="22.41",
                                      res="24.02", gbs=2, dp=1, pp=1, tp=8, engine="1f1b",
                                      local="1.00B")),
        ("N/A", "llama8b dp8", dict(mt="350.00", ht="350.00", tok="4530.90", alloc="71.33",
                                    res="74.90", gbs=16, dp=8, pp=1, tp=1, engine="afab",
                                    local="8.03B")),
    ]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for job, name, v in runs:
            w.writerow([job, name, "1"] + [c.format(**v) for c in common])


def main():
    with open(os.path.join(OUT, "000000_step_1.pickle"), "wb") as f:
        pickle.dump(snapshot().snapshot(), f, protocol=4)
    write_csv(os.path.join(OUT, "nanotron_benchmark.csv"))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""nanoplan's predicted step times against step times others measured on real GPUs.

Reads tests/data/measured_step_times.toml, runs `nanoplan estimate <args> --format json` for every
expressible case and compares step_time.seconds with the measured time, or the throughput it
gives with a measured throughput (the error is always the step time's: negative when the
prediction is faster). The papers' cases
(planner/recompute/published.cpp) come from `cost_check --markdown`, whose rows are iteration
times or the per-GPU throughput the paper printed.

  tools/step_accuracy.py [--nanoplan BIN] [--cost-check BIN] [--check]

It prints the table docs/step-times.md shows: each case with its GPU, measured and predicted
figures and the error, then the mean |error| and the worst case per GPU and over all. --check
exits 1 unless every expressible case of the data file is within +-15 % of its measurement or
says in outside_bound why not (a stated reason that no longer holds, the case now within the
bound, fails too), and the mean |error| over the cases within the bound is at most MEAN_BOUND.
The papers' cases are held to their bounds by tests/test_cost.cpp; those beyond carry their
reason in published.cpp. Python's standard library only.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BOUND = 0.15  # no case beyond it (issue 29's goal)
# The goal is a mean |error| of 5 % (issue 29); the table holds 10 % today, and --check keeps it
# there (docs/step-times.md says what is missing).
MEAN_BOUND = 0.10


UNITS = ("ms", "s", "tokens/s", "tokens/s/GPU")


def predict(nanoplan, case):
    """The estimate's figure in the case's unit: a step time, or the throughput a step time gives
    (tokens/s over the job, or per GPU). A case without a model takes it from its args (a job
    file)."""
    args = [nanoplan, "estimate"]
    if "model" in case:
        args += ["--model", os.path.join(ROOT, case["model"])]
    args += shlex.split(case["args"]) + ["--format", "json"]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)  # args' paths: the repo's
    if out.returncode != 0:
        raise SystemExit(f"{case['id']}: nanoplan estimate failed: {out.stderr.strip()}")
    j = json.loads(out.stdout)
    st = j["step_time"]
    if case["unit"] == "tokens/s":
        return st["tokens_per_second"]
    if case["unit"] == "tokens/s/GPU":
        return st["tokens_per_second"] / j["setup"]["gpus"]
    return st["seconds"] * (1e3 if case["unit"] == "ms" else 1.0)


def figure(value, unit):
    """A figure as the table prints it: times to two decimals, throughputs in whole tokens."""
    return f"{value:,.0f} {unit}" if unit.startswith("tokens/s") else f"{value:.2f} {unit}"


def step_error(case, predicted):
    """The predicted step time's error: negative when the prediction is faster (a throughput's
    error is measured / predicted - 1, the same quantity)."""
    m = case["measured"]
    if case["unit"].startswith("tokens/s"):
        return m / predicted - 1
    return (predicted - m) / m


def paper_rows(cost_check):
    """(source, gpu, what, published, predicted, unit, error) from cost_check --markdown."""
    out = subprocess.run([cost_check, "--markdown"], capture_output=True, text=True, check=True)
    rows = []
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or cells[0] == "source" or cells[0].startswith("---"):
            continue
        published, unit = cells[2].split(" ", 1)
        predicted = cells[3].split(" ", 1)[0]
        rows.append(((cells[0], "a100-80gb", cells[1], float(published), float(predicted), unit,
                      float(cells[4].replace("%", "").strip()) / 100), cells[5]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nanoplan", default=os.path.join(ROOT, "build/tools/nanoplan"))
    ap.add_argument("--cost-check", default=os.path.join(ROOT, "build/tools/cost_check"))
    ap.add_argument("--data", default=os.path.join(ROOT, "tests/data/measured_step_times.toml"))
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    with open(a.data, "rb") as f:
        cases = tomllib.load(f)["case"]

    rows, outside, not_expressible, problems = [], [], [], []
    for c in cases:
        for key in ("id", "source", "label", "counter", "gpu", "unit", "measured"):
            if key not in c:
                raise SystemExit(f"{c.get('id', '?')}: missing {key}")
        if c["unit"] not in UNITS:
            raise SystemExit(f"{c['id']}: unit {c['unit']!r} is none of {', '.join(UNITS)}")
        if c.get("expressible", True) is False:
            not_expressible.append((c["id"], c["reason"]))
            continue
        predicted = predict(a.nanoplan, c)
        err = step_error(c, predicted)
        row = (c["label"], c["gpu"], c["id"], c["measured"], predicted, c["unit"], err)
        if "outside_bound" in c:
            outside.append((row, c["outside_bound"]))
            if abs(err) <= BOUND:
                problems.append(f"{c['id']}: within the bound now ({err:+.1%}); its "
                                "outside_bound reason is stale")
        else:
            rows.append(row)
            if abs(err) > BOUND:
                problems.append(f"{c['id']}: {err:+.1%} is beyond +-{BOUND:.0%} and no "
                                "outside_bound says why")
    papers = []
    for row, why in paper_rows(a.cost_check):  # bounds: tests/test_cost.cpp
        (outside.append((row, why)) if why else papers.append(row))

    print("| source | GPU | case | measured | predicted | error |")
    print("|---|---|---|---:|---:|---:|")
    everything = papers + rows + [r for r, _ in outside]
    for src, gpu, what, m, p, unit, err in everything:
        print(f"| {src} | {gpu} | {what} | {figure(m, unit)} | {figure(p, unit)} | "
              f"{100 * err:+.1f} % |")
    print()

    def summary(label, errs):
        print(f"- {label}: {len(errs)} cases, mean |error| {100 * sum(errs) / len(errs):.1f} %, "
              f"worst {100 * max(errs):.1f} %")

    by_gpu = {}
    for r in everything:
        by_gpu.setdefault(r[1], []).append(abs(r[6]))
    for gpu, errs in sorted(by_gpu.items()):
        summary(gpu, errs)
    summary("all", [abs(r[6]) for r in everything])
    within = [abs(r[6]) for r in papers + rows]
    summary("all but those outside the bound", within)
    mean = sum(within) / len(within)
    if outside:
        print("\nOutside the bound, with the reason:\n")
        for (src, gpu, what, m, p, unit, err), why in outside:
            print(f"- {what} ({gpu}): measured {figure(m, unit)}, predicted {figure(p, unit)} "
                  f"({100 * err:+.1f} %): {why}")
    if not_expressible:
        print("\nNot expressible yet:\n")
        for cid, why in not_expressible:
            print(f"- {cid}: {why}")
    if a.check:
        if mean > MEAN_BOUND:
            problems.append(f"mean |error| {mean:.1%} over the cases within the bound is above "
                            f"{MEAN_BOUND:.0%}")
        for p in problems:
            print(f"step_accuracy: {p}", file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

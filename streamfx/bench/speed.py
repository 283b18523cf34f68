"""Step time of streambp against gradient checkpointing, methods interleaved in fresh processes.

    python -m streamfx.bench.speed [--preset qwen3-layers,qwen3-head] [--seq 4096,16384]
                                   [--pairs 5] [--methods streambp,ckpt,ckpt-compiled,ckpt-offload]
                                   [--out bench-out/speed] [--options '{"chunk_size": 512}']

A trainer's batch: ``input_ids``, ``attention_mask`` (all ones, as collators pass it) and labels
with the prompt (first quarter) masked; fp32 on the CPU. For each preset and length, ``--pairs``
rounds; each round runs every method once, each in its own process (a warm-up step, which
compiles, then ``--steps`` timed steps; the round's value is their median), the methods' order
rotating from round to round. Reported per method: the median over rounds of the step time, its
ratio to each baseline's median (``ratio to ckpt``: < 1 is faster), the peak RSS rise of one step
after the warm-up, and for streambp the time split per region kind and phase (layers / head,
forward / backward; the rest of the step is what runs outside the streamed regions). The peak is
measured with every large block handed back to the system when freed, so that RSS follows live
memory (``worker.fix_malloc_thresholds``); the steps are then timed under the settings glibc's
defaults reach in a long-running process (``worker.default_malloc_steady_state``), as a training
process runs.

Methods:
  streambp        torch.compile(model, backend="streambp", options=--options)
  streambp-recompute  the same with head_grad="recompute" (the head's backward reruns its chunks)
  streambp-keep   the same with attention="keep" (each layer's attention output and log-sum-exp kept
                  from the forward: its backward does not run the attention's forward again)
  ckpt            HF activation checkpointing (activation_checkpointing_enable()), eager
  ckpt-compiled   the same under torch.compile(model) (Inductor)
  ckpt-offload    HF activation checkpointing with its inputs offloaded to the host
                  (activation_checkpointing_enable(offload=True), where transformers has it)
  eager           every activation kept
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

METHODS = ("streambp", "streambp-recompute", "streambp-keep", "ckpt", "ckpt-compiled", "ckpt-offload", "eager")
BASELINES = ("ckpt", "ckpt-compiled")


def _prepare(method: str, model, options: dict):
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method in ("streambp", "streambp-recompute", "streambp-keep"):
            from .methods import _streambp_backend

            if method == "streambp-recompute":
                options = {**options, "head_grad": "recompute"}
            if method == "streambp-keep":
                options = {**options, "attention": "keep"}
            return torch.compile(model, backend=_streambp_backend(), options=options)
        if method in ("ckpt", "ckpt-compiled"):
            from .methods import compile_checkpointed, hf_checkpointing

            hf_checkpointing(model)
            return compile_checkpointed(model) if method == "ckpt-compiled" else model
        if method == "ckpt-offload":
            if not hasattr(model, "activation_checkpointing_enable"):
                raise RuntimeError("this transformers has no activation_checkpointing_enable(offload=True)")
            if not torch.cuda.is_available():
                raise RuntimeError("not on a CPU: its offload copies to pinned host memory, which needs a GPU")
            model.activation_checkpointing_enable(offload=True)
            return model
        if method == "eager":
            return model
    raise ValueError(f"unknown method {method!r}; known: {METHODS}")


def worker(args: dict) -> dict:
    """One process, one method: warm-up step, timed steps, peak RSS rise of one step."""
    import torch

    from streamfx import runtime

    from . import presets as presets_mod
    from .worker import MemoryMeter, default_malloc_steady_state, fix_malloc_thresholds

    fix_malloc_thresholds()
    torch.manual_seed(0)
    preset = presets_mod.get_preset(args["preset"])
    T = args["seq"]
    model = presets_mod.build_model(preset, "float32", "cpu", seed=0, max_seq=T)
    ids, labels = presets_mod.make_batch(preset, T, "cpu", seed=0)
    mask = torch.ones_like(ids)
    step_model = _prepare(args["method"], model, args.get("options") or {})

    def step():
        loss = step_model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss.detach()

    t0 = time.perf_counter()
    loss = step()
    warm = time.perf_counter() - t0
    with MemoryMeter("cpu") as meter:
        step()
    # timed as a training process runs: freed blocks reused from the heap, not mapped afresh
    default_malloc_steady_state()
    runtime.TIMES.clear()
    runtime.TIMING[0] = args["method"].startswith("streambp")
    times = []
    for _ in range(args["steps"]):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    runtime.TIMING[0] = False
    split = {f"{kind} {phase}": t / args["steps"] for (kind, phase), t in sorted(runtime.TIMES.items())}
    return {"method": args["method"], "preset": args["preset"], "seq": T, "time_s": statistics.median(times),
            "times_s": times, "warmup_s": warm, "rss_rise_bytes": meter.peak_bytes - meter.pre_bytes,
            "loss": float(loss), "split_s": split}


def _run_one(args: dict, timeout: float, env: dict | None = None) -> dict:
    cmd = [sys.executable, "-m", "streamfx.bench.speed", "--worker", json.dumps(args)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(args, error=f"timed out after {timeout:.0f} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return dict(args, error=(proc.stderr.strip().splitlines() or ["no output"])[-1][:300])


def table(rows: list, methods: list) -> str:
    """The markdown table of medians, ratios and the streambp time split."""
    out = ["| preset | T | method | step s (median) | rounds | ratio to ckpt | ratio to ckpt-compiled "
           "| peak RSS rise MiB | streambp split (s per step) |", "|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["preset"], r["seq"]) for r in rows})
    for preset, T in keys:
        mine = [r for r in rows if (r["preset"], r["seq"]) == (preset, T) and "error" not in r]
        med = {m: statistics.median([r["time_s"] for r in mine if r["method"] == m])
               for m in methods if any(r["method"] == m for r in mine)}
        for m in methods:
            got = [r for r in mine if r["method"] == m]
            if not got:
                err = next((r["error"] for r in rows if (r["preset"], r["seq"], r["method"]) == (preset, T, m)), "-")
                out.append(f"| {preset} | {T} | {m} | failed: {err} | 0 | - | - | - | - |")
                continue
            ratios = [f"{med[m] / med[b]:.3f}" if b in med and m != b else "-" for b in BASELINES]
            rss = statistics.median([r["rss_rise_bytes"] for r in got]) / 2**20
            split = "-"
            if m.startswith("streambp"):
                parts = {k: statistics.median([r["split_s"].get(k, 0.0) for r in got])
                         for k in sorted({k for r in got for k in r["split_s"]})}
                split = ", ".join(f"{k} {v:.2f}" for k, v in parts.items()) + \
                    f"; outside regions {med[m] - sum(parts.values()):.2f}"
            out.append(f"| {preset} | {T} | {m} | {med[m]:.3f} | {len(got)} | {ratios[0]} | {ratios[1]} "
                       f"| {rss:.0f} | {split} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamfx.bench.speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--preset", default="qwen3-layers,qwen3-head")
    p.add_argument("--seq", default="4096,16384")
    p.add_argument("--pairs", type=int, default=5, help="rounds of every method (default 5)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per process (default 2)")
    p.add_argument("--methods", default="streambp,ckpt,ckpt-compiled")
    p.add_argument("--options", default="{}", help="JSON options of the streambp rows")
    p.add_argument("--out", default="bench-out/speed")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per process")
    ns = p.parse_args(argv)
    if ns.worker:
        print(json.dumps(worker(json.loads(ns.worker))), flush=True)
        return 0
    methods = [m for m in ns.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        p.error(f"unknown method(s) {unknown}; known: {list(METHODS)}")
    from .presets import PRESETS

    presets = [x for x in ns.preset.split(",") if x]
    unknown = [x for x in presets if x not in PRESETS]
    if unknown:
        p.error(f"unknown preset(s) {unknown}; known: {sorted(PRESETS)}")
    options = json.loads(ns.options)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    # the workers share an Inductor cache of this run's own (they run one after another): another
    # process compiling into the default cache at the same time can leave a half-written kernel
    # there, and a chunk graph whose kernel fails to load runs uncompiled (and is timed so)
    env = dict(os.environ)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str((out / "inductor-cache").resolve()))
    for preset in presets:
        for T in [int(t) for t in ns.seq.split(",")]:
            for r in range(ns.pairs):
                order = methods[r % len(methods):] + methods[:r % len(methods)]
                for m in order:
                    row = _run_one({"preset": preset, "seq": T, "method": m, "steps": ns.steps,
                                    "options": options}, ns.timeout, env)
                    row["round"] = r
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    (out / "speed.json").write_text(json.dumps(rows, indent=1))
    text = (f"python -m streamfx.bench.speed {' '.join(argv if argv is not None else sys.argv[1:])}\n\n"
            f"machine: {os.cpu_count()} cores; torch threads per process: default\n\n" + table(rows, methods))
    (out / "speed.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

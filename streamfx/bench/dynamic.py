"""Symbolic sequence length: compile times and step time against ``dynamic=False``.

    python -m streamfx.bench.dynamic [--model qwen3-layers] [--t1 1024] [--t2 2048] [--reps 7]
                                     [--processes 1] [--codegen inductor]

Each process (fresh, with an empty Inductor cache directory) builds the preset twice with the same
weights and:

  1. compiles model A with ``torch.compile(model, backend="streambp")`` (no ``dynamic=``: Dynamo's
     automatic dynamic shapes), runs 3 steps at T1 (the static compile), then 3 steps at T2 (the
     symbolic recompile). Compile time = first step - median of the next two, at each length; the
     Dynamo-timed metrics and the backend / chunk compile counts of each phase are reported too;
  2. compiles model B with ``dynamic=False`` at T2 (its compile shares the warm Inductor cache of
     step 1 in this process, so its compile time is not a cold figure);
  3. times forward+backward at T2 of A (symbolic schedule, a length it was not first compiled at)
     and B (compiled at its own length), interleaved A, B, A, B, ... ``--reps`` times after one
     warm-up each; reports the medians and their ratio A / B, and checks from
     ``streamfx.runtime.COUNTERS`` that every call streamed and that no chunk graph or backend
     compile happened after the dynamic compile.

Optionally (``--extra 768,1536``) A is also called once at further lengths to show that no further
backend or chunk compile happens. Step-time figures on a shared machine are noisy: read the ratio
(measured interleaved) rather than the absolute times.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _worker(a) -> dict:
    import torch
    from torch._dynamo import utils as dynamo_utils

    import importlib
    from streamfx import runtime
    from streamfx.bench import presets

    sbackend = importlib.import_module("streamfx.backend")  # the module (streamfx.backend is also a function)
    C = runtime.COUNTERS
    backend_calls = [0]
    real_compile_graph = sbackend.compile_graph

    def counting_compile_graph(*args, **kwargs):
        backend_calls[0] += 1
        return real_compile_graph(*args, **kwargs)

    sbackend.compile_graph = counting_compile_graph

    p = presets.get_preset(a.model)
    tmax = max([a.t1, a.t2] + a.extra)
    models = [presets.build_model(p, p.dtype, "cpu", seed=0, max_seq=tmax) for _ in range(2)]
    batches = {t: presets.make_batch(p, t, "cpu", seed=0) for t in {a.t1, a.t2, *a.extra}}
    opts = {"codegen": a.codegen}
    A = torch.compile(models[0], backend="streambp", options=opts)
    B = torch.compile(models[1], backend="streambp", dynamic=False, options=opts)

    def step(fn, model, t):
        ids, labels = batches[t]
        t0 = time.perf_counter()
        fn(input_ids=ids, labels=labels).loss.backward()
        dt = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
        return dt

    def metrics():
        return {k: sum(v) for k, v in dynamo_utils.compilation_time_metrics.items()}

    def snap():
        return dict(C, backend_compiles=backend_calls[0])

    def diff(after, before):
        return {k: after[k] - before.get(k, 0) for k in after}

    def phase(fn, model, t, n=3):
        c0, m0 = snap(), metrics()
        times = [step(fn, model, t) for _ in range(n)]
        c1, m1 = snap(), metrics()
        later = statistics.median(times[1:]) if n > 1 else float("nan")
        dm = {k: round(v, 3) for k, v in diff(m1, m0).items() if v > 0.01}
        return {"T": t, "first_step_s": times[0], "later_step_s": later,
                "compile_s": times[0] - later, "counters": diff(c1, c0), "dynamo_timed_s": dm}

    out = {"threads": torch.get_num_threads(), "torch": torch.__version__}
    out["A_static"] = phase(A, models[0], a.t1)
    out["A_dynamic"] = phase(A, models[0], a.t2)
    out["B_static_at_t2"] = phase(B, models[1], a.t2)
    c0 = snap()
    out["A_extra"] = [phase(A, models[0], t, n=1) for t in a.extra]
    # interleaved step timing at T2
    ta, tb = [], []
    ca, cb = {}, {}
    for _ in range(a.reps):
        s = snap(); ta.append(step(A, models[0], a.t2)); da = diff(snap(), s)
        s = snap(); tb.append(step(B, models[1], a.t2)); db = diff(snap(), s)
        for acc, d in ((ca, da), (cb, db)):
            for k, v in d.items():
                acc[k] = acc.get(k, 0) + v
    out["timing"] = {"T": a.t2, "reps": a.reps, "A_dynamic_s": ta, "B_static_s": tb,
                     "A_median_s": statistics.median(ta), "B_median_s": statistics.median(tb),
                     "ratio": statistics.median(ta) / statistics.median(tb),
                     "ratio_of_pairs_median": statistics.median(x / y for x, y in zip(ta, tb)),
                     "A_counters": ca, "B_counters": cb}
    out["after_dynamic_compile"] = diff(snap(), c0)
    return out


def _print(r: dict) -> None:
    print(f"torch {r['torch']}, {r['threads']} threads")
    print("| phase | T | first step s | later step s | compile s (first - later) | backend compiles "
          "| chunk compiles | region fwd/bwd | dynamo _compile.compile_inner s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("A_static", "A_dynamic", "B_static_at_t2"):
        ph = r[name]
        c = ph["counters"]
        print(f"| {name} | {ph['T']} | {ph['first_step_s']:.1f} | {ph['later_step_s']:.2f} | "
              f"{ph['compile_s']:.1f} | {c['backend_compiles']} | {c['chunk_compiles']} | "
              f"{c['region_forward']}/{c['region_backward']} | "
              f"{ph['dynamo_timed_s'].get('_compile.compile_inner', 0):.1f} |")
    for ph in r["A_extra"]:
        c = ph["counters"]
        print(f"| A_extra | {ph['T']} | {ph['first_step_s']:.2f} | - | - | {c['backend_compiles']} | "
              f"{c['chunk_compiles']} | {c['region_forward']}/{c['region_backward']} | - |")
    t = r["timing"]
    print(f"\nstep time at T={t['T']}, {t['reps']} interleaved reps after warm-up")
    print("| method | median s | min s | max s | region fwd/bwd | chunk compiles | backend compiles |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, key, ck in (("default (dynamic recompile)", "A_dynamic_s", "A_counters"),
                           ("dynamic=False at own T", "B_static_s", "B_counters")):
        xs, c = t[key], t[ck]
        print(f"| {label} | {statistics.median(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} | "
              f"{c['region_forward']}/{c['region_backward']} | {c['chunk_compiles']} | "
              f"{c['backend_compiles']} |")
    print(f"ratio of medians dynamic/static = {t['ratio']:.3f}; median of per-pair ratios = "
          f"{t['ratio_of_pairs_median']:.3f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-layers")
    p.add_argument("--t1", type=int, default=1024)
    p.add_argument("--t2", type=int, default=2048)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--extra", default="", help="further lengths A is called at once (comma list)")
    p.add_argument("--codegen", default="inductor")
    p.add_argument("--processes", type=int, default=1, help="fresh processes (repetitions)")
    p.add_argument("--json", default="", help="append each process's raw result to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.extra = [int(x) for x in a.extra.split(",") if x]
    if a.worker:
        print("RESULT " + json.dumps(_worker(a)))
        return
    for i in range(a.processes):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_FX_GRAPH_CACHE="0",
                       TORCHINDUCTOR_AUTOGRAD_CACHE="0")
            cmd = [sys.executable, "-m", "streamfx.bench.dynamic", "--worker", "--model", a.model,
                   "--t1", str(a.t1), "--t2", str(a.t2), "--reps", str(a.reps),
                   "--extra", ",".join(map(str, a.extra)), "--codegen", a.codegen]
            load0 = os.getloadavg()
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            load1 = os.getloadavg()
        if out.returncode:
            sys.stderr.write(out.stderr[-5000:])
            raise SystemExit(out.returncode)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        r = json.loads(line[len("RESULT "):])
        r["loadavg_before"], r["loadavg_after"] = load0, load1
        print(f"\n## process {i + 1}/{a.processes}: {a.model}, T1={a.t1}, T2={a.t2}, codegen={a.codegen}, "
              f"load avg before {load0[0]:.2f}/{load0[1]:.2f}, after {load1[0]:.2f}/{load1[1]:.2f}")
        _print(r)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()

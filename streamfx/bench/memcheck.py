"""Predicted against measured step peaks: ``python -m streamfx.bench.memcheck``.

For each model and sequence length: ``streamfx.plan_memory`` (in this process, traced once at a
short length) predicts the step peak; a fresh process per model measures it at each length (CPU:
the RSS high-water mark over one training step after a warm-up step at that length, above the
RSS before it; CUDA: the allocator's peak above what was allocated before it;
``worker.MemoryMeter``), under one compile with the sequence length dynamic. Models: ``preset:<name>``
(``presets.PRESETS``, fp32) or ``zoo:<function>`` (``tests/zoo.py``, with the model's
hidden size and positions widened so long sequences are meaningful); ``@bfloat16`` after a spec
builds it in that dtype.

    python -m streamfx.bench.memcheck --models preset:qwen3-layers,preset:qwen3-head --seqs 1024,4096,16384
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WIDE_HIDDEN = 256   # zoo models are built this wide: their step then holds megabytes, not kilobytes
ZOO_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "tests")


def build(spec: str, seq: int):
    """(model, input_ids, labels) of a model spec at length ``seq`` (CPU; fp32, or the dtype after
    an ``@``: ``preset:qwen3-layers@bfloat16``)."""
    import torch

    spec, _, dtype = spec.partition("@")
    kind, name = spec.split(":", 1)
    if kind == "preset":
        from . import presets

        p = presets.PRESETS[name]
        model = presets.build_model(p, dtype or "float32", "cpu", max_seq=seq)
        return (model, *batch(spec, seq))
    zoo = _zoo()
    # zoo's builders read its module constants when called: widen them for this build only, so a
    # caller that shares the module (a test process) keeps its own small models
    saved = zoo.MAX_POS, zoo.HIDDEN, zoo.HEAD_DIM
    zoo.MAX_POS = max(zoo.MAX_POS, seq)
    zoo.HIDDEN, zoo.HEAD_DIM = WIDE_HIDDEN, WIDE_HIDDEN // zoo.HEADS
    try:
        model, _ = getattr(zoo, name)()
    finally:
        zoo.MAX_POS, zoo.HIDDEN, zoo.HEAD_DIM = saved
    if dtype:
        model.to(getattr(torch, dtype))
    return (model, *batch(spec, seq))


def batch(spec: str, seq: int):
    """(input_ids, labels) of a model spec at length ``seq``."""
    import torch

    kind, name = spec.partition("@")[0].split(":", 1)
    if kind == "preset":
        from . import presets

        return presets.make_batch(presets.PRESETS[name], seq, "cpu")
    zoo = _zoo()
    torch.manual_seed(0)
    ids = torch.randint(1, zoo.VOCAB, (1, seq))
    labels = ids.clone()
    labels[:, : seq // 4] = -100
    return ids, labels


def _zoo():
    if os.path.abspath(ZOO_DIR) not in sys.path:
        sys.path.insert(0, os.path.abspath(ZOO_DIR))
    import zoo

    return zoo


METHODS = ("streamfx", "activation checkpointing")


def measure(spec: str, seqs, options: dict | None = None, device: str = "cpu",
            method: str = "streamfx") -> list:
    """Per length in ``seqs`` (run in a fresh process): one warm-up step, then the measured one.
    ``method``: the model under ``torch.compile(backend="streambp")``, or eager with Hugging
    Face's gradient checkpointing (``activation_checkpointing_enable()``). The model is built and
    compiled once (built for the longest length); each length's inputs have their sequence dim
    marked dynamic, so that one compile serves every length (as it does for a trainer's later
    lengths)."""
    import torch

    from . import worker

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known: {METHODS}")
    if device == "cpu":
        worker.fix_malloc_thresholds()
    model, _, _ = build(spec, max(seqs))
    model.to(device)
    if method == "streamfx":
        compiled = torch.compile(model, backend="streambp", options=options or {})
    else:
        from .methods import hf_checkpointing

        hf_checkpointing(model)
        compiled = model
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    out = []
    for T in seqs:
        x, y = (t.to(device) for t in batch(spec, T))
        if len(seqs) > 1:
            torch._dynamo.mark_dynamic(x, 1)
            torch._dynamo.mark_dynamic(y, 1)

        def step():
            loss = compiled(input_ids=x, labels=y).loss
            loss.backward()

        step()
        model.zero_grad(set_to_none=True)
        with worker.MemoryMeter(device) as meter:
            step()
        model.zero_grad(set_to_none=True)
        out.append({"seq": T, "measured": meter.peak_bytes - meter.pre_bytes, "params": params})
    return out


def measure_in_subprocess(spec: str, seqs, options: dict | None = None, timeout: float = 3600,
                          method: str = "streamfx") -> dict:
    """``measure`` in a fresh process: {length: {"measured": bytes, "params": bytes}}, or
    {"error": the process's last output} when it failed. ``seqs``: a length or several."""
    seqs = [seqs] if isinstance(seqs, int) else list(seqs)
    env = dict(os.environ)
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    arg = json.dumps({"spec": spec, "seqs": seqs, "options": options or {}, "method": method})
    out = subprocess.run([sys.executable, "-m", "streamfx.bench.memcheck", "--measure", arg], env=env,
                         capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr or out.stdout)[-2000:]}
    return {r["seq"]: r for r in json.loads(lines[-1])}


def predict(spec: str, seqs, options: dict | None = None, trace_len: int = 64, method: str = "streamfx"):
    """The memory report of a model spec, and its predicted step peaks at ``seqs`` (``method``:
    streamfx's, or a baseline's, see ``MemoryReport.step_peak``)."""
    import streamfx

    model, ids, labels = build(spec, max(seqs))
    report = streamfx.plan_memory(model, input_ids=ids[:, :trace_len], labels=labels[:, :trace_len], options=options)
    return report, {T: report.step_peak(T, method) for T in seqs}


def table(specs, seqs, options=None) -> list:
    rows = []
    for spec in specs:
        report, predicted = predict(spec, seqs, options)
        got = measure_in_subprocess(spec, seqs, options)
        for T in seqs:
            m = got.get(T, {"error": got.get("error", "not measured")})
            row = {"model": spec, "T": T, "chunks": report.chunks(T), "predicted": predicted[T], **m}
            if "measured" in m:
                row["ratio"] = predicted[T] / m["measured"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamfx.bench.memcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="preset:qwen3-layers,preset:qwen3-head")
    parser.add_argument("--seqs", default="1024,4096,16384")
    parser.add_argument("--options", default="{}", help="backend options, JSON")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.measure:
        a = json.loads(ns.measure)
        print(json.dumps(measure(a["spec"], a["seqs"], a.get("options"), method=a.get("method", "streamfx"))))
        return 0
    rows = table(ns.models.split(","), [int(s) for s in ns.seqs.split(",")], json.loads(ns.options))
    print(f"{'model':<24} {'T':>6} {'chunks':>12} {'predicted':>10} {'measured':>10} {'ratio':>6}")
    for r in rows:
        if "measured" in r:
            print(f"{r['model']:<24} {r['T']:>6} {str(tuple(r['chunks'])):>12} {r['predicted'] / 2**20:>8.1f}Mi "
                  f"{r['measured'] / 2**20:>8.1f}Mi {r['ratio']:>6.2f}")
        else:
            print(f"{r['model']:<24} {r['T']:>6}  measurement failed: {r['error'][-300:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

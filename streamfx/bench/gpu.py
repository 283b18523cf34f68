"""``python -m streamfx.bench gpu``: the headline measurements in one command that fits a
10-minute limit on one H100 with no network (random weights, nothing downloaded).

Contract: :func:`main` runs the parts of :data:`PLAN` in order, each within its time budget and
all within ``--deadline`` seconds; a part or measurement that would start after its budget is a
row saying so. After every part it writes ``OUT/gpu.md`` (markdown tables), ``OUT/gpu.json`` and
``OUT/gpu.png`` (memory against length; step time), so a command stopped from outside still
leaves what it measured. ``--device cpu --tiny`` runs the same code paths on tiny shapes (the
compiles without Inductor) as a smoke test. Returns 0; only bad flags make it non-zero.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import time
from pathlib import Path

from . import gpu_parts as parts

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    budget_s: float     # on an H100 (see docs/gpu.md for what each part's time is spent on)
    what: str


PLAN = (
    Part("kernels", 75, "per SDPA kernel form (flash, efficient, cuDNN) and dtype (bf16, fp32), small model: "
                        "streamed or not, gradient error against eager with the same kernel"),
    Part("memory", 210, "Qwen3-8B shape, bf16, BP only: peak allocated / reserved memory per method at 4 lengths"),
    Part("max_len", 120, "Qwen3-8B shape: the longest length that fits the device, per method, by bisection "
                         "with the method's one dynamic compile"),
    Part("speed", 150, "Qwen3-4B shape, bf16: median step time at 24k tokens per method"),
)


def setup_for(ns) -> parts.Setup:
    """The shapes of each part: the published ones, or tiny ones for ``--tiny``."""
    cap = int(ns.mem_cap_gb * GiB) if ns.mem_cap_gb else None
    if ns.tiny:
        return parts.Setup(device=ns.device, kernel_preset="tiny", kernel_seq=48, memory_preset="tiny",
                           memory_seqs=(32, 64, 96, 128), speed_preset="tiny", speed_seq=96, speed_repeats=2,
                           max_len_step=32, max_len_limit=256, mem_cap_bytes=cap or 64 * GiB,
                           streamfx_options={"codegen": "eager"}, compile_backend="aot_eager")
    return parts.Setup(device=ns.device, kernel_preset="qwen3-layers", kernel_seq=1024, memory_preset="qwen3-8b",
                       memory_seqs=(4096, 8192, 16384, 32768), speed_preset="qwen3-4b", speed_seq=24576,
                       speed_repeats=3, max_len_step=2048, max_len_limit=262144, mem_cap_bytes=cap,
                       streamfx_options={}, compile_backend="inductor")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m streamfx.bench gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench-out/gpu", help="output directory (default: bench-out/gpu)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes: the same code paths in a minute or two")
    p.add_argument("--parts", default=",".join(x.name for x in PLAN),
                   help=f"comma list, run in the plan's order (default: all of {', '.join(x.name for x in PLAN)})")
    p.add_argument("--deadline", type=float, default=570.0, help="seconds for the whole command (default 570)")
    p.add_argument("--mem-cap-gb", type=float, default=None,
                   help="memory cap of the longest-length search in GiB (default: the device's memory)")
    return p


def main(argv=None) -> int:
    ns = build_parser().parse_args(argv)
    chosen = [x for x in ns.parts.split(",") if x]
    unknown = set(chosen) - {x.name for x in PLAN}
    if unknown:
        build_parser().error(f"unknown part(s) {sorted(unknown)}; known: {[x.name for x in PLAN]}")
    import torch

    if ns.device == "cuda" and not torch.cuda.is_available():
        build_parser().error("--device cuda but torch.cuda.is_available() is False (use --device cpu --tiny)")
    start, setup, state = time.monotonic(), setup_for(ns), {}
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"meta": {**_meta(ns), "memory_preset": setup.memory_preset, "speed_preset": setup.speed_preset},
               "parts": {}}
    for part in (x for x in PLAN if x.name in chosen):
        budget = ns.deadline if ns.tiny else part.budget_s  # (tiny: the budgets are an H100's)
        setup.deadline = min(start + ns.deadline, time.monotonic() + budget)
        began = time.monotonic()
        print(f"streamfx bench gpu: {part.name} ({part.what}); budget {part.budget_s:.0f} s", flush=True)
        if part.name == "speed":  # (the large model of memory and max_len goes first)
            state.clear()
            parts._free(setup.device)
        rows = _run(part.name, setup, state)
        results["parts"][part.name] = {"what": part.what, "seconds": round(time.monotonic() - began, 1), "rows": rows}
        write(out, results)
    print((out / "gpu.md").read_text(), flush=True)
    return 0


def _run(name, setup, state) -> list[dict]:
    try:
        if name in ("memory", "max_len"):
            return getattr(parts, name)(setup, state)
        return getattr(parts, name)(setup)
    except Exception as exc:  # noqa: BLE001 - a part that fails as a whole (building the model) is a row
        return [{"status": "error", "reason": parts.describe_exception(exc)}]


def _meta(ns) -> dict:
    from .summary import machine_info

    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": "python -m streamfx.bench gpu" + (" --device cpu" if ns.device == "cpu" else "")
                       + (" --tiny" if ns.tiny else ""),
            "machine": machine_info(ns.device)}


# ---------------------------------------------------------------- report
COLUMNS = {
    "kernels": [("kernel", "kernel"), ("dtype", "dtype"), ("status", "status"), ("streamed", "streamed"),
                ("grad_error", "grad error vs eager"), ("eager_rounding", "eager vs fp32 math"), ("reason", "note")],
    "memory": [("method", "method"), ("seq", "T"), ("status", "status"), ("allocated", "peak allocated GiB"),
               ("reserved", "peak reserved GiB"), ("seconds", "step s"), ("reason", "note")],
    "max_len": [("method", "method"), ("status", "status"), ("max_len", "longest T that fits"),
                ("first_failure", "first T that does not"), ("compiles", "compiles while probing"),
                ("probes", "probes"), ("reason", "note")],
    "speed": [("method", "method"), ("seq", "T"), ("status", "status"), ("seconds", "median step s"),
              ("first_seconds", "first step s (compile)"), ("reserved", "peak reserved GiB"), ("reason", "note")],
}


def _cell(key, value) -> str:
    if value is None:
        return ""
    if key in ("allocated", "reserved"):
        return f"{value / GiB:.2f}"
    if isinstance(value, float):
        return f"{value:.3g}"
    if key == "probes":
        return " ".join(f"{t}:{r}" for t, r in value)
    return str(value).replace("|", "/").replace("\n", " ")


def markdown(results: dict) -> str:
    m = results["meta"]["machine"]
    lines = [f"# streamfx GPU bench ({results['meta']['date']})", "",
             f"`{results['meta']['command']}` on {m.get('gpu', m.get('cpu'))}: torch {m['torch']}, "
             f"transformers {m['transformers']}, Python {m['python']}; shapes: memory and max_len "
             f"{results['meta']['memory_preset']}, speed {results['meta']['speed_preset']}", ""]
    for name, part in results["parts"].items():
        whole = len(part["rows"]) == 1 and set(part["rows"][0]) <= {"status", "reason"}  # the part failed
        cols = [("status", "status"), ("reason", "note")] if whole else COLUMNS[name]
        lines += [f"## {name} ({part['seconds']} s)", "", part["what"], "",
                  "| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_cell(k, r.get(k)) for k, _ in cols) + " |" for r in part["rows"]]
        lines.append("")
    return "\n".join(lines)


def plot(path: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    rows = results["parts"].get("memory", {}).get("rows", [])
    for method in parts.METHODS:
        pts = [(r["seq"], r["reserved"] / GiB) for r in rows if r.get("method") == method and r.get("status") == "ok"]
        if pts:
            left.plot(*zip(*pts), marker="o", label=method)
    left.set(title=f"BP step peak reserved memory ({results['meta']['memory_preset']}, bf16)", xlabel="tokens",
             ylabel="GiB")
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8) if left.lines else left.text(0.5, 0.5, "no data", ha="center", transform=left.transAxes)
    speed = [r for r in results["parts"].get("speed", {}).get("rows", []) if r.get("status") == "ok"]
    right.bar([r["method"] for r in speed], [r["seconds"] for r in speed])
    right.set(title=f"median step time ({results['meta']['speed_preset']}, bf16)", ylabel="seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: Path, results: dict) -> None:
    (out / "gpu.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "gpu.md").write_text(markdown(results))
    try:
        plot(out / "gpu.png", results)
    except ImportError:  # matplotlib absent: the tables are the result
        pass

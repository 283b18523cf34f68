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
import os
import tempfile
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
    Part("kernels", 75, "per SDPA kernel form (flash, efficient, cuDNN) and dtype (bf16, fp32), small models "
                        "(Hugging Face Qwen3 with grouped K/V heads; a plain causal transformer): streamed or not, "
                        "gradient error against eager with the same kernel"),
    Part("offload", 40, "small model, fp32: layer inputs on the device, offloaded, rebuilt from every 2nd, both: "
                        "gradient error against eager, the step's peak rise and time"),
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
                           streamfx_options={"codegen": "eager"}, compile_backend="aot_eager",
                           offload_seq=64, offload_chunk=16)
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
    p.add_argument("--methods", default=",".join(parts.DEFAULT_METHODS),
                   help=f"comma list of the methods the memory, max_len and speed parts run, of "
                        f"{', '.join(parts.METHODS)} (default: {', '.join(parts.DEFAULT_METHODS)})")
    p.add_argument("--deadline", type=float, default=570.0, help="seconds for the whole command (default 570)")
    p.add_argument("--budget", action="append", default=[], metavar="PART=SECONDS",
                   help="a part's time budget in seconds instead of the plan's (repeatable), e.g. offload=70")
    p.add_argument("--mode", default="default",
                   help="torch.compile's mode for streamfx and checkpointing under torch.compile, e.g. "
                        "max-autotune-no-cudagraphs (default: default; not with --tiny, whose graphs run as FX graphs)")
    p.add_argument("--mem-cap-gb", type=float, default=None,
                   help="memory cap of the longest-length search in GiB (default: the device's memory)")
    return p


def main(argv=None) -> int:
    ns = build_parser().parse_args(argv)
    chosen = [x for x in ns.parts.split(",") if x]
    unknown = set(chosen) - {x.name for x in PLAN}
    if unknown:
        build_parser().error(f"unknown part(s) {sorted(unknown)}; known: {[x.name for x in PLAN]}")
    budgets = {x.name: x.budget_s for x in PLAN}
    for item in ns.budget:
        name, _, secs = item.partition("=")
        try:
            if name not in budgets:
                raise ValueError
            budgets[name] = float(secs)
        except ValueError:
            build_parser().error(f"--budget: PART=SECONDS with PART one of {[x.name for x in PLAN]}, got {item!r}")
    methods = tuple(m for m in ns.methods.split(",") if m)
    if not methods or set(methods) - set(parts.METHODS):
        build_parser().error(f"--methods: a comma list of {', '.join(parts.METHODS)}, got {ns.methods!r}")
    import torch

    if ns.device == "cuda" and not torch.cuda.is_available():
        build_parser().error("--device cuda but torch.cuda.is_available() is False (use --device cpu --tiny)")
    if ns.mode != "default":
        from streamfx import StreamBPError, StreamConfig

        if ns.tiny:
            build_parser().error("--mode sets Inductor's options; --tiny runs its graphs as FX graphs")
        try:
            StreamConfig(mode=ns.mode)
        except StreamBPError as e:
            build_parser().error(f"--mode: {e}")
    start, setup, state = time.monotonic(), dataclasses.replace(setup_for(ns), methods=methods, mode=ns.mode), {}
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"meta": {**_meta(ns), "memory_preset": setup.memory_preset, "speed_preset": setup.speed_preset},
               "parts": {}}
    planner = Planner(setup, out) if "memory" in chosen else None
    for part in (x for x in PLAN if x.name in chosen):
        budget = ns.deadline if ns.tiny else budgets[part.name]  # (tiny: the budgets are an H100's)
        setup.deadline = min(start + ns.deadline, time.monotonic() + budget)
        began = time.monotonic()
        print(f"streamfx bench gpu: {part.name} ({part.what}); budget {budget:.0f} s", flush=True)
        if part.name == "speed":  # (the large model of memory and max_len goes first)
            state.clear()
            parts._free(setup.device)
        rows = _run(part.name, setup, state)
        results["parts"][part.name] = {"what": part.what, "seconds": round(time.monotonic() - began, 1), "rows": rows}
        if planner is not None:
            planner.merge(results)
        write(out, results)
    if planner is not None:
        planner.merge(results, wait=max(0.0, start + ns.deadline - time.monotonic()))
        write(out, results)
    print((out / "gpu.md").read_text(), flush=True)
    return 0


class Planner:
    """The memory planner's predictions for the memory part's model (``streamfx.bench.gpu_plan``),
    computed in a CPU process of its own while the GPU parts run, then set beside the measured
    step peaks and longest lengths as the part "plan"."""

    WHAT = ("the memory planner (traced on the meta device, before any step) against the measurements: "
            "the step's peak rise of allocated memory over the memory held before it, and the longest T")

    def __init__(self, setup: parts.Setup, out: Path):
        import subprocess
        import sys

        import torch

        if setup.device == "cuda":
            self.budget = torch.cuda.mem_get_info()[0]  # what the run-time policy sees: free + allocated (none yet)
        else:
            self.budget = setup.mem_cap_bytes
        self.path, self.result = out / "plan.json", None
        self.path.unlink(missing_ok=True)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=os.environ.get("STREAMFX_PLAN_THREADS", "4"))
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamfx.bench.gpu_plan", "--preset", setup.memory_preset, "--dtype", "bfloat16",
             "--budget", str(self.budget), "--seqs", ",".join(map(str, setup.memory_seqs)),
             "--device", setup.device, "--out", str(self.path)], env=env, stdout=self.log, stderr=self.log)

    def merge(self, results: dict, wait: float = 0.0) -> None:
        import subprocess

        if self.result is None:
            try:
                code = self.proc.wait(timeout=wait) if wait else self.proc.poll()
            except subprocess.TimeoutExpired:
                code = None
            if code is None:
                if wait:
                    self.proc.kill()
                    results["parts"]["plan"] = {"what": self.WHAT, "seconds": None, "rows": [
                        {"status": "error", "reason": "the planner did not finish before the deadline"}]}
                return
            if code != 0:
                self.log.seek(0)
                tail = self.log.read().decode(errors="replace").strip().splitlines()[-3:]
                self.result = {"error": f"planner exited with {code}: " + " / ".join(tail)}
            else:
                self.result = json.loads(self.path.read_text())
        results["parts"]["plan"] = {"what": self.WHAT, "seconds": self.result.get("seconds"),
                                    "rows": plan_rows(self.result, results)}


def plan_rows(plan: dict, results: dict) -> list[dict]:
    """Predicted against measured: the step peak rise per method and length, the longest length."""
    if "error" in plan:
        return [{"status": "error", "reason": plan["error"]}]
    measured = {(r.get("method"), r.get("seq")): r for r in results["parts"].get("memory", {}).get("rows", [])}
    rows = []
    for p in plan["steps"]:
        m = measured.get((p["method"], p["seq"]), {})
        rise = m["allocated"] - m["before"] if m.get("status") == "ok" and m.get("before") is not None else None
        row = {"quantity": "step peak rise GiB", "method": p["method"], "seq": p["seq"],
               "chunks": " ".join(map(str, p.get("chunks", []))) or None,
               "predicted": p["predicted"] / GiB if p.get("predicted") is not None else None,
               "measured": rise / GiB if rise is not None else None, "reason": p.get("reason")}
        if rise is None and m.get("status") == "ok":  # (CPU: only the process's high-water mark, no rise)
            row["reason"] = "no allocated memory measured on this device"
        if row["predicted"] and row["measured"]:
            row["ratio"] = row["predicted"] / row["measured"]
        rows.append(row)
    longest = {r.get("method"): r for r in results["parts"].get("max_len", {}).get("rows", [])}
    for method, predicted in plan["longest"].items():
        m = longest.get(method, {})
        row = {"quantity": "longest T", "method": method, "predicted": predicted,
               "measured": m.get("max_len"), "reason": m.get("reason")}
        if m.get("first_failure"):
            row["reason"] = f"bisection bracket {m.get('max_len')}-{m['first_failure']}"
        if predicted and row["measured"]:
            row["ratio"] = predicted / row["measured"]
        rows.append(row)
    rows.append({"quantity": "budget GiB", "predicted": plan["budget"] / GiB,
                 "reason": f"held before the step (predicted): {plan['held'] / GiB:.2f} GiB"})
    return rows


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
                       + (" --tiny" if ns.tiny else "") + (f" --mode {ns.mode}" if ns.mode != "default" else ""),
            "machine": machine_info(ns.device)}


# ---------------------------------------------------------------- report
# chunk graphs compiled again for a call whose sizes broke a shape guard of their compiles: "+N"
COMPILED = "graphs compiled (Dynamo+chunk[+at new sizes])"
COLUMNS = {
    "kernels": [("model", "model"), ("kernel", "kernel"), ("dtype", "dtype"), ("status", "status"), ("streamed", "streamed"),
                ("grad_error", "grad error vs eager"), ("eager_rounding", "eager vs fp32 math"), ("reason", "note")],
    "offload": [("variant", "layer inputs"), ("seq", "T"), ("status", "status"), ("streamed", "streamed"),
                ("grad_error", "grad error vs eager"), ("rise", "peak rise GiB"), ("seconds", "step s"),
                ("moved", "inputs offloaded / dropped / rebuilt / loaded"), ("reason", "note")],
    "memory": [("method", "method"), ("seq", "T"), ("status", "status"), ("allocated", "peak allocated GiB"),
               ("before", "allocated before GiB"), ("reserved", "peak reserved GiB"), ("seconds", "step s"),
               ("first_seconds", "first step s (compile)"), ("compiled", COMPILED), ("chunks", "chunk calls / region calls"),
               ("vjp", "backward chunk graphs compiled / fallen back (first step)"), ("reason", "note")],
    "plan": [("quantity", "quantity"), ("method", "method"), ("seq", "T"), ("chunks", "chunks (layer head)"),
             ("predicted", "predicted"), ("measured", "measured"), ("ratio", "predicted / measured"),
             ("reason", "note")],
    "max_len": [("method", "method"), ("status", "status"), ("max_len", "longest T that fits"),
                ("first_failure", "first T that does not"), ("compiles", "compiled while probing (Dynamo+chunk[+at new sizes])"),
                ("probes", "probes"), ("reason", "note")],
    "speed": [("method", "method"), ("seq", "T"), ("status", "status"), ("seconds", "median step s"),
              ("first_seconds", "first step s (compile)"), ("reserved", "peak reserved GiB"),
              ("compiled", COMPILED), ("chunks", "chunk calls / region calls"),
              ("vjp", "backward chunk graphs compiled / fallen back (first step)"), ("reason", "note")],
}


def _cell(key, value) -> str:
    if value is None:
        return ""
    if key == "moved" and isinstance(value, dict):
        return " / ".join(str(value.get(k, 0)) for k in ("inputs_offloaded", "inputs_dropped", "inputs_rebuilt",
                                                          "inputs_loaded"))
    if key in ("allocated", "reserved", "before", "rise"):
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

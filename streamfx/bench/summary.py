"""From raw runs to per-method rows, and the machine description of the report header.

Contract:
  * :func:`summarise` groups the raw runs of one preset by method and returns one row dict per
    method (in the order the methods were asked for) with ``peak_delta`` / ``peak`` / ``time``
    maps seq -> value (None when that run did not succeed), ``bytes_per_token`` (least-squares
    slope of the step's peak memory over the lengths that succeeded; None with fewer than two),
    ``mem_vs_ckpt`` (slope / ckpt's slope), ``time_vs_ckpt`` (median step time / ckpt's at the
    longest length both ran), ``loss_rel_err`` / ``grad_rel_err`` (worst over lengths) and
    ``status`` ("ok" or the reasons, with streamfx's warnings as notes).
  * :func:`machine_info` describes the host (CPU model, cores, RAM, GPU) and the library versions.
"""
from __future__ import annotations

import os
import platform
import sys


def least_squares_slope(points: list[tuple[float, float]]) -> float | None:
    """Slope of the least-squares line through ``points`` (None with fewer than two distinct x)."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    n = len(points)
    mx, my = sum(xs) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return sxy / sxx


def _worst(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    if any(v != v for v in values):
        return float("nan")
    return max(values)


def _status(runs: list[dict]) -> str:
    failed = [r for r in runs if r.get("status") != "ok"]
    notes = []
    for r in runs:
        for n in r.get("notes") or []:
            if n not in notes:
                notes.append(n)
    if not failed:
        text = "ok"
    else:
        reasons = {}
        for r in failed:
            reasons.setdefault(r.get("reason") or r.get("status"), []).append(r["seq"])
        if len(failed) == len(runs) and len(reasons) == 1:
            text = next(iter(reasons))
        else:
            text = "; ".join(f"T={','.join(map(str, seqs))}: {why}" for why, seqs in reasons.items())
    if notes:
        text += " (note: " + " | ".join(notes) + ")"
    return text


def summarise(runs: list[dict], preset: str, methods: list[str], seqs: list[int]) -> list[dict]:
    rows = []
    for method in methods:
        mine = [r for r in runs if r.get("preset") == preset and r.get("method") == method]
        ok = {r["seq"]: r for r in mine if r.get("status") == "ok"}
        row = {
            "method": method,
            "peak_delta": {s: ok[s]["peak_delta_bytes"] if s in ok else None for s in seqs},
            "peak": {s: ok[s]["peak_bytes"] if s in ok else None for s in seqs},
            "time": {s: ok[s].get("median_time_s") if s in ok else None for s in seqs},
            "bytes_per_token": least_squares_slope([(s, ok[s]["peak_delta_bytes"]) for s in ok]),
            "loss_rel_err": _worst(ok[s].get("loss_rel_err") for s in ok),
            "grad_rel_err": _worst(ok[s].get("grad_rel_err") for s in ok),
            "status": _status(mine) if mine else "not run",
            "ok": bool(ok),
        }
        rows.append(row)
    ckpt = next((r for r in rows if r["method"] == "ckpt"), None)
    for row in rows:
        row["mem_vs_ckpt"] = row["time_vs_ckpt"] = None
        row["time_vs_ckpt_seq"] = None
        if ckpt is None:
            continue
        if row["bytes_per_token"] is not None and ckpt["bytes_per_token"]:
            row["mem_vs_ckpt"] = row["bytes_per_token"] / ckpt["bytes_per_token"]
        common = [s for s in seqs if row["time"].get(s) and ckpt["time"].get(s)]
        if common:
            s = max(common)
            row["time_vs_ckpt"] = row["time"][s] / ckpt["time"][s]
            row["time_vs_ckpt_seq"] = s
    return rows


# ---------------------------------------------------------------- machine

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def machine_info(device: str) -> dict:
    import torch

    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:
        tf_version = "not installed"
    info = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_bytes": _ram_bytes(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": tf_version,
        "platform": platform.platform(),
        "device": device,
    }
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_memory_bytes"] = props.total_memory
        info["cuda"] = torch.version.cuda
    return info

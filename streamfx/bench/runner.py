"""Runs the measurements, each in its own worker process, and the GPU maximum-length search.

Contract:
  * :func:`run_measurements` returns one raw-run dict per (preset, sequence length, method), in
    that order, with eager first at every length so that the other workers can compare their loss
    and gradients against it.  A method that does not apply becomes a run with status "skipped"
    and the reason; a worker that times out, dies or raises becomes a run with status "timeout",
    "crashed", "error" or "oom" and the reason.  Nothing a method does stops the benchmark.
  * :func:`run_max_len` (CUDA only) finds, per method, the longest sequence whose BP step fits
    under a memory cap: doubling from ``max_len_start`` until a probe fails, then bisection down to
    the larger of ``max_len_step`` tokens and 1/16 of the length.  Every probe is a fresh worker
    and any failure (OOM, error, timeout) counts as "does not fit".
  * One progress line is printed per worker.
  * Worker output (stdout and stderr) is kept in ``OUT/logs/``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import methods as methods_mod
from .presets import get_preset

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


@dataclasses.dataclass
class BenchConfig:
    """Everything the runner needs; built by :mod:`streamfx.bench.cli`."""

    presets: list[str]
    methods: list[str]
    out_dir: Path
    device: str = "cpu"
    dtype: str | None = None            # None: each preset's default dtype
    seqs: list[int] | None = None       # None: each preset's default lengths
    repeats: int = 3
    timeout: float = 900.0
    seed: int = 0
    grad_sample: int = 1 << 18
    streambp_options: dict = dataclasses.field(default_factory=dict)
    loss: str = "model"                 # methods_mod.LOSSES
    reference_options: dict = dataclasses.field(default_factory=dict)
    reference_python: str | None = None
    reference_error: str | None = None
    max_len: bool = False
    max_len_methods: tuple[str, ...] = ("ckpt", "streambp")
    mem_cap_gb: float | None = None
    max_len_start: int = 4096
    max_len_step: int = 512
    max_len_probes: int = 16

    def dtype_of(self, preset: str) -> str:
        return self.dtype or get_preset(preset).dtype

    def seqs_of(self, preset: str) -> list[int]:
        return list(self.seqs or get_preset(preset).seqs)


def _log(msg: str) -> None:
    print(msg, flush=True)


def worker_env(cfg: BenchConfig, method: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(methods_mod.worker_env(method))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_worker(cfg: BenchConfig, args: dict, log_name: str) -> dict:
    """Run one worker; always returns a result dict (with ``wall_s``), whatever happens to it."""
    method = args["method"]
    python = cfg.reference_python if methods_mod.METHODS[method].reference else sys.executable
    logs = cfg.out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    fd, result_path = tempfile.mkstemp(prefix="run-", suffix=".json", dir=logs)
    os.close(fd)
    args = dict(args, result_path=result_path)
    cmd = [python, "-m", "streamfx.bench.worker", "--json-args", json.dumps(args)]
    log_path = logs / f"{log_name}.log"
    t0 = time.perf_counter()
    status = None
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd[:4]) + " '" + cmd[4] + "'\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=worker_env(cfg, method),
                                cwd=str(cfg.out_dir), start_new_session=True)
        try:
            rc = proc.wait(timeout=cfg.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, status = None, "timeout"
    wall = time.perf_counter() - t0
    base = {k: args.get(k) for k in ("mode", "preset", "method", "seq", "dtype", "device")}
    base["log"] = str(log_path.relative_to(cfg.out_dir))
    try:
        text = Path(result_path).read_text()
    finally:
        os.unlink(result_path)
    if status == "timeout":
        return dict(base, status="timeout", reason=f"timeout (> {cfg.timeout:g} s)", wall_s=wall)
    if not text.strip():
        why = f"worker died with exit code {rc}"
        if rc is not None and rc < 0:
            why += f" ({signal.Signals(-rc).name})" if -rc in signal.valid_signals() else ""
        tail = _last_line(log_path)
        return dict(base, status="crashed", reason=why + (f": {tail}" if tail else ""), wall_s=wall)
    result = json.loads(text)
    return dict(base, **result, wall_s=wall)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def describe_run(run: dict) -> str:
    """The progress-line summary of a run."""
    if run.get("status") != "ok":
        return f"{run.get('status', '?').upper()}: {run.get('reason', '')}"
    parts = [f"peak +{run['peak_delta_bytes'] / MiB:8.1f} MiB (abs {run['peak_bytes'] / MiB:.0f} MiB)"]
    if run.get("median_time_s") is not None:
        parts.append(f"step {run['median_time_s']:.3f} s (warm-up {run.get('warmup_time_s', 0):.1f} s)")
    if run.get("loss_rel_err") is not None and run.get("method") != "eager":
        parts.append(f"loss err {run['loss_rel_err']:.1e} grad err {run['grad_rel_err']:.1e}")
    if run.get("notes"):
        parts.append(f"note: {run['notes'][0][:80]}")
    return "  ".join(parts)


def _ordered(methods: list[str]) -> list[str]:
    return (["eager"] if "eager" in methods else []) + [m for m in methods if m != "eager"]


def run_measurements(cfg: BenchConfig) -> list[dict]:
    jobs = [(p, s, m) for p in cfg.presets for s in cfg.seqs_of(p) for m in _ordered(cfg.methods)]
    runs, width = [], len(str(len(jobs)))
    for i, (preset, seq, method) in enumerate(jobs, 1):
        dtype = cfg.dtype_of(preset)
        ref_path = cfg.out_dir / "ref" / f"{preset}-{dtype}-{cfg.device}-T{seq}-seed{cfg.seed}.pt"
        head = f"[{i:>{width}}/{len(jobs)}] {preset:<12} {method:<15} T={seq:<6}"
        base = {"mode": "measure", "preset": preset, "method": method, "seq": seq, "dtype": dtype,
                "device": cfg.device}
        why = methods_mod.not_applicable(method, cfg.device, cfg.reference_python, cfg.reference_error)
        if why is not None:
            run = dict(base, status="skipped", reason=why)
        else:
            _log(f"{head} running ...")
            if method == "eager" and ref_path.exists():
                ref_path.unlink()
            args = dict(base, seed=cfg.seed, repeats=cfg.repeats, grad_sample=cfg.grad_sample, loss=cfg.loss,
                        ref_path=str(ref_path) if "eager" in cfg.methods else None,
                        streambp_options=cfg.streambp_options, reference_options=cfg.reference_options)
            run = run_worker(cfg, args, f"{preset}-{method}-T{seq}")
        runs.append(run)
        _log(f"{head} {describe_run(run)}")
        if i == len(jobs) or jobs[i][:2] != (preset, seq):
            ref_path.unlink(missing_ok=True)  # the eager gradients of this length are no longer needed
    try:
        (cfg.out_dir / "ref").rmdir()
    except OSError:
        pass
    return runs


# ---------------------------------------------------------------- maximum length (CUDA)

def run_max_len(cfg: BenchConfig) -> list[dict]:
    """Per (preset, method): the longest fitting sequence, with every probe recorded."""
    out = []
    for preset in cfg.presets:
        for method in cfg.max_len_methods:
            base = {"preset": preset, "method": method, "dtype": cfg.dtype_of(preset), "device": cfg.device}
            why = "needs CUDA" if cfg.device != "cuda" else methods_mod.not_applicable(
                method, cfg.device, cfg.reference_python, cfg.reference_error)
            if why:
                out.append(dict(base, status="skipped", reason=why, max_len=None, probes=[]))
                _log(f"[max-len] {preset:<12} {method:<15} SKIPPED: {why}")
                continue
            out.append(dict(base, **_bisect(cfg, preset, method)))
    return out


def _bisect(cfg: BenchConfig, preset: str, method: str) -> dict:
    step = cfg.max_len_step
    cap = int(cfg.mem_cap_gb * (1 << 30)) if cfg.mem_cap_gb else None
    probes: list[dict] = []
    last_reason = ""

    def fits(seq: int) -> bool:
        nonlocal last_reason
        args = {"mode": "probe", "preset": preset, "method": method, "seq": seq,
                "dtype": cfg.dtype_of(preset), "device": cfg.device, "seed": cfg.seed,
                "mem_cap_bytes": cap, "streambp_options": cfg.streambp_options, "loss": cfg.loss,
                "reference_options": cfg.reference_options}
        run = run_worker(cfg, args, f"maxlen-{preset}-{method}-T{seq}")
        ok = run.get("status") == "ok"
        if not ok:
            last_reason = run.get("reason", "")
        probes.append({"seq": seq, "ok": ok, "status": run.get("status"), "reason": run.get("reason", ""),
                       "peak_bytes": run.get("peak_bytes")})
        _log(f"[max-len] {preset:<12} {method:<15} T={seq:<7} {'fits' if ok else describe_run(run)}")
        return ok

    lo, hi, seq = 0, None, max(step, cfg.max_len_start // step * step)
    while len(probes) < cfg.max_len_probes and hi is None:
        if fits(seq):
            lo, seq = seq, seq * 2
        else:
            hi = seq
    while hi is not None and hi - lo > max(step, lo // 16) and len(probes) < cfg.max_len_probes:
        mid = max(step, (lo + hi) // 2 // step * step)
        if mid in (lo, hi):
            break
        if fits(mid):
            lo = mid
        else:
            hi = mid
    status = "ok" if lo > 0 else "failed"
    return {"status": status, "max_len": lo or None, "first_failure": hi, "cap_bytes": cap,
            "reason": "" if lo else last_reason, "probes": probes}

"""Command line of ``python -m streamfx.bench``.

Contract: :func:`main` parses the flags (see ``--help``), runs every measurement in its own worker
process (:mod:`streamfx.bench.runner`), writes results.md / results.json / results.csv /
memory.png into ``--out`` (:mod:`streamfx.bench.report`) and returns 0.  A method that fails or
does not apply is a row with the reason; only bad flags make it return non-zero.
``python -m streamfx.bench gpu ...`` is the GPU headline command (:mod:`streamfx.bench.gpu`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

from . import methods as methods_mod
from .presets import DTYPE_BYTES, PRESETS, get_preset

QUICK_MODELS = ["qwen3-head"]
QUICK_SEQS = [256, 512]
QUICK_REPEATS = 2


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return sorted(set(values))


def _json_obj(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m streamfx.bench",
        description="Peak memory, bytes/token, step time and exactness of one BP step of a Qwen3-shaped "
                    "causal LM: streambp against eager, gradient checkpointing and torch.compile variants.")
    p.add_argument("--quick", action="store_true",
                   help=f"a short CPU run (5-10 minutes on 2 cores, most of it compiling): models {','.join(QUICK_MODELS)}, "
                        f"seq {','.join(map(str, QUICK_SEQS))}, repeats {QUICK_REPEATS} (explicit flags win)")
    p.add_argument("--out", default="bench-out", help="output directory (default: bench-out)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda when available, else cpu")
    p.add_argument("--model", action="append", default=None, metavar="PRESET[,PRESET]",
                   help=f"model preset(s), comma list or repeated; known: {', '.join(PRESETS)} "
                        "(default: qwen3-head,qwen3-layers on CPU, qwen3-0.6b on CUDA)")
    p.add_argument("--seq", type=_int_list, default=None, help="comma list of sequence lengths "
                   "(default: each preset's own)")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default=None,
                   help="default: each preset's own (float32 for CPU presets, bfloat16 for GPU presets)")
    p.add_argument("--methods", default=",".join(methods_mod.DEFAULT_METHODS),
                   help=f"comma list of methods; known: {', '.join(methods_mod.METHODS)}")
    p.add_argument("--repeats", type=int, default=None, help="timed steps per measurement (default 3; --quick 2)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per measurement before it counts as failed (default 1800; --quick 600)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the batch")
    p.add_argument("--grad-sample", type=int, default=1 << 18,
                   help="gradient elements per parameter compared with eager (strided sample above this)")
    p.add_argument("--loss", choices=list(methods_mod.LOSSES), default="model",
                   help="model: the model's own loss from labels (default); shifted: "
                        "cross_entropy(logits[:, :-1], labels[:, 1:]) computed on the returned logits")
    p.add_argument("--streambp-options", type=_json_obj, default={},
                   help='JSON options for the streambp rows, e.g. \'{"chunk_size": 256}\'')
    p.add_argument("--reference-venv", nargs="?", const="", default=None, metavar="DIR",
                   help="build (or reuse) a venv with the reference streambp package and transformers 4.51.3 "
                        "and run the reference row in it (default DIR: OUT/reference-venv)")
    p.add_argument("--reference-options", type=_json_obj, default={},
                   help="JSON keyword arguments for the reference StreamModel")
    p.add_argument("--max-len", action="store_true",
                   help="CUDA only: bisect the longest sequence that fits for ckpt and streambp")
    p.add_argument("--mem-cap-gb", type=float, default=None,
                   help="memory cap of --max-len in GiB (default: the device's memory)")
    p.add_argument("--max-len-start", type=int, default=4096, help="first length --max-len probes")
    p.add_argument("--max-len-step", type=int, default=512, help="resolution of --max-len in tokens")
    return p


def _models(values: list[str] | None, quick: bool, device: str) -> list[str]:
    if not values:
        if quick:
            return list(QUICK_MODELS)
        return ["qwen3-head", "qwen3-layers"] if device == "cpu" else ["qwen3-0.6b"]
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    for n in names:
        get_preset(n)
    return list(dict.fromkeys(names))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["gpu"]:  # the headline measurements in one command (streamfx.bench.gpu)
        from .gpu import main as gpu_main

        return gpu_main(args[1:])
    parser = build_parser()
    ns = parser.parse_args(argv)
    import torch

    from . import report, runner, summary
    from .reference import ensure_venv

    device = ns.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch.cuda.is_available() is False")
    try:
        models = _models(ns.model, ns.quick, device)
        methods = methods_mod.parse_methods(ns.methods)
    except ValueError as exc:
        parser.error(str(exc))
    out_dir = Path(ns.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)

    cfg = runner.BenchConfig(
        presets=models, methods=methods, out_dir=out_dir, device=device, dtype=ns.dtype,
        seqs=ns.seq or (QUICK_SEQS if ns.quick else None),
        repeats=ns.repeats if ns.repeats is not None else (QUICK_REPEATS if ns.quick else 3),
        timeout=ns.timeout if ns.timeout is not None else (600.0 if ns.quick else 1800.0),
        seed=ns.seed, grad_sample=ns.grad_sample, streambp_options=ns.streambp_options, loss=ns.loss,
        reference_options=ns.reference_options, max_len=ns.max_len, mem_cap_gb=ns.mem_cap_gb,
        max_len_start=ns.max_len_start, max_len_step=ns.max_len_step)
    if "reference" in methods and ns.reference_venv is not None:
        venv = Path(ns.reference_venv) if ns.reference_venv else out_dir / "reference-venv"
        cfg.reference_python, cfg.reference_error = ensure_venv(venv)

    print(f"streamfx bench: device {device}, presets {', '.join(models)}, methods {', '.join(methods)}, "
          f"output {out_dir}", flush=True)
    runs = runner.run_measurements(cfg)
    max_len = runner.run_max_len(cfg) if ns.max_len else []

    summaries = {}
    for preset in models:
        seqs = cfg.seqs_of(preset)
        params = next((r.get("params") for r in runs if r.get("preset") == preset and r.get("params")), None)
        summaries[preset] = {"seqs": seqs, "dtype": cfg.dtype_of(preset), "params": params,
                             "rows": summary.summarise(runs, preset, methods, seqs)}
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": "python -m streamfx.bench " + shlex.join(sys.argv[1:] if argv is None else argv),
            "machine": summary.machine_info(device)}
    config = {"presets": models, "methods": methods, "device": device, "repeats": cfg.repeats,
              "timeout": cfg.timeout, "seed": cfg.seed, "seqs": {p: cfg.seqs_of(p) for p in models},
              "dtypes": {p: cfg.dtype_of(p) for p in models}, "streambp_options": cfg.streambp_options,
              "reference_options": cfg.reference_options, "max_len": ns.max_len, "mem_cap_gb": ns.mem_cap_gb,
              "grad_sample": cfg.grad_sample, "loss": cfg.loss}
    paths = report.write_all(out_dir, meta, config, summaries, runs, max_len)
    print()
    print(paths["results.md"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()), flush=True)
    return 0

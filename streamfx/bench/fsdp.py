"""Peak memory per rank of one FSDP2 training step: ``python -m streamfx.bench.fsdp``.

Every method runs on its own ``--ranks`` processes (gloo on CPU, NCCL with ``--device cuda``):
each rank builds the preset's model with the same name-seeded weights (:mod:`.presets`), applies
FSDP2's standard recipe (``fully_shard`` per decoder layer, then the root), prepares the method
(:func:`.methods.prepare`: ``eager``, ``ckpt`` = HF gradient checkpointing, ``streambp``: the whole
model compiled with the streambp backend), runs ``--warmup`` steps (compiles; FSDP2's first step
also initialises its state) and then one measured step on its own batch (``make_batch`` with the rank as the seed). Measured per rank, with the
protocol of :mod:`.worker` (fixed malloc thresholds on CPU): the peak RSS of the step
(``VmHWM`` after ``clear_refs``; the CUDA allocator peak on GPUs), the RSS before it, the step
time, the regions that ran streamed, the compiles during the measured step (Dynamo graphs and
chunk graphs: 0 when the warm-up covered them), and the largest relative error of the rank's gradient shards against the eager method's.

Prints a markdown table and writes ``fsdp.json`` into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from . import methods as methods_mod
from . import presets as presets_mod
from .worker import MemoryMeter, fix_malloc_thresholds

METHODS = ("eager", "ckpt", "streambp")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, args: dict, out_dir: str) -> None:
    fix_malloc_thresholds()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    device = args["device"]
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)
    result = {"rank": rank, "method": args["method"]}
    try:
        preset = presets_mod.get_preset(args["preset"])
        model = presets_mod.build_model(preset, args["dtype"], device, seed=0, max_seq=args["seq"])
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        step = methods_mod.prepare(args["method"], model, device, streambp_options=args["streambp_options"])
        ids, labels = presets_mod.make_batch(preset, args["seq"], device, seed=rank)
        from torch._dynamo.utils import counters

        from streamfx.chunks import COUNTERS

        start = time.perf_counter()
        for _ in range(args["warmup"]):
            step(ids, labels)
            model.zero_grad(set_to_none=True)
        result["warmup_time_s"] = time.perf_counter() - start
        before = dict(COUNTERS)
        graphs = counters["stats"]["unique_graphs"]
        with MemoryMeter(device) as meter:
            start = time.perf_counter()
            loss = step(ids, labels)
            if device == "cuda":
                torch.cuda.synchronize()
            result["time_s"] = time.perf_counter() - start
        result.update(peak_bytes=meter.peak_bytes, pre_bytes=meter.pre_bytes, loss=float(loss),
                      streamed_regions=COUNTERS["region_backward"] - before["region_backward"],
                      compiles=counters["stats"]["unique_graphs"] - graphs + COUNTERS["chunk_compiles"]
                      - before["chunk_compiles"])
        grads = {n: p.grad.to_local().detach().float().cpu() for n, p in model.named_parameters()
                 if p.grad is not None}
        torch.save(grads, os.path.join(out_dir, f"grads-{args['method']}-{rank}.pt"))
        result["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - reported in the table
        result.update(status="error", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    with open(os.path.join(out_dir, f"result-{args['method']}-{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def _grad_error(out_dir: str, method: str, rank: int) -> float | None:
    import torch

    try:
        ref = torch.load(os.path.join(out_dir, f"grads-eager-{rank}.pt"))
        got = torch.load(os.path.join(out_dir, f"grads-{method}-{rank}.pt"))
    except FileNotFoundError:
        return None
    worst = 0.0
    for name, g in ref.items():
        h = got.get(name)
        if h is None or h.shape != g.shape:
            return float("inf")
        scale = g.abs().max().item()
        worst = max(worst, (h - g).abs().max().item() / (scale or 1.0))
    return worst


def run(preset: str, seq: int, methods, ranks: int, device: str, dtype: str, out_dir: str,
        streambp_options: dict | None = None, warmup: int = 2) -> list[dict]:
    import torch.multiprocessing as mp

    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for method in methods:
        args = dict(preset=preset, seq=seq, method=method, device=device, dtype=dtype,
                    streambp_options=streambp_options or {}, warmup=warmup)
        mp.start_processes(_rank, args=(ranks, _free_port(), args, out_dir), nprocs=ranks, start_method="spawn")
        for rank in range(ranks):
            with open(os.path.join(out_dir, f"result-{method}-{rank}.json")) as f:
                row = json.load(f)
            row["grad_rel_err"] = _grad_error(out_dir, method, rank) if method != "eager" else 0.0
            rows.append(row)
    return rows


def table(rows: list[dict], preset: str, seq: int) -> str:
    mib = 2 ** 20
    eager = {r["rank"]: r for r in rows if r["method"] == "eager" and r.get("status") == "ok"}
    lines = [f"FSDP2 per decoder layer + root, preset {preset}, T={seq}, one row per rank per method", "",
             "| method | rank | peak RSS (MiB) | step (MiB, peak - before) | vs eager step | step time (s) "
             "| streamed regions | compiles in step | grad rel. err |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['method']} | {r['rank']} | {r.get('reason', r.get('status'))} | | | | | | |")
            continue
        delta = r["peak_bytes"] - r["pre_bytes"]
        e = eager.get(r["rank"])
        ratio = f"{delta / (e['peak_bytes'] - e['pre_bytes']):.2f}x" if e else ""
        err = r.get("grad_rel_err")
        lines.append(f"| {r['method']} | {r['rank']} | {r['peak_bytes'] / mib:.0f} | {delta / mib:.0f} | {ratio} "
                     f"| {r['time_s']:.2f} | {r['streamed_regions']} | {r['compiles']} | {'' if err is None else f'{err:.1e}'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen3-layers")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"])
    p.add_argument("--chunk-size", type=int, default=None, help="streambp's layer chunk size (default: automatic)")
    p.add_argument("--warmup", type=int, default=2, help="steps before the measured one")
    p.add_argument("--out", default="bench-fsdp")
    a = p.parse_args(argv)
    methods = methods_mod.parse_methods(a.methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        p.error(f"unknown method(s) {unknown}; allowed: {list(METHODS)}")
    if "eager" in methods:   # the reference of the gradient comparison runs first
        methods = ["eager"] + [m for m in methods if m != "eager"]
    dtype = a.dtype or presets_mod.get_preset(a.preset).dtype
    options = {} if a.chunk_size is None else {"chunk_size": a.chunk_size}
    rows = run(a.preset, a.seq, methods, a.ranks, a.device, dtype, a.out, options, a.warmup)
    text = table(rows, a.preset, a.seq)
    with open(os.path.join(a.out, "fsdp.json"), "w") as f:
        json.dump({"preset": a.preset, "seq": a.seq, "ranks": a.ranks, "device": a.device, "dtype": dtype,
                   "rows": rows}, f, indent=1)
    print(text)
    return 0 if all(r.get("status") == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

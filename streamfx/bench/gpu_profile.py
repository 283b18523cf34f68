"""``python -m streamfx.bench.gpu_profile``: where one training step's time goes, per method, on a
preset's shape cut to a few layers (a Qwen3-8B layer at a fraction of its compile time).

For each method and length: the first step (the compile) and its seconds, one measured step
(``gpu_parts.measured_step``: seconds, peaks, graphs compiled, chunked region calls), then the same
step under ``cProfile`` (Python's view: the functions the step's wall time is spent in, waits on
the device included) and under ``torch.profiler`` (the ops by their own device and CPU time, then
split by their inputs' shapes: which copies and which products the time goes to). It
writes ``OUT/profile.md`` after every step, so a command stopped from outside keeps what it
measured. ``--device cpu --preset tiny`` runs the same code on CPU.
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
from pathlib import Path

from . import gpu_parts as parts
from . import presets as presets_mod


def _profile_tables(step, ids, labels, device: str, rows: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts, record_shapes=True) as prof:
        step(ids, labels)
        parts._sync(device)
    out = []
    keys = (["self_cuda_time_total"] if device == "cuda" else []) + ["self_cpu_time_total", "cpu_time_total"]
    # the last view: the ops split by their inputs' shapes (which copies, which products), by the
    # time the device (or, on a CPU, the op itself) spends in them
    views = [(key, False) for key in keys] + [(keys[0], True)]
    for key, by_shape in views:
        try:
            avg = prof.key_averages(group_by_input_shape=by_shape)
            table = avg.table(sort_by=key, row_limit=rows, max_name_column_width=70,
                              max_shapes_column_width=90)
        except Exception as exc:  # noqa: BLE001 - a sort key this torch names otherwise
            table = f"({type(exc).__name__}: {exc})"
        out.append(f"by {key}{', per input shapes' if by_shape else ''}:\n\n```\n{table}\n```\n")
    return "\n".join(out)


def _python_profile(step, ids, labels, device: str, rows: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    step(ids, labels)
    parts._sync(device)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(rows)
    text = buf.getvalue()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(rows)
    return f"cumulative:\n\n```\n{text}\n```\n\nown time:\n\n```\n{buf.getvalue()}\n```\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamfx.bench.gpu_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--layers", type=int, default=4, help="layers kept of the preset (default 4)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--seqs", default="4096", help="comma list of lengths")
    p.add_argument("--methods", default="streamfx,ckpt")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--rows", type=int, default=25, help="rows of each profile table")
    p.add_argument("--no-profile", action="store_true", help="step times only")
    p.add_argument("--out", default="bench-out/profile")
    ns = p.parse_args(argv)
    methods = [m for m in ns.methods.split(",") if m]
    if set(methods) - set(parts.METHODS):
        p.error(f"--methods: a comma list of {', '.join(parts.METHODS)}")
    seqs = [int(x) for x in ns.seqs.split(",") if x]
    import torch

    preset = dataclasses.replace(presets_mod.get_preset(ns.preset), num_hidden_layers=ns.layers)
    cpu = ns.device == "cpu"
    setup = parts.Setup(device=ns.device, kernel_preset=ns.preset, kernel_seq=0, memory_preset=ns.preset,
                        memory_seqs=tuple(seqs), speed_preset=ns.preset, speed_seq=0, speed_repeats=1,
                        max_len_step=0, max_len_limit=0, mem_cap_bytes=None,
                        streamfx_options={"codegen": "eager"} if cpu and ns.preset == "tiny" else {},
                        compile_backend="inductor")
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    model = presets_mod.build_model(preset, ns.dtype, ns.device, seed=0, max_seq=max(seqs))
    models = parts.per_method(model)
    head = (f"# where a step's time goes: {ns.preset} cut to {ns.layers} layers, {ns.dtype}, {ns.device} "
            f"({torch.cuda.get_device_name() if ns.device == 'cuda' else 'cpu'}), torch {torch.__version__}\n\n")
    table = ["| method | T | first step s | step s | compiled | chunks | peak allocated GiB | before GiB | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    details: list[str] = []

    def write():
        (out / "profile.md").write_text(head + "\n".join(table) + "\n\n" + "\n".join(details))

    steps = {m: parts.stepper(m, models[m], setup) for m in methods}   # (each compiles once, dynamic)
    for seq in seqs:
        ids, labels = presets_mod.make_batch(preset, seq, ns.device)
        for method, step in steps.items():
            f = parts.measured_step(step, preset, seq, setup)   # (the compile)
            first = f"{f['seconds']:.2f}" if f["status"] == "ok" else f"{f['status']}: {f.get('reason', '')[:200]}"
            r = parts.measured_step(step, preset, seq, setup)
            gib = lambda k: f"{r[k] / 2**30:.2f}" if r.get(k) is not None else ""  # noqa: E731
            table.append(f"| {method} | {seq} | {first} | {r.get('seconds', 0):.3f} | {r['compiled']} | {r['chunks']} "
                         f"| {gib('allocated')} | {gib('before')} | {(r.get('reason') or '')[:200]} |")
            print(table[-1], flush=True)
            write()
            if ns.no_profile or r.get("status") != "ok":
                continue
            details.append(f"## {method}, T={seq}: Python (cProfile)\n\n"
                           + _python_profile(step, ids, labels, ns.device, ns.rows))
            write()
            details.append(f"## {method}, T={seq}: ops (torch.profiler)\n\n"
                           + _profile_tables(step, ids, labels, ns.device, ns.rows))
            write()
            parts._free(ns.device)
            print(f"profiled {method} T={seq}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Step memory against depth: layer inputs off the device. One fresh process per (layers, method).

    python -m streamfx.bench.depth [--model qwen3-layers] [--seq 8192] [--layers 6,12,24]
        [--methods streambp,streambp-offload,streambp-keep4,ckpt-offload] [--options '{"codegen": "eager"}']

Each process is a ``streamfx.bench.worker`` measurement of the preset with that many layers:
warm-up step (compiles), ``--repeats`` timed steps, then the memory step (peak RSS over the
pre-step RSS on the CPU). The table gives the step's peak rise per depth, its growth from the
smallest to the largest depth, its ratio to plain streambp at the same depth, and the median
step time with its ratio to plain streambp.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

MIB = 1 << 20


def measure(preset: str, method: str, seq: int, layers: int, options: dict, repeats: int, timeout: float,
            device: str = "cpu", keep_grads: bool = False, threads: int | None = None) -> dict:
    from .methods import not_applicable

    why = not_applicable(method, device, None)
    if why is not None:
        return {"status": "n/a", "reason": why}
    fd, path = tempfile.mkstemp(prefix="depth-", suffix=".json")
    os.close(fd)
    args = {"preset": preset, "method": method, "seq": seq, "layers": layers, "repeats": repeats, "device": device, "keep_grads": keep_grads,
            "streambp_options": options, "result_path": path}
    try:
        subprocess.run([sys.executable, "-m", "streamfx.bench.worker", "--json-args", json.dumps(args)],
                       timeout=timeout, capture_output=True, text=True,
                       env=dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})))
        with open(path) as f:
            text = f.read()
        return json.loads(text) if text.strip() else {"status": "crashed"}
    except subprocess.TimeoutExpired:
        return {"status": "timeout"}
    finally:
        os.unlink(path)


def table(results: dict, layers: list, methods: list) -> str:
    """Markdown: one row per method; ``results[(method, L)]`` are worker results."""
    def peak(m, L):
        r = results.get((m, L), {})
        return r["peak_delta_bytes"] / MIB if r.get("status") == "ok" else None

    def time_of(m, L):
        r = results.get((m, L), {})
        return r.get("median_cpu_time_s", r.get("median_time_s")) if r.get("status") == "ok" else None

    fmt = lambda v, spec: "—" if v is None else format(v, spec)  # noqa: E731
    top = layers[-1]
    head = (["method"] + [f"peak L={L} MiB" for L in layers] + [f"growth L={layers[0]}->{top}", f"vs streambp L={top}"]
            + [f"CPU time L={L} s" for L in layers] + [f"time vs streambp L={top}", "grad err", "status"])
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 2) + "---|"]
    for m in methods:
        peaks = [peak(m, L) for L in layers]
        growth = peaks[-1] / peaks[0] if None not in (peaks[0], peaks[-1]) and peaks[0] else None
        base = peak("streambp", top)
        rel = peaks[-1] / base if peaks[-1] is not None and base else None
        times = [time_of(m, L) for L in layers]
        tb = time_of("streambp", top)
        trel = times[-1] / tb if times[-1] is not None and tb else None
        last = results.get((m, top), {})
        err = last.get("grad_rel_err")
        status = ",".join(sorted({results.get((m, L), {}).get("status", "—") for L in layers}))
        lines.append("| " + " | ".join([m] + [fmt(p, ".1f") for p in peaks] + [fmt(growth, ".2f"), fmt(rel, ".2f")]
                                       + [fmt(t, ".2f") for t in times] + [fmt(trel, ".2f"), fmt(err, ".1e"), status])
                     + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-layers")
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--layers", default="6,12,24")
    p.add_argument("--methods", default="streambp,streambp-offload,streambp-keep4,streambp-offload-keep4,ckpt-offload")
    p.add_argument("--options", default="{}", help="streambp options (JSON), e.g. '{\"codegen\": \"eager\"}'")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--keep-grads", action="store_true",
                   help="gradient buffers allocated before the memory step: the peak leaves them out")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of each worker")
    p.add_argument("--json", default=None, help="also write every result here")
    a = p.parse_args(argv)
    layers = [int(x) for x in a.layers.split(",")]
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    options = json.loads(a.options)
    results = {}
    for L in layers:
        for m in methods:
            r = measure(a.model, m, a.seq, L, options, a.repeats, a.timeout, a.device, a.keep_grads, a.threads)
            results[(m, L)] = r
            print(f"# {m} L={L}: {r.get('status')} peak {r.get('peak_delta_bytes', 0) / MIB:.1f} MiB "
                  f"time {r.get('median_time_s')} {r.get('reason', '')}", flush=True)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump([dict(v, method=k[0], layers=k[1]) for k, v in results.items()], f, indent=1)
    print(f"{a.model}, T={a.seq}, options {options}, one fresh process per cell; peak = step peak RSS over "
          f"the pre-step RSS")
    print(table(results, layers, methods))


if __name__ == "__main__":
    main()

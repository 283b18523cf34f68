"""Compile time against the number of chunks: one fresh process per chunk size.

    python -m streamfx.bench.compile_time [--model qwen3-layers] [--seq 1024] [--chunks 4,64]

Each process builds the preset, compiles it with the streambp backend (Inductor codegen, an
empty Inductor cache directory) and runs three steps. Compile time = first step - median of the
next two; chunk compiles = the runtime's counter. The number of chunk graphs compiled depends on
the distinct layer structures, not on the number of chunks or layers.
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


def _worker(preset: str, seq: int, chunk: int) -> dict:
    import torch

    from streamfx import runtime
    from streamfx.bench import presets

    p = presets.get_preset(preset)
    model = presets.build_model(p, p.dtype, "cpu", seed=0, max_seq=seq)
    ids, labels = presets.make_batch(p, seq, "cpu", seed=0)
    compiled = torch.compile(model, backend="streambp", dynamic=False,
                             options={"chunk_size": chunk, "head_chunk_size": chunk})
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        compiled(input_ids=ids, labels=labels).loss.backward()
        times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    step = statistics.median(times[1:])
    return {"chunk": chunk, "chunks": -(-seq // chunk), "first_step_s": times[0], "step_s": step,
            "compile_s": times[0] - step, "chunk_compiles": runtime.COUNTERS["chunk_compiles"]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-layers")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--chunks", default="4,64", help="numbers of chunks per layer (comma list)")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker is not None:
        print(json.dumps(_worker(a.model, a.seq, a.worker)))
        return
    print(f"{a.model}, T={a.seq}, one fresh process and an empty Inductor cache per row")
    print("| chunks | chunk size | chunk compiles | first step s | step s | compile s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in (int(x) for x in a.chunks.split(",")):
        chunk = -(-a.seq // n)
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_FX_GRAPH_CACHE="0",
                       TORCHINDUCTOR_AUTOGRAD_CACHE="0")
            out = subprocess.run([sys.executable, "-m", "streamfx.bench.compile_time", "--model", a.model,
                                  "--seq", str(a.seq), "--worker", str(chunk)],
                                 env=env, capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {r['chunks']} | {r['chunk']} | {r['chunk_compiles']} | {r['first_step_s']:.1f} | "
              f"{r['step_s']:.2f} | {r['compile_s']:.1f} |")


if __name__ == "__main__":
    main()

"""Benchmarks: memory per token, maximum length and time of streambp against its peers.

``python -m streamfx.bench [--quick] [--out DIR] [--model PRESET] [--seq 512,1024] ...`` measures one
BP step (forward with labels + ``loss.backward()``) of a Qwen3-shaped causal LM with random weights
for every method in :mod:`streamfx.bench.methods`, each measurement in a fresh worker process
(:mod:`streamfx.bench.worker`), and writes ``results.md``, ``results.json``, ``results.csv`` and
``memory.png`` (:mod:`streamfx.bench.report`).

Importing this package imports neither torch nor transformers; the worker and the CLI do.
"""


def main(argv=None) -> int:
    """Run the benchmark CLI (see :mod:`streamfx.bench.cli`); returns the exit status."""
    from .cli import main as _main

    return _main(argv)


__all__ = ["main"]

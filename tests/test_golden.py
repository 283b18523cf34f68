"""The analysis of one small model, as text, against a checked-in golden copy.

The text (``streamfx.dumps.to_text``) lists every node of the joint graph with its class,
sequence-dim roles, region and attention site, then the sites, regions and plan. A change to
any analysis shows up here as a readable diff. To accept an intended change:
``STREAMFX_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py``.

Torch 2.11 decomposes the embedding's backward differently (an ``index_put`` of a ``where``
where later releases have ``_unsafe_masked_index_put_accumulate``): it has a copy of its own,
``tiny_lm_analysis.torch-2.11.txt`` (checked by ``.ci/compat``), which may differ from the main
copy only in the backward lines outside every region (the embedding's gradient).
"""
import os
import pathlib
import re

import pytest
import torch
from torch._functorch.aot_autograd import aot_function, make_boxed_func
from torch._functorch.partitioners import default_partition
from torch._inductor.decomposition import select_decomp_table

from streamfx.config import StreamConfig
from streamfx.dumps import to_text
from streamfx.passes import pipeline

pytestmark = pytest.mark.fast  # the whole module is in the fast tier
from test_analysis import TinyLM

GOLDEN_DIR = pathlib.Path(__file__).parent / "golden"
MAIN = GOLDEN_DIR / "tiny_lm_analysis.txt"
_RELEASE = GOLDEN_DIR / f"tiny_lm_analysis.torch-{'.'.join(torch.__version__.split('.')[:2])}.txt"
GOLDEN = _RELEASE if _RELEASE.exists() else MAIN


def joint_of(model, *args):
    """The AOTAutograd joint graph of ``model(*args)`` (parameters as inputs, the backend's
    decompositions), without Dynamo."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    captured = {}

    def fn(p, *a):
        return (torch.func.functional_call(model, {**p, **buffers}, a),)

    def partition(gm, inputs, **kwargs):
        captured["joint"], captured["nfwd"] = gm, kwargs["num_fwd_outputs"]
        return default_partition(gm, inputs, **kwargs)

    compiler = lambda gm, ex: make_boxed_func(gm.forward)  # noqa: E731
    aot_function(fn, fw_compiler=compiler, bw_compiler=compiler, partition_fn=partition,
                 decompositions=select_decomp_table())(params, *args)
    return captured["joint"], captured["nfwd"]


def analysed_text() -> str:
    torch.manual_seed(0)
    model = TinyLM(V=16, d=8, H=2, layers=2, attn="sdpa")
    idx = torch.randint(0, 16, (1, 6))
    joint, nfwd = joint_of(model, idx, idx)
    a = pipeline.analyze(joint.graph, nfwd)
    pipeline.decide(a, StreamConfig(chunk_size=4, head_chunk_size=3))
    return to_text(joint, a) + "\n"


def test_analysis_matches_golden_text():
    text = analysed_text()
    if os.environ.get("STREAMFX_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"no golden file; run with STREAMFX_UPDATE_GOLDEN=1 to write {GOLDEN}"
    assert text == GOLDEN.read_text()


def _outside_the_embedding_backward(text: str) -> list[str]:
    """The lines a release's decomposition of the embedding backward leaves alone: all but the
    backward nodes outside every region, the graph's return, and the token ids' user count."""
    keep = []
    for line in text.splitlines():
        if line.endswith("region=None attn=None backward") or line.startswith("return "):
            continue
        keep.append(re.sub(r"num_users=\d+", "num_users=?", line) if "placeholder" in line else line)
    return keep


def test_release_copies_differ_only_in_the_embedding_backward():
    main = _outside_the_embedding_backward(MAIN.read_text())
    for other in sorted(GOLDEN_DIR.glob("tiny_lm_analysis.torch-*.txt")):
        assert _outside_the_embedding_backward(other.read_text()) == main, other.name

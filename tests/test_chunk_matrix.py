"""Every zoo model at every chunk size, through padding and prompt masks.

Layer chunks 1, 5, 16, T-1, T and > T, each paired with a head chunk from 1, 7, T-1, T and > T,
on B=2 rows of T=18 tokens (left padding, right padding, a prompt span of ignored labels, and
longer padding). Loss and every gradient match eager autograd; every layer and the head really
stream with the requested chunk counts.

``codegen="eager"`` covers the matrix by halves: each model runs every other chunk size, so
each chunk size runs on four models and each case on four (model, chunk size) pairs. Under Inductor the chunk graphs are compiled for a
symbolic chunk and prefix length, so one compile serves every chunk size: the Inductor test
runs the chunk sizes of a model on one case and checks that no chunk size after the first
compiles anything: two models at all six sizes, the rest of the zoo (slow tier) at three.
"""

import pytest
import torch

import zoo
from tiers import cases
from conftest import assert_grads_match, assert_streamed, run_eager_and_compiled
from streamfx.passes.schedule import chunk_count

T = 18
LAYER_CHUNKS = [1, 5, 16, T - 1, T, 40]
HEAD_CHUNKS = [1, 7, T - 1, T, 40, 7]
CASES = [zoo.Case("left", 2, T, pad="left"), zoo.Case("right", 2, T, pad="right"),
         zoo.Case("prompt", 2, T, ignore=(3, 12)), zoo.Case("left7", 2, T, pad="left", n_pad=7),
         zoo.Case("right7", 2, T, pad="right", n_pad=7), zoo.Case("b1", 1, T)]
MODELS = ["qwen3_sdpa", "qwen3_eager", "llama_tied", "mistral_sliding", "gemma3", "gpt2", "nanogpt",
          "tiny_llama"]


def build(name):
    model, make_inputs = zoo.ZOO[name]()
    if name == "gpt2":
        model.loss_type = "ForCausalLM"  # stock GPT-2 graph-breaks before its loss (test_parity.py)
    return model, make_inputs


def check(run, case, chunk, head_chunk):
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert not run.warnings, run.warnings
    layers = {p.name for p in run.programs if p.name.startswith("layer")}
    assert layers == {f"layer.{i}" for i in range(zoo.LAYERS)}, [p.name for p in run.programs]
    for name in layers:
        assert all(n == chunk_count(T, chunk) for n in run.schedules[name]), (name, run.schedules)
    assert_streamed(run, T=T, head_chunk_size=head_chunk)


# half the (model, chunk size) product, every chunk size on four models and every case four times,
# no (chunk size, case) pair twice: each model alternates between the odd and the even chunk sizes
COVER = [(name, i) for m, name in enumerate(MODELS) for i in range(len(LAYER_CHUNKS)) if (i + m) % 2 == 0]
# by default every chunk size and every model once: model i at chunk size i, the last two models
# at the first two sizes
DEFAULT = [(name, m if m < len(LAYER_CHUNKS) else m - len(LAYER_CHUNKS)) for m, name in enumerate(MODELS)]


@pytest.mark.parametrize("name, i", cases(COVER, DEFAULT), ids=[f"chunk{LAYER_CHUNKS[i]}-{name}" for name, i in COVER])
def test_every_chunk_size_eager_codegen(name, i):
    model, make_inputs = build(name)
    case = CASES[(i + MODELS.index(name) // 2) % len(CASES)]
    options = {"codegen": "eager", "chunk_size": LAYER_CHUNKS[i], "head_chunk_size": HEAD_CHUNKS[i]}
    run = run_eager_and_compiled(model, make_inputs(case), options)
    check(run, case, LAYER_CHUNKS[i], HEAD_CHUNKS[i])


def inductor_every_chunk_size(name, sizes=range(len(LAYER_CHUNKS))):
    """The chunk sizes ``sizes`` (indices; all by default) on one case (a case changes the graphs:
    batch size, masks). The compile cache and the key-range cache start empty (a key range cached
    by an earlier test skips the mask graph's compile), so the counts are this model's alone."""
    from streamfx import runtime

    runtime.clear_caches()
    compiles = []
    case = {"qwen3_eager": CASES[0], "mistral_sliding": CASES[4]}.get(name, CASES[MODELS.index(name) % len(CASES)])
    for chunk, head_chunk in [(LAYER_CHUNKS[i], HEAD_CHUNKS[i]) for i in sizes]:
        torch._dynamo.reset()
        model, make_inputs = build(name)
        options = {"codegen": "inductor", "chunk_size": chunk, "head_chunk_size": head_chunk}
        run = run_eager_and_compiled(model, make_inputs(case), options)
        check(run, case, chunk, head_chunk)
        assert all(p.codegen == "inductor" for p in run.programs)
        compiles.append(run.counters["chunk_compiles"])
    # graphs compiled for the first chunk size serve every other
    assert compiles[1:] == [0] * (len(compiles) - 1), compiles


@pytest.mark.parametrize("name", cases(["qwen3_eager", "mistral_sliding"], ["mistral_sliding"]))
def test_every_chunk_size_inductor(name):
    """Eager attention with left padding (rows that see no key: wide chunks); a sliding window
    with right padding."""
    inductor_every_chunk_size(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", cases([m for m in MODELS if m not in ("qwen3_eager", "mistral_sliding")], ["nanogpt"]))
def test_every_chunk_size_inductor_rest_of_zoo(name):
    """Every other zoo model at three chunk sizes (one token, a middle size, more than T): the
    graphs compiled for the first serve the other two, but for code compiled at a size of one
    (nanoGPT's mask check, compiled at a chunk of one row, takes its rows' dim as 1: it compiles
    again, with no cache entry to serve the other sizes)."""
    inductor_every_chunk_size(name, sizes=(0, 2, 5))

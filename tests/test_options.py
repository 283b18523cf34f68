"""Options: validation before any compile work, and the ways options reach the backend."""
import pytest
import torch

import streamfx
from streamfx import StreamBPError, StreamConfig

pytestmark = pytest.mark.fast  # the whole module is in the fast tier


def _model():
    return torch.nn.Linear(4, 4)


@pytest.mark.parametrize("options, key", [
    ({"chunk_sise": 4}, "chunk_sise"),
    ({"chunk_size": 0}, "chunk_size"),
    ({"chunk_size": -3}, "chunk_size"),
    ({"head_chunk_size": 2.5}, "head_chunk_size"),
    ({"chunk_size": True}, "chunk_size"),
    ({"codegen": "triton"}, "codegen"),
    ({"strict": "yes"}, "strict"),
    ({"return_logits": 1}, "return_logits"),
    ({"kv_boundary": "compressed"}, "kv_boundary"),
])
def test_bad_options_raise_streambp_error_through_torch_compile(options, key):
    compiled = torch.compile(_model(), backend="streambp", options=options)
    with pytest.raises(StreamBPError) as err:
        compiled(torch.randn(2, 4))
    assert key in str(err.value)


@pytest.mark.parametrize("compile_kwargs, says", [
    ({"mode": "max-autotune"}, "CUDA graphs"),
    ({"mode": "reduce-overhead"}, "CUDA graphs"),
    ({"mode": "fastest"}, "must be one of"),
    ({"options": {"mode": "max-autotune-no-cudagraphs", "codegen": "eager"}}, "codegen='eager'"),
])
def test_a_compile_mode_streaming_cannot_honour_raises_with_the_modes_it_can(compile_kwargs, says):
    """torch.compile's ``mode`` reaches the backend: a mode that turns
    on CUDA graphs, one torch does not define, or one with nothing for Inductor to compile raises
    before any compile work, naming the modes that apply."""
    compiled = torch.compile(_model(), backend="streambp", **compile_kwargs)
    with pytest.raises(StreamBPError, match=says) as err:
        compiled(torch.randn(2, 4))
    assert "'max-autotune-no-cudagraphs'" in str(err.value) or "codegen='eager'" in str(err.value), err.value
    assert "'max-autotune'" not in str(err.value).split("one of")[-1], err.value


@pytest.mark.heavy
def test_a_compile_mode_and_inductor_options_reach_every_inductor_compile_of_the_streamed_step(monkeypatch):
    """``torch.compile(model, backend="streambp", mode=...)``: the outer graphs and every chunk graph
    compile with that mode's Inductor options, and the streamed step is exact; "lite" (torch 2.13's,
    cheap to compile; else "max-autotune-no-cudagraphs") without its undecomposed joint graph
    (``INDUCTOR_OPTIONS_NOT_TAKEN``), without which the loss would be one op and the head would not
    stream. ``options={"inductor_options": {...}}``: those Inductor options."""
    import copy
    import functools

    from torch._inductor import compile_fx as inductor_compile
    from torch._inductor import config as inductor_config

    import zoo
    from conftest import assert_grads_match, grads_of
    from streamfx.config import inductor_modes
    from streamfx.runtime import _PROGRAMS, COUNTERS

    read = ("max_autotune", "coordinate_descent_tuning", "use_joint_graph_passes", "fallback_by_default",
            "selective_decompose", "epilogue_fusion")
    seen = []
    real = inductor_compile.compile_fx

    def spy(*args, **kwargs):
        seen.append({key: functools.reduce(getattr, key.split("."), inductor_config) for key in read})
        return real(*args, **kwargs)

    monkeypatch.setattr(inductor_compile, "compile_fx", spy)
    model, make_inputs = zoo.nanogpt()
    inputs = make_inputs(zoo.Case("mode", 2, 16))
    mode = "lite" if "lite" in inductor_modes() else "max-autotune-no-cudagraphs"   # (torch 2.11 has no lite)
    given = {"inductor_options": {"epilogue_fusion": False, "coordinate_descent_tuning": True},
             "chunk_size": 4, "head_chunk_size": 4}
    for compile_kwargs in ({"mode": mode}, {"options": given}):
        torch._dynamo.reset()
        ref = copy.deepcopy(model)
        inputs.loss_of(ref(*inputs.args, **inputs.kwargs)).backward()
        mine = copy.deepcopy(model)
        seen.clear()
        before, keys = dict(COUNTERS), set(_PROGRAMS)
        inputs.loss_of(torch.compile(mine, backend="streambp", **compile_kwargs)(*inputs.args, **inputs.kwargs)).backward()
        moved = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
        assert {p.kind for k, p in _PROGRAMS.items() if k not in keys} == {"layer", "head"}, compile_kwargs
        assert moved["region_backward"] >= 2, (compile_kwargs, moved)
        assert moved["chunk_compiles"] >= 2 and len(seen) > moved["chunk_compiles"], (compile_kwargs, moved, len(seen))
        patches = StreamConfig.from_options(compile_kwargs.get("options", compile_kwargs)).inductor_patches
        want = {k: v for k, v in patches.items() if k in read}
        assert want and all({k: s[k] for k in want} == want for s in seen), (compile_kwargs, want, seen)
        assert not any(s["selective_decompose"] for s in seen)
        assert_grads_match(grads_of(ref), grads_of(mine))


@pytest.mark.parametrize("inductor_options, says", [
    ({"max_autotun": True}, "not options of torch._inductor.config"),
    ({"triton.cudagraphs": True}, "CUDA graphs"),
    ({"custom_partitioner_fn": None}, "partitioner"),
    ({"selective_decompose": True}, "decompositions"),
    ({"fx_graph_cache": True}, "cache"),
    ([("max_autotune", True)], "must be a dict"),
])
def test_inductor_options_streaming_cannot_honour_raise_with_the_reason(inductor_options, says):
    with pytest.raises(StreamBPError, match=says):
        torch.compile(_model(), backend="streambp", options={"inductor_options": inductor_options})(torch.randn(2, 4))
    with pytest.raises(StreamBPError, match="codegen='eager'"):
        StreamConfig(inductor_options={"max_autotune": True}, codegen="eager")
    assert StreamConfig(inductor_options={"triton.cudagraphs": False}).inductor_patches == {"triton.cudagraphs": False}


def test_error_names_allowed_values():
    with pytest.raises(StreamBPError, match=r"\('inductor', 'eager'\)"):
        StreamConfig(codegen="fast")
    with pytest.raises(StreamBPError, match=r"\('auto', 'latent', 'heads'\)"):
        StreamConfig(kv_boundary=None)
    with pytest.raises(StreamBPError, match="allowed options are .*chunk_size.*head_chunk_size"):
        StreamConfig.from_options({"chunksize": 8})


def test_backend_factory_validates_at_construction():
    with pytest.raises(StreamBPError, match="chunk_size"):
        streamfx.backend(chunk_size=-1)
    be = streamfx.backend(chunk_size=8, codegen="eager")
    assert be.config == StreamConfig(chunk_size=8, codegen="eager")


def test_streambp_error_is_a_value_error():
    assert issubclass(StreamBPError, ValueError)


def test_dump_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("STREAMFX_DUMP_DIR", str(tmp_path))
    assert StreamConfig().effective_dump_dir == str(tmp_path)
    assert StreamConfig(dump_dir="x").effective_dump_dir == "x"


def test_registered_entry_point_without_import():
    """`backend="streambp"` resolves through the torch_dynamo_backends entry point."""
    import subprocess
    import sys
    code = ("import torch; m = torch.nn.Linear(3, 3); "
            "y = torch.compile(m, backend='streambp', options={'codegen': 'eager'})(torch.randn(2, 3)); "
            "print('streamfx' in __import__('sys').modules, tuple(y.shape))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("True (2, 3)")


@pytest.mark.parametrize("codegen", ["eager", "inductor"])
def test_inference_and_no_tangent_graphs_pass_through(codegen):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 3))
    x = torch.randn(4, 5)
    compiled = torch.compile(m, backend="streambp", options={"codegen": codegen})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x))
    y = compiled(x)
    y.sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).sum().backward()
    for g, p in zip(grads, m.parameters()):
        torch.testing.assert_close(g, p.grad)


def test_automatic_layer_chunk_grows_with_the_length_and_bounds_chunk_by_length():
    """The automatic layer chunk: a quarter of T from 64 tokens up to 2,048 (larger chunks run
    faster), with chunk x T at most 2**25 from 512 tokens up, so that the terms of a chunk that
    grow with T (a padded batch's mask block, unfused attention's scores) cost a long sequence
    no more memory per token than chunks of 512."""
    from streamfx.passes.schedule import auto_chunk

    assert [auto_chunk(T) for T in (16, 100, 1024, 2048, 4096, 8192, 16384)] == [16, 64, 256, 512, 1024, 2048, 2048]
    for T in (16384, 20000, 32768, 65536, 1 << 20):
        c = auto_chunk(T)
        assert c >= 512 and (c * T <= 1 << 25 or c == 512), (T, c)
    assert auto_chunk(32768) == 1024 and auto_chunk(1 << 20) == 512


def test_no_chunk_is_one_token_where_the_sequence_has_more():
    """The schedule's chunks cover the sequence in order, none empty, none longer than the chunk
    size (but with chunks of 2, where a last token joins the chunk before it), and none of one
    token where the sequence has more: a chunk graph compiled for chunks of several rows takes
    guards a chunk of one row breaks (``tests/test_dynamic.py``'s Inductor loop counts them)."""
    from streamfx.passes.schedule import chunk_bounds, chunk_count

    assert chunk_bounds(16, 5) == [(0, 5), (5, 10), (10, 14), (14, 16)]
    assert chunk_bounds(7, 2) == [(0, 2), (2, 4), (4, 7)] and chunk_bounds(1, 4) == [(0, 1)]
    assert chunk_bounds(4097, 1024)[-2:] == [(3072, 4095), (4095, 4097)]
    for T in range(1, 70):
        for c in range(1, 18):
            b = chunk_bounds(T, c)
            assert len(b) == chunk_count(T, c) and b[0][0] == 0 and b[-1][1] == T, (T, c, b)
            assert all(s < e and e == s2 for (s, e), (s2, _) in zip(b, b[1:] + [(T, None)])), (T, c, b)
            assert all(e - s <= c for s, e in b) or (c == 2 and b[-1][1] - b[-1][0] == 3), (T, c, b)
            assert len(b) == 1 or c == 1 or all(e - s >= 2 for s, e in b), (T, c, b)

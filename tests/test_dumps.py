"""Dumps: graphviz .dot, rendered .svg and text, per graph and per pass that changed it."""
import shutil

import pytest
import torch

from test_analysis import TinyLM

pytestmark = pytest.mark.fast  # the whole module is in the fast tier


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed")
def test_dump_renders_svg_with_classes_regions_and_schedule(tmp_path):
    torch.manual_seed(0)
    model = TinyLM(V=32, d=16, H=2, layers=2)
    idx = torch.randint(0, 32, (1, 12))
    compiled = torch.compile(model, backend="streambp",
                             options={"codegen": "eager", "dump_dir": str(tmp_path), "head_chunk_size": 5})
    compiled(idx, idx).backward()
    names = sorted(p.name for p in tmp_path.iterdir())
    joint = [n for n in names if n.endswith("0-joint.svg")]
    streamed = [n for n in names if n.endswith("1-streamed.svg")]
    assert joint and streamed, names
    svg = (tmp_path / joint[0]).read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    dot = (tmp_path / joint[0].replace(".svg", ".dot")).read_text()
    assert "cluster_layer.0" in dot and "cluster_head" in dot  # regions as clusters
    assert "#f7c6a3" in dot  # causal-mixing colour: the attention sites
    text = (tmp_path / streamed[0].replace(".svg", ".txt")).read_text()
    assert "streamfx.region" in text and "region_backward" in text
    assert "chunk graph of head" in text and "3 chunk(s) of 5 tokens" in text
    assert "chunk schedule" in (tmp_path / streamed[0].replace(".svg", ".dot")).read_text()


def test_dump_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMFX_DUMP_DIR", str(tmp_path))
    model = TinyLM(V=16, d=8, H=2)
    idx = torch.randint(0, 16, (1, 6))
    torch.compile(model, backend="streambp", options={"codegen": "eager"})(idx, idx)
    assert any(p.name.endswith(".txt") for p in tmp_path.iterdir())


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed")
def test_dump_names_carry_the_process(tmp_path, monkeypatch):
    """Two processes (ranks) dumping the same graph into one directory write different files, and
    rendering leaves every other file in place (no temporary source file is cleaned up)."""
    import os

    import streamfx.dumps as dumps

    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    other, other_dot = tmp_path / "rank1.pid1.graph0.0-joint", tmp_path / "rank1.pid1.graph0.0-joint.dot"
    other.write_text("not mine")       # what another rank wrote for the same graph name
    other_dot.write_text("digraph {}")
    monkeypatch.setenv("RANK", "0")
    paths = dumps.dump_graph(gm, None, str(tmp_path), "graph0.0-joint")
    mine = f"rank0.pid{os.getpid()}.graph0.0-joint"
    assert sorted(os.path.basename(p) for p in paths) == sorted(mine + ext for ext in (".dot", ".txt", ".svg"))
    assert other.read_text() == "not mine" and other_dot.read_text() == "digraph {}"
    assert not (tmp_path / mine).exists()  # no source file left behind


def test_without_graphviz_only_dumps_need_it(tmp_path, monkeypatch):
    """Without the ``graphviz`` package (a GPU machine's environment) streamfx compiles, and the
    text form works; asking for dumps is an error that names the package."""
    import sys

    import streamfx
    from streamfx.dumps import to_text

    monkeypatch.setitem(sys.modules, "graphviz", None)  # import graphviz raises ImportError
    model = TinyLM(V=16, d=8, H=2)
    idx = torch.randint(0, 16, (1, 6))
    torch._dynamo.reset()
    torch.compile(model, backend="streambp", options={"codegen": "eager"})(idx, idx).backward()
    assert "placeholder" in to_text(torch.fx.symbolic_trace(torch.nn.Linear(2, 2)))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "dump_dir": str(tmp_path)})
    with pytest.raises(streamfx.StreamBPError, match="'graphviz', which is not installed"):
        compiled(idx, idx)

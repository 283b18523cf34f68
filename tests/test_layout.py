"""The shape of the code: the pass order in one function, imports that point one way."""
import ast
import inspect
import pathlib

import networkx as nx
import pytest

from streamfx.passes import pipeline

pytestmark = pytest.mark.fast  # the whole module is in the fast tier

PASSES = pathlib.Path(pipeline.__file__).parent
# analyses and policy: they never build graphs or run chunks
PURE = {"axes", "rules", "seq_dims", "attention", "regions", "plan", "pulls", "kv", "specs", "graphs", "record"}


def imports() -> nx.DiGraph:
    """module -> modules of streamfx.passes (and streamfx itself) it imports."""
    g = nx.DiGraph()
    for path in PASSES.glob("*.py"):
        mod = path.stem
        g.add_node(mod)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    names = [node.module] if node.module else [a.name for a in node.names]
                    for name in names:
                        g.add_edge(mod, name.split(".")[0])
                elif node.module and node.module.startswith("streamfx") and not node.module.startswith("streamfx.passes"):
                    g.add_edge(mod, node.module)
    return g


def test_passes_import_graph_has_no_cycle():
    g = imports()
    assert nx.is_directed_acyclic_graph(g), list(nx.simple_cycles(g))


def test_policy_and_analyses_import_no_rewrite_or_runtime():
    g = imports()
    for mod in PURE:
        reach = nx.descendants(g, mod) if mod in g else set()
        assert not reach & {"rewrite", "streamfx.runtime", "pipeline", "hoist"}, (mod, sorted(reach))


def test_pipeline_order_is_one_function():
    """``pipeline.run`` names every step, in order."""
    src = inspect.getsource(pipeline.run)
    steps = ["analyze(", "decide(", "move_slices(", "stream_joint("]
    where = [src.index(s) for s in steps]
    assert where == sorted(where), where

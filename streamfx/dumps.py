"""Graph dumps: a graphviz .dot and rendered .svg, and a readable text form, per graph and pass.

Nodes are coloured by class, labelled with their sequence-dim roles, and grouped in clusters by
region; attention sites are outlined; nodes made by a streamfx pass are marked.

Several processes may share one dump directory (the ranks of a distributed run): every name
starts with the process (``rank<r>.pid<p>.``), and the .svg is rendered from the .dot written
here, so no temporary file exists that another process could overwrite or delete.
"""
from __future__ import annotations

import os
import shutil

from streamfx.errors import StreamBPError
from streamfx.passes.record import get

COLORS = {"token-local": "#cfe8cf", "causal-mixing": "#f7c6a3", "sequence-reduction": "#b7d3f2",
          "sequence-free": "#eeeeee", "unknown-mixing": "#f29b9b"}


def require_graphviz():
    """The ``graphviz`` Python package, imported when a dump is asked for: only dumps need it (the
    text form does not), and a GPU machine may well lack it."""
    try:
        import graphviz
    except ImportError as err:
        raise StreamBPError("graph dumps (option 'dump_dir' or STREAMFX_DUMP_DIR) need the Python package "
                            "'graphviz', which is not installed: pip install graphviz (or install "
                            "streamfx[dumps]); without a dump directory nothing needs it") from err
    return graphviz


def _label(node) -> str:
    rec = get(node)
    v = node.meta.get("val")
    shape = "x".join(str(s) for s in v.shape) if hasattr(v, "shape") else ""
    dims = ""
    if rec and rec.dims:
        dims = "[" + ",".join(r or "." for r in rec.dims) + "]"
    target = getattr(node.target, "__name__", str(node.target)) if node.op == "call_function" else node.op
    return f"{node.name}\\n{target}\\n{shape} {dims}"


def to_dot(gm, title: str = ""):
    """A ``graphviz.Digraph`` of the graph."""
    graphviz = require_graphviz()
    g = graphviz.Digraph(title or "graph", graph_attr={"rankdir": "TB", "label": title, "fontsize": "10"},
                         node_attr={"shape": "box", "style": "filled", "fontsize": "8"})
    clusters: dict = {}
    for n in gm.graph.nodes:
        rec = get(n)
        attrs = {"fillcolor": COLORS.get(rec.cls, "white") if rec else "white"}
        if rec and rec.attention is not None:
            attrs.update(color="#c05000", penwidth="2")
        if (rec and rec.created_by) or "streamfx" in str(n.target):
            attrs.update(shape="box3d", fillcolor="#ffe680")
        region = rec.region if rec else None
        target = clusters.setdefault(region, graphviz.Digraph(name=f"cluster_{region}",
                                                              graph_attr={"label": region or "", "style": "dashed"})) if region else g
        target.node(n.name, _label(n), **attrs)
    for sub in clusters.values():
        g.subgraph(sub)
    for n in gm.graph.nodes:
        for x in n.all_input_nodes:
            g.edge(x.name, n.name)
    return g


def to_text(gm, analysis=None, programs=()) -> str:
    lines = []
    for n in gm.graph.nodes:
        rec = get(n)
        extra = (f"  # {rec.cls} dims={rec.dims} region={rec.region} attn={rec.attention} {rec.part}"
                 + (f" made by {rec.created_by}" if rec.created_by else "")) if rec else ""
        lines.append(f"{n.format_node()}{extra}")
    if analysis is not None:
        lines.append("")
        lines.append("# attention sites: " + "; ".join(s.describe() for s in analysis.sites))
        lines.append("# regions: " + "; ".join(r.describe() for r in analysis.regions))
        lines.append("# plan: " + "; ".join(p.describe() for p in analysis.plans))
    for plan, prog in programs:
        lines.append("")
        lines.append(f"# chunk graph of {plan.name} (schedule: {plan.describe()})")
        lines.append(prog.chunk_gm.code)
    return "\n".join(lines)


def process_tag() -> str:
    """``rank<r>.pid<p>.``: the distributed rank (torch.distributed's, else the launcher's RANK;
    left out in a single process) and the process id."""
    rank = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank()
    except Exception:  # a process group being torn down: fall back to the launcher's variable
        rank = None
    if rank is None and os.environ.get("RANK", "").isdigit():
        rank = int(os.environ["RANK"])
    return (f"rank{rank}." if rank is not None else "") + f"pid{os.getpid()}."


def dump_graph(gm, analysis, directory: str, name: str, programs=()) -> list[str]:
    """Write <tag><name>.dot, .svg (if graphviz's dot is installed) and .txt, ``<tag>`` naming
    the process (``process_tag``); return the paths."""
    os.makedirs(directory, exist_ok=True)
    graphviz = require_graphviz()
    base = os.path.join(directory, process_tag() + name)
    dot = to_dot(gm, name)
    if programs:
        for plan, prog in programs:
            sub = graphviz.Digraph(name=f"cluster_chunk_{plan.name}",
                                   graph_attr={"label": f"chunk schedule: {plan.describe()}", "style": "bold"})
            for n in prog.chunk_gm.graph.nodes:
                sub.node(f"chunk_{plan.name}_{n.name}", n.name, fillcolor="#fff3b0")
                for x in n.all_input_nodes:
                    sub.edge(f"chunk_{plan.name}_{x.name}", f"chunk_{plan.name}_{n.name}")
            dot.subgraph(sub)
    paths = [base + ".dot", base + ".txt"]
    with open(base + ".dot", "w") as f:
        f.write(dot.source)
    with open(base + ".txt", "w") as f:
        f.write(to_text(gm, analysis, programs))
    if shutil.which("dot"):
        graphviz.render("dot", "svg", base + ".dot", outfile=base + ".svg")
        paths.append(base + ".svg")
    return paths

"""Self-checks of the pipeline, on when ``STREAMFX_VERIFY=1`` (the tests set it).

After every step that changes a graph: ``graph.lint()`` and the project's invariants (regions
cover what they claim; every chunk graph type-checks at chunk shapes). Under verification an
analysis rule or a mask evaluation that raises re-raises instead of making the op "unknown",
so a bug in a rule fails a test instead of showing up as a refusal.
"""
from __future__ import annotations

import os

import torch.fx as fx

from .graphs import is_tensor, val


class VerificationError(AssertionError):
    """An invariant of the pipeline does not hold (a bug in streamfx, not in the model)."""


def enabled() -> bool:
    return os.environ.get("STREAMFX_VERIFY", "") not in ("", "0")


def graph(gm_or_graph, step: str) -> None:
    """``lint()`` a graph a step produced."""
    if not enabled():
        return
    g = gm_or_graph.graph if isinstance(gm_or_graph, fx.GraphModule) else gm_or_graph
    try:
        g.lint()
    except Exception as e:  # noqa: BLE001
        raise VerificationError(f"graph after step {step!r} does not lint: {e}") from e


def analysis(a) -> None:
    """Regions cover what they claim: their nodes are forward nodes of the graph, every input of a
    region node is inside the region or one of its inputs, every output is a region node."""
    if not enabled():
        return
    fwd = set(a.fwd_nodes)
    for r in a.regions:
        inside = set(r.nodes)
        _check(inside <= fwd, f"{r.name}: nodes outside the forward graph")
        _check(set(r.outputs) <= inside, f"{r.name}: outputs that are not region nodes")
        _check(not (set(r.inputs) & inside), f"{r.name}: inputs that are region nodes")
        for n in r.nodes:
            missing = [x for x in n.all_input_nodes if x not in inside and x not in r.inputs and is_tensor(val(x))]
            _check(not missing, f"{r.name}: {n.name} reads {[x.name for x in missing]}, neither inside nor inputs")
    for p in a.plans:
        inside = set(p.nodes)
        _check(len(p.in_specs) == len(p.inputs), f"{p.name}: one spec per input")
        _check(len(p.out_specs) == len(p.outputs), f"{p.name}: one spec per output")
        _check(set(p.outputs) <= inside, f"{p.name}: outputs that are not plan nodes")
        for n in p.nodes:
            missing = [x for x in n.all_input_nodes if x not in inside and x not in p.inputs and is_tensor(val(x))]
            _check(not missing, f"{p.name}: {n.name} reads {[x.name for x in missing]}, neither inside nor inputs")


def chunk_graph(gm: fx.GraphModule, name: str) -> None:
    """A chunk graph lints and every value in it has a fake tensor of its chunk shape."""
    if not enabled():
        return
    graph(gm, f"chunk graph of {name}")
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.meta.get("val") is None:
            raise VerificationError(f"chunk graph of {name}: {n.format_node()} has no value")
        if n.op == "placeholder":
            _check(is_tensor(val(n)) or val(n) is not None, f"chunk graph of {name}: {n.name} has no value")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise VerificationError(message)

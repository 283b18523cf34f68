"""The pass pipeline over an AOTAutograd joint graph: analyse, decide, rewrite.

    analysis = analyze(joint, num_fwd_outputs)       # pure: seq dims, attention, regions, classes
    plans    = decide(analysis, config)              # pure: which regions stream, chunk sizes
    joint, analysis = move_slices(joint, ...)        # on a copy: a shifted loss's slice moved to the head entry
    joint    = stream_joint(joint, ..., plans)       # the only step that builds a new graph
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from streamfx.errors import CannotStream
from . import attention as attn
from .plan import plan_head, plan_layer
from .record import NodeRecord, tag
from .regions import find_regions
from .seq_dims import UNKNOWN_MIXING, infer_axes, seed_from_embedding


@dataclasses.dataclass
class Analysis:
    graph: fx.Graph
    num_fwd_outputs: int
    fwd_nodes: list
    bwd_nodes: list
    sd: object
    sites: list
    classes: dict
    regions: list
    plans: list = dataclasses.field(default_factory=list)
    refusals: list = dataclasses.field(default_factory=list)   # (region name, CannotStream)
    programs: list = dataclasses.field(default_factory=list)   # (plan, runtime program) after the rewrite
    requires_grad: frozenset = frozenset()                      # forward nodes that get a gradient
    moved: list = dataclasses.field(default_factory=list)      # hoist.MovedSlice: slices moved before the head

    @property
    def seq_len(self):
        for p in self.plans:
            return p.length
        for s in self.sites:
            return s.query.meta["val"].shape[-2]
        return None

    def unknown_mixing(self) -> list:
        return [n for n in self.fwd_nodes if self.classes.get(n) == UNKNOWN_MIXING]


def split_joint(graph: fx.Graph, num_fwd_outputs: int):
    """Forward nodes (needed by the forward outputs, independent of tangents) and the rest."""
    out = graph.find_nodes(op="output")[0]
    fwd_outs = [o for o in list(out.args[0])[:num_fwd_outputs] if isinstance(o, fx.Node)]
    tangent_dep = set()
    for n in graph.nodes:
        if (n.op == "placeholder" and n.name.startswith("tangents")) or any(x in tangent_dep for x in n.all_input_nodes):
            tangent_dep.add(n)
    needed, stack = set(fwd_outs), list(fwd_outs)
    while stack:
        for x in stack.pop().all_input_nodes:
            if x not in needed:
                needed.add(x)
                stack.append(x)
    fwd = [n for n in graph.nodes if (n in needed or (n.op == "placeholder" and n not in tangent_dep))]
    bwd = [n for n in graph.nodes if n.op == "call_function" and n not in needed]
    return fwd, bwd, fwd_outs


def differentiable(graph: fx.Graph, num_fwd_outputs: int, fwd: list) -> frozenset:
    """Forward nodes whose gradient the joint computes: primals with a gradient output (not a
    frozen weight, not an integer input) and floating-point values computed from them."""
    primals = [n for n in graph.find_nodes(op="placeholder") if n.name.startswith("primals")]
    grads = list(graph.find_nodes(op="output")[0].args[0])[num_fwd_outputs:]
    if len(grads) != len(primals):
        return frozenset(fwd)
    out = {p for p, g in zip(primals, grads) if g is not None}
    for n in fwd:
        v = n.meta.get("val")
        if n.op == "call_function" and isinstance(v, torch.Tensor) and v.is_floating_point() \
                and any(x in out for x in n.all_input_nodes):
            out.add(n)
    return frozenset(out)


def analyze(graph: fx.Graph, num_fwd_outputs: int, real_inputs: dict | None = None) -> Analysis:
    fwd, bwd, fwd_outs = split_joint(graph, num_fwd_outputs)
    sd = infer_axes(graph)
    sites = attn.find_sites(graph, sd, set(fwd))
    if sites:
        sd.set_seq(sd.axes[sites[0].query][0][-2][-1])
    else:
        sd.set_seq(seed_from_embedding(graph, sd))
    for s in sites:
        attn.classify_mask(s, real_inputs or {})
    site_nodes = frozenset().union(*(s.nodes for s in sites)) if sites else frozenset()
    classes = {n: sd.classify(n, site_nodes) for n in graph.nodes if n.op in ("call_function", "placeholder", "get_attr")}
    regions = find_regions(fwd, sd, sites, fwd_outs, classes)
    analysis = Analysis(graph, num_fwd_outputs, fwd, bwd, sd, sites, classes, regions,
                        requires_grad=differentiable(graph, num_fwd_outputs, fwd))
    _record(analysis, site_nodes)
    return analysis


def _record(a: Analysis, site_nodes) -> None:
    region_of = {n: r.name for r in a.regions for n in r.nodes}
    site_of = {n: s.index for s in a.sites for n in s.nodes}
    fwd = set(a.fwd_nodes)
    for n, cls in a.classes.items():
        tag(n, NodeRecord(dims=a.sd.roles(n), cls=cls, part="forward" if n in fwd else "backward",
                          region=region_of.get(n), attention=site_of.get(n)))


def decide(a: Analysis, config) -> list:
    """Plans for the regions that stream; refusals recorded (with the responsible node)."""
    plans = []
    fwd = set(a.fwd_nodes)
    for r in a.regions:
        try:
            if r.kind == "head":
                plans.append(plan_head(r, a.sd, a.classes, config, fwd, a.requires_grad))
            else:
                plans.append(plan_layer(r, a.sd, a.classes, config, fwd, a.requires_grad))
        except CannotStream as e:
            a.refusals.append((r.name, e))
    a.plans = plans
    return plans

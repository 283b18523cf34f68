"""The mask of a streamed layer as a graph of its own: which keys each chunk must read.

The runtime evaluates this graph for a chunk's query rows against every key and reduces it to
the keys those rows may see (``streamfx.keyranges``); the chunk then reads exactly those. The
graph is the part of the layer that computes the mask (its pulled nodes, or a token-by-token
mask input read as it is), with the layer's inputs it needs. How the mask is applied to the
scores says which of its values hide a key:

  additive   a float mask added to the scores: values at or below min/2 hide a key
  allowed    a boolean mask, True where a query may see a key (SDPA's convention; ``where``)
  masked     a boolean mask, True where a key is hidden (``masked_fill``)

``fill`` is the value a hidden score gets (-inf for fused attention with a boolean mask): a row
whose keys are all hidden by a finite value is averaged over every key by the full attention.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from streamfx.errors import CannotStream
from .graphs import ancestors, in_order, val

aten = torch.ops.aten


@dataclasses.dataclass
class MaskGraph:
    graph: object         # the mask's chunk graph (``streamfx.chunks.ChunkGraph``)
    inputs: list          # indices of the layer inputs the graph reads
    kind: str             # "additive" | "allowed" | "masked"
    fill_finite: bool     # a hidden score is finite (rows that see no key see every key)
    key_dim: int          # the mask's key dim
    query_dim: int | None  # the mask's query dim (None: the mask is the same for every row)


def convention(site) -> tuple:
    """(kind, fill_finite) of the site's mask, from the op that applies it."""
    mask = site.mask
    if site.mask_user is None:  # fused attention: SDPA's convention
        return ("allowed", False) if val(mask).dtype == torch.bool else ("additive", True)
    user = site.mask_user
    args = list(user.args)
    if user.target in (aten.add.Tensor, aten.sub.Tensor) and mask in args:
        return "additive", True
    if user.target in (aten.masked_fill.Scalar, aten.masked_fill.Tensor) and args[1] is mask:
        return "masked", _finite(args[2])
    if user.target is aten.where.self and args[0] is mask:  # where(mask, scores, fill) or where(mask, fill, scores)
        if args[1] in site.nodes:
            return "allowed", _finite(args[2])
        if args[2] in site.nodes:
            return "masked", _finite(args[1])
    raise CannotStream(f"a mask applied to the scores by {user.target}", user)


def _finite(fill) -> bool:
    """Whether a fill value is finite; a computed fill counts as finite (the safe side) unless
    it is a constant -inf."""
    if isinstance(fill, (int, float)):
        return math.isfinite(fill)
    if isinstance(fill, torch.fx.Node) and fill.target in (aten.scalar_tensor.default, aten.full.default):
        value = fill.args[0] if fill.target is aten.scalar_tensor.default else fill.args[1]
        return not isinstance(value, (int, float)) or math.isfinite(value)
    return True


def mask_graph(plan, chunk_graph) -> MaskGraph | None:
    """The mask graph of a layer plan, or None when its attention has no mask (fused causal
    attention reads keys [0, e)). ``chunk_graph(inputs, specs, nodes, outputs)`` builds it."""
    site = plan.site
    if site.mask is None:
        return None
    kind, fill_finite = convention(site)
    inside = set(plan.nodes)
    nodes = in_order(ancestors([site.mask], within=inside)) if site.mask in inside else []
    reads = set(nodes) | {site.mask}
    used = [i for i, x in enumerate(plan.inputs) if x in reads or any(x in n.all_input_nodes for n in nodes)]
    if not used:
        raise CannotStream("the mask reads none of the layer's inputs", site.mask)
    graph = chunk_graph([plan.inputs[i] for i in used], [plan.in_specs[i] for i in used], nodes, [site.mask])
    roles = plan.sd.roles(site.mask)
    ndim = val(site.mask).dim()
    key_dim = ndim - 1 if site.mask_user is None else (roles.index("k") if "k" in roles else ndim - 1)
    query_dim = roles.index("q") if "q" in roles and roles.index("q") != key_dim else None
    return MaskGraph(graph, used, kind, fill_finite, key_dim, query_dim)

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
    graph: object         # the masks' chunk graph (``streamfx.chunks.ChunkGraph``): one output per mask
    inputs: list          # indices of the layer inputs the graph reads
    forms: tuple          # per output: (kind, fill_finite, key_dim, query_dim), see ``convention``


def convention(site) -> tuple:
    """(kind, fill_finite) of the site's mask, from the op that applies it."""
    mask = site.mask
    if site.mask_user is None:  # fused attention: SDPA's convention
        return ("allowed", False) if val(mask).dtype == torch.bool else ("additive", True)
    user = site.mask_user
    args = list(user.args)
    if user.target in (aten.add.Tensor, aten.sub.Tensor) and mask in args:
        return "additive", True
    if user.target is aten.baddbmm.default and args[0] is mask and user.kwargs.get("beta", 1) == 1:
        return "additive", True   # (mask + Q·Kᵀ in one op: nn.MultiheadAttention's with need_weights)
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
    attention reads keys [0, e)). A layer with several attention sites has one output per
    distinct mask: a chunk reads the keys any of its sites may see. ``chunk_graph(inputs, specs,
    nodes, outputs, zeros)`` builds it (``zeros``: nodes read as a zero scalar)."""
    sites = [s for s in plan.sites if s.mask is not None]
    if not sites:
        return None
    inside = set(plan.nodes)
    outputs, forms, zeros, reads = [], [], set(), set()
    for site in sites:
        out, nodes, scores, form = _mask_part(site, inside, plan.sd)
        if out in outputs:
            continue
        outputs.append(out)
        forms.append(form)
        zeros |= scores
        reads |= nodes
    # A term per key the layer computes from its rows (a bias added to every query's scores) is
    # not known for every key while a chunk runs: read as zero, it hides no key, so the chunk
    # reads every key the rest of the mask lets through (more, where the term itself would hide).
    # The block is then never taken for exactly causal (the kernel's causal attention would drop
    # the term), and its key dim is counted from the end (the op that broadcast the term is read
    # as zero too, so the block may have fewer dims).
    terms = {n if n.target is aten.expand.default else x for n, x in plan.key_terms
             if x in reads and val(x).is_floating_point()}
    if terms:
        zeros |= terms
        reads = {n for n in reads if n in zeros or n in _reached(outputs, zeros, inside)}
        forms = [(kind, finite, key_dim - val(o).dim(), None)
                 for (kind, finite, key_dim, _), o in zip(forms, outputs)]
    nodes = in_order(reads)
    used = [i for i, x in enumerate(plan.inputs) if x in reads or any(x in n.all_input_nodes for n in nodes)]
    if not used:
        raise CannotStream("the mask reads none of the layer's inputs", sites[0].mask)
    graph = chunk_graph([plan.inputs[i] for i in used], [plan.in_specs[i] for i in used], nodes, outputs, zeros)
    return MaskGraph(graph, used, tuple(forms))


def _reached(outputs, stops: set, inside: set) -> set:
    """The nodes of ``inside`` the outputs are computed from, not through ``stops``."""
    seen, stack = set(), [o for o in outputs if o not in stops]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack += [x for x in n.all_input_nodes if x in inside and x not in stops]
    return seen


def _mask_part(site, inside: set, sd) -> tuple:
    """(output, the nodes it is computed from (itself included), nodes read as zero, its form) of
    one site's mask: the mask itself, or, where several terms are applied in sequence
    (``site.mask_chain``), the chain applied to zero scores: an additive mask."""
    if site.mask_chain:
        chain = list(site.mask_chain)
        scores = {x for x in chain[0].all_input_nodes if x in site.nodes}
        terms = [x for n in chain for x in n.all_input_nodes if x not in site.nodes]
        nodes = ancestors(terms, within=inside) | set(chain) | {x for x in terms if x not in inside}
        return chain[-1], nodes, scores, ("additive", True, site.score_dims[1], site.score_dims[0])
    kind, fill_finite = convention(site)
    mask = site.mask
    nodes = ancestors([mask], within=inside) | {mask}
    roles = sd.roles(mask)
    ndim = val(mask).dim()
    key_dim = ndim - 1 if site.mask_user is None else (roles.index("k") if "k" in roles else ndim - 1)
    query_dim = roles.index("q") if "q" in roles and roles.index("q") != key_dim else None
    return mask, nodes, set(), (kind, fill_finite, key_dim, query_dim)

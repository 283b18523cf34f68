"""Shaping a layer's node set: what it recomputes per chunk instead of reading whole.

Two pulls, both pure (they return node sets and specs; nothing in the graph changes):
  ``pull_masks``      a token-by-token mask input ([.., T, T]) is replaced by the per-token values
                      it is built from (or by the token-by-token graph input it is converted
                      from), so each chunk builds its own [.., c, e] slice;
  ``pull_producers``  a cheap per-token input (rotary cos/sin) is recomputed per chunk from
                      fewer bytes per token (the position ids);
  ``pull_created``    a tensor made from sizes alone over the tokens merged with other dims
                      (a flat ``arange(B*T*k)`` of a mixture-of-experts dispatch) is made per chunk.
"""
from __future__ import annotations

import dataclasses

import torch

from .graphs import in_order, made_from_sizes, node_inputs, per_token, unpadded
from .positions import remade_per_chunk
from .rules import is_pointwise
from .seq_dims import SEQ_FREE, TOKEN_LOCAL
from .specs import WHOLE, Spec

aten = torch.ops.aten
RANDOM_OPS = {aten.native_dropout.default, aten.bernoulli.default, aten.bernoulli.p, aten.rand.default,
              aten.randn.default, aten.rand_like.default, aten.randn_like.default}

# ---- masks built per chunk ----------------------------------------------------------------------
# Ops a token-by-token mask may be built with inside a chunk: each output dim lines up with the
# same dim of every (broadcast) input, so a chunk of the mask is the op on chunks of its inputs.
# Ops that make a token-by-token tensor from sizes alone (SDPA's math kernel starts its causal
# mask as ``ones(L, S)``): a chunk makes its own [c, n] block (sizes are rebuilt per chunk).
MASK_MAKERS = {aten.full.default, aten.ones.default, aten.zeros.default, aten.empty.memory_format}
MASK_VIEW_OPS = {aten.expand.default, aten.clone.default, aten.alias.default, aten._to_copy.default,
                 torch.ops.prims.convert_element_type.default, aten.where.self,
                 aten.masked_fill.Scalar, aten.masked_fill.Tensor}


@dataclasses.dataclass
class PulledMasks:
    nodes: list = dataclasses.field(default_factory=list)      # mask nodes recomputed per chunk
    frontier: dict = dataclasses.field(default_factory=dict)   # input -> Spec: how a chunk reads it


def pull_masks(region, sd):
    """Move the token-by-token part of each mask into the layer: a region input with two sequence
    dims (a [.., T, T] mask) is replaced by the per-token values it is computed from (query
    positions, key positions, padding flags, document ids), so each chunk builds its [.., c, e]
    slice of the mask and no T x T tensor exists. Inputs whose mask cannot be rebuilt this way
    stay token-by-token inputs, sliced per chunk.

    Returns (nodes, inputs, PulledMasks): the region's nodes with the pulled mask nodes, in graph
    order, and its inputs with each pulled mask replaced by its frontier."""
    pulled = PulledMasks()
    pullable = {}

    def can_pull(n) -> bool:
        if n in pullable:
            return pullable[n]
        ok = (n.op == "call_function" and "k" in sd.roles(n)
              and (n.target in MASK_VIEW_OPS or n.target in MASK_MAKERS or is_pointwise(n.target)
                   or unpadded(n) is not None)
              and all(frontier_role(x, n, sd) is not False or can_pull(x) for x in _mask_inputs(n)))
        pullable[n] = ok
        return ok

    replaced = [x for x in region.inputs if "k" in sd.roles(x) and can_pull(x)]
    if not replaced:
        return region.nodes, region.inputs, pulled
    chosen, stack = set(), list(replaced)
    while stack:
        n = stack.pop()
        if n in chosen:
            continue
        chosen.add(n)
        if unpadded(n) is not None:
            chosen.add(n.args[0])  # (the pad, which a chunk copy leaves out)
        for x in _mask_inputs(n):
            if "k" in sd.roles(x) and can_pull(x):
                stack.append(x)
            else:
                pulled.frontier.setdefault(x, _frontier_spec(frontier_role(x, n, sd)))
    pulled.nodes = in_order(chosen)
    nodes = in_order(set(region.nodes) | chosen)
    inputs = [x for x in region.inputs if x not in chosen]
    inputs += [x for x in pulled.frontier if x not in inputs]
    return nodes, inputs, pulled


def frontier_role(x, user, sd):
    """How an input ``x`` of a pulled mask node ``user`` is sliced per chunk: None (whole: no
    sequence dim), ("q", d) (rows [s, e) along dim d), ("k", d) (the key prefix [0, e) along d),
    ("qk", (dq, dk)) (a token-by-token input that lines up with the user's query and key dims:
    the [rows, keys] block, read from a tensor that exists anyway, such as a [B, 1, T, T] mask
    passed to a layer compiled alone), or False when it cannot be sliced (a sequence dim that
    does not line up with the user's)."""
    v = x.meta.get("val")
    if not isinstance(v, torch.Tensor):
        return None
    axes = (sd.axes.get(x) or [None])[0]
    if axes is None:
        return False
    seq = [i for i, a in enumerate(axes) if sd.has_seq(a)]
    if not seq:
        return None
    out_roles = sd.roles(user)
    lined = [out_roles[j] if 0 <= (j := d + len(out_roles) - v.dim()) else None for d in seq]
    if len(seq) == 2 and lined == ["q", "k"]:
        return "qk", tuple(seq)
    if len(seq) > 1 or lined[0] not in ("q", "k"):
        return False
    return lined[0], seq[0]


def keys_only(x, inside, sd) -> bool:
    """Whether an input's one sequence dim is a key position wherever the layer reads it: every
    user is token-by-token and lines that dim up with its key dim (a per-key bias such as
    ALiBi's, added to the scores). Such an input is read per chunk over the chunk's keys."""
    users = [u for u in x.users if u in inside]
    roles = [frontier_role(x, u, sd) for u in users]
    return bool(users) and all(r not in (None, False) and r[0] == "k" for r in roles)


def _mask_inputs(n) -> list:
    """The tensor inputs a pulled mask node is built from; a pad taken back off is its unpadded
    input (a chunk copy reads that directly, see ``rewrite.build_graph``)."""
    x = unpadded(n)
    return [x] if x is not None else node_inputs(n)


def _frontier_spec(role) -> Spec:
    if role is None:
        return WHOLE
    kind, d = role
    if kind == "qk":
        return Spec.qk(*d)
    return Spec.chunk(d) if kind == "q" else Spec.prefix(d)


# ---- cheap per-token inputs recomputed per chunk -----------------------------------------------
PULL_LIMIT = 48  # most nodes recomputed for one input


def pull_producers(nodes, inputs, pulled: PulledMasks, sd, classes, requires_grad):
    """Recompute per chunk a per-token input that is cheap to compute from fewer bytes per token:
    rotary cos/sin ([T, head_dim] each, shared by every layer) come from the position ids (one
    integer per token), so the layer reads and saves the position ids and each chunk computes
    its own rows. An input is pulled when it is computed by token-local ops (at most PULL_LIMIT)
    from inputs that get no gradient, and those inputs hold fewer bytes per token than it.

    Updates ``pulled`` (the nodes join the shared nodes, their inputs the frontier); returns
    (nodes, inputs) like ``pull_masks``."""
    if requires_grad is None:
        return nodes, inputs
    chosen_all, new_frontier = set(), {}
    for x in inputs:
        v = x.meta.get("val")
        if (x in pulled.frontier or x.op != "call_function" or not isinstance(v, torch.Tensor)
                or x in requires_grad or "k" in sd.roles(x) or sd.seq_dim(x) is None
                or keys_only(x, set(nodes), sd)):
            continue
        chosen, frontier, stack = set(), {}, [x]
        while stack and len(chosen) <= PULL_LIMIT:
            n = stack.pop()
            if n in chosen or n in frontier:
                continue
            val = n.meta.get("val")
            # a node whose sequence dim comes from none of its inputs (arange, a slice of a
            # buffer) is read per chunk, not recomputed
            inner = (n.op == "call_function" and classes.get(n) in (TOKEN_LOCAL, SEQ_FREE)
                     and n.target not in RANDOM_OPS and isinstance(val, torch.Tensor)
                     and any(sd.seq_dim(a) is not None for a in n.all_input_nodes
                             if isinstance(a.meta.get("val"), torch.Tensor)))
            if not inner:
                frontier[n] = None
                continue
            chosen.add(n)
            stack.extend(node_inputs(n))
        if stack or not chosen:
            continue
        roles = {f: _per_token_role(f, sd) for f in frontier}
        if any(r is False for r in roles.values()) or any(f in requires_grad for f in list(frontier) + list(chosen)):
            continue
        cost = sum(per_token(f, sd, nbytes=True) for f, r in roles.items() if r is not None)
        if cost >= per_token(x, sd, nbytes=True):
            continue
        chosen_all |= chosen
        new_frontier.update(roles)
    if not chosen_all:
        return nodes, inputs
    pulled.nodes = in_order(set(pulled.nodes) | chosen_all)
    for f, role in new_frontier.items():
        pulled.frontier.setdefault(f, _frontier_spec(role))
    nodes = in_order(set(nodes) | chosen_all)
    inputs = [x for x in inputs if x not in chosen_all]
    inputs += [f for f in new_frontier if f not in inputs]
    return nodes, inputs


def _per_token_role(f, sd):
    """("q", d) for a frontier node sliced per chunk along its sequence dim d, None for one read
    whole (no sequence dim), False when it cannot be sliced per chunk."""
    v = f.meta.get("val")
    if not isinstance(v, torch.Tensor):
        return None
    roles = sd.roles(f)
    if "k" in roles:
        return False
    d = sd.seq_dim(f)
    if d is None:
        return None
    return ("q", d) if sd.seq_is_atomic(f) else False


def pull_created(nodes, inputs, sd):
    """(nodes, inputs) with the inputs made from sizes alone (no tensor input: ``empty``,
    ``arange``, ``iota``) whose sequence dim is merged with another dim made inside the layer,
    at its chunk's sizes, where that makes the chunk's values (``positions.remade_per_chunk``);
    the others stay inputs, read per chunk as rows of their flat dim."""
    inside = set(nodes)
    created = [x for x in inputs if made_from_sizes(x)
               and sd.seq_dim(x) is not None and not sd.seq_is_atomic(x) and "k" not in sd.roles(x)
               and remade_per_chunk(x, inside)]
    if not created:
        return nodes, inputs
    return in_order(list(nodes) + created), [x for x in inputs if x not in created]

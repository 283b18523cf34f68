"""The plan: which regions stream, with which chunk sizes, what is saved. Pure policy.

A ``RegionPlan`` is everything the rewrite needs for one region: its nodes, inputs (sliced per
chunk or passed whole), outputs (concatenated per chunk or summed over chunks), outputs that are
dropped (the logits when a loss is computed and return_logits is False), and the chunk size.
Refusals raise CannotStream naming the node.
"""
from __future__ import annotations

import dataclasses

import torch

from streamfx.errors import CannotStream
from .hoist import UNSLICED
from .rules import is_pointwise
from .seq_dims import SEQ_FREE, SEQ_REDUCTION, TOKEN_LOCAL

aten = torch.ops.aten
SUM_OPS = (aten.sum.dim_IntList, aten.sum.default)
HEAD_CHUNK_ELEMENTS = 1 << 22  # auto head chunk: about 4M logits values (16 MB in fp32) per chunk


@dataclasses.dataclass
class RegionPlan:
    name: str
    kind: str
    nodes: list
    inputs: list
    outputs: list
    dropped: list
    in_specs: list
    out_specs: list
    chunk_size: int
    length: int
    grad_inputs: list
    sd: object
    shared: frozenset = frozenset()   # nodes computed inside the region and also outside it

    @property
    def saved(self) -> list:
        """Per-token inputs the region keeps for its backward (those it slices per chunk)."""
        return [x for x, (k, _) in zip(self.inputs, self.in_specs) if k != "whole"]

    def describe(self) -> str:
        n_chunks = -(-self.length // self.chunk_size)
        return (f"{self.name}: {n_chunks} chunk(s) of {self.chunk_size} tokens (T={self.length}); "
                f"saves {[x.name for x in self.saved]}; outputs {[f'{o.name}:{k}' for o, (k, _) in zip(self.outputs, self.out_specs)]}"
                + (f"; drops {[d.name for d in self.dropped]}" if self.dropped else ""))


def plan_head(region, sd, classes, config, fwd: set, requires_grad=None) -> RegionPlan:
    inside = set(region.nodes)
    for n in region.nodes:
        cls = classes[n]
        if cls not in (TOKEN_LOCAL, SEQ_FREE, SEQ_REDUCTION):
            raise CannotStream(f"{cls} op in the head region", n)
        if cls == SEQ_REDUCTION:
            if n.target not in SUM_OPS:
                raise CannotStream("a reduction over the sequence that is not a sum", n)
            if any(u in inside for u in n.users):
                raise CannotStream("a sum over the sequence is used again inside the head region", n)
    reductions = [n for n in region.nodes if classes[n] == SEQ_REDUCTION]
    if not reductions:
        raise CannotStream("the head computes no reduction over the sequence (no loss in the graph)")
    outputs, out_specs, dropped = [], [], []
    for o in region.outputs:
        if classes[o] == SEQ_REDUCTION:
            outputs.append(o)
            out_specs.append(("sum", None))
            continue
        d = sd.seq_dim(o)
        if d is None or "k" in sd.roles(o):
            raise CannotStream("a value leaves the head region without a sequence dim", o)
        only_output = _reaches_only_outputs(o, fwd, inside)
        if only_output and not config.return_logits:
            dropped.append(o)
            continue
        outputs.append(o)
        out_specs.append(("cat", d))
    if not config.return_logits:
        # the whole-sequence logits of a shifted loss (the head computes their slice itself)
        # follow the same convention: returned as None
        dropped += [n for n in region.nodes[0].graph.nodes if n.meta.get(UNSLICED) and n in fwd
                    and n not in inside and _reaches_only_outputs(n, fwd, inside)]
    in_specs, lengths = [], []
    for x in region.inputs:
        if not isinstance(x.meta.get("val"), torch.Tensor):
            raise CannotStream("symbolic sizes (dynamic shapes) are not streamed yet; "
                               "compile with dynamic=False", x)
        d = sd.seq_dim(x)
        if d is not None and "k" in sd.roles(x):
            raise CannotStream("an input of the head region has two sequence dims", x)
        in_specs.append(("chunk", d) if d is not None else ("whole", None))
        if d is not None:
            lengths.append(x.meta["val"].shape[d])
    if any(not isinstance(t, int) for t in lengths):
        raise CannotStream("symbolic sequence length (dynamic shapes) is not streamed yet; "
                           "compile with dynamic=False")
    if len(set(lengths)) != 1:
        raise CannotStream(f"head inputs disagree on the sequence length ({sorted(set(lengths))})")
    T = lengths[0]
    grad_inputs = [i for i, x in enumerate(region.inputs) if x.meta["val"].is_floating_point()
                   and x.meta["val"].numel() > 0 and (requires_grad is None or x in requires_grad)]
    chunk = config.head_chunk_size or _auto_head_chunk(region, sd, T)
    return RegionPlan("head", "head", region.nodes, region.inputs, outputs, dropped, in_specs,
                      out_specs, chunk, T, grad_inputs, sd, region.shared)


ALIASES = (aten.alias.default, aten.detach.default)


def _reaches_only_outputs(node, fwd: set, inside: set) -> bool:
    """True if ``node`` leaves the region only as a graph output (possibly through alias/detach)."""
    users = [u for u in node.users if u in fwd and u not in inside]
    if not users:
        return any(u.op == "output" for u in node.users)
    return all(u.op == "output" or (u.target in ALIASES and _reaches_only_outputs(u, fwd, inside))
               for u in users)


def _auto_head_chunk(region, sd, T: int) -> int:
    """Chunk so that the widest per-token tensor of the head holds about HEAD_CHUNK_ELEMENTS values."""
    widest = 1
    for n in region.nodes:
        v = n.meta.get("val")
        d = sd.seq_dim(n) if isinstance(v, torch.Tensor) else None
        if d is not None and isinstance(v.shape[d], int) and v.shape[d] > 0:
            widest = max(widest, v.numel() // v.shape[d])
    return max(16, min(T, HEAD_CHUNK_ELEMENTS // widest))


RANDOM_OPS = {aten.native_dropout.default, aten.bernoulli.default, aten.bernoulli.p, aten.rand.default,
              aten.randn.default, aten.rand_like.default, aten.randn_like.default}


@dataclasses.dataclass
class LayerPlan(RegionPlan):
    site: object = None
    kv_nodes: list = dataclasses.field(default_factory=list)
    kv_outputs: tuple = ()       # the keys and values the K/V graph produces (see kv_boundary)
    key_side: frozenset = frozenset()  # nodes between those and the attention's keys/values
    unpulled: "LayerPlan | None" = None   # the same plan with its masks as token-by-token inputs

    @property
    def window(self) -> int | None:
        """W of a sliding-window mask (a query at t sees keys (t - W, t]), else None."""
        if self.site is not None and "sliding-window" in self.site.mask_kind:
            return self.site.window
        return None

    def describe(self) -> str:
        text = super().describe()
        if self.window:
            text += f"; sliding window {self.window}: a chunk [s, e) reads keys [max(0, s-{self.window - 1}), e)"
        return text


def plan_layer(region, sd, classes, config, fwd: set, requires_grad=None) -> LayerPlan:
    """A layer region streams when all its ops are token-local except one causal attention site."""
    if len(region.attention) != 1:
        raise CannotStream(f"a layer region with {len(region.attention)} attention sites")
    site = region.attention[0]
    if not site.is_causal:
        raise CannotStream("attention that is not causal mixes every token with every other", site.output)
    for n in region.nodes:
        if n.target in RANDOM_OPS:
            raise CannotStream("random op (dropout) whose randomness the chunked recomputation cannot replay", n)
        cls = classes[n]
        if cls == "causal-mixing" and n not in site.nodes:
            raise CannotStream("token mixing outside the recognised attention site", n)
        if cls not in (TOKEN_LOCAL, SEQ_FREE, "causal-mixing"):
            raise CannotStream(f"{cls} op inside a layer", n)
    nodes, inputs, pulled = pull_masks(region, sd)
    nodes, inputs = pull_producers(nodes, inputs, pulled, sd, classes, requires_grad)
    plan = _layer_plan(region, sd, config, site, nodes, inputs, pulled, requires_grad)
    if pulled.nodes:  # the rewrite uses this one if the masks do not rebuild per chunk
        plan.unpulled = _layer_plan(region, sd, config, site, region.nodes, region.inputs, PulledMasks(),
                                    requires_grad)
    return plan


def _layer_plan(region, sd, config, site, nodes, inputs, pulled, requires_grad=None) -> LayerPlan:
    inside = set(nodes)
    outputs, out_specs = [], []
    for o in region.outputs:
        d = sd.seq_dim(o)
        if d is None or not sd.seq_is_atomic(o):
            raise CannotStream("a value leaves the layer without a plain sequence dim", o)
        outputs.append(o)
        out_specs.append(("cat", d))
    in_specs, lengths = [], []
    for x in inputs:
        v = x.meta.get("val")
        if not isinstance(v, torch.Tensor):
            raise CannotStream("symbolic sizes (dynamic shapes) are not streamed yet; compile with dynamic=False", x)
        roles = sd.roles(x)
        if x in pulled.frontier:
            role, d = pulled.frontier[x]
            in_specs.append(("whole", None) if role is None else ("chunk" if role == "q" else "prefix", d))
            if d is not None:
                lengths.append(v.shape[d])
        elif "k" in roles:
            dq, dk = roles.index("q"), roles.index("k")
            in_specs.append(("qk", (dq, dk)))
            lengths += [v.shape[dq], v.shape[dk]]
        elif "q" in roles:
            if not sd.seq_is_atomic(x):
                raise CannotStream("an input of the layer merges the sequence with another dim", x)
            in_specs.append(("chunk", roles.index("q")))
            lengths.append(v.shape[roles.index("q")])
        else:
            in_specs.append(("whole", None))
    if any(not isinstance(t, int) for t in lengths) or len(set(lengths)) != 1:
        raise CannotStream(f"layer inputs disagree on a static sequence length ({lengths})")
    kv_out = tuple(kv_boundary(x, inside, sd) for x in (site.key, site.value))
    kv = _ancestors_within({b for b, _ in kv_out}, inside)
    T = lengths[0]
    # mask inputs (token-by-token, or the per-token values a mask is built from) get no gradient
    grad_inputs = [i for i, x in enumerate(inputs) if in_specs[i][0] in ("chunk", "whole")
                   and x not in pulled.frontier and x.meta["val"].is_floating_point() and x.meta["val"].numel() > 0
                   and (requires_grad is None or x in requires_grad)]
    chunk = config.chunk_size or auto_chunk(T)
    return LayerPlan(region.name, "layer", nodes, inputs, outputs, [], in_specs, out_specs,
                     chunk, T, grad_inputs, sd, frozenset(pulled.nodes), site=site,
                     kv_nodes=[n for n in nodes if n in kv], kv_outputs=tuple(b for b, _ in kv_out),
                     key_side=frozenset().union(*(chain for _, chain in kv_out)))


# ---- keys and values ---------------------------------------------------------------------------
KV_VIEW_OPS = {aten.unsqueeze.default, aten.expand.default, aten.clone.default, aten.view.default,
               aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
               aten.transpose.int, aten.alias.default}


def kv_boundary(node, inside: set, sd):
    """Where the K/V graph stops for the attention's keys (or values) ``node``: walking back
    through views and copies (GQA's repeat_kv is unsqueeze, expand, clone, view), the narrowest
    tensor of the walk, the earliest of equal ones. The full-length K/V buffers, their fp32
    gradients and each chunk's prefix then hold only the distinct key/value heads; the query
    graph applies the rest of the walk per chunk (fused CPU attention skips the repeat).
    Returns (boundary, nodes after it up to ``node``: the key side of the query graph)."""
    walk, cur = [node], node
    while cur.op == "call_function" and cur.target in KV_VIEW_OPS:
        x = cur.args[0]
        if not isinstance(x, torch.fx.Node) or x not in inside or sd.seq_dim(x) is None or not sd.seq_is_atomic(x):
            break
        if [u for u in x.users if u in inside] != [cur]:
            break
        walk.append(x)
        cur = x
    best = min(range(len(walk)), key=lambda i: (walk[i].meta["val"].numel(), -i))
    return walk[best], frozenset(walk[:best])


# ---- masks built per chunk --------------------------------------------------------------------
# Ops a token-by-token mask may be built with inside a chunk: each output dim lines up with the
# same dim of every (broadcast) input, so a chunk of the mask is the op on chunks of its inputs.
MASK_VIEW_OPS = {aten.expand.default, aten.clone.default, aten.alias.default, aten._to_copy.default,
                 torch.ops.prims.convert_element_type.default, aten.where.self,
                 aten.masked_fill.Scalar, aten.masked_fill.Tensor}


@dataclasses.dataclass
class PulledMasks:
    nodes: list = dataclasses.field(default_factory=list)      # mask nodes recomputed per chunk
    frontier: dict = dataclasses.field(default_factory=dict)   # input -> (role "q"/"k"/None, dim)


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
              and (n.target in MASK_VIEW_OPS or is_pointwise(n.target))
              and all(_frontier_role(x, n, sd) is not False or can_pull(x) for x in n.all_input_nodes))
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
        for x in n.all_input_nodes:
            if "k" in sd.roles(x) and can_pull(x):
                stack.append(x)
            else:
                role = _frontier_role(x, n, sd)
                d = None if role is None else role[1]
                pulled.frontier.setdefault(x, (None if role is None else role[0], d))
    order = {n: i for i, n in enumerate(region.nodes[0].graph.nodes)}
    pulled.nodes = sorted(chosen, key=order.__getitem__)
    nodes = sorted(set(region.nodes) | chosen, key=order.__getitem__)
    inputs = [x for x in region.inputs if x not in chosen]
    inputs += [x for x in pulled.frontier if x not in inputs]
    return nodes, inputs, pulled


def _frontier_role(x, user, sd):
    """How an input ``x`` of a pulled mask node ``user`` is sliced per chunk: None (whole: no
    sequence dim), ("q", d) (rows [s, e) along dim d), ("k", d) (the key prefix [0, e) along d),
    or False when it cannot be sliced (it has both sequence dims itself, or a sequence dim that
    does not line up with one of the user's)."""
    v = x.meta.get("val")
    if not isinstance(v, torch.Tensor):
        return None
    axes = (sd.axes.get(x) or [None])[0]
    if axes is None:
        return False
    seq = [i for i, a in enumerate(axes) if sd.has_seq(a)]
    if not seq:
        return None
    if len(seq) > 1:
        return False
    out_roles = sd.roles(user)
    j = seq[0] + len(out_roles) - v.dim()
    if j < 0 or out_roles[j] not in ("q", "k"):
        return False
    return out_roles[j], seq[0]


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
                or x in requires_grad or "k" in sd.roles(x) or sd.seq_dim(x) is None):
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
            stack.extend(n.all_input_nodes)
        if stack or not chosen:
            continue
        roles = {f: _per_token_role(f, sd) for f in frontier}
        if any(r is False for r in roles.values()) or any(f in requires_grad for f in list(frontier) + list(chosen)):
            continue
        cost = sum(_bytes_per_token(f, sd) for f, r in roles.items() if r is not None)
        if cost >= _bytes_per_token(x, sd):
            continue
        chosen_all |= chosen
        new_frontier.update(roles)
    if not chosen_all:
        return nodes, inputs
    order = {n: i for i, n in enumerate(next(iter(chosen_all)).graph.nodes)}
    pulled.nodes = sorted(set(pulled.nodes) | chosen_all, key=order.__getitem__)
    for f, role in new_frontier.items():
        pulled.frontier.setdefault(f, role if role is not None else (None, None))
    nodes = sorted(set(nodes) | chosen_all, key=order.__getitem__)
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


def _bytes_per_token(n, sd) -> float:
    v = n.meta["val"]
    d = sd.seq_dim(n)
    return v.numel() * v.element_size() / max(1, v.shape[d])


AUTO_CHUNK_MIN, AUTO_CHUNK_MAX = 64, 512


def auto_chunk(T: int) -> int:
    """Automatic layer chunk: a quarter of the sequence, clamped to [64, 512] tokens.

    Larger chunks run faster (fewer, larger matmuls; less per-chunk work that scales with the
    key prefix: building the chunk's mask, repeating grouped K/V heads, zeroing dK/dV), which is
    why the paper uses T/3. Smaller chunks use less memory, and a chunk's working set grows
    with chunk x prefix (its mask, its attention gradients), so past 4 x 512 tokens the chunk
    stays at 512: memory per token stays flat as T grows."""
    return min(T, max(AUTO_CHUNK_MIN, min(AUTO_CHUNK_MAX, -(-T // 4))))


def _ancestors_within(targets, inside: set) -> set:
    seen, stack = set(), [t for t in targets if t in inside]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(x for x in n.all_input_nodes if x in inside)
    return seen

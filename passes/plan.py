"""The plan: which regions stream, with which chunk sizes, what is saved. Pure policy.

A ``RegionPlan`` is everything the rewrite needs for one region: its nodes, its inputs and how
a chunk reads each (``specs.Spec``), its outputs and how chunk results are put together, the
outputs it drops (the logits when a loss is computed and return_logits is False), and the
chunk size. Refusals raise CannotStream naming the node.
"""
from __future__ import annotations

import dataclasses

import torch

from streamfx.errors import CannotStream
from .graphs import ALIASES, ancestors, per_token
from .kv import kv_boundary
from .pulls import RANDOM_OPS, PulledMasks, pull_masks, pull_producers
from .seq_dims import CAUSAL_MIXING, SEQ_FREE, SEQ_REDUCTION, TOKEN_LOCAL
from .specs import SUM, WHOLE, Spec

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
    in_specs: list                    # Spec per input
    out_specs: list                   # Spec per output
    chunk_size: int
    length: int
    grad_inputs: list
    sd: object
    shared: frozenset = frozenset()   # nodes computed inside the region and also outside it

    @property
    def saved(self) -> list:
        """Per-token inputs the region keeps for its backward (those it slices per chunk)."""
        return [x for x, spec in zip(self.inputs, self.in_specs) if spec.sliced]

    def describe(self) -> str:
        n_chunks = -(-self.length // self.chunk_size)
        return (f"{self.name}: {n_chunks} chunk(s) of {self.chunk_size} tokens (T={self.length}); "
                f"saves {[x.name for x in self.saved]}; outputs {[f'{o.name}:{s.kind}' for o, s in zip(self.outputs, self.out_specs)]}"
                + (f"; drops {[d.name for d in self.dropped]}" if self.dropped else ""))


# ---- the head ------------------------------------------------------------------------------------
def plan_head(region, sd, classes, config, fwd: set, requires_grad=None, unsliced=frozenset()) -> RegionPlan:
    """``unsliced``: whole-sequence tensors whose slice the head computes itself (a moved slice)."""
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
            out_specs.append(SUM)
            continue
        d = sd.seq_dim(o)
        if d is None or "k" in sd.roles(o):
            raise CannotStream("a value leaves the head region without a sequence dim", o)
        if _reaches_only_outputs(o, fwd, inside) and not config.return_logits:
            dropped.append(o)
            continue
        outputs.append(o)
        out_specs.append(Spec.cat(d))
    if not config.return_logits:
        # the whole-sequence logits of a shifted loss (the head computes their slice itself)
        # follow the same convention: returned as None
        dropped += [n for n in unsliced if n in fwd and n not in inside and _reaches_only_outputs(n, fwd, inside)]
    in_specs, lengths = [], []
    for x in region.inputs:
        if not isinstance(x.meta.get("val"), torch.Tensor):
            raise CannotStream("symbolic sizes (dynamic shapes) are not streamed yet; "
                               "compile with dynamic=False", x)
        d = sd.seq_dim(x)
        if d is not None and "k" in sd.roles(x):
            raise CannotStream("an input of the head region has two sequence dims", x)
        in_specs.append(Spec.chunk(d) if d is not None else WHOLE)
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


def _reaches_only_outputs(node, fwd: set, inside: set) -> bool:
    """True if ``node`` leaves the region only as a graph output (possibly through alias/detach)."""
    users = [u for u in node.users if u in fwd and u not in inside]
    if not users:
        return any(u.op == "output" for u in node.users)
    return all(u.op == "output" or (u.target in ALIASES and _reaches_only_outputs(u, fwd, inside))
               for u in users)


def _auto_head_chunk(region, sd, T: int) -> int:
    """Chunk so that the widest per-token tensor of the head holds about HEAD_CHUNK_ELEMENTS values."""
    widths = [per_token(n, sd) for n in region.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    widest = max([w for w in widths if w != float("inf")] + [1])
    return max(16, min(T, HEAD_CHUNK_ELEMENTS // widest))


# ---- layers --------------------------------------------------------------------------------------
@dataclasses.dataclass
class LayerPlan(RegionPlan):
    site: object = None
    kv_nodes: list = dataclasses.field(default_factory=list)
    kv_outputs: tuple = ()       # the keys and values the K/V graph produces (see kv.kv_boundary)
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
        if cls == CAUSAL_MIXING and n not in site.nodes:
            raise CannotStream("token mixing outside the recognised attention site", n)
        if cls not in (TOKEN_LOCAL, SEQ_FREE, CAUSAL_MIXING):
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
        out_specs.append(Spec.cat(d))
    in_specs, lengths = [], []
    for x in inputs:
        v = x.meta.get("val")
        if not isinstance(v, torch.Tensor):
            raise CannotStream("symbolic sizes (dynamic shapes) are not streamed yet; compile with dynamic=False", x)
        roles = sd.roles(x)
        if x in pulled.frontier:
            spec = pulled.frontier[x]
        elif "k" in roles:
            spec = Spec.qk(roles.index("q"), roles.index("k"))
        elif "q" in roles:
            if not sd.seq_is_atomic(x):
                raise CannotStream("an input of the layer merges the sequence with another dim", x)
            spec = Spec.chunk(roles.index("q"))
        else:
            spec = WHOLE
        in_specs.append(spec)
        lengths += [v.shape[d] for d, _ in spec.seq_dims()]
    if any(not isinstance(t, int) for t in lengths) or len(set(lengths)) != 1:
        raise CannotStream(f"layer inputs disagree on a static sequence length ({lengths})")
    kv_out = tuple(kv_boundary(x, inside, sd) for x in (site.key, site.value))
    kv = ancestors({b for b, _ in kv_out}, within=inside)
    T = lengths[0]
    # mask inputs (token-by-token, or the per-token values a mask is built from) get no gradient
    grad_inputs = [i for i, x in enumerate(inputs) if in_specs[i].kind in ("chunk", "whole")
                   and x not in pulled.frontier and x.meta["val"].is_floating_point() and x.meta["val"].numel() > 0
                   and (requires_grad is None or x in requires_grad)]
    chunk = config.chunk_size or auto_chunk(T)
    return LayerPlan(region.name, "layer", nodes, inputs, outputs, [], in_specs, out_specs,
                     chunk, T, grad_inputs, sd, frozenset(pulled.nodes), site=site,
                     kv_nodes=[n for n in nodes if n in kv], kv_outputs=tuple(b for b, _ in kv_out),
                     key_side=frozenset().union(*(chain for _, chain in kv_out)))


AUTO_CHUNK_MIN, AUTO_CHUNK_MAX = 64, 512


def auto_chunk(T: int) -> int:
    """Automatic layer chunk: a quarter of the sequence, clamped to [64, 512] tokens.

    Larger chunks run faster (fewer, larger matmuls; less per-chunk work that scales with the
    key prefix: building the chunk's mask, repeating grouped K/V heads, zeroing dK/dV), which is
    why the paper uses T/3. Smaller chunks use less memory, and a chunk's working set grows
    with chunk x prefix (its mask, its attention gradients), so past 4 x 512 tokens the chunk
    stays at 512: memory per token stays flat as T grows."""
    return min(T, max(AUTO_CHUNK_MIN, min(AUTO_CHUNK_MAX, -(-T // 4))))

"""The plan: which regions stream, with which chunk sizes, what is saved. Pure policy.

A ``RegionPlan`` is everything the rewrite needs for one region: its nodes, its inputs and how
a chunk reads each (``specs.Spec``), its outputs and how chunk results are put together, the
outputs it drops (the logits when a loss is computed and return_logits is False), and the
chunk size. Refusals raise CannotStream naming the node.
"""
from __future__ import annotations

import dataclasses
import re

import torch

from streamfx.errors import CannotStream, op_name, source_line
from . import unit_axes
from .graphs import ALIASES, ancestors, hint, in_order, per_token, same
from .kv import kv_outputs, returned_chain
from .rules import COLLECTIVE, is_collective
from .positions import rebuild_positions
from .schedule import AUTO_CHUNK_RULE, auto_head_chunk, chunk_count, chunk_size
from .pulls import RANDOM_OPS, PulledMasks, keys_only, pull_created, pull_masks, pull_producers
from .seq_dims import CAUSAL_MIXING, SEQ_FREE, SEQ_REDUCTION, TOKEN_LOCAL, UNKNOWN_MIXING, seq_slice
from .specs import SUM, WHOLE, Spec, dim_order

aten = torch.ops.aten
SUM_OPS = (aten.sum.dim_IntList, aten.sum.default)

CACHE_OUTPUT = ("the attention's keys or values leave the layer in a form its K/V graph does not keep "
                "(a KV cache of what the keys are computed from: use_cache=True); training streams with "
                "use_cache=False (model.config.use_cache = False, or use_cache=False in the call)")
HEAD_SLICE = ("unknown-mixing op in the head region, a slice along the sequence that does not move in front of "
              "the head (a head streams one run of rows of one length, and each loss over its own run of rows "
              "is a head of its own; a value computed from two runs, as logits[:, 1:] - logits[:, :-1], is "
              "neither); where it shifts a loss, shift the labels instead and keep the per-token values whole: "
              "F.pad(labels, (0, n), value=-100)[:, n:] against them, with ignore_index=-100, as Hugging Face's "
              "loss does")
TOKEN_BY_TOKEN_OUTPUT = ("a [.., T, T] value leaves the layer, one entry per query and key (its attention "
                         "probabilities, as output_attentions=True returns them, or scores a later layer reads): "
                         "it exists whole for the whole sequence, so the layer runs unstreamed; call the model "
                         "with output_attentions=False (the default) for its layers to stream")


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
    chunk_size: int | None            # None: automatic, from the length at run time
    length: object                    # the sequence length (an int, or a SymInt)
    grad_inputs: list
    sd: object
    shared: frozenset = frozenset()   # nodes computed inside the region and also outside it
    # (output, flat index) of each scalar output element whose gradient the forward computes
    # (the head's loss sums), or None: the backward recomputes each chunk (see ``grad_seeds``)
    seeds: tuple | None = None
    # a head that streams as a map of rows (``regions._rows``): why its loss's sums do not
    rows: str | None = None

    @property
    def results(self) -> list:
        """Every value the region returns, in the region op's order: ``outputs``, then a layer's
        ``returned`` keys and values."""
        return list(self.outputs) + list(getattr(self, "returned", ()))

    def chunk_at(self, T: int) -> int:
        """Tokens per chunk at sequence length T."""
        return chunk_size(self.kind, T, self.chunk_size)

    @property
    def saved(self) -> list:
        """Per-token inputs the region keeps for its backward (those it slices per chunk)."""
        return [x for x, spec in zip(self.inputs, self.in_specs) if spec.sliced]

    def symbols(self) -> str:
        """The shape symbols of the region's inputs and what each one is: the sequence length, or
        the size of the model's input Dynamo bound it from (``input_ids.size(0)``)."""
        length = getattr(self.length, "node", None)
        seq = set(length.expr.free_symbols) if length is not None else set()
        found: dict = {}
        for x in self.inputs:
            v = x.meta.get("val")
            for d, size in enumerate(getattr(v, "shape", ())):
                for sym in getattr(getattr(size, "node", None), "expr", 0).free_symbols \
                        if not isinstance(size, int) else ():
                    role = "the sequence length" if sym in seq else \
                        _bound_from(size.node, sym) or ("the batch size" if d == 0 else "a size")
                    found.setdefault(sym, role)
        for sym in seq:
            found.setdefault(sym, "the sequence length")
        return ", ".join(f"{sym} ({role})" for sym, role in sorted(found.items(), key=lambda kv: str(kv[0]))) \
            or "no symbol"

    def describe(self, names: bool = True, budget: int | bool | None = None) -> str:
        """The schedule and what the region keeps; ``names``: the graph's node names (graph
        dumps, beside the graph), else what each tensor is to the user (``explain()``).
        ``budget``: where a memory budget sizes the chunks (``membudget.BudgetPolicy``), the
        chunk it chose at this length, or True where the length is symbolic (chosen per call)."""
        if isinstance(self.length, int):
            c = budget if budget is not None and not isinstance(budget, bool) else self.chunk_at(self.length)
            schedule = f"{chunk_count(self.length, c)} chunk(s) of {c} tokens (T={self.length})" \
                + (", sized by the memory budget" if budget is not None else "")
        else:
            c = "the largest size the memory budget fits at the call's length" if budget \
                else f"{self.chunk_size} tokens" if self.chunk_size else f"an automatic size ({AUTO_CHUNK_RULE})"
            schedule = (f"chunks of {c} (T={self.length}, symbolic: the schedule is computed per call; "
                        f"depends on {self.symbols()})")
        if not names:
            return f"{self.name}{self.module()}: {schedule}; {self._keeps()}" + \
                (f"; drops {len(self.dropped)} output(s) nothing reads (the logits)" if self.dropped else "") + \
                (f"; a map of rows up to its per-token values, read whole after it ({self.rows})" if self.rows else "")
        saves = (f"computes the gradients of {len(self.seeds)} output value(s) in the forward, keeps them "
                 f"instead of its inputs" if self.seeds is not None else f"saves {[x.name for x in self.saved]}")
        return (f"{self.name}: {schedule}; "
                f"{saves}; outputs {[f'{o.name}:{s.kind}' for o, s in zip(self.outputs, self.out_specs)]}"
                + (f"; drops {[d.name for d in self.dropped]}" if self.dropped else ""))

    def module(self) -> str:
        """`` (model.layers.3)``: the module the region's code is in, as the model names it."""
        from streamfx.memory import in_module

        return in_module(self.nodes)

    def _keeps(self) -> str:
        """What the region keeps for its backward, by role (``memory.saved_role``)."""
        from streamfx.memory import saved_role

        if self.seeds is not None:
            return (f"computes the gradients of {len(self.seeds)} output value(s) in the forward, keeps them "
                    f"instead of its inputs")
        roles: dict = {}
        for x, spec in zip(self.inputs, self.in_specs):
            if spec.sliced:
                role = saved_role(self, spec, x.meta.get("val"))
                roles[role] = roles.get(role, 0) + 1
        return "keeps " + (", ".join(f"{r}" + (f" (x{n})" if n > 1 else "") for r, n in roles.items()) or "nothing")


# ---- the head ------------------------------------------------------------------------------------
def plan_head(region, sd, classes, config, fwd: set, requires_grad=None, unsliced=frozenset()) -> RegionPlan:
    """``unsliced``: whole-sequence tensors whose slice the head computes itself (a moved slice)."""
    inside = set(region.nodes)
    for n in region.nodes:
        cls = classes[n]
        if cls not in (TOKEN_LOCAL, SEQ_FREE, SEQ_REDUCTION):
            if cls == UNKNOWN_MIXING and seq_slice(n, sd) is not None:
                raise CannotStream(HEAD_SLICE, n)
            raise unit_axes.refusal(n, sd) or CannotStream(
                f"{cls} op in the head region" + (f": {COLLECTIVE}" if is_collective(n.target) else ""), n)
        if cls == SEQ_REDUCTION:
            if n.target not in SUM_OPS:
                raise CannotStream("a reduction over the sequence that is not a sum", n)
            if any(u in inside for u in n.users):
                raise CannotStream("a sum over the sequence is used again inside the head region", n)
    reductions = [n for n in region.nodes if classes[n] == SEQ_REDUCTION]
    if not reductions and region.unreduced is not None:   # (else a map of rows: ``regions._rows``)
        values, leaves, selector = region.unreduced
        if leaves:
            raise CannotStream("the head computes no reduction over the sequence (no loss in the graph): the logits "
                               "leave the graph whole and the loss is computed outside it; for the head to stream, "
                               "compute the loss in the compiled code (pass labels to a Hugging Face model, or "
                               "compile a function that returns the loss)", values)
        if selector is not None:
            where = f"{op_name(values)}{source_line(values)}"
            raise CannotStream(f"the head computes per-token values wider than the hidden state for the whole "
                               f"sequence ({where}) and its loss reads selected tokens of them (no sum over the "
                               f"tokens to stream): they exist whole; select the tokens before the projection "
                               f"that widens them (e.g. hidden[:, -1] before the LM head, not logits[:, -1] "
                               f"after it)", selector)
        raise CannotStream("the head computes per-token values wider than the hidden state for the whole sequence "
                           "and no sum over the tokens of them that streamfx recognises as a loss (a sum of "
                           "per-token terms): they exist whole", values)
    outputs, out_specs, dropped = [], [], []
    width = per_token(region.entry, sd)

    def wide(n):
        return per_token(n, sd) > width

    for o in region.outputs:
        if classes[o] == SEQ_REDUCTION:
            outputs.append(o)
            out_specs.append(SUM)
            continue
        d = sd.seq_dim(o)
        if d is None or "k" in sd.roles(o):
            raise CannotStream("a value leaves the head region without a sequence dim", o)
        # logits-like outputs (wider per token than the hidden state the head starts from) are
        # dropped; per-token results (log-probs, entropy) stay outputs
        if _reaches_only_outputs(o, fwd, inside) and not config.return_logits and wide(o):
            dropped.append(o)
            continue
        merged = _merged(o, sd)
        if merged == "none":
            raise CannotStream("a value leaves the head region without a plain sequence dim (nor one that "
                               "merges the sequence with one other dim)", o)
        outputs.append(o)
        out_specs.append(Spec.cat(d, merged))   # (per-token losses flattened to [B*T]: merged)
    if not config.return_logits:
        # the whole-sequence logits of a shifted loss (the head computes their slice itself)
        # follow the same convention: returned as None
        dropped += [n for n in unsliced if n in fwd and n not in inside and _reaches_only_outputs(n, fwd, inside)]
    in_specs, lengths = [], []
    for x in region.inputs:
        d = sd.seq_dim(x)
        if d is not None and "k" in sd.roles(x):
            raise CannotStream("an input of the head region has two sequence dims", x)
        spec = _chunk_spec(x, sd, "head") if d is not None else WHOLE
        in_specs.append(spec)
        if d is not None and spec.merged is None:
            lengths.append((x, x.meta["val"].shape[d]))
    T = _one_length(lengths, "head")
    grad_inputs = [i for i, x in enumerate(region.inputs) if x.meta["val"].is_floating_point()
                   and _nonempty(x) and (requires_grad is None or x in requires_grad)]
    chunk = config.head_chunk_size or _auto_head_chunk(region, sd)
    seeds = grad_seeds(outputs, out_specs, requires_grad, config.head_grad) if grad_inputs else None
    return RegionPlan(region.name, "head", region.nodes, region.inputs, outputs, dropped, in_specs,
                      out_specs, chunk, T, grad_inputs, sd, region.shared, seeds=seeds,
                      rows=None if reductions else "no sum over the tokens in the graph")


MAX_SEEDS = 64  # head_grad="forward": at most this many output values get their gradients in the forward


def grad_seeds(outputs, out_specs, requires_grad, mode: str):
    """The output values whose gradients the head computes in its forward pass, or None where its
    backward recomputes the chunks.

    A head whose outputs that carry a gradient are sums over the sequence (a loss, its numerator;
    per-row sums) can compute, per chunk, the gradient of each sum's value with respect to its
    inputs (the hidden state's rows and the head's weights) right after the chunk's forward, and
    keep those: one logits product per chunk instead of two, and its input is not kept. Each value
    costs one backward per chunk, so it pays where one value carries a gradient ("auto": a
    1-element loss), and ``head_grad="forward"`` asks for it with up to ``MAX_SEEDS`` values.
    A per-token output with a gradient (log-probs) needs the backward's own gradient per token:
    the chunks are recomputed."""
    if mode == "recompute":
        return None
    seeds = []
    for j, (o, spec) in enumerate(zip(outputs, out_specs)):
        v = o.meta.get("val")
        if not (isinstance(v, torch.Tensor) and v.is_floating_point()) or \
                (requires_grad is not None and o not in requires_grad):
            continue
        n = v.numel()
        if spec.kind != "sum" or not isinstance(n, int):
            return None
        seeds += [(j, k) for k in range(n)]
    if not seeds or len(seeds) > (1 if mode == "auto" else MAX_SEEDS):
        return None
    return tuple(seeds)


def _reaches_only_outputs(node, fwd: set, inside: set) -> bool:
    """True if ``node`` leaves the region only as a graph output (possibly through alias/detach)."""
    users = [u for u in node.users if u in fwd and u not in inside]
    if not users:
        return any(u.op == "output" for u in node.users)
    return all(u.op == "output" or (u.target in ALIASES and _reaches_only_outputs(u, fwd, inside))
               for u in users)


def _auto_head_chunk(region, sd) -> int:
    """Chunk so that the widest per-token tensor of the head holds about HEAD_CHUNK_BYTES
    (``schedule.auto_head_chunk``)."""
    widths = [per_token(n, sd, nbytes=True) for n in region.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    return auto_head_chunk(max([w for w in widths if w != float("inf")] + [1]))


def _one_length(lengths: list, what: str):
    """The one sequence length the (input, length) pairs share. Their sequence dims are one axis
    (the analysis unified them), so two different symbols (Dynamo gives each input's dim its
    own) are equal at run time, where the runtime checks it; two different constants refuse."""
    if not lengths:
        raise CannotStream(f"no input of the {what} region has the sequence")
    first = lengths[0][1]
    for x, n in lengths[1:]:
        if isinstance(n, int) and isinstance(first, int) and n != first:
            raise CannotStream(f"{what} inputs disagree on the sequence length ({first} and {n})", x)
    return first


def _merged(node, sd) -> str | None:
    """None for a plain sequence dim; "inner" for a dim that merges other axes in front of the
    sequence ([B*T]: rows of one batch element together), "outer" for one that merges them
    behind it ([T*B]); "none" where the sequence sits between two (not written per chunk)."""
    if sd.seq_is_atomic(node):
        return None
    atoms = sd.axes[node][0][sd.seq_dim(node)]
    where = [i for i, a in enumerate(atoms) if sd.has_seq((a,))]
    if len(where) != 1:
        return "none"
    return "inner" if where[0] == len(atoms) - 1 else "outer" if where[0] == 0 else "none"


def _chunk_spec(x, sd, what: str) -> Spec:
    """How a region reads an input with query rows: rows [s, e) of its sequence dim, or of the
    sequence within a dim that merges it with another (``[B*T, E]``: Phi-3.5-MoE's router noise,
    drawn flat), read per chunk as ``[B*c, E]`` (a row-major copy: an input laid out in another
    order is refused), its gradient written back the same way."""
    d = sd.seq_dim(x)
    merged = _merged(x, sd)
    if merged is None:
        return Spec.chunk(d)
    v = x.meta["val"]
    if merged == "none" or dim_order([hint(n) for n in v.shape], [hint(n) for n in v.stride()]) is not None:
        raise CannotStream(f"an input of the {what} merges the sequence with another dim"
                           + ("" if merged == "none" else " and is laid out in another order than its dims'"), x)
    return Spec.chunk(d, merged)


def _nonempty(x) -> bool:
    return not same(x.meta["val"].numel(), 0)


# ---- layers --------------------------------------------------------------------------------------
@dataclasses.dataclass
class LayerPlan(RegionPlan):
    sites: tuple = ()            # the layer's attention sites (several: DiffLlama's two calls)
    kv_nodes: list = dataclasses.field(default_factory=list)
    kv_outputs: tuple = ()       # what the K/V graph produces: keys and values, or MLA's latent (see kv)
    key_side: frozenset = frozenset()  # nodes between those and the attention's keys/values
    kv_latent: bool = False      # the K/V graph ends before the keys and values (a narrower cut)
    # causal convolutions in the K/V graph (keys convolved before the scores): a chunk's K/V graph
    # reads this many rows before its own, by ``kv_specs`` (None: ``in_specs``)
    kv_reach: int = 0
    kv_specs: list | None = None
    kv_convs: tuple = ()         # the causal convolutions only the K/V graph computes (``kv.inner_convs``)
    key_terms: tuple = ()        # (broadcasting op, term) per key the K/V graph computes (``kv.per_key_terms``)
    # K/V graph outputs that leave the layer too (a KV cache returned to the caller: use_cache=True),
    # returned after ``outputs`` from the full-length buffers the K/V graph writes
    returned: tuple = ()
    returned_from: dict = dataclasses.field(default_factory=dict)  # returned -> (K/V output, view nodes to it)
    unpulled: "LayerPlan | None" = None   # the same plan with its masks as token-by-token inputs

    def describe(self, names: bool = True, budget: int | bool | None = None) -> str:
        text = super().describe(names, budget)
        if len(self.sites) > 1:
            text += f"; {len(self.sites)} attention sites ({', '.join(f'#{s.index}' for s in self.sites)})"
        if self.kv_outputs:
            width = sum(per_token(x, self.sd) for x in dict.fromkeys(self.kv_outputs))
            what = [x.name for x in self.kv_outputs] if names else f"{len(dict.fromkeys(self.kv_outputs))} tensor(s)"
            text += (f"; K/V graph keeps {what} ({width:g} values per position)"
                     + (", a latent the keys and values are computed from per chunk" if self.kv_latent else ""))
        if self.returned:
            text += (f"; returns {[x.name for x in self.returned] if names else f'{len(self.returned)} tensor(s)'} "
                     "of its K/V graph too (a KV cache: use_cache=True)")
        if self.kv_reach:
            text += (f"; the K/V graph convolves or shifts the rows: each chunk's runs over its own rows and the "
                     f"{self.kv_reach} before them")
        if self.sites and all(s.kind == "conv" for s in self.sites):
            text += (f"; causal convolution: a chunk reads its own rows and the "
                     f"{max(s.reach for s in self.sites)} before them")
        masked = [s.mask_kind for s in self.sites if s.mask is not None]
        if masked:
            text += (f"; keys per chunk: those its rows may see under the mask ({', '.join(dict.fromkeys(masked))}), "
                     "read from the mask per call")
            if any(s.mask_checked_per_call for s in self.sites):
                text += "; a call whose mask is exactly causal runs the kernel's causal attention without it"
        return text


# Why an op of each class refuses its layer (``plan_layer``): what the user reads beside the op.
_INSIDE_A_LAYER = {
    UNKNOWN_MIXING: "it combines positions along the sequence other than through the layer's causal attention "
                    "(a shift, a prefix sum, a convolution or a sort), which no rule computes per chunk of tokens",
    SEQ_REDUCTION: "it reduces over the tokens in the forward (a sum or mean over the sequence, such as an "
                   "auxiliary loss computed inside the layer), which no chunk computes from its own rows",
}


CONV_OPS = (aten.convolution.default, aten.constant_pad_nd.default)
CONV_ADVICE = ("make a convolution along the sequence causal (1-D, stride 1, padded on the left only: "
               "F.pad(x, ((k - 1) * dilation, 0)) before it, or padding=(k - 1) * dilation and its output cut to "
               "the first T rows), which streams")


def plan_layer(region, sd, classes, config, fwd: set, requires_grad=None) -> LayerPlan:
    """A layer region streams when all its ops are token-local except its causal attention
    sites (one or more: every site reads keys from the same prefix of each chunk)."""
    sites = tuple(region.attention)
    if not sites:
        raise CannotStream("a layer region with no attention site")
    for site in sites:
        _check_site(site)
    if len({s.mask is None for s in sites if s.kind != "conv"}) > 1:
        # a chunk reads one key range for all its sites: a masked site may widen it, which the
        # causal alignment of an unmasked site (keys [0, e)) does not allow
        raise CannotStream("attention sites with and without a mask in one layer", sites[-1].output)
    site_nodes = frozenset().union(*(s.nodes for s in sites))
    for n in region.nodes:
        if n.target in RANDOM_OPS:
            raise CannotStream("random op (dropout) whose randomness the chunked recomputation cannot replay", n)
        cls = classes[n]
        if cls == CAUSAL_MIXING and n not in site_nodes:
            raise CannotStream("token mixing outside the recognised attention sites", n)
        if cls not in (TOKEN_LOCAL, SEQ_FREE, CAUSAL_MIXING):
            why = COLLECTIVE if is_collective(n.target) else \
                _INSIDE_A_LAYER.get(cls, "no rule computes its rows per chunk of tokens")
            raise unit_axes.refusal(n, sd) or CannotStream(
                f"{cls} op inside a layer: {why}"
                "; this layer runs unstreamed, the other regions stream as they can; to stream it, "
                + (CONV_ADVICE if n.target in CONV_OPS else "compute the op outside the decoder layers or per token")
                + ". The op", n)
    nodes, inputs, pulled = pull_masks(region, sd)
    nodes, inputs = pull_producers(nodes, inputs, pulled, sd, classes, requires_grad)
    nodes, inputs = rebuild_positions(region.nodes, *pull_created(nodes, inputs, sd), sd)
    plan = _layer_plan(region, sd, config, sites, nodes, inputs, pulled, requires_grad)
    if pulled.nodes:  # the rewrite uses this one if the masks do not rebuild per chunk
        unpulled = rebuild_positions(region.nodes, *pull_created(region.nodes, region.inputs, sd), sd)
        plan.unpulled = _layer_plan(region, sd, config, sites, *unpulled, PulledMasks(), requires_grad)
    return plan


def _check_site(site) -> None:
    if site.dropout is not None:
        p = site.dropout if isinstance(site.dropout, (int, float)) else "a traced value"
        raise CannotStream(f"fused attention with dropout (dropout_p={p}): the kernel draws its random mask "
                           "inside, and a chunk's recomputation cannot replay it; set the attention's dropout to "
                           "0 (attention_dropout=0.0 in a Hugging Face config, as long-context training does), "
                           "or apply dropout to the probabilities outside the kernel (attention written out, "
                           "such as attn_implementation=\"eager\"), whose random mask is drawn once and read "
                           "per chunk", site.output)
    if site.conflict:
        raise CannotStream(site.conflict, site.mask_user)
    if not site.is_causal and not site.softmax:
        raise CannotStream("token mixing by scores that multiply the values with no softmax (linear "
                           "attention or a state-space scan over blocks of the sequence), whose pattern is "
                           "not causal attention's", site.output)
    if not site.is_causal:
        raise CannotStream(site.mask_note or "attention that is not causal mixes every token with every other",
                           site.output)


def _layer_plan(region, sd, config, sites, nodes, inputs, pulled, requires_grad=None) -> LayerPlan:
    kv_out, key_side, latent, kv_convs, key_terms = kv_outputs(sites, set(nodes), inputs, region.outputs, sd,
                                                               config.kv_boundary)
    for _, term in key_terms:
        if not term.meta["val"].is_floating_point():
            from streamfx.memory import base_of

            # (a bias per key only adds to the scores; which keys a selection hides decides the keys
            # a chunk reads, and that is known only once the layer has computed it for every key)
            raise CannotStream("the mask hides keys by a selection per key that the layer computes from its own "
                               "activations: which keys a chunk's queries see is known only after the layer has "
                               "run over every key; compute the selection before the layers (from the model's "
                               "inputs or its embeddings: read as data at every call) or add a bias per key instead",
                               base_of(term))   # (the op that selects, not its views)
    rebuilt = [x for x in inputs if x in key_side]  # made from sizes, rebuilt at the prefix's length
    if rebuilt:
        nodes, inputs = in_order(list(nodes) + rebuilt), [x for x in inputs if x not in rebuilt]
    inside = set(nodes)
    kv = ancestors(set(kv_out), within=inside)
    for site in sites:
        if kv & site.nodes and site.kind != "conv":
            # the K/V graph runs per chunk of rows (and the rows a causal convolution in it reads
            # before them): attention in it would read keys before them
            raise CannotStream("the keys or values of the layer's attention are computed by another of its "
                               "attention calls (an attention's output convolved or attended again)", site.output)
    kv_reach = _reach(kv, [s for s in sites if s.kind == "conv" and kv & s.nodes])
    outputs, out_specs, returned = [], [], {}
    for o in region.outputs:
        if o in kv or o in key_side:
            # keys or values the caller gets too (a KV cache): from the K/V graph's buffer
            chain = returned_chain(o, kv_out, key_side) if sd.seq_dim(o) is not None else None
            if chain is None:
                raise CannotStream(CACHE_OUTPUT, o)
            returned[o] = chain
            continue
        if "k" in sd.roles(o):
            raise CannotStream(TOKEN_BY_TOKEN_OUTPUT, o)
        d = sd.seq_dim(o)
        merged = _merged(o, sd) if d is not None else "none"
        if merged == "none":
            raise CannotStream("a value leaves the layer without a plain sequence dim (nor one that "
                               "merges the sequence with one other dim)", o)
        outputs.append(o)
        out_specs.append(Spec.cat(d, merged))
    in_specs, lengths = [], []
    for x in inputs:
        v = x.meta.get("val")
        roles = sd.roles(x)
        if x in pulled.frontier:
            spec = pulled.frontier[x]
        elif "k" in roles:
            spec = Spec.qk(roles.index("q"), roles.index("k"))
        elif "q" in roles and keys_only(x, inside, sd):
            if requires_grad is not None and x in requires_grad:
                raise CannotStream("a per-key input of the attention scores needs a gradient", x)
            if not sd.seq_is_atomic(x):   # (keys [lo, ke) are read as one range of the dim)
                raise CannotStream("a per-key input of the attention scores merges the sequence with another dim", x)
            spec = Spec.prefix(roles.index("q"))
        elif "q" in roles:
            spec = _chunk_spec(x, sd, "layer")
        else:
            spec = WHOLE
        in_specs.append(spec)
        lengths += [(x, v.shape[d]) for d, _ in spec.seq_dims() if spec.merged is None]
    T = _one_length(lengths, "layer")
    # every input the joint differentiates gets its gradient, mask and score inputs included (a
    # learned bias, slope or temperature): rows of the chunk, [rows, keys] blocks of a
    # token-by-token input, or the whole input, accumulated over chunks
    grad_inputs = [i for i, x in enumerate(inputs) if x.meta["val"].is_floating_point() and _nonempty(x)
                   and (requires_grad is None or x in requires_grad)]
    for i in grad_inputs:
        if in_specs[i].kind == "prefix":
            raise CannotStream("a per-key input of the attention scores needs a gradient", inputs[i])
    kv_specs = _halo_specs(inputs, in_specs, kv) if kv_reach else None
    return LayerPlan(region.name, "layer", nodes, inputs, outputs, [], in_specs, out_specs,
                     config.chunk_size, T, grad_inputs, sd, frozenset(pulled.nodes), sites=sites,
                     kv_nodes=[n for n in nodes if n in kv], kv_outputs=kv_out, key_side=key_side,
                     kv_latent=latent, returned=tuple(returned), returned_from=returned, kv_reach=kv_reach,
                     kv_specs=kv_specs, kv_convs=kv_convs, key_terms=key_terms)


def _reach(kv: set, convs) -> int:
    """How many rows before its own a row of the K/V graph's outputs reads through the causal
    convolutions in it (``convs``): the most, over every path, of their reaches added up."""
    if not convs:
        return 0
    out_of = {site.output: site.reach for site in convs}
    reach: dict = {}
    for n in in_order(kv):
        reach[n] = max((reach.get(x, 0) for x in n.all_input_nodes), default=0) + out_of.get(n, 0)
    return max(reach.values())


def _halo_specs(inputs, in_specs, kv: set) -> list:
    """The specs the K/V graph reads its inputs by when causal convolutions in it read rows
    before a chunk's: rows [lo, e) (``Spec.prefix``) of every per-row input, the rest as they are.
    An input whose sequence is merged with another dim, or a token-by-token one, is refused."""
    specs = []
    for x, spec in zip(inputs, in_specs):
        used = any(u in kv for u in x.users)
        if used and (spec.merged is not None or spec.kind == "qk"):
            raise CannotStream("the keys or values are convolved along the sequence from an input that "
                               + ("merges the sequence with another dim" if spec.merged else "is token by token"), x)
        specs.append(Spec.prefix(spec.dim) if spec.kind == "chunk" else spec)
    return specs


def _bound_from(node, sym) -> str | None:
    """The input size Dynamo bound a shape symbol from, as the user names it
    (``L['kwargs']['input_ids'].size()[0]``: ``input_ids.size(0)``); None where it has none."""
    env = getattr(node, "shape_env", None)
    for source in (getattr(env, "var_to_sources", None) or {}).get(sym, ()):
        name = str(source.name() if callable(getattr(source, "name", None)) else getattr(source, "name", ""))
        # (a positional argument: args[0])
        found = re.search(r"\['(\w+)'\]\[(\d+)\]\.size\(\)\[(\d+)\]$", name)
        if found:
            return f"{found.group(1)}[{found.group(2)}].size({found.group(3)})"
        found = re.search(r"\['([^'\]]+)'\]\.size\(\)\[(\d+)\]$", name)
        if found:
            return f"{found.group(1)}.size({found.group(2)})"
    return None

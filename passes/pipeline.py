"""The pass pipeline over an AOTAutograd joint graph, in one function: ``run``.

    analyse      seq dims, attention sites, regions, node classes (pure)
    decide       a plan per region that streams, a refusal (op, source line) per one that does not (pure)
    move slices  a shifted loss's slice of the logits moved in front of the head (on a copy)
    stream       streamed regions become ``streamfx::region`` calls; the joint is re-derived

Each step that changes a graph dumps it (``dump``) and, under ``STREAMFX_VERIFY=1``, checks it.
"""
from __future__ import annotations

import dataclasses
import warnings

import torch
import torch.fx as fx

from streamfx import offload
from streamfx.errors import CannotStream
from . import attention as attn, hoist, masks, verify
from .graphs import (ancestors, is_tangent, is_tensor, node_inputs, normalize_dim, outputs as graph_outputs,
                     per_token, primals, val, wider, written_input)
from .plan import CONV_ADVICE, CONV_OPS, plan_head, plan_layer
from .pulls import RANDOM_OPS
from .record import NodeRecord, tag
from .regions import find_regions
from .rewrite import CONV_ROWS, CONV_TAPS, RegionFailed, dropped_outputs, stream_joint
from .seq_dims import SEQ_REDUCTION, UNKNOWN_MIXING, infer_axes
from .sources import seed_sequence
from .units import projects

aten = torch.ops.aten

MAX_MOVES = 4  # sequence slices moved in front of the head, at most


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
    notes: list = dataclasses.field(default_factory=list)      # (region name, CannotStream): streams, but...
    # (region name, CannotStream): a head that cannot stream and holds nothing wider per token than
    # the hidden state it starts from (a question-answering head's two logits per token): run whole
    # at no cost in memory, said by explain() only
    whole: list = dataclasses.field(default_factory=list)
    programs: list = dataclasses.field(default_factory=list)   # (plan, runtime program) after the rewrite
    requires_grad: frozenset = frozenset()                      # forward nodes that get a gradient
    moved: list = dataclasses.field(default_factory=list)      # hoist.MovedSlice: slices moved before the head
    dropped: set = dataclasses.field(default_factory=set)      # forward outputs returned as None
    stores: list = dataclasses.field(default_factory=list)     # offload.StorePlan: layer inputs offloaded or rebuilt

    @property
    def unsliced(self) -> frozenset:
        """Whole-sequence tensors whose slice the head computes itself (moved slices)."""
        return frozenset(m.unsliced for m in self.moved)

    @property
    def seq_len(self):
        """The sequence length: a streamed layer's, else the attention's queries', else a
        streamed head's (which may stream a run of it: a shifted loss's T - 1)."""
        for p in self.plans:
            if p.kind == "layer":
                return p.length
        for s in self.sites:
            atoms = _query_axis(s, self.sd) if s.kind != "conv" else ()
            # (queries merged with other axes in one dim: the size of the axis the keys run along)
            return self.sd.table.size[atoms[0]] if len(atoms) == 1 else s.query.meta["val"].shape[s.seq_dim]
        for p in self.plans:
            return p.length
        return None

    def unknown_mixing(self) -> list:
        return [n for n in self.fwd_nodes if self.classes.get(n) == UNKNOWN_MIXING]


def run(joint: fx.GraphModule, num_fwd_outputs: int, config, constants: dict | None = None,
        dump=None, planned=None) -> tuple[fx.GraphModule, Analysis]:
    """The whole pipeline. Returns the joint graph to partition (streamed, or the input one where
    nothing streams) and the analysis of the graph the rewrite started from, with its plans,
    refusals, programs and dropped outputs. ``constants``: real values of the inputs that are
    parameters or buffers. ``dump(step, gm, analysis, programs=())`` is called after each step
    that changed a graph. ``planned(dropped)``: called before the rewrite with the forward
    outputs the plans drop (``rewrite.dropped_outputs``, the rewrite's own rule; none where nothing
    streams); it may raise to stop here (the backend then traces the graph again with those
    outputs detached, and the rewrite runs once)."""
    dump = dump or (lambda *args, **kwargs: None)
    a = analyze(joint.graph, num_fwd_outputs, constants)
    decide(a, config)
    dump("joint", joint, a)
    # a slice of the logits blocks the head; moved in front of it on a copy, kept if the head streams
    joint, a = move_slices(joint, a, config, constants)
    if a.moved:
        dump("moved", joint, a)
    fwd_outs = graph_outputs(joint.graph)[:num_fwd_outputs]
    dropped = dropped_outputs(fwd_outs, a.plans)
    if planned is not None:
        planned(dropped)
    while a.plans:
        try:
            streamed = stream_joint(joint, num_fwd_outputs, a.fwd_nodes, a.plans, config.codegen,
                                    storage=offload.Options.of(config), attention=config.attention,
                                    inductor=config.inductor_patches)
            break
        except RegionFailed as err:
            # that region runs unstreamed and the others stream, where the outputs dropped stay
            # those the graph was traced for (a layer drops none; a head drops the logits)
            rest = [p for p in a.plans if p is not err.plan]
            if dropped_outputs(fwd_outs, rest) != dropped:
                a.refusals.append(("all", err.error))
                a.plans = []
                return joint, a
            a.refusals.append((err.plan.name, err.error))
            a.plans = rest
        except CannotStream as err:
            a.refusals.append(("all", err))
            a.plans = []
            return joint, a
    if not a.plans:
        return joint, a
    for _, program in streamed.programs:  # a chunk that fails at run time raises under strict
        program.strict = config.strict
        if getattr(program, "keep_refused", None):
            warnings.warn(f"streamfx: attention='keep' keeps nothing of region '{program.name}': "
                          f"{program.keep_refused}; its backward recomputes the attention", stacklevel=2)
    a.plans = [p for p, _ in streamed.programs]
    a.programs, a.dropped, a.stores = streamed.programs, streamed.dropped, streamed.stores
    dump("streamed", streamed.joint, None, programs=streamed.programs)
    return streamed.joint, a


def split_joint(graph: fx.Graph, num_fwd_outputs: int):
    """Forward nodes (needed by the forward outputs, independent of tangents) and the rest."""
    fwd_outs = [o for o in graph_outputs(graph)[:num_fwd_outputs] if isinstance(o, fx.Node)]
    tangent_dep = set()
    for n in graph.nodes:
        if is_tangent(n) or any(x in tangent_dep for x in n.all_input_nodes):
            tangent_dep.add(n)
    # an input mutation AOTAutograd keeps in the graph (a buffer updated in place: a step
    # counter, running statistics) is a forward root of its own: it has no users
    mutations = [n for n in graph.nodes if n.op == "call_function" and n not in tangent_dep
                 and written_input(n) is not None]
    needed, stack = set(fwd_outs) | set(mutations), list(fwd_outs) + mutations
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
    ps = primals(graph)
    grads = graph_outputs(graph)[num_fwd_outputs:]
    if len(grads) != len(ps):
        return frozenset(fwd)
    out = {p for p, g in zip(ps, grads) if g is not None}
    for n in fwd:
        v = n.meta.get("val")
        # (an op with several outputs, fused attention, has a tuple value: its getitems follow)
        vals = v if isinstance(v, (tuple, list)) else [v]
        if n.op == "call_function" and any(isinstance(t, torch.Tensor) and t.is_floating_point() for t in vals) \
                and any(x in out for x in n.all_input_nodes):
            out.add(n)
    return frozenset(out)


def _query_axis(site, sd) -> tuple:
    """The atoms of a site's query dim; where it merges the sequence with other axes (grouped
    heads' queries as ``[b x g, r x T, d]``), the one of them the keys run along."""
    atoms = sd.table.canon(sd.axes[site.query][0][-2])
    if len(atoms) <= 1:
        return atoms
    keys = {d[0] for d in map(sd.table.canon, sd.axes[site.key][0]) if len(d) == 1}
    along = [a for a in atoms if a in keys]
    return (along[-1],) if len(along) == 1 else atoms


def analyze(graph: fx.Graph, num_fwd_outputs: int, constants: dict | None = None) -> Analysis:
    """Step 1, pure: sequence dims, attention sites and their masks, regions, node classes.
    ``constants``: real values of graph inputs that are parameters or buffers (masks built from
    a buffer are evaluated with it)."""
    fwd, bwd, fwd_outs = split_joint(graph, num_fwd_outputs)
    sd = infer_axes(graph)
    sites = attn.find_sites(graph, sd, set(fwd))
    # the sequence is the query axis of the attention (none when a sequence has one token)
    attention = [s for s in sites if s.kind != "conv"]
    atoms = [_query_axis(s, sd) for s in attention]
    seed = seed_sequence(graph, sd)
    # (where a site's queries lie along the axis of the loss's per-token targets, that one: an
    # encoder-decoder's decoder, whose tokens the loss is over; else along the token ids' axis:
    # a site found inside a linear attention's blocks, whose "queries" are positions within a
    # block, comes first)
    for axis in (seed_sequence(graph, sd, "loss") if attention else None, seed):
        along = [a for a in atoms if a and axis is not None and sd.table.find(a[-1]) == sd.table.find(axis)]
        if along:
            atoms = along
            break
    sd.set_seq(atoms[0][-1] if atoms and atoms[0] else None if attention else seed)
    # causal convolutions along the sequence (one along another dim mixes no tokens)
    sites = [s for s in sites if s.kind != "conv" or sd.has_seq(sd.axes[s.key][0][s.seq_dim])]
    for i, s in enumerate(sites):
        s.index = i
        if s.kind == "conv":   # (the rows of its output a copy of it keeps: rewrite._conv_rows)
            s.output.meta[CONV_ROWS] = s.trim or (s.seq_dim, 0)
            for n in s.nodes:
                n.meta[CONV_TAPS] = True
        else:
            masks.classify(s, constants or {}, s.query.meta["val"].shape[-2])
    site_nodes = frozenset().union(*(s.nodes for s in sites)) if sites else frozenset()
    classes = {n: sd.classify(n, site_nodes) for n in graph.nodes if n.op in ("call_function", "placeholder", "get_attr")}
    requires_grad = differentiable(graph, num_fwd_outputs, fwd)
    regions = find_regions(fwd, sd, sites, fwd_outs, classes, requires_grad)
    analysis = Analysis(graph, num_fwd_outputs, fwd, bwd, sd, sites, classes, regions, requires_grad=requires_grad)
    _record(analysis)
    verify.analysis(analysis)
    return analysis


def _record(a: Analysis) -> None:
    """Each node's analysis record: its dims, class, part, region and attention site."""
    region_of = {n: r.name for r in a.regions for n in r.nodes}
    site_of = {n: s.index for s in a.sites for n in s.nodes}
    fwd = set(a.fwd_nodes)
    for n, cls in a.classes.items():
        tag(n, NodeRecord(dims=a.sd.roles(n), cls=cls, part="forward" if n in fwd else "backward",
                          region=region_of.get(n), attention=site_of.get(n)))


def decide(a: Analysis, config) -> list:
    """Step 2, pure: plans for the regions that stream; refusals recorded (with the responsible node)."""
    plans = []
    fwd = set(a.fwd_nodes)
    for i, r in enumerate(a.regions):
        try:
            if r.kind == "head":
                plans.append(_plan_head(a, i, config, fwd))
            else:
                plans.append(plan_layer(r, a.sd, a.classes, config, fwd, a.requires_grad))
        except CannotStream as e:
            (a.whole if r.kind == "head" and _narrow(r, a.sd) else a.refusals).append((r.name, e))
    a.plans = plans
    _coverage(a)
    verify.analysis(a)
    return plans


def _plan_head(a: Analysis, i: int, config, fwd: set):
    """The head's plan: over its sums, or where those do not stream, as the map of rows its
    region also holds (``regions._rows``), which then takes its place; else the refusal of its
    sums."""
    region = a.regions[i]
    try:
        return plan_head(region, a.sd, a.classes, config, fwd, a.requires_grad, a.unsliced)
    except CannotStream as refused:
        if region.rows is None:
            raise
        try:
            plan = plan_head(region.rows, a.sd, a.classes, config, fwd, a.requires_grad, a.unsliced)
        except CannotStream:
            raise refused from None
        plan.rows = f"its sums over the tokens do not stream: {refused.describe()}"
    a.regions[i] = region.rows
    _record(a)
    return plan


def _narrow(region, sd) -> bool:
    """Whether no value of the region is wider per token than the hidden state it starts from:
    streaming it would keep nothing from existing whole that the layers' outputs do not match."""
    if region.unreduced is not None:   # (a head without a loss over wider values: the logits)
        return False
    floor = per_token(region.entry, sd)
    return not any(wider(n, sd, floor) for n in region.nodes)


def _reductions_back_on_tokens(a: Analysis, regions: set) -> list:
    """Sums over the sequence outside every region whose result comes back onto the tokens
    (a product of scores with values that no attention site claimed, a pooled context added to
    each token): token mixing. A loss's sums end in a scalar and are left out."""
    on_tokens: dict = {}
    for n in reversed(a.fwd_nodes):
        on_tokens[n] = (n.op == "call_function" and bool(a.sd.axes.get(n)) and a.sd.seq_dim(n) is not None) \
            or any(on_tokens.get(u, False) for u in n.users)
    return [n for n in a.fwd_nodes if a.classes.get(n) == SEQ_REDUCTION and n.op == "call_function"
            and n not in regions and n in a.requires_grad and on_tokens[n]]


# a softmax over the classes, fused or decomposed (its max over the classes comes first)
CLASS_SOFTMAX = (aten._log_softmax.default, aten._softmax.default, aten.logsumexp.default, aten.amax.default)


def _logits_from_outside(a: Analysis, plan):
    """The softmax over classes of a head whose logits are a graph input: no projection computes
    them in the graph (the LM head ran outside it), so they exist for the whole sequence and only
    the loss over them streams. None otherwise."""
    inside = set(plan.nodes)
    feeding = ancestors(list(plan.inputs), within=set(a.fwd_nodes)) | inside
    if any(projects(n) for n in feeding):
        return None
    if not any(n.op == "placeholder" and _floating(n) and a.sd.seq_dim(n) is not None for n in feeding):
        return None
    for n in a.fwd_nodes:
        if n in feeding and n.target in CLASS_SOFTMAX and isinstance(n.args[0], fx.Node) \
                and _over_classes(n, n.args[0], a.sd):
            return n
    return None


def _over_classes(op, x, sd) -> bool:
    """Whether ``op`` reduces ``x`` along dims other than the sequence dim."""
    rank = val(x).dim()
    dims = op.args[1] if len(op.args) > 1 else []
    dims = [dims] if isinstance(dims, int) else list(dims)
    return bool(dims) and sd.seq_dim(x) not in [normalize_dim(d, rank) for d in dims]


def _floating(x) -> bool:
    v = val(x)
    return is_tensor(v) and v.is_floating_point()


def _coverage(a: Analysis) -> None:
    """Refusals for what would otherwise run unstreamed without a word: attention outside every
    layer region, a loss outside the head, token mixing with no attention to stream around, a
    graph with no sequence found whose gradient passes an op without a rule."""
    if a.sites and a.sd.seq_atom is None:
        a.refusals.append(("graph", CannotStream("a sequence of one token: there is nothing to stream")))
        return
    if a.sd.seq_atom is None:
        # nothing to find the sequence by (an attention streamfx recognises, a token embedding, a
        # per-token loss), as in a graph piece holding only layers: an op without a rule that
        # carries a gradient may be the layers' token mixing (an attention kernel streamfx does
        # not know, such as flex_attention or a custom op), so the graph is said to run unstreamed
        unknown = [n for n in a.fwd_nodes if n.op == "call_function" and n in a.sd.unknown
                   and n in a.requires_grad and any(_floating(x) for x in node_inputs(n))]
        if unknown:
            a.refusals.append(("graph", CannotStream(
                "no sequence found in this graph (no attention streamfx recognises, no token embedding, no "
                "per-token loss), and it computes a gradient through an op streamfx has no rule for, which "
                "may mix tokens (an attention kernel it does not stream, such as flex_attention or a custom "
                "attention op): the graph runs unstreamed; use attn_implementation='sdpa' (or 'eager') for "
                "the layers to stream", unknown[0])))
    in_layers = {s.index for r in a.regions if r.kind == "layer" for s in r.attention}
    for s in a.sites:
        if s.index not in in_layers:
            other = a.sd.seq_dim(s.query) is None   # (an encoder-decoder's encoder)
            a.refusals.append((f"attention #{s.index}", CannotStream(
                "attention over other positions than the sequence the loss is over (an encoder's, whose output "
                "the decoder reads whole)" if other else
                "attention outside every layer region (no residual stream found around it)", s.output)))
    regions = set().union(*(r.nodes for r in a.regions)) if a.regions else set()
    mixing = a.unknown_mixing() + _reductions_back_on_tokens(a, regions)
    # between attention layers: mixing that carries a gradient (mask and position arithmetic of
    # integer inputs mixes tokens too, but carries none) on the way to a later attention
    before = ancestors([x for s in a.sites for x in (s.query, s.key, s.value)]) if a.sites else set()
    outside = [n for n in mixing if n not in regions and n in a.requires_grad and n in before]
    if a.sites and outside:  # a hybrid model's recurrent or convolution layers, between its attention layers
        a.refusals.append(("layers without attention", CannotStream(
            "token mixing outside every attention layer (a recurrence, a convolution or linear attention, "
            "as in a hybrid model's state-space or linear-attention layers): those layers run unstreamed; "
            "the attention layers stream", outside[0])))
    # a streamed head's entry may be a slice of the hidden state (a shifted loss's slice moved in
    # front of the head): the shift, not token mixing
    entries = {x for p in a.plans if p.kind == "head" for x in p.inputs}
    mixing = [n for n in mixing if n not in entries]
    if not a.sites and mixing:
        head = any(p.kind == "head" for p in a.plans)
        a.refusals.append(("layers", CannotStream(
            "no causal attention found: layers run unstreamed" + ("; the head streams" if head else "")
            + "; token mixing without a recognised causal attention (recurrences, convolutions that are not "
            "causal, bidirectional or relative-position attention) cannot stream"
            + (f"; {CONV_ADVICE}" if mixing[0].target in CONV_OPS else ""), mixing[0])))
    for p in a.plans:
        softmax = _logits_from_outside(a, p) if p.kind == "head" else None
        if softmax is not None:
            a.notes.append((p.name, CannotStream(
                "its logits arrive as an input of the graph: the LM head that computes them ran outside it "
                "(a graph break between the LM head and the loss, such as ZeRO-3's parameter hooks on the "
                "LM head, or a loss compiled apart from the model), so the logits and their gradient exist "
                "for the whole sequence and only the softmax and the loss over them stream; keep the LM "
                "head and the loss in one compiled graph to stream the logits too (under DeepSpeed ZeRO-3: "
                "streamfx.zero3.stream_head(engine) after deepspeed.initialize)", softmax)))
    cached = [o for p in a.plans if p.kind == "layer" for o in getattr(p, "returned", ())]
    if cached:   # (one note for every layer)
        width = int(sum(per_token(o, a.sd, nbytes=True) for o in cached))
        a.notes.append(("layers", CannotStream(
            f"they return their keys and values (a KV cache: use_cache=True), {width:,} bytes per sequence position over "
            f"{len(cached)} tensors, held for the whole sequence from each layer's forward until the caller "
            "drops the output; a training step needs no cache: use_cache=False (model.config.use_cache = "
            "False, or use_cache=False in the call) saves that memory", cached[0])))
    kept_random = [x for p in a.plans if p.kind == "layer" for x, spec in zip(p.inputs, p.in_specs)
                   if spec.kind == "qk" and any(n.target in RANDOM_OPS for n in ancestors([x]))]
    if kept_random:   # (one note for every layer: the cause is the model's, the same in each)
        a.notes.append(("layers", CannotStream(
            "a random [.., T, T] tensor (dropout's keep mask on the attention probabilities) is kept from "
            "each layer's forward to its backward and read per chunk: its memory grows with the square of "
            "the length; set the attention's dropout to 0 (attention_dropout=0.0 in a Hugging Face config) "
            "for long sequences", kept_random[0])))
    # (reductions that carry a gradient: an index computed from token ids, a sequence
    # classifier's last non-padding token found by an argmax over the sequence, is no loss)
    sums = [n for n in a.fwd_nodes if a.classes.get(n) == SEQ_REDUCTION and n.op == "call_function"
            and n in a.requires_grad]
    # a loss whose head does not stream always says why: the head's own refusal, or this one
    if sums and not any(p.kind == "head" for p in a.plans) \
            and not any(name == "head" for name, _ in a.refusals + a.whole):
        cut = _symbolic_slice(sums)
        a.refusals.append(("head", CannotStream(
            "a sum over the sequence outside a head region: its input is sliced along the sequence with a "
            "symbolic bound (`hidden[:, -logits_to_keep:]` with `logits_to_keep` traced as a symbolic int, as "
            "under dynamic=True), so the labels' sequence axis cannot be matched with the hidden state's; "
            "compile with dynamic=None (torch.compile's default: an int that never changes stays a constant)",
            cut) if cut is not None else CannotStream(
            "a sum over the sequence (a loss) outside a head region: the loss runs unstreamed; a head "
            "streams when the loss is a sum of per-token terms of the last layer's hidden state", sums[0])))


def _symbolic_slice(nodes):
    """A slice with a symbolic start or stop that one of ``nodes`` is computed from, or None."""
    seen, stack = set(nodes), list(nodes)
    while stack:
        n = stack.pop()
        if n.op == "call_function" and n.target is torch.ops.aten.slice.Tensor \
                and any(isinstance(b, fx.Node) for b in n.args[2:4]):
            return n
        for x in n.all_input_nodes:
            if x not in seen:
                seen.add(x)
                stack.append(x)
    return None


def move_slices(joint: fx.GraphModule, a: Analysis, config, constants: dict | None = None):
    """Step 3: (joint, analysis) with the head's sequence slices moved to its entry, on a copy of
    the joint, when the head then streams and every region that streamed before still does;
    else the given pair."""
    if not hoist.head_slices(a):
        return joint, a
    graph, val_map = hoist.copy_graph(joint.graph)
    real = {val_map[p]: x for p, x in (constants or {}).items() if p in val_map}
    moved: list = []
    b = _analyse_and_decide(graph, a.num_fwd_outputs, real, config, moved)
    for _ in range(MAX_MOVES):
        m = hoist.move_one(graph, b)
        if m is None:
            break
        moved.append(m)
        verify.graph(graph, hoist.STEP)
        b = _analyse_and_decide(graph, a.num_fwd_outputs, real, config, moved)
    before = {p.name for p in a.plans}
    if not moved or not any(p.kind == "head" for p in b.plans) or not before <= {p.name for p in b.plans}:
        return joint, a
    return fx.GraphModule(joint, graph), b


def _analyse_and_decide(graph, num_fwd_outputs, real, config, moved) -> Analysis:
    b = analyze(graph, num_fwd_outputs, real)
    b.moved = list(moved)
    decide(b, config)
    return b

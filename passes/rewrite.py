"""The rewrite: streamed regions become ``streamfx::region`` calls; the joint is re-derived.

``stream_joint`` (1) extracts the forward graph from AOTAutograd's joint, (2) builds each planned
region's full graph and chunk graph, (3) rebuilds the forward with one region call per region,
(4) traces forward + autograd of that forward into a new joint with the same primals, tangents
and outputs, which AOTAutograd's own partitioner then splits. Everything that can fail is
checked in (2) before the joint is touched; failures raise CannotStream.
"""
from __future__ import annotations

import dataclasses
import operator

import networkx as nx
import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks
from torch._functorch._aot_autograd.utils import copy_fwd_metadata_to_bw_nodes
from torch._guards import detect_fake_mode
from torch._inductor.decomposition import select_decomp_table
from torch.fx.experimental.proxy_tensor import make_fx

from streamfx import blocks, chunks, offload  # noqa: F401  (blocks registers streamfx::causal_blocks)
from streamfx.chunks import ChunkGraph, Slot
from streamfx.errors import CannotStream
from streamfx.runtime import Keep, LayerProgram, MaskCheck, RegionProgram, no_nan_check
from . import kernels, reach, verify
from .graphs import (ALIASES, COPIES, ancestors, bind, hint, is_tangent, order, outputs as graph_outputs, primals,
                     tangents, unpadded, written_input)
from .record import made_by
from .sizes import Sizes
from .specs import Spec, accumulation_dtype, dim_order

aten = torch.ops.aten
STEP = "stream"


def region_program(plan, codegen: str) -> RegionProgram:
    """A region that is token-local per chunk (the head): its chunk graph reads chunk rows."""
    full = chunk_graph(plan.name, plan.inputs, plan.in_specs, plan.nodes, plan.outputs, plan.sd, whole=True)
    chunk = chunk_graph(plan.name, plan.inputs, plan.in_specs, plan.nodes, plan.outputs, plan.sd)
    return RegionProgram(plan.name, chunk, full, plan.in_specs, plan.out_specs, plan.chunk_size,
                         plan.grad_inputs, codegen, seeds=plan.seeds)


def chunk_graph(name, inputs, specs, nodes, outputs, sd, extra=(), extra_dims=(), key_side=frozenset(),
                edit=None, whole=False, zeros=frozenset(), more_slots=()) -> ChunkGraph:
    """A region's graph for one chunk (``build_graph``), its placeholders' slots, checked at
    symbolic chunk shapes. ``extra``: the keys and values (sequence-major prefixes, key dims
    ``extra_dims``); ``edit(gm)`` changes the graph before it is checked; ``whole``: the
    region for the whole sequence (not checked: it is the joint's own graph); ``zeros``: nodes
    read as a zero scalar of their dtype (the scores, where the graph applies masks to them);
    ``more_slots``: the slots of tensor placeholders ``edit`` adds after the keys and values."""
    gm, sizes = build_graph(inputs, specs, nodes, outputs, sd, extra=extra, key_side=key_side, whole=whole,
                            zeros=zeros)
    if edit is not None:
        edit(gm)
    roles = [{d: _merged_rows(x, spec, sd) if spec.merged else ("q" if whole else r) for d, r in spec.seq_dims()}
             for x, spec in zip(inputs, specs)]
    slots = [_slot(x, r, sd) for x, r in zip(inputs, roles)]
    slots += [_slot(x, {d: "k"}, sd, layout="seq_major") for x, d in zip(extra, extra_dims)]
    slots += list(more_slots)
    try:
        graph = ChunkGraph(name, gm, tuple(slots), tuple(sizes))
        if not whole:
            chunks.check(graph)
    except Exception as e:  # noqa: BLE001 - any failure to instantiate the region per chunk
        failed = e.error if isinstance(e, chunks.ChunkCheckFailed) else e
        if verify.enabled() and not isinstance(failed, CannotStream):
            raise failed from None
        first = e.text if isinstance(e, chunks.ChunkCheckFailed) else str(failed).splitlines()[0] if str(failed) else ""
        # (the op the chunk's propagation failed at, with its source line, where it is known; the
        # sizes of the error named as the chunk's rows, the rows it reads, the inputs' sizes)
        if isinstance(e, chunks.ChunkCheckFailed) and {"q", "k"} <= e.roles:
            first += ("; the chunk's rows meet the rows before them here: the layer mixes positions outside its "
                      "causal attention in a form no rule reads per chunk; to stream it, compute that mixing "
                      "outside the decoder layers or per token")
        raise CannotStream(f"the region does not instantiate per chunk ({type(failed).__name__}: {first})",
                           getattr(e, "node", None) if isinstance(e, chunks.ChunkCheckFailed) else None)
    if not whole:
        verify.chunk_graph(gm, name)
    return graph


def _returned(plan, o) -> tuple:
    """(index of the K/V graph output, graph of the views from it to ``o`` or None) of a value the
    layer returns from its K/V buffers (``LayerPlan.returned``)."""
    source, chain = plan.returned_from[o]
    if not chain:
        return plan.kv_outputs.index(source), None
    spec = Spec.chunk(plan.sd.seq_dim(source))
    return plan.kv_outputs.index(source), chunk_graph(plan.name, [source], [spec], chain, [o], plan.sd, whole=True)


def _merged_rows(x, spec, sd):
    """The size of a chunk's dim that merges its rows with other axes (``Spec.chunk(d, merged)``):
    the other axes' sizes times the chunk's rows (``chunks.KEY_SYMBOLS["q"]``)."""
    import sympy

    other = _atoms_size([a for a in sd.table.canon(sd.axes[x][0][spec.dim]) if not sd.has_seq((a,))], sd)
    return chunks.KEY_SYMBOLS["q"] * (sympy.Integer(other) if isinstance(other, int) else other.node.expr)


def _atoms_size(atoms, sd):
    """The product of the sizes of ``atoms`` (an int, or a SymInt written with their symbols)."""
    size = 1
    for a in atoms:
        size = size * sd.table.size[a]
    return size


def _slot(x, roles: dict, sd, layout: str = "dense") -> Slot:
    """The slot of input ``x``: a symbolic dim is written with the symbol of its axis, so two
    inputs that Dynamo gave their own batch symbol (input ids and labels) share one."""
    v = x.meta["val"]
    axes = (sd.axes.get(x) or [None])[0]
    shape = []
    for j, size in enumerate(v.shape):
        if j in roles or isinstance(size, int) or axes is None:
            shape.append(size)
            continue
        shape.append(_atoms_size(sd.table.canon(axes[j]), sd))
    return Slot.of(v, roles, layout, shape=shape)


def build_graph(inputs, specs, nodes, outputs, sd, extra=(), key_side=frozenset(), whole=False, zeros=frozenset()):
    """Copy ``nodes`` into a new GraphModule with ``inputs`` (then ``extra`` nodes) as placeholders,
    then the sizes it needs: (graph module, the size placeholders' keys in order).

    Size arguments are rebuilt from the axes of their dims (``sizes.Sizes``) from size
    placeholders: "q", the length of the chunk's rows; "k", the number of keys it reads (for key
    dims and ``key_side`` nodes, computed from the keys and values alone); shape symbols of the
    joint graph (a dynamic batch size). ``whole``: the region for the whole sequence (the keys
    are the rows). The runtime passes each size read from the inputs (``chunks.ChunkGraph``).
    """
    g, env, prefix = fx.Graph(), {}, {}
    for i, x in enumerate(list(inputs) + list(extra)):
        p = g.placeholder(f"in_{i}_{x.name}")
        p.meta["val"] = x.meta.get("val")
        # (an input that is a key too, the tensor a causal convolution or token shift reads from
        # the layer's input itself: the chunk's rows for its other uses, the prefix for the key side)
        if i >= len(inputs) and x in env:
            prefix[x] = p
        else:
            env[x] = p
    size_inputs: dict = {}
    last = [p for p in g.nodes][-1] if len(g.nodes) else None

    def size_of(key):
        key = "q" if whole and key == "k" else key
        if key not in size_inputs:
            nonlocal last
            with g.inserting_after(last) if last is not None else g.inserting_before(None):
                last = size_inputs[key] = g.placeholder(f"size_{len(size_inputs)}")
        return size_inputs[key]

    dims = {d for x in list(inputs) + list(extra) for d in _slot(x, {}, sd).shape if not isinstance(d, int)}
    sizes = Sizes(sd, size_of, readable=dims.__contains__)
    for z in zeros:
        v = z.meta["val"]
        env[z] = g.call_function(aten.scalar_tensor.default, (0.0,), {"dtype": v.dtype, "device": v.device})
    for n in nodes:
        if n in env:
            continue
        swap = prefix if prefix and (n in key_side or n.meta.get(CONV_TAPS)) else {}
        rows = {x: env[x] for x in swap}
        env.update(swap)
        _copy_node(g, n, env, sizes, size_of, whole, key_side)
        env.update(rows)
    g.output(tuple(env[o] for o in outputs))
    for n in list(g.nodes):
        kern = kernels.of(n)
        if kern is not None and kern.mask_align and bind(n).get(kern.mask) is not None:
            _align_mask(g, n, kern)
    g.eliminate_dead_code()
    _canonical_names(g)
    return fx.GraphModule(_attributes(g, nodes), g), list(size_inputs)


def _copy_node(g, n, env, sizes, size_of, whole, key_side) -> None:
    """Copy node ``n`` into the chunk graph ``g`` (``env``: its nodes by the joint's), in the form a
    chunk computes it (``build_graph``)."""
    if isinstance(n.meta.get("val"), torch.SymInt) and any(x not in env for x in n.all_input_nodes):
        return  # a size computed from sizes outside (B * (T - 1) for a view): rebuilt where used
    if unpadded(n) in env:  # a kernel's alignment of its mask rows: redone for the copy's length
        env[n] = env[unpadded(n)]
        return
    if n.target is aten.constant_pad_nd.default and n.users and all(unpadded(u) is not None for u in n.users):
        return
    conv = n.meta.get(CONV_ROWS)
    if conv is not None and n.target is aten.slice.Tensor:
        env[n] = _conv_rows(g, env[n.args[0]], conv, size_of, whole, n in key_side, n.meta["val"].device)
        return
    if not whole and n.meta.get(CONV_TAPS) and n.target is aten.constant_pad_nd.default:
        pads, ndim = list(n.args[1]), len(n.meta["val"].shape)
        value = n.args[2] if len(n.args) > 2 else 0.0
        d = next((ndim - 1 - i for i in range(len(pads) // 2) if pads[2 * i] or pads[2 * i + 1]), ndim - 1)
        i = ndim - 1 - d
        new = _pad_rows(g, env[n.args[0]], ndim, pads[2 * i], pads[2 * i + 1], value, d)
        env[n] = new if conv is None else _conv_rows(g, new, conv, size_of, whole, n in key_side,
                                                     n.meta["val"].device)
        return
    if not whole and n.meta.get(CONV_TAPS) and n.target is aten.convolution.default and _depthwise(n):
        env[n] = _conv_taps(g, n, env)
        if conv is not None:
            env[n] = _conv_rows(g, env[n], conv, size_of, whole, n in key_side, n.meta["val"].device)
        return
    new = _autograd_form(g.node_copy(n, lambda x: env.get(x, x)))
    new.meta.pop("unbacked_bindings", None)  # (symbols of the joint graph's shape environment)
    if n in key_side and new.target in (aten.view.default, aten._unsafe_view.default):
        new.target = aten.reshape.default  # a prefix of a sequence-major buffer is strided
    sizes.patch(new, n, key_side=n in key_side)
    if not whole:
        made_by(new, STEP)
    env[n] = new if conv is None else _conv_rows(g, new, conv, size_of, whole, n in key_side,
                                                 n.meta["val"].device)


# node meta of a causal convolution's output: (dim, its first row); of each node of its chain
# (``attention.conv_site``, ``attention.shift_site``): True
CONV_ROWS = "streamfx_conv_rows"
CONV_TAPS = "streamfx_conv_taps"


_END = 9223372036854775807   # (a slice to the end, as the graphs write it)


def _depthwise(conv: fx.Node) -> bool:
    """A 1-D convolution with one input channel per group (every channel convolved alone)."""
    w = conv.args[1].meta["val"]
    return w.dim() == 3 and w.shape[1] == 1 and conv.args[8] == w.shape[0] == conv.args[0].meta["val"].shape[1]


def _pad_rows(g: fx.Graph, x: fx.Node, n: int, left: int, right: int, value=0.0, d: int | None = None) -> fx.Node:
    """``x`` (``n`` dims) with ``left`` and ``right`` rows of ``value`` around its dim ``d`` (the last
    by default; a negative ``right`` drops rows: a token shift), made by concatenation: a pad's
    fake kernel reads its input's sizes as integers, which fixes a symbolic length to the
    sample's (a compile per chunk length). The rows are one row of ``x`` filled with ``value``
    and expanded (no size read from ``x``)."""
    d = n - 1 if d is None else d
    made = []
    parts = []
    whole = x
    if right < 0:
        x = g.call_function(aten.slice.Tensor, (x, d, 0, right))
        made.append(x)
        right = 0
    for rows in (left, right):
        if not rows:
            parts.append(None)
            continue
        row = g.call_function(aten.slice.Tensor, (whole, d, 0, 1))
        filled = g.call_function(aten.full_like.default, (row, value))
        parts.append(g.call_function(aten.expand.default, (filled, [-1] * d + [rows] + [-1] * (n - 1 - d))))
        made += [row, filled, parts[-1]]
    new = g.call_function(aten.cat.default, ([p for p in (parts[0], x, parts[1]) if p is not None], d))
    for m in (*made, new):
        made_by(m, STEP)
    return new


def _conv_taps(g: fx.Graph, conv: fx.Node, env: dict) -> fx.Node:
    """A depthwise causal convolution of a chunk as the sum of its taps (each a slice of the input
    times one weight per channel, plus the bias): exact, and its code is the same for every
    length (Inductor's convolution specialises on its input's length: a compile per length)."""
    before = set(g.nodes)
    x, w, b = (env.get(a, a) for a in conv.args[:3])
    padding, dilation = conv.args[4][0], conv.args[5][0]
    k = conv.args[1].meta["val"].shape[-1]
    dtype = conv.meta["val"].dtype
    if dtype in (torch.bfloat16, torch.float16):   # (summed in fp32 and rounded once, as the convolution does)
        x, w, b = (None if t is None else g.call_function(aten._to_copy.default, (t,), {"dtype": torch.float32})
                   for t in (x, w, b))
    if padding:
        x = _pad_rows(g, x, 3, padding, padding)
    total = None
    for i in range(k):   # (tap i: elements i·dil .. of the padded input, up to (k - 1 - i)·dil before its end)
        end = -(k - 1 - i) * dilation or _END
        tap = g.call_function(aten.slice.Tensor, (x, 2, i * dilation, end))
        weight = g.call_function(aten.slice.Tensor, (w, 2, i, i + 1))   # [C, 1, 1]: one weight per channel
        term = g.call_function(aten.mul.Tensor, (tap, g.call_function(aten.view.default, (weight, [-1, 1]))))
        total = term if total is None else g.call_function(aten.add.Tensor, (total, term))
    if b is not None:
        total = g.call_function(aten.add.Tensor, (total, g.call_function(aten.view.default, (b, [-1, 1]))))
    if dtype in (torch.bfloat16, torch.float16):
        total = g.call_function(aten._to_copy.default, (total,), {"dtype": dtype})
    for n in set(g.nodes) - before:   # (made by the streamed step, as every copied op is)
        made_by(n, STEP)
    return total


def _conv_rows(g: fx.Graph, x: fx.Node, conv: tuple, size_of, whole: bool, keys: bool, device) -> fx.Node:
    """The rows of a causal convolution's output ``x`` that are the graph's own (``conv``: its dim
    and first row): in a chunk graph the convolution runs over the keys the chunk reads (its
    own rows and at least the ``reach`` before), and its last ``q`` rows are the chunk's; on the
    key side (keys convolved before the attention reads them), its ``k`` rows from ``first``; for
    the whole sequence, its rows from ``first``."""
    d, first = conv
    q = size_of("k" if keys else "q")
    if whole or keys:
        new = g.call_function(aten.narrow.default, (x, d, first, q))
    else:
        # (rows [k - q, k) picked by index, not sliced: a slice from a symbolic start makes
        # Inductor specialise the backward on the key length, a compile per chunk length)
        end = g.call_function(operator.add, (size_of("k"), first))
        start = g.call_function(operator.sub, (end, q))
        # (``device``: the convolution's, from the joint graph: ``x`` is a new node, with no value yet)
        rows = g.call_function(aten.arange.start, (start, end), {"dtype": torch.int64, "device": device})
        made_by(rows, STEP)
        new = g.call_function(aten.index_select.default, (x, d, rows))
    if not whole:
        made_by(new, STEP)
    return new


def _autograd_form(new: fx.Node) -> fx.Node:
    """A copied node in a form autograd can differentiate again (the rewrite re-derives the
    backward of the forward graph, and chunk graphs are differentiated at run time): the prims
    cast becomes ``_to_copy``; a functional ``copy(dst, src)`` (a ``copy_`` into a new tensor,
    as MLA builds its keys) becomes ``where(True, src, dst)``, which broadcasts and casts alike;
    the prims flip becomes ``aten.flip``."""
    if new.target is torch.ops.prims.convert_element_type.default:
        new.target, new.args, new.kwargs = aten._to_copy.default, (new.args[0],), {"dtype": new.args[1]}
    elif new.target is torch.ops.prims.rev.default:  # (flip, as Inductor's decompositions write it)
        new.target, new.args, new.kwargs = aten.flip.default, (new.args[0], list(new.args[1])), {}
    elif new.target is aten.copy.default:
        dst, src = new.args[:2]
        g = new.graph
        with g.inserting_before(new):
            cast = g.call_function(aten._to_copy.default, (src,), {"dtype": dst.meta["val"].dtype})
            everywhere = g.call_function(aten.ones_like.default, (dst,), {"dtype": torch.bool})
        new.target, new.args, new.kwargs = aten.where.self, (everywhere, cast, dst), {}
    return new


def _attributes(g: fx.Graph, nodes) -> dict:
    """The constants (``get_attr`` targets: lifted tensor constants) a copied graph refers to,
    taken from the module that owns the nodes' graph."""
    targets = {n.target for n in g.nodes if n.op == "get_attr"}
    if not targets:
        return {}
    owner = next(iter(nodes)).graph.owning_module
    return {t: getattr(owner, t) for t in targets}


def _canonical_names(g: fx.Graph) -> None:
    """Name nodes by position so layers of the same structure produce the same code (one compile)."""
    nodes = list(g.nodes)
    for i, n in enumerate(nodes):
        n._rename(f"tmp_{i}_{id(n)}")
    for i, n in enumerate(nodes):
        if n.op != "output":
            n._rename(f"x{i}")
        if n.op == "placeholder":
            n.target = n.name


def layer_program(plan, codegen: str, attention: str = "recompute") -> LayerProgram:
    """K/V graph (keys and values of a chunk), query graph (a chunk's output from its queries and
    the keys/values it reads; fused causal attention aligned to the bottom right of them) and
    the mask graph (which keys each chunk must read, see ``reach``). ``attention="keep"``: also
    the variants that keep each attention's output and log-sum-exp from the forward for the
    backward (``keep_attention``)."""
    sd = plan.sd
    full = chunk_graph(plan.name, plan.inputs, plan.in_specs, plan.nodes, plan.results, sd, whole=True)
    kv_out = plan.kv_outputs
    kv_dims = tuple(sd.seq_dim(x) for x in kv_out)
    # (with causal convolutions in it, the K/V graph reads the rows before a chunk's too: it is
    # all key side, at the length it reads, and the runtime keeps its last rows)
    kv = chunk_graph(plan.name, plan.inputs, plan.kv_specs or plan.in_specs, plan.kv_nodes, list(kv_out), sd,
                     key_side=frozenset(plan.kv_nodes) if plan.kv_reach else frozenset())

    def attention_edits(gm, drop_masks=False):
        # the copy keeps the graph order: its fused attention calls are the region's in order,
        # each a site, or a cross-attention (no site: its keys are whole for every chunk)
        sites = {s.output: s for s in plan.sites if s.kind.startswith("sdpa")}
        fused = [sites.get(n) for n in plan.nodes if n.op == "call_function" and n.target in kernels.FORWARD_OPS]
        calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in kernels.FORWARD_OPS]
        if len(calls) != len(fused):
            raise CannotStream(f"the chunk graph holds {len(calls)} fused attention calls for {len(fused)} in the "
                               "region")
        for node, site in zip(calls, fused):
            if site is not None:
                _chunk_attention(gm, node, site, drop_masks)
        gm.graph.eliminate_dead_code()
        gm.recompile()

    def query_graph(edit, more_slots=()):
        return chunk_graph(plan.name, plan.inputs, plan.in_specs, plan.nodes, plan.outputs, sd, extra=kv_out,
                           extra_dims=kv_dims, key_side=plan.key_side, edit=edit, more_slots=more_slots)

    q = query_graph(attention_edits)
    mask = causal = None
    mg = reach.mask_graph(plan, lambda ins, specs, nodes, outs, zeros: chunk_graph(plan.name, ins, specs, nodes, outs, sd,
                                                                                  zeros=zeros))
    if mg is not None:
        mask = MaskCheck(mg.graph, mg.inputs, mg.forms)
        if any(s.mask_checked_per_call for s in plan.sites):
            # the mask is data, or too long to evaluate here: a call whose masks are all exactly
            # causal (``keyranges.reach``) runs the kernel's own causal attention instead
            try:
                causal = query_graph(lambda gm: attention_edits(gm, drop_masks=True))
            except CannotStream:
                causal = None
    # (convolutions the query graph computes: those only the K/V graph computes are in ``kv_reach``)
    convs = [s.reach for s in plan.sites if s.kind == "conv" and not any(s is c for c in plan.kv_convs)]
    prog = LayerProgram(plan.name, q, full, plan.in_specs, plan.out_specs, plan.chunk_size,
                        plan.grad_inputs, codegen, kv=kv, kv_dims=kv_dims, mask=mask, causal=causal,
                        returned_kv=tuple(_returned(plan, o) for o in plan.returned),
                        reach=max(convs) if convs and all(s.kind == "conv" for s in plan.sites) else None,
                        convolved=bool(convs), kv_reach=plan.kv_reach, kv_specs=plan.kv_specs)
    if attention == "keep":
        variants = {"chunk": lambda gm: attention_edits(gm)}
        if causal is not None:
            variants["causal"] = lambda gm: attention_edits(gm, drop_masks=True)
        prog.keep, prog.keep_refused = keep_attention(plan, query_graph, variants, len(plan.inputs) + len(kv_out))
    return prog


def keep_attention(plan, query_graph, variants: dict, n_tensors: int):
    """(``runtime.Keep``, None), or (None, why not): the query graph variants (``variants``: name
    -> its attention edit) whose every fused attention can read a kept output (``_keepable_calls``)
    get two more: one whose forward also returns each attention's output and log-sum-exp, and one
    whose attention reads them (``streamfx::kept_blocks`` / ``kept_attention``: the kernel's
    backward from them, no forward again). A call that runs another variant recomputes.
    ``n_tensors``: the query graph's tensor placeholders (inputs, then keys and values)."""
    sites = sorted((s for s in plan.sites if s.kind.startswith("sdpa")), key=lambda s: plan.nodes.index(s.output))
    if not sites:
        return None, "it has no fused attention"
    if sum(n.op == "call_function" and n.target in kernels.FORWARD_OPS for n in plan.nodes) != len(sites):
        return None, "it holds a fused attention that is no causal site (a cross-attention), which keeping does not cover"
    kerns = [kernels.of(s.output) for s in sites]
    bad = [k.name for k in kerns if k is None or not k.keeps]
    if bad:
        able = ", ".join(k.name for k in kernels.KERNELS.values() if k.keeps)
        return None, (f"its attention runs on the {bad[0]} kernel; keeping needs one whose backward reads "
                      f"the forward's output and log-sum-exp ({able})")
    slots = []
    for site in sites:
        q, v = site.query.meta["val"], site.value.meta["val"]
        qs, vs = _slot(site.query, {q.dim() - 2: "q"}, plan.sd), _slot(site.value, {}, plan.sd)
        out = site.output.meta["val"][0]
        order = dim_order([hint(n) for n in out.shape], [hint(n) for n in out.stride()])
        slots.append(Slot((*qs.shape[:-1], vs.shape[-1]), q.dtype, str(q.device), order=order))
        slots.append(Slot(qs.shape[:-1], accumulation_dtype(q.dtype), str(q.device)))
    # the query graph's placeholders that get a gradient: the region's, then the K/V prefix
    needs_grad = frozenset(plan.grad_inputs) | frozenset(range(len(plan.inputs), n_tensors))
    fwd, bwd, raw, why = {}, {}, {}, {}
    for name, edit in variants.items():
        def keeping(gm, edit=edit, name=name):
            edit(gm)
            calls = _keepable_calls(gm, len(sites), needs_grad)
            raw[name] = tuple(c.target is not torch.ops.streamfx.causal_blocks.default for c in calls)
            _output_attention(gm, calls)

        def kept(gm, edit=edit):
            edit(gm)
            _read_kept_attention(gm, _keepable_calls(gm, len(sites), needs_grad), n_tensors)

        try:
            fwd[name] = query_graph(keeping)
            bwd[name] = query_graph(kept, more_slots=slots)
        except CannotStream as err:
            for made in (fwd, bwd, raw):
                made.pop(name, None)
            why[name] = err.describe()
    if not bwd:
        return None, ("its chunks' attention is not plain causal (a mask that is not exactly causal stays in "
                      "it, or the attention has dropout)")
    def whole(gm):
        calls = [n for n in gm.graph.nodes if kernels.of(n) is not None]
        if [kernels.of(n) for n in calls] != kerns:
            raise CannotStream("the whole layer's attention calls are not its sites'")
        _output_attention(gm, calls)

    try:
        full = chunk_graph(plan.name, plan.inputs, plan.in_specs, plan.nodes, plan.results, plan.sd, whole=True,
                           edit=whole)
    except CannotStream as err:
        return None, err.describe()
    return Keep(fwd, bwd, full, tuple(slots), tuple(k.name for k in kerns), raw, why), None


def _keepable_calls(gm, n: int, needs_grad=frozenset()) -> list:
    """The chunk graph's ``n`` attention calls, if the backward of each can read a kept output and
    log-sum-exp: ``causal_blocks``, a bottom-right kernel called with its own causal flag and no
    mask, or a kernel called with the chunk's mask whose backward takes it, a mask that needs no
    gradient (computed from no placeholder numbered in ``needs_grad``: a learned bias gets its
    gradient from the recomputed attention's autograd only); no dropout."""
    places = {p: i for i, p in enumerate(gm.graph.find_nodes(op="placeholder"))}
    calls = []
    for x in gm.graph.nodes:
        kern = kernels.of(x)
        if x.target is torch.ops.streamfx.causal_blocks.default:
            calls.append(x)
        elif kern is not None:
            b = bind(x)
            mask = b.get(kern.mask) if kern.mask else None
            plain = kern.alignment == "bottom-right" and b.get("is_causal") and mask is None
            masked = kern.keeps_masked and mask is not None and not b.get("is_causal")
            if not (kern.keeps and (plain or masked)) or b.get("dropout_p"):
                raise CannotStream(f"a chunk's attention on the {kern.name} kernel cannot read a kept output")
            if masked and isinstance(mask, fx.Node) and getattr(mask.meta.get("val"), "dtype", None) != torch.bool and any(
                    places.get(a) in needs_grad for a in ancestors([mask])):
                raise CannotStream("its attention mask needs a gradient (a learned bias), which the kernel's "
                                   "backward from a kept output does not give")
            calls.append(x)
    if len(calls) != n:
        raise CannotStream(f"the chunk holds {len(calls)} attention calls for {n} sites")
    return calls


def _getitem(g: fx.Graph, call: fx.Node, i: int) -> fx.Node:
    """Output ``i`` of a call that returns several (its getitem node, made where there is none)."""
    for u in call.users:
        if u.target is operator.getitem and u.args[1] == i:
            return u
    with g.inserting_after(call):
        return g.call_function(operator.getitem, (call, i))


def _output_attention(gm: fx.GraphModule, calls) -> None:
    """Each attention call's output and log-sum-exp (raw, as the op returns it) as more outputs."""
    g = gm.graph
    out = g.find_nodes(op="output")[0]
    more = [_getitem(g, c, i) for c in calls for i in (0, 1)]
    out.args = (tuple(out.args[0]) + tuple(more),)
    gm.recompile()


def _read_kept_attention(gm: fx.GraphModule, calls, n_tensors: int) -> None:
    """Each attention call replaced by ``kept_blocks`` (for ``causal_blocks``) or ``kept_attention``
    (a kernel's own call) reading its output and log-sum-exp from two new placeholders (after the
    ``n_tensors`` tensor placeholders)."""
    g = gm.graph
    phs = g.find_nodes(op="placeholder")
    anchor = phs[n_tensors] if len(phs) > n_tensors else next(n for n in g.nodes if n.op != "placeholder")
    for i, call in enumerate(calls):
        with g.inserting_before(anchor):
            out, lse = g.placeholder(f"kept_{i}_out"), g.placeholder(f"kept_{i}_lse")
        if call.target is torch.ops.streamfx.causal_blocks.default:
            kernel, q, k, v, scale = call.args
            op = torch.ops.streamfx.kept_blocks.default
            args = (kernel, q, k, v, out, lse, scale)
        else:
            b, kern = bind(call), kernels.of(call)
            args = (kern.name, b["query"], b["key"], b["value"], out, lse, b.get(kern.mask) if kern.mask else None,
                    bool(b.get("is_causal")), b.get("scale"))
            op = torch.ops.streamfx.kept_attention.default
        with g.inserting_before(call):
            new = g.call_function(op, args)
        for u in list(call.users):
            if u.target is not operator.getitem or (u.args[1] != 0 and u.users):
                raise CannotStream("the attention's log-sum-exp is read inside the chunk")
            if u.args[1] == 0:
                u.replace_all_uses_with(new)
            g.erase_node(u)
        g.erase_node(call)
    g.eliminate_dead_code()
    gm.recompile()


def _chunk_attention(gm: fx.GraphModule, node: fx.Node, site, drop_mask: bool = False) -> None:
    """The chunk's fused attention ``node`` (the copy of ``site``'s) on the model's own kernel (``kernels``), aligned to the bottom
    right of the keys it reads, with no [c, n] mask where the pattern is causal:

    - a mask whose pattern is plain causal and read from no data (Hugging Face's 4-D mask of an
      unpadded batch) gives way to the kernel's own causal flag;
    - a kernel that aligns causal to the bottom right (flash) runs as it is;
    - a top-left kernel whose backward reads its output and log-sum-exp runs as its prefix and
      diagonal blocks merged through the log-sum-exp (``streamfx.blocks``);
    - any other kernel gets the chunk's causal mask;
    - a data mask (padding, documents) stays, built per chunk (padded for a kernel that reads
      aligned rows: ``build_graph``);
    - grouped K/V heads go to a kernel that takes them without being repeated.

    ``drop_mask``: drop any mask as if it were plain causal (the query graph a call runs when its
    masks are found exactly causal, see ``AttentionSite.mask_checked_per_call``)."""
    kern = kernels.of(node)
    if kern.grouped_kv:
        _grouped_kv_in_place(gm, node)
    b = bind(node)
    mask = b.get(kern.mask) if kern.mask else None
    if mask is not None and (site.plain_causal_mask or drop_mask) and not b.get("is_causal"):
        _set_args(node, {kern.mask: None, "is_causal": True})
        b, mask = bind(node), None
    if mask is not None:
        if b.get("is_causal"):
            raise CannotStream("fused attention with both is_causal and a mask", site.output)
    elif b.get("is_causal") and kern.alignment != "bottom-right":
        if kern.blocks and not b.get("dropout_p"):
            _causal_blocks(gm, node, kern)
        else:
            _lower_right_mask(gm, node, kern, site)


def _set_args(node: fx.Node, values: dict) -> None:
    """Set arguments of ``node`` by name, positional or keyword as its schema has them."""
    names = [a.name for a in node.target._schema.arguments]
    args, kwargs = list(node.args), dict(node.kwargs)
    for name, value in values.items():
        i = names.index(name)
        if i < len(args):
            args[i] = value
        else:
            kwargs[name] = value
    node.args, node.kwargs = tuple(args), kwargs


def _causal_blocks(gm: fx.GraphModule, node: fx.Node, kern) -> None:
    """Replace the kernel call by ``streamfx::causal_blocks`` (the kernel's prefix and diagonal
    blocks merged): the attention's users read only its output."""
    users = list(node.users)
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in users):
        raise CannotStream(f"the {kern.name} attention's log-sum-exp is read inside the chunk", node)
    b = bind(node)
    with gm.graph.inserting_before(node):
        call = gm.graph.call_function(torch.ops.streamfx.causal_blocks.default,
                                      (kern.name, b["query"], b["key"], b["value"], b.get("scale")))
    for u in users:
        u.args = (call, 0)
    gm.graph.erase_node(node)


def _align_mask(g: fx.Graph, node: fx.Node, kern) -> None:
    """Pad the mask's key dim to a multiple of ``kern.mask_align`` for the copy's key length and
    slice it back, as the kernel's composite does for the whole sequence (the kernel reads
    aligned rows); ``build_graph`` leaves the whole sequence's pad and slice out of a copy. The
    composite's broadcast to [B, H, L, S] (an expand, its sizes rebuilt for the copy) is kept."""
    mask = bind(node)[kern.mask]
    base = mask
    while base.target is aten.expand.default:
        base = base.args[0]
    align = kern.mask_align
    rank = base.meta["val"].dim()
    with g.inserting_before(node):
        n = g.call_function(aten.sym_size.int, (base, -1))
        pad = g.call_function(operator.sub, (align, g.call_function(operator.mod, (n, align))))
        # (zeros concatenated, not ``constant_pad_nd``: its fake kernel takes no symbolic pad, so a
        # chunk graph traced at symbolic key lengths, its one-graph backward among them, failed;
        # the zeros are one key's column of the mask, zeroed and broadcast to the pad's width)
        column = g.call_function(aten.zeros_like.default, (g.call_function(aten.slice.Tensor, (base, -1, 0, 1)),))
        zeros = g.call_function(aten.expand.default, (column, [-1] * (rank - 1) + [pad]))
        padded = g.call_function(aten.cat.default, ([base, zeros], -1))
        aligned = g.call_function(aten.slice.Tensor, (padded, -1, 0, n))
        if mask.target is aten.expand.default:
            aligned = g.call_function(aten.expand.default, (aligned, mask.args[1]))
    _set_args(node, {kern.mask: aligned})


def _lower_right_mask(gm: fx.GraphModule, node: fx.Node, kern, site) -> None:
    """Give the chunk's attention an explicit mask: query i of a chunk of c queries sees keys
    0..(n - c + i) of the n-key prefix (causal, aligned to the bottom right)."""
    if kern.mask is None:
        raise CannotStream(f"a causal chunk on the {kern.name} kernel, which takes no mask and aligns top-left",
                           site.output)
    device = site.query.meta["val"].device
    g = gm.graph
    with g.inserting_before(node):
        q_len = g.call_function(aten.sym_size.int, (node.args[0], -2))
        k_len = g.call_function(aten.sym_size.int, (node.args[1], -2))
        qpos = g.call_function(aten.arange.default, (q_len,), {"dtype": torch.int64, "device": device})
        qpos = g.call_function(aten.add.Tensor, (qpos, g.call_function(operator.sub, (k_len, q_len))))
        kpos = g.call_function(aten.arange.default, (k_len,), {"dtype": torch.int64, "device": device})
        allowed = g.call_function(aten.ge.Tensor, (g.call_function(aten.unsqueeze.default, (qpos, 1)),
                                                   g.call_function(aten.unsqueeze.default, (kpos, 0))))
        dtype = site.query.meta["val"].dtype  # fused attention wants an additive mask of q's dtype
        zero = g.call_function(aten.scalar_tensor.default, (0.0,), {"dtype": dtype, "device": device})
        ninf = g.call_function(aten.scalar_tensor.default, (float("-inf"),), {"dtype": dtype, "device": device})
        mask = g.call_function(aten.where.self, (allowed, zero, ninf))
    _set_args(node, {kern.mask: mask, "is_causal": False})


def _grouped_kv_in_place(gm: fx.GraphModule, node: fx.Node) -> None:
    """A kernel that takes grouped K/V heads as they are (query head h reads K/V head
    h // n_rep): drop the repeat (unsqueeze, expand, clone, view) in front of the attention, so
    no chunk copies the K/V prefix n_rep times or sums its gradient back."""
    args = list(node.args)
    bases = [_head_repeat_base(args[pos]) for pos in (1, 2)]
    # both or neither: K and V must keep one head count (a cast between K's repeat and the
    # attention, as autocast writes it, keeps K repeated, and then V stays repeated too)
    if all(b is not None for b in bases) and bases[0].meta["val"].shape[1] == bases[1].meta["val"].shape[1]:
        for pos, b in zip((1, 2), bases):
            if b.meta["val"].dim() == 5:   # (the repeat's unsqueeze is outside this graph: undo it here)
                with gm.graph.inserting_before(node):
                    squeezed = gm.graph.call_function(aten.squeeze.dim, (b, 2))
                squeezed.meta["val"] = b.meta["val"].squeeze(2)
                b = squeezed
            args[pos] = b
        node.args = tuple(args)


def _head_repeat_base(x):
    """The [B, KV, L, D] tensor ``x`` repeats the way HF's repeat_kv does it (unsqueeze(2),
    expand over the new dim, optional clone, view/reshape merging dims 1 and 2), or None; where
    the unsqueeze is not in the graph, the [B, KV, 1, L, D] tensor it made."""
    def skip(n):
        while isinstance(n, fx.Node) and n.op == "call_function" and n.target in COPIES:
            n = n.args[0]
        return n

    x = skip(x)
    if not (isinstance(x, fx.Node) and x.target in (aten.view.default, aten._unsafe_view.default, aten.reshape.default)):
        return None
    e = skip(x.args[0])
    if not (isinstance(e, fx.Node) and e.target is aten.expand.default):
        return None
    u = e.args[0]
    uv = u.meta.get("val") if isinstance(u, fx.Node) else None
    if isinstance(u, fx.Node) and u.target is aten.unsqueeze.default and u.args[1] == 2:
        base = u.args[0]
    elif isinstance(uv, torch.Tensor) and uv.dim() == 5 and uv.shape[2] == 1:
        # the unsqueezed [B, KV, 1, L, D] tensor made before this graph (an input of it):
        # returned as it is, squeezed where it is used
        base = u
    else:
        return None
    v, out = base.meta.get("val"), x.meta.get("val")
    if not (isinstance(v, torch.Tensor) and isinstance(out, torch.Tensor) and v.dim() in (4, 5) and out.dim() == 4):
        return None
    return base


@dataclasses.dataclass
class Streamed:
    """The rewrite's result: the new joint graph, each streamed region's plan and runtime program
    (a layer whose masks do not rebuild per chunk has its ``unpulled`` plan here), and the indices
    of the forward outputs that are dropped (returned as None)."""
    joint: fx.GraphModule
    programs: list        # (plan, program) per streamed region
    dropped: set
    stores: list = dataclasses.field(default_factory=list)  # offload.StorePlan of each layer that stores inputs


class RegionFailed(CannotStream):
    """A region's program cannot be built (``error``, with its node): that region alone cannot
    stream; nothing has been changed yet."""

    def __init__(self, plan, error: CannotStream):
        super().__init__(error.reason, error.node)
        self.plan, self.error = plan, error


def stream_joint(joint: fx.GraphModule, num_fwd_outputs: int, fwd_nodes, plans, codegen: str,
                 storage=None, attention: str = "recompute", inductor: dict | None = None) -> Streamed:
    """A new joint graph in which every planned region runs as a streamed region op, its chunk
    graphs compiled by ``codegen`` (with "inductor", with the Inductor options ``inductor``).
    ``storage`` (``streamfx.offload.Options``): layer inputs offloaded or rebuilt; those layers
    run as ``streamfx::region_stored`` (see ``streamfx.offload``)."""
    outs = graph_outputs(joint.graph)
    fwd_outs, grad_outs = outs[:num_fwd_outputs], outs[num_fwd_outputs:]
    ps, ts = primals(joint.graph), tangents(joint.graph)
    # (an opaque input, a process group a collective reads, has no gradient; the joint returns
    # the object itself in its place)
    needs_grad = [isinstance(g, fx.Node) and isinstance(g.meta.get("val"), torch.Tensor) for g in grad_outs]
    primal_names = [p.name for p in ps]
    tangent_outputs = _tangent_outputs(joint, ts, num_fwd_outputs)
    effect = next((n for n in fwd_nodes if n.op == "call_function" and n.target is torch.ops.higher_order.with_effects),
                  None)
    if effect is not None:
        op = effect.args[1]
        raise CannotStream(f"an op with side effects ({getattr(op, '__name__', op)}) is in the graph, which AOTAutograd "
                           "orders through effect tokens in the forward and the backward; streaming differentiates "
                           "the forward again and would not keep that order", effect)

    # everything that can fail happens here, before any new graph exists
    programs = []
    for plan in plans:
        try:
            programs.append(_program(plan, codegen, attention if storage is None else "recompute"))
        except CannotStream as err:   # (this region only: the caller streams the others without it)
            raise RegionFailed(plan, err) from err
    for _, prog in programs:
        prog.inductor = dict(inductor or {})
        prog.register()
    stores = offload.plans(programs, storage) if storage is not None else {}
    offload.PLANS.update(stores)

    fwd = _forward_with_regions(fwd_nodes, ps, fwd_outs, programs, stores)
    dropped = dropped_outputs(fwd_outs, [p for p, _ in programs])

    def joint_fn(primals, tangents):
        # (node by node with each node's meta current, as AOTAutograd traces Dynamo's graph: the
        # traced nodes keep their source lines and modules, and the backward's nodes get their
        # forward node's through ``seq_nr``, which the memory report and Inductor name them by)
        with torch.enable_grad(), fx_traceback.preserve_node_meta():
            ps = [p.detach().requires_grad_(True) if ng and isinstance(p, torch.Tensor) and p.is_floating_point() else p
                  for p, ng in zip(primals, needs_grad)]
            outs = list(fx.Interpreter(fwd).run(*ps))
            with_tangent = tangent_outputs if tangent_outputs is not None else [
                i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad]
            if len(with_tangent) != len(tangents):
                raise CannotStream(f"outputs needing gradients ({len(with_tangent)}) do not match "
                                   f"the tangents ({len(tangents)})")
            pairs = [(outs[i], t) for i, t in zip(with_tangent, tangents) if i not in dropped]
            wrt = [p for p, ng in zip(ps, needs_grad) if ng and p.requires_grad]
            setup_stacktrace_preservation_hooks([o.grad_fn for o, _ in pairs if o.grad_fn is not None])
            grads = torch.autograd.grad([o for o, _ in pairs], wrt, [t for _, t in pairs], allow_unused=True)
        it = iter(grads)
        all_grads = [next(it) if ng and p.requires_grad else None for p, ng in zip(ps, needs_grad)]
        for i, g in enumerate(grad_outs):   # (an opaque object where the joint returns one: as it was)
            if isinstance(g, fx.Node) and g.op == "placeholder" and not needs_grad[i]:
                all_grads[i] = ps[primal_names.index(g.name)]
        lost = [i for i, (g, ng) in enumerate(zip(all_grads, needs_grad)) if ng and g is None]
        if lost:  # never a made-up zero: a gradient the joint computes must come through the regions
            raise CannotStream(f"the streamed graph does not reach the gradient of input(s) "
                               f"{[primal_names[i] for i in lost]}")
        return outs + all_grads

    vals_p = [p.meta["val"] for p in ps]
    vals_t = [t.meta["val"] for t in ts]
    mode = detect_fake_mode(vals_p + vals_t)
    with mode, no_nan_check():
        new_joint = make_fx(joint_fn, decomposition_table=select_decomp_table(),
                            record_module_stack=True)(vals_p, vals_t)
    for n in list(new_joint.graph.nodes):   # (an op's None output that nothing reads: partitioners save tensors)
        if n.op == "call_function" and n.target is operator.getitem and not n.users \
                and not isinstance(n.meta.get("val"), torch.Tensor):
            new_joint.graph.erase_node(n)
    new_joint.recompile()
    _tag_forward_backward(new_joint.graph)
    copy_fwd_metadata_to_bw_nodes(new_joint)   # (by the tags above)
    for n in new_joint.graph.nodes:
        if n.op == "call_function" and getattr(n.target, "namespace", None) == "streamfx":
            made_by(n, STEP)
    verify.graph(new_joint, STEP)
    return Streamed(new_joint, programs, dropped, [stores[prog.key] for _, prog in programs if prog.key in stores])


def _program(plan, codegen: str, attention: str = "recompute"):
    """(plan, runtime program) of one region; a layer whose masks do not rebuild per chunk falls
    back to its plan with the masks as token-by-token inputs."""
    if plan.kind == "layer":
        try:
            return plan, layer_program(plan, codegen, attention)
        except CannotStream:
            if plan.unpulled is None:
                raise
            return plan.unpulled, layer_program(plan.unpulled, codegen, attention)
    return plan, region_program(plan, codegen)


def _tag_forward_backward(graph: fx.Graph) -> None:
    """AOTAutograd's partitioners place nodes by ``partitioner_tag``. As when AOTAutograd traces
    a joint itself, nodes traced before the backward started are forward, the rest backward."""
    started = False
    for n in graph.nodes:
        if n.op == "output":
            break
        started = started or (n.op != "placeholder" and any(is_tangent(x) for x in n.all_input_nodes))
        n.meta["partitioner_tag"] = "is_backward" if started or is_tangent(n) else "is_forward"


def dropped_outputs(fwd_outs, plans) -> set:
    """Indices of the forward outputs ``plans`` drop (returned as None: the unsliced logits): an
    output that is a dropped value or an alias of one (through aliases a region may hold)."""
    dropped = set().union(*(p.dropped for p in plans)) if plans else set()
    return {i for i, o in enumerate(fwd_outs) if any(x in dropped for x in _alias_chain(o))}


def _alias_chain(node) -> list:
    """``node`` and the values it aliases, down to the first that is not an alias."""
    chain = [node]
    while isinstance(node, fx.Node) and node.target in ALIASES:
        node = node.args[0]
        chain.append(node)
    return chain


def _tangent_outputs(joint, tangents, num_fwd_outputs):
    """Index of the forward output each tangent belongs to, from AOTAutograd's descriptors."""
    out_descs = joint.graph.find_nodes(op="output")[0].meta.get("desc")
    try:
        descs = list(out_descs)[:num_fwd_outputs]
        return [descs.index(t.meta["desc"].output) for t in tangents]
    except (TypeError, KeyError, AttributeError, ValueError):
        return None


def _forward_with_regions(fwd_nodes, primals, fwd_outs, programs, stores=None) -> fx.GraphModule:
    """The forward graph with each region collapsed into one region call (topologically placed).
    A region in ``stores`` (key -> offload.StorePlan) is a ``region_stored`` call whose last
    output is its handle, passed to the next layer of its chain."""
    stores, handles = stores or {}, {}
    owner = {}
    for plan, prog in programs:
        for n in plan.nodes:
            if n not in plan.shared:
                owner[n] = (plan, prog)
    rank = order(fwd_nodes)
    dag = nx.DiGraph()
    unit = lambda n: owner[n][0].name if n in owner else n  # noqa: E731
    for n in fwd_nodes:
        dag.add_node(unit(n))
        for x in n.all_input_nodes:
            if unit(x) != unit(n):
                dag.add_edge(unit(x), unit(n))
    for n in fwd_nodes:  # a buffer updated in place is read (by regions too) before the update
        written = written_input(n)
        if written is not None:
            for reader in written.users:
                if reader is not n and reader in rank and unit(reader) != unit(n):
                    dag.add_edge(unit(reader), unit(n))
    first = {}
    for n in fwd_nodes:
        first.setdefault(unit(n), rank[n])
    g = fx.Graph()
    env = {}
    for p in primals:
        env[p] = g.placeholder(p.name)
        env[p].meta = dict(p.meta)
    for plan, _ in programs:  # dropped outputs computed outside the region (unsliced logits)
        for d in plan.dropped:
            if d not in owner:
                env[d] = _empty_like(g, d)
    for u in nx.lexicographical_topological_sort(dag, key=lambda u: first[u]):
        if isinstance(u, str):
            plan, prog = next(pp for pp in programs if pp[0].name == u)
            ins = [env[x] for x in plan.inputs]
            if prog.key in stores:
                sp = stores[prog.key]  # (the previous layer's handle: its entry rebuilds this input)
                link = handles[sp.link[1]] if sp.dropped is not None else None
                call = g.call_function(torch.ops.streamfx.region_stored.default, (prog.key, ins, link))
                handles[prog.key] = g.call_function(operator.getitem, (call, len(plan.results)))
            else:
                call = g.call_function(torch.ops.streamfx.region.default, (prog.key, ins))
            for j, o in enumerate(plan.results):
                env[o] = g.call_function(operator.getitem, (call, j))
            for d in plan.dropped:
                if d not in env:
                    env[d] = _empty_like(g, d)
        elif u.op != "placeholder" and u not in env:
            env[u] = _autograd_form(g.node_copy(u, lambda x: env[x]))
    g.output([env[o] if o is not None else None for o in fwd_outs])
    gm = fx.GraphModule(_attributes(g, fwd_nodes), g)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _empty_like(g: fx.Graph, node: fx.Node) -> fx.Node:
    """The placeholder value of a dropped output: an empty tensor of its dtype and device."""
    v = node.meta["val"]
    return g.call_function(aten.empty.memory_format, ([0],), {"dtype": v.dtype, "device": v.device})

"""Runtime of streamed regions: the ``streamfx::region`` op, its backward, and the chunk loop.

A ``RegionProgram`` holds one region's chunk graph (the region instantiated for a chunk of
tokens, ``chunks.ChunkGraph``) and how its inputs are read and its outputs put together
(``streamfx.passes.specs``). The schedule is computed from the real inputs at every call: the
sequence length, the chunk bounds (an automatic chunk size follows the length), and for a
layer the keys each chunk reads (``keyranges``). Forward runs the chunks in order without
grad; backward runs them in reverse, recomputing each chunk with grad and calling autograd on
it, so only one chunk's activations exist at a time.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import time
import warnings

import torch
import torch.fx as fx

from streamfx.passes.schedule import chunk_bounds, chunk_size

from . import failures, keyranges
from .passes.graphs import hint
from .passes.specs import accumulation_dtype, dim_order, empty_in_order, leading
from .chunks import COUNTERS, ChunkGraph  # noqa: F401  (COUNTERS is part of the runtime's interface)

_PROGRAMS: dict[int, "RegionProgram"] = {}
_ids = itertools.count()
# seconds spent in region calls per (region kind, phase), while TIMING[0] is True (the bench's
# time split; the device is synchronized around each call)
TIMING = [False]
TIMES: dict = collections.defaultdict(float)


# while ANALYSIS[0] is True, the model runs to be compiled and reported, never backward
# (``plan_memory``, ``explain``): its region calls store no layer input (``offload``: no copy,
# no file)
ANALYSIS = [False]
# while SHAPES_ONLY[0] is True, a region call returns uninitialised outputs of the right shapes
# without running its chunks (``plan_memory`` runs a model once to compile it and reads only the
# compiled graphs: a 152k-token vocabulary's head would otherwise compute its logits and weight
# gradient on the CPU for nothing)
SHAPES_ONLY = [False]


@contextlib.contextmanager
def _on(*flags):
    """Each of ``flags`` (a one-element list) True within the block, as it was after."""
    before = [f[0] for f in flags]
    for f in flags:
        f[0] = True
    try:
        yield
    finally:
        for f, b in zip(flags, before):
            f[0] = b


def analysis():
    return _on(ANALYSIS)


def shapes_only():
    return _on(SHAPES_ONLY, ANALYSIS)   # (a run of shapes only is an analysis: it has no backward)


def _uninitialised(fake_impl, key, inputs) -> list:
    """The outputs ``fake_impl`` gives for ``inputs``, as real uninitialised tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = fake_impl(key, list(inputs))
    return [torch.empty_strided(f.shape, f.stride(), dtype=f.dtype, device=f.device) if f is not None else None
            for f in fakes]


@contextlib.contextmanager
def _timed(prog, phase: str):
    if not TIMING[0]:
        yield
        return
    sync = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        sync()
        TIMES[("layer" if isinstance(prog, LayerProgram) else "head", phase)] += time.perf_counter() - t0
@dataclasses.dataclass
class RegionProgram:
    name: str
    chunk: ChunkGraph                 # the region instantiated for a chunk
    full: ChunkGraph                  # the whole region (output shapes, fake evaluation)
    in_specs: list
    out_specs: list
    chunk_size: int | None            # None: automatic (``auto_chunk`` of the length)
    grad_inputs: list                 # indices of inputs that get a gradient
    codegen: str = "eager"
    key: int = -1
    inductor: dict = dataclasses.field(default_factory=dict)   # Inductor options of its chunk graphs' compiles
    strict: bool = False              # a run-time chunk failure raises (``failures.settle``)
    fallbacks: list = dataclasses.field(default_factory=list)  # (phase, cause) of the calls run whole, distinct
    # the gradient computed in the forward: (output, flat index) of each scalar output element
    # whose gradients with respect to the inputs the forward keeps (``forward_with_grads``), or
    # None: the backward recomputes the chunks
    seeds: tuple | None = None
    policy: object = None             # a memory budget's chunk sizes (``membudget.BudgetPolicy``)
    _said_non_finite: bool = False    # a non-finite seed gradient was warned about (``scale_grads``)
    kind = "head"

    @property
    def n_outputs(self) -> int:
        """How many values the region returns (before what a forward keeps for its backward)."""
        return len(self.out_specs) + len(getattr(self, "returned_kv", ()))

    def register(self) -> int:
        self.key = next(_ids)
        _PROGRAMS[self.key] = self
        return self.key

    @property
    def chunk_gm(self) -> fx.GraphModule:
        return self.chunk.gm

    @property
    def full_gm(self) -> fx.GraphModule:
        return self.full.gm

    # -- chunk schedule ------------------------------------------------------------------
    def length(self, inputs) -> int:
        """The sequence length of this call (every input with query rows has it)."""
        lengths = {x.shape[d] for x, spec in zip(inputs, self.in_specs) for d, role in spec.seq_dims()
                   if role == "q" and spec.merged is None}
        if len(lengths) != 1:
            raise RuntimeError(f"streamfx: the inputs of region {self.name} disagree on the sequence length "
                               f"({sorted(lengths)})")
        return lengths.pop()

    def size_for(self, T: int) -> int:
        return chunk_size(self.kind, T, self.chunk_size, self.policy)

    def bounds(self, inputs):
        T = self.length(inputs)
        return chunk_bounds(T, self.size_for(T))

    def chunk_inputs(self, inputs, s, e, lo=0, ke=None, reuse=None):
        """The chunk's inputs, with the keys [lo, ke) (default [0, e)); ``reuse``: inputs already
        sliced for rows [s, e), whose row slices are taken as they are."""
        T = self.length(inputs) if any(spec.merged for spec in self.in_specs) else None
        return [reuse[j] if reuse is not None and spec.kind in ("chunk", "whole") else spec.take(x, s, e, lo, ke, T)
                for j, (x, spec) in enumerate(zip(inputs, self.in_specs))]

    def fn(self, graph: ChunkGraph | None = None, train: bool = True) -> callable:
        """A chunk graph (default: the region's) as run: the inference compile the forward runs
        under no_grad (its outputs hold no autograd graph, so nothing of a chunk outlives it),
        or the training compile the backward differentiates."""
        graph = graph or self.chunk
        return graph.fn(self.codegen, train, self.grad_inputs, self.inductor)

    # -- forward / backward ----------------------------------------------------------------
    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        COUNTERS["region_forward"] += 1
        fn, T = self.fn(train=False), self.length(inputs)
        result = [None] * len(self.out_specs)
        with torch.no_grad():
            for s, e in self.bounds(inputs):
                COUNTERS["chunks_forward"] += 1
                with failures.chunk("forward", s, e, T):
                    self._collect(result, fn(*self.chunk_inputs(inputs, s, e)), s, e, T)
        return self._outputs(result)

    def _collect(self, result: list, outs, s: int, e: int, T: int) -> None:
        """Chunk [s, e)'s outputs into ``result``: rows of a cat output, sums accumulated in fp32
        (fp64 for fp64 outputs)."""
        for j, (o, spec) in enumerate(zip(outs, self.out_specs)):
            if spec.kind == "cat":
                _put_rows(result, j, o, spec, s, e, T)
            elif result[j] is None:
                result[j] = _acc(o)
            else:
                result[j].add_(o)

    def _outputs(self, result: list) -> list:
        """The collected outputs, sums cast back to their outputs' dtypes."""
        return [r if spec.kind == "cat" else r.to(dtype).contiguous()
                for r, spec, dtype in zip(result, self.out_specs, self._out_dtypes)]

    def forward_with_grads(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The outputs, then the gradient of every seed (one scalar output element) with respect
        to every input in ``grad_inputs`` (seed-major), each chunk run once with grad: a head
        whose outputs are a few sums computes its logits once per chunk, and its backward only
        scales these by the incoming gradients (``scale_grads``)."""
        COUNTERS["region_forward"] += 1
        fn, T = self.fn(), self.length(inputs)
        result = [None] * len(self.out_specs)
        stored = [[None] * len(self.grad_inputs) for _ in self.seeds]
        last = len(self.seeds) - 1
        for s, e in self.bounds(inputs):
            COUNTERS["chunks_forward"] += 1
            COUNTERS["chunks_backward"] += 1  # (each chunk's backward runs here, in the forward)
            with failures.chunk("forward", s, e, T), autograd_inside_op(), torch.enable_grad():
                xs = self._leaves(self.chunk_inputs(inputs, s, e))
                outs = fn(*xs)
                wrt = [xs[i] for i in self.grad_inputs]
                for k, (j, flat) in enumerate(self.seeds):
                    target = outs[j].reshape(-1)[flat]
                    got = torch.autograd.grad(target, wrt, allow_unused=True, retain_graph=k < last) \
                        if target.requires_grad else [None] * len(wrt)
                    self._store(stored[k], got, inputs, s, e)
                    del got, target
            with torch.no_grad():
                self._collect(result, [o.detach() for o in outs], s, e, T)
            del outs, xs, wrt   # (before the next chunk runs: a chunk's weight gradients are weight-sized)
        return self._outputs(result) + [self.grad_in_layout(g, i, g.dtype) if g is not None else self._stored_zeros(inputs, i)
                       for per_seed in stored for i, g in zip(self.grad_inputs, per_seed)]

    def _store(self, stored: list, got, inputs, s: int, e: int) -> None:
        """Chunk [s, e)'s gradients into one seed's buffers: rows of a per-token input written
        once (its buffer has the input's dtype), whole inputs summed over chunks in fp32."""
        for n, (i, g) in enumerate(zip(self.grad_inputs, got)):
            spec = self.in_specs[i]
            if spec.kind == "chunk":
                if stored[n] is None:
                    stored[n] = self._stored_zeros(inputs, i)
                if g is not None:
                    spec.put_rows(stored[n], g, s, e, self.length(inputs))
            elif g is not None:
                stored[n] = _sum_into(stored[n], g, _others(got, n))

    def _stored_zeros(self, inputs, i: int) -> torch.Tensor:
        x = inputs[i]
        return self.grad_empty(x, i, x.dtype if self.in_specs[i].kind == "chunk" else _acc_dtype(x)).zero_()

    def stored_fakes(self, inputs) -> list:
        """Fake values of what ``forward_with_grads`` returns after the outputs (dense, in each
        input's layout)."""
        return [self.grad_empty(inputs[i], i, inputs[i].dtype if self.in_specs[i].kind == "chunk"
                                else _acc_dtype(inputs[i]))
                for _ in self.seeds for i in self.grad_inputs]

    def scale_grads(self, grads: list, stored: list) -> list[torch.Tensor]:
        """The gradients of ``grad_inputs`` from the incoming output gradients (None where an
        output got none) and the stored seed gradients: the sum over seeds of the seed's
        incoming gradient times its stored gradient, in fp32, cast to each input's dtype."""
        COUNTERS["region_backward"] += 1
        n = len(self.grad_inputs)
        # (each seed's incoming gradient as a one-element tensor in its accumulation dtype: the
        # products are fp32 (fp64) whatever the stored gradient's dtype, as a 0-dim one would not
        # make them)
        seeds = [(k, _acc(grads[j].reshape(-1)[flat]).reshape(1))
                 for k, (j, flat) in enumerate(self.seeds) if grads[j] is not None]
        finite = not seeds or bool(torch.isfinite(torch.cat([g for _, g in seeds])).all())
        if not finite and not self._said_non_finite:
            self._said_non_finite = True
            _warn_non_finite_seed(self.name)
        result = []
        for m, i in enumerate(self.grad_inputs):
            dtype = self._in_dtypes[i]
            # (a 0-dim input's gradient is 0-dim: times a one-element tensor it would be [1])
            terms = [(s, g if s.dim() else g.reshape(())) for s, g in
                     ((stored[k * n + m], g) for k, g in seeds)]
            if not terms:
                result.append(self.grad_empty(stored[m], i, dtype).zero_())
            elif len(terms) == 1 and finite:   # (the loss alone: the product written in the input's dtype at once)
                s, g = terms[0]
                result.append(torch.mul(s, g, out=self.grad_empty(s, i, dtype)))
            else:
                acc = None
                for s, g in terms:
                    # an infinite or NaN incoming gradient (a mean over zero tokens: 0 / 0) times a
                    # stored gradient of zero is zero, as in the loss's own backward, which masks the
                    # rows it ignores after dividing by their count (``nll_loss_backward``)
                    sg = s * g if finite else torch.where(s == 0, 0, s * g)
                    acc = sg if acc is None else acc.add_(sg)
                result.append(self.grad_in_layout(acc, i, dtype))
        return result

    @functools.cached_property
    def _in_dtypes(self):
        return [n.meta["val"].dtype for n in self.full_gm.graph.find_nodes(op="placeholder")[:len(self.in_specs)]]

    @functools.cached_property
    def _out_dtypes(self):
        return [n.meta["val"].dtype for n in self.full_gm.graph.find_nodes(op="output")[0].args[0]]

    @functools.cached_property
    def grad_orders(self) -> dict:
        """Per input in ``grad_inputs``: the order of its dims in memory (``specs.dim_order`` of its
        traced value; None: row-major). Its gradient is returned in that layout, the layout
        autograd's AccumulateGrad asks of a parameter's gradient: a weight the graph reads
        transposed (``permute`` outside the region) gets its gradient transposed, so the
        graph's view back to the parameter has the parameter's own layout and autograd keeps it
        as it is (a row-major gradient would be laid out twice: here, then by AccumulateGrad)."""
        vals = [n.meta.get("val") for n in self.full_gm.graph.find_nodes(op="placeholder")[:len(self.in_specs)]]
        return {i: dim_order([hint(s) for s in vals[i].shape], [hint(s) for s in vals[i].stride()])
                if isinstance(vals[i], torch.Tensor) else None for i in self.grad_inputs}

    def grad_empty(self, x: torch.Tensor, i: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """An empty gradient of input ``x`` (input i) in its layout (``grad_orders``)."""
        return empty_in_order(x.shape, self.grad_orders.get(i), dtype or x.dtype, x.device)

    def grad_in_layout(self, g: torch.Tensor, i: int, dtype: torch.dtype) -> torch.Tensor:
        """``g`` as input i's gradient: in ``dtype`` and in the input's layout, with at most one
        copy (``g`` itself where it already is)."""
        return in_order(g, self.grad_orders.get(i), dtype)

    def backward(self, inputs: list[torch.Tensor], grads: list) -> list[torch.Tensor]:
        COUNTERS["region_backward"] += 1
        fn, T = self.fn(), self.length(inputs)
        acc = self._grad_buffers(inputs)
        for s, e in reversed(self.bounds(inputs)):
            COUNTERS["chunks_backward"] += 1
            with failures.chunk("backward", s, e, T), autograd_inside_op(), torch.enable_grad():
                xs = self._leaves(self.chunk_inputs(inputs, s, e))
                outs = fn(*xs)
                pairs = [(o, spec.rows(g, s, e, T).reshape(o.shape) if spec.kind == "cat" else g.to(o.dtype))
                         for o, g, spec in zip(outs, grads, self.out_specs)
                         if g is not None and o.requires_grad]
                if not pairs:
                    continue
                got = torch.autograd.grad([p[0] for p in pairs], [xs[i] for i in self.grad_inputs],
                                          [p[1] for p in pairs], allow_unused=True)
            self._accumulate(acc, got, s, e, given=[p[1] for p in pairs], T=T)
            del xs, outs, pairs, got   # (before the next chunk runs)
        return self._gradients(acc, inputs)

    def _grad_buffers(self, inputs) -> dict:
        """Gradient buffers: zeros for inputs read in parts (``_row_grad_dtype``); a whole input's
        (a parameter's) buffer is its first chunk's gradient, when that is a dense fp32 tensor of
        its own (else a copy in its accumulation dtype), and later chunks add into it: no
        zero-filled buffer and no full-size add for the first chunk."""
        return {i: (self.grad_empty(inputs[i], i, _row_grad_dtype(self.in_specs[i], inputs[i])).zero_()
                    if self.in_specs[i].sliced else None)
                for i in self.grad_inputs}

    def _gradients(self, acc: dict, inputs) -> list:
        """The gradients returned, dense in each input's layout and dtype (as their fake values say)."""
        return [self.grad_in_layout(acc[i], i, inputs[i].dtype) if acc[i] is not None
                else self.grad_empty(inputs[i], i).zero_() for i in self.grad_inputs]

    def _leaves(self, xs):
        xs = [x.detach() for x in xs]
        for i in self.grad_inputs:
            xs[i].requires_grad_(True)
        return xs

    def _accumulate(self, acc, got, s, e, lo=0, ke=None, given=(), T=None, specs=None):
        """Chunk [s, e)'s gradients (keys [lo, ke)) into the buffers; ``given``: the output
        gradients autograd was called with; ``T``: the call's length (read by an input that
        merges the sequence with another dim); ``specs``: how the graph read its inputs (default
        ``in_specs``)."""
        ke = e if ke is None else ke
        specs = specs or self.in_specs
        for n, (i, g) in enumerate(zip(self.grad_inputs, got)):
            if g is None:
                continue
            spec = specs[i]
            if spec.kind == "chunk":
                spec.put_rows(acc[i], g, s, e, T, add=True)
            elif spec.kind == "qk":
                acc[i].narrow(spec.dim, s, e - s).narrow(spec.kdim, lo, ke - lo).add_(g)
            elif spec.kind == "prefix":
                acc[i].narrow(spec.dim, lo, ke - lo).add_(g)
            else:
                acc[i] = _sum_into(acc[i], g, list(given) + _others(got, n), late=True)


def in_order(t: torch.Tensor, order: tuple | None, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, dense with its dims in ``order`` (``empty_in_order``), with at most one
    copy (a sum kept in a weight's layout and cast at once): ``t`` itself where it already is."""
    if t.dtype == dtype and (t.is_contiguous() if order is None else t.permute(order).is_contiguous()):
        return t
    return empty_in_order(t.shape, order, dtype, t.device).copy_(t)


def _sum_into(buf, g: torch.Tensor, given=(), late: bool = False) -> torch.Tensor:
    """``buf + g`` in ``buf`` (a gradient accumulated over chunks, in fp32 for 16-bit gradients);
    with no ``buf`` yet, ``g`` itself when it is a dense tensor of its own in the accumulation
    dtype (not sharing memory with one of the ``given`` output gradients, which autograd may hand
    back as they are), else a copy. ``late``: the first gradient is kept in its own dtype and
    promoted when a second one comes (a gradient with one contribution, a region run as one
    chunk, makes no fp32 round trip: the same values, no fp32 copy of every weight)."""
    if buf is not None:
        if buf.dtype != _acc_dtype(buf):
            buf = buf.to(_acc_dtype(buf))
        return buf.add_(g)
    dtype = g.dtype if late else _acc_dtype(g)
    if g.dtype == dtype and _owns_its_storage(g, given):
        return g
    return g.to(dtype, copy=True)   # (in its own layout where it is dense: the input's, as a rule)


def _others(got, n: int) -> list:
    """The gradients of one autograd call beside its n-th: two may share a storage (one gradient
    handed to two inputs, as it is or transposed), and a buffer kept as it is must not."""
    return [h for j, h in enumerate(got) if j != n and h is not None]


def _owns_its_storage(g: torch.Tensor, given=()) -> bool:
    """Whether ``g`` is the one dense tensor on its storage (the whole of it, in any order of dims:
    autograd gives a weight used transposed its gradient transposed, the layout of the weight) and
    that storage is none of the ``given`` tensors' (the output gradients autograd was called with,
    the other gradients it returned with ``g``). Such a gradient is kept as the sum's buffer:
    later chunks' gradients come in the same layout and add to it in memory order; the buffer is
    laid out as its input once, when it is returned (``grad_in_layout``: as a weight's, the layout
    autograd gave it, it is returned as it is)."""
    storage = g.untyped_storage()
    dense = g.permute(sorted(range(g.dim()), key=lambda d: -g.stride(d))).is_contiguous()
    return g.storage_offset() == 0 and dense \
        and storage.nbytes() == g.numel() * g.element_size() \
        and not any(t.untyped_storage().data_ptr() == storage.data_ptr() for t in given)


def _put_rows(result: list, j: int, o: torch.Tensor, spec, s: int, e: int, T: int) -> None:
    """Write a chunk's rows [s, e) of output j into its full-length buffer (made on first use)."""
    if result[j] is None:
        result[j] = o.new_empty(spec.full_length(o, e - s, T))
    spec.rows(result[j], s, e, T).copy_(spec.split(o, e - s))


_RANGE_CACHES: dict = {}


def clear_caches() -> None:
    """Forget every compiled chunk graph and every cached key range (a fresh process's state:
    compile counts measured after this are one model's alone)."""
    from . import chunks

    chunks.forget()
    _RANGE_CACHES.clear()


@dataclasses.dataclass
class MaskCheck:
    """The mask part of a layer (``streamfx.passes.reach``) and how its values hide keys: one
    (kind, fill_finite, key_dim) per output of the graph, one output per distinct mask of the
    layer's attention sites. Layers with the same mask graph share its cache (every layer of a
    model reads one mask)."""
    graph: ChunkGraph
    inputs: list          # indices of the layer inputs it reads
    forms: tuple

    @functools.cached_property
    def _cache_key(self) -> tuple:
        return (self.graph.gm.code, tuple(s.key() for s in self.graph.slots), self.forms)

    @property
    def cache(self) -> keyranges.RangeCache:
        return _RANGE_CACHES.setdefault(self._cache_key, keyranges.RangeCache())


@dataclasses.dataclass
class Keep:
    """What a layer keeps of its attention from the forward for the backward (``attention="keep"``,
    built by ``passes.rewrite.keep_attention``): per fused attention its output (the kernel's
    layout) and merged log-sum-exp ([B, H, T] fp32), whole-length buffers the region op returns
    after its outputs. The backward's chunks then run the kernel's backward from them instead of
    its forward again. ``fwd``/``bwd``: per query graph variant ("chunk", "causal") that has them,
    the graph that also returns them and the graph that reads them (placeholders after the keys
    and values); a call that runs another variant leaves its buffers unused and recomputes.
    ``full``: the whole region with each attention's output and raw log-sum-exp as more outputs
    (their shapes, and a forward run whole). ``slots``: out, lse per attention, at chunk shape."""
    fwd: dict
    bwd: dict
    full: ChunkGraph
    slots: tuple
    kernels: tuple            # per attention: its kernel's name (the whole graph's raw lse layout)
    raw: dict = dataclasses.field(default_factory=dict)  # per variant, per attention: whether its
                              # keeping graph returns the kernel's raw lse (a kernel's own call), not blocks' merged one
    why: dict = dataclasses.field(default_factory=dict)  # per variant that keeps nothing: why

    @functools.cached_property
    def dims(self) -> tuple:
        """The sequence dim of each kept tensor."""
        return tuple(next(d for d, n in enumerate(s.shape) if isinstance(n, str)) for s in self.slots)

    def empty(self, shapes: list, device) -> list:
        """Whole-length buffers of the given shapes, laid out as the slots say (the fake and the
        real values of the region op's outputs alike)."""
        return [empty_in_order(shape, slot.order, slot.dtype, device) for shape, slot in zip(shapes, self.slots)]

    def tensors(self, extra: list, raw) -> list:
        """A keeping graph's extra outputs (output, lse per attention) as the kept tensors: the
        lse of an attention whose ``raw`` flag is set is the kernel's own (a kernel's call), its
        [B, H, L] fp32 view taken; blocks give their merged one already."""
        from .passes import kernels
        got = list(extra)
        for i, (name, is_raw) in enumerate(zip(self.kernels, raw)):
            if is_raw:
                got[2 * i + 1] = _acc(kernels.BY_NAME[name].lse_view(got[2 * i + 1], got[2 * i].shape[-2]))
        return got

    def shapes_like(self, kept_chunk: list, T: int) -> list:
        """The whole-length shapes of kept tensors given one chunk's."""
        return [tuple(T if d == dim else n for d, n in enumerate(t.shape)) for t, dim in zip(kept_chunk, self.dims)]


@dataclasses.dataclass
class LayerProgram(RegionProgram):
    """A transformer layer: ``kv`` gives a chunk's keys and values (or what they are computed
    from, MLA's latent), ``chunk`` a chunk's output from its queries and the keys/values
    [lo, hi) it reads.

    Keys per chunk: [0, e) for causal attention without a mask; [s - reach, e) for a layer whose
    token mixing is causal convolutions alone (``reach``: the most rows before its own a row
    reads); with a mask, the keys its rows
    may see (``mask``, evaluated per call, cached while the mask's inputs do not change). A
    chunk that reads keys after its own end is "wide".

    Forward: chunks in order; keys/values are written into full-length buffers as they come
    (ahead of the chunk for a wide one). Backward: keys/values for the whole sequence once;
    wide chunks first, then every chunk in reverse: recompute the chunk, backward it,
    accumulate dK/dV over its keys in fp32 and the parameter gradients; rows [s, e) of dK/dV
    are then final (every chunk that reads them has run), so they go back through the K/V
    producers at once and the chunk's input gradient is complete.
    """

    kind = "layer"
    kv: ChunkGraph | None = None
    kv_dims: tuple = (None, None)  # the sequence dim of each K/V graph output
    mask: MaskCheck | None = None
    causal: ChunkGraph | None = None  # the query graph with its fused attention's masks dropped
                                      # (the kernel's own causal attention), for a call whose
                                      # masks are all exactly causal
    keep: Keep | None = None          # attention outputs kept for the backward (attention="keep")
    keep_refused: str | None = None   # why attention="keep" keeps nothing here
    reach: int | None = None          # a layer that mixes rows by causal convolutions only: a row reads this many before it
    convolved: bool = False           # a layer with causal convolutions beside masked attention (``key_ranges``)
    # causal convolutions in the K/V graph: a chunk's K/V graph reads rows [s - kv_reach, e) by
    # ``kv_specs`` and its outputs' last e - s rows are the chunk's
    kv_reach: int = 0
    kv_specs: list | None = None
    # values the region also returns after the query graph's outputs, from the K/V graph's
    # full-length buffers (a KV cache): (index of the K/V graph output, ChunkGraph of the views from
    # it to the returned value, or None). Where the caller differentiates one, its gradient starts
    # the backward's dK/dV.
    returned_kv: tuple = ()
    _said_recomputes: bool = False    # a call whose masks are not exactly causal was warned about

    @property
    def kv_gm(self) -> fx.GraphModule:
        return self.kv.gm

    def key_ranges(self, inputs, bounds) -> list:
        """(lo, hi) of the keys each chunk reads. A layer with causal convolutions beside masked
        attention reads its keys from the first: a convolution's rows before the chunk's (its own
        rows' reach, or every row of convolved keys) are then read whatever the mask lets the
        attention see; a chunk whose mask lets it see keys after its own rows cannot line the
        convolution's rows up with its own, and the call runs whole."""
        ranges = self._read_mask(inputs, bounds)[0]
        if self.convolved and self.mask is not None:
            wide = [(s, e) for (s, e), (_, hi) in zip(bounds, ranges) if hi > e]
            if wide:
                raise RuntimeError(f"the mask lets the rows of chunk {list(wide[0])} see keys after them, in a layer "
                                   "with a causal convolution")
            ranges = [(0, hi) for _, hi in ranges]
        return ranges

    def query_graph(self, inputs, bounds) -> ChunkGraph:
        """The query graph a call runs: ``causal`` where every chunk's masks are exactly causal
        (a trainer's all-ones attention mask, a causal mask too long to evaluate at compile time)."""
        if self.causal is not None and self._read_mask(inputs, bounds)[1]:
            COUNTERS["mask_found_causal"] += 1
            return self.causal
        return self.chunk

    def _read_mask(self, inputs, bounds) -> tuple:
        """(key ranges, whether every chunk's masks are exactly causal), read from the mask."""
        if self.mask is None:
            return [(0 if self.reach is None else max(0, s - self.reach), e) for s, e in bounds], False
        m, T = self.mask, self.length(inputs)
        reads = [inputs[i] for i in m.inputs]
        extra = (T, tuple(bounds))
        cached = m.cache.get(reads, extra)
        if cached is not None:
            return cached
        COUNTERS["mask_checks"] += 1
        fn = m.graph.fn(self.codegen, train=False, inductor=self.inductor)
        specs = [self.in_specs[i] for i in m.inputs]
        rows = []
        with torch.no_grad():
            for s, e in bounds:
                with failures.chunk("mask check", s, e, T):
                    blocks = fn(*[spec.take(x, s, e, 0, T, T) for x, spec in zip(reads, specs)])
                    rows.append(keyranges.union([keyranges.reach(b, (s, e), *form) for b, form in zip(blocks, m.forms)]))
        rows = torch.stack(rows)
        result = keyranges.ranges_from_reach(rows, bounds, T), keyranges.all_causal(rows)
        m.cache.put(reads, extra, result)
        return result

    def _returned(self, KV, k: int, views, train: bool = False) -> torch.Tensor:
        """A value the layer returns from its K/V buffers (``returned_kv``): buffer k, through
        ``views`` where the value is a view of it (``train``: differentiably)."""
        if views is None:
            return KV[k]
        return views.fn("eager", train)(KV[k])[0]

    def keys_values(self, inputs, fn_kv):
        """Run the K/V graph chunk by chunk into full-length buffers; yields (s, e, the chunk's
        inputs, the buffers) after each chunk's rows are written (inputs None where the K/V graph
        read rows before the chunk's: not the query graph's)."""
        bufs, T = None, self.length(inputs)
        for s, e in self.bounds(inputs):
            with failures.chunk("keys and values", s, e, T):
                xs = self.kv_inputs(inputs, s, e)
                kvs = fn_kv(*xs)
                if bufs is None:
                    bufs = [seq_major_empty(t, d, T) for t, d in zip(kvs, self.kv_dims)]
                for buf, t, d in zip(bufs, kvs, self.kv_dims):
                    buf.narrow(d, s, e - s).copy_(t.narrow(d, t.shape[d] - (e - s), e - s))
            yield s, e, (None if self.kv_reach else xs), bufs

    def kv_inputs(self, inputs, s, e):
        """The K/V graph's inputs for chunk [s, e): the chunk's, or with causal convolutions in
        it, rows [s - kv_reach, e) of the per-row ones."""
        if not self.kv_reach:
            return self.chunk_inputs(inputs, s, e)
        lo = max(0, s - self.kv_reach)
        return [spec.take(x, s, e, lo, e) for x, spec in zip(inputs, self.kv_specs)]

    def kv_grads(self, dKV, s, e):
        """The gradients of chunk [s, e)'s K/V graph outputs: rows [s, e) of ``dKV``, after zeros
        for the rows before them that a convolution in it read (their gradients come with their
        own chunk)."""
        rows = [g.narrow(d, s, e - s) for g, d in zip(dKV, self.kv_dims)]
        lo = max(0, s - self.kv_reach)
        if lo == s:
            return rows
        return [torch.cat([g.new_zeros(g.shape[:d] + (s - lo,) + g.shape[d + 1:]), g], d)
                for g, d in zip(rows, self.kv_dims)]

    def prefix(self, bufs, lo, ke):
        """Rows [lo, ke) of the K/V buffers: views of the sequence-major buffers, no copy."""
        return [b.narrow(d, lo, ke - lo) for b, d in zip(bufs, self.kv_dims)]

    def variant(self, graph: ChunkGraph) -> str:
        return "causal" if graph is self.causal else "chunk"

    def forward(self, inputs):
        COUNTERS["region_forward"] += 1
        bounds, T = self.bounds(inputs), self.length(inputs)
        ranges = self.key_ranges(inputs, bounds)
        graph = self.query_graph(inputs, bounds)
        keeping = self.keep.fwd.get(self.variant(graph)) if self.keep is not None else None
        fn, fn_kv = self.fn(keeping or graph, train=False), self.fn(self.kv, train=False)
        result, kept, n = [None] * len(self.out_specs), None, len(self.out_specs)
        kv, done, KV, xs = self.keys_values(inputs, fn_kv), 0, None, None

        def written_up_to(end):
            nonlocal done, KV, xs
            while done < end:
                _, done, xs, KV = next(kv)

        with torch.no_grad():
            for (s, e), (lo, hi) in zip(bounds, ranges):
                COUNTERS["chunks_forward"] += 1
                with failures.chunk("forward", s, e, T):
                    written_up_to(max(e, hi))
                    chunk = self.chunk_inputs(inputs, s, e, lo, hi, reuse=xs if done == e else None)
                    outs = fn(*chunk, *self.prefix(KV, lo, hi))
                    for j, spec in enumerate(self.out_specs):
                        _put_rows(result, j, outs[j], spec, s, e, T)
                    if keeping is not None:
                        got = self.keep.tensors(outs[n:], self.keep.raw[self.variant(graph)])
                        if kept is None:
                            kept = self.keep.empty(self.keep.shapes_like(got, T), got[0].device)
                        for buf, t, d in zip(kept, got, self.keep.dims):
                            buf.narrow(d, s, e - s).copy_(t)
                    del outs, chunk   # (before the next chunk runs)
            written_up_to(T)  # (a generator left unfinished would hold its buffers)
        result += [dense(self._returned(KV, k, views)) for k, views in self.returned_kv]
        if self.keep is None:
            return result
        if kept is None:   # (this call's masks are not exactly causal: its backward recomputes)
            if not self._said_recomputes:
                self._said_recomputes = True
                why = self.keep.why.get(self.variant(graph), "")
                warnings.warn(f"streamfx: attention='keep': a call of region '{self.name}' (T={T}) runs its "
                              f"{'masked' if graph is self.chunk else self.variant(graph)} query graph, which keeps "
                              f"nothing ({why}): its backward recomputes the attention, and the buffers kept for "
                              f"it go unused (said once per region)", stacklevel=2)
            kept = self.keep.empty(self._kept_shapes(inputs, T), inputs[0].device)
        return result + kept

    def _kept_shapes(self, inputs, T) -> list:
        """The whole-length shapes of the kept tensors at these inputs, from the kept slots' sizes
        (the symbols of the inputs' slots)."""
        env = {}
        for slot, x in zip(self.chunk.slots, inputs):
            for d, size in enumerate(slot.shape):
                if not isinstance(size, (int, str)) and size.is_Symbol:
                    env[size] = x.shape[d]
        return [tuple(T if isinstance(n, str) else (n if isinstance(n, int) else int(n.subs(env))) for n in slot.shape)
                for slot in self.keep.slots]

    def backward(self, inputs, grads, kept=()):
        """``kept``: what the forward kept of the attention (``Keep``), if it kept it."""
        COUNTERS["region_backward"] += 1
        with torch.no_grad():
            for _, _, _, KV in self.keys_values(inputs, self.fn(self.kv, train=False)):
                pass
        dKV = [torch.zeros_like(b, dtype=_acc_dtype(b)) for b in KV]
        n = len(self.out_specs)
        for (k, views), g in zip(self.returned_kv, grads[n:]):   # (a returned KV cache the caller differentiated)
            if g is None:
                continue
            if views is not None:
                with autograd_inside_op(), torch.enable_grad():
                    leaf = KV[k].detach().requires_grad_(True)
                    g, = torch.autograd.grad(self._returned([leaf], 0, views, train=True), leaf, g.to(leaf.dtype))
            dKV[k].add_(g)
        grads = grads[:n]
        acc = self._grad_buffers(inputs)
        bounds, T = self.bounds(inputs), self.length(inputs)
        ranges = self.key_ranges(inputs, bounds)
        graph = self.query_graph(inputs, bounds)
        reads_kept = self.keep.bwd.get(self.variant(graph)) if self.keep is not None and kept else None
        if reads_kept is None:
            kept = ()
        query = reads_kept or graph
        vjp_kv, vjp = self.vjp(self.kv), self.vjp(query)
        fn_kv = self.fn(self.kv) if vjp_kv is None else None
        fn = self.fn(query) if vjp is None else None
        dims = self.keep.dims if kept else ()
        # wide chunks first: their dK/dV reach rows after them
        for (s, e), (lo, hi) in zip(bounds, ranges):
            if hi > e:
                rows = [b.narrow(d, s, e - s) for b, d in zip(kept, dims)]
                self._query_backward(vjp, fn, inputs, grads, KV, dKV, acc, s, e, lo, hi, rows)
                if rows:
                    COUNTERS["attention_kept"] += 1
        for (s, e), (lo, hi) in reversed(list(zip(bounds, ranges))):
            COUNTERS["chunks_backward"] += 1
            sliced = None
            if hi <= e:
                rows = [b.narrow(d, s, e - s) for b, d in zip(kept, dims)]
                sliced = self._query_backward(vjp, fn, inputs, grads, KV, dKV, acc, s, e, lo, hi, rows)
                if rows:
                    COUNTERS["attention_kept"] += 1
            # rows [s, e) of dK/dV are final: push them through the K/V producers now
            lo = 0   # (the keys [lo, e) a prefix input of the K/V graph was read over)
            if self.kv_reach:
                sliced, lo = None, max(0, s - self.kv_reach)   # (it reads rows before the chunk's)
            if vjp_kv is not None:
                with failures.chunk("backward", s, e, T):
                    xs = sliced if sliced is not None else self.kv_inputs(inputs, s, e)
                    ran = vjp_kv(xs, self.kv_grads(dKV, s, e))
                if ran is not None:
                    self._accumulate(acc, ran[0], s, e, lo, e, given=ran[1], T=T, specs=self.kv_specs)
                del xs, ran, sliced
                continue
            with failures.chunk("backward", s, e, T), autograd_inside_op(), torch.enable_grad():
                xs = self._leaves(sliced if sliced is not None else self.kv_inputs(inputs, s, e))
                kvs = fn_kv(*xs)
                # K or V may depend on nothing trainable (LoRA on q/v only: K comes from frozen
                # weights and, in the first layer, from an input that needs no gradient)
                pairs = [(t, g.to(t.dtype)) for t, g in zip(kvs, self.kv_grads(dKV, s, e)) if t.requires_grad]
                if not pairs:
                    continue
                got = torch.autograd.grad([p[0] for p in pairs], [xs[i] for i in self.grad_inputs],
                                          [p[1] for p in pairs], allow_unused=True)
            self._accumulate(acc, got, s, e, lo, e, given=[p[1] for p in pairs], T=T, specs=self.kv_specs)
            del xs, kvs, pairs, got, sliced   # (before the next chunk runs)
        return self._gradients(acc, inputs)

    def _query_backward(self, vjp, fn, inputs, grads, KV, dKV, acc, s, e, lo, hi, kept_rows=()):
        """Recompute chunk [s, e) against keys [lo, hi), backward it; accumulate the parameter
        and chunk input gradients and dK/dV over [lo, hi). Returns the chunk's sliced inputs.
        ``vjp``: the query graph's ``Vjp``, else ``fn`` (its training compile) and autograd run
        it. ``kept_rows``: the chunk's rows of the kept attention tensors (both read them)."""
        T = self.length(inputs)
        if vjp is not None:
            with failures.chunk("backward", s, e, T):
                sliced = self.chunk_inputs(inputs, s, e, lo, hi)
                prefix = self.prefix(KV, lo, hi)
                ran = vjp([*sliced, *prefix, *kept_rows],
                          [spec.rows(g, s, e, T) if g is not None else None for g, spec in zip(grads, self.out_specs)])
            if ran is None:
                return sliced
            got, n = ran[0], len(prefix)
            self._accumulate(acc, got[:-n], s, e, lo, hi, given=list(ran[1]) + [g for g in got[-n:] if g is not None],
                             T=T)
            for buf, g, d in zip(dKV, got[-n:], self.kv_dims):
                if g is not None:
                    buf.narrow(d, lo, hi - lo).add_(g)
            return sliced
        with failures.chunk("backward", s, e, T), autograd_inside_op(), torch.enable_grad():
            sliced = self.chunk_inputs(inputs, s, e, lo, hi)
            xs = self._leaves(sliced)
            prefix = [t.detach().requires_grad_(True) for t in self.prefix(KV, lo, hi)]
            outs = fn(*xs, *prefix, *kept_rows)
            pairs = [(o, spec.rows(g, s, e, T).reshape(o.shape)) for o, g, spec in zip(outs, grads, self.out_specs)
                     if g is not None and o.requires_grad]
            if not pairs:
                return sliced
            wrt = [xs[i] for i in self.grad_inputs] + prefix
            got = torch.autograd.grad([p[0] for p in pairs], wrt, [p[1] for p in pairs], allow_unused=True)
        n = len(prefix)
        self._accumulate(acc, got[:-n], s, e, lo, hi,
                         given=[p[1] for p in pairs] + [g for g in got[-n:] if g is not None], T=T)
        for buf, g, d in zip(dKV, got[-n:], self.kv_dims):
            if g is not None:
                buf.narrow(d, lo, hi - lo).add_(g)
        return sliced

    def _grads_of(self, graph: ChunkGraph) -> list:
        """The inputs of a chunk graph that get a gradient: the region's, and the K/V prefix (a
        query graph's last inputs)."""
        n = len(self.in_specs)
        queries = graph is self.chunk or graph is self.causal or (
            self.keep is not None and any(graph is g for g in (*self.keep.fwd.values(), *self.keep.bwd.values())))
        return list(self.grad_inputs) + (list(range(n, n + len(self.kv_dims))) if queries else [])

    def vjp(self, graph: ChunkGraph):
        """The chunk graph's recomputation and backward compiled as one graph (``ChunkGraph.vjp``),
        or None: its training compile and autograd run it. Its gradients come in ascending input
        order, the order of ``_grads_of`` (``grad_inputs`` are numbered in input order)."""
        order = self._grads_of(graph)
        if order != sorted(order):
            raise AssertionError(f"streamfx: {graph.name}: gradient inputs out of order {order}")
        return graph.vjp(self.codegen, order, self.inductor)

    def fn(self, graph: ChunkGraph | None = None, train: bool = True):
        graph = graph or self.chunk
        # the query graph's last inputs are the K/V prefix: with train, they get gradients
        grads = self._grads_of(graph)
        if (graph is self.chunk or graph is self.causal) and self.causal is not None:
            # both query graphs compile together: a later call whose masks turn exactly causal
            # (or stop being so) runs code compiled already, as every later length does
            other = self.causal if graph is self.chunk else self.chunk
            other.fn(self.codegen, train, grads, self.inductor)
        return graph.fn(self.codegen, train, grads, self.inductor)


def seq_major_empty(t: torch.Tensor, d: int, length: int) -> torch.Tensor:
    """An empty tensor like ``t`` with ``length`` along dim ``d``, laid out with ``d`` outermost:
    its prefixes [0, e) along ``d`` are dense views whose strides do not depend on e, so one
    compiled chunk graph reads every prefix in place."""
    shape = list(t.shape)
    shape[d] = length
    return empty_in_order(shape, leading(d, t.dim()), t.dtype, t.device)


def autograd_inside_op():
    """Re-enable autograd dispatch inside a custom op kernel (which runs below autograd), so the
    backward can recompute a chunk and differentiate it."""
    DK = torch._C.DispatchKey
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for k in (DK.AutogradFunctionality, DK.AutogradOther, DK.AutogradNestedTensor, DK.ADInplaceOrView):
        exclude = exclude.remove(k)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


@contextlib.contextmanager
def no_nan_check():
    """Anomaly mode, where the user turned it on, without its check of every backward's outputs for
    NaN while a backward is traced through fake tensors (the check reads a value, which a fake
    tensor has not), as AOTAutograd traces its joint graph; its tracebacks stay on."""
    if not torch.is_anomaly_enabled():
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Anomaly Detection has been enabled")
        with torch.autograd.set_detect_anomaly(True, check_nan=False):
            yield


@contextlib.contextmanager
def fake_autograd():
    """The state a chunk graph's backward is traced in through fake tensors, as AOTAutograd traces
    its joint graph: autograd dispatch on (``autograd_inside_op``: also inside a custom op's
    kernel, where a budget policy sizes chunks), the Python dispatcher (the shape rules of some
    ops, baddbmm's broadcast of its input, take symbolic sizes only there) and ``no_nan_check``."""
    from torch._dispatch.python import enable_python_dispatcher

    with autograd_inside_op(), enable_python_dispatcher(), no_nan_check():
        yield


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    return accumulation_dtype(x.dtype)


def _acc(x: torch.Tensor) -> torch.Tensor:
    """``x`` in its accumulation dtype (itself where it is in it already)."""
    return x.to(_acc_dtype(x))


def _row_grad_dtype(spec, x: torch.Tensor) -> torch.dtype:
    """The dtype of the gradient buffer of an input read in parts. An element of an input read
    by one chunk ("chunk" rows, "qk" blocks) gets at most two gradients, both in its dtype: its
    chunk's (the queries' backward) and, in a layer with keys and values, its rows' through the
    K/V producers. Zeros plus the first is that value exactly and adding the second rounds once
    to fp32 and once to the dtype in an fp32 buffer and in one of the input's dtype alike, so
    the buffer is in the input's dtype: the same bits without an fp32 copy of the whole length
    and its cast at the end. A "prefix" input sums a gradient per chunk over its rows: fp32 for
    a 16-bit input."""
    return x.dtype if spec.kind in ("chunk", "qk") else _acc_dtype(x)


# ---- the custom ops --------------------------------------------------------------------------
@torch.library.custom_op("streamfx::region", mutates_args=())
def region(key: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run a streamed region forward, chunk by chunk (and for a region with ``seeds``, its
    seeds' gradients after its outputs, see ``RegionProgram.forward_with_grads``)."""
    prog = _PROGRAMS[key]
    if prog.policy is not None:   # a length no chunk size fits raises here, before any chunk runs
        prog.size_for(prog.length(list(inputs)))
    if SHAPES_ONLY[0]:
        return _uninitialised(_region_fake, key, inputs)
    try:
        with _timed(prog, "forward"):
            return prog.forward_with_grads(list(inputs)) if prog.seeds is not None else prog.forward(list(inputs))
    except Exception as err:  # noqa: BLE001 - raised as the error asks, or the region runs whole
        failures.settle(prog, err, "forward")
        if prog.seeds is not None:
            return _forward_with_grads_whole(prog, list(inputs))
        with torch.no_grad():
            if _keeps(prog):   # (the whole graph's attention output and log-sum-exp kept as the chunks' would be)
                return _forward_keeping_whole(prog, list(inputs))
            return [dense(o) for o in prog.full.fn("eager", train=False)(*inputs)]


def dense(o: torch.Tensor) -> torch.Tensor:
    """A copy of a region output, contiguous: the layout every path of the op returns (the chunked
    forward writes rows into a contiguous buffer; an output that is a transposed view in the graph,
    keys returned as a KV cache, leaves the op contiguous all the same)."""
    return o.clone(memory_format=torch.contiguous_format)


def _keeps(prog) -> bool:
    return getattr(prog, "keep", None) is not None


def _forward_keeping_whole(prog, inputs: list, fake: bool = False) -> list:
    """A keeping layer's outputs and kept tensors from its whole graph (no chunks); ``fake``:
    their fake values (shapes only)."""
    outs = list(prog.keep.full.fn("eager", train=False)(*inputs))
    n = prog.n_outputs
    got = prog.keep.tensors(outs[n:], [True] * len(prog.keep.kernels))   # (the whole graph's kernel calls)
    kept = prog.keep.empty([t.shape for t in got], got[0].device)
    if not fake:
        for buf, t in zip(kept, got):
            buf.copy_(t)
    return [dense(o) if o is not None else o for o in outs[:n]] + kept


def _forward_with_grads_whole(prog: RegionProgram, inputs: list) -> list:
    """What ``forward_with_grads`` returns, from the whole region graph (no chunks)."""
    with autograd_inside_op(), torch.enable_grad():
        xs = prog._leaves(inputs)
        outs = prog.full.fn("eager", train=True)(*xs)
        wrt = [xs[i] for i in prog.grad_inputs]
        stored = []
        for k, (j, flat) in enumerate(prog.seeds):
            target = outs[j].reshape(-1)[flat]
            got = torch.autograd.grad(target, wrt, allow_unused=True, retain_graph=True) \
                if target.requires_grad else [None] * len(wrt)
            stored += [prog.grad_in_layout(g, i, z.dtype) if g is not None else z
                       for i, g, z in zip(prog.grad_inputs, got, (prog._stored_zeros(inputs, i) for i in prog.grad_inputs))]
    return [dense(o.detach()) for o in outs] + stored


def _backward_whole(prog: RegionProgram, inputs: list, grads: list) -> list:
    """The gradients of ``backward`` from the whole region graph (no chunks)."""
    with autograd_inside_op(), torch.enable_grad():
        xs = prog._leaves(inputs)
        outs = prog.full.fn("eager", train=True)(*xs)
        pairs = [(o, g.to(o.dtype)) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        got = torch.autograd.grad([o for o, _ in pairs], [xs[i] for i in prog.grad_inputs],
                                  [g for _, g in pairs], allow_unused=True) if pairs else [None] * len(prog.grad_inputs)
    return [prog.grad_in_layout(g, i, g.dtype) if g is not None else prog.grad_empty(inputs[i], i).zero_()
            for i, g in zip(prog.grad_inputs, got)]


@region.register_fake
def _region_fake(key, inputs):
    prog = _PROGRAMS[key]
    with _fresh_unbacked_discarded(inputs):
        if _keeps(prog):
            return _forward_keeping_whole(prog, list(inputs), fake=True)
        outs = [dense(o) if o is not None else o for o in prog.full.fn("eager", train=False)(*inputs)]
    return outs + (prog.stored_fakes(inputs) if prog.seeds is not None else [])


def _fresh_unbacked_discarded(tensors):
    """The region graph run on fake inputs for its outputs' shapes: the sizes it reads from data
    inside (``.tolist()`` of tokens per expert, unbacked symbols) size no output, and are dropped."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([t for t in tensors if isinstance(t, torch.Tensor)])
    env = getattr(mode, "shape_env", None)
    return env.ignore_fresh_unbacked_symbols() if env is not None else contextlib.nullcontext()


@torch.library.custom_op("streamfx::region_backward", mutates_args=())
def region_backward(key: int, inputs: list[torch.Tensor], grads: list[torch.Tensor],
                    present: list[bool], kept: list[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients of a streamed region's inputs (those in ``grad_inputs``), chunk by chunk in reverse.
    ``present[j]`` is False where output j got no gradient (its entry in ``grads`` is a placeholder);
    ``kept``: what a layer's forward kept of its attention (``Keep``)."""
    prog = _PROGRAMS[key]
    grads = [g if p else None for g, p in zip(grads, present)]
    try:
        with _timed(prog, "backward"):
            if kept:
                return prog.backward(list(inputs), grads, list(kept))
            return prog.backward(list(inputs), grads)
    except Exception as err:  # noqa: BLE001 - raised as the error asks, or the region runs whole
        failures.settle(prog, err, "backward")
        return _backward_whole(prog, list(inputs), grads)


@region_backward.register_fake
def _region_backward_fake(key, inputs, grads, present, kept):
    prog = _PROGRAMS[key]
    return [prog.grad_empty(inputs[i], i) for i in prog.grad_inputs]


def _warn_non_finite_seed(name: str) -> None:
    warnings.warn(f"streamfx: region '{name}' (head_grad='forward') got an infinite or NaN gradient for a "
                  "loss sum it kept the gradient of (a mean over zero tokens: every label ignored, a zero "
                  "num_items_in_batch): its gradients are zero where the kept gradient is zero, as a "
                  "PyTorch loss's backward gives for the rows it ignores, and inf or NaN elsewhere; a loss "
                  "that multiplies by its mask before dividing gets NaN there in eager. "
                  "options={'head_grad': 'recompute'} runs the loss's own backward ops", stacklevel=2)


@torch.library.custom_op("streamfx::region_scale", mutates_args=())
def region_scale(key: int, grads: list[torch.Tensor], present: list[bool],
                 stored: list[torch.Tensor]) -> list[torch.Tensor]:
    """The backward of a region whose forward kept its seeds' gradients (``stored``): they
    scaled by the incoming gradients (``RegionProgram.scale_grads``); nothing is recomputed."""
    grads = [g if p else None for g, p in zip(grads, present)]
    with _timed(_PROGRAMS[key], "backward"):
        return _PROGRAMS[key].scale_grads(grads, list(stored))


@region_scale.register_fake
def _region_scale_fake(key, grads, present, stored):
    prog = _PROGRAMS[key]
    return [prog.grad_empty(g, i, prog._in_dtypes[i]) for g, i in zip(stored, prog.grad_inputs)]


def _setup(ctx, inputs, output):
    key, xs = inputs
    ctx.key = key
    prog = _PROGRAMS[key]
    ctx.n_inputs = len(xs)
    if prog.seeds is not None:  # the backward reads the stored gradients, not the inputs
        stored = output[prog.n_outputs:]
        ctx.mark_non_differentiable(*stored)
        ctx.save_for_backward(*stored)
    elif _keeps(prog):   # the inputs, and the attention kept for the backward
        kept = output[prog.n_outputs:]
        ctx.mark_non_differentiable(*kept)
        ctx.save_for_backward(*xs, *kept)
    else:
        ctx.save_for_backward(*xs)


def _backward(ctx, grads):
    prog = _PROGRAMS[ctx.key]
    saved = list(ctx.saved_tensors)
    grads = list(grads)[:prog.n_outputs]
    present = [g is not None for g in grads]
    gs = [g if g is not None else saved[0].new_empty(0) for g in grads]
    if prog.seeds is not None:
        got = region_scale(ctx.key, gs, present, saved)
        result = [None] * ctx.n_inputs
        for i, g in zip(prog.grad_inputs, got):
            result[i] = g
        return None, result
    xs, kept = saved[:ctx.n_inputs], saved[ctx.n_inputs:]
    got = region_backward(ctx.key, xs, gs, present, kept)
    result = [None] * len(xs)
    for i, g in zip(prog.grad_inputs, got):
        result[i] = g
    return None, result


region.register_autograd(_backward, setup_context=_setup)

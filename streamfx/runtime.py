"""Runtime of streamed regions: the ``streamfx::region`` op, its backward, and the chunk loop.

A ``RegionProgram`` holds one region's chunk graph (the region instantiated for a chunk of
tokens) and how its inputs are read and its outputs put together (``streamfx.passes.specs``);
a chunk [s, e) reads keys [lo, e), lo = 0 or, for a sliding window of W keys, max(0, s - W + 1).
Forward runs the chunks in order without grad; backward runs them in reverse, recomputing each
chunk with grad and calling autograd on it, so only one chunk's activations exist at a time.
Chunk graphs are compiled once (codegen "inductor": dynamic chunk length) and shared by every
region program with the same graph code.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import warnings
from typing import Callable

import torch
import torch.fx as fx
from torch._functorch import config as functorch_config
from torch.fx._lazy_graph_module import _LazyGraphModule

_PROGRAMS: dict[int, "RegionProgram"] = {}
_COMPILED: dict[tuple, Callable] = {}
_ids = itertools.count()
COUNTERS = {"region_forward": 0, "region_backward": 0, "chunks_forward": 0, "chunks_backward": 0,
            "chunk_compiles": 0, "chunk_compile_failures": 0}


@dataclasses.dataclass
class RegionProgram:
    name: str
    chunk_gm: fx.GraphModule          # region graph instantiated for a chunk
    full_gm: fx.GraphModule           # the original region graph (shapes, fake evaluation)
    in_specs: list
    out_specs: list
    chunk_size: int
    grad_inputs: list                 # indices of inputs that get a gradient
    codegen: str = "eager"
    key: int = -1
    window: int | None = None         # sliding window: a query at t sees keys (t - window, t]
    row_check: bool = False           # the region also returns which chunks ran against every key

    def register(self) -> int:
        self.key = next(_ids)
        _PROGRAMS[self.key] = self
        return self.key

    # -- chunk schedule ------------------------------------------------------------------
    def length(self, inputs) -> int:
        for x, spec in zip(inputs, self.in_specs):
            if spec.kind == "chunk":
                return x.shape[spec.dim]
        raise AssertionError("region without a chunked input")

    def bounds(self, inputs):
        T, c = self.length(inputs), self.chunk_size
        return [(s, min(s + c, T)) for s in range(0, T, c)]

    def key_start(self, s: int) -> int:
        """First key any query of a chunk starting at ``s`` can see."""
        return max(0, s - self.window + 1) if self.window else 0

    def chunk_inputs(self, inputs, s, e, lo=None, ke=None):
        """The chunk's inputs, with the keys [lo, ke) (default: [key_start(s), e))."""
        lo = self.key_start(s) if lo is None else lo
        return [spec.take(x, s, e, lo, ke) for x, spec in zip(inputs, self.in_specs)]

    def fn(self, gm: fx.GraphModule | None = None, inputs=None, prefix=(), train: bool = True) -> Callable:
        """The chunk graph (or ``gm``) as run: itself, or compiled by Inductor once per distinct
        graph code, with symbolic chunk and prefix lengths (``inputs``: the region inputs).
        ``train=False`` gives the inference compile the forward runs under no_grad: its outputs
        hold no autograd graph, so nothing of a chunk outlives it."""
        gm = gm if gm is not None else self.chunk_gm
        if self.codegen == "eager":
            return gm
        key = (gm.code, tuple(self.in_specs), tuple(str(t.dtype) for t in inputs), train)
        if key not in _COMPILED:
            COUNTERS["chunk_compiles"] += 1
            try:
                _COMPILED[key] = compile_chunk_graph(gm, self, inputs, prefix, train)
            except Exception as e:  # noqa: BLE001 - Inductor limits on symbolic shapes
                COUNTERS["chunk_compile_failures"] += 1
                warnings.warn(f"streamfx: a chunk graph of {self.name} runs as an FX graph, Inductor "
                              f"could not compile it ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
                _COMPILED[key] = gm
        return _COMPILED[key]

    # -- forward / backward ----------------------------------------------------------------
    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        COUNTERS["region_forward"] += 1
        fn, T = self.fn(inputs=inputs, train=False), self.length(inputs)
        result = [None] * len(self.out_specs)
        with torch.no_grad():
            for s, e in self.bounds(inputs):
                COUNTERS["chunks_forward"] += 1
                outs = fn(*self.chunk_inputs(inputs, s, e))
                for j, (o, spec) in enumerate(zip(outs, self.out_specs)):
                    if spec.kind == "cat":
                        _put_rows(result, j, o, spec.dim, s, e, T)
                    elif result[j] is None:
                        result[j] = o.float()
                    else:
                        result[j].add_(o)
        return [r if spec.kind == "cat" else r.to(dtype)
                for r, spec, dtype in zip(result, self.out_specs, self._out_dtypes)]

    @functools.cached_property
    def _out_dtypes(self):
        return [n.meta["val"].dtype for n in self.full_gm.graph.find_nodes(op="output")[0].args[0]]

    def backward(self, inputs: list[torch.Tensor], grads: list) -> list[torch.Tensor]:
        COUNTERS["region_backward"] += 1
        fn = self.fn(inputs=inputs)
        acc = self._grad_buffers(inputs)
        for s, e in reversed(self.bounds(inputs)):
            COUNTERS["chunks_backward"] += 1
            with autograd_inside_op(), torch.enable_grad():
                xs = self._leaves(self.chunk_inputs(inputs, s, e))
                outs = fn(*xs)
                pairs = [(o, g.narrow(spec.dim, s, e - s) if spec.kind == "cat" else g.to(o.dtype))
                         for o, g, spec in zip(outs, grads, self.out_specs)
                         if g is not None and o.requires_grad]
                if not pairs:
                    continue
                got = torch.autograd.grad([p[0] for p in pairs], [xs[i] for i in self.grad_inputs],
                                          [p[1] for p in pairs], allow_unused=True)
            self._accumulate(acc, got, s, e)
        return [acc[i].to(inputs[i].dtype) for i in self.grad_inputs]

    def _grad_buffers(self, inputs) -> dict:
        """Gradient buffers; parameters (whole inputs) accumulate over chunks in fp32."""
        return {i: torch.zeros_like(inputs[i], dtype=_acc_dtype(inputs[i])) for i in self.grad_inputs}

    def _leaves(self, xs):
        xs = [x.detach() for x in xs]
        for i in self.grad_inputs:
            xs[i].requires_grad_(True)
        return xs

    def _accumulate(self, acc, got, s, e, lo=None, ke=None):
        lo = self.key_start(s) if lo is None else lo
        ke = e if ke is None else ke
        for i, g in zip(self.grad_inputs, got):
            if g is None:
                continue
            spec = self.in_specs[i]
            if spec.kind == "chunk":
                acc[i].narrow(spec.dim, s, e - s).add_(g)
            elif spec.kind == "qk":
                acc[i].narrow(spec.dim, s, e - s).narrow(spec.kdim, lo, ke - lo).add_(g)
            else:
                acc[i].add_(g)

def _put_rows(result: list, j: int, o: torch.Tensor, d: int, s: int, e: int, T: int) -> None:
    """Write a chunk's rows [s, e) of output j into its full-length buffer (made on first use)."""
    if result[j] is None:
        result[j] = _full_like_along(o, d, T)
    result[j].narrow(d, s, e - s).copy_(o)


def compile_chunk_graph(gm: fx.GraphModule, prog: "RegionProgram", inputs, prefix, train: bool = True) -> Callable:
    """Inductor-compile a chunk graph for every chunk length c and prefix length e at once.

    Sample inputs take c and e = 2c + 1 as sizes and only the sequence dims are dynamic, so the
    compiled code assumes nothing about c, e but their role. Duck sizing gives every chunk dim
    one symbol and every prefix dim another: the backward then reads the chunk length from any
    saved tensor (with one symbol per input, a flattened [B * c] label chunk would carry a
    size whose symbol no input provides). With ``train``, inputs that get gradients require
    grad, so AOTAutograd also compiles the backward; without, the graph is compiled for inference.
    """
    from torch._inductor.compile_fx import compile_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    T = prog.length(inputs)
    c = max(2, min(prog.chunk_size, T))
    e = 2 * c + 1
    mode = FakeTensorMode(shape_env=ShapeEnv(duck_shape=True))
    samples, dynamic = [], []
    for i, (x, spec) in enumerate(zip(inputs, prog.in_specs)):
        shape, dyn = list(x.shape), set()
        for d, role in spec.seq_dims():
            shape[d] = c if role == "q" else e
            dyn.add(d)
        sample = (torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device) if not spec.sliced
                  else torch.empty(shape, dtype=x.dtype, device=x.device))  # chunks are made dense
        samples.append((sample, dyn, train and i in prog.grad_inputs))
    for t, d in prefix:  # keys and values: the prefix [0, e) of a sequence-major buffer
        layout = seq_major_empty(t, d, e)
        samples.append((torch.empty_strided(layout.shape, layout.stride(), dtype=t.dtype, device=t.device),
                        {d}, train))
    fakes = []
    for t, dyn, grad in samples:
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DUCK if k in dyn else DimDynamic.STATIC
                                                      for k in range(t.dim())])
        f = mode.from_tensor(t.requires_grad_(grad and t.is_floating_point()), symbolic_context=ctx)
        fakes.append(f)
    _LazyGraphModule.force_recompile(gm)
    # grad mode as asked: AOTAutograd compiles forward and backward, or an inference graph
    with torch._guards.tracing(torch._guards.TracingContext(mode)), autograd_inside_op(), \
            torch.set_grad_enabled(train), \
            functorch_config.patch(force_non_lazy_backward_lowering=True, enable_autograd_cache=False):
        return compile_fx(gm, fakes)


@dataclasses.dataclass
class LayerProgram(RegionProgram):
    """A transformer layer: ``kv_gm`` gives a chunk's keys and values, ``chunk_gm`` a chunk's
    output from its queries and the keys/values [lo, e) (lo = 0 unless a sliding window hides
    the keys before it).

    Forward: chunks in order; keys/values are written into full-length buffers as they come.
    Backward: keys/values for the whole sequence once; chunks in reverse: recompute the chunk,
    backward it, accumulate dK/dV over its keys in fp32 and the parameter gradients; rows
    [s, e) of dK/dV are then final, so they go back through the K/V producers at once and the
    chunk's input gradient is complete.

    With ``row_check`` the query graph also returns whether every query row saw a key. A chunk
    with a row that saw none (all its keys masked with a finite value: the full attention
    averages such a row over every key of the sequence) is "wide": it runs against all T keys.
    The forward returns which chunks were wide; the backward runs those first, so every chunk
    that reaches dK/dV rows [s, e) has run before those rows are pushed through the K/V
    producers.
    """

    kv_gm: fx.GraphModule | None = None
    kv_dims: tuple = (None, None)

    def keys_values(self, inputs, fn_kv):
        """Run the K/V graph chunk by chunk into full-length buffers; yields (s, e, the chunk's
        inputs, (K, V)) after each chunk's rows are written."""
        bufs = None
        for s, e in self.bounds(inputs):
            xs = self.chunk_inputs(inputs, s, e)
            k, v = fn_kv(*xs)
            if bufs is None:
                bufs = [seq_major_empty(t, d, self.length(inputs)) for t, d in zip((k, v), self.kv_dims)]
            for buf, t, d in zip(bufs, (k, v), self.kv_dims):
                buf.narrow(d, s, e - s).copy_(t)
            yield s, e, xs, bufs

    def prefix(self, K, V, lo, ke):
        """Keys and values [lo, ke): views of the sequence-major buffers, no copy."""
        return K.narrow(self.kv_dims[0], lo, ke - lo), V.narrow(self.kv_dims[1], lo, ke - lo)

    def forward(self, inputs):
        COUNTERS["region_forward"] += 1
        fn, fn_kv, T = None, self.fn(self.kv_gm, inputs=inputs, train=False), self.length(inputs)
        bounds = self.bounds(inputs)
        result = [None] * len(self.out_specs)
        wide = torch.zeros(len(bounds), dtype=torch.bool)
        kv, done, K, V, xs = self.keys_values(inputs, fn_kv), 0, None, None, None

        def written_up_to(end):
            nonlocal done, K, V, xs
            while done < end:
                _, done, xs, (K, V) = next(kv)

        with torch.no_grad():
            for i, (s, e) in enumerate(bounds):
                COUNTERS["chunks_forward"] += 1
                written_up_to(e)
                fn = fn or self.fn(inputs=inputs, prefix=[(K, self.kv_dims[0]), (V, self.kv_dims[1])], train=False)
                chunk = xs if done == e else self.chunk_inputs(inputs, s, e)
                outs = fn(*chunk, *self.prefix(K, V, self.key_start(s), e))
                if self.row_check and not bool(outs[-1]):
                    written_up_to(T)
                    wide[i] = True
                    outs = fn(*self.chunk_inputs(inputs, s, e, 0, T), *self.prefix(K, V, 0, T))
                for j, (o, spec) in enumerate(zip(outs, self.out_specs)):
                    _put_rows(result, j, o, spec.dim, s, e, T)
            written_up_to(T)  # (a generator left unfinished would hold its buffers)
        return result + ([wide] if self.row_check else [])

    def backward(self, inputs, grads, wide=None):
        COUNTERS["region_backward"] += 1
        with torch.no_grad():
            for _, _, _, (K, V) in self.keys_values(inputs, self.fn(self.kv_gm, inputs=inputs, train=False)):
                pass
        fn_kv = self.fn(self.kv_gm, inputs=inputs)
        fn = self.fn(inputs=inputs, prefix=[(K, self.kv_dims[0]), (V, self.kv_dims[1])])
        dK = torch.zeros_like(K, dtype=torch.float32)
        dV = torch.zeros_like(V, dtype=torch.float32)
        acc = self._grad_buffers(inputs)
        bounds, T = self.bounds(inputs), self.length(inputs)
        wide = [bool(w) for w in wide.tolist()] if wide is not None else [False] * len(bounds)
        # wide chunks first: their dK/dV reach rows after them
        for (s, e), w in zip(bounds, wide):
            if w:
                self._query_backward(fn, inputs, grads, K, V, dK, dV, acc, s, e, 0, T)
        dk, dv = self.kv_dims
        for (s, e), w in reversed(list(zip(bounds, wide))):
            COUNTERS["chunks_backward"] += 1
            sliced = None
            if not w:
                sliced = self._query_backward(fn, inputs, grads, K, V, dK, dV, acc, s, e, self.key_start(s), e)
            # rows [s, e) of dK/dV are final: push them through the K/V producers now
            with autograd_inside_op(), torch.enable_grad():
                xs = self._leaves(sliced if sliced is not None else self.chunk_inputs(inputs, s, e))
                k, v = fn_kv(*xs)
                got = torch.autograd.grad([k, v], [xs[i] for i in self.grad_inputs],
                                          [dK.narrow(dk, s, e - s).to(k.dtype), dV.narrow(dv, s, e - s).to(v.dtype)],
                                          allow_unused=True)
            self._accumulate(acc, got, s, e)
        return [acc[i].to(inputs[i].dtype) for i in self.grad_inputs]

    def _query_backward(self, fn, inputs, grads, K, V, dK, dV, acc, s, e, lo, ke):
        """Recompute chunk [s, e) against keys [lo, ke), backward it; accumulate the parameter
        and chunk input gradients and dK/dV over [lo, ke). Returns the chunk's sliced inputs."""
        with autograd_inside_op(), torch.enable_grad():
            sliced = self.chunk_inputs(inputs, s, e, lo, ke)
            xs = self._leaves(sliced)
            Kp, Vp = (t.detach().requires_grad_(True) for t in self.prefix(K, V, lo, ke))
            outs = fn(*xs, Kp, Vp)
            pairs = [(o, g.narrow(spec.dim, s, e - s)) for o, g, spec in zip(outs, grads, self.out_specs)
                     if g is not None and o.requires_grad]
            if not pairs:
                return sliced
            wrt = [xs[i] for i in self.grad_inputs] + [Kp, Vp]
            got = torch.autograd.grad([p[0] for p in pairs], wrt, [p[1] for p in pairs], allow_unused=True)
        self._accumulate(acc, got[:-2], s, e, lo, ke)
        for buf, g, d in ((dK, got[-2], self.kv_dims[0]), (dV, got[-1], self.kv_dims[1])):
            if g is not None:
                buf.narrow(d, lo, ke - lo).add_(g)
        return sliced


def _full_like_along(t: torch.Tensor, d: int, length: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[d] = length
    return t.new_empty(shape)


def seq_major_empty(t: torch.Tensor, d: int, length: int) -> torch.Tensor:
    """An empty tensor like ``t`` with ``length`` along dim ``d``, laid out with ``d`` outermost:
    its prefixes [0, e) along ``d`` are dense views whose strides do not depend on e, so one
    compiled chunk graph reads every prefix in place."""
    shape = list(t.shape)
    shape[d] = length
    order = [d] + [k for k in range(t.dim()) if k != d]
    buf = t.new_empty([shape[k] for k in order])
    return buf.permute([order.index(k) for k in range(t.dim())])


def autograd_inside_op():
    """Re-enable autograd dispatch inside a custom op kernel (which runs below autograd), so the
    backward can recompute a chunk and differentiate it."""
    DK = torch._C.DispatchKey
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for k in (DK.AutogradFunctionality, DK.AutogradOther, DK.AutogradNestedTensor, DK.ADInplaceOrView):
        exclude = exclude.remove(k)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype


# ---- the custom ops --------------------------------------------------------------------------
@torch.library.custom_op("streamfx::region", mutates_args=())
def region(key: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run a streamed region forward, chunk by chunk."""
    return _PROGRAMS[key].forward(list(inputs))


@region.register_fake
def _region_fake(key, inputs):
    prog = _PROGRAMS[key]
    outs = [o.clone() if o is not None else o for o in prog.full_gm(*inputs)]
    if prog.row_check:  # which chunks ran against every key
        outs.append(inputs[0].new_empty(len(prog.bounds(inputs)), dtype=torch.bool))
    return outs


@torch.library.custom_op("streamfx::region_backward", mutates_args=())
def region_backward(key: int, inputs: list[torch.Tensor], grads: list[torch.Tensor],
                    present: list[bool], wide: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Gradients of a streamed region's inputs (those in ``grad_inputs``), chunk by chunk in reverse.
    ``present[j]`` is False where output j got no gradient (its entry in ``grads`` is a placeholder);
    ``wide``: a layer's chunks that ran against every key in the forward."""
    prog = _PROGRAMS[key]
    grads = [g if p else None for g, p in zip(grads, present)]
    if wide is not None:
        return prog.backward(list(inputs), grads, wide)
    return prog.backward(list(inputs), grads)


@region_backward.register_fake
def _region_backward_fake(key, inputs, grads, present, wide=None):
    return [torch.empty_like(inputs[i]) for i in _PROGRAMS[key].grad_inputs]


def _setup(ctx, inputs, output):
    key, xs = inputs
    ctx.key = key
    ctx.row_check = _PROGRAMS[key].row_check
    ctx.save_for_backward(*xs, *([output[-1]] if ctx.row_check else []))


def _backward(ctx, grads):
    prog = _PROGRAMS[ctx.key]
    xs = list(ctx.saved_tensors)
    wide = xs.pop() if ctx.row_check else None
    grads = list(grads)[:len(prog.out_specs)]
    present = [g is not None for g in grads]
    gs = [g if g is not None else xs[0].new_empty(0) for g in grads]
    got = region_backward(ctx.key, xs, gs, present, wide)
    result = [None] * len(xs)
    for i, g in zip(prog.grad_inputs, got):
        result[i] = g
    return None, result


region.register_autograd(_backward, setup_context=_setup)

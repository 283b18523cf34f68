"""Chunk graphs: a region instantiated for one chunk, and how each is compiled for all sizes.

A ``ChunkGraph`` is an FX graph plus a ``Slot`` per tensor placeholder: the shape of what the
runtime passes there, each dim a constant, the chunk length ("q"), the key length ("k"), or an
expression of the compiled graph's shape symbols (the batch size when Dynamo compiled it
dynamic). Its last placeholders are sizes ("q", "k", or a symbol), which the graph's size
arguments are computed from; the runtime reads each from the tensors it passes. Inductor
compiles a chunk graph on fake inputs whose "q" and "k" dims and symbolic dims are symbols of a
fresh shape environment (never Dynamo's), sampled at the sizes of the first call that runs it,
so one compile serves every chunk length, key length, sequence length and batch size, except
where the compile decided code by the sample sizes: it records each such decision as a shape
guard (a long reduction's accumulation, a kernel's launch grid), and a call whose sizes break
one runs code compiled again at its own sizes (``Sized``), as Dynamo recompiles a frame whose
guards fail.

The compile cache is keyed on everything the compiled code depends on: the graph's structure
(``structure_key``: its ops and how they connect, not its node names, so the layers of one model
share their chunk graphs), every slot (dtypes, devices, static sizes, layouts), the constants it
reads, which inputs get a gradient, and whether it is the inference or the training compile. The
shape check of a chunk graph (``check``) is cached on the same structure, slots and sizes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import re
import warnings
from typing import Callable

import sympy
import torch
import torch.fx as fx
from torch._functorch import config as functorch_config
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from .passes.graphs import hint
from .passes.specs import dense, dim_order, empty_in_order, leading

COUNTERS = {"region_forward": 0, "region_backward": 0, "chunks_forward": 0, "chunks_backward": 0,
            "chunk_compiles": 0, "chunk_compile_failures": 0, "mask_checks": 0, "mask_found_causal": 0,
            "region_fallbacks": 0,
            "unit_backward": 0,     # (a Function's own backward, run for a chunk or a whole tensor)
            "attention_kept": 0,    # (a layer chunk's backward that read its attention kept from the forward)
            "vjp_compiles": 0,      # (a chunk graph's recomputation and backward compiled as one graph)
            "vjp_fallbacks": 0,     # (... which the joint trace or Inductor did not take: the training compile runs)
            "guard_recompiles": 0}  # (a chunk graph compiled again: a call's sizes broke a shape guard of its compiles)
_log = logging.getLogger("streamfx")
_COMPILED: dict[tuple, Callable] = {}
_CHECKED: dict[tuple, list | tuple] = {}   # (a failure: the error, the node position, the named sizes)
_GENERATION = [0]   # bumped by ``forget``: what a chunk graph remembers of _COMPILED is stale


def compiled_variants() -> list:
    """(graph name, "train" | "inference" | "vjp", [each compile's shape guards, as text]) per
    compiled chunk graph."""
    out = []
    for key, v in _COMPILED.items():
        kind = "vjp" if key[-1] == "vjp" else "train" if key[-1] else "inference"
        sized = [s for s in getattr(v, "_given", {}).values()] if kind == "vjp" else [getattr(v, "sized", None)]
        for s in sized:
            if s is not None:
                out.append((s.graph.name, kind, [[str(g) for g in var.guards] for var in s.variants]))
    return out


def forget() -> None:
    """Forget every compiled and checked chunk graph."""
    _COMPILED.clear()
    _CHECKED.clear()
    _GENERATION[0] += 1
# sample sizes of the symbols a chunk graph is compiled with: distinct, so that no two symbols
# are ever taken for one
HINTS = {"q": 5, "k": 13}
OTHER_HINTS = (3, 7, 11, 17, 19, 23, 29, 31)


@dataclasses.dataclass(frozen=True)
class Slot:
    shape: tuple               # per dim: int, "q", "k", or a sympy expression of shape symbols (and of
                               # KEY_SYMBOLS["q"]: a dim that merges the chunk's rows with other axes)
    dtype: torch.dtype
    device: str
    layout: str = "dense"      # "dense", or "seq_major" (the key dim outermost: a K/V prefix view)
    stride: tuple | None = None  # the strides of an input passed whole with static sizes (a weight's view)
    order: tuple | None = None   # dense, its dims in this order from the outermost (None: row-major)

    @staticmethod
    def of(val, roles: dict, layout: str = "dense", shape=None) -> "Slot":
        """The slot of a fake value ``val`` whose dims in ``roles`` ({dim: "q"|"k"}) are chunk dims
        (``shape``: its sizes written another way, with the same symbols for the same axes)."""
        sizes = val.shape if shape is None else shape
        shape = tuple(roles.get(j) or (s if isinstance(s, int) else s.node.expr) for j, s in enumerate(sizes))
        stride, order = None, None
        if not roles and all(isinstance(s, int) for s in tuple(val.shape) + tuple(val.stride())):
            stride = tuple(val.stride())
        elif layout == "dense":  # a chunk keeps the stride order of the whole input (``specs.dim_order``)
            order = dim_order([hint(s) for s in val.shape], [hint(s) for s in val.stride()])
        return Slot(shape, val.dtype, str(val.device), layout, stride, order)

    def key(self) -> tuple:
        return (tuple(str(s) for s in self.shape), str(self.dtype), self.device, self.layout, self.stride, self.order)

    def fit(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` laid out as the compiled code expects it (a copy only where it is not)."""
        if self.stride is not None:
            if tuple(x.stride()) == self.stride:
                return x
            return torch.empty_strided(x.shape, self.stride, dtype=x.dtype, device=x.device).copy_(x)
        if self.layout != "dense":
            return x
        return dense(x, self.order)


@dataclasses.dataclass
class ChunkGraph:
    name: str
    gm: fx.GraphModule
    slots: tuple                # one per tensor placeholder
    sizes: tuple = ()           # the size placeholders after them: "q", "k" or a shape symbol
    _key: tuple | None = dataclasses.field(default=None, init=False, repr=False, compare=False)
    _fns: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        where: dict = {}   # (every non-constant size: the (input, dim)s written with it)
        for i, slot in enumerate(self.slots):
            for d, s in enumerate(slot.shape):
                if isinstance(s, str) or (isinstance(s, sympy.Expr) and not s.is_number):
                    where.setdefault(s, []).append((i, d))
        # dims of several inputs written with one symbolic size: the compiled graph reads it
        # from one of them, so they must agree in every call (else the region runs whole)
        self.agree = tuple(tuple(v) for s, v in where.items() if not isinstance(s, str) and len(v) > 1)
        # each size a call gives, as (key, input, dim, factor): the dim's size divided by the factor
        # (1, or an expression of sizes read before it). "q", "k" and every shape symbol that is a
        # whole dim of an input are read from that dim; a shape symbol that is only a factor of
        # dims (a batch merged with the heads, ``[B x H, ...]``) is solved from one of them, and
        # becomes a size placeholder of the graph (compiled code binds a symbol from an input's
        # whole dim or from a size input, never from a product)
        self.readers = [(s, *v[0], 1) for s, v in where.items() if isinstance(s, (str, sympy.Symbol))]
        known = {KEY_SYMBOLS.get(r[0], r[0]) for r in self.readers}
        for s, v in where.items():
            if isinstance(s, str) or s.is_Symbol:
                continue
            for f in sorted(s.free_symbols - known, key=str):
                factor, rest = s.as_independent(f, as_Add=False)
                if rest == f and factor.free_symbols <= known and factor != 0:
                    self.readers.append((f, *v[0], factor))
                    known.add(f)
        if any(r[0] not in self.sizes for r in self.readers if r[3] != 1):
            self._bind([r[0] for r in self.readers if r[3] != 1 and r[0] not in self.sizes])
        self.readers = tuple(self.readers)
        # the sizes compiled code is specialised by, with how each is read
        self.symbols = tuple(r[0] for r in self.readers)
        self.locate = tuple((*where[key][0], 1) if key in where else self._locate(key) for key in self.sizes)

    def _bind(self, symbols: list) -> None:
        """Size placeholders for ``symbols`` after the graph's others."""
        last = [n for n in self.gm.graph.nodes if n.op == "placeholder"][-1]
        for j, _ in enumerate(symbols):
            with self.gm.graph.inserting_after(last):
                last = self.gm.graph.placeholder(f"size_solved_{j}")
        self.gm.recompile()
        self.sizes = tuple(self.sizes) + tuple(symbols)

    def _locate(self, key) -> tuple:
        """(slot, dim, factor): a size is the size of that slot's dim divided by the factor."""
        for r in self.readers:
            if r[0] == key:
                return r[1:]
        raise ValueError(f"size {key} is not a dim of any input")

    def read(self, args) -> list:
        """The sizes this call gives, in ``sizes``' order."""
        if all(f == 1 for _, _, f in self.locate):
            return [args[i].shape[d] for i, d, _ in self.locate]
        values = self.values(args)
        return [values[key] if key in values else args[i].shape[d] for key, (i, d, _) in zip(self.sizes, self.locate)]

    def key(self) -> tuple:
        """What running the graph depends on: its structure, its slots, its sizes, its constants.
        Computed once (a chunk graph is not changed after it is made: every region call reads
        its compiled code by this key)."""
        if self._key is None:
            self._key = (structure_key(self.gm), tuple(s.key() for s in self.slots), tuple(map(str, self.sizes)),
                         _constants_key(self.gm))
        return self._key

    def fn(self, codegen: str, train: bool, grads=(), inductor: dict | None = None) -> Callable:
        """The graph as run, taking the tensors (sizes are read from them): itself (codegen
        "eager"), or compiled by Inductor with the options ``inductor`` (config patches), once per
        key, at the sizes of its first call (``Sized``). ``grads``: the slots that get a
        gradient (with ``train``: the training compile)."""
        if codegen == "eager":
            # (its forward, not the module: a module call of a GraphModule prints the failing line
            # and drops the traceback, which ``failures`` reads the failing node from)
            return self._with_sizes(self.gm.forward)
        grads = tuple(sorted(grads)) if train else ()
        options = _options_key(inductor)
        mine = self._fns.get((grads, train, options))
        if mine is not None and mine[1] == _GENERATION[0]:
            return mine[0]
        key = (self.key(), grads, train, options)
        if key not in _COMPILED:
            COUNTERS["chunk_compiles"] += 1
            def compile_at(values):
                return compile_graph(self.gm, self.slots, self.sizes, grads, train, values, self.symbols, inductor)

            def failed(e):
                COUNTERS["chunk_compile_failures"] += 1
                warnings.warn(f"streamfx: a chunk graph of {self.name} runs as an FX graph, Inductor "
                              f"could not compile it ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
                return Variant(self.gm)

            _COMPILED[key] = self._with_sizes(Sized(self, compile_at, failed), fit=True)
        self._fns[(grads, train, options)] = (_COMPILED[key], _GENERATION[0])
        return _COMPILED[key]

    def vjp(self, codegen: str, grads: tuple, inductor: dict | None = None) -> "Vjp | None":
        """The graph's vector-Jacobian product as one compiled inference graph (Inductor's code
        for the chunk's recomputation and its backward together, with nothing of the forward
        computed that no gradient reads: a layer's last projection, whose output only its
        backward's input is), or None where the chunk runs as the training compile and autograd
        (eager codegen, or a graph the joint trace does not take; sizes whose joint compile
        raises run the training compile inside ``Vjp``)."""
        if codegen == "eager":
            return None
        grads = tuple(sorted(grads))
        options = _options_key(inductor)
        mine = self._fns.get(("vjp", grads, options))
        if mine is not None and mine[1] == _GENERATION[0]:
            return mine[0]
        key = (self.key(), grads, "vjp", options)
        if key not in _COMPILED:
            try:
                _COMPILED[key] = Vjp(self, grads, inductor)
            except Exception as e:  # noqa: BLE001 - the training compile runs it instead
                COUNTERS["vjp_fallbacks"] += 1
                _log.debug("streamfx: %s: no joint vjp compile (%s: %s)", self.name, type(e).__name__, e)
                _COMPILED[key] = None
        self._fns[("vjp", grads, options)] = (_COMPILED[key], _GENERATION[0])
        return _COMPILED[key]

    def check_agree(self, args) -> None:
        """Raise where inputs that share an axis differ in its size (real calls: fake ones at
        symbolic shapes are not checked)."""
        for group in self.agree:
            sizes = [args[i].shape[d] for i, d in group]
            if all(type(n) is int for n in sizes) and len(set(sizes)) != 1:
                raise RuntimeError(f"streamfx: inputs of {self.name} that share an axis differ in size "
                                   f"({[tuple(args[i].shape) for i, _ in group]})")

    def _with_sizes(self, f: "Callable | Sized", fit: bool = False) -> Callable:
        """``f`` called with the sizes appended (read from the tensors), and with ``fit`` the
        tensors in the layouts compiled code expects (``Sized``: the code compiled for the
        call's sizes)."""
        slots = self.slots

        def run(*args):
            self.check_agree(args)
            if fit:
                args = [slot.fit(x) for slot, x in zip(slots, args)]
            fn = f.pick(args) if isinstance(f, Sized) else f
            return fn(*args, *self.read(args))

        run.sized = f if isinstance(f, Sized) else None
        return run

    def values(self, args) -> dict:
        """{"q" | "k" | shape symbol: its size in this call}."""
        out: dict = {}
        for key, i, d, factor in self.readers:
            n = int(args[i].shape[d])
            if factor != 1:
                by = factor.xreplace({KEY_SYMBOLS.get(k, k): v for k, v in out.items()})
                n = n // int(by)
            out[key] = n
        return out


def _options_key(inductor: dict | None) -> tuple:
    """Inductor options as part of a compiled graph's cache key."""
    return tuple(sorted((k, repr(v)) for k, v in (inductor or {}).items()))


@dataclasses.dataclass
class Variant:
    """Code compiled for a chunk graph, and the shape guards its compile took: sympy conditions
    on "q", "k" (``KEY_SYMBOLS``) and the slots' shape symbols, true where it may run."""
    code: object
    guards: tuple = ()


KEY_SYMBOLS = {"q": sympy.Symbol("streamfx_q", integer=True), "k": sympy.Symbol("streamfx_k", integer=True)}


def holds(guards, values: dict) -> bool:
    """Whether every guard is true at ``values`` ({"q" | "k" | shape symbol: size})."""
    subs = {KEY_SYMBOLS.get(key, key): sympy.Integer(n) for key, n in values.items()}
    for g in guards:
        try:
            if not bool(g.xreplace(subs)):
                return False
        except TypeError:   # (a condition the sizes do not decide: not known to hold)
            return False
    return True


class Sized:
    """A chunk graph's compiled code for every size of its calls, compiled at the sizes of the
    first call that needs it (Inductor's choices by size, a kernel's blocks and grid, fit the
    sizes it runs at): a call whose sizes break a shape guard of every compile so far compiles
    again at its own sizes (a compile is valid at the sizes it was compiled at, whatever its
    guards say). ``compile_at(values) -> Variant``; ``failed(error) -> Variant``: what runs
    where a compile raised, at every size from then on. The choice is cached per sizes."""

    def __init__(self, graph: "ChunkGraph", compile_at: Callable, failed: Callable):
        self.graph, self.compile_at, self.failed = graph, compile_at, failed
        self.variants: list[Variant] = []
        self._picked: dict = {}

    def pick_variant(self, args) -> Variant:
        values = self.graph.values(args)
        at = tuple(values.values())
        got = self._picked.get(at)
        if got is None:
            got = next((v for v in self.variants if holds(v.guards, values)), None)
            if got is None:
                if self.variants:
                    COUNTERS["guard_recompiles"] += 1
                    _log.info("streamfx: %s compiles again at sizes %s (a shape guard of its compiles fails there)",
                              self.graph.name, values)
                try:
                    got = self.compile_at(values)
                except Exception as e:  # noqa: BLE001 - Inductor limits on symbolic shapes
                    from .failures import is_device_error

                    if is_device_error(e):
                        raise
                    got = self.failed(e)
                self.variants.append(got)
            self._picked[at] = got
        return got

    def pick(self, args):
        return self.pick_variant(args).code


def structure_key(gm: fx.GraphModule) -> tuple:
    """The graph with its nodes numbered instead of named: per node its op, its target and its
    arguments (other nodes by number, constants by ``repr``, so ``1``, ``1.0`` and ``True`` stay
    apart). Two graphs with one key compute the same function of their placeholders, given the
    same constants (``_constants_key``)."""
    number: dict = {}
    rows = []
    for i, n in enumerate(gm.graph.nodes):
        number[n] = i
        args = fx.node.map_aggregate((n.args, n.kwargs), lambda a: _Ref(number[a]) if isinstance(a, fx.Node)
                                     else _Opaque(a) if isinstance(a, torch.Tensor) else a)
        target = None if n.op in ("placeholder", "output") else n.target   # callables by identity
        rows.append((n.op, target, repr(args)))
    return tuple(rows)


class _Ref(int):
    def __repr__(self):
        return f"%{int(self)}"


class _Opaque:
    """A tensor written into a node's arguments: keyed by identity (held, so never reused)."""

    _held: dict = {}

    def __init__(self, t):
        _Opaque._held[id(t)] = t
        self.id = id(t)

    def __repr__(self):
        return f"<tensor {self.id}>"


def _constants_key(gm: fx.GraphModule) -> tuple:
    """The values of the constants a graph reads (``get_attr``): compiled code embeds them."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            t = getattr(gm, n.target)
            if isinstance(t, torch.Tensor):
                data = t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
                out.append((n.target, tuple(t.shape), tuple(t.stride()), str(t.dtype),
                            hashlib.sha256(data).hexdigest()))
            elif isinstance(t, fx.GraphModule):   # a higher-order op's subgraph
                out.append((n.target, structure_key(t), _constants_key(t)))
            else:
                out.append((n.target, repr(t)))
    return tuple(out)


def fake_inputs(slots, sizes=(), grads=(), hints: dict | None = None, values: dict | None = None):
    """(fake mode, fake inputs) for ``slots`` and then ``sizes``, in a fresh shape environment:
    "q" and "k" dims and every symbol of the slots become symbols of their own, sampled at
    ``values`` ({"q" | "k" | shape symbol: size}) where given, else at distinct sample sizes
    (``hints``: other samples for "q" and "k"). ``shape_guards(mode)`` reads the guards a compile
    on them took."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    # Fake tensor dispatch uncached: a chunk graph is propagated once, and a cache hit rebuilds its
    # output from symbolic sizes at more cost than the meta kernel it saves (half the time of a check).
    mode.cache_enabled = False
    hints = {**HINTS, **(hints or {})}

    def symbol(name, hint):
        s = env.create_symbol(hint, ConstantSource(f"streamfx_{name}"), dynamic_dim=DimDynamic.DYNAMIC,
                              do_not_specialize_zero_one=True)
        return s, env.create_symintnode(s, hint=hint)

    values = values or {}
    roles = {r: symbol(r, values.get(r, hints[r])) for r in ("q", "k")}
    # (a dim that merges the chunk's rows with other axes is written with KEY_SYMBOLS["q"])
    outer = sorted({f for slot in slots for d in slot.shape if isinstance(d, sympy.Expr) for f in d.free_symbols}
                   - set(KEY_SYMBOLS.values()), key=str)
    subs = {KEY_SYMBOLS[r]: roles[r][0] for r in roles}
    samples = {roles[r][0]: values.get(r, hints[r]) for r in roles}
    names = {roles[r][0]: KEY_SYMBOLS[r] for r in roles}
    for i, s in enumerate(outer):
        sample = values.get(s, OTHER_HINTS[i % len(OTHER_HINTS)] + 32 * (i // len(OTHER_HINTS)))
        new, _ = symbol(f"s{i}", sample)
        subs[s], samples[new], names[new] = new, sample, s

    def size(d):
        if isinstance(d, int):
            return d
        if isinstance(d, str):
            return roles[d][1]
        expr = d.xreplace(subs)
        return env.create_symintnode(expr, hint=int(expr.xreplace(samples)))

    fakes = []
    with mode:
        for i, slot in enumerate(slots):
            shape = [size(d) for d in slot.shape]
            if slot.layout == "seq_major":
                kd = slot.shape.index("k")
                t = empty_in_order(shape, leading(kd, len(shape)), slot.dtype, slot.device)
            elif slot.stride is not None:
                t = torch.empty_strided(shape, slot.stride, dtype=slot.dtype, device=slot.device)
            else:
                t = empty_in_order(shape, slot.order, slot.dtype, slot.device)
            fakes.append(t.requires_grad_(i in grads and slot.dtype.is_floating_point))
    fakes += [roles[key][1] if isinstance(key, str) else size(key) for key in sizes]
    mode.streamfx_names = names
    return mode, fakes


def _at_zero_or_one(mode) -> dict:
    """{symbol's name: size} of the sizes ``fake_inputs`` sampled at 0 or 1."""
    from .memory import values_of

    hints = values_of(mode.shape_env)
    return {name: int(hints[sym]) for sym, name in mode.streamfx_names.items()
            if sym in hints and int(hints[sym]) in (0, 1)}


def _caches(mode):
    """AOTAutograd's and Inductor's caches, off for a compile at a size sampled at 0 or 1: its code
    may take that size as a constant with no guard to say so, and a cache entry would then serve
    a compile at another size (which its guards let it)."""
    stack = contextlib.ExitStack()
    if _at_zero_or_one(mode):
        from torch._inductor import config as inductor_config

        stack.enter_context(inductor_config.patch(fx_graph_cache=False))
        stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    return stack


def shape_guards(mode, symbols) -> tuple:
    """The shape guards a compile on ``fake_inputs``' mode took, as conditions on "q", "k"
    (``KEY_SYMBOLS``) and the slots' shape symbols, and the size of each sampled at 0 or 1.
    ``symbols``: the sizes a call gives (``ChunkGraph.symbols``); a guard on any other symbol
    raises (no call could be checked)."""
    names = mode.streamfx_names
    known = {KEY_SYMBOLS.get(key, key) for key in symbols}
    out = []
    for g in mode.shape_env.guards:
        expr = g.expr.xreplace(names)
        if expr is sympy.true:
            continue
        missing = expr.free_symbols - known
        if missing:
            raise ValueError(f"a shape guard {g.expr} of the compile is on sizes no input has as a dim "
                             f"({sorted(map(str, missing))})")
        out.append(expr)
    # a size sampled at 0 or 1 is one the compile may take as that constant without a guard
    # (a dim of one element broadcasts and has no stride that matters: Inductor's code then
    # asserts the size of an input's dim of the chunk's rows is 1): its code runs at that size only
    out += [sympy.Eq(name, n) for name, n in _at_zero_or_one(mode).items() if name in known]
    return tuple(dict.fromkeys(out))


def compile_graph(gm: fx.GraphModule, slots, sizes, grads, train: bool, values: dict | None,
                  symbols: tuple, inductor: dict | None = None) -> Variant:
    """Inductor-compile a chunk graph on symbolic fake inputs (sampled at ``values`` where given:
    ``fake_inputs``), with the shape guards the compile took (``symbols``: the sizes a call
    gives, ``ChunkGraph.symbols``). With ``train``, the ``grads``
    inputs require grad, so AOTAutograd also compiles the backward; without, the graph is
    compiled for inference (its outputs hold no autograd graph). AOTAutograd's and Inductor's
    caches serve it: a graph an earlier process compiled (the same model restarted, a measurement
    at another length) loads instead of tracing and compiling again. ``inductor``: the Inductor
    options (config patches) the compile runs with."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    from . import onehot
    from .runtime import autograd_inside_op

    fake_mode, fakes = fake_inputs(slots, sizes, grads, values=values)
    _LazyGraphModule.force_recompile(gm)
    # (a loss's one-hot gradient made pointwise, ``onehot``)
    # (the user's Inductor options first: streamfx's own settings, inside them, hold)
    with inductor_config.patch(inductor or {}), torch._guards.tracing(torch._guards.TracingContext(fake_mode)), \
            autograd_inside_op(), torch.set_grad_enabled(train), inductor_config.patch(onehot.compile_config()), \
            functorch_config.patch(force_non_lazy_backward_lowering=True), _caches(fake_mode):
        code = compile_fx(gm, fakes)
    return Variant(code, shape_guards(fake_mode, symbols))


class Vjp:
    """A chunk graph's vector-Jacobian product: ``vjp(xs, out_grads)`` recomputes the chunk and
    returns the gradients of its ``grads`` inputs (None where one does not depend on the outputs
    given a gradient), or None when no output that needs a gradient got one. Traced as the
    backward of the chunk with ``make_fx`` (the chunk's forward, ``autograd.grad`` of the outputs
    given gradients) and compiled by Inductor as one inference graph, once per set of outputs
    given a gradient, on the same symbolic inputs as ``compile_graph``, at the sizes of its first
    call: every chunk length, key length and batch size runs that compile, except sizes that
    break one of its shape guards (``Sized``)."""

    def __init__(self, graph: ChunkGraph, grads: tuple, inductor: dict | None = None):
        self.graph, self.grads, self.inductor = graph, grads, inductor
        self._given: dict = {}
        # (the outputs that need a gradient: their gradients are the tangents)
        outs = _trace(graph, grads)[2]
        self.needs = tuple(i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad)

    def _sized(self, given: tuple) -> Sized:
        if given not in self._given:
            def compile_at(values):
                COUNTERS["vjp_compiles"] += 1
                return _compile_vjp(self.graph, self.grads, given, _trace(self.graph, self.grads, values), self.inductor)

            def failed(e):   # (these sizes and later ones run the training compile)
                COUNTERS["vjp_fallbacks"] += 1
                _log.debug("streamfx: %s: no joint vjp compile (%s: %s)", self.graph.name, type(e).__name__, e)
                return Variant(None)

            self._given[given] = Sized(self.graph, compile_at, failed)
        return self._given[given]

    def __call__(self, xs: list, out_grads: list):
        given = tuple(i for i in self.needs if out_grads[i] is not None)
        if not given:
            return None
        graph = self.graph
        graph.check_agree(xs)
        args = [slot.fit(x) for slot, x in zip(graph.slots, xs)]
        code = self._sized(given).pick(args)
        if code is None:
            return self._autograd(args, out_grads, given)
        fn, shapes, dtypes, where, present = code
        sizes = graph.read(args)
        values = {sym: (sizes[d] if i is None else args[i].shape[d]) for sym, (i, d) in where.items()}
        tangents = [out_grads[j].reshape([n if isinstance(n, int) else int(n.xreplace(values)) for n in shape])
                    .to(dtype).contiguous() for j, shape, dtype in zip(given, shapes, dtypes)]
        got = iter(fn(*args, *sizes, *tangents))
        return [next(got) if p else None for p in present], tangents

    def _autograd(self, args, out_grads, given):
        """The call run by the chunk's training compile and autograd (no joint compile)."""
        from .runtime import autograd_inside_op

        fn = self.graph.fn("inductor", True, self.grads, self.inductor)
        with autograd_inside_op(), torch.enable_grad():
            xs = [x.detach().requires_grad_(i in self.grads and x.dtype.is_floating_point)
                  for i, x in enumerate(args)]
            outs = fn(*xs)
            tangents = [out_grads[j].reshape(outs[j].shape).to(outs[j].dtype) for j in given]
            got = torch.autograd.grad([outs[j] for j in given], [xs[i] for i in self.grads], tangents,
                                      allow_unused=True)
        return list(got), tangents


def _trace(graph: ChunkGraph, grads: tuple, values: dict | None = None) -> tuple:
    """(fake mode, symbolic fake inputs with ``grads`` requiring a gradient, the graph's outputs
    on them); sampled at ``values`` where given (``fake_inputs``)."""
    from .runtime import fake_autograd

    mode, fakes = fake_inputs(graph.slots, graph.sizes, grads, values=values)
    # (sizes read from data here, ``.tolist()`` of tokens per expert, are the joint trace's to
    # bind: left pending in the shape environment, that trace finds them in none of its outputs)
    with mode, fake_autograd(), torch.enable_grad(), mode.shape_env.ignore_fresh_unbacked_symbols():
        return mode, fakes, list(graph.gm(*fakes))


def _compile_vjp(graph: ChunkGraph, grads: tuple, given: tuple, traced: tuple, inductor: dict | None = None) -> Variant:
    """A ``Variant`` whose code is (compiled fn(*inputs, *sizes, *tangents) -> the gradients that
    exist, the tangents' shapes in the inputs' symbols, their dtypes, {symbol: (input, dim)} to
    read them from, which of ``grads`` has a gradient), with the shape guards of the trace and the
    compile. ``traced``: ``_trace(graph, grads, values)``; ``inductor``: as ``compile_graph``'s."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx
    from torch.fx.experimental.proxy_tensor import make_fx

    from . import onehot
    from .runtime import autograd_inside_op, fake_autograd

    fake_mode, fakes, outs = traced
    n, m = len(graph.slots), len(graph.sizes)
    where = {}
    for i, x in enumerate(fakes[:n]):
        for d, size in enumerate(x.shape):
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                where.setdefault(size.node.expr, (i, d))
    for d, size in enumerate(fakes[n:]):   # (a symbol solved from a product of dims: a size input)
        if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
            where.setdefault(size.node.expr, (None, d))
    shapes = []
    for j in given:
        shape = tuple(int(s) if not isinstance(s, torch.SymInt) else s.node.expr for s in outs[j].shape)
        missing = {f for s in shape if not isinstance(s, int) for f in s.free_symbols} - where.keys()
        if missing:
            raise ValueError(f"output {j}'s size symbols {sorted(map(str, missing))} are no input's dims")
        shapes.append(tuple(int(s) if not isinstance(s, int) and s.is_number else s for s in shape))
    with fake_mode:
        tangents = [torch.empty(outs[j].shape, dtype=outs[j].dtype, device=outs[j].device) for j in given]
    present = []
    gm = graph.gm

    def joint(*args):
        primals, sizes, tans = args[:n], args[n:n + m], args[n + m:]
        with torch.enable_grad():
            o = gm(*primals, *sizes)
            got = torch.autograd.grad([o[j] for j in given], [primals[i] for i in grads], list(tans),
                                      allow_unused=True)
        present[:] = [g is not None for g in got]
        return [g for g in got if g is not None]

    _LazyGraphModule.force_recompile(gm)
    # (the backward on the calling thread, as AOTAutograd traces its joint graph: the autograd
    # engine runs a CUDA backward on its device thread, where the trace's dispatch state is not set)
    with fake_mode, fake_autograd(), torch.autograd.set_multithreading_enabled(False):
        traced = make_fx(joint)(*fakes, *tangents)
    with fake_mode:
        inputs = [x.detach() if isinstance(x, torch.Tensor) else x for x in fakes] + tangents
    with inductor_config.patch(inductor or {}), torch._guards.tracing(torch._guards.TracingContext(fake_mode)), \
            autograd_inside_op(), torch.set_grad_enabled(False), inductor_config.patch(onehot.compile_config()), \
            functorch_config.patch(force_non_lazy_backward_lowering=True), _caches(fake_mode):
        fn = compile_fx(traced, inputs)
    return Variant((fn, shapes, [t.dtype for t in tangents], where, tuple(present)), shape_guards(fake_mode, graph.symbols))


class ChunkCheckFailed(Exception):
    """A chunk graph that does not propagate at symbolic chunk shapes: ``error``, raised at
    ``node`` (a copy of the joint graph's node: its op and source line), or None."""

    def __init__(self, error: Exception, node, sizes: dict | None = None):
        first, sizes = (str(error).splitlines()[0] if str(error) else ""), sizes or {}
        # ``roles``: what the sizes the error writes are ("q", "k", or an input size's own symbol)
        self.roles = {sizes[s] for s in re.findall(r"\bs\d+\b", first) if s in sizes}
        self.text = re.sub(r"\bs\d+\b", lambda m: f"{m[0]}: {_said(sizes[m[0]])}" if m[0] in sizes else m[0], first)
        super().__init__(f"{type(error).__name__}: {self.text}")
        self.error, self.node = error, node


def _said(role) -> str:
    return {"q": "the chunk's rows", "k": "the rows up to the chunk's end"}.get(role, f"input size {role}")


def _named_sizes(mode) -> dict:
    """{the check's symbol as an error writes it: its role}: "q" (the chunk's rows), "k" (the rows
    a chunk reads, up to its end), or the graph's own symbol of an input size."""
    role = {v: r for r, v in KEY_SYMBOLS.items()}
    return {str(sym): role.get(name, name) for sym, name in getattr(mode, "streamfx_names", {}).items()}


class _Propagation(FakeTensorProp):
    """FakeTensorProp that remembers the position of the node it is running (``at``)."""

    def run_node(self, n):
        self.at = self._positions[n]
        return super().run_node(n)

    def propagate_dont_convert_inputs(self, *args):
        self._positions = {n: i for i, n in enumerate(self.module.graph.nodes)}
        return super().propagate_dont_convert_inputs(*args)


def check(graph: ChunkGraph) -> None:
    """Propagate symbolic chunk-shaped fake inputs through the graph (raises where it does not
    instantiate per chunk). Cached on the graph's key: every layer of a model, and every later
    compile of it, has its chunk graphs checked once."""
    key = graph.key()
    if key not in _CHECKED:
        prop = mode = None
        try:
            mode, fakes = fake_inputs(graph.slots, graph.sizes)
            prop = _Propagation(graph.gm, mode)
            prop.propagate_dont_convert_inputs(*fakes)
            _CHECKED[key] = [n.meta.get("val") for n in graph.gm.graph.nodes]
        except Exception as e:  # noqa: BLE001 - raised again below, and for every graph with this key
            _CHECKED[key] = (e, getattr(prop, "at", None), _named_sizes(mode))
    if isinstance(_CHECKED[key], tuple):
        err, at, sizes = _CHECKED[key]
        raise ChunkCheckFailed(err, None if at is None else list(graph.gm.graph.nodes)[at], sizes) from err
    for n, v in zip(graph.gm.graph.nodes, _CHECKED[key]):   # the values at chunk shapes, as propagated
        n.meta["val"] = v
        # no unbacked-size bindings (``.tolist()`` of tokens per expert) of the check's own shape
        # environment, as ``build_graph`` leaves none of the joint graph's: Inductor propagates
        # the graph again in its compile's fresh environment and rebinds to the names a binding
        # gives, where a fresh ``u0`` named like a stale one fails as a memoised value
        n.meta.pop("unbacked_bindings", None)

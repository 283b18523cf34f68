"""The memory model of a training step: liveness over the partitioned forward and backward graphs.

Every tensor a graph node makes is allocated when the node runs and freed after its last use
(a view lives as long as its base; the backward's inputs saved by the forward live from the
forward to their last use in the backward; parameter gradients, the backward's outputs, live
past the step). Sizes come from each node's fake value: expressions of the graph's shape
symbols, evaluated at the sequence length asked for (the symbols of the sequence length get T,
every other symbol the value it had when the graph was traced).

A streamed region runs as one node of these graphs; while it runs it also holds its working set,
a function of its chunk size c and of T: the K/V buffers of the sequence and, in the backward,
their fp32 gradients; and one chunk's working set, the peak of a liveness run over the chunk
graph (traced once with symbolic chunk and key lengths, its backward included: the chunk's
intermediates, its attention over the key prefix, its weight gradients).
"""
from __future__ import annotations

import collections
import dataclasses
import operator
import re

import sympy
import torch
import torch.fx as fx

from .errors import source_line
from .passes.specs import accumulation_dtype


# ---- sizes ----------------------------------------------------------------------------------------
def nbytes_expr(v):
    """Bytes of a (fake) tensor as an int or a sympy expression of shape symbols; 0 for others."""
    if not isinstance(v, torch.Tensor):
        return 0
    n = v.numel()
    n = n.node.expr if isinstance(n, torch.SymInt) else n
    return n * v.element_size()


def values_of(env) -> dict:
    """Every symbol of a shape environment with the value it was created with."""
    return dict(getattr(env, "backed_var_to_val", None) or env.var_to_val)


def evaluate(expr, subs: dict) -> int:
    """The integer value of a size expression (an int, or a sympy expression of shape symbols)
    at ``subs`` ({symbol: value}). Each expression is compiled once to Python integer arithmetic
    (the memory model evaluates the same expressions at every length and chunk size it tries);
    one with a term that has no exact integer form is substituted by sympy."""
    if isinstance(expr, int):
        return expr
    fn = _EVALUATORS.get(expr)
    if fn is None:
        fn = _EVALUATORS[expr] = _evaluator(expr)
    return fn(subs)


_EVALUATORS: dict = {}


class _NoIntegerForm(Exception):
    pass


def _evaluator(expr):
    expr = sympy.sympify(expr)
    if expr.is_number:
        value = int(expr)
        return lambda subs: value

    def substituted(subs):
        return int(expr.xreplace(subs))

    names: dict = {}
    try:
        code = _integer_code(expr, names)
    except _NoIntegerForm:
        return substituted
    fn = eval(f"lambda {', '.join(names.values())}: {code}", {"max": max, "min": min})  # noqa: S307 - built from a sympy tree
    symbols = tuple(names)

    def compiled(subs):
        try:
            values = [int(subs[x]) for x in symbols]
        except KeyError:   # (a symbol without a value: as sympy reports it)
            return substituted(subs)
        return fn(*values)

    return compiled


def _integer_code(e, names: dict) -> str:
    """Python source of ``e`` in exact integer arithmetic; ``_NoIntegerForm`` for a term that has
    none (a rational coefficient, a float, a function this does not know)."""
    from torch.utils._sympy.functions import CeilDiv, CleanDiv, FloorDiv, Max, Min, Mod, PythonMod

    def sub(x):
        return _integer_code(x, names)

    if isinstance(e, sympy.Integer):
        return f"({int(e)})"
    if isinstance(e, sympy.Symbol):
        return names.setdefault(e, f"v{len(names)}")
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(map(sub, e.args)) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(map(sub, e.args)) + ")"
    if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and e.exp >= 0:
        return f"({sub(e.base)} ** {int(e.exp)})"
    if isinstance(e, (FloorDiv, CleanDiv)):
        return f"({sub(e.args[0])} // {sub(e.args[1])})"
    if isinstance(e, CeilDiv):
        return f"(-((-{sub(e.args[0])}) // {sub(e.args[1])}))"
    if isinstance(e, (Mod, PythonMod)):
        return f"({sub(e.args[0])} % {sub(e.args[1])})"
    if isinstance(e, (Max, sympy.Max)):
        return "max(" + ", ".join(map(sub, e.args)) + ")"
    if isinstance(e, (Min, sympy.Min)):
        return "min(" + ", ".join(map(sub, e.args)) + ")"
    if isinstance(e, sympy.Piecewise):   # (a chunk size chosen by length: the first true branch)
        out = "None"
        for value, cond in reversed(e.args):
            out = f"({sub(value)} if {sub(cond)} else {out})"
        return out
    if e is sympy.true or e is sympy.false:
        return str(bool(e))
    if isinstance(e, sympy.core.relational.Relational) and e.rel_op in _RELATIONS:
        return f"({sub(e.lhs)} {e.rel_op} {sub(e.rhs)})"
    if isinstance(e, (sympy.And, sympy.Or)):
        return "(" + (" and " if isinstance(e, sympy.And) else " or ").join(map(sub, e.args)) + ")"
    if isinstance(e, sympy.Not):
        return f"(not {sub(e.args[0])})"
    raise _NoIntegerForm(e)


_RELATIONS = frozenset({">=", ">", "<=", "<", "==", "!="})   # (sympy's relations written as Python's)


def is_view(node: fx.Node) -> bool:
    """The node's output shares its input's storage (a view, an alias, an item of a list)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return not isinstance(node.args[0].meta.get("val"), (list, tuple))
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def base_of(node: fx.Node) -> fx.Node:
    while is_view(node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def rounded(nbytes: int, device: str) -> int:
    """Bytes the allocator hands out for a request: CUDA's caching allocator rounds blocks up to
    512 bytes, and requests over 1 MiB to whole 2 MiB pages; the CPU allocator as asked."""
    if not device.startswith("cuda") or nbytes <= 0:
        return nbytes
    if nbytes > 1 << 20:
        return -(-nbytes // (2 << 20)) * (2 << 20)
    return -(-nbytes // 512) * 512


# ---- liveness -------------------------------------------------------------------------------------
@dataclasses.dataclass
class Live:
    """One graph's allocations in execution order: per step the node, the tensors it makes
    (``born``: (node, bytes expr)) and those that die after it (nodes)."""
    steps: list          # [(node, born, dies)]

    @staticmethod
    def of(graph: fx.Graph, held=frozenset(), keep=frozenset(), born_early=None, drop=frozenset()) -> "Live":
        """``held``: nodes whose storage exists before the graph and is not counted (parameters,
        inputs); ``keep``: nodes that outlive the graph (outputs, tensors saved for later);
        ``born_early``: placeholders of tensors made earlier and counted (the backward's saved
        tensors), given with their bytes; they die after their last use here; ``drop``: outputs
        that die after their last use all the same (saved tensors recomputed later)."""
        nodes = list(graph.nodes)
        owner = {n: base_of(n) for n in nodes}
        last: dict = {}
        for i, n in enumerate(nodes):
            for x in n.all_input_nodes:
                if n.op != "output" or owner[x] not in drop:
                    last[owner[x]] = i
        out = graph.find_nodes(op="output")
        for o in out:
            for x in o.all_input_nodes:
                if owner[x] not in held and owner[x] not in drop:
                    keep = keep | {owner[x]}
        steps = []
        dying: dict = {}
        for n in nodes:
            if n in keep or n in held:
                continue
            if owner[n] is n:
                dying.setdefault(last.get(n, nodes.index(n)), []).append(n)
        for i, n in enumerate(nodes):
            born = []
            if n.op == "placeholder":
                if born_early and n in born_early:
                    born.append((n, born_early[n]))
            elif n.op == "call_function" and owner[n] is n and n not in held:
                born += _made(n)
            ws = _workspace(n)
            steps.append((n, born + ws, [d for d in dying.get(i, []) if d.op != "placeholder" or
                                         (born_early and d in born_early)] + [k for k, _ in ws]))
        return Live(steps)


# ---- what an op allocates inside, beyond its outputs -------------------------------------------------
# {op: fn(node) -> bytes (int or expression)}: registered by the module that implements the op
# (``streamfx.blocks``); counted while the op runs, in both liveness models.
WORKSPACE: dict = {}


class _Workspace:
    """The key of an op's workspace in a liveness run (made and freed at the op)."""

    def __init__(self, node):
        self.node = node
        self.name = f"{node.name}.workspace"


def _workspace(n: fx.Node) -> list:
    """[(key, bytes)] of the op's workspace: registered here, or an attention kernel's from the
    kernel table (``streamfx.passes.kernels``); [] for ops with none."""
    from streamfx.passes import kernels

    if n.op != "call_function":
        return []
    fn = WORKSPACE.get(n.target)
    size = fn(n) if fn is not None else kernels.workspace(n)
    return [(_Workspace(n), size)] if fn is not None or size != 0 else []


# ---- what Inductor's generated code allocates ---------------------------------------------------------
# Inductor fuses pointwise work into the kernels that read it: an intermediate made by a fusible
# op is computed inside its consumers and never stored, unless a kernel it cannot be fused into
# (a matmul, attention, any fallback) or the graph's output takes it. Reductions fuse their inputs
# and store their (small) results. A pointwise kernel, or a scatter into a fresh buffer, writes
# into an input buffer of its own size whose last read it is ("in_out_ptr"; ``del buf; # reuse``).
_aten = torch.ops.aten
FUSED_LOADS = frozenset({   # ops Inductor lowers to loads inside other kernels (no pointwise tag)
    _aten._to_copy.default, _aten.gather.default, _aten.cat.default, _aten.index.Tensor,
    _aten.embedding.default, _aten.constant_pad_nd.default, _aten.tril.default, _aten.triu.default,
    _aten.full.default, _aten.full_like.default, _aten.zeros.default, _aten.zeros_like.default,
    _aten.ones.default, _aten.ones_like.default, _aten.new_zeros.default, _aten.new_ones.default,
    _aten.new_full.default, _aten.scalar_tensor.default, _aten.arange.start, _aten.arange.default,
    _aten.arange.start_step, torch.ops.prims.iota.default, _aten.copy.default, _aten.lift_fresh_copy.default,
    _aten.slice_scatter.default, _aten.select_scatter.default})
SCATTERS = frozenset({   # lowered as a write into (a copy of) their first input
    _aten.scatter.src, _aten.scatter.value, _aten.scatter_add.default, _aten.scatter_reduce.two,
    _aten.index_put.default, _aten.index_add.default})


def _kind(n: fx.Node) -> str:
    """"fusible" | "reduction" | "kernel" (a kernel of its own: extern, fallback, scatter)."""
    t = n.target
    tags = getattr(t, "tags", ())
    if t in FUSED_LOADS or torch.Tag.pointwise in tags or _scatter_upon_constant(n):
        return "fusible"
    if torch.Tag.reduction in tags:
        return "reduction"
    return "kernel"


def _scatter_upon_constant(n: fx.Node) -> bool:
    """A scalar scattered into a constant, one index per row (a loss's one-hot gradient): Inductor's
    joint-graph pattern ``scatter_upon_const_tensor`` makes it pointwise."""
    if n.target is not _aten.scatter.value or not isinstance(n.args[0], fx.Node) \
            or n.args[0].target is not _aten.full.default:
        return False
    index = n.args[2].meta.get("val") if isinstance(n.args[2], fx.Node) else None
    return isinstance(index, torch.Tensor) and index.shape[n.args[1]] == 1


def _fused_steps(graph: fx.Graph, held=frozenset()) -> list:
    """``Live.steps`` of ``graph`` as Inductor's code runs it: fused intermediates make nothing,
    a kernel's inputs live until the last kernel that reads them (through the fused work in
    between), and a pointwise kernel or a scatter takes over an input buffer of its size that
    dies there. (Inductor's heuristics that store a pointwise result several kernels read are
    left out: in a forward and backward traced as one graph, the readers of a result are split
    between the two graphs Inductor compiles, and the backward's recompute it.)"""
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}

    def owner(x):
        # a view is its base; an item of a node that returns several tensors, that node
        while True:
            b = base_of(x)
            if b.target is operator.getitem and isinstance(b.args[0], fx.Node):
                x = b.args[0]
                continue
            return b

    kind = {n: _kind(n) for n in nodes if n.op == "call_function" and owner(n) is n}
    outputs = {owner(x) for o in graph.find_nodes(op="output") for x in o.all_input_nodes}

    def readers(n):
        # the nodes that read n's storage: through views and items, to the ops that compute
        out, todo = [], list(n.users)
        while todo:
            u = todo.pop()
            if u.op == "call_function" and owner(u) is not u:
                todo += list(u.users)
            else:
                out.append(u)
        return out

    def tensors(n):
        v = n.meta.get("val")
        return isinstance(v, torch.Tensor) or (isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v))

    # (a reader that makes no tensor, such as a size query, stores nothing it reads)
    virtual = {n for n, k in kind.items() if k == "fusible" and n not in outputs
               and all(u.op == "call_function" and (kind.get(u) != "kernel" or not tensors(u)) for u in readers(n))}
    sources: dict = {}   # the stored buffers a fused intermediate is computed from

    def srcs(x):
        b = owner(x)
        return sources[b] if b in virtual else {b}

    for n in nodes:   # (in order: a node's inputs come first)
        if n in virtual:
            sources[n] = set().union(*[srcs(y) for y in n.all_input_nodes])

    reads = {n: set().union(*[srcs(x) for x in n.all_input_nodes])
             for n in nodes if n not in virtual and (n.op == "output" or n in kind)}
    last: dict = {}
    for n, rs in reads.items():
        for b in rs:
            last[b] = max(last.get(b, -1), index[n])
    root = {}
    for n in nodes:
        if n not in reads or n.op == "output":
            continue
        if kind[n] == "fusible" or n.target in SCATTERS:
            size = nbytes_expr(n.meta.get("val"))
            cands = srcs(n.args[0]) if n.target in SCATTERS else sorted(reads[n], key=index.get)
            for x in cands:
                b = root.get(x, x)
                if b in held or b.op == "placeholder" or b in outputs:
                    continue
                if last.get(b) == index[n] and size != 0 and nbytes_expr(b.meta.get("val")) == size:
                    root[n] = b
                    last[b] = max(last[b], last.get(n, index[n]))
                    break
    dying: dict = {}
    for n in reads:
        if n.op != "output" and n not in root and n not in outputs and n not in held:
            dying.setdefault(last.get(n, index[n]), []).append(n)
    steps = []
    for i, n in enumerate(nodes):
        born = _made(n) if n in reads and n.op != "output" and n not in root and n not in held else []
        ws = _workspace(n)
        steps.append((n, born + ws, dying.get(i, []) + [k for k, _ in ws]))
    return steps


def _made(n: fx.Node) -> list:
    v = n.meta.get("val")
    if isinstance(v, (list, tuple)):
        return [(n, sum((nbytes_expr(x) for x in v), 0))]
    return [(n, nbytes_expr(v))]


# ---- chunk graphs ---------------------------------------------------------------------------------
RECENT = 32   # the lengths a cache keyed by length keeps (``Recent``)


class Recent(collections.OrderedDict):
    """A dict of the ``size`` entries used last. The caches keyed by a call's length (its chunk
    sizes, its step's timeline) serve the calls of one step and the next steps at that length; a
    training run with a new length per batch would otherwise grow them by an entry per length it
    ever saw."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


@dataclasses.dataclass
class ChunkCurve:
    """The peak bytes a chunk graph allocates while it runs (inputs are views of what the region
    holds and are not counted; its outputs are), as a function of the chunk length q and the key
    length k. ``train``: the graph's forward and its backward (autograd.grad to the inputs that
    get a gradient), as the region's backward runs it; else its no-grad forward."""
    live: Live
    q: object
    k: object
    fixed: dict
    _cache: dict = dataclasses.field(default_factory=lambda: Recent(1024))   # (q, k) -> peak

    def __call__(self, q: int, k: int | None = None) -> int:
        key = (q, k)
        if key not in self._cache:
            self._cache[key] = self._peak(q, k)
        return self._cache[key]

    def _peak(self, q: int, k: int | None) -> int:
        subs = dict(self.fixed)
        if self.q is not None:
            subs[self.q] = q
        if self.k is not None:
            subs[self.k] = k if k is not None else q
        return peak_of(self.live, subs)[0]

    def _lengths(self, q: int) -> dict:
        """The sizes at chunk length q, keys as many (a K/V graph that reads the rows before a
        chunk's has key-length sizes only)."""
        return {**self.fixed, **{s: q for s in (self.q, self.k) if s is not None}}

    def outputs_at(self, q: int) -> int:
        """Bytes of the graph's outputs at chunk length q (the K/V graph: one row of K/V per token)."""
        subs = self._lengths(q)
        out = self.live.steps[-1][0]
        return sum(evaluate(nbytes_expr(x.meta.get("val")), subs) for x in out.all_input_nodes)

    def accumulators_at(self, q: int) -> int:
        """Bytes of the graph's outputs at chunk length q in their accumulation dtypes (fp32 for
        16-bit outputs: the K/V gradients' buffers)."""
        subs = self._lengths(q)
        out = self.live.steps[-1][0]
        return sum(evaluate(nbytes_expr(v), subs) // v.element_size() * accumulation_dtype(v.dtype).itemsize
                   for v in (x.meta.get("val") for x in out.all_input_nodes) if isinstance(v, torch.Tensor))


_CURVES: dict = {}


def chunk_curve(graph, grads=(), train=False, fused=False) -> ChunkCurve:
    """The working-set curve of a ``chunks.ChunkGraph`` (cached on its structure and slots).
    ``fused``: as Inductor's code runs it (``_fused_steps``), else op by op as eager runs it."""
    from . import onehot

    # (Inductor's code has the one-hot rewrite where chunk compiles run it now: part of the key)
    one_hot = fused and onehot.compiles_with_pass()
    key = (graph.key(), tuple(grads), train, fused, one_hot)
    if key not in _CURVES:
        _CURVES[key] = _trace_curve(graph, tuple(grads), train, fused, one_hot)
    return _CURVES[key]


def _trace_curve(graph, grads, train, fused=False, one_hot=False) -> ChunkCurve:
    from torch.fx.experimental.proxy_tensor import make_fx

    from .chunks import fake_inputs

    grads = tuple(i for i in grads if graph.slots[i].dtype.is_floating_point) if train else ()
    # Traced on the CPU whatever the graph's device: sizes do not depend on it, and the autograd
    # engine runs a CUDA backward on its device thread, where the trace's Python dispatch state is
    # not set (torch 2.11: "tls_on_entry.has_value() INTERNAL ASSERT FAILED" from the step).
    slots = [dataclasses.replace(s, device="cpu") for s in graph.slots]
    mode, fakes = fake_inputs(slots, graph.sizes, grads)
    gm = on_cpu(graph.gm)

    def run(*args):
        if not train:
            with torch.no_grad():
                return gm(*args)
        with torch.enable_grad():
            outs = [o for o in gm(*args) if isinstance(o, torch.Tensor) and o.requires_grad]
            wrt = [args[i] for i in grads]
            if not outs or not wrt:
                return outs
            got = torch.autograd.grad(outs, wrt, [torch.empty_like(o) for o in outs], allow_unused=True)
            return [g for g in got if g is not None]

    from .runtime import fake_autograd

    with mode, fake_autograd():
        traced = make_fx(run)(*fakes)
    q = k = None
    for slot, x in zip(graph.slots, fakes):
        for d, role in enumerate(slot.shape):
            if role in ("q", "k"):
                sym = x.shape[d].node.expr
                q, k = (sym, k) if role == "q" else (q, sym)
    fixed = {s: v for s, v in values_of(mode.shape_env).items() if s not in (q, k)}
    # (the tangents the trace makes stand for rows of the output gradient: views, not counted)
    tangents = {n for n in traced.graph.nodes if n.target is torch.ops.aten.empty_like.default}
    held = frozenset(tangents)
    if one_hot:   # (Inductor's code: one-hot gradients made pointwise)
        from . import onehot

        onehot.rewrite(traced.graph)
    live = Live(_fused_steps(traced.graph, held)) if fused else Live.of(traced.graph, held=held)
    return ChunkCurve(live, q, k, fixed)


def on_cpu(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with every device it names (factory and copy arguments, tensor constants) the CPU;
    ``gm`` itself when it names none but the CPU."""
    def cpu(a):
        if isinstance(a, torch.device) and a.type != "cpu":
            return torch.device("cpu")
        if isinstance(a, (list, tuple)):
            return type(a)(cpu(x) for x in a)
        if isinstance(a, dict):
            return {k: cpu(v) for k, v in a.items()}
        return a

    consts = {n.target: getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    moved = {k: v.cpu() for k, v in consts.items() if isinstance(v, torch.Tensor) and v.device.type != "cpu"}
    named = any(cpu(n.args) != n.args or cpu(dict(n.kwargs)) != dict(n.kwargs)
                for n in gm.graph.nodes if n.op == "call_function")
    if not named and not moved:
        return gm
    g = fx.Graph()
    out = g.graph_copy(gm.graph, {})
    g.output(out)
    for n in g.nodes:
        if n.op == "call_function":
            n.args, n.kwargs = cpu(n.args), cpu(dict(n.kwargs))
    return fx.GraphModule({k: moved.get(k, v) for k, v in consts.items()}, g)


def peak_of(live: Live, subs: dict, extra=None) -> tuple[int, int, dict]:
    """(peak bytes, step index of the peak, {node: bytes} live there). ``extra(step) -> bytes``
    adds a working set held while a step runs (a streamed region's)."""
    current, alive = 0, {}
    best, at, snapshot = -1, -1, {}
    for i, (n, born, dies) in enumerate(live.steps):
        for x, b in born:
            b = evaluate(b, subs)
            alive[x] = alive.get(x, 0) + b
            current += b
        total = current + (extra(i) if extra is not None else 0)
        if total > best:
            best, at, snapshot = total, i, dict(alive)
        for d in dies:
            current -= alive.pop(d, 0)
    return max(best, 0), at, snapshot


# ---- names the user knows --------------------------------------------------------------------------
def module_path(node: fx.Node | None, key: str = "nn_module_stack") -> str:
    """The module a node's code is in, as the model names it (``model.layers.3``); ``key``
    "fwd_nn_module_stack": for a backward node, the module of the forward code it differentiates."""
    stack = (node.meta.get(key) or {}) if node is not None else {}
    if not stack:
        return ""
    paths = [path for path, _ in stack.values()]
    # the deepest module reached from the compiled object: a module reached through a global
    # (a function the `kernels` package wraps as a module, transformers >= 5.25's
    # `use_kernelized_func`: ``G['...modeling_qwen3'].apply_rotary_pos_emb``) is not one the
    # model names; its code is in the module that called it
    own = [p for p in paths if not p.startswith("G[")]
    return dotted((own or paths)[-1]) or "the model"


def dotted(path: str) -> str:
    """A Dynamo source path as the model names it: ``L['self']._modules['model']._modules['layers']
    ._modules['0']._parameters['weight']`` -> ``model.layers.0.weight`` ("" for the compiled object)."""
    path = re.sub(r"^L\[[^\]]*\](\[\d+\])*", "", path)   # the compiled object itself
    path = re.sub(r"\._(?:modules|parameters|buffers)\['([^']*)'\]", r".\1", path)
    for a, b in (("']", ""), ("['", "."), ("[", "."), ("]", ""), ("_modules.", "")):
        path = path.replace(a, b)
    return path.strip(".")


def saved_role(plan, spec, value) -> str:
    """What a per-token tensor a streamed region keeps is, as the user knows it (``explain()``'s
    saved list and the memory report's rows read this one name)."""
    if spec.kind in ("qk", "prefix"):
        return "attention mask data"
    floating = value.is_floating_point()
    if plan.kind == "layer":
        return "layer input" if floating else "per-token input (positions)"
    return "hidden states entering the head" if floating else "labels"


def common_module(nodes) -> str:
    """The module a region's code is in: the deepest module holding at least three quarters of
    the nodes that come from a module (a layer region: ``model.layers.3``, though the rotary and
    mask code it also reads sits in ``model.rotary_emb`` and ``model``; a head: ``lm_head``)."""
    paths = [p.split(".") for p in map(module_path, nodes) if p]
    counts: dict = {}
    for p in paths:
        for k in range(1, len(p) + 1):
            key = ".".join(p[:k])
            counts[key] = counts.get(key, 0) + 1
    held = [k for k, n in counts.items() if 4 * n >= 3 * len(paths)]
    return max(held, key=lambda k: k.count("."), default="")


def region_module(nodes) -> str:
    """The module a region's code is in (``common_module``); empty when that is the compiled
    module itself (a decoder layer compiled alone), which names nothing more."""
    m = common_module(nodes)
    return m if m != "the model" else ""


def in_module(nodes) -> str:
    """`` (model.layers.3)``: ``region_module`` for a description, empty where it is."""
    m = region_module(nodes)
    return f" ({m})" if m else ""


def where(node: fx.Node | None) -> str:
    return source_line(node).strip() if node is not None else ""

"""A ``torch.autograd.Function``, or a gradient hook, as one op with its own backward: a unit.

Dynamo captures ``Fn.apply(...)`` as ``autograd_function_apply(fwd_body, bwd_body, *args)``;
AOTAutograd inlines both bodies into the joint graph, and the streamed joint, which
differentiates the forward graph again (and each chunk graph at run time), would differentiate
the forward body instead of calling the Function's backward. ``wrap(gm)`` runs on Dynamo's graph
and replaces each such call by ``streamfx::unit(key, inputs)``: its forward runs the forward
body, its autograd formula runs the backward body (``streamfx::unit_backward``), so every later
pass sees one op, and differentiating it, for the whole sequence or a chunk, calls the
Function's own backward. The op returns the body's outputs and then the values the backward
reads that are not inputs (its saved intermediates); on torch 2.11 the body's outputs include
intermediates too, whose gradient placeholders the backward leaves unused.

A gradient hook on an intermediate (``y.register_hook(fn)`` inside the compiled code) is the same
kind of op: from torch 2.13 Dynamo captures it as ``register_hook(y, hook_body, *freevars)``,
whose hook make_fx registers while it traces, so the joint's backward applies it to the
gradient and a forward differentiated again would drop it (torch 2.11 captures it as a Function
whose forward is the identity and whose backward calls the hook). ``wrap`` makes it a unit of
that form: the identity forward, the hook as the backward, no gradient for the hook's captured
tensors (eager autograd runs a hook outside any graph).

A unit runs per chunk only where it is per token: ``unit_axes`` reads that from its bodies.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import re

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode

from . import verify
from .graphs import PROJECTIONS, same

aten = torch.ops.aten


@dataclasses.dataclass
class Unit:
    name: str              # the Function's class, as Dynamo names its bodies' owner
    fwd: fx.GraphModule    # the forward body, grad toggles removed: (outputs, saved values)
    bwd: fx.GraphModule    # the backward body: (*output grads, *saved values) -> input grads
    args: tuple            # per body argument: ("in", i) a tensor input, ("size", i, k) its size k
                           # (read from the tensor each call: a chunk's for a chunk), ("const", value)
    n_out: int             # outputs of the forward body (the op's first outputs)
    saved: tuple           # per saved value: as ``args``, or ("out", j) an output of the op
    non_differentiable: frozenset
    grads: tuple           # body arguments the backward returns a gradient for (not None)
    signature: object = None  # unit_axes.Signature: its axes and where it combines positions
    dropped: tuple = ()    # positions of the forward body's outputs that are sizes, not tensors (torch
                           # 2.11 returns a dynamic compile's intermediate sizes there): the op leaves
                           # them out, and the backward's placeholders for their gradients get None
    hook: bool = False     # a gradient hook (``register_hook``), not a Function

    def describe(self) -> str:
        return "a gradient hook (Tensor.register_hook)" if self.hook else \
            f"a torch.autograd.Function ({self.name}) with a backward of its own"


_UNITS: dict[int, Unit] = {}
_KEYS: dict = {}  # structure -> key: layers that apply one Function share a unit (and chunk graphs)
RANDOM = ("rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "randperm", "bernoulli", "dropout",
          "normal", "uniform", "exponential", "geometric", "cauchy", "log_normal", "multinomial", "poisson", "random")


# ---- the ops ----------------------------------------------------------------------------------
def _run(body: fx.GraphModule, args) -> tuple:
    with torch.no_grad():
        return fx.Interpreter(body).run(*args)


def _body_args(unit: Unit, inputs) -> list:
    return [_read(a, inputs) for a in unit.args]


def _read(where: tuple, inputs, outputs=()):
    kind = where[0]
    return inputs[where[1]] if kind == "in" else inputs[where[1]].shape[where[2]] if kind == "size" \
        else outputs[where[1]] if kind == "out" else where[1]


def _fresh(values, inputs) -> list:
    """Outputs that share no memory with an input or an earlier output (a custom op returns
    new tensors)."""
    out: list = []
    for v in values:
        if any(v is o or torch._C._is_alias_of(v, o) for o in list(inputs) + out):
            v = v.clone()
        out.append(v)
    return out


def _forward(unit: Unit, inputs) -> list:
    outs, saved = _run(unit.fwd, _body_args(unit, inputs))
    outs = [o for j, o in enumerate(outs) if j not in unit.dropped]
    extra = [s for s, where in zip(saved, unit.saved) if where[0] == "out"]
    return _fresh(list(outs) + extra, inputs)


@torch.library.custom_op("streamfx::unit", mutates_args=())
def unit_op(key: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """A Function's forward body (its outputs, then its saved intermediates)."""
    return _forward(_UNITS[key], inputs)


@unit_op.register_fake
def _unit_fake(key, inputs):
    return _forward(_UNITS[key], inputs)


def _grads(unit: Unit, grads, saved, sizes) -> list:
    tensors, ints = iter(saved), iter(sizes)
    values = [w[1] if w[0] == "const" else next(ints) if w[0] == "size" else next(tensors) for w in unit.saved]
    given = iter(grads)
    grads = [None if j in unit.dropped else next(given) for j in range(unit.n_out + len(unit.dropped))]
    got = _run(unit.bwd, grads + values)
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    return [got[j] for j in unit.grads]


@torch.library.custom_op("streamfx::unit_backward", mutates_args=())
def unit_backward(key: int, grads: list[torch.Tensor], saved: list[torch.Tensor],
                  sizes: list[int]) -> list[torch.Tensor]:
    """A Function's backward body: the gradients it returns for its tensor inputs (``Unit.grads``)."""
    from streamfx.chunks import COUNTERS

    COUNTERS["unit_backward"] += 1
    return _fresh(_grads(_UNITS[key], grads, saved, sizes), list(grads) + list(saved))


@unit_backward.register_fake
def _unit_backward_fake(key, grads, saved, sizes):
    return _fresh(_grads(_UNITS[key], grads, saved, sizes), list(grads) + list(saved))


def _setup(ctx, inputs, output):
    key, xs = inputs
    unit = _UNITS[key]
    ctx.key = key
    ctx.outs = [(o.shape, o.dtype, o.device) for o in output[:unit.n_out]]
    ctx.ins = [x.shape for x in xs]
    ctx.save_for_backward(*[_read(w, xs, output) for w in unit.saved if w[0] in ("in", "out")])
    ctx.sizes = [_read(w, xs) for w in unit.saved if w[0] == "size"]
    ctx.mark_non_differentiable(*[o for j, o in enumerate(output)
                                  if j >= unit.n_out or j in unit.non_differentiable])


def _backward(ctx, grads):
    unit = _UNITS[ctx.key]
    # (as eager autograd materialises them: zeros for the outputs that got no gradient)
    gs = [g if g is not None else torch.zeros(s, dtype=d, device=dev)
          for g, (s, d, dev) in zip(list(grads)[:unit.n_out], ctx.outs)]
    got = unit_backward(ctx.key, gs, list(ctx.saved_tensors), ctx.sizes)
    result = [None] * len(ctx.ins)
    for j, g in zip(unit.grads, got):
        kind, i = unit.args[j]
        if kind == "in":  # (a gradient of a broadcast input, summed as autograd does)
            shape = ctx.ins[i]
            result[i] = g if len(g.shape) == len(shape) and all(map(same, g.shape, shape)) else g.sum_to_size(shape)
    return None, result


unit_op.register_autograd(_backward, setup_context=_setup)
UNIT = torch.ops.streamfx.unit.default
UNIT_BACKWARD = torch.ops.streamfx.unit_backward.default


def projects(n: fx.Node) -> bool:
    """Whether ``n`` is a projection: one of ``graphs.PROJECTIONS``, or a unit whose bodies
    compute one (a Function wrapping a linear, as DeepSpeed ZeRO-3's does)."""
    if n.op != "call_function":
        return False
    if n.target in PROJECTIONS:
        return True
    unit = _UNITS.get(n.args[0]) if n.target is UNIT else None
    sig = getattr(unit, "signature", None)
    return sig is not None and any(t in PROJECTIONS for t in sig.ops)


# ---- Dynamo's graph: Function calls and gradient hooks become units ------------------------------
def is_function_call(n: fx.Node) -> bool:
    return n.op == "call_function" and type(n.target).__name__ == "AutogradFunctionApply"


def is_hook_call(n: fx.Node) -> bool:
    """Dynamo's ``register_hook(tensor, hook_body, *freevars)`` (torch >= 2.13): a hook on an
    intermediate, applied by the joint's backward."""
    return n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator) \
        and n.target.name() == "register_hook"


def is_hook(n: fx.Node) -> bool:
    """A gradient hook on an intermediate, in either of Dynamo's forms (``register_hook``, or
    before torch 2.13 a Function that applies it)."""
    return is_hook_call(n) or (is_function_call(n) and _registers_hook(n.meta.get("stack_trace") or ""))


def wrap(gm: fx.GraphModule, signature) -> dict:
    """Each ``autograd_function_apply`` and ``register_hook`` of Dynamo's graph that can be a unit
    becomes one (see the module doc); ``signature(unit, vals)`` gives its axes
    (``unit_axes.signature``). One that cannot (a size argument, random ops, effects beyond its
    outputs, an in-place output) stays as it is, for ``stops.custom_backward`` to judge; returns
    those, each with why it is not a unit."""
    count, kept, roots = 0, {}, {}
    for n in list(gm.graph.nodes):
        if is_hook_call(n):
            why = _wrap_hook(gm, n, signature, roots)
            if why is not None:
                kept[n] = why
            count += why is None
            continue
        if not is_function_call(n):
            continue
        unit, why = _unit_of(gm, n)
        if unit is None:
            kept[n] = why
            continue
        inputs = [a for a in n.args[2:] if isinstance(a, fx.Node) and isinstance(_value(a), torch.Tensor)]
        vals = [_value(a) for a in inputs]
        key, why = _registered(unit, vals, signature, "its bodies do")   # (if not: left to the derivative check)
        if key is None:
            kept[n] = why
            continue
        with gm.graph.inserting_before(n):
            new = gm.graph.call_function(UNIT, (key, inputs))
        new.meta.update(n.meta)
        for u in list(n.users):   # (the op's outputs leave the body's sizes out)
            if u.target is operator.getitem and unit.dropped:
                u.args = (u.args[0], u.args[1] - sum(j < u.args[1] for j in unit.dropped))
        mode = _fake_mode(vals)
        if mode is not None:
            with mode:
                new.meta["example_value"] = unit_op(key, vals)
        bodies = n.args[:2]
        n.replace_all_uses_with(new)
        gm.graph.erase_node(n)
        for body in bodies:
            if not body.users:
                gm.graph.erase_node(body)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return kept


def _wrap_hook(gm: fx.GraphModule, n: fx.Node, signature, roots: dict) -> str | None:
    """A ``register_hook`` call as a unit (None), or why it cannot be one. Eager autograd applies
    a tensor's hooks to its whole gradient, whichever reads came before the registration, in the
    order they were registered; Dynamo's graph hands the hooked tensor only to the reads after
    it. So the unit goes right after the tensor's definition and every read of the tensor goes
    through it, and a later hook on the same tensor (``roots``: a unit's output -> its tensor)
    goes between the tensor and the earlier ones, whose backward then runs first."""
    given = n.args[0]
    root = roots.get(given, given)
    n.args = (root, *n.args[1:])
    unit, why = _hook_unit(gm, n)
    if unit is None:
        return why
    inputs = [root] + [a for a in n.args[2:] if isinstance(a, fx.Node) and isinstance(_value(a), torch.Tensor)]
    vals = [_value(a) for a in inputs]
    key, why = _registered(unit, vals, signature, "its hook does")   # (if not: the graph runs unstreamed)
    if key is None:
        return why
    order = {x: i for i, x in enumerate(gm.graph.nodes)}
    after = max(inputs, key=order.__getitem__)
    if after.op == "placeholder":
        after = gm.graph.find_nodes(op="placeholder")[-1]
    if any(u is not n and order[u] <= order[after] for u in root.users):
        return "its hook reads a value computed after a read of its tensor"
    with gm.graph.inserting_after(after):
        new = gm.graph.call_function(UNIT, (key, inputs))
    with gm.graph.inserting_after(new):
        result = gm.graph.call_function(operator.getitem, (new, 0))
    new.meta.update(n.meta)
    result.meta.update(n.meta)
    mode = _fake_mode(vals)
    if mode is not None:
        with mode:
            new.meta["example_value"] = unit_op(key, vals)
        result.meta["example_value"] = new.meta["example_value"][0]
    root.replace_all_uses_with(result, delete_user_cb=lambda u: u is not new and u is not n)
    n.replace_all_uses_with(given if given in roots else result)   # (the reads after it: through every hook)
    body = n.args[1]
    gm.graph.erase_node(n)
    if isinstance(body, fx.Node) and not body.users:
        gm.graph.erase_node(body)
    roots[result] = root
    return None


def _hook_unit(gm: fx.GraphModule, n: fx.Node) -> tuple:
    """(the unit of a ``register_hook`` call, None), or (None, why it cannot be one): forward
    ``(tensor, *captured) -> ((tensor,), captured)``, backward ``(grad, *captured) -> (hook(grad,
    *captured) or grad, None, ...)``."""
    from .stops import _pure

    body = getattr(gm, n.args[1].target)
    if not _pure(body):
        return None, "its hook calls more than tensor math"
    if any(m.op == "call_method" and m.target in ("item", "tolist") for m in body.graph.nodes):
        return None, "its hook reads a tensor's value as a number"
    if _random(body):
        return None, "its hook draws random numbers (a chunk's gradient would get others)"
    captured = n.args[2:]
    tensors = [n.args[0]] + [a for a in captured if isinstance(a, fx.Node) and isinstance(_value(a), torch.Tensor)]
    args = _places(captured, tensors)
    if args is None:
        return None, "its hook reads a size that is no size of its tensors"
    args = [("in", 0)] + args
    fwd = fx.Graph()
    xs = [fwd.placeholder(f"arg{i}") for i in range(len(args))]
    fwd.output(((xs[0],), tuple(xs[1:])))
    bwd = fx.Graph()
    grad = bwd.placeholder("grad")
    saved = [bwd.placeholder(f"saved{i}") for i in range(len(captured))]
    params = body.graph.find_nodes(op="placeholder")
    if len(params) != 1 + len(captured):
        return None, "its hook body does not take (gradient, captured values)"
    out = bwd.graph_copy(body.graph, dict(zip(params, [grad] + saved)))
    if isinstance(out, (tuple, list)):
        out = out[0] if len(out) == 1 else None if not out else out
    if isinstance(out, (tuple, list)) or (out is not None and not isinstance(out, fx.Node)):
        return None, "its hook does not return one gradient"
    bwd.output((grad if out is None else out,) + (None,) * len(captured))
    return Unit("register_hook", fx.GraphModule(torch.nn.Module(), fwd), fx.GraphModule(body, bwd), tuple(args), 1,
                tuple(args[1:]), frozenset(), (0,), hook=True), None


def _fake_mode(vals):
    """The fake mode of Dynamo's example values (not the tracing context's)."""
    return next((v.fake_mode for v in vals if hasattr(v, "fake_mode")), None) or detect_fake_mode(vals)


def _value(node: fx.Node):
    return node.meta.get("example_value", node.meta.get("val"))


def _unit_of(gm: fx.GraphModule, n: fx.Node) -> tuple:
    """(the unit of a Function call, None), or (None, why it cannot be one)."""
    from .stops import _pure, _without_grad_toggles

    fwd, bwd = getattr(gm, n.args[0].target), getattr(gm, n.args[1].target)
    if n.kwargs.get("dirty_idx"):
        return None, "it changes an input in place (ctx.mark_dirty)"
    if not (_pure(fwd) and _pure(bwd)):
        return None, "its forward or backward calls more than tensor math"
    if any(m.op == "call_method" and m.target in ("item", "tolist") for b in (fwd, bwd) for m in b.graph.nodes):
        return None, "it reads a tensor's value as a number (.item(), as a dynamic compile passes a float)"
    if _random(fwd) or _random(bwd):
        return None, "it draws random numbers (a chunk recomputed in the backward would draw others)"
    tensors = [a for a in n.args[2:] if isinstance(a, fx.Node) and isinstance(_value(a), torch.Tensor)]
    args = _places(n.args[2:], tensors)
    if args is None:
        return None, "it takes a size as an argument that is no size of its tensor inputs"
    fwd_out = fwd.graph.find_nodes(op="output")[0].args[0]
    if not (isinstance(fwd_out, (tuple, list)) and len(fwd_out) == 2):
        return None, "its forward body is not (outputs, saved values)"
    outs, saved_nodes = fwd_out
    dropped = tuple(j for j, o in enumerate(outs) if not isinstance(_value(o) if isinstance(o, fx.Node) else o,
                                                                    torch.Tensor))
    if any(u.target is operator.getitem and u.args[1] in dropped for u in n.users):
        return None, "it returns a size, not a tensor"
    params = fwd.graph.find_nodes(op="placeholder")
    saved, extra = [], len(outs) - len(dropped)
    for s in saved_nodes:
        if isinstance(s, fx.Node) and s.op == "placeholder":
            saved.append(args[params.index(s)])
        elif isinstance(s, fx.Node):
            if not isinstance(_value(s), torch.Tensor):
                return None, "it saves a size it computes for its backward"
            saved.append(("out", extra))
            extra += 1
        else:
            saved.append(("const", s))
    bwd_out = bwd.graph.find_nodes(op="output")[0].args[0]
    bwd_out = bwd_out if isinstance(bwd_out, (tuple, list)) else (bwd_out,)
    if len(bwd.graph.find_nodes(op="placeholder")) != len(outs) + len(saved) or len(bwd_out) != len(args):
        return None, "its backward body does not take (output gradients, saved values)"
    grads = tuple(j for j, g in enumerate(bwd_out) if isinstance(g, fx.Node) and args[j][0] == "in")
    kept = [j for j in range(len(outs)) if j not in dropped]
    trace = n.meta.get("stack_trace") or ""
    hook = _registers_hook(trace)   # (torch 2.11 captures a gradient hook as a Function)
    return Unit("register_hook" if hook else _class_of(fwd) or _function_name(trace), _without_grad_toggles(fwd),
                _without_grad_toggles(bwd), tuple(args), len(kept), tuple(saved),
                frozenset(kept.index(j) for j in n.kwargs.get("non_differentiable_idx", ()) if j in kept), grads,
                dropped=dropped, hook=hook), None


def _class_of(body: fx.GraphModule) -> str | None:
    """The class whose ``forward`` the body was traced from: the innermost class around the line
    of the Function's ``forward`` frame in its nodes' stack traces (the frame that torch's
    autograd-function code calls; a module called inside it has frames "in forward" too), None
    where no node has one."""
    for node in body.graph.nodes:
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)', node.meta.get("stack_trace") or "")
        calls = [i + 1 for i, (path, _, _) in enumerate(frames[:-1]) if path.endswith("autograd_function.py")]
        at = [calls[-1]] if calls else [i for i, f in enumerate(frames) if f[2] == "forward"][-1:]
        if at and frames[at[0]][2] == "forward":
            path, line = frames[at[0]][0], int(frames[at[0]][1])
            return next((name for first, last, name in _classes_in(path) if first <= line <= last), None)
    return None


@functools.lru_cache(maxsize=64)
def _classes_in(path: str) -> tuple:
    """(first line, last line, name) of each class defined in a source file, innermost first."""
    import ast
    import linecache

    try:
        tree = ast.parse("".join(linecache.getlines(path)))
    except (SyntaxError, ValueError):
        return ()
    spans = [(c.lineno, c.end_lineno, c.name) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
    return tuple(sorted(spans, key=lambda c: c[1] - c[0]))


def _function_name(trace: str) -> str:
    """The Function's class name, read from the call in the stack trace of its apply node (Dynamo
    keeps no reference to the class): ``Fn.apply(`` in the part of the innermost frame's line
    that the trace marks (``B.apply(A.apply(x))`` holds two calls; each node's markers span its
    own), the first such call of the line where nothing is marked (the call is the whole line)."""
    lines = trace.rstrip("\n").split("\n")
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    if frames and frames[-1] + 1 < len(lines):
        source = lines[frames[-1] + 1]
        marks = lines[frames[-1] + 2] if frames[-1] + 2 < len(lines) else ""
        if marks.strip() and set(marks.strip()) <= set("^~"):
            start = len(marks) - len(marks.lstrip())
            source = source[start:len(marks.rstrip())]
        names = re.findall(r"(\w+)\.apply\(", source)
        if names:
            return names[0]
    names = re.findall(r"(\w+)\.apply\(", trace)
    return names[-1] if names else "Function"


def _registers_hook(trace: str) -> bool:
    """Whether the innermost line of a Function call's stack trace registers a gradient hook
    (``y.register_hook(fn)``) rather than applying a Function: the form Dynamo gives a hook on
    an intermediate before torch 2.13."""
    lines = trace.rstrip("\n").split("\n")
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    source = lines[frames[-1] + 1] if frames and frames[-1] + 1 < len(lines) else ""
    return ".register_hook(" in source and ".apply(" not in source


def _places(values, tensors) -> list | None:
    """Where each body argument comes from (``Unit.args``): ("in", i) tensor input i, ("size", i, k)
    a size of one (a dynamic compile lifts the inputs' sizes into the bodies), ("const", value);
    None where a size is no size of the tensors."""
    places = []
    for a in values:
        if a in tensors:
            places.append(("in", tensors.index(a)))
        elif isinstance(a, fx.Node):
            where = _size_of(_value(a), tensors)
            if where is None:
                return None
            places.append(where)
        else:
            places.append(("const", a))
    return places


def _size_of(v, tensors) -> tuple | None:
    """("size", i, k): the size ``v`` (a SymInt) is dim k of tensor input i; None if none."""
    if isinstance(v, torch.SymInt):
        for i, t in enumerate(tensors):
            for k, size in enumerate(_value(t).shape):
                if isinstance(size, torch.SymInt) and size.node.expr == v.node.expr:
                    return ("size", i, k)
    return None


def _random(body: fx.GraphModule) -> bool:
    return any(n.op in ("call_function", "call_method") and
               getattr(n.target, "__name__", str(n.target)).split(".")[-1].strip("_") in RANDOM
               for n in body.graph.nodes)


_serials = itertools.count()


def _symbols_of(vals):
    """The compile whose symbols the sizes of ``vals`` are, when any is symbolic (a serial of its
    ShapeEnv), else None: a symbol's name ("s0") means a size only within one compile, so a unit
    whose signature holds symbolic sizes is shared by the layers of that compile, not with another
    compile whose "s0" may be another size."""
    if not any(isinstance(d, torch.SymInt) for v in vals for d in v.shape):
        return None
    mode = _fake_mode(vals)
    env = getattr(mode, "shape_env", None)
    if env is None:
        return None
    if not hasattr(env, "_streamfx_serial"):
        env._streamfx_serial = next(_serials)
    return env._streamfx_serial


def _registered(unit: Unit, vals, signature, subject: str) -> tuple:
    """(``_register``'s key, None), or (None, why not: "<subject> not trace to ATen: <error>")."""
    try:
        return _register(unit, vals, signature), None
    except (ImportError, NameError):  # this code against a torch it does not know: loud
        raise
    except Exception as e:  # noqa: BLE001 - bodies that do not trace to ATen: the caller says why
        if verify.enabled():
            raise
        return None, f"{subject} not trace to ATen: {type(e).__name__}"


def _register(unit: Unit, vals, signature) -> int:
    """The unit's key: one per structure and input metadata (a Function applied in every layer
    is one unit, so the layers' chunk graphs stay one graph)."""
    from streamfx.chunks import structure_key

    key = (structure_key(unit.fwd), structure_key(unit.bwd), repr(unit.args), unit.n_out, repr(unit.saved),
           tuple(sorted(unit.non_differentiable)), unit.grads, unit.dropped,
           tuple((tuple(map(str, v.shape)), str(v.dtype), str(v.device)) for v in vals), _symbols_of(vals))
    if key not in _KEYS:
        unit.signature = signature(unit, vals)
        _KEYS[key] = len(_UNITS)
        _UNITS[_KEYS[key]] = unit
    return _KEYS[key]

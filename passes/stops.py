"""Where eager autograd stops a gradient, the streamed joint stops it too.

AOTAutograd traces the joint graph below autograd: ``x.detach()`` and a value computed under
``torch.no_grad()`` become ordinary forward ops (``aten.alias``, the block's ops), and only the
joint's backward half, derived above autograd, knows that no gradient passes there. The streamed
joint differentiates the forward graph again (and chunk graphs are differentiated per chunk at
run time), so those points must be visible in the graph itself.

``mark(gm)`` runs on Dynamo's graph, before AOTAutograd: every ``detach`` of a value that carries
a gradient, and every read of such a value computed under ``no_grad`` by code outside the block,
becomes ``streamfx::stop_gradient`` (a copy whose output requires no gradient, as
``detach`` does). ``strip(joint)`` turns it back into an alias once the joint's backward exists,
so the partitioned graphs copy nothing; graphs compiled without a backward (inference) keep the
copy. A ``torch.autograd.Function`` is one op with its own backward (``units``); one that cannot
be (a size argument, random numbers) and whose backward is not the derivative of its forward is
found by ``custom_backward(gm)``, and the graph runs unstreamed.
"""
from __future__ import annotations

import copy
import operator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .compat import size_hint


@torch.library.custom_op("streamfx::stop_gradient", mutates_args=())
def stop_gradient(x: torch.Tensor) -> torch.Tensor:
    """``x.detach()`` as an op autograd sees in a traced graph."""
    return x.clone()


@stop_gradient.register_fake
def _stop_gradient_fake(x):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.mark_non_differentiable(output)


def _backward(ctx, grad):
    return None


stop_gradient.register_autograd(_backward, setup_context=_setup)

STOP = torch.ops.streamfx.stop_gradient.default
_DETACH = (torch.Tensor.detach, torch.detach, torch.ops.aten.detach.default)


def _value(node: fx.Node):
    return node.meta.get("example_value", node.meta.get("val"))


def _is_detach(node: fx.Node) -> bool:
    return (node.op == "call_method" and node.target == "detach") or \
        (node.op == "call_function" and node.target in _DETACH)


def mark(gm: fx.GraphModule) -> int:
    """Gradient stops of Dynamo's graph made explicit (see the module doc); returns how many.
    Only values that would carry a gradient get one: a ``no_grad`` block computing rotary tables
    from buffers, or a detach of data, is left as it is."""
    graph = gm.graph
    enabled = torch.is_grad_enabled()
    carries: set = set()   # would carry a gradient if computed with grad enabled
    off: set = set()       # computed with grad disabled
    stops = []
    for n in graph.nodes:
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            enabled = bool(n.args[0])
            continue
        if n.op == "output":
            continue
        if n.op == "placeholder":
            value = _value(n)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                carries.add(n)
            continue
        if n.op == "get_attr":
            value = getattr(gm, str(n.target), None)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                carries.add(n)
            continue
        if enabled and _is_detach(n) and n.args and n.args[0] in carries:
            stops.append(n)
            continue
        if any(x in carries for x in n.all_input_nodes):
            carries.add(n)
        if not enabled or (n.target is operator.getitem and n.args[0] in off):
            off.add(n)
    count = 0
    for n in stops:  # a detach of a value that carries a gradient
        with graph.inserting_after(n):
            new = graph.call_function(STOP, (n.args[0],))
        new.meta.update(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        count += 1
    for n in [n for n in graph.nodes if n in off and n in carries]:  # a no_grad value read outside its block
        outside = [u for u in n.users if u not in off]
        if not outside or not isinstance(_value(n), torch.Tensor):
            continue
        with graph.inserting_after(n):
            new = graph.call_function(STOP, (n,))
        new.meta.update(n.meta)
        for u in outside:
            u.replace_input_with(n, new)
        count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count


def custom_backward(gm: fx.GraphModule):
    """The first call of a ``torch.autograd.Function`` left in Dynamo's graph (``units.wrap``
    makes the others one op each) whose backward is not the derivative of its forward, or None. The joint's backward half calls the Function's own
    backward; a joint that differentiates the forward graph again differentiates the Function's
    forward ops instead. That is exact where the backward is their derivative (Bloom's GeLU, a
    fused formula written by hand), which is checked numerically here on random inputs of the
    call's shapes at two scales; a Function whose backward differs (a straight-through
    estimator, a scaled or clipped gradient), or that cannot be checked, is returned."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and type(n.target).__name__ == "AutogradFunctionApply":
            try:
                same = _backward_is_derivative(gm, n)
            except (ImportError, NameError):  # this code against a torch it does not know: loud
                raise
            except Exception:  # noqa: BLE001 - not checkable: taken as a backward of its own
                same = False
            if not same:
                return n
    return None


def _real_like(value, scale: float, g: torch.Generator):
    shape = [size_hint(s, fallback=4) for s in value.shape]  # (a hint adds no guard)
    if not value.is_floating_point():
        raise TypeError("a non-floating input")
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(value.dtype)


def _without_grad_toggles(body: fx.GraphModule) -> fx.GraphModule:
    graph = copy.deepcopy(body.graph)
    for n in list(graph.nodes):
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            graph.erase_node(n)
    return fx.GraphModule(body, graph)


def _pure(body: fx.GraphModule) -> bool:
    """Only tensor math (ATen, torch functions, Tensor methods, operator): nothing with effects
    beyond its outputs (a collective, a hook) runs when the bodies are checked."""
    for n in body.graph.nodes:
        if n.op in ("placeholder", "output", "call_method"):
            continue
        if n.op != "call_function":
            return False
        module = getattr(n.target, "__module__", "") or ""
        if isinstance(n.target, torch._ops.OpOverload):
            if n.target.namespace not in ("aten", "prims"):
                return False
        elif n.target is torch._C._set_grad_enabled or module in ("_operator", "operator"):
            continue
        elif not module.startswith("torch") or module.startswith(("torch.distributed", "torch._dynamo")):
            return False
    return True


def _read_outputs(node: fx.Node):
    """Indices of the Function's outputs that the graph reads (None: all). Torch 2.11's forward
    body also returns intermediates, whose gradient placeholders the backward never reads; an
    output nothing reads gets no gradient in eager autograd either, so the check gives it none."""
    if all(u.target is operator.getitem and isinstance(u.args[1], int) for u in node.users):
        return {u.args[1] for u in node.users}
    return None


def _backward_is_derivative(gm: fx.GraphModule, node: fx.Node) -> bool:
    fwd_body, bwd = getattr(gm, node.args[0].target), getattr(gm, node.args[1].target)
    if not (_pure(fwd_body) and _pure(bwd)):
        return False
    fwd = _without_grad_toggles(fwd_body)
    values = [_value(a) if isinstance(a, fx.Node) else a for a in node.args[2:]]
    if not all(isinstance(v, (torch.Tensor, int, torch.SymInt)) for v in values):
        return False
    read, g = _read_outputs(node), torch.Generator().manual_seed(0)
    with unset_fake_temporarily():
        for scale in (1.0, 8.0):
            # (sizes of a symbolic compile come as arguments too: their hints, consistent with the shapes)
            args = [_real_like(v, scale, g).requires_grad_(True) if isinstance(v, torch.Tensor)
                    else size_hint(v, fallback=4) for v in values]
            if not _agrees(fwd, bwd, args, read, g):
                return False
    return True


def _derivative(fwd, args, cotangents):
    """Autograd's derivative of the forward body at ``args``, with ``cotangents`` (a list, or a
    function of the body's outputs that makes one); also the body's saved values and the list."""
    xs = [a for a in args if isinstance(a, torch.Tensor)]
    with torch.enable_grad():
        outs, saved = fwd(*args)
        cotangents = cotangents(outs) if callable(cotangents) else cotangents
        pairs = [(o, c) for o, c in zip(_tensors(outs), cotangents) if o.requires_grad]
        if not pairs:
            return [None] * len(xs), saved, cotangents
        grads = torch.autograd.grad([o for o, _ in pairs], xs, [c for _, c in pairs], allow_unused=True)
    return grads, saved, cotangents


def _tensors(outs):
    return [o for o in outs if isinstance(o, torch.Tensor)]


def _agrees(fwd, bwd, args, read, g) -> bool:
    """One probe: the Function's backward against autograd's derivative of its forward, both in
    the call's dtypes. Each is judged by its distance to the same derivative computed in float64:
    the backward may be off by a few times what the derivative's own rounding is off (bf16 rounds
    at 2**-8, fp32 at 2**-24), never by more (a scaled or clipped gradient is off by far more)."""

    def random_cotangents(outs):  # none for an output the graph never reads
        return [(torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype) if read is None or i in read
                 else torch.zeros_like(o)) for i, o in enumerate(outs) if isinstance(o, torch.Tensor)]

    derived, saved, cotangents = _derivative(fwd, args, random_cotangents)
    wide = [a.detach().double().requires_grad_(True) if isinstance(a, torch.Tensor) else a for a in args]
    exact, _, _ = _derivative(fwd, wide, [c.double() for c in cotangents])
    with torch.no_grad():
        own = bwd(*cotangents, *[s.detach() if isinstance(s, torch.Tensor) else s for s in saved])
    own = list(own) if isinstance(own, (tuple, list)) else [own]
    if len(own) == len(args):  # a gradient (None) for each size argument too
        own = [o for o, a in zip(own, args) if isinstance(a, torch.Tensor)]
    if len(own) != len(derived):
        return False
    for d, o, e in zip(derived, own, exact):
        if d is None or o is None:
            if (d is None) != (o is None) and bool((d if o is None else o).abs().sum() > 0):
                return False
            continue
        if d.shape != o.shape:
            return False
        e = e.detach() if e is not None else torch.zeros_like(d, dtype=torch.float64)
        rounding = (d.double() - e).abs().max().item()
        if (o.double() - e).abs().max().item() > 4 * rounding + 1e-4 * max(e.abs().max().item(), 1e-30):
            return False
    return True


def strip(joint: fx.GraphModule) -> int:
    """Each gradient stop of a joint whose backward is derived becomes an alias of its input."""
    nodes = joint.graph.find_nodes(op="call_function", target=STOP)
    for n in nodes:
        n.target = torch.ops.aten.alias.default
    if nodes:
        joint.recompile()
    return len(nodes)

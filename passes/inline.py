"""Nested compile regions inlined into Dynamo's graph.

``torch.compiler.nested_compile_region`` on a function (a decoder layer's ``forward``, so that
every layer compiles once) makes each of its calls ``invoke_subgraph(subgraph, identifier,
*operands)`` in Dynamo's graph, which AOTAutograd keeps as one op with a forward and a backward
graph of its own: the passes would see each layer as one opaque op, with no attention and no
sequence rule inside, and stream none of them. ``inline(gm)`` copies each call's subgraph in
place of the call, so the graph holds the ops of every layer as if the function were not
decorated. Compiling once for every layer is kept another way: layers of one structure share
their chunk graphs (``streamfx.chunks``).
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

MAX_DEPTH = 16   # regions nested in regions, inlined level by level


def is_region_call(n: fx.Node) -> bool:
    return n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator) \
        and n.target.name() == "invoke_subgraph"


def inline(gm: fx.GraphModule) -> int:
    """Replaces every ``invoke_subgraph`` call of ``gm`` (and of the subgraphs it inlines) by the
    subgraph's nodes; returns how many calls it inlined. A call whose subgraph does not take its
    operands one by one, or whose result is read other than by index, stays as it is."""
    count = 0
    for _ in range(MAX_DEPTH):
        calls = [n for n in gm.graph.nodes if is_region_call(n)]
        done = sum(_inline_call(gm, n) for n in calls)
        count += done
        if not done:
            break
    if count:   # (copies nothing reads are left to AOTAutograd's trace: an in-place update has no users either)
        gm.graph.lint()
        gm.recompile()
    return count


def _inline_call(gm: fx.GraphModule, call: fx.Node) -> bool:
    body_node, operands = call.args[0], call.args[2:]
    if not (isinstance(body_node, fx.Node) and body_node.op == "get_attr") or call.kwargs:
        return False
    body = getattr(gm, body_node.target)
    params = body.graph.find_nodes(op="placeholder")
    if len(params) != len(operands) or any(u.op != "call_function" or u.target is not operator.getitem
                                           or not isinstance(u.args[1], int) for u in call.users):
        return False
    env = dict(zip(params, operands))
    result = None
    with gm.graph.inserting_before(call):
        for node in body.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                result = node.args[0]
                break
            if node.op == "get_attr":   # (a nested subgraph or constant of the body: one of gm's own)
                name = _free_name(gm, node.target.replace(".", "_"))
                setattr(gm, name, _attr(body, node.target))
                env[node] = gm.graph.get_attr(name)
                env[node].meta.update(node.meta)
                continue
            env[node] = gm.graph.node_copy(node, lambda x: env[x])
            _restack(env[node], call)
    outs = fx.node.map_arg(result, lambda x: env[x])
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    for u in list(call.users):
        u.replace_all_uses_with(outs[u.args[1]])
        gm.graph.erase_node(u)
    gm.graph.erase_node(call)
    if not body_node.users:
        gm.graph.erase_node(body_node)
    return True


def _restack(node: fx.Node, call: fx.Node) -> None:
    """The module stack of a node copied for ``call``: the subgraph was traced in one call (the
    first layer's), so its nodes name that layer's modules; they get the call's own stack, and
    the modules below it named under the call's module (``model.layers.1.self_attn``)."""
    stack = list((node.meta.get("nn_module_stack") or {}).items())
    outer = list((call.meta.get("nn_module_stack") or {}).items())
    if not outer or len(stack) < len(outer) or \
            getattr(stack[len(outer) - 1][1][1], "__qualname__", None) != getattr(outer[-1][1][1], "__qualname__", ""):
        return
    traced, own = stack[len(outer) - 1][1][0], outer[-1][1][0]
    inner = [(f"{key}@{own}" if own != traced else key,
              (own + path[len(traced):] if path.startswith(traced) else path, cls))
             for key, (path, cls) in stack[len(outer):]]
    node.meta["nn_module_stack"] = dict(outer + inner)


def _attr(module, target: str):
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _free_name(gm: fx.GraphModule, base: str) -> str:
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    return name

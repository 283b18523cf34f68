"""The decomposition table of the joint graph the streaming passes read.

The streamed joint differentiates the forward graph again, so each op in it must have eager's
derivative: ops whose decomposition is the same function with another derivative in floating
point stay whole where a gradient is taken through them (``KEPT_WHOLE``), and graphs handed to a
partitioner and Inductor are decomposed first (``decompose_kept``). A mean is a sum over its
sizes, so that the head streams a loss averaged over tokens.
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch._inductor.decomposition import select_decomp_table


# Ops kept whole in the joint graph: the streamed joint differentiates the forward graph again,
# and these ops' own derivatives are exact where their decompositions' are not (``_safe_softmax``
# of a row whose keys are all masked is 0; differentiating its decomposition gives 0 * nan; the
# gradient of a vector norm at a zero vector is 0, that of its decomposition sqrt(sum(x^2)) nan;
# SiLU decomposed as x / (1 + exp(-x)) has the derivative exp(-x) / (1 + exp(-x))^2, inf / inf at
# x = -100, where autograd's silu_backward gives 0). Every elementwise function the decomposition
# table writes with other ops is kept whole (activations, softplus, logaddexp, xlogy...): the
# re-derived joint, traced with the table, then decomposes it and its own backward, as
# AOTAutograd does. Left to the table: arithmetic it only rewrites (add with alpha, rsub, true
# division, bit operations), whose derivative is the same.
_REWRITTEN_ONLY = {"add", "rsub", "true_divide", "__xor__", "bitwise_and_", "bitwise_or_", "conj_physical",
                   "isfinite", "isneginf", "isposinf", "masked_fill", "lcm", "angle"}


def _kept_whole() -> tuple:
    table = select_decomp_table()
    pointwise = tuple(op for op in table if isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags
                      and op.namespace == "aten" and not op._overloadpacket.__name__.endswith(("_backward", "_"))
                      and op._overloadname not in ("out", "grad_input") and not op._overloadname.endswith("_out")
                      and op._overloadpacket.__name__ not in _REWRITTEN_ONLY)
    return (torch.ops.aten._safe_softmax.default, torch.ops.aten.linalg_vector_norm.default) + pointwise


KEPT_WHOLE = _kept_whole()


def _mean_dtypes(x, dtype) -> tuple:
    """(the mean's dtype, the dtype its sum accumulates in: fp32 for half precision)."""
    out_dtype = dtype or x.dtype
    return out_dtype, torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype


def _mean_as_sum(x, *, dtype=None):
    """The mean of a whole tensor as its sum over its size, in aten ops (the streamed joint
    differentiates them again), so a loss written as the mean of per-token terms
    (``per_token.mean()``) is a sum the head streams. Half-precision sums accumulate in fp32 and
    round once, as ``mean`` does."""
    out_dtype, acc = _mean_dtypes(x, dtype)
    total = torch.ops.aten.sum.default(x, dtype=acc)
    return torch.ops.aten.div.Tensor(total, x.numel()).to(out_dtype)


def _mean_dim_as_sum(x, dim=None, keepdim=False, *, dtype=None):
    """The mean over some dims as the sum over them divided by their sizes' product (ATen's CPU
    kernel computes it so), so a mean over the tokens (a per-sequence mean of per-token losses,
    ``loss.view(B, T).mean(1)``) is a sum the head streams. Half precision as in ``_mean_as_sum``."""
    dims = [d % max(x.dim(), 1) for d in ([dim] if isinstance(dim, int) else (dim or range(x.dim())))]
    count = 1
    for d in dims:
        count = count * (x.shape[d] if x.dim() else 1)
    out_dtype, acc = _mean_dtypes(x, dtype)
    total = torch.ops.aten.sum.dim_IntList(x, dims, keepdim, dtype=acc)
    return torch.ops.aten.div.Tensor(total, count).to(out_dtype)


def _binary_cross_entropy(x, target, weight=None, reduction=1):
    """Binary cross-entropy as its elementwise op (kept whole: its own derivative is finite where the
    probability is 0 or 1, that of its decomposition's clamped logarithm is not) and the reduction."""
    if reduction == 0:
        return NotImplemented
    loss = torch.ops.aten.binary_cross_entropy.default(x, target, weight, 0)
    return torch.ops.aten.mean.default(loss) if reduction == 1 else torch.ops.aten.sum.default(loss)


def decompositions() -> dict:
    """Inductor's decomposition table without the ops in ``KEPT_WHOLE`` (``decompose_kept``
    decomposes them before Inductor compiles a graph), and the mean as a sum (``_mean_as_sum``,
    ``_mean_dim_as_sum``)."""
    table = {op: fn for op, fn in select_decomp_table().items() if op not in KEPT_WHOLE}
    table[torch.ops.aten.mean.default] = _mean_as_sum
    table[torch.ops.aten.mean.dim] = _mean_dim_as_sum
    table[torch.ops.aten.binary_cross_entropy.default] = _binary_cross_entropy
    return table


def decompose_kept(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` (a joint graph about to be partitioned and compiled) with every op of ``KEPT_WHOLE``
    replaced, in place, by its decomposition traced at the node's values: its backward exists
    already, so nothing is differentiated again, and Inductor gets the forms it lowers (torch 2.11
    has no lowering for some of them). Names, placeholders and outputs stay as they are."""
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    kept = set(KEPT_WHOLE)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in kept]
    if not nodes:
        return gm
    table = select_decomp_table()
    mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")])
    for node in nodes:
        flat, spec = torch.utils._pytree.tree_flatten((node.args, node.kwargs))
        where = [i for i, a in enumerate(flat) if isinstance(a, fx.Node)]
        op = node.target

        def call(*tensors, flat=flat, where=where, spec=spec, op=op):
            values = list(flat)
            for i, t in zip(where, tensors):
                values[i] = t
            args, kwargs = torch.utils._pytree.tree_unflatten(values, spec)
            return op(*args, **kwargs)

        with mode:
            sub = make_fx(call, decomposition_table=table)(*[flat[i].meta["val"] for i in where])
        env = dict(zip(sub.graph.find_nodes(op="placeholder"), [flat[i] for i in where]))
        before = set(gm.graph.nodes)
        with gm.graph.inserting_before(node):
            out = gm.graph.graph_copy(sub.graph, env)
        for new in gm.graph.nodes:   # (each piece is the op as the model wrote it: its line, module, tags)
            if new not in before:
                new.meta.update({k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta", "example_value")})
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm

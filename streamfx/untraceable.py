"""Custom ops whose backward AOTAutograd cannot trace: the graph runs eagerly, with the cause named.

A custom op's backward registered in Python (``torch.library.register_autograd``) is traced into
the joint graph; one that reads a tensor's values (``offs.tolist()``, ``.item()``) fails there with
a data-dependent error, streamed or not. Such a graph cannot be compiled at all; it runs as
Dynamo captured it (eager autograd, the op's own backward: exact, unstreamed), and the refusal
names the op, with what is known about it (:data:`KNOWN`), instead of a generic failure.
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from .errors import CannotStream

# op -> what is known about its backward, and the remedy
KNOWN = {
    "transformers::grouped_mm_fallback": (
        "transformers < 5.24 registers this backward (its MoE expert matmul for weights other than bf16 "
        "under torch.compile; it calls offs.tolist()): fp32 and fp16 MoE layers stream with "
        "transformers >= 5.24, or with bf16 weights"),
}
_BUILTIN = ("aten", "prims", "streamfx", "higher_order")


def op_name(target) -> str | None:
    """``namespace::op`` of an op overload or packet; None for anything else."""
    if isinstance(target, torch._ops.OpOverload):
        return target.name()
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name
    return None


def _data_dependent(err: BaseException | None) -> bool:
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (DataDependentOutputException, GuardOnDataDependentSymNode)) \
                or "_local_scalar_dense" in str(err):
            return True
        err = getattr(err, "inner_exception", None) or err.__cause__ or err.__context__
    return False


def refusal(gm: fx.GraphModule, err: BaseException) -> CannotStream | None:
    """The refusal for a compile that failed on a custom op's untraceable backward, or None."""
    if not _data_dependent(err):
        return None
    custom = [n for n in gm.graph.nodes if n.op == "call_function" and op_name(n.target)
              and op_name(n.target).split("::")[0] not in _BUILTIN]
    if not custom:
        return None
    n = next((n for n in custom if op_name(n.target) in KNOWN), custom[0])
    known = KNOWN.get(op_name(n.target))
    return CannotStream(
        f"the backward of {op_name(n.target)} reads a tensor's values (.tolist(), .item()), which "
        f"AOTAutograd cannot trace into a joint graph, streamed or not: the graph runs eagerly"
        + (f"; {known}" if known else ""), n)

"""Run-time failures of a streamed region's chunk schedule: what reaches the user, and how.

The analysis decides what streams; a chunk schedule that fails when it runs is a bug found late,
never a silent change of program. ``settle`` decides from the exception and the options alone:

- a device error (out of memory, an accelerator or CUDA error) reaches the user as itself (the
  same object and type), with a note naming the region and the chunk; the region is never rerun
  whole (that would need more memory than the chunk that failed, and hide the first cause);
- so does an error the user asked for about the step's values (anomaly mode's NaN found in a
  backward's output): it is the model's, streamed or not;
- with ``strict=True`` (and under ``STREAMFX_VERIFY``, the tests' self-checks) any other failure
  raises ``StreamBPError`` naming the region, the chunk, and the op and its source line where
  the chunk graph runs as an FX graph (``codegen="eager"``);
- otherwise the region runs whole for this call (exact, not streamed): warned once per region,
  counted in ``COUNTERS["region_fallbacks"]`` and on the program (``explain()`` lists them).
"""
from __future__ import annotations

import traceback
import warnings

import torch

from .chunks import COUNTERS
from .errors import StreamBPError, op_name, source_line

# exception types, and the first words of RuntimeError messages, of device errors: the device
# state is what failed, not the schedule
DEVICE_ERRORS = tuple(t for t in (torch.OutOfMemoryError, getattr(torch, "AcceleratorError", None)) if t)
DEVICE_MESSAGES = ("CUDA error", "CUDA driver error", "CUDA out of memory", "cuDNN error", "CUDNN_STATUS_",
                   "CUBLAS_STATUS_", "HIP error", "XPU out of memory", "MPS backend out of memory", "NCCL error")

KEPT_CAUSES = 8   # distinct (phase, cause) pairs a region program keeps of the calls it ran whole

# the words of RuntimeError messages the user asked for about the values the step computes:
# anomaly mode's check of each backward's outputs (``torch.autograd.set_detect_anomaly``)
VALUE_MESSAGES = ("returned nan values in its",)


class chunk:
    """``with chunk(phase, s, e, T):`` around one chunk's work: an exception leaving it records
    where it was raised (the innermost chunk wins)."""

    __slots__ = ("where",)

    def __init__(self, phase: str, s: int, e: int, T: int):
        self.where = (phase, s, e, T)

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if err is not None and getattr(err, "_streamfx_chunk", None) is None:
            try:
                err._streamfx_chunk = self.where
            except AttributeError:  # (an exception type without a __dict__)
                pass
        return False


def is_device_error(err: BaseException) -> bool:
    return isinstance(err, DEVICE_ERRORS) or (
        isinstance(err, RuntimeError) and str(err).lstrip().startswith(DEVICE_MESSAGES))


def is_value_error(err: BaseException) -> bool:
    return isinstance(err, RuntimeError) and any(m in str(err) for m in VALUE_MESSAGES)


def settle(prog, err: Exception, phase: str) -> None:
    """Raise what must reach the user; return (after the warning and the count) when the region
    may run whole for this call."""
    from streamfx.passes import verify

    where = f"region '{prog.name}', in {_chunk(err, phase)}"
    if is_device_error(err):
        err.add_note(f"streamfx: raised in {where} (not rerun whole: a device error reaches the caller)")
        raise err
    if is_value_error(err):
        err.add_note(f"streamfx: raised in {where} (anomaly mode's check of the values, which the region's "
                     "unstreamed form meets as well: not rerun whole)")
        raise err
    cause = f"{type(err).__name__}: {_first_line(err)}{_op(prog, err)}"
    failed = f"streamfx: region '{prog.name}' could not run chunk by chunk ({cause}), in {_chunk(err, phase)}"
    if prog.strict or verify.enabled():
        raise StreamBPError(f"{failed} ({'strict=True' if prog.strict else 'STREAMFX_VERIFY'})") from err
    COUNTERS["region_fallbacks"] += 1   # (every call; the program keeps its first distinct causes)
    first = not prog.fallbacks
    if (phase, cause) not in prog.fallbacks and len(prog.fallbacks) < KEPT_CAUSES:
        prog.fallbacks.append((phase, cause))
    if first:  # once per region program, as the compile-time refusals
        warnings.warn(f"{failed}; it runs without streaming for this call (strict=True raises instead)",
                      stacklevel=4)


def _chunk(err, phase: str) -> str:
    """Where in the schedule ``err`` was raised: 'the forward of chunk [s, e) of T tokens'."""
    at = getattr(err, "_streamfx_chunk", None)
    if at is None:
        return f"the {phase}"
    phase, s, e, T = at
    return f"the {phase} of chunk [{s}, {e}) of {T} tokens"


def _first_line(err) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else ""


def _op(prog, err) -> str:
    """': op at file:line (code)' of the node whose line of an FX chunk graph raised, or ''."""
    node = failing_node(prog, err)
    return f": {op_name(node)}{source_line(node)}" if node is not None else ""


def failing_node(prog, err):
    """The node of one of the program's FX graphs whose generated line is the innermost frame of
    ``err``'s traceback in such a graph (None when no FX graph ran it: Inductor's code)."""
    graphs = [g.gm for g in (prog.chunk, getattr(prog, "causal", None), getattr(prog, "kv", None), prog.full)
              if g is not None]
    mask = getattr(prog, "mask", None)
    if mask is not None:
        graphs.append(mask.graph.gm)
    codes = {type(gm).forward.__code__: gm for gm in graphs}
    for frame, lineno in reversed(list(traceback.walk_tb(err.__traceback__))):
        gm = codes.get(frame.f_code)
        if gm is None:
            continue
        index = gm._lineno_map.get(lineno - frame.f_code.co_firstlineno) if gm._lineno_map else None
        nodes = list(gm.graph.nodes)
        return nodes[index] if index is not None and index < len(nodes) else None
    return None

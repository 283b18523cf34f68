"""Exceptions raised by streamfx."""
import functools

from torch._dynamo.exc import ShortenTraceback


class StreamBPError(ShortenTraceback, ValueError):
    """Bad options, or a strict-mode refusal to fall back.

    It derives from Dynamo's ShortenTraceback so that torch.compile lets it reach the user as
    itself (not wrapped in BackendCompilerFailed), and from ValueError for plain callers.
    """

    def __init__(self, message: str):
        super().__init__(message, first_useful_frame=None)


class CannotStream(Exception):
    """Raised by an analysis or rewrite, before it changes anything, when a region cannot stream.

    ``node`` is the FX node responsible (its op and source line go into the user's warning).
    """

    def __init__(self, reason: str, node=None):
        super().__init__(reason)
        self.reason = reason
        self.node = node

    def describe(self) -> str:
        if self.node is None:
            return self.reason
        return f"{self.reason}: {op_name(self.node)}{source_line(self.node)}"


def op_name(node) -> str:
    target = node.target
    name = getattr(target, "__name__", None) or str(target)
    return str(getattr(target, "_overloadpacket", name)) if hasattr(target, "_overloadpacket") else name


def source_line(node) -> str:
    """' at file:line (code)' for the innermost user frame of an FX node's stack_trace, or ''."""
    trace = node.meta.get("stack_trace") if node is not None else None
    if not trace:
        return ""
    lines = [ln.strip() for ln in trace.strip().splitlines()]
    frames = [i for i, ln in enumerate(lines) if ln.startswith("File ")]
    if not frames:
        return ""
    user = [i for i in frames if not _library_frame(lines[i])]
    i = (user or frames)[-1]  # the innermost frame of the user's code, not torch's
    loc = lines[i]
    code = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else ""
    try:
        file_part, rest = loc.split(", line ", 1)
        where = f"{file_part[6:-1]}:{rest.split(',')[0]}"
    except ValueError:
        where = loc
    return f" at {where}" + (f" ({code})" if code else "")


@functools.cache
def _library_dirs() -> tuple:
    """The directories of torch and of streamfx's own code (the package and its passes): frames
    there are not the user's. By location, not by name: a user's project may live in a folder
    called streamfx."""
    import os

    import torch

    here = os.path.dirname(os.path.abspath(__file__))
    passes = os.path.join(os.path.dirname(here), "passes")
    return tuple(os.path.join(d, "") for d in (os.path.dirname(os.path.abspath(torch.__file__)), here, passes))


def _library_frame(line: str) -> bool:
    """Whether a ``File "...", line N, in f`` line of a stack trace is in torch or streamfx."""
    import os

    path = line[len('File "'):].split('", line ', 1)[0]
    return os.path.abspath(path).startswith(_library_dirs())


def failure(err: Exception, step: str) -> CannotStream:
    """An unexpected exception of a pass as a refusal: the reason names the pass step, the
    exception and the innermost pass function it passed through; the node is the one the
    innermost frame holding a graph node was working on (its op and source line go into the
    warning)."""
    import os
    import traceback

    import torch.fx as fx

    frames, tb = [], err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    own = _library_dirs()[1:]   # streamfx and its passes
    ours = [f for f in frames if os.path.abspath(f.f_code.co_filename).startswith(own)]
    node = None
    for frame in reversed(frames):  # the innermost frame working on a node (a pass, or torch under it)
        found = [v for k, v in frame.f_locals.items() if isinstance(v, fx.Node) and k in _NODE_NAMES]
        found = found or [v for v in frame.f_locals.values() if isinstance(v, fx.Node)]
        if found:
            node = found[0]
            break
    where = ""
    if ours:
        summary = traceback.extract_tb(err.__traceback__)[frames.index(ours[-1])]
        where = f" in {summary.filename.rsplit('/', 2)[-2]}/{summary.filename.rsplit('/', 1)[-1]}:{summary.lineno} {summary.name}"
    text = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
    return CannotStream(f"{step} failed ({type(err).__name__}: {text}{where})", node)


_NODE_NAMES = ("node", "n", "user", "x", "site", "out")

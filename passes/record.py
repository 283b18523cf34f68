"""The one namespaced, frozen record streamfx keeps per FX node: ``node.meta["streamfx"]``."""
from __future__ import annotations

import dataclasses

KEY = "streamfx"


@dataclasses.dataclass(frozen=True)
class NodeRecord:
    dims: tuple = ()              # role of each dim of the (first) output: "q", "k" or None
    cls: str | None = None        # class from seq_dims.CLASSES
    part: str | None = None       # "forward" or "backward" half of the joint graph
    region: str | None = None     # region name, e.g. "layer.2" or "head"
    attention: int | None = None  # attention site index
    created_by: str | None = None  # the pipeline step that made the node (None: traced by AOTAutograd)


def tag(node, record: NodeRecord) -> None:
    """Attach an analysis record. Analyses are recomputed after a rewrite, so records are
    replaced whole; which step made the node survives the replacement."""
    old = node.meta.get(KEY)
    if old is not None and old.created_by and not record.created_by:
        record = dataclasses.replace(record, created_by=old.created_by)
    node.meta[KEY] = record


def made_by(node, step: str) -> None:
    """Record that pipeline step ``step`` created ``node``."""
    node.meta[KEY] = dataclasses.replace(node.meta.get(KEY) or NodeRecord(), created_by=step)


def get(node) -> NodeRecord | None:
    return node.meta.get(KEY)

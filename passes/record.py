"""The one namespaced, frozen record streamfx keeps per FX node: ``node.meta["streamfx"]``."""
from __future__ import annotations

import dataclasses

KEY = "streamfx"


@dataclasses.dataclass(frozen=True)
class NodeRecord:
    dims: tuple                 # role of each dim of the (first) output: "q", "k" or None
    cls: str                    # class from seq_dims.CLASSES
    part: str                   # "forward" or "backward" half of the joint graph
    region: str | None = None   # region name, e.g. "layer.2" or "head"
    attention: int | None = None  # attention site index
    created_by: str | None = None  # the pass that created the node, for nodes made by streamfx


def tag(node, record: NodeRecord) -> None:
    """Attach a record; analyses are recomputed after a rewrite, so records are replaced whole."""
    node.meta[KEY] = record


def get(node) -> NodeRecord | None:
    return node.meta.get(KEY)

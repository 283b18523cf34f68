"""Layer inputs off the device: offload (``offload="cpu" | "disk"``) and two-level recompute
(``keep_every=k``).

A streamed layer keeps one tensor for its backward: its input (plus small per-token values:
masks, positions, dropout masks). Where either option is on, the rewrite calls a layer as
``streamfx::region_stored`` instead of ``streamfx::region``. The op runs the layer as the region
op does, then hands the inputs that are to leave AOTAutograd's saved tensors to the store here,
and returns one more output: a handle (a 1-element int64 CPU tensor holding the entry's id).
Its autograd formula saves the handle and the other inputs only, so AOTAutograd saves neither
the stored inputs nor anything they alias; ``streamfx::region_stored_backward`` reads them back
from the entry. The entry goes when its backward has read it, unless the graph is retained for
another backward (``retain_graph=True``); otherwise, and at the latest, when its handle goes:
when autograd frees the saved handle (with the graph of a step that never ran its backward, or
with the frames of an exception) the entry's copies and files go with it. A call run only to be
compiled and reported (``plan_memory``, ``explain``: ``runtime.analysis``) stores nothing: it has no
backward.

What an entry holds (``StorePlan``, decided per region at the rewrite, ``plans``):
- ``offloaded``: the region's per-token inputs (the residual input, dropout masks, cos/sin of a
  layer compiled alone), each written to the tier: "cpu", pinned host memory, copied on a side
  stream while the next layer computes and copied back one layer ahead of its backward; "disk",
  a file under ``offload_dir`` (written from host memory; read back one layer ahead by a worker
  thread).
- ``dropped``: with ``keep_every=k``, the residual input of a layer whose input is the previous
  layer's output in the same graph (a chain), for every layer but each k-th of a chain. Its
  backward rebuilds it from the nearest kept input before it by running the layers between
  forward again (the region op's own chunked forward: the same compiled chunk graphs on the same
  inputs, so the rebuilt input equals the forward's bit for bit; dropout masks are region
  inputs, drawn once, so the replay reads the same randomness). The rebuilt inputs of a group are
  made together, at the backward of its last layer, and each is freed by its own layer's
  backward: a step keeps about L/k + k layer inputs instead of L.

With ``offload="auto"`` (the default under a ``memory_budget``), every layer's per-token
inputs are candidates and each call picks what happens to them (``StorePlan.resolve``): the
budget's policy (``membudget.BudgetPolicy``) takes the first storage, in ``storages``' order, at
which the memory model predicts the step to fit; inputs that stay are held as device copies
(``kept``).

Device copies sit behind one small interface (``HostCopies`` on the CPU, ``CudaCopies``), so the
order of copies, prefetches and releases runs the same on the CPU as on a GPU. On the CPU the
"cpu" tier is a same-device copy (the input already lives in host memory: it saves nothing).
"""
from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import itertools
import os
import shutil
import tempfile
import threading
import warnings
import weakref
from typing import Optional

import torch

from .chunks import COUNTERS

TIERS = ("cpu", "disk")
for _name in ("inputs_offloaded", "inputs_loaded", "inputs_rebuilt", "inputs_dropped", "inputs_kept"):
    COUNTERS.setdefault(_name, 0)


@dataclasses.dataclass(frozen=True)
class Options:
    """What leaves AOTAutograd's saved tensors: the tier of the offloaded inputs (None: none are;
    "auto": chosen per call, see ``storages``) and every how many layers of a chain an input is
    kept (1: all)."""
    offload: str | None = None
    offload_dir: str | None = None
    keep_every: int = 1

    @classmethod
    def of(cls, config) -> "Options | None":
        if config.storage_auto:
            return cls("auto", config.offload_dir, 1)
        keep = config.keep_every or 1
        if config.offload is None and keep == 1:
            return None
        return cls(config.offload, config.offload_dir, keep)

    def describe(self) -> str:
        if self.offload == "auto":
            return ("layer inputs chosen per call by the memory budget: kept in device memory where the step is "
                    "predicted to fit, else offloaded: on a GPU to pinned host memory (with keep_every where host "
                    "memory is short, then to files), on a CPU device to files (under "
                    f"{self.offload_dir or tempfile.gettempdir()})")
        return describe_storage(self.offload, self.keep_every, self.offload_dir)


def storages(device: str) -> list:
    """The storages ``offload="auto"`` tries, cheapest first: (tier, keep_every). On a CPU device
    files are the one tier that frees memory (layer inputs already live in host memory), and
    rebuilding inputs frees no more than files do. A GPU moves inputs to pinned host memory, with
    keep_every where host memory holds too few of them (``StepModel.host_bytes``), then files."""
    if str(device).startswith("cuda"):
        return [(None, 1)] + [("cpu", k) for k in (1, 2, 3, 4, 6, 8)] + [("disk", 1)]
    return [(None, 1), ("disk", 1)]


def describe_storage(tier: str | None, keep_every: int, offload_dir: str | None = None) -> str:
    where = {None: "kept in device memory", "cpu": "offloaded to pinned host memory",
             "disk": f"offloaded to files under {offload_dir or tempfile.gettempdir()}"}[tier]
    text = f"layer inputs {where}"
    if keep_every > 1:
        text += (f"; keep_every={keep_every}: one layer input in {keep_every} of consecutive layers "
                 f"kept, the others rebuilt in the backward")
    return text


@dataclasses.dataclass(frozen=True)
class StorePlan:
    """How one region call keeps its inputs (indices into the region's inputs). A plan of tier
    "auto" lists candidates (``offloaded``, ``dropped``), which ``resolve`` turns into one call's plan."""
    region: str
    offloaded: tuple = ()          # inputs written to the tier
    dropped: int | None = None     # the chain input rebuilt in the backward (keep_every)
    link: tuple | None = None      # (input index, previous region key, its output index) of a chain
    feeds: bool = False            # the next layer's input is dropped: keep what rebuilds it
    tier: str | None = None
    directory: str | None = None
    keep_every: int = 1
    kept: tuple = ()               # inputs the store holds as device copies (a call of an "auto" plan)
    depth: int = 0                 # the layer's place in its chain (0: its first)

    def resolve(self, tier: str | None, keep_every: int) -> "StorePlan":
        """One call's plan of an "auto" plan: its inputs go to ``tier`` (None: device copies), and
        with ``keep_every`` the chain input of each layer but every k-th of a chain is rebuilt."""
        if self.tier != "auto":
            return self
        dropped = self.dropped if self.dropped is not None and self.depth % keep_every else None
        rest = tuple(sorted(set(self.offloaded) | ({self.dropped} - {dropped, None})))
        return dataclasses.replace(self, offloaded=rest if tier else (), kept=() if tier else rest, dropped=dropped,
                                   feeds=self.feeds and (self.depth + 1) % keep_every != 0, tier=tier,
                                   keep_every=keep_every)

    @property
    def options(self) -> Options:
        return Options(self.tier, self.directory, self.keep_every)

    @property
    def stored(self) -> frozenset:
        return frozenset(self.offloaded) | frozenset(self.kept) | ({self.dropped} if self.dropped is not None else set())

    @property
    def active(self) -> bool:
        return bool(self.offloaded) or self.dropped is not None or self.feeds

    def describe(self) -> str:
        if self.tier == "auto":
            return f"{self.region}: {len(self.stored)} input(s) whose storage each call chooses"
        parts = []
        if self.offloaded:
            parts.append(f"{len(self.offloaded)} input(s) offloaded ({self.tier})")
        parts.append("input rebuilt in the backward" if self.dropped is not None else "input kept")
        return f"{self.region}: " + ", ".join(parts)


PLANS: dict[int, StorePlan] = {}


# ---- the plan (at the rewrite) ------------------------------------------------------------------
def plans(programs, options: Options) -> dict:
    """{region key: StorePlan} for the layer regions of one graph. Layers form chains where a
    layer's residual input is the previous layer's output itself (no op between); keep_every
    counts along a chain. Warns where keep_every is on and a layer starts a chain of its own
    for a reason other than being the first layer of the graph."""
    from .runtime import LayerProgram

    layers = [(plan, prog) for plan, prog in programs if isinstance(prog, LayerProgram)]
    producer = {o: (prog.key, j) for plan, prog in layers for j, o in enumerate(plan.results)}
    readers = {}
    for plan, _ in programs:
        for x in plan.inputs:
            readers[x] = readers.get(x, 0) + 1
    out, depth = {}, {}
    for n, (plan, prog) in enumerate(layers):
        per_token = [i for i, (x, spec) in enumerate(zip(plan.inputs, plan.in_specs))
                     if spec.kind == "chunk" and readers[x] == 1 and _floating_or_bool(x)]
        linked = [i for i in per_token if plan.inputs[i] in producer]
        link = (linked[0], *producer[plan.inputs[linked[0]]]) if len(linked) == 1 else None
        depth[prog.key] = depth[link[1]] + 1 if link is not None and link[1] in depth else 0
        dropped = link[0] if link is not None and depth[prog.key] % options.keep_every else None
        if options.offload == "auto":   # candidates: each call's plan is ``StorePlan.resolve``'s
            dropped = link[0] if link is not None else None
        if options.keep_every > 1 and link is None:
            _warn_unchained(plan, per_token, first=n == 0, alone=len(layers) == 1)
        offloaded = tuple(i for i in per_token if i != dropped) if options.offload else ()
        out[prog.key] = StorePlan(plan.name, offloaded, dropped, link, tier=options.offload,
                                  directory=options.offload_dir, keep_every=options.keep_every, depth=depth[prog.key])
    for key, sp in list(out.items()):  # a layer whose successor's input is rebuilt keeps its inputs
        if sp.dropped is not None:
            prev = sp.link[1]
            out[prev] = dataclasses.replace(out[prev], feeds=True)
    return {k: v for k, v in out.items() if v.active}


def _floating_or_bool(x) -> bool:
    v = x.meta.get("val")
    return isinstance(v, torch.Tensor) and (v.is_floating_point() or v.dtype == torch.bool)


_WARNED: set = set()


def _warn_unchained(plan, per_token, first: bool, alone: bool) -> None:
    from .errors import source_line

    if first and not alone:
        return
    if alone:
        cause = ("this graph holds one layer (a layer compiled alone: FSDP2 or ZeRO-3 per layer, "
                 "a graph break): its input is kept; keep_every rebuilds inputs from consecutive "
                 "layers of one graph")
    else:
        x = plan.inputs[per_token[0]] if per_token else None
        where = f" ({x.name}{source_line(x)})" if x is not None else ""
        cause = (f"the input of {plan.name} is not the previous layer's output itself but computed "
                 f"from it by ops outside the streamed layers{where}: it is kept and starts a new group")
    if cause not in _WARNED:
        _WARNED.add(cause)
        warnings.warn(f"streamfx: keep_every: {cause}", stacklevel=2)


# ---- device copies --------------------------------------------------------------------------
class HostCopies:
    """Copies for tensors that live in host memory: nothing to overlap, no events."""

    def to_host(self, t):
        # a compiled graph may reuse the input's buffer once the region op has returned
        return t.clone(memory_format=torch.contiguous_format), None

    def to_device(self, host, device):
        return host, None

    def ready(self, t, event) -> None:
        """Before the compute stream reads ``t``."""

    def host_wait(self, event) -> None:
        """Before host code reads a host copy (a worker thread, never the compute thread)."""


class CudaCopies:
    """Copies between a CUDA device and pinned host memory on one side stream per device:
    device-to-host after the compute stream's work so far (the layer's input is complete),
    host-to-device whenever asked (a layer ahead); events order the compute stream after them,
    and nothing on the compute thread waits for the host."""

    def __init__(self, device):
        self.side = torch.cuda.Stream(device)

    def to_host(self, t):
        compute = torch.cuda.current_stream(t.device)
        src = t.clone(memory_format=torch.contiguous_format)  # the graph may reuse t's buffer
        host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        self.side.wait_stream(compute)
        with torch.cuda.stream(self.side):
            host.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.side)
        src.record_stream(self.side)
        return host, event

    def to_device(self, host, device):
        with torch.cuda.device(device), torch.cuda.stream(self.side):
            t = torch.empty(host.shape, dtype=host.dtype, device=device)
            t.copy_(host, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.side)
        return t, event

    def ready(self, t, event) -> None:
        compute = torch.cuda.current_stream(t.device)
        compute.wait_event(event)
        t.record_stream(compute)

    def host_wait(self, event) -> None:
        event.synchronize()


_COPIES: dict = {}


def copies_for(device: torch.device):
    if device.type != "cuda":
        return _COPIES.setdefault("host", HostCopies())
    return _COPIES.setdefault(device, CudaCopies(device))


# ---- saved values -------------------------------------------------------------------------------
_WORKER = None
_WORKER_NAME = "streamfx-offload"


def worker() -> concurrent.futures.ThreadPoolExecutor:
    """One thread for file writes and read-ahead, first in first out."""
    global _WORKER
    if _WORKER is None:
        _WORKER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=_WORKER_NAME)
    return _WORKER


class Kept:
    """A value kept as a reference (the forward already holds it: keep_every's kept inputs, or
    an input left in device memory)."""

    def __init__(self, t):
        self.t = t

    def prefetch(self) -> None:
        pass

    def load(self):
        return self.t

    def release(self) -> None:
        self.t = None


class OnHost:
    """The "cpu" tier: a host copy, copied back to the device on prefetch or load."""

    def __init__(self, t):
        self.device, self.copies = t.device, copies_for(t.device)
        self.host, self.event = self.copies.to_host(t)
        self.back = None

    def prefetch(self) -> None:
        if self.back is None:
            self.back = self.copies.to_device(self.host, self.device)

    def load(self):
        self.prefetch()
        (t, event), self.back = self.back, None
        self.copies.ready(t, event)
        return t

    def release(self) -> None:
        self.host = self.back = None


class OnDisk:
    """The "disk" tier: a file of the tensor's bytes. A CPU tensor is written before the region
    op returns (its buffer may be reused after); a device tensor goes to pinned host memory on
    the side stream and the worker writes it once the copy is done. Read-ahead runs on the
    worker (and, on a GPU, copies to the device there)."""

    def __init__(self, t, base: str | None):
        self.shape, self.dtype, self.device = tuple(t.shape), t.dtype, t.device
        self.copies = copies_for(t.device)
        self.written = self.reading = None
        self.gone = False
        self.base, self.path = base, _new_file(base)
        try:
            if t.device.type == "cpu":
                _write(self.path, t)
            else:
                host, event = self.copies.to_host(t)
                self.written = worker().submit(self._write_after, host, event)
        except BaseException:
            self._remove()
            raise

    def _write_after(self, host, event):
        try:
            self.copies.host_wait(event)
            _write(self.path, host)
        finally:
            if self.gone:  # released while the write was pending (see ``release``)
                self._remove()

    def _remove(self) -> None:
        """The file goes, and with this process's last file the directory that held it (once)."""
        _unlink(self.path)
        with _DIRS_LOCK:
            base, self.base = self.base, _REMOVED
        if base is not _REMOVED:
            _file_removed(base)

    def _read(self):
        if self.written is not None:
            self.written.result()
        host = _read(self.path, self.shape, self.dtype, pin=self.device.type == "cuda")
        return self.copies.to_device(host, self.device)

    def prefetch(self) -> None:
        if self.reading is None:
            self.reading = worker().submit(self._read)

    def load(self):
        self.prefetch()
        (t, event), self.reading = self.reading.result(), None
        self.copies.ready(t, event)
        return t

    def release(self) -> None:
        self.gone = True
        if not threading.current_thread().name.startswith(_WORKER_NAME):  # (a collection on the worker)
            concurrent.futures.wait([f for f in (self.written, self.reading) if f is not None])
        self.reading = None
        if self.written is None or self.written.done():
            self._remove()
        # (else this is a collection on the worker, before its pending write: that write removes it)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _write(path: str, t: torch.Tensor) -> None:
    data = t.detach().contiguous().reshape(-1).view(torch.uint8)
    with open(path, "wb") as f:
        f.write(memoryview(data.numpy()))


def _read(path: str, shape, dtype, pin: bool = False) -> torch.Tensor:
    n = os.path.getsize(path)
    buf = torch.empty(n, dtype=torch.uint8, pin_memory=pin)
    with open(path, "rb") as f:
        if f.readinto(memoryview(buf.numpy())) != n:
            raise RuntimeError(f"streamfx: offloaded input file {path} was cut short")
    return buf.view(dtype).reshape(shape)


_DIRS: dict = {}   # base -> [this process's directory under it, files in it]
_DIRS_LOCK = threading.Lock()
_REMOVED = object()


def _new_file(base: str | None) -> str:
    """A new empty file in this process's directory of offloaded inputs under ``base``: the
    directory is made with the first file and removed with the last (a process that ends
    without running exit handlers, e.g. a ``multiprocessing`` child, leaves nothing behind)."""
    with _DIRS_LOCK:
        if base not in _DIRS:
            if base is not None:
                os.makedirs(base, exist_ok=True)
            _DIRS[base] = [tempfile.mkdtemp(prefix=f"streamfx-offload-{os.getpid()}-", dir=base), 0]
        d = _DIRS[base]
        fd, path = tempfile.mkstemp(prefix="input-", suffix=".bin", dir=d[0])
        os.close(fd)
        d[1] += 1
        return path


@atexit.register
def _remove_directories() -> None:
    for path, _ in list(_DIRS.values()):
        shutil.rmtree(path, True)


def _file_removed(base: str | None) -> None:
    with _DIRS_LOCK:
        d = _DIRS[base]
        d[1] -= 1
        if d[1] == 0:
            del _DIRS[base]
            try:
                os.rmdir(d[0])
            except OSError:   # (something else put a file there)
                pass


# ---- entries --------------------------------------------------------------------------------
class Entry:
    """What one region call keeps for its backward beyond AOTAutograd's saved tensors."""

    def __init__(self, eid: int, key: int, plan: StorePlan, prev: "Entry | None"):
        self.id, self.key, self.plan, self.prev = eid, key, plan, prev
        self.saved: dict = {}          # input index -> Kept / OnHost / OnDisk
        self.others: list | None = None  # every input not stored (to rebuild the next layer's input)
        self.loaded: dict = {}         # input index -> tensor read back ahead of the backward
        self.rebuilt = None

    def prefetch(self) -> None:
        for i, v in self.saved.items():
            if i not in self.loaded:
                v.prefetch()

    def stored_inputs(self, consume: bool) -> dict:
        """{index: tensor} of the stored inputs; ``consume``: this entry's backward takes them."""
        got = {}
        for i, v in self.saved.items():
            t = self.loaded.pop(i) if i in self.loaded else v.load()
            if not consume:
                self.loaded[i] = t
            got[i] = t
        if self.plan.dropped is not None:
            got[self.plan.dropped] = self.rebuilt_input(consume)
        return got

    def inputs(self, kept: list, consume: bool) -> list:
        stored = self.stored_inputs(consume)
        it = iter(kept)
        return [stored[i] if i in self.plan.stored else next(it) for i in range(len(kept) + len(self.plan.stored))]

    def rebuilt_input(self, consume: bool):
        """The dropped input: rebuilt from the nearest kept input before it by the layers between
        (each rebuilt input is cached until its own layer's backward takes it)."""
        if self.rebuilt is None:
            chain, e = [self], self.prev
            while e.plan.dropped is not None and e.rebuilt is None:
                chain.append(e)
                e = e.prev
            for x in reversed(chain):
                p = x.prev
                with torch.no_grad():
                    outs = torch.ops.streamfx.region.default(p.key, p.inputs(p.others, consume=False))
                x.rebuilt = outs[x.plan.link[2]]
                COUNTERS["inputs_rebuilt"] += 1
        t = self.rebuilt
        if consume:
            self.rebuilt = None
        return t

    def release(self) -> None:
        for v in self.saved.values():
            v.release()
        self.saved, self.others, self.loaded, self.rebuilt, self.prev = {}, None, {}, None, None


class Store:
    """Entries by id, in the order the forward made them (the backward reads them in reverse)."""

    def __init__(self):
        self.live: dict[int, Entry] = {}
        self.ids = itertools.count()
        self.lock = threading.RLock()  # (a release can run from a collection inside ``put``)

    def put(self, key: int, inputs: list, link) -> torch.Tensor:
        plan = PLANS[key]
        if plan.tier == "auto":
            plan = plan.resolve(*storage_of(key, inputs))
        prev = self.entry(link, plan.region) if link is not None else None
        entry = Entry(next(self.ids), key, plan, prev)
        try:
            for i in plan.offloaded:
                x = inputs[i]
                if plan.tier == "disk":
                    entry.saved[i] = OnDisk(x, plan.directory)
                else:
                    entry.saved[i] = OnHost(x)
                COUNTERS["inputs_offloaded"] += 1
            for i in plan.kept:   # (a compiled graph may reuse the input's buffer once the op has returned)
                entry.saved[i] = Kept(inputs[i].clone(memory_format=torch.contiguous_format))
                COUNTERS["inputs_kept"] += 1
            if plan.dropped is not None:
                COUNTERS["inputs_dropped"] += 1
            if plan.feeds:
                entry.others = [x for i, x in enumerate(inputs) if i not in plan.stored]
        except BaseException:
            entry.release()
            raise
        handle = torch.tensor([entry.id], dtype=torch.int64)
        with self.lock:
            self.live[entry.id] = entry
        weakref.finalize(handle, self.release, entry.id)
        return handle

    def entry(self, handle: torch.Tensor, region: str = "") -> Entry:
        eid = int(handle[0])
        try:
            return self.live[eid]
        except KeyError:
            raise RuntimeError(f"streamfx: the stored inputs of region {region or '?'} were released before "
                               f"its backward (entry {eid})") from None

    def release(self, eid: int) -> None:
        with self.lock:
            entry = self.live.pop(eid, None)
        if entry is not None:
            entry.release()

    def prefetch_before(self, entry: Entry) -> None:
        """Start reading back what the next backward (the entry made just before) needs, and
        the kept input its rebuild starts from."""
        with self.lock:
            earlier = [e for eid, e in self.live.items() if eid < entry.id]
        if not earlier:
            return
        e = earlier[-1]
        e.prefetch()
        while e.plan.dropped is not None and e.rebuilt is None and e.prev is not None:
            e = e.prev
            e.prefetch()


STORE = Store()


def storage_of(key: int, inputs: list) -> tuple:
    """(tier, keep_every) of a call of an "auto" region: what its budget's policy chose at the
    call's length (device copies where no policy sizes the call)."""
    from .runtime import _PROGRAMS

    prog = _PROGRAMS[key]
    policy = getattr(prog, "policy", None)
    if policy is None or not hasattr(policy, "storage"):
        return None, 1
    return policy.storage(prog.length(list(inputs)))


# ---- the ops --------------------------------------------------------------------------------------
@torch.library.custom_op("streamfx::region_stored", mutates_args=())
def region_stored(key: int, inputs: list[torch.Tensor], link: Optional[torch.Tensor]) -> list[torch.Tensor]:
    """A streamed region (``streamfx::region``) whose stored inputs go to the store; the last
    output is the entry's handle."""
    from .runtime import ANALYSIS

    outs = torch.ops.streamfx.region.default(key, inputs)
    if ANALYSIS[0]:   # (a handle to no entry: the call has no backward)
        return list(outs) + [torch.tensor([-1], dtype=torch.int64)]
    return list(outs) + [STORE.put(key, list(inputs), link)]


@region_stored.register_fake
def _region_stored_fake(key, inputs, link):
    outs = torch.ops.streamfx.region.default(key, inputs)
    return [o.clone() for o in outs] + [torch.empty(1, dtype=torch.int64)]


@torch.library.custom_op("streamfx::region_stored_backward", mutates_args=())
def region_stored_backward(key: int, kept: list[torch.Tensor], handle: torch.Tensor, grads: list[torch.Tensor],
                           present: list[bool]) -> list[torch.Tensor]:
    """``streamfx::region_backward`` of a region whose stored inputs come from the store."""
    entry = STORE.entry(handle, PLANS[key].region)
    xs = entry.inputs(list(kept), consume=True)
    COUNTERS["inputs_loaded"] += len(entry.plan.offloaded)
    STORE.prefetch_before(entry)
    got = torch.ops.streamfx.region_backward.default(key, xs, grads, present, [])
    if not torch._C._autograd._get_current_graph_task_keep_graph():
        # this backward frees the step's graph (no retain_graph): nothing reads the entry again
        # (a later layer's rebuild reads earlier entries only), so it goes now, whatever else
        # still holds its handle (a frame kept by an exception's traceback)
        STORE.release(entry.id)
    return got


@region_stored_backward.register_fake
def _region_stored_backward_fake(key, kept, handle, grads, present):
    from .runtime import _PROGRAMS, _region_backward_fake

    prog, plan = _PROGRAMS[key], PLANS[key]
    it, xs = iter(kept), []
    for i, p in enumerate(prog.full_gm.graph.find_nodes(op="placeholder")[:len(prog.in_specs)]):
        v = p.meta["val"]
        xs.append(torch.empty(v.shape, dtype=v.dtype, device=v.device) if i in plan.stored else next(it))
    return _region_backward_fake(key, xs, grads, present, [])  # (the op returns region_backward's gradients)


def _setup(ctx, inputs, output):
    key, xs, _ = inputs
    ctx.key, ctx.n = key, len(xs)
    stored = PLANS[key].stored
    ctx.save_for_backward(*[x for i, x in enumerate(xs) if i not in stored], output[-1])


def _backward(ctx, grads):
    from .runtime import _PROGRAMS

    prog = _PROGRAMS[ctx.key]
    *kept, handle = ctx.saved_tensors
    grads = list(grads)[:prog.n_outputs]
    present = [g is not None for g in grads]
    gs = [g if g is not None else kept[0].new_empty(0) for g in grads]
    got = region_stored_backward(ctx.key, kept, handle, gs, present)
    result = [None] * ctx.n
    for i, g in zip(prog.grad_inputs, got):
        result[i] = g
    return None, result, None


region_stored.register_autograd(_backward, setup_context=_setup)

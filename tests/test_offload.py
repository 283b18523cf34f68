"""Layer inputs off the device: ``offload`` ("cpu", "disk") and ``keep_every`` (two-level recompute).

Gradients equal eager autograd's with the options on; the inputs really leave AOTAutograd's saved
tensors (the store's counters) and come back in the backward (read back, or rebuilt by the layers
before them); files live exactly as long as the step's autograd graph, also when it fails."""
import collections
import copy
import errno
import gc
import os
import types
import warnings

import pytest
import torch

import streamfx
import zoo
from conftest import assert_grads_match, grads_of, run_eager_and_compiled
from tiers import cases
from streamfx import offload
from streamfx.runtime import COUNTERS, LayerProgram

L = 5  # layers: not a multiple of 2 or 3
PLAIN_LAYERS = zoo.LAYERS  # the plain PyTorch models' depth (bound when zoo was imported)


def files_under(path) -> list:
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


@pytest.fixture(autouse=True)
def _no_earlier_garbage():
    """Collect what earlier tests in this worker left in reference cycles (a step that raised
    keeps its entries alive through its traceback until a collection), so that ``STORE.live``
    holds only this test's entries: each of its steps must release them by reference counts.
    (Only when there are such entries: a collection over a worker's heap of compiled graphs
    takes over a second.)"""
    if offload.STORE.live:
        gc.collect()
    yield


def left_under(path) -> list:
    """Files and directories under ``path`` (a step leaves neither, not even an empty directory)."""
    return [os.path.join(d, f) for d, ds, fs in os.walk(path) for f in ds + fs]


def deep(monkeypatch, layers=L):
    monkeypatch.setattr(zoo, "LAYERS", layers)


def check(run, tmp_path=None, *, offloaded=0, dropped=0):
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads, rtol=1e-5)
    c = run.counters
    assert c["inputs_offloaded"] == offloaded and c["inputs_loaded"] == offloaded, c
    assert c["inputs_dropped"] == dropped and c["inputs_rebuilt"] == dropped, c
    assert not offload.STORE.live, "every entry is released with the step's autograd graph"
    if tmp_path is not None:
        assert not left_under(tmp_path), left_under(tmp_path)


def _why_live(path) -> str:
    """What a failed "nothing left" check found: the entries live, and how many a collection frees
    (those a reference cycle held; the rest have a strong reference), what that collection found
    (the frames and exceptions among it name the cycle's maker), and the files left."""
    live = sorted(offload.STORE.live)
    holders = _holders_of_handles(set(live))
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        garbage, gc.garbage[:] = list(gc.garbage), []
    finally:
        gc.set_debug(0)
    frames = sorted({f"{o.f_code.co_name} ({os.path.basename(o.f_code.co_filename)}:{o.f_lineno})"
                     for o in garbage if type(o) is types.FrameType})
    errors = sorted({repr(o)[:200] for o in garbage if issubclass(type(o), BaseException)})
    kinds = collections.Counter(type(o).__qualname__ for o in garbage).most_common(12)
    del garbage
    gc.collect()
    return (f"entries {live} live after the step; after gc.collect() {sorted(offload.STORE.live)}; "
            f"files {left_under(path)}; the handles' holders {holders}; the collection's frames {frames}, "
            f"exceptions {errors}, kinds {kinds}")


def _holders_of_handles(ids: set) -> list:
    """What refers to the live entries' handles (``offload.Store.put``'s one-element id tensors),
    two levels up: a frame by its function and line, anything else by its type."""
    def name(o):
        if type(o) is types.FrameType:
            return f"frame {o.f_code.co_name} ({os.path.basename(o.f_code.co_filename)}:{o.f_lineno})"
        return type(o).__qualname__

    handles = [o for o in gc.get_objects() if type(o) is torch.Tensor and o.dtype == torch.int64
               and o.shape == (1,) and o.device.type == "cpu" and int(o[0]) in ids]
    out = []
    for h in handles[:3]:
        for r in gc.get_referrers(h):
            if r is handles:
                continue
            up = sorted({name(u) for u in gc.get_referrers(r) if u is not handles})[:6]
            out.append(f"{name(r)} <- {up}")
    del handles
    return sorted(set(out))[:12]


def step_matches_eager(ref, mine, compiled, inputs) -> None:
    """One step of ``ref`` (eager) and of ``compiled`` (``mine`` compiled): equal loss and gradients."""
    for m in (ref, mine):
        m.zero_grad(set_to_none=True)
    ref_loss = inputs.loss_of(ref(*inputs.args, **inputs.kwargs))
    ref_loss.backward()
    loss = inputs.loss_of(compiled(*inputs.args, **inputs.kwargs))
    loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(grads_of(ref), grads_of(mine), rtol=1e-5)


def dropped_of(layers, k):
    """Layers whose input is rebuilt: every one but each k-th of the chain."""
    return sum(1 for i in range(layers) if i % k)


# ---- options ----------------------------------------------------------------------------------
@pytest.mark.fast
@pytest.mark.parametrize("options,match", [({"offload": "gpu"}, "offload.*'cpu'.*'disk'"),
                                           ({"offload": True}, "offload"),
                                           ({"keep_every": 0}, "keep_every.*positive"),
                                           ({"keep_every": 2.0}, "keep_every"),
                                           ({"offload_dir": ""}, "offload_dir")])
def test_bad_options_raise(options, match):
    with pytest.raises(streamfx.StreamBPError, match=match):
        streamfx.StreamConfig.from_options(options)


@pytest.mark.fast
def test_offload_dir_that_is_a_file_raises(tmp_path):
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(streamfx.StreamBPError, match="offload_dir"):
        streamfx.StreamConfig(offload="disk", offload_dir=str(f / "sub"))


# ---- exact gradients ----------------------------------------------------------------------------
@pytest.mark.parametrize("case", [pytest.param("right_pad", marks=pytest.mark.extended), "left_pad"])
def test_disk_offload_is_exact_and_leaves_no_files(case, tmp_path, monkeypatch):
    deep(monkeypatch)
    model, make_inputs = zoo.qwen3_sdpa()
    run = run_eager_and_compiled(model, make_inputs(case),
                                 {"chunk_size": 5, "offload": "disk", "offload_dir": str(tmp_path)})
    check(run, tmp_path, offloaded=L)


@pytest.mark.fast
@pytest.mark.parametrize("k", [pytest.param(2, marks=pytest.mark.extended), pytest.param(3, marks=pytest.mark.heavy)])
def test_keep_every_is_exact(k, monkeypatch):
    deep(monkeypatch)
    model, make_inputs = zoo.llama_tied()
    run = run_eager_and_compiled(model, make_inputs("left_pad"), {"chunk_size": 5, "keep_every": k})
    check(run, dropped=dropped_of(L, k))


@pytest.mark.fast
def test_disk_offload_with_keep_every_is_exact(tmp_path, monkeypatch):
    deep(monkeypatch)
    model, make_inputs = zoo.qwen3_sdpa()
    run = run_eager_and_compiled(model, make_inputs("prompt"), {"chunk_size": 5, "keep_every": 3, "offload": "disk",
                                                                "offload_dir": str(tmp_path)})
    check(run, tmp_path, offloaded=L - dropped_of(L, 3), dropped=dropped_of(L, 3))


DENSE = ["qwen3_sdpa", "qwen3_eager", "llama_tied", "mistral_sliding", "gemma3", "gpt2", "nanogpt", "tiny_llama"]
MODES = {"disk": {"offload": "disk"}, "keep2": {"keep_every": 2}, "keep3-disk": {"keep_every": 3, "offload": "disk"}}


# every dense zoo model with both options (keep_every 3 over the disk tier); each option alone on
# three models of different forms (the suite's time on two cores: each case compiles its model).
# The default run: both options on five models of different forms, each alone on one.
ZOO_CASES = [(n, "keep3-disk") for n in DENSE] + [(n, m) for m in ("disk", "keep2") for n in ("qwen3_sdpa", "gemma3", "gpt2")]
ZOO_DEFAULT = [(n, "keep3-disk") for n in ("qwen3_sdpa", "mistral_sliding", "gemma3", "gpt2", "nanogpt")] + [
    ("qwen3_sdpa", "disk"), ("gpt2", "keep2")]


@pytest.mark.parametrize("name, mode", cases(ZOO_CASES, ZOO_DEFAULT), ids=[f"{m}-{n}" for n, m in ZOO_CASES])
def test_zoo_dense_models(name, mode, tmp_path, monkeypatch):
    deepened = name in zoo.HF_MODELS and name != "gemma3"  # (gemma3's layer pattern and the plain models: 2)
    if deepened:
        deep(monkeypatch, 4)
    model, make_inputs = zoo.ZOO[name]()
    options = dict(MODES[mode], chunk_size=5, offload_dir=str(tmp_path))
    run = run_eager_and_compiled(model, make_inputs("right_pad"), options)
    layers = len({p.name for p in run.programs if isinstance(p, LayerProgram)})
    assert layers == (4 if deepened else PLAIN_LAYERS), [p.name for p in run.programs]
    k = options.get("keep_every", 1)
    dropped = dropped_of(layers, k)
    check(run, tmp_path, offloaded=layers - dropped if "offload" in options else 0, dropped=dropped)


@pytest.mark.parametrize("name", ["qwen3_sdpa", pytest.param("mistral_sliding", marks=pytest.mark.extended)])
def test_packed_documents(name, tmp_path, monkeypatch):
    deep(monkeypatch)
    model, make_inputs = zoo.ZOO[name]()
    position_ids = torch.cat([torch.arange(7), torch.arange(11), torch.arange(6)]).unsqueeze(0)
    inputs = make_inputs(zoo.Case("packed", 1, 24), position_ids=position_ids)
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "keep_every": 2, "offload": "disk",
                                                 "offload_dir": str(tmp_path)})
    check(run, tmp_path, offloaded=L - dropped_of(L, 2), dropped=dropped_of(L, 2))


def gpt2_dropout(layers=L):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=zoo.VOCAB, n_embd=zoo.HIDDEN, n_layer=layers, n_head=zoo.HEADS,
                     n_positions=zoo.MAX_POS, resid_pdrop=0.2, embd_pdrop=0.1, attn_pdrop=0.0,
                     pad_token_id=zoo.PAD_ID)
    return zoo._hf(GPT2LMHeadModel, cfg, "sdpa"), zoo._hf_inputs(zoo.VOCAB)


@pytest.mark.fast
@pytest.mark.parametrize("options", [pytest.param({"keep_every": 2}, marks=pytest.mark.extended), {"keep_every": 3, "offload": "disk"}],
                         ids=["keep2", "keep3-disk"])
@pytest.mark.heavy
def test_dropout_is_replayed(options, tmp_path):
    """With dropout on, the rebuilt inputs see the forward's dropout masks: gradients equal those
    of the same compile without the options under the same seed (and the masks are drawn: the
    loss differs from eval mode's)."""
    model, make_inputs = gpt2_dropout()
    inputs = make_inputs("right_pad")
    grads, losses = [], []
    for opts in ({}, dict(options, offload_dir=str(tmp_path))):
        torch._dynamo.reset()
        m = copy.deepcopy(model)
        compiled = torch.compile(m, backend="streambp", options={"codegen": "eager", "chunk_size": 5, **opts})
        before = dict(COUNTERS)
        torch.manual_seed(7)
        loss = compiled(*inputs.args, **inputs.kwargs).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append(grads_of(m))
        ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
    assert ran["inputs_rebuilt"] == dropped_of(L, options["keep_every"]), ran
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)
    assert_grads_match(grads[0], grads[1], rtol=1e-6)
    with torch.no_grad():
        assert (model.eval()(*inputs.args, **inputs.kwargs).loss - losses[0]).abs() > 1e-4
    assert not left_under(tmp_path)


# ---- the store's order and lifetimes ---------------------------------------------------------------
class Recording(offload.HostCopies):
    """Host copies that log each copy and each wait of the compute stream, with the tensor's
    first value (the layers' inputs differ)."""

    def __init__(self):
        self.log = []

    def to_host(self, t):
        host, _ = super().to_host(t)
        self.log.append(("to_host", host.flatten()[0].item()))
        return host, ("event", len(self.log))

    def to_device(self, host, device):
        self.log.append(("to_device", host.flatten()[0].item()))
        return host.clone(), ("event", len(self.log))

    def ready(self, t, event):
        assert event is not None and event[0] == "event"
        self.log.append(("ready", t.flatten()[0].item()))


@pytest.mark.fast
@pytest.mark.heavy
def test_host_tier_copies_back_a_layer_ahead(monkeypatch):
    """The "cpu" tier, with the device copies recorded: every input goes to the host once in the
    forward; in the backward each comes back (to_device) while the layer after it computes its
    backward (one layer ahead), and the compute side waits on its event before reading it."""
    deep(monkeypatch)
    rec = Recording()
    monkeypatch.setitem(offload._COPIES, "host", rec)
    original = LayerProgram.backward

    def logged(self, inputs, grads):
        rec.log.append(("backward", None))
        return original(self, inputs, grads)

    monkeypatch.setattr(LayerProgram, "backward", logged)
    model, make_inputs = zoo.qwen3_sdpa()
    run = run_eager_and_compiled(model, make_inputs("b1"), {"chunk_size": 5, "offload": "cpu"})
    check(run, offloaded=L)
    ups = [v for op, v in rec.log if op == "to_host"]
    downs = [v for op, v in rec.log if op == "to_device"]
    assert len(ups) == L and downs == ups[::-1], rec.log
    order = [op for op, _ in rec.log if op != "to_host"]
    assert order == ["to_device", "ready"] + ["to_device", "backward", "ready"] * (L - 1) + ["backward"], order

@pytest.mark.fast
@pytest.mark.heavy
def test_entries_live_with_the_autograd_graph(tmp_path, monkeypatch):
    """Files exist between the forward and the backward, and go when the graph goes (backward,
    or a forward whose graph is dropped without one). A backward that frees the graph releases
    each entry as it reads it, whatever else holds the entries' handles (here a list; in a run, a
    frame kept by an exception's traceback); one that retains the graph (``retain_graph=True``)
    keeps them for the next, which computes the same gradients."""
    deep(monkeypatch, 3)
    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs("b1")
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "chunk_size": 5,
                                                                  "offload": "disk", "offload_dir": str(tmp_path)})
    loss = compiled(*inputs.args, **inputs.kwargs).loss
    assert len(files_under(tmp_path)) == 3
    loss.backward()
    assert not left_under(tmp_path) and not offload.STORE.live
    loss = compiled(*inputs.args, **inputs.kwargs).loss
    assert len(files_under(tmp_path)) == 3
    del loss
    gc.collect()
    assert not left_under(tmp_path) and not offload.STORE.live

    handles, put = [], offload.Store.put
    monkeypatch.setattr(offload.Store, "put", lambda self, *a: handles.append(put(self, *a)) or handles[-1])
    model.zero_grad(set_to_none=True)
    compiled(*inputs.args, **inputs.kwargs).loss.backward()
    assert len(handles) == 3 and not offload.STORE.live and not left_under(tmp_path)
    once = grads_of(model)
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()   # (a retained graph needs a compile without donated buffers, as without streamfx)
    with torch._functorch.config.patch(donated_buffer=False):
        loss = compiled(*inputs.args, **inputs.kwargs).loss
        loss.backward(retain_graph=True)
        assert len(offload.STORE.live) == 3 and len(files_under(tmp_path)) == 3
        assert_grads_match(once, grads_of(model), rtol=1e-6)
        loss.backward()
    assert len(handles) == 6 and not offload.STORE.live and not left_under(tmp_path)
    assert_grads_match({k: None if g is None else 2 * g for k, g in once.items()}, grads_of(model), rtol=1e-6)


def fail_on(monkeypatch, method, call):
    calls = {"n": 0}
    original = getattr(LayerProgram, method)

    def failing(self, *args):
        calls["n"] += 1
        if calls["n"] == call:
            raise torch.OutOfMemoryError("injected")
        return original(self, *args)

    monkeypatch.setattr(LayerProgram, method, failing)


@pytest.mark.fast
@pytest.mark.heavy
@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_failure_mid_step_leaves_no_files(phase, tmp_path, monkeypatch):
    """An error in the third layer's forward, or the second layer's backward, reaches the caller
    as itself; once it is handled and the step's tensors are gone, no file is left."""
    deep(monkeypatch)
    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs("b1")
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "chunk_size": 5,
                                                                  "offload": "disk", "keep_every": 2,
                                                                  "offload_dir": str(tmp_path)})
    fail_on(monkeypatch, phase, 3 if phase == "forward" else 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compiled(*inputs.args, **inputs.kwargs).loss.backward()
        except torch.OutOfMemoryError as err:
            assert "injected" in str(err)
        else:
            raise AssertionError("the injected error did not reach the caller")
    gc.collect()
    assert not left_under(tmp_path) and not offload.STORE.live


@pytest.mark.fast
def test_a_failed_write_reaches_the_caller_and_leaves_no_files(tmp_path, monkeypatch):
    """The disk filling up while the third layer's input is written: the OSError reaches the
    caller as itself, and the files already written, the partial one and their directory go."""
    deep(monkeypatch, 3)
    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs("b1")
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "chunk_size": 5,
                                                                  "offload": "disk", "offload_dir": str(tmp_path)})
    written, original = [], offload._write

    def write(path, t):
        written.append(path)
        if len(written) == 3:
            with open(path, "wb") as f:
                f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        original(path, t)

    monkeypatch.setattr(offload, "_write", write)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(OSError, match="No space left"):
            compiled(*inputs.args, **inputs.kwargs)
    gc.collect()
    assert len(written) == 3 and not left_under(tmp_path) and not offload.STORE.live


# ---- graphs of one layer, explain ----------------------------------------------------------------
@pytest.mark.fast
def test_layers_compiled_alone(tmp_path, monkeypatch):
    """One graph per layer (FSDP2 / ZeRO-3 per layer, graph breaks): each offloads its input;
    keep_every has no neighbours to rebuild from and says so."""
    deep(monkeypatch, 3)
    model, make_inputs = zoo.qwen3_sdpa()
    ref = copy.deepcopy(model)
    for layer in model.model.layers:
        layer.compile(backend="streambp", options={"codegen": "eager", "chunk_size": 5, "offload": "disk",
                                                   "keep_every": 2, "offload_dir": str(tmp_path)})
    inputs = make_inputs("right_pad")
    ref_loss = inputs.loss_of(ref(*inputs.args, **inputs.kwargs))
    ref_loss.backward()
    before = dict(COUNTERS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = inputs.loss_of(model(*inputs.args, **inputs.kwargs))
        assert files_under(tmp_path)
        loss.backward()
    ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
    grads = {k.replace("._orig_mod", ""): g for k, g in grads_of(model).items()}
    assert_grads_match(grads_of(ref), grads, rtol=1e-5)
    assert ran["inputs_offloaded"] >= 3 and ran["inputs_dropped"] == 0, ran
    assert any("keep_every" in str(w.message) and "one layer" in str(w.message) for w in caught)
    assert not left_under(tmp_path)


@pytest.mark.fast
@pytest.mark.heavy
def test_explain_says_what_was_chosen(monkeypatch):
    deep(monkeypatch, 4)
    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs("b1")
    before = dict(COUNTERS)
    report = streamfx.explain(model, *inputs.args, **inputs.kwargs,
                              options={"codegen": "eager", "offload": "disk", "keep_every": 3})
    text = str(report)
    # (explain's calls have no backward: they write no file and keep no input)
    assert all(COUNTERS[k] == before[k] for k in ("inputs_kept", "inputs_offloaded", "inputs_dropped")), COUNTERS
    assert "layer inputs offloaded to files" in text and "keep_every=3" in text, text
    assert text.count("input rebuilt in the backward") == 2 and text.count("input kept") == 2, text


@pytest.mark.slow
def test_inductor_disk_and_keep_every(tmp_path, monkeypatch):
    deep(monkeypatch)
    model, make_inputs = zoo.qwen3_sdpa()
    run = run_eager_and_compiled(model, make_inputs("left_pad"), {"codegen": "inductor", "chunk_size": 5,
                                                                  "keep_every": 2, "offload": "disk",
                                                                  "offload_dir": str(tmp_path)})
    check(run, tmp_path, offloaded=L - dropped_of(L, 2), dropped=dropped_of(L, 2))


@pytest.mark.fast
@pytest.mark.heavy
def test_later_lengths_through_the_symbolic_compile(tmp_path, monkeypatch):
    """The second length recompiles with symbolic sizes (the stored inputs' shapes are symbols in
    the backward); the third reuses that compile. Every length is exact and leaves no file."""
    deep(monkeypatch, 3)
    model, make_inputs = zoo.qwen3_sdpa()
    ref, mine = copy.deepcopy(model), copy.deepcopy(model)
    compiled = torch.compile(mine, backend="streambp", options={"codegen": "eager", "chunk_size": 5, "offload": "disk",
                                                                "keep_every": 2, "offload_dir": str(tmp_path)})
    before = dict(COUNTERS)
    for case in ("right_pad", "odd13", zoo.Case("t20", 2, 20, pad="left")):
        inputs = make_inputs(case)
        step_matches_eager(ref, mine, compiled, inputs)
        assert not left_under(tmp_path)
    ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
    assert ran["inputs_rebuilt"] == 3 and ran["inputs_offloaded"] == 6, ran


# ---- chosen by a memory budget (offload="auto") ---------------------------------------------------

@pytest.mark.fast
@pytest.mark.heavy
def test_a_memory_budget_moves_layer_inputs_off_the_device_only_where_the_step_needs_it(tmp_path, monkeypatch):
    """Under a memory_budget with no offload options, each call's storage of layer inputs is the
    first the memory model predicts to fit (``offload.storages``): a short length keeps them in
    device memory, a long one in one compile writes them to files. Both lengths are exact, the
    report predicts the run-time choice, and explain() says what was chosen."""
    deep(monkeypatch, 6)
    model, make_inputs = zoo.qwen3_sdpa()
    short, long = make_inputs(zoo.Case("t256", 1, 256)), make_inputs(zoo.Case("t1024", 1, 1024))
    options = {"codegen": "eager", "offload_dir": str(tmp_path)}
    before = dict(COUNTERS)
    report = streamfx.plan_memory(model, *short.args, **short.kwargs, options={**options, "memory_budget": "1GiB"})
    # (the planner's run of the model has no backward: it stores no layer input, not even where a
    # reference cycle left from its trace would keep its outputs until a collection)
    assert all(COUNTERS[k] == before[k] for k in ("inputs_kept", "inputs_offloaded", "inputs_dropped"))
    assert not offload.STORE.live, _why_live(tmp_path)
    kept, disk = (report.storages.model(s) for s in [(None, 1), ("disk", 1)])
    need = {s: m.peak(1024, 16, 16) for s, m in [("kept", kept), ("disk", disk)]}
    assert need["disk"] < need["kept"], need   # (the layer inputs are most of the step at this length)
    budget = report.held + need["disk"] + (need["kept"] - need["disk"]) // 4
    assert report.storage(256, budget) == (None, 1) and report.storage(1024, budget) == ("disk", 1)

    ref, mine = copy.deepcopy(model), copy.deepcopy(model)
    compiled = torch.compile(mine, backend="streambp", options={**options, "memory_budget": budget}, dynamic=True)
    for inputs, stored in [(short, "inputs_kept"), (long, "inputs_offloaded")]:
        before = dict(COUNTERS)
        step_matches_eager(ref, mine, compiled, inputs)
        ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
        other = "inputs_offloaded" if stored == "inputs_kept" else "inputs_kept"
        assert ran[stored] == 6 and ran[other] == 0 and ran["inputs_rebuilt"] == 0, ran
        # (each entry goes as its backward reads it: also where a reference cycle made while the
        # step ran still holds its handle, such as an exception kept with its traceback below the
        # step, whose frames keep the AOT forward's frame and the handles among its outputs)
        assert not offload.STORE.live and not left_under(tmp_path), _why_live(tmp_path)

    explained = streamfx.explain(model, *long.args, **long.kwargs, options={**options, "memory_budget": budget})
    text = "\n".join(explained.memory_lines() + [sp.options.describe() for sp in explained.storage])
    assert "layer inputs chosen per call by the memory budget" in text, text
    assert "at T=1024: layer inputs offloaded to files" in text, text
    assert "layer input read back from the disk tier" in text, text


@pytest.mark.fast
def test_storages_resolve_per_call():
    """An "auto" plan lists candidates; each call's plan keeps, offloads or drops them."""
    sp = offload.StorePlan("layer 2", offloaded=(1,), dropped=0, link=(0, 7, 0), feeds=True, tier="auto", depth=2)
    assert sp.stored == {0, 1}
    kept = sp.resolve(None, 1)
    assert kept.kept == (0, 1) and kept.offloaded == () and kept.dropped is None and not kept.feeds
    assert kept.stored == sp.stored
    on_disk = sp.resolve("disk", 1)
    assert on_disk.offloaded == (0, 1) and on_disk.kept == () and on_disk.dropped is None
    third = sp.resolve("cpu", 3)   # depth 2 of a chain, k=3: rebuilt; the next (depth 3) is kept
    assert third.dropped == 0 and third.offloaded == (1,) and not third.feeds and third.stored == sp.stored
    second = sp.resolve("cpu", 2)  # depth 2, k=2: kept; the next is rebuilt from it
    assert second.dropped is None and second.offloaded == (0, 1) and second.feeds
    assert offload.storages("cpu") == [(None, 1), ("disk", 1)]
    assert offload.storages("cuda:0")[:3] == [(None, 1), ("cpu", 1), ("cpu", 2)]
    with pytest.raises(streamfx.StreamBPError, match="keep_every.*None with offload='auto'"):
        streamfx.config.StreamConfig(offload="auto", keep_every=2)


@pytest.mark.fast
@pytest.mark.heavy
@pytest.mark.parametrize("storage", [(None, 2), ("disk", 3)], ids=["kept-keep2", "disk-keep3"])
def test_a_chosen_storage_that_rebuilds_inputs_is_exact(storage, tmp_path, monkeypatch):
    """The storages a GPU may choose under a budget rebuild inputs (keep_every) of "auto" plans
    resolved per call; here the CPU device is given one such storage to choose."""
    deep(monkeypatch)
    monkeypatch.setattr(offload, "storages", lambda device: [storage])
    model, make_inputs = zoo.qwen3_sdpa()
    run = run_eager_and_compiled(model, make_inputs("left_pad"), {"chunk_size": 5, "memory_budget": "8GiB",
                                                                  "offload_dir": str(tmp_path)})
    tier, k = storage
    dropped = dropped_of(L, k)
    check(run, tmp_path, offloaded=(L - dropped) if tier else 0, dropped=dropped)
    assert run.counters["inputs_kept"] == (0 if tier else L - dropped), run.counters

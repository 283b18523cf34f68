"""Graph pieces: a decoder layer compiled alone, the head and loss alone, a graph break inside a
block. Each piece streams what it holds (layers between residual-stream graph inputs and outputs,
a head whose sequence axis comes from the labels), with gradients equal to eager autograd's."""
import copy
import warnings

import pytest
import torch

import streamfx
import zoo
from conftest import assert_grads_match, counting_allreduce, grads_of
from tiers import cases
from streamfx.runtime import COUNTERS
from streamfx.passes.schedule import chunk_count

OPTIONS = {"codegen": "eager", "chunk_size": 5, "head_chunk_size": 4}


def step(model, inputs):
    """Loss and gradients of one forward + backward; runtime counters and streamfx warnings."""
    model.zero_grad(set_to_none=True)
    before = dict(COUNTERS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = inputs.loss_of(model(*inputs.args, **inputs.kwargs))
        loss.backward()
    ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
    grads = {k.removeprefix("_orig_mod."): g for k, g in grads_of(model).items()}
    return loss.detach(), grads, ran, [str(w.message) for w in caught if "streamfx" in str(w.message)]


def compare(ref, model, inputs):
    ref_loss, ref_grads, _, _ = step(ref, inputs)
    loss, grads, ran, messages = step(model, inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(ref_grads, grads, rtol=1e-5)
    return ran, messages


@pytest.mark.fast
@pytest.mark.parametrize("case", ["odd17", "right_pad"])
def test_decoder_layers_compiled_alone(case):
    """``layer.compile`` on each Qwen3 decoder layer: one graph per layer, whose input and output
    are the residual stream; rotary cos/sin arrive as graph inputs, and with padding the 4-D mask
    built outside the layers too (read per chunk). Every layer streams (several chunks)."""
    model, make_inputs = zoo.qwen3()
    ref = copy.deepcopy(model)
    for layer in model.model.layers:
        layer.compile(backend="streambp", options=OPTIONS)
    ran, messages = compare(ref, model, make_inputs(case))
    assert not messages, messages
    assert ran["region_forward"] == zoo.LAYERS and ran["region_backward"] == zoo.LAYERS, ran
    assert ran["chunks_backward"] >= zoo.LAYERS * 3, ran  # T >= 16 in chunks of 5


@pytest.mark.fast
@pytest.mark.heavy
def test_explain_decoder_layer_alone():
    model, make_inputs = zoo.qwen3()
    inputs = make_inputs("odd17")
    layer, captured = model.model.layers[0], {}
    handle = layer.register_forward_pre_hook(lambda m, a, kw: captured.update(args=a, kwargs=kw), with_kwargs=True)
    model(**inputs.kwargs)
    handle.remove()
    hidden = captured["args"][0].detach().requires_grad_(True)
    report = streamfx.explain(layer, hidden, **captured["kwargs"], options=OPTIONS)
    assert [p.name for p in report.plan] == ["layer.0"], str(report)
    assert not report.not_streamed, str(report)
    assert "layer.0: 4 chunk(s) of 5 tokens (T=17)" in str(report)


@pytest.mark.fast
def test_layer_alone_reads_the_mask_input_per_chunk():
    """With padding, the [B, 1, T, T] boolean mask reaches a layer compiled alone as a graph input
    and SDPA's decomposition converts it to a float mask. The conversion runs per chunk on the
    input's [rows, keys] block: the only token-by-token tensor the layer reads, and keeps for its
    backward, is the input, which exists outside the graph anyway (converted whole, each layer
    of an FSDP2 model kept its own [B, 1, T, T] float copy until the backward)."""
    model, make_inputs = zoo.qwen3()
    layer, captured = model.model.layers[0], {}
    handle = layer.register_forward_pre_hook(lambda m, a, kw: captured.update(args=a, kwargs=kw), with_kwargs=True)
    model(**make_inputs("right_pad").kwargs)
    handle.remove()
    assert captured["kwargs"]["attention_mask"].dtype == torch.bool
    hidden = captured["args"][0].detach().requires_grad_(True)
    plan = streamfx.explain(layer, hidden, **captured["kwargs"], options=OPTIONS).plan[0]
    token_by_token = [x for x, spec in zip(plan.inputs, plan.in_specs) if spec.kind == "qk"]
    assert [x.op for x in token_by_token] == ["placeholder"], [x.format_node() for x in token_by_token]


def head_loss(model, shift="labels"):
    """The final norm, the LM head and the loss. ``shift``: "labels", Hugging Face's loss (the
    labels padded at the end and shifted); "logits", the logits shifted against the labels
    (``logits[:, :-1]`` against ``labels[:, 1:]``, as TRL and custom losses write it)."""
    def head(hidden, labels):
        logits = model.lm_head(model.model.norm(hidden))
        if shift == "logits":
            return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                                     ignore_index=-100)
        return model.loss_function(logits, labels, model.config.vocab_size)
    return head


@pytest.mark.fast
@pytest.mark.parametrize("case", ["prompt", "odd13"])
@pytest.mark.parametrize("shift", ["labels", "logits"])
def test_head_only_graph(case, shift):
    """A graph holding only the final norm, the LM head and the loss (what follows a graph break,
    or DDP's last piece): no attention, no embedding; the sequence axis comes from the labels.
    A loss over shifted logits takes the axis its slice was cut from, the hidden state's: the
    slice moves in front of the head, which streams over T - 1 tokens, with no warning."""
    model, make_inputs = zoo.qwen3()
    inputs = make_inputs(case)
    hidden = model.model(input_ids=inputs.kwargs["input_ids"]).last_hidden_state.detach()
    labels = inputs.kwargs["labels"]
    ref_h, h = hidden.clone().requires_grad_(True), hidden.clone().requires_grad_(True)
    ref_loss = head_loss(model, shift)(ref_h, labels)
    ref_loss.backward()
    ref_grads = grads_of(model)
    model.zero_grad(set_to_none=True)
    before = dict(COUNTERS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = torch.compile(head_loss(model, shift), backend="streambp", options=OPTIONS)(h, labels)
        loss.backward()
    ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(ref_grads, grads_of(model), rtol=1e-5)
    assert_grads_match({"hidden": ref_h.grad}, {"hidden": h.grad}, rtol=1e-5)
    assert not [str(w.message) for w in caught if "streamfx" in str(w.message)]
    T = labels.shape[1] - (shift == "logits")
    assert ran["region_forward"] == 1 and ran["chunks_backward"] == chunk_count(T, 4), ran
    torch._dynamo.reset()
    report = streamfx.explain(head_loss(model, shift), h, labels, options=OPTIONS)
    assert [p.name for p in report.plan] == ["head"] and not report.caveats, str(report)
    assert bool(report.moved) == (shift == "logits"), str(report)


@pytest.mark.fast
@pytest.mark.parametrize("shift", [False, True])
def test_loss_over_logits_it_receives(shift):
    """A loss compiled apart from the model, over logits it receives (as after a graph break
    between the LM head and the loss: ZeRO-3's hooks on the LM head): the loss streams over the
    logits, exactly, and one warning says that the logits exist whole and what to change;
    explain() lists the caveat. The head starts at the logits input, so the softmax over the
    classes streams too (no log-softmax of the whole sequence is computed and saved before it)."""
    torch.manual_seed(0)
    logits = torch.randn(2, 13, 50, requires_grad=True)
    labels = torch.randint(0, 50, (2, 13))
    labels[1, :4] = -100

    def loss_of(logits, labels):
        if shift:  # as Hugging Face's loss_function shifts: the labels, padded at the end
            labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1), ignore_index=-100)

    ref = loss_of(logits, labels)
    ref_grad, = torch.autograd.grad(ref, logits)
    before = dict(COUNTERS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = torch.compile(loss_of, backend="streambp", options=OPTIONS)(logits, labels)
        grad, = torch.autograd.grad(loss, logits)
    ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)
    assert ran["region_forward"] == 1 and ran["chunks_backward"] > 1, ran
    messages = [str(w.message) for w in caught if "streamfx" in str(w.message)]
    assert len(messages) == 1 and "region 'head' streams, but its logits arrive as an input" in messages[0], messages
    assert "test_pieces.py" in messages[0] and "one compiled graph" in messages[0], messages
    torch._dynamo.reset()
    report = streamfx.explain(loss_of, logits, labels, options=OPTIONS)
    assert [p.name for p in report.plan] == ["head"] and len(report.caveats) == 1, str(report)
    assert "head streams, but its logits arrive" in str(report), str(report)
    head, = report.regions
    assert head.entry.op == "placeholder", head.describe()
    aten = torch.ops.aten
    assert any(n.target in (aten.amax.default, aten._log_softmax.default) for n in head.nodes), head.describe()


class BreakingBlock(zoo.LlamaBlock):
    """A plain-PyTorch block with a graph break between its attention and its MLP."""

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        torch._dynamo.graph_break()
        return x + self.mlp(self.mlp_norm(x))


@pytest.mark.fast
def test_graph_break_inside_block():
    """A graph break in the middle of block 1 of 3 (plain PyTorch). Dynamo then compiles each
    block's forward as a frame of its own: block 0 (reused by block 2, the same code), block 1's
    attention half and its MLP half. Block 0, block 2 and block 1's attention half (a region ending
    at the graph output) stream. The break sits inside the model's loop over its blocks, so Dynamo
    skips the model's forward: its norm, head and loss run eagerly, and one warning says so,
    naming that forward, the break and what to change."""
    torch.manual_seed(0)
    model = zoo.TinyLlama(n_layer=3).train()
    broken = BreakingBlock(zoo.HIDDEN, zoo.HEADS, zoo.KV_HEADS, zoo.HIDDEN // zoo.HEADS, 64)
    broken.load_state_dict(model.layers[1].state_dict())
    model.layers[1] = broken
    ref = copy.deepcopy(model)
    inputs = zoo._plain_inputs(zoo.VOCAB)("odd17")
    compiled = torch.compile(model, backend="streambp", options=OPTIONS)
    ref_loss, ref_grads, _, _ = step(ref, inputs)
    loss, grads, ran, messages = step(compiled, inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(ref_grads, grads, rtol=1e-5)
    assert len(messages) == 1, messages
    assert "Dynamo runs TinyLlama.forward" in messages[0] and "zoo.py" in messages[0], messages
    at = f"test_pieces.py:{BreakingBlock.forward.__code__.co_firstlineno + 2}"
    assert at in messages[0] and "layer.compile" in messages[0], messages  # the break, the remedy
    assert ran["region_forward"] == 3 and ran["region_backward"] == 3, ran
    assert ran["chunks_backward"] == 3 * 4, ran  # T=17 in chunks of 5


def train_step(model, kwargs):
    loss = model(**kwargs).loss
    loss.backward()
    return loss.detach()


@pytest.mark.fast
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["step", "compiled_autograd"])
def test_whole_train_step_compiled(how):
    """The training step compiled as one function, forward and ``loss.backward()`` together
    ("step": Dynamo breaks the graph at the backward call, the forward graph streams and the
    backward runs the regions' own backward); and the same under compiled autograd, which traces
    the backward graph itself and calls each region's backward as an opaque function. Two calls
    with different data, each exact, every region streamed, no warning."""
    model, make_inputs = zoo.qwen3()
    ref = copy.deepcopy(model)
    captures = torch._dynamo.utils.counters["compiled_autograd"]["captures"]
    with torch._dynamo.config.patch(compiled_autograd=how == "compiled_autograd"):
        compiled = torch.compile(train_step, backend="streambp", options=OPTIONS)
        for case in ("right_pad", "prompt"):
            kwargs = make_inputs(case).kwargs
            ref.zero_grad(set_to_none=True)
            ref_loss = train_step(ref, kwargs)
            model.zero_grad(set_to_none=True)
            before = dict(COUNTERS)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                loss = compiled(model, kwargs)
            ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
            torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
            assert_grads_match(grads_of(ref), grads_of(model), rtol=1e-5)
            assert not [str(w.message) for w in caught if "streamfx" in str(w.message)]
            assert ran["region_forward"] == zoo.LAYERS + 1 == ran["region_backward"], ran
            assert ran["chunks_backward"] >= zoo.LAYERS * 4, ran  # T=16 in chunks of 5
    traced = torch._dynamo.utils.counters["compiled_autograd"]["captures"] - captures
    assert (traced > 0) == (how == "compiled_autograd"), traced


def optimizer_step(model, opt, kwargs):
    loss = model(**kwargs).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


@pytest.mark.parametrize("optimizer", cases(["SGD", "AdamW"], ["SGD"]))
def test_whole_train_step_with_the_optimizer_compiled(optimizer):
    """The step compiled as one function with the optimizer's step and zero_grad in it: Dynamo
    breaks at the backward call, the forward graph streams, and the optimizer's update, a graph
    of its own with no sequence in it, compiles and runs as it is. Three steps on two kinds of
    batch: the parameters follow eager's (SGD with momentum, linear in the gradients: within fp32
    rounding; AdamW, whose update divides by the gradients' running RMS and so magnifies their
    last-bit differences where they are tiny: its losses), every region streamed, no warning."""
    model, make_inputs = zoo.qwen3()
    ref = copy.deepcopy(model)

    def make(m):
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) if optimizer == "SGD" \
            else torch.optim.AdamW(m.parameters(), lr=1e-3)

    opt, ref_opt = make(model), make(ref)
    start = [p.detach().clone() for p in model.parameters()]
    compiled = torch.compile(optimizer_step, backend="streambp", options=OPTIONS)
    for case in ("right_pad", "prompt", "right_pad"):
        kwargs = make_inputs(case).kwargs
        ref_loss = optimizer_step(ref, ref_opt, kwargs)
        before = dict(COUNTERS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = compiled(model, opt, kwargs)
        ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        assert not [str(w.message) for w in caught if "streamfx" in str(w.message)]
        assert ran["region_forward"] == zoo.LAYERS + 1 == ran["region_backward"], ran
        assert all(p.grad is None for p in model.parameters())
    if optimizer == "SGD":
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    else:   # (the step moved the parameters eager's moved)
        moved = [bool((p != p0).any()) for p, p0 in zip(model.parameters(), start)]
        assert moved == [bool((q != p0).any()) for q, p0 in zip(ref.parameters(), start)] and any(moved), moved


class CountingBlock(zoo.LlamaBlock):
    """A block that reads counts out of a tensor (JetMoE's tokens per expert: ``.tolist()``)."""

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        self.sizes = (x[..., 0] > 0).long().sum(1).tolist()
        return x + self.mlp(self.mlp_norm(x))


@pytest.mark.fast
@pytest.mark.heavy
def test_data_dependent_break_names_capture_scalar_outputs():
    """A ``.tolist()`` inside a block breaks the graph inside the model's loop: the warning names
    the break and Dynamo's setting that traces it as a symbol; with that setting the model
    compiles whole and every layer streams. Exact either way."""
    torch.manual_seed(0)
    model = zoo.TinyLlama(n_layer=2).train()
    counting = CountingBlock(zoo.HIDDEN, zoo.HEADS, zoo.KV_HEADS, zoo.HIDDEN // zoo.HEADS, 64)
    counting.load_state_dict(model.layers[1].state_dict())
    model.layers[1] = counting
    inputs = zoo._plain_inputs(zoo.VOCAB)("odd17")
    ref_loss, ref_grads, _, _ = step(copy.deepcopy(model), inputs)
    for capture in (False, True):
        torch._dynamo.reset()
        # config.patch, not monkeypatch: pytest >= 9.2 restores with delattr, which hides the option
        with torch._dynamo.config.patch(capture_scalar_outputs=capture):
            compiled = torch.compile(copy.deepcopy(model), backend="streambp", options=OPTIONS)
            loss, grads, ran, messages = step(compiled, inputs)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        assert_grads_match(ref_grads, grads, rtol=1e-5)
        if not capture:
            assert len(messages) == 1 and "Dynamo runs TinyLlama.forward" in messages[0], messages
            assert "capture_scalar_outputs = True" in messages[0], messages
        else:
            assert messages == [] and ran["region_forward"] == 3, (messages, ran)  # 2 layers + head


@pytest.mark.fast
def test_skipped_function_is_an_error_under_strict():
    """With ``strict=True`` the model's forward that Dynamo skips (a graph break inside its loop
    over the blocks) is an error naming it, not a warning."""
    torch.manual_seed(0)
    model = zoo.TinyLlama(n_layer=2).train()
    model.layers[1] = BreakingBlock(zoo.HIDDEN, zoo.HEADS, zoo.KV_HEADS, zoo.HIDDEN // zoo.HEADS, 64)
    inputs = zoo._plain_inputs(zoo.VOCAB)("odd17")
    compiled = torch.compile(model, backend="streambp", options={**OPTIONS, "strict": True})
    with pytest.raises(streamfx.StreamBPError, match=r"Dynamo runs TinyLlama\.forward .*strict=True"):
        compiled(*inputs.args, **inputs.kwargs)


def test_graph_break_inside_hf_layer(monkeypatch):
    """A graph break inside decoder layer 1's MLP (of 3) of a Hugging Face Qwen3: Dynamo compiles
    each decoder layer as a frame of its own, and the causal-LM forward after the model as a graph
    holding the head and the loss. Layers 0 and 2 stream, layer 1's attention half streams, and
    the head streams (its sequence axis comes from the labels). The break sits inside the loop
    over the layers, so Dynamo skips Qwen3Model.forward (the embedding and the final norm run
    eagerly): one warning names it and the break."""
    monkeypatch.setattr(zoo, "LAYERS", 3)
    model, make_inputs = zoo.qwen3()
    mlp = model.model.layers[1].mlp
    forward = mlp.forward

    def breaking(x):
        torch._dynamo.graph_break()
        return forward(x)

    ref = copy.deepcopy(model)
    mlp.forward = breaking
    compiled = torch.compile(model, backend="streambp", options=OPTIONS)
    ran, messages = compare(ref, compiled, make_inputs("odd17"))
    assert len(messages) == 1 and "Dynamo runs Qwen3Model.forward" in messages[0], messages
    assert f"test_pieces.py:{breaking.__code__.co_firstlineno + 1}" in messages[0], messages  # the break
    # layers 0 and 2, layer 1's attention half (T=17 in 4 chunks of 5), the head (5 chunks of 4)
    assert ran["region_forward"] == 4 and ran["region_backward"] == 4, ran
    assert ran["chunks_backward"] == 3 * 4 + 5, ran


@pytest.mark.fast
@pytest.mark.parametrize("dynamo_flag", [pytest.param(False, marks=pytest.mark.heavy), True])
def test_hf_gradient_checkpointing_left_on_under_a_direct_compile(dynamo_flag):
    """A Hugging Face model with its gradient checkpointing on, compiled directly with the streambp
    backend (no ``streamfx.prepare``, which switches checkpointing off). transformers >= 5.25's
    layers set and reset the `kernels` package's routing variable in their forward, a side effect
    Dynamo's checkpoint operator refuses: every layer breaks the graph. Without Dynamo's
    ``skip_fwd_side_effects_in_bwd_under_checkpoint`` the step is exact and the one warning names
    the break as checkpointing's and both ways out (where transformers has no such side effect,
    every layer streams and nothing is said); with it, every layer and the head stream, exact,
    nothing said."""
    from streamfx.bench.methods import hf_checkpointing

    model, make_inputs = zoo.qwen3()
    hf_checkpointing(model)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="streambp", options=OPTIONS)
    # (config.patch, not monkeypatch: pytest >= 9.2 restores a module attribute with delattr,
    # which hides a Dynamo option from every later compile in the worker)
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=dynamo_flag):
        ran, messages = compare(ref, compiled, make_inputs("odd17"))
    streamed = ran["region_forward"] == zoo.LAYERS + 1 and ran["chunks_backward"] >= zoo.LAYERS * 4 + 5
    if dynamo_flag or not messages:
        assert streamed and not messages, (ran, messages)
    else:
        assert len(messages) == 1 and "activation checkpointing's" in messages[0], messages
        assert "gradient_checkpointing_disable()" in messages[0] and \
            "skip_fwd_side_effects_in_bwd_under_checkpoint = True" in messages[0], messages


@pytest.mark.fast
def test_ddp_piece_cut_inside_layer(tmp_path):
    """One-rank DDP with 5 KB buckets: Dynamo's DDPOptimizer cuts each decoder layer where a bucket
    fills, so a piece holds the attention without its query/key producers (and others the
    projections or the MLP alone). Those pieces run unstreamed, exactly, and warn with the cause
    and the remedy; the last piece, the LM head and the loss, streams. Each parameter is reduced
    once (a comm hook counts them)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch._dynamo.reset()
    model, make_inputs = zoo.tiny_llama()
    ref = copy.deepcopy(model)
    inputs = make_inputs("odd17")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    first_bucket = dist._DEFAULT_FIRST_BUCKET_BYTES
    try:
        # DDPOptimizer asserts that its first bucket (1 MiB by default) is no larger than the others
        dist._DEFAULT_FIRST_BUCKET_BYTES = 5000
        wrapped, names, reduced = DDP(model, bucket_cap_mb=5000 / 2 ** 20), {p: n for n, p in model.named_parameters()}, []

        wrapped.register_comm_hook(None, counting_allreduce(names, reduced))
        compiled = torch.compile(wrapped, backend="streambp", options=OPTIONS)
        ref_loss, ref_grads, _, _ = step(ref, inputs)
        loss, grads, ran, messages = step(compiled, inputs)
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = first_bucket
        # gloo's worker threads finish releasing their works (which needs the GIL) before the
        # reducer, freed with the GIL held, drops the last reference to the group and joins them
        dist.barrier()
        dist.destroy_process_group()
        torch._dynamo.reset()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(ref_grads, {k.removeprefix("module."): g for k, g in grads.items()}, rtol=1e-5)
    assert sorted(reduced) == sorted(ref_grads), reduced
    assert ran["region_forward"] == 1 and ran["chunks_backward"] == 5, ran  # the head: T=17 in chunks of 4
    cut = [m for m in messages if "attention outside every layer region" in m]
    # one warning per cut piece that holds an attention (warnings are per compiled graph)
    graphs = {m.rsplit("(compiled graph ", 1)[-1] for m in cut}
    assert len(cut) == len(graphs) == len(model.layers), messages
    assert "DDPOptimizer" in cut[0] and "torch._dynamo.config.optimize_ddp = False" in cut[0], cut
    assert "bucket_cap_mb" in cut[0] and "zoo.py" in cut[0], cut  # the remedy and the source line


@pytest.mark.fast
def test_head_symbolic_slice_names_cause():
    """A head graph compiled with dynamic=True, whose hidden state is sliced by an int that becomes
    a symbol (``hidden[:, -logits_to_keep:]``): the labels' sequence axis cannot be matched with
    the hidden state's, so the head runs unstreamed, exactly, and the warning names the slice and
    the remedy (dynamic=None keeps an unchanging int constant)."""
    model, make_inputs = zoo.qwen3()
    inputs = make_inputs("odd13")
    hidden = model.model(input_ids=inputs.kwargs["input_ids"]).last_hidden_state.detach()
    labels = inputs.kwargs["labels"]

    def head(hidden, labels, keep):
        return head_loss(model)(hidden[:, -keep:], labels[:, -keep:])

    ref = head(hidden, labels, 11)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = torch.compile(head, backend="streambp", options=OPTIONS, dynamic=True)(hidden, labels, 11)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    messages = [str(w.message) for w in caught if "streamfx" in str(w.message)]
    assert len(messages) == 1 and "sliced along the sequence with a symbolic bound" in messages[0], messages
    assert "dynamic=None" in messages[0] and "test_pieces.py" in messages[0], messages


def _in_nested_regions(layers) -> None:
    """Each layer's ``forward`` under ``torch.compiler.nested_compile_region`` (compiled once for
    every layer: Dynamo's ``invoke_subgraph``, one opaque op per call in AOTAutograd's graph)."""
    made: dict = {}
    for layer in layers:
        cls = type(layer)
        if cls not in made:
            made[cls] = type(f"Region{cls.__name__}", (cls,), {"forward": torch.compiler.nested_compile_region(cls.forward)})
        layer.__class__ = made[cls]


@pytest.mark.parametrize("name,codegen", [pytest.param("qwen3", "eager", marks=pytest.mark.extended),
                                          pytest.param("nanogpt", "eager", marks=pytest.mark.fast), ("qwen3", "inductor")])
def test_layers_in_a_nested_compile_region_stream(name, codegen):
    """Layers whose forward is a nested compile region are inlined into the graph the passes
    see: every layer and the head stream, exact, at a first length and a later one (a
    differentiated ``invoke_subgraph`` left in the graph gave other gradients)."""
    model, make_inputs = getattr(zoo, name)()
    _in_nested_regions(model.model.layers if name == "qwen3" else model.transformer.h)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="streambp", options={**OPTIONS, "codegen": codegen})
    for case in (["right_pad", "odd17"] if name == "qwen3" else ["odd13", "odd17"]):
        ran, messages = compare(ref, compiled, make_inputs(case))
        assert not messages, messages
        assert ran["region_forward"] == zoo.LAYERS + 1, ran
        assert ran["chunks_backward"] >= zoo.LAYERS * 3 + 4, ran
    if codegen == "eager":   # (each layer's ops named by its own modules, not by the layer the region was traced in)
        torch._dynamo.reset()
        report = str(streamfx.explain(copy.deepcopy(ref), *make_inputs("odd13").args, **make_inputs("odd13").kwargs))
        layers = "model.layers" if name == "qwen3" else "transformer.h"
        assert f"layer.0 ({layers}.0)" in report and f"layer.1 ({layers}.1)" in report, report


@pytest.mark.fast
def test_a_nested_compile_region_left_in_the_graph_runs_it_unstreamed(monkeypatch):
    """A region call that is not inlined (here: the inlining switched off, as for a call whose
    result is read other than by index) is one op whose own backward the streamed joint would
    not call: the graph runs unstreamed, exact, and the warning names the call."""
    from streamfx.passes import inline

    monkeypatch.setattr(inline, "inline", lambda gm: 0)
    model, make_inputs = zoo.nanogpt()
    _in_nested_regions(model.transformer.h)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="streambp", options=OPTIONS)
    ran, messages = compare(ref, compiled, make_inputs("odd13"))
    assert ran["region_forward"] == 0, ran
    assert len(messages) == 1 and "nested compile region" in messages[0] and "zoo.py" in messages[0], messages


class CountedBlock(zoo.Block):
    """A nanoGPT block that counts its calls in a buffer (an in-place update in the forward)."""

    def forward(self, x):
        self.calls.add_(1)
        return super().forward(x)


@pytest.mark.fast
def test_a_nested_compile_region_that_updates_a_buffer():
    """The region's in-place buffer update is inlined with its ops and kept (AOTAutograd turns it
    into a copy into the buffer; torch's own backends refuse such a region in training): every
    layer streams, exact, each layer's counter at 1 as in eager."""
    model, make_inputs = zoo.nanogpt()
    for block in model.transformer.h:
        block.__class__ = CountedBlock
        block.register_buffer("calls", torch.zeros(()))
    _in_nested_regions(model.transformer.h)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="streambp", options=OPTIONS)
    ran, messages = compare(ref, compiled, make_inputs("odd13"))
    assert not messages, messages
    assert ran["region_forward"] == zoo.LAYERS + 1, ran
    assert [b.calls.item() for b in model.transformer.h] == [b.calls.item() for b in ref.transformer.h] == [1.0] * zoo.LAYERS

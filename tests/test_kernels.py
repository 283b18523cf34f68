"""Every attention kernel form streams, on the kernel the model used, with no T x T tensor.

The CUDA kernels (flash, efficient, cuDNN) run here as CPU stand-ins (``streamfx.emulate``) that
keep each kernel's causal alignment, output layouts, log-sum-exp layout, mask padding and
backward contract; "cpu" is the CPU's own fused kernel. Each case compiles with strict=True and
asserts that every layer and the head streamed, that the chunk graphs call the model's kernel
(flash with its own bottom-right causal, top-left kernels as prefix + diagonal blocks, a mask
only for per-token data), that nothing the partitioner saves has T x T elements, and gradients
against eager (fp32: 1e-5 relative; bf16: no worse than twice eager-bf16's own error against a
float64 run).
"""
import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F

import streamfx
import zoo
from tiers import cases
from conftest import assert_grads_match, grads_of, run_eager_and_compiled
from streamfx import emulate
from streamfx.passes import kernels
from streamfx.passes.graphs import bind
from streamfx.passes.schedule import chunk_count

T = 24     # no other dim of the zoo's models is 24
CHUNK = 5
KERNEL_FORMS = ("cpu", "flash", "efficient", "cudnn")


def packed_inputs(make_inputs):
    position_ids = torch.cat([torch.arange(7), torch.arange(11), torch.arange(6)]).unsqueeze(0)
    return make_inputs(zoo.Case("packed", 1, T), position_ids=position_ids)


# case -> (zoo model, inputs, the mask the model gives SDPA: None, "causal" (Hugging Face's 4-D
# mask of an unpadded batch, read from no data) or "data" (per-token data: padding, documents, a window))
CASES = {
    "causal": ("tiny_llama", lambda mk: mk(zoo.Case("t", 2, T)), None),             # F.sdpa(is_causal=True)
    "gqa": ("tiny_llama_gqa", lambda mk: mk(zoo.Case("t", 2, T)), None),            # enable_gqa=True
    "hf_causal": ("qwen3_sdpa", lambda mk: mk(zoo.Case("t", 2, T)), "causal"),
    "sliding": ("mistral_sliding", lambda mk: mk(zoo.Case("t", 2, T)), "data"),     # window 5
    "left_pad": ("qwen3_sdpa", lambda mk: mk(zoo.Case("t", 2, T, pad="left")), "data"),
    "packed": ("qwen3_sdpa", packed_inputs, "data"),                                # documents by position ids
}


def kernel_context(kernel, codegen="eager"):
    """The emulated CUDA kernel (its mask alignment checked where the chunk graphs run as FX
    graphs: Inductor realigns the efficient kernel's mask for CUDA tensors only)."""
    if kernel == "cpu":
        return contextlib.nullcontext()
    return emulate.cuda_attention(kernel, check_alignment=codegen == "eager")


@contextlib.contextmanager
def saved_by_partitioner():
    """The values AOTAutograd's partitioner saves for the backward (the backward graph's inputs
    that are not tangents), for every graph compiled inside the context."""
    from streamfx.session import Session

    saved, original = [], Session.partition

    def partition(self, *args, **kwargs):
        fw, bw = original(self, *args, **kwargs)
        saved.extend(n.meta.get("val") for n in bw.graph.find_nodes(op="placeholder")
                     if "tangent" not in n.name)
        return fw, bw

    Session.partition = partition
    try:
        yield saved
    finally:
        Session.partition = original


def attention_calls(programs) -> list:
    """(kernel name, node) of every attention call in the layers' query chunk graphs."""
    calls = []
    for prog in programs:
        if not prog.name.startswith("layer"):
            continue
        for n in prog.chunk_gm.graph.nodes:
            if n.target is torch.ops.streamfx.causal_blocks.default:
                calls.append(("blocks:" + n.args[0], n))
            elif kernels.of(n) is not None:
                calls.append((kernels.of(n).name, n))
    return calls


def check_kernel_use(kernel, case, calls):
    """Each chunk runs on the model's kernel, aligned by the kernel itself where the pattern is
    causal: flash's own causal flag, a top-left kernel's blocks; a mask only for per-token data."""
    mask = CASES[case][2]
    if kernel == "efficient" and case == "gqa":  # grouped heads the efficient kernel does not take:
        assert not calls, calls                   # SDPA's math kernel, unfused attention in the graph
        return
    assert calls, "no attention call in the chunk graphs"
    # SDPA gives a masked call to the efficient kernel, as flash takes no mask
    fused = "efficient" if kernel == "flash" and mask else {"cpu": "cpu-flash"}.get(kernel, kernel)
    for name, node in calls:
        if mask == "data":
            assert name == fused, name
            kern = kernels.of(node)
            assert kern.mask and bind(node).get(kern.mask) is not None, node.format_node()
        elif fused == "flash":
            assert name == "flash" and bind(node)["is_causal"], node.format_node()
        else:
            assert name == "blocks:" + fused, name


def no_token_by_token(saved):
    for v in saved:
        if isinstance(v, torch.Tensor):
            assert list(v.shape).count(T) <= 1, f"a saved tensor holds {tuple(v.shape)}"


def rel(got, ref):
    return ((got.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def run_form(kernel, case, dtype=torch.float32, codegen="eager"):
    name, make, _ = CASES[case]
    model, make_inputs = zoo.ZOO[name]()
    inputs = make(make_inputs)
    model = model.to(dtype)
    options = {"chunk_size": CHUNK, "head_chunk_size": CHUNK, "codegen": codegen, "strict": True}
    with kernel_context(kernel, codegen), saved_by_partitioner() as saved:
        run = run_eager_and_compiled(model, inputs, options)
    assert sorted({p.name for p in run.programs}) == ["head"] + [f"layer.{i}" for i in range(zoo.LAYERS)], (
        [p.name for p in run.programs], run.warnings)
    assert run.counters["chunks_backward"] >= (zoo.LAYERS + 1) * chunk_count(T, CHUNK), run.counters
    assert not run.warnings, run.warnings
    check_kernel_use(kernel, case, attention_calls(run.programs))
    no_token_by_token(saved)
    if dtype == torch.float32:
        torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
        assert_grads_match(run.ref_grads, run.grads, rtol=1e-5)
        return
    # bf16: streamed no worse than twice eager-bf16's own error, both against float64
    ref64 = copy.deepcopy(model).double()
    inputs.loss_of(ref64(*inputs.args, **inputs.kwargs)).backward()
    exact = grads_of(ref64)
    for n, g in run.grads.items():
        if exact[n] is None:
            continue
        own, ours = rel(run.ref_grads[n], exact[n]), rel(g, exact[n])
        assert ours <= 2 * own + 1e-6, f"{n}: streamed error {ours:.2e}, eager bf16's {own:.2e}"


# the fast tier: each kernel once, each kind of mask once; the default run adds half the pairs
# (each kernel with three cases, each case with two kernels); the rest are extended
FAST = {("cpu", "causal"), ("flash", "causal"), ("efficient", "hf_causal"), ("cudnn", "left_pad")}
DEFAULT = FAST | {(k, c) for i, k in enumerate(KERNEL_FORMS) for j, c in enumerate(CASES) if (i + j) % 2 == 0}


def _pair_marks(k, c):
    return [pytest.mark.fast] if (k, c) in FAST else [] if (k, c) in DEFAULT else [pytest.mark.extended]


@pytest.mark.parametrize("kernel,case", [pytest.param(k, c, id=f"{k}-{c}", marks=_pair_marks(k, c))
                                         for k in KERNEL_FORMS for c in CASES])
def test_kernel_forms_stream_fp32(kernel, case):
    run_form(kernel, case)


BF16_CASES = ["causal", "gqa", "left_pad"]


@pytest.mark.slow
@pytest.mark.parametrize("kernel, case", cases([(k, c) for k in KERNEL_FORMS for c in BF16_CASES],
                                               [(k, BF16_CASES[i % 3]) for i, k in enumerate(KERNEL_FORMS)]))
def test_kernel_forms_stream_bf16(kernel, case):
    run_form(kernel, case, dtype=torch.bfloat16)


@pytest.mark.slow
@pytest.mark.parametrize("kernel, case", cases([(k, c) for k in KERNEL_FORMS for c in ("causal", "left_pad")],
                                               [(k, ("causal", "left_pad")[i % 2]) for i, k in enumerate(KERNEL_FORMS)]))
def test_kernel_forms_stream_inductor(kernel, case):
    run_form(kernel, case, codegen="inductor")


@pytest.mark.parametrize("case", cases(["hf_causal", "left_pad", "sliding"], ["hf_causal", "left_pad"]))
def test_cudnn_mask_filled_as_before_torch_2_13_streams(monkeypatch, case):
    """Before torch 2.13 the CUDA composite hands cuDNN a boolean mask's hidden positions as
    -65504 (-65536 in bf16), not -inf: under torch.compile Hugging Face gives SDPA that boolean
    mask, and cuDNN is the H100's default kernel. Such a mask still reads as causal (or as its
    window), rows that see no key (left padding) are read whole, and gradients are exact."""
    import dataclasses

    monkeypatch.setitem(kernels.BY_NAME, "cudnn", dataclasses.replace(kernels.BY_NAME["cudnn"], bool_mask_fill=-65504.0))
    filled = []
    real = emulate._additive

    def spy(mask, dtype, kernel):
        out = real(mask, dtype, kernel)
        if mask is not None and mask.dtype == torch.bool and kernel == "cudnn":
            filled.append(kernels.BY_NAME[kernel].bool_mask_fill)
        return out

    monkeypatch.setattr(emulate, "_additive", spy)
    run_form("cudnn", case)
    assert filled and set(filled) == {-65504.0}, filled   # (a boolean mask reached cuDNN's composite)


# ---- masks that carry more than their causal pattern ------------------------------------------------
def _masked_form(kernel, form, options):
    model, make_inputs = zoo.FORMS[form]()
    inputs = make_inputs(zoo.Case("t", 2, T))
    with kernel_context(kernel):
        run = run_eager_and_compiled(model, inputs, {"chunk_size": CHUNK, **options})
    layers = {p.name for p in run.programs if p.name.startswith("layer")}
    assert layers == {f"layer.{i}" for i in range(zoo.LAYERS)}, ([p.name for p in run.programs], run.warnings)
    assert run.counters["chunks_backward"] >= zoo.LAYERS * chunk_count(T, CHUNK), run.counters
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads, rtol=1e-5)
    return run


@pytest.mark.parametrize("kernel", [pytest.param(k, marks=[pytest.mark.fast] if k in ("efficient", "cudnn") else [])
                                    for k in KERNEL_FORMS])
@pytest.mark.parametrize("form", ["sdpa_alibi", "head_windows"])
def test_a_causal_pattern_mask_carrying_more_stays_in_the_chunks(kernel, form):
    """A constant mask whose allowed keys form the causal pattern but that carries more (ALiBi's
    per-head bias on the keys it lets through; a narrower window for some heads) streams with
    the mask in each chunk, not as the kernel's own causal attention: exact on every kernel."""
    run = _masked_form(kernel, form, {"strict": True})
    assert not run.warnings, run.warnings


@pytest.mark.fast
@pytest.mark.parametrize("kernel,attention", [("cpu", "recompute"), ("efficient", "recompute"),
                                                     pytest.param("efficient", "keep", marks=pytest.mark.heavy)])
def test_a_mask_that_needs_a_gradient_streams_exactly(kernel, attention):
    """Trained ALiBi slopes: the mask needs a gradient. The CPU's SDPA runs its math form, the
    efficient kernel returns the mask's gradient from its backward (a per-(query, key) output);
    the slopes' gradient is exact. Kept attention cannot give it (the kernel's backward from a
    kept output has none): the layer recomputes, said with the cause."""
    run = _masked_form(kernel, "learned_alibi", {"attention": attention})
    assert run.grads["learned"] is not None and run.grads["learned"].abs().max() > 0
    if attention == "keep":
        said = [w for w in run.warnings if "attention='keep'" in w]
        assert said and "needs a gradient" in said[0], run.warnings
        assert run.counters["attention_kept"] == 0, run.counters
    else:
        assert not run.warnings, run.warnings


@pytest.mark.fast
@pytest.mark.parametrize("kernel", [pytest.param(k, marks=[] if k == "efficient" else pytest.mark.heavy)
                                    for k in ("flash", "efficient", "cudnn")])
def test_fused_attention_with_dropout_is_refused_with_the_cause(kernel):
    """A fused CUDA kernel with ``dropout_p > 0`` (Hugging Face's SDPA attention in training with
    ``attention_dropout > 0``) draws its random mask inside: a chunk's recomputation would draw
    another, so the layers do not stream (strict: StreamBPError naming the dropout and the remedy)
    where they would otherwise have given gradients of different randomness. Written-out
    attention's dropout streams (``test_layers``)."""
    model, make_inputs = zoo.qwen3_sdpa()
    for m in model.modules():
        if hasattr(m, "attention_dropout"):   # (read at each call; the config is read when built)
            m.attention_dropout = 0.1
    inputs = make_inputs(zoo.Case("t", 2, T))
    compiled = torch.compile(model.train(), backend="streambp",
                             options={"codegen": "eager", "chunk_size": CHUNK, "strict": True})
    with kernel_context(kernel), pytest.raises(streamfx.StreamBPError) as raised:
        inputs.loss_of(compiled(*inputs.args, **inputs.kwargs)).backward()
    said = str(raised.value)
    assert "fused attention with dropout (dropout_p=0.1)" in said and "attention_dropout=0.0" in said, said


# ---- the pieces ----------------------------------------------------------------------------
@pytest.mark.fast
def test_every_kernel_entry_matches_its_schema():
    """Each table entry names arguments its op has (the passes read q/k/v/mask/causal by name)."""
    for op, kern in kernels.KERNELS.items():
        names = {a.name for a in op._schema.arguments}
        assert {"query", "key", "value", "is_causal", "scale"} <= names, (kern.name, names)
        assert kern.mask is None or kern.mask in names, (kern.name, kern.mask)
        assert kern.dropout is None or kern.dropout in names, (kern.name, kern.dropout)
        assert kern.alignment in ("bottom-right", "top-left"), kern.name
        if kern.blocks:
            assert kern.backward is not None and kern.lse_view is not None, kern.name


@pytest.mark.fast
@pytest.mark.parametrize("kernel", ["flash", "efficient", "cudnn"])
@pytest.mark.parametrize("masked", [False, True])
def test_emulated_kernels_equal_cpu_attention(kernel, masked):
    """The stand-ins compute what CPU attention computes (forward and gradients), and SDPA reaches
    the emulated kernel: flash unmasked, the efficient kernel where flash would get a mask."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 13, 8, requires_grad=True) for _ in range(3))
    mask = torch.rand(13, 13) > 0.3 if masked else None
    mask = mask | torch.eye(13, dtype=torch.bool) if masked else None

    def f():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not masked)
    ref = f()
    gref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    with emulate.cuda_attention(kernel):
        out = f()
        g = torch.autograd.grad(out.square().sum(), (q, k, v))
    used = "efficient" if kernel == "flash" and masked else kernel
    assert used.lower() in type(out.grad_fn).__name__.lower(), type(out.grad_fn).__name__
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(g, gref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert "FlashAttentionForCpu" in type(f().grad_fn).__name__  # the registrations ended with the context


@pytest.mark.fast
@pytest.mark.parametrize("kernel", ["cpu-flash", "efficient", "cudnn"])
@pytest.mark.parametrize("queries,keys", [(4, 4), (4, 11), (3, 16)])
def test_causal_blocks_equal_bottom_right_causal_attention(kernel, queries, keys):
    """A chunk of queries against a longer key prefix on a top-left kernel: prefix and diagonal
    blocks merged through the log-sum-exp, and each block's backward from the merged statistics,
    equal bottom-right causal attention (float64 reference), GQA included where the kernel takes it."""
    torch.manual_seed(0)
    kv_heads = 4 if kernel == "efficient" else 2
    q = torch.randn(2, 4, queries, 8, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, keys, 8, requires_grad=True) for _ in range(2))
    rep = 4 // kv_heads
    allowed = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
    ref = F.scaled_dot_product_attention(q.double(), k.double().repeat_interleave(rep, 1),
                                         v.double().repeat_interleave(rep, 1), attn_mask=allowed)
    gref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    with emulate.cuda_attention("efficient"):
        out, _ = torch.ops.streamfx.causal_blocks(kernel, q, k, v, None)
        g = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert (out.double() - ref).abs().max() <= 1e-5
    for a, b in zip(g, gref):
        assert rel(a, b) <= 1e-5


@pytest.mark.fast
def test_efficient_mask_is_padded_per_chunk():
    """The efficient kernel reads mask rows aligned to 8 elements: its composite pads the key dim
    of the whole mask and slices it back. The analysis sees through that pad (no [T, T] mask is
    saved, as ``test_kernel_forms_stream_fp32`` asserts), and each chunk pads its own [c, n] mask
    for its key length (the stand-in raises on an unaligned mask, as the CUDA kernel does)."""
    torch.manual_seed(0)
    q = torch.randn(1, 2, 5, 8)
    with emulate.cuda_attention("efficient"), pytest.raises(RuntimeError, match="aligned"):
        torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, torch.zeros(1, 2, 5, 5), False)
    run_form("efficient", "left_pad")   # T = 24 keys, chunks of 5: n = 5, 10, 15, ... keys per chunk


@pytest.mark.fast
def test_masks_of_a_cuda_graph_are_read_on_the_cpu():
    """A mask's pattern is read at compile time by evaluating its subgraph; a graph captured on a
    GPU creates its positions on the GPU (``arange(T, device="cuda")``) and holds CUDA constants.
    The evaluation runs on the CPU (no GPU is touched, none is needed): the pattern is causal, read
    from the position data, not "unknown" (which refused the layer as "not causal")."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from streamfx.passes import masks
    from streamfx.passes.attention import AttentionSite

    def mask(pos, w):
        ar = torch.arange(pos.shape[-1], device=pos.device)
        allowed = (ar[None, :] <= ar[:, None]) & (pos[:, None, :] >= 0)
        return torch.where(allowed, 0.0, float("-inf")) + w.sum() * 0

    gm = make_fx(mask, tracing_mode="fake")(torch.zeros(2, 16, dtype=torch.long), torch.zeros(3))
    with FakeTensorMode():  # the same graph as captured on a GPU
        for n in gm.graph.nodes:
            if "device" in n.kwargs:
                n.kwargs = {**n.kwargs, "device": torch.device("cuda")}
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                n.meta["val"] = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda")
    pos, w = gm.graph.find_nodes(op="placeholder")
    out = gm.graph.find_nodes(op="output")[0].args[0]
    site = AttentionSite(0, "sdpa:test", None, None, None, out, frozenset([out]), False, out)
    masks.classify(site, {w: torch.zeros(3)}, 16)
    assert (site.mask_kind, site.data, site.is_causal) == ("causal", (pos,), True)


@pytest.mark.fast
@pytest.mark.parametrize("unsqueezed_outside", [False, True])
def test_grouped_kv_heads_reach_the_kernel_unrepeated(unsqueezed_outside):
    """HF's repeat_kv in front of a kernel that takes grouped K/V heads (unsqueeze, expand, clone,
    reshape) is dropped: the kernel reads the K/V heads as they are. Also where the repeat's
    unsqueeze is made before the graph (a region's input is the [B, KV, 1, L, D] tensor): the
    kernel reads it squeezed. Same output either way."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from streamfx.passes import rewrite

    aten = torch.ops.aten
    B, H, KV, L, D = 1, 4, 2, 12, 8

    def repeat(x):
        x = x if unsqueezed_outside else x[:, :, None]
        return x.expand(B, KV, H // KV, L, D).clone().reshape(B, H, L, D)

    def f(q, k, v):
        return aten._scaled_dot_product_flash_attention_for_cpu(q, repeat(k), repeat(v), 0.0, True)[0]

    g = torch.Generator().manual_seed(0)
    kv_shape = (B, KV, 1, L, D) if unsqueezed_outside else (B, KV, L, D)
    args = [torch.randn(B, H, L, D, generator=g), torch.randn(*kv_shape, generator=g),
            torch.randn(*kv_shape, generator=g)]
    gm = make_fx(f, tracing_mode="fake")(*args)
    node = next(n for n in gm.graph.nodes if n.target is aten._scaled_dot_product_flash_attention_for_cpu.default)
    assert kernels.of(node).grouped_kv
    rewrite._grouped_kv_in_place(gm, node)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    assert not any(n.target in (aten.expand.default, aten.clone.default) for n in gm.graph.nodes), gm.graph
    assert node.args[1].meta["val"].shape == (B, KV, L, D)
    torch.testing.assert_close(gm(*args), f(*args))

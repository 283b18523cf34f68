"""Mixture-of-experts layers stream: transformers' grouped expert dispatch (a sort of
token-expert pairs by expert, a gather of their tokens, grouped matmuls whose groups are counted
from the sorted ids, the inverse permutation and a sum over the top-k slots) is a permutation of
a chunk's tokens and its inverse, so every layer streams with exact gradients."""
import pytest
import torch
from hypothesis import example, given, strategies as st

import streamfx
from conftest import assert_grads_match, run_eager_and_compiled
from streamfx.passes.seq_dims import TOKEN_LOCAL, UNKNOWN_MIXING, infer_axes

import zoo
from tiers import cases, compiling
from streamfx.passes.schedule import chunk_count

pytestmark = pytest.mark.skipif(not zoo.moe_streams(), reason="transformers < 5.24: grouped_mm_fallback's "
                                "backward reads offs.tolist(); tests/test_untraceable.py checks the refusal")
T = 16
DISPATCH_OPS = ("aten.sort", "aten.index", "aten.histc", "aten.index_put", "transformers.grouped_mm_fallback")


def _parity(inputs, options, model=None):
    model = model if model is not None else zoo.qwen3_moe()[0]
    run = run_eager_and_compiled(model, inputs, options)
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    return run


def _layers_streamed(run, chunk, length=T, n_layers=zoo.LAYERS):
    """Every layer region ran chunk by chunk, forward and backward, with ceil(T / chunk) chunks."""
    n = chunk_count(length, min(chunk, length))
    layers = {name: runs for name, runs in run.schedules.items() if name.startswith("layer.")}
    assert sorted(layers) == [f"layer.{i}" for i in range(n_layers)], (run.schedules, run.warnings)
    for name, runs in layers.items():
        assert runs and set(runs) == {n}, (name, runs)
    assert run.schedules.get("head"), (run.schedules, run.warnings)
    assert not run.warnings, run.warnings


@pytest.mark.parametrize("chunk", [1, pytest.param(5, marks=[pytest.mark.fast, pytest.mark.heavy]), T - 1, T, T + 7])
def test_every_layer_streams_per_chunk_size(chunk):
    _, make_inputs = zoo.qwen3_moe()
    run = _parity(make_inputs(zoo.Case("t", 2, T)), {"chunk_size": chunk, "head_chunk_size": 6})
    _layers_streamed(run, chunk)


@pytest.mark.parametrize("case", ["right_pad", "left_pad", "prompt", "odd13"])
def test_padding_and_prompt_masks(case):
    _, make_inputs = zoo.qwen3_moe()
    inputs = make_inputs(case)
    run = _parity(inputs, {"chunk_size": 5})
    _layers_streamed(run, 5, inputs.T)


# Inductor codegen, with padding and prompts at changing lengths:
# test_dynamic.py::test_forms_every_length_inductor[qwen3_moe].


@pytest.mark.parametrize("top_k", [1, 3])
def test_other_top_k(top_k):
    model, make_inputs = zoo.qwen3_moe(top_k=top_k)
    run = _parity(make_inputs("right_pad"), {"chunk_size": 5}, model)
    _layers_streamed(run, 5)


@pytest.mark.fast
@pytest.mark.heavy
def test_dispatch_is_classed_token_local():
    """The dispatch ops are token-local in the analysis (not merely unstreamed without a word)."""
    model, make_inputs = zoo.qwen3_moe()
    inputs = make_inputs("b1")
    report = streamfx.explain(model, *inputs.args, options={"chunk_size": 5, "codegen": "eager"}, **inputs.kwargs)
    a = report.analyses[0]
    seen = set()
    for n in a.fwd_nodes:
        name = str(n.target)
        if any(name.startswith(op) for op in DISPATCH_OPS) and "integrations/moe.py" in (n.meta.get("stack_trace") or ""):
            seen.add(name.split(".")[0] + "." + name.split(".")[1])
            assert a.classes[n] in (TOKEN_LOCAL, "sequence-free"), (n.format_node(), a.classes[n])
    assert {"aten.sort", "aten.index", "aten.histc", "aten.index_put"} <= seen, seen
    assert sorted(p.name for p in report.plan) == ["head", "layer.0", "layer.1"]


def _sort_graph(fn, *shapes):
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn)(*[torch.randn(s) for s in shapes])
    sd = infer_axes(gm.graph)
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    sd.set_seq(sd.axes[x][0][0][0])
    return gm, sd


def _classes(gm, sd):
    return {n.name: sd.classify(n) for n in gm.graph.nodes if n.op == "call_function"}


@pytest.mark.fast
def test_sorted_rows_that_meet_their_original_order_mix_tokens():
    """x + sort(x) pairs token t with another token: the sort is unknown-mixing."""
    gm, sd = _sort_graph(lambda x: x + torch.sort(x, dim=0).values, (8, 4))
    assert UNKNOWN_MIXING in _classes(gm, sd).values()


@pytest.mark.fast
def test_a_permutation_and_its_inverse_are_token_local():
    def f(x):
        ids = x.sum(-1)
        _, perm = torch.sort(ids)
        y = x[perm] * 2
        inv = torch.empty_like(perm).index_put((perm,), torch.arange(perm.size(0)))
        return y[inv]

    gm, sd = _sort_graph(f, (8, 4))
    classes = _classes(gm, sd)
    assert UNKNOWN_MIXING not in classes.values(), classes


@pytest.mark.fast
def test_gather_by_an_index_of_other_tokens_mixes():
    """x[perm] where perm sorts a different axis (not this sequence's tokens) is not a reordering of
    the chunk's rows."""
    def f(x):
        _, perm = torch.sort(x[:, 0])
        return x[perm.flip(0)]

    gm, sd = _sort_graph(f, (8, 4))
    assert UNKNOWN_MIXING in _classes(gm, sd).values()


@pytest.mark.fast
def test_one_expert_per_token_at_batch_one_streams():
    """Batch 1, one expert per token: the dispatch's flat dim has exactly T elements, on the
    tokens' own axis. The arange its inverse permutation is written from holds positions of the
    layer's rows (read as an index), so each chunk makes its own instead of slicing the whole
    sequence's (whose positions would point outside the chunk)."""
    model, make_inputs = zoo.qwen3_moe(top_k=1)
    run = _parity(make_inputs(zoo.Case("t", 1, T)), {"chunk_size": 5, "strict": True}, model)
    _layers_streamed(run, 5)


@compiling(6)
@example(B=1, length=16, top_k=1, experts=4, chunk=5)
@example(B=1, length=7, top_k=1, experts=2, chunk=3)
@given(B=st.integers(1, 3), length=st.integers(2, 20), top_k=st.integers(1, 3), experts=st.integers(2, 6),
       chunk=st.integers(1, 8))
def test_dispatch_streams_for_any_batch_length_and_routing(B, length, top_k, experts, chunk):
    """Random batch (1 included), length, experts per token (1 included), expert count and chunk
    size: every layer streams under strict=True, and loss and gradients equal eager's."""
    top_k = min(top_k, experts)
    torch._dynamo.reset()
    model, make_inputs = zoo.qwen3_moe(experts=experts, top_k=top_k)
    run = _parity(make_inputs(zoo.Case("p", B, length)), {"chunk_size": chunk, "strict": True}, model)
    _layers_streamed(run, chunk, length)


def _positions(fn, region_from):
    """The axes of ``fn``'s graph (its input's dim 0 the sequence) and the nodes of a region that
    starts at the first node named ``region_from``."""
    gm, sd = _sort_graph(fn, (8, 4))
    start = next(n for n in gm.graph.nodes if n.name == region_from)
    inside, nodes = {start}, [start]
    for n in gm.graph.nodes:
        if n.op == "call_function" and n not in inside and any(x in inside for x in n.all_input_nodes):
            inside.add(n)
            nodes.append(n)
    inputs = [x for n in nodes for x in n.all_input_nodes if x not in inside]
    return gm, sd, nodes, list(dict.fromkeys(inputs))


@pytest.mark.fast
def test_an_arange_read_as_row_positions_is_made_per_chunk():
    """An arange made outside the layer whose values become the inverse permutation of the
    layer's rows is made per chunk (rebuilt at the chunk's length), whatever its size."""
    from streamfx.passes.positions import rebuild_positions

    def f(x):
        h = x * 2
        _, perm = torch.sort(h.sum(-1))
        inv = torch.empty_like(perm).index_put((perm,), torch.arange(x.shape[0]))
        return (h[perm] * 3)[inv]

    gm, sd, nodes, inputs = _positions(f, "mul")
    arange = next(x for x in inputs if x.target is torch.ops.aten.arange.default)
    got_nodes, got_inputs = rebuild_positions(nodes, nodes, inputs, sd)
    assert arange in got_nodes and arange not in got_inputs


@pytest.mark.fast
def test_positions_computed_outside_the_layer_are_refused():
    """A sort's indices computed before the layer and used to gather the layer's rows: sliced per
    chunk they would hold positions of the whole sequence; the layer is refused with that cause."""
    from streamfx.errors import CannotStream
    from streamfx.passes.positions import rebuild_positions

    def f(x):
        _, perm = torch.sort(x.sum(-1))
        h = x * 2
        return h[perm] * 3

    gm, sd, nodes, inputs = _positions(f, "mul")
    with pytest.raises(CannotStream, match="positions along the sequence computed outside the layer"):
        rebuild_positions(nodes, nodes, inputs, sd)


@pytest.mark.parametrize("case", cases(["right_pad", "t", "b1"], ["right_pad"]))
def test_router_aux_loss_streams(case):
    """The load-balancing loss reads every layer's router logits ([B*T, E]: batch and tokens in
    one dim): the residual stream goes on past them, each layer streams and writes its chunk's
    rows of the router logits, the head streams the cross-entropy, and the aux loss (sums over the
    router logits) is exact; nothing warns."""
    model, make_inputs = zoo.qwen3_moe(router_logits=True)
    inputs = make_inputs(zoo.Case("t", 2, T)) if case == "t" else make_inputs(case)
    run = _parity(inputs, {"chunk_size": 5, "head_chunk_size": 6}, model)
    _layers_streamed(run, 5, inputs.T)
    assert set(run.schedules["head"]) == {chunk_count(inputs.T, 6)}, run.schedules
    for got, ref in zip(run.out.router_logits, run.ref_out.router_logits, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(run.out.aux_loss, run.ref_out.aux_loss, rtol=1e-5, atol=1e-7)


@pytest.mark.fast
def test_a_loss_outside_every_head_warns():
    """A graph with a loss whose head does not stream says so, naming the sum and its source line
    and what to change (here the loss reads a layer's inside and the last hidden state through a
    cumsum); gradients stay exact."""
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv, self.o = torch.nn.Embedding(50, 8), torch.nn.Linear(8, 24), torch.nn.Linear(8, 8)

        def layer(self, h):
            q, k, v = self.qkv(h).unsqueeze(1).chunk(3, -1)
            return h + self.o(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(1))

        def forward(self, ids):
            h1 = self.layer(self.emb(ids))
            return (self.layer(h1).cumsum(1) ** 2).sum() + h1.pow(2).sum()

    inputs = zoo.Inputs((torch.randint(0, 50, (2, 12)),), {}, zoo.Case("t", 2, 12), lambda out: out, lambda out: None, 50)
    run = run_eager_and_compiled(Model(), inputs, {"chunk_size": 5})
    assert_grads_match(run.ref_grads, run.grads)
    assert "head" not in run.schedules
    head = [w for w in run.warnings if "region 'head'" in w]
    assert head and "aten.sum" in head[0] and "test_moe.py" in head[0] and "per-token terms" in head[0], run.warnings


def _tiny(config_cls, model_cls, **kw):
    cfg = config_cls(vocab_size=zoo.VOCAB, hidden_size=zoo.HIDDEN, intermediate_size=64, num_hidden_layers=zoo.LAYERS,
                     num_attention_heads=zoo.HEADS, num_key_value_heads=zoo.KV_HEADS, max_position_embeddings=zoo.MAX_POS,
                     tie_word_embeddings=False, pad_token_id=zoo.PAD_ID, **kw)
    return zoo._hf(model_cls, cfg, "sdpa")


def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM
    return _tiny(MixtralConfig, MixtralForCausalLM, head_dim=zoo.HEAD_DIM, num_local_experts=4, num_experts_per_tok=2)


def olmoe():
    from transformers import OlmoeConfig, OlmoeForCausalLM
    return _tiny(OlmoeConfig, OlmoeForCausalLM, num_experts=4, num_experts_per_tok=2)


def qwen2_moe():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    return _tiny(Qwen2MoeConfig, Qwen2MoeForCausalLM, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                 shared_expert_intermediate_size=16, decoder_sparse_step=1, mlp_only_layers=[])


@pytest.mark.parametrize("family", cases([mixtral, olmoe, qwen2_moe], [qwen2_moe]))
def test_other_moe_families_are_exact(family):
    """Mixtral, OLMoE and Qwen2-MoE (a shared expert with a sigmoid gate): exact gradients, every
    layer and the head stream."""
    model = family()
    inputs = zoo._hf_inputs(zoo.VOCAB)("left_pad")
    run = _parity(inputs, {"chunk_size": 5}, model)
    _layers_streamed(run, 5)


def test_eager_expert_loop_is_exact():
    """transformers' eager expert loop (``experts_implementation="eager"``: a Python loop over the
    experts hit, ``torch.where`` of each expert's tokens, ``index_add_``) iterates over data, so
    Dynamo splits the model at it: exact gradients, no internal error, and the attention layers of
    every graph piece stream."""
    model, make_inputs = zoo.qwen3_moe()
    model.config._experts_implementation = "eager"
    assert model.model.layers[0].mlp.experts.config._experts_implementation == "eager"
    run = _parity(make_inputs("right_pad"), {"chunk_size": 5}, model)
    n = chunk_count(T, 5)
    assert run.schedules.get("layer.0") and set(run.schedules["layer.0"]) == {n}, run.schedules
    # one layer region per graph piece (the loop splits the model inside each layer's MoE block),
    # each asked for its schedule four times over a forward and backward, as in a one-graph model
    assert len(run.schedules["layer.0"]) == 4 * zoo.LAYERS, run.schedules
    assert run.schedules.get("head"), run.schedules


def test_group_limited_routing_streams():
    """DeepSeek-V3's routing (transformers' DeepseekV3ForCausalLM from a tiny config): expert
    groups scored per token, a mask scattered into ``zeros_like(group_scores)``, top-k over the
    masked scores, then the grouped dispatch. The scattered mask keeps the tokens' axis of its
    index, so every layer (the dense first one and the MoE one) and the head stream, exactly."""
    import arch_sweep

    result = arch_sweep.check("deepseek_v3")
    assert result["status"] == "ok" and result["error"] is None, result
    assert result["warnings"] == [], result["warnings"]
    assert result["streamed"] == [f"layer.{i}" for i in range(result["layers"])] + ["head"], result
    # fp32 (kv_boundary="auto"): the per-head keys and values hold less than the latent plus
    # what each chunk would rebuild from it
    assert result["kv_latent"] == [], result
    assert result["loss_err"] <= 1e-5 and result["grad_err"] <= 1e-4, result


def test_complex_rotary_streams():
    """DeepSeek-V2 (transformers' DeepseekV2ForCausalLM from a tiny config): its rotary embedding
    multiplies query and key in complex form (``view_as_complex`` of [..., 2] pairs, a complex
    product, ``view_as_real`` back), all per token. Every layer (MLA attention, the MoE) and the
    head stream, exactly, with the K/V graph ending at MLA's latent."""
    import arch_sweep

    result = arch_sweep.check("deepseek_v2", {"kv_boundary": "latent"})
    assert result["status"] == "ok" and result["error"] is None, result
    assert result["warnings"] == [], result["warnings"]
    assert result["streamed"] == [f"layer.{i}" for i in range(result["layers"])] + ["head"], result
    # MLA with kv_boundary="latent": the K/V graph keeps the compressed latent and the rotary
    # key, not the per-head keys and values
    assert result["kv_latent"] == [f"layer.{i}" for i in range(result["layers"])], result
    assert result["loss_err"] <= 1e-5 and result["grad_err"] <= 1e-4, result


# the families whose grouped dispatch has exactly T token-expert pairs at batch 1 with one expert per token
TOP1_FAMILIES = ("qwen3_moe", "mixtral", "granitemoe", "deepseek_v3", "gpt_oss", "olmoe", "qwen2_moe")


@pytest.mark.slow
@pytest.mark.parametrize("family", cases(TOP1_FAMILIES, ["qwen3_moe", "mixtral", "deepseek_v3"]))
def test_one_expert_per_token_at_batch_one_in_hf_families(family):
    """Hugging Face MoE families from tiny configs with one expert per token, batch 1 (the
    dispatch's flat dim has exactly T elements and its sort indices are positions in the whole
    sequence): every layer streams under strict=True, and loss and gradients equal eager's."""
    import arch_configs

    text = arch_configs.tiny_config(family)
    text = text.get_text_config() if hasattr(text, "get_text_config") else text
    keys = {k: 1 for k in arch_configs.TOP_K_KEYS if getattr(text, k, None) is not None}
    assert keys, f"{family}: no top-k key in its config"
    model = arch_configs.build(family, "eager" if family == "gpt_oss" else "sdpa", **keys)  # (gpt-oss: no SDPA)
    batch = arch_configs.inputs(model, B=1, T=T, seed=0)
    inputs = zoo.Inputs((), batch, zoo.Case("t", 1, T), lambda o: o.loss, lambda o: o.logits, 0)
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "strict": True})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    # with one expert per token a router that renormalises its top-k weights gives the chosen
    # expert weight 1 whatever the logits: the router's gradient is zero, and eager's is rounding
    # noise (~1e-10); such a gradient must be noise in the streamed step too
    largest = max(g.abs().max().item() for g in run.ref_grads.values() if g is not None)
    noise = {n for n, g in run.ref_grads.items() if g is not None and g.abs().max().item() < 1e-7 * largest}
    for n in noise:
        assert run.grads[n].abs().max().item() < 1e-7 * largest, (n, run.grads[n].abs().max().item(), largest)
    assert len(noise) < len(run.ref_grads) // 4, sorted(noise)
    assert_grads_match({n: g for n, g in run.ref_grads.items() if n not in noise},
                       {n: g for n, g in run.grads.items() if n not in noise})
    _layers_streamed(run, 5, n_layers=model.config.get_text_config().num_hidden_layers)

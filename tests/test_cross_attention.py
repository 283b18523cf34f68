"""Cross-attention: queries along the sequence, keys and values from other positions (an encoder's
output, image features). It combines nothing along the queries, so a decoder layer that holds it
streams like any other: each chunk's queries read every key of the other positions. A causal
cross-attention (the query's position decides which keys it sees) and attention from other
positions onto the sequence (latents reading the tokens) combine positions along it: refused,
exact. An encoder-decoder streams its decoder's layers and its head; its encoder's attention is
over other positions than the loss's and runs whole.

Every case is compared with eager autograd on the same weights (``conftest``).
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import assert_grads_match, run_eager_and_compiled
from tiers import cases

OPTIONS = {"codegen": "eager", "chunk_size": 5, "head_chunk_size": 5}
T, S, D, VOCAB = 16, 7, 32, 64


class Attention(nn.Module):
    def __init__(self, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.kv, self.o = nn.Linear(D, D), nn.Linear(D, 2 * D), nn.Linear(D, D)

    def forward(self, x, states=None, causal=True, mask=None):
        B, L, _ = x.shape
        src = x if states is None else states
        q = self.q(x).view(B, L, self.heads, -1).transpose(1, 2)
        k, v = self.kv(src).view(B, src.shape[1], 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        return self.o(out.transpose(1, 2).reshape(B, L, D))


class Block(nn.Module):
    """Causal self-attention, then attention from the tokens to ``states`` (``form`` "cross"),
    or from learned latents to the tokens and back ("latents"), then an MLP."""

    def __init__(self, form):
        super().__init__()
        self.form = form
        self.n1, self.n2, self.n3 = nn.LayerNorm(D), nn.LayerNorm(D), nn.LayerNorm(D)
        self.self_attn, self.cross = Attention(), Attention()
        self.latents = nn.Parameter(torch.randn(1, 3, D)) if form == "latents" else None
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))

    def forward(self, x, states, mask, causal_cross):
        x = x + self.self_attn(self.n1(x))
        h = self.n2(x)
        if self.form == "latents":   # (the latents read every token: a summary of the whole sequence)
            summary = self.cross(self.latents.expand(x.shape[0], -1, -1), h, causal=False)
            x = x + self.cross(h, summary, causal=False)
        else:
            x = x + self.cross(h, states, causal=causal_cross, mask=mask)
        return x + self.mlp(self.n3(x))


class Decoder(nn.Module):
    def __init__(self, form="cross", causal_cross=False):
        super().__init__()
        torch.manual_seed(0)
        self.causal_cross = causal_cross
        self.embed, self.project = nn.Embedding(VOCAB, D), nn.Linear(24, D)
        self.blocks = nn.ModuleList(Block(form) for _ in range(2))
        self.norm, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB)

    def forward(self, ids, features, labels, mask=None):
        states = self.project(features)   # (the other positions get gradients too)
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, states, mask, self.causal_cross)
        return F.cross_entropy(self.head(self.norm(x)).flatten(0, 1), labels.flatten())


class Inputs:
    def __init__(self, args, kwargs=None, loss_of=lambda out: out):
        self.args, self.kwargs, self.loss_of, self.T = args, kwargs or {}, loss_of, T


def plain_inputs(mask=None):
    g = torch.Generator().manual_seed(1)
    ids, labels = torch.randint(0, VOCAB, (2, T), generator=g), torch.randint(0, VOCAB, (2, T), generator=g)
    features = torch.randn(2, S, 24, generator=g)
    if mask == "bool":    # the second row's last two states are padding
        mask = torch.ones(2, 1, 1, S, dtype=torch.bool)
        mask[1, ..., -2:] = False
    elif mask == "float":
        mask = torch.zeros(2, 1, 1, S)
        mask[1, ..., -2:] = float("-inf")
    return Inputs((ids, features, labels, mask))


@pytest.mark.fast
@pytest.mark.parametrize("mask, codegen", cases([(m, c) for m in (None, "bool", "float") for c in ("eager", "inductor")],
                                                [(None, "eager"), (None, "inductor"), ("bool", "eager"), ("float", "eager")],
                                                fast=[(None, "eager"), ("bool", "eager"), ("float", "eager")]))
def test_cross_attention_to_other_states_streams(mask, codegen):
    """Decoder layers whose cross-attention reads projected features (with a padding mask on
    them, boolean or additive, or none) stream, each chunk's queries against all the states;
    the head streams; gradients (the projection's included) as eager's; nothing said."""
    run = run_eager_and_compiled(Decoder(), plain_inputs(mask), {**OPTIONS, "codegen": codegen})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-6, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert not run.warnings, run.warnings
    assert run.schedules == {"layer.0": [4] * 4, "layer.1": [4] * 4, "head": [4]}, run.schedules


@pytest.mark.fast
@pytest.mark.parametrize("form", ["causal_cross", "latents"])
def test_cross_attention_that_combines_positions_along_the_sequence_is_refused(form):
    """A causal cross-attention (which states a query sees depends on its position) and latents
    that read every token combine positions along the sequence: the layers run unstreamed, said
    with the attention's op and line; the head streams; exact."""
    model = Decoder("latents") if form == "latents" else Decoder(causal_cross=True)
    run = run_eager_and_compiled(model, plain_inputs(), OPTIONS)
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-6, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    # (the latents' summary is an attention site of its own: each block's causal self-attention
    # is a layer region before it, which streams)
    streamed = ["layer.0", "layer.2"] if form == "latents" else []
    assert run.schedules == {**{k: [4] * 4 for k in streamed}, "head": [4]}, run.schedules
    said = " ".join(run.warnings)
    assert "is not streamed" in said and "scaled_dot_product" in said and "out = F.scaled_dot_product_attention(" \
        in said, said


def _bart(**extra):
    import transformers

    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=VOCAB, d_model=D, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, use_cache=False, attn_implementation="sdpa",
        **extra)
    return config


def encoder_decoder(name):
    import transformers

    torch.manual_seed(0)
    if name == "bart":
        model = transformers.BartForConditionalGeneration(_bart())
    else:
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=VOCAB, d_model=D, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
            dropout_rate=0.0, decoder_start_token_id=0, attn_implementation="sdpa"))
    g = torch.Generator().manual_seed(1)
    source, labels = torch.randint(0, VOCAB, (2, S), generator=g), torch.randint(0, VOCAB, (2, T), generator=g)
    attention_mask = torch.ones(2, S, dtype=torch.long)
    attention_mask[1, -2:] = 0
    kwargs = dict(input_ids=source, attention_mask=attention_mask, labels=labels, use_cache=False)
    return model.train(), Inputs((), kwargs, lambda out: out.loss)


@pytest.mark.fast
@pytest.mark.parametrize("name", [pytest.param("bart", marks=pytest.mark.heavy), "t5"])
def test_encoder_decoder_streams_its_decoder_and_head(name):
    """Hugging Face encoder-decoders (BART, whose decoder's LayerDrop draw breaks Dynamo's graph on
    transformers 5.17, so it runs in the default tier; T5, with its learned relative position bias): the loss
    is over the decoder's tokens, so the sequence is the decoder's: its layers (self-attention
    and cross-attention to the padded encoder output) and the head stream; the encoder's
    bidirectional attention is over other positions and runs whole, said once; exact."""
    model, inputs = encoder_decoder(name)
    run = run_eager_and_compiled(model, inputs, OPTIONS)
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-6, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert run.schedules == {"layer.0": [4] * 4, "layer.1": [4] * 4, "head": [4]}, run.schedules
    [said] = run.warnings
    assert "attention over other positions than the sequence the loss is over (an encoder's" in said, said


@pytest.mark.fast
def test_a_decoder_given_encoder_states_streams():
    """A decoder-only model with cross-attention layers called with an encoder's states and their
    padding mask (GPT-2 with add_cross_attention): every layer and the head stream; exact."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=D, n_layer=2, n_head=4, n_positions=64,
                                     add_cross_attention=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     use_cache=False, attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(config).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, T), generator=g)
    states = torch.randn(2, S, D, generator=g)
    mask = torch.ones(2, S, dtype=torch.long)
    mask[1, -2:] = 0
    kwargs = dict(input_ids=ids, encoder_hidden_states=states, encoder_attention_mask=mask, labels=ids)
    run = run_eager_and_compiled(model, Inputs((), kwargs, lambda out: out.loss), OPTIONS)
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-6, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert not run.warnings, run.warnings
    assert run.schedules == {"layer.0": [4] * 4, "layer.1": [4] * 4, "head": [4]}, run.schedules


def test_mllama_with_images_streams_its_text_layers():
    """Llama 3.2 Vision (Mllama) with an image: its cross-attention decoder layers (no self-
    attention: they read the vision tower's states under a per-token cross-attention mask) stream
    inside the regions of the self-attention layers before them, every text layer and the head
    streaming; the vision tower's attention runs whole, said once; exact."""
    import transformers

    torch.manual_seed(0)
    vision = transformers.MllamaVisionConfig(
        hidden_size=D, intermediate_size=64, num_hidden_layers=2, num_global_layers=1, attention_heads=4,
        image_size=28, patch_size=14, max_num_tiles=1, vision_output_dim=64, intermediate_layers_indices=[0],
        supported_aspect_ratios=[[1, 1]])
    text = transformers.MllamaTextConfig(
        vocab_size=128, hidden_size=D, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, cross_attention_layers=[1, 3], max_position_embeddings=64, pad_token_id=0,
        bos_token_id=1, eos_token_id=2)
    config = transformers.MllamaConfig(vision_config=vision, text_config=text, image_token_index=127)
    config._attn_implementation = "sdpa"
    model = transformers.MllamaForConditionalGeneration(config).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 120, (2, T), generator=g)
    ids[:, 1] = 127   # the image token
    seen = torch.zeros(2, T, 1, 1, dtype=torch.long)
    seen[:, 1:] = 1    # the tokens from the image token on see the image
    kwargs = dict(input_ids=ids, pixel_values=torch.randn(2, 1, 1, 3, 28, 28, generator=g),
                  aspect_ratio_ids=torch.ones(2, 1, dtype=torch.long), aspect_ratio_mask=torch.ones(2, 1, 1, dtype=torch.long),
                  cross_attention_mask=seen, labels=ids, use_cache=False)
    run = run_eager_and_compiled(model, Inputs((), kwargs, lambda out: out.loss), OPTIONS)
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-6, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    # (two regions: each self-attention layer with the cross-attention layer after it)
    assert run.schedules == {"layer.0": [4] * 4, "layer.1": [4] * 4, "head": [4]}, run.schedules
    [said] = run.warnings
    assert "attention over other positions than the sequence the loss is over" in said, said

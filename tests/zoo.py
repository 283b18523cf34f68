"""A zoo of tiny causal LMs for end-to-end tests of the streambp backend.

Every factory returns ``(model, make_inputs)``:
  model:        an fp32 ``nn.Module`` with deterministic (``torch.manual_seed``) random weights, in
                train mode (dropout is 0 everywhere), ``use_cache=False`` for Hugging Face models.
  make_inputs:  ``make_inputs(case) -> Inputs``; ``case`` is one of ``CASES`` (or a custom
                ``Case``). ``Inputs`` carries the call's args/kwargs and knows how to read the loss
                and the logits from that model's output (HF ``ModelOutput`` or a plain tuple).

Cases (``CASES``):
  b1          B=1, T=16, every label counts
  right_pad   B=2, T=16; row 1 ends with 5 padding tokens (attention_mask 0, labels -100)
  left_pad    B=2, T=16; row 1 starts with 5 padding tokens (attention_mask 0, labels -100)
  prompt      B=2, T=16; labels -100 over the prompt span [2, 11) of both rows: with head chunks
              of 4 tokens the span starts inside a chunk and crosses chunk boundaries
  odd13       B=2, T=13
  odd17       B=1, T=17
Plain PyTorch models take no attention mask: their padding cases only mask the labels.

Hugging Face models shift the labels inside their loss (labels[t + 1] scores logits[t]); the
plain models shift inside ``forward`` too (nanoGPT takes already-shifted targets, as nanoGPT does).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 96
HIDDEN = 32
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
LAYERS = 2
MAX_POS = 64
PAD_ID = 0


# ---- cases --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    B: int
    T: int
    pad: str | None = None              # None | "right" | "left"
    n_pad: int = 5
    ignore: tuple | None = None         # (start, end): labels -100 over [start, end) in every row
    seed: int = 1234


CASES = {
    "b1": Case("b1", 1, 16),
    "right_pad": Case("right_pad", 2, 16, pad="right"),
    "left_pad": Case("left_pad", 2, 16, pad="left"),
    "prompt": Case("prompt", 2, 16, ignore=(2, 11)),
    "odd13": Case("odd13", 2, 13),
    "odd17": Case("odd17", 1, 17),
}


def tokens(case: Case, vocab: int = VOCAB):
    """(input_ids, attention_mask, labels) of a case: labels = input_ids with -100 where ignored."""
    g = torch.Generator().manual_seed(case.seed)
    ids = torch.randint(1, vocab, (case.B, case.T), generator=g)
    mask = torch.ones(case.B, case.T, dtype=torch.long)
    if case.pad == "right":
        mask[-1, case.T - case.n_pad:] = 0
    elif case.pad == "left":
        mask[-1, : case.n_pad] = 0
    ids = ids.masked_fill(mask == 0, PAD_ID)
    labels = ids.masked_fill(mask == 0, -100)
    if case.ignore is not None:
        s, e = case.ignore
        labels[:, s:e] = -100
    return ids, mask, labels


@dataclasses.dataclass
class Inputs:
    args: tuple
    kwargs: dict
    case: Case
    loss_of: Callable[[Any], torch.Tensor]
    logits_of: Callable[[Any], torch.Tensor | None]
    vocab: int

    @property
    def B(self) -> int:
        return self.case.B

    @property
    def T(self) -> int:
        return self.case.T


def _case(case) -> Case:
    return CASES[case] if isinstance(case, str) else case


def _hf_inputs(vocab: int, use_mask: bool = True):
    def make_inputs(case, **extra) -> Inputs:
        case = _case(case)
        ids, mask, labels = tokens(case, vocab)
        kwargs = dict(input_ids=ids, labels=labels)
        if use_mask and case.pad is not None:
            kwargs["attention_mask"] = mask
        kwargs.update(extra)
        return Inputs((), kwargs, case, lambda o: o.loss, lambda o: o.logits, vocab)

    return make_inputs


# ---- Hugging Face models ---------------------------------------------------------------------
def _hf(model_cls, config, attn: str):
    config.use_cache = False
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = model_cls(config).float().train()
    assert model.config._attn_implementation == attn, model.config._attn_implementation
    return model


def qwen3(attn: str = "sdpa"):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                      max_position_embeddings=MAX_POS, tie_word_embeddings=False, pad_token_id=PAD_ID)
    return _hf(Qwen3ForCausalLM, cfg, attn), _hf_inputs(VOCAB)


def qwen3_sdpa():
    return qwen3("sdpa")


def qwen3_eager():
    return qwen3("eager")


def llama_tied(attn: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                      max_position_embeddings=MAX_POS, tie_word_embeddings=True, pad_token_id=PAD_ID)
    model = _hf(LlamaForCausalLM, cfg, attn)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model, _hf_inputs(VOCAB)


def mistral_sliding(attn: str = "sdpa", window: int = 5):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                        max_position_embeddings=MAX_POS, sliding_window=window, tie_word_embeddings=False,
                        pad_token_id=PAD_ID)
    model = _hf(MistralForCausalLM, cfg, attn)
    assert model.config.sliding_window == window
    return model, _hf_inputs(VOCAB)


def gemma3(attn: str = "eager", window: int = 4, softcap: float = 3.0):
    """Gemma3 text: layer 0 sliding (window 4 < T), layer 1 global; final logit softcapping."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                           max_position_embeddings=MAX_POS, sliding_window=window, query_pre_attn_scalar=HEAD_DIM,
                           layer_types=["sliding_attention", "full_attention"],
                           final_logit_softcapping=softcap, pad_token_id=PAD_ID)
    model = _hf(Gemma3ForCausalLM, cfg, attn)
    assert model.config.final_logit_softcapping == softcap
    assert list(model.config.layer_types) == ["sliding_attention", "full_attention"]
    return model, _hf_inputs(VOCAB)


def gpt2(attn: str = "sdpa"):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=MAX_POS,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=PAD_ID)
    return _hf(GPT2LMHeadModel, cfg, attn), _hf_inputs(VOCAB)


EXPERTS = 4
TOP_K = 2


def moe_streams() -> bool:
    """Whether fp32 MoE layers can stream with the installed transformers: from 5.24 its
    ``grouped_mm_fallback`` (the expert matmul for weights other than bf16 under torch.compile) has
    a backward op of its own; before, the backward reads ``offs.tolist()``, no compile can hold it,
    and streamfx names that cause (tests/test_untraceable.py)."""
    import transformers.integrations.moe  # noqa: F401 - registers transformers' ops

    return hasattr(torch.ops.transformers, "grouped_mm_fallback_backward")


def qwen3_moe(attn: str = "sdpa", experts: int = EXPERTS, top_k: int = TOP_K, router_logits: bool = False):
    """Qwen3-MoE: every layer a mixture of ``experts`` (top-``top_k`` routing, transformers'
    grouped expert dispatch: a sort of token-expert pairs by expert, grouped matmuls, the inverse
    permutation); ``router_logits``: the load-balancing auxiliary loss is added to the loss."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         head_dim=HEAD_DIM, num_experts=experts, num_experts_per_tok=top_k, decoder_sparse_step=1,
                         mlp_only_layers=[], max_position_embeddings=MAX_POS, tie_word_embeddings=False,
                         output_router_logits=router_logits, router_aux_loss_coef=0.01, pad_token_id=PAD_ID)
    model = _hf(Qwen3MoeForCausalLM, cfg, attn)
    assert model.config.num_experts == experts and model.config.num_experts_per_tok == top_k
    assert model.config._experts_implementation == "grouped_mm", model.config._experts_implementation
    return model, _hf_inputs(VOCAB)


class CountedExperts(nn.Module):
    """A mixture of experts that counts its tokens per expert (JetMoE's and ScatterMoE's
    dispatch): the one-hot of each token's ``top_k`` experts summed over the tokens and read with
    ``.tolist()``, the token-expert pairs sorted by expert, their tokens gathered and split into
    one group per expert by those counts, a matmul per group, the groups put back together by
    ``cat`` and added to their tokens with ``index_add``. ``count="one_hot"`` counts with
    ``F.one_hot`` instead of a scatter."""

    def __init__(self, d, hidden, experts, top_k, count="scatter"):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.w_in = nn.Parameter(torch.randn(experts, 2 * hidden, d) * d ** -0.5)
        self.w_out = nn.Parameter(torch.randn(experts, d, hidden) * hidden ** -0.5)
        self.experts, self.top_k, self.count = experts, top_k, count

    def _per_expert(self, x, sizes, w):
        return torch.cat([F.linear(group, w[i]) for i, group in enumerate(x.split(sizes, dim=0))], dim=0)

    def forward(self, x):
        B, T, d = x.shape
        x = x.reshape(-1, d)
        top_logits, top_idx = self.router(x).float().topk(self.top_k, dim=1)
        gates = torch.softmax(top_logits, dim=1).type_as(x)
        if self.count == "one_hot":
            counts = F.one_hot(top_idx, self.experts).sum((0, 1))
        else:
            counts = x.new_zeros(x.shape[0], self.experts).scatter(1, top_idx, 1).long().sum(0)
        sizes = counts.tolist()
        _, order = top_idx.flatten().sort(0)
        token = order.div(self.top_k, rounding_mode="trunc")
        h = self._per_expert(x[token], sizes, self.w_in)
        a, b = h.chunk(2, dim=-1)
        y = self._per_expert(F.silu(a) * b, sizes, self.w_out) * gates.flatten()[order][:, None]
        return torch.zeros_like(x).index_add(0, token, y).view(B, T, d)


def counted_moe(experts: int = EXPERTS, top_k: int = TOP_K, count: str = "scatter"):
    """TinyLlama whose MLPs are ``CountedExperts``; its ``.tolist()`` needs Dynamo's
    ``capture_scalar_outputs`` to compile whole."""
    torch.manual_seed(0)
    model = TinyLlama().train()
    for block in model.layers:
        block.mlp = CountedExperts(HIDDEN, 24, experts, top_k, count)
    return model, _plain_inputs(VOCAB)


# ---- plain PyTorch: nanoGPT ----------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, d, n_head, block_size):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.n_head = n_head
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head, block_size)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, vocab=VOCAB, d=HIDDEN, n_head=HEADS, n_layer=LAYERS, block_size=MAX_POS):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d),
            wpe=nn.Embedding(block_size, d),
            h=nn.ModuleList([Block(d, n_head, block_size) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(d),
        ))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.vocab = vocab

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-100)
        return logits, loss


def nanogpt():
    torch.manual_seed(0)
    model = NanoGPT().float().train()

    def make_inputs(case) -> Inputs:
        case = _case(case)
        ids, _, labels = tokens(case)
        targets = torch.cat([labels[:, 1:], torch.full((case.B, 1), -100)], dim=1)  # next-token targets
        return Inputs((ids, targets), {}, case, lambda o: o[1], lambda o: o[0], VOCAB)

    return model, make_inputs


# ---- plain PyTorch: Llama-style ----------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, d, n_head, n_kv, head_dim, gqa="repeat"):
        super().__init__()
        self.n_head, self.n_kv, self.hd, self.gqa = n_head, n_kv, head_dim, gqa
        self.q_proj = nn.Linear(d, n_head * head_dim, bias=False)
        self.k_proj = nn.Linear(d, n_kv * head_dim, bias=False)
        self.v_proj = nn.Linear(d, n_kv * head_dim, bias=False)
        self.o_proj = nn.Linear(n_head * head_dim, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.gqa == "native":  # grouped K/V heads handed to the kernel as they are
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            rep = self.n_head // self.n_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    def __init__(self, d, n_head, n_kv, head_dim, ffn, gqa="repeat"):
        super().__init__()
        self.attn_norm = RMSNorm(d)
        self.attn = LlamaAttention(d, n_head, n_kv, head_dim, gqa)
        self.mlp_norm = RMSNorm(d)
        self.mlp = SwiGLU(d, ffn)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class TinyLlama(nn.Module):
    """RMSNorm, RoPE (cos/sin buffers), GQA, SDPA(is_causal=True), SwiGLU, untied head.

    ``forward(idx, labels)`` returns ``(loss, logits)``; the label shift happens inside:
    ``shift="labels"`` shifts the labels the way HF's loss does (pad with -100, drop the first),
    ``shift="logits"`` is the classic ``logits[:, :-1]`` / ``labels[:, 1:]``.
    """

    def __init__(self, vocab=VOCAB, d=HIDDEN, n_head=HEADS, n_kv=KV_HEADS, n_layer=LAYERS, ffn=64,
                 max_pos=MAX_POS, theta=10000.0, shift="labels", gqa="repeat"):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        hd = d // n_head
        self.layers = nn.ModuleList(LlamaBlock(d, n_head, n_kv, hd, ffn, gqa) for _ in range(n_layer))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(max_pos).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.vocab, self.shift = vocab, shift

    def forward(self, idx, labels=None):
        B, T = idx.shape
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        loss = None
        if labels is not None:
            if self.shift == "logits":
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, self.vocab), labels[:, 1:].reshape(-1),
                                       ignore_index=-100)
            else:
                shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
                loss = F.cross_entropy(logits.reshape(-1, self.vocab).float(), shifted.reshape(-1),
                                       ignore_index=-100)
        return loss, logits


def _plain_inputs(vocab):
    def make_inputs(case) -> Inputs:
        case = _case(case)
        ids, _, labels = tokens(case, vocab)
        return Inputs((ids, labels), {}, case, lambda o: o[0], lambda o: o[1], vocab)

    return make_inputs


def tiny_llama(shift: str = "labels", gqa: str = "repeat"):
    torch.manual_seed(0)
    return TinyLlama(shift=shift, gqa=gqa).float().train(), _plain_inputs(VOCAB)


def tiny_llama_gqa():
    """TinyLlama handing its 2 K/V heads to SDPA with ``enable_gqa=True`` (4 query heads)."""
    return tiny_llama(gqa="native")


def tiny_llama_logit_shift():
    return tiny_llama(shift="logits")


# ---- registry ------------------------------------------------------------------------------------
ZOO: dict[str, Callable] = {
    "qwen3_sdpa": qwen3_sdpa,
    "qwen3_eager": qwen3_eager,
    "llama_tied": llama_tied,
    "mistral_sliding": mistral_sliding,
    "gemma3": gemma3,
    "gpt2": gpt2,
    "qwen3_moe": qwen3_moe,
    "nanogpt": nanogpt,
    "tiny_llama": tiny_llama,
    "tiny_llama_gqa": tiny_llama_gqa,
}
HF_MODELS = ("qwen3_sdpa", "qwen3_eager", "llama_tied", "mistral_sliding", "gemma3", "gpt2")


# ---- attention forms: sinks, ALiBi, chunked attention, MLA ------------------------------
class FormAttention(nn.Module):
    """Eager attention over per-head Q, K, V with one of the attention forms of ``FormLM``."""

    def __init__(self, d, n_head, form, chunk=4):
        super().__init__()
        self.n_head, self.hd, self.form, self.chunk = n_head, d // n_head, form, chunk
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        if form == "sinks":  # gpt-oss: a learned logit per head in every row's softmax denominator
            self.sinks = nn.Parameter(torch.randn(n_head))

    def forward(self, x, bias):
        B, T, d = x.shape
        q, k, v = (t.view(B, T, self.n_head, self.hd).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        scale = 1.0 / math.sqrt(self.hd)
        if self.form in ("chunked", "sdpa_alibi", "learned_alibi", "head_windows"):
            # Llama 4: bias is a boolean [T, T] mask (causal, within C-token blocks); ALiBi over
            # SDPA: a float [H, T, T] mask, causal with a per-head linear bias on the keys it lets
            # through; head windows: a boolean [H, T, T] mask, plain causal for head 0 only
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        elif self.form == "alibi":  # Bloom: the per-key bias is baddbmm's input, [B*H, 1, T]
            s = torch.baddbmm(bias, q.reshape(B * self.n_head, T, self.hd),
                              k.reshape(B * self.n_head, T, self.hd).transpose(1, 2), beta=1.0, alpha=scale)
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            s = s.view(B, self.n_head, T, T).masked_fill(~causal, torch.finfo(s.dtype).min)
            y = torch.softmax(s, -1) @ v
        else:  # sinks
            s = (q @ k.transpose(-2, -1)) * scale + bias
            sink = self.sinks.view(1, -1, 1, 1).expand(B, -1, T, -1)
            s = torch.cat([s, sink], dim=-1)
            s = s - s.max(dim=-1, keepdim=True).values
            p = torch.softmax(s, dim=-1)[..., :-1]
            y = p @ v
        return self.o(y.transpose(1, 2).reshape(B, T, d))


class FormBlock(nn.Module):
    def __init__(self, d, n_head, form):
        super().__init__()
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.attn = FormAttention(d, n_head, form)
        self.mlp = SwiGLU(d, 2 * d)

    def forward(self, x, bias):
        x = x + self.attn(self.n1(x), bias)
        return x + self.mlp(self.n2(x))


class FormLM(nn.Module):
    """A small causal LM whose layers use one attention form: "sinks" (gpt-oss), "alibi" (Bloom:
    a per-key linear bias from baddbmm), "chunked" (Llama 4: queries see earlier keys of their own
    ``chunk``-token block), "sdpa_alibi" (a float causal mask with ALiBi's per-head bias, to
    SDPA), "learned_alibi" (the same with trained slopes), "head_windows" (a sliding window per
    head, none for head 0). ``forward(idx, labels)`` returns ``(loss, logits)``, labels shifted
    inside as in ``TinyLlama``."""

    def __init__(self, form, vocab=VOCAB, d=HIDDEN, n_head=HEADS, n_layer=LAYERS, chunk=4):
        super().__init__()
        self.form, self.n_head, self.chunk, self.vocab = form, n_head, chunk, vocab
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(FormBlock(d, n_head, form) for _ in range(n_layer))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("slopes", 2.0 ** (-8.0 * torch.arange(1, n_head + 1) / n_head), persistent=False)
        if form == "learned_alibi":   # the slopes trained: the mask needs a gradient
            self.learned = nn.Parameter(self.slopes.clone())

    def bias(self, B, T, device):
        pos = torch.arange(T, device=device)
        if self.form == "chunked":
            return (pos[None, :] <= pos[:, None]) & (pos[None, :] // self.chunk == pos[:, None] // self.chunk)
        if self.form == "alibi":
            return (self.slopes[:, None, None] * pos.float()[None, None, :]).repeat(B, 1, 1)
        if self.form == "head_windows":   # head 0 sees every earlier key, head h the last 1 + 2h
            distance = pos[:, None] - pos[None, :]
            heads = torch.arange(self.n_head, device=device)[:, None, None]
            return (distance >= 0) & ((heads == 0) | (distance <= 2 * heads))
        if self.form in ("sdpa_alibi", "learned_alibi"):
            slopes = self.learned if self.form == "learned_alibi" else self.slopes
            distance = (pos[:, None] - pos[None, :]).float()
            return (-slopes[:, None, None] * distance).masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        causal = pos[None, :] <= pos[:, None]
        return torch.zeros(T, T, device=device).masked_fill(~causal, float("-inf"))

    def forward(self, idx, labels=None):
        B, T = idx.shape
        x = self.embed(idx)
        bias = self.bias(B, T, idx.device)
        for layer in self.layers:
            x = layer(x, bias)
        logits = self.lm_head(self.norm(x))
        loss = None
        if labels is not None:
            shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
            loss = F.cross_entropy(logits.reshape(-1, self.vocab), shifted.reshape(-1), ignore_index=-100)
        return loss, logits


def form_lm(form):
    torch.manual_seed(0)
    return FormLM(form).float().train(), _plain_inputs(VOCAB)


def sinks():
    return form_lm("sinks")


def alibi():
    return form_lm("alibi")


def chunked():
    return form_lm("chunked")


def falcon(attn: str = "sdpa"):
    """Falcon 7B layout: multi-query attention read as ``qkv[..., [-2], :]``, parallel attention."""
    from transformers import FalconConfig, FalconForCausalLM

    cfg = FalconConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                       multi_query=True, new_decoder_architecture=False, parallel_attn=True, alibi=False,
                       bias=False, max_position_embeddings=MAX_POS, pad_token_id=PAD_ID)
    return _hf(FalconForCausalLM, cfg, attn), _hf_inputs(VOCAB)


def bloom():
    """Bloom: ALiBi from the attention mask's cumulative sum, scores by ``baddbmm``."""
    from transformers import BloomConfig, BloomForCausalLM

    cfg = BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS, pad_token_id=PAD_ID,
                      hidden_dropout=0.0, attention_dropout=0.0)
    return _hf(BloomForCausalLM, cfg, "eager"), _hf_inputs(VOCAB)


FORMS = {"sinks": sinks, "alibi": alibi, "chunked": chunked, "falcon": falcon, "bloom": bloom,
         **{form: functools.partial(form_lm, form) for form in ("sdpa_alibi", "learned_alibi", "head_windows")}}


class MLAAttention(nn.Module):
    """DeepSeek-V3 multi-head latent attention: K/V come from a per-token latent (kv_lora_rank r)
    plus one decoupled rotary key shared by the heads; the key is assembled per head by writing
    the no-rope and rope parts into an empty tensor (``slice_scatter``), then SDPA."""

    def __init__(self, d, n_head, r=8, dn=8, dr=4, dv=8, assemble="scatter"):
        super().__init__()
        self.h, self.r, self.dn, self.dr, self.dv, self.assemble = n_head, r, dn, dr, dv, assemble
        self.q_proj = nn.Linear(d, n_head * (dn + dr), bias=False)
        self.kv_a = nn.Linear(d, r + dr, bias=False)
        self.kv_norm = RMSNorm(r)
        self.kv_b = nn.Linear(r, n_head * (dn + dv), bias=False)
        self.o = nn.Linear(n_head * dv, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.dn + self.dr).transpose(1, 2)
        q_pass, q_rot = q.split([self.dn, self.dr], -1)
        latent, k_rot = self.kv_a(x).split([self.r, self.dr], -1)
        kv = self.kv_b(self.kv_norm(latent)).view(B, T, self.h, self.dn + self.dv).transpose(1, 2)
        k_pass, v = kv.split([self.dn, self.dv], -1)
        k_rot = k_rot.view(B, 1, T, self.dr)
        q_rot = q_rot * cos + rotate_half(q_rot) * sin
        k_rot = k_rot * cos + rotate_half(k_rot) * sin
        q = torch.cat([q_pass, q_rot], -1)
        if self.assemble == "cat":  # as transformers' DeepseekV3Attention writes it
            key = torch.cat([k_pass, k_rot.expand(B, self.h, T, self.dr)], -1)
        else:
            key = k_pass.new_empty(B, self.h, T, self.dn + self.dr)
            key[..., : self.dn] = k_pass
            key[..., self.dn:] = k_rot
        y = F.scaled_dot_product_attention(q, key, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


class MLABlock(nn.Module):
    def __init__(self, d, n_head, **attn):
        super().__init__()
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.attn = MLAAttention(d, n_head, **attn)
        self.mlp = SwiGLU(d, 2 * d)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.n1(x), cos, sin)
        return x + self.mlp(self.n2(x))


class MLALM(nn.Module):
    def __init__(self, vocab=VOCAB, d=HIDDEN, n_head=HEADS, n_layer=LAYERS, dr=4, max_pos=MAX_POS, **attn):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(MLABlock(d, n_head, dr=dr, **attn) for _ in range(n_layer))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        inv = 1.0 / (10000.0 ** (torch.arange(0, dr, 2).float() / dr))
        freqs = torch.outer(torch.arange(max_pos).float(), torch.cat([inv, inv]))
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)
        self.vocab = vocab

    def forward(self, idx, labels=None):
        B, T = idx.shape
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, self.cos[:T], self.sin[:T])
        logits = self.lm_head(self.norm(x))
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        return F.cross_entropy(logits.reshape(-1, self.vocab), shifted.reshape(-1), ignore_index=-100), logits


def mla():
    torch.manual_seed(0)
    return MLALM().float().train(), _plain_inputs(VOCAB)


FORMS["mla"] = mla


def mla_cat():
    """MLA with its keys assembled by ``cat``, as transformers' DeepseekV3Attention writes them."""
    torch.manual_seed(0)
    return MLALM(assemble="cat").float().train(), _plain_inputs(VOCAB)


FORMS["mla_cat"] = mla_cat

"""Model presets and the deterministic model/batch builders shared by every benchmark worker.

Contract:
  * ``PRESETS[name]`` is a :class:`Preset`: Qwen3-shaped decoder dimensions plus the default dtype
    and sequence lengths the preset is meant for.  The CPU presets are small enough for a laptop;
    the GPU presets carry the published Qwen3 config values (the weights are random: nothing is
    downloaded).
  * :func:`build_model` returns a ``Qwen3ForCausalLM`` in train mode with ``use_cache=False`` whose
    parameters depend only on ``(preset, seed, device, dtype)``: every parameter is re-initialised
    from a generator seeded by its name, so two workers (even two transformers versions) that build
    the same preset hold identical weights.
  * :func:`make_batch` returns ``(input_ids, labels)`` of shape ``[1, seq]``; the labels are the
    input ids with the first quarter set to -100 (a prompt that takes no loss).
"""
from __future__ import annotations

import contextlib
import dataclasses
import zlib

IGNORE_INDEX = -100


@dataclasses.dataclass(frozen=True)
class Preset:
    """Dimensions of a Qwen3-shaped causal LM and the defaults it is benchmarked with."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    dtype: str                  # default dtype: "float32" or "bfloat16"
    seqs: tuple[int, ...]       # default sequence lengths
    gpu: bool = False           # meant for a GPU (too large for a CPU run)
    max_position_embeddings: int = 40960
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    note: str = ""
    experts: int = 0            # > 0: a Qwen3-MoE model, every layer a mixture of this many experts
    top_k: int = 0
    moe_intermediate_size: int = 0

    def floor_bytes_per_token(self, dtype_bytes: int) -> int:
        """Activation floor of exact BP: the (layers + 1) residual-stream boundaries, d values each."""
        return (self.num_hidden_layers + 1) * self.hidden_size * dtype_bytes


def _qwen3(name, d, ffn, layers, heads, kv, head_dim, vocab, tie, dtype, seqs, gpu=False, note=""):
    return Preset(name=name, vocab_size=vocab, hidden_size=d, intermediate_size=ffn,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                  head_dim=head_dim, tie_word_embeddings=tie, dtype=dtype, seqs=tuple(seqs),
                  gpu=gpu, note=note)


PRESETS: dict[str, Preset] = {p.name: p for p in [
    _qwen3("tiny", 32, 64, 2, 2, 1, 16, 128, False, "float32", (32, 64),
           note="CI smoke test"),
    _qwen3("qwen3-head", 256, 768, 2, 4, 2, 64, 32000, False, "float32", (512, 1024, 2048),
           note="large vocabulary: the LM head and loss dominate"),
    _qwen3("qwen3-layers", 256, 768, 6, 4, 2, 64, 512, False, "float32", (512, 1024, 2048),
           note="small vocabulary: the decoder layers dominate"),
    dataclasses.replace(_qwen3("qwen3-moe", 256, 768, 6, 4, 2, 64, 512, False, "float32", (512, 1024, 2048),
                               note="Qwen3-MoE: 8 experts, top-2, every layer sparse"),
                        experts=8, top_k=2, moe_intermediate_size=256),
    # Published Qwen3 configs (hidden, ffn, layers, heads, kv heads, head_dim, vocab, tied embeddings).
    _qwen3("qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, True, "bfloat16", (4096, 8192, 16384),
           gpu=True, note="Qwen3-0.6B shape, random weights"),
    _qwen3("qwen3-4b", 2560, 9728, 36, 32, 8, 128, 151936, True, "bfloat16", (4096, 8192, 16384),
           gpu=True, note="Qwen3-4B shape, random weights"),
    _qwen3("qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, False, "bfloat16", (2048, 4096, 8192),
           gpu=True, note="Qwen3-8B shape, random weights"),
]}

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}") from None


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def hf_config(preset: Preset, max_seq: int = 0):
    """The transformers ``Qwen3Config`` (``Qwen3MoeConfig`` for a preset with experts) of a preset
    (works with transformers 4.51 and 5.x)."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    moe = dict(num_experts=preset.experts, num_experts_per_tok=preset.top_k, decoder_sparse_step=1,
               mlp_only_layers=[], moe_intermediate_size=preset.moe_intermediate_size)
    return (Qwen3MoeConfig if preset.experts else Qwen3Config)(
        **(moe if preset.experts else {}),
        vocab_size=preset.vocab_size,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_key_value_heads,
        head_dim=preset.head_dim,
        max_position_embeddings=max(preset.max_position_embeddings, max_seq),
        rope_theta=preset.rope_theta,
        rms_norm_eps=preset.rms_norm_eps,
        tie_word_embeddings=preset.tie_word_embeddings,
        attention_dropout=0.0,
        use_sliding_window=False,
        sliding_window=None,
        use_cache=False,
        attn_implementation="sdpa",
    )


@contextlib.contextmanager
def _default_dtype(dtype):
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(preset: Preset, dtype: str, device: str, seed: int = 0, max_seq: int = 0):
    """A train-mode Qwen3ForCausalLM with name-seeded random weights (see the module docstring)."""
    import torch
    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

    dt = torch_dtype(dtype)
    config = hf_config(preset, max_seq)
    with _default_dtype(dt), torch.device(device):
        model = (Qwen3MoeForCausalLM if preset.experts else Qwen3ForCausalLM)(config)
    model.to(device=device, dtype=dt)
    init_weights(model, seed)
    model.train()
    model.config.use_cache = False
    return model


def init_weights(model, seed: int, std: float = 0.02) -> None:
    """Re-initialise every parameter from a generator seeded by ``seed`` and the parameter's name.

    Matrices get N(0, std^2); vectors (norm weights) get 1 + N(0, std^2).  Tied parameters are
    visited once, under their first name.
    """
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            gen = torch.Generator(device=param.device)
            gen.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
            values = torch.randn(param.shape, generator=gen, device=param.device, dtype=torch.float32)
            values.mul_(std)
            if param.dim() == 1:
                values.add_(1.0)
            param.copy_(values)


def make_batch(preset: Preset, seq: int, device: str, seed: int = 0):
    """``(input_ids, labels)`` of shape [1, seq]; the first seq // 4 labels are -100."""
    import torch

    gen = torch.Generator().manual_seed(seed + 7919 * seq)
    input_ids = torch.randint(0, preset.vocab_size, (1, seq), generator=gen)
    labels = input_ids.clone()
    labels[:, : seq // 4] = IGNORE_INDEX
    return input_ids.to(device), labels.to(device)

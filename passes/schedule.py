"""The chunk-size policy, shared by the plan (compile time) and the runtime (every call)."""

AUTO_CHUNK_MIN, AUTO_CHUNK_MAX = 64, 512


def auto_chunk(T: int) -> int:
    """Automatic layer chunk: a quarter of the sequence, clamped to [64, 512] tokens.

    Larger chunks run faster (fewer, larger matmuls; less per-chunk work that scales with the
    key prefix: building the chunk's mask, zeroing dK/dV), which is why the paper uses T/3.
    Smaller chunks use less memory, and a chunk's working set grows with chunk x prefix (its
    mask, its attention gradients), so past 4 x 512 tokens the chunk stays at 512: memory per
    token stays flat as T grows."""
    return min(T, max(AUTO_CHUNK_MIN, min(AUTO_CHUNK_MAX, -(-T // 4))))

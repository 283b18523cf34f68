"""The chunk-size policy, shared by the plan (compile time) and the runtime (every call)."""

AUTO_CHUNK_MIN, AUTO_CHUNK_MAX = 64, 512
MIN_CHUNK = 16   # the smallest chunk a memory budget may choose


def auto_chunk(T: int) -> int:
    """Automatic layer chunk: a quarter of the sequence, clamped to [64, 512] tokens.

    Larger chunks run faster (fewer, larger matmuls; less per-chunk work that scales with the
    key prefix: building the chunk's mask, zeroing dK/dV), which is why the paper uses T/3.
    Smaller chunks use less memory, and a chunk's working set grows with chunk x prefix (its
    mask, its attention gradients), so past 4 x 512 tokens the chunk stays at 512: memory per
    token stays flat as T grows."""
    return min(T, max(AUTO_CHUNK_MIN, min(AUTO_CHUNK_MAX, -(-T // 4))))


def chunk_size(kind: str, T: int, fixed: int | None, policy=None) -> int:
    """Tokens per chunk of a region of ``kind`` ("layer" or "head") at length T: the fixed size
    (the user's, or the plan's automatic head chunk) unless a memory budget ``policy`` sizes
    automatic chunks (``membudget.BudgetPolicy``), else the automatic layer rule."""
    if policy is not None:
        return min(policy.chunk(kind, T), T)
    return min(fixed or auto_chunk(T), T)


def chunk_candidates(T: int) -> list:
    """Chunk sizes a memory budget chooses from, largest first: T, then powers of two below it."""
    out, c = [T], 1
    while c * 2 < T:
        c *= 2
    while c >= MIN_CHUNK:
        out.append(c)
        c //= 2
    return out


def largest_fitting(candidates, fits):
    """The first of ``candidates`` (largest first) for which ``fits`` holds; None if none does.
    A chunk's working set grows with its size, so the search bisects the sorted candidates."""
    lo, hi = 0, len(candidates)   # candidates[hi:] fit if any does; find the first that fits
    if not candidates or not fits(candidates[-1]):
        return None
    hi = len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return candidates[lo]

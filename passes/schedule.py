"""The chunk-size policy, shared by the plan (compile time) and the runtime (every call)."""

AUTO_CHUNK_MIN, AUTO_CHUNK_MAX = 64, 2048
AUTO_CHUNK_PAIRS = 1 << 25   # query-key pairs of one chunk against the whole sequence, at most
AUTO_CHUNK_FLOOR = 512       # ... unless that leaves fewer tokens than this
MIN_CHUNK = 16   # the smallest chunk a memory budget may choose
AUTO_CHUNK_RULE = (f"T/4 in [{AUTO_CHUNK_MIN}, {AUTO_CHUNK_MAX}], at most 2**{AUTO_CHUNK_PAIRS.bit_length() - 1}/T "
                   f"from {AUTO_CHUNK_FLOOR} up")   # ``auto_chunk`` in words, for what the plans describe


def auto_chunk(T: int) -> int:
    """Automatic layer chunk: a quarter of the sequence, at least 64 tokens and at most 2,048,
    and at most 2**25 / T tokens (but never fewer than 512 for that bound).

    Larger chunks run faster: fewer and larger matrix products and attention calls, less work per
    chunk (the key prefix's mask, the merge of the attention blocks, the Python around each
    call). On the CPU bench's layers preset (fp32, a trainer's attention mask), chunks of 512 ran
    a step in 1.21x and 1.13x gradient checkpointing's time at T=4096 and T=16384, chunks of
    2,048 in 0.94x and 0.90x. Smaller chunks use less memory, which is why the paper uses T/3
    and why the chunk is bounded: its working set is a constant (its own activations, about c x
    the layer's widest per-token tensors), plus terms of c x T (a padded batch's mask block, the
    scores of attention that is not fused) that grow with the length; bounding c x T by 2**25
    (2,048 tokens up to T = 16,384, 1,024 at 32,768, 512 from 65,536) keeps a long sequence's
    memory per token where chunks of 512 keep it. A memory budget (``membudget``) sizes chunks
    from the step's own memory model instead."""
    cap = max(AUTO_CHUNK_FLOOR, min(AUTO_CHUNK_MAX, AUTO_CHUNK_PAIRS // max(T, 1)))
    return min(T, max(AUTO_CHUNK_MIN, min(cap, -(-T // 4))))


HEAD_CHUNK_BYTES = 128 << 20  # the head's widest per-token tensor (its logits) per chunk, in bytes
HEAD_CHUNK_MIN = 16


def auto_head_chunk(bytes_per_token: float) -> int:
    """Automatic head chunk: as many tokens as fit HEAD_CHUNK_BYTES of the head's widest
    per-token tensor (the logits; in fp32, 128 MiB is 1,048 tokens of a 32,000-token vocabulary,
    220 of a 151,936-token one), at least HEAD_CHUNK_MIN.

    Sized in bytes, not tokens, so that a large vocabulary still gets a chunk large enough for
    an efficient logits product (a fixed count of values per chunk shrank to 27 tokens for
    Qwen3's vocabulary); the chunk's working set (its logits, their softmax and gradient) stays
    a constant few times HEAD_CHUNK_BYTES whatever the length."""
    if not bytes_per_token or bytes_per_token == float("inf"):
        return HEAD_CHUNK_MIN
    return max(HEAD_CHUNK_MIN, int(HEAD_CHUNK_BYTES // bytes_per_token))


def chunk_size(kind: str, T: int, fixed: int | None, policy=None) -> int:
    """Tokens per chunk of a region of ``kind`` ("layer" or "head") at length T: the fixed size
    (the user's, or the plan's automatic head chunk) unless a memory budget ``policy`` sizes
    automatic chunks (``membudget.BudgetPolicy``), else the automatic layer rule."""
    c = policy.chunk(kind, T) if policy is not None else None
    if c is not None:
        return min(c, T)
    return min(fixed or auto_chunk(T), T)


def chunk_bounds(T: int, c: int) -> list:
    """The chunks [s, e) of a length-T sequence in chunks of c tokens: c tokens each, the
    last what remains, except that one token is never a chunk of its own where more are: a last
    chunk of one token takes one from the chunk before it (c - 1 and 2 tokens; with c = 2, the
    two join into one of 3). A chunk graph is compiled for chunks of two or more rows (a size of 1
    is where broadcasting, and the guards a compile takes on it, differ), so one row left over
    would compile every graph of the region again."""
    out = [(s, min(s + c, T)) for s in range(0, T, c)]
    if c > 1 and len(out) > 1 and out[-1][1] - out[-1][0] == 1:
        s = out[-2][0]
        out[-2:] = [(s, T - 2), (T - 2, T)] if c > 2 else [(s, T)]
    return out


def chunk_count(T: int, c: int) -> int:
    """How many chunks ``chunk_bounds(T, c)`` has."""
    return len(chunk_bounds(T, c))


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

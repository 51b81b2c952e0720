"""NVFP4 GEMV in Triton: c[m, 0, l] = sum_k A[m, k, l] * B[0, k, l] with A, B in FP4 E2M1 (two
values per byte along K, the even one in the low nibble) times FP8 E4M3 block scales (one per
16 values along K, the plain [rows, K/16, L] layout), fp32 accumulation, fp16 out.

One program computes BLOCK_M rows of c for one batch l, looping over K in tiles of BLOCK_KB
bytes (2 * BLOCK_KB values, BLOCK_KB / 8 scales) with 16-byte loads. Per tile: the 16-value
block dot products of the decoded codes, exact in fp32 (products are multiples of 1/4 up to 36,
sixteen of them stay below 2^10), times the product of the two block scales, exact too (4-bit by
4-bit significands), summed into the fp32 accumulator: the only rounding before the fp16 store.

Decoding is bit arithmetic, no lookup: an E2M1 code's sign to bit 15 and its three exponent and
mantissa bits to bits 11..9 make the fp16 of its value times 2^-14 (E4M3 alike, times 2^-8).
Where K is contiguous the codes are read as 32-bit words and decoded two at a time (the fp16
patterns of bytes 0 and 2 share a word, then bytes 1 and 3): half the integer work of going
byte by byte, which a strided K still does. The powers of two are undone once per program.

When rows x batches give too few programs to fill the GPU, K is split over programs that write
fp32 partial sums, added in a fixed order by a second kernel (no atomics: results do not depend
on scheduling).

Self-contained (torch and triton only): this file is the source of the ``triton`` Solution that
opforge's built-in dataset ships for every nvfp4_gemv Definition.
"""

import functools

import torch
import triton
import triton.language as tl

#: Bytes of A per K tile (512 FP4 values, 32 scales), rows per program, warps per program.
BLOCK_KB = 256
BLOCK_M = 32
NUM_WARPS = 4
#: Programs per SM below which K is split (enough loads in flight to cover their latency).
PROGRAMS_PER_SM = 2
#: E2M1 decodes to value x 2^-14 and E4M3 to value x 2^-8: a block term comes out x 2^-44.
#: Powers of two change no rounding here (every intermediate stays a normal fp32).
UNDO_DECODE_SCALE = tl.constexpr(2.0 ** 44)


@triton.jit
def _low_nibbles(x):
    # The low nibble of bytes 0 and 2 of each 32-bit word (of the byte itself for a byte) as
    # fp16 patterns of E2M1 x 2^-14: sign to bit 15, exponent and mantissa to bits 11..9. For
    # exponent 0 that is an fp16 subnormal, which fp16 keeps (fp32 arithmetic may flush them).
    return ((x & 0x00080008) << 12) | ((x & 0x00070007) << 9)


@triton.jit
def _high_nibbles(x):
    return ((x & 0x00800080) << 8) | ((x & 0x00700070) << 5)


@triton.jit
def _fp16_bits(bits):
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _pair_dot(p, q):
    # Two fp16 patterns per word each (low and high half): their two products, summed.
    return _fp16_bits(p & 0xFFFF) * _fp16_bits(q & 0xFFFF) + _fp16_bits(p >> 16) * _fp16_bits(q >> 16)


@triton.jit
def _word_dot(a, b):
    # The 8 products of the E2M1 codes of two words (x 2^-28), summed: exact.
    s = _pair_dot(_low_nibbles(a), _low_nibbles(b)) + _pair_dot(_high_nibbles(a), _high_nibbles(b))
    a = a >> 8
    b = b >> 8
    return s + _pair_dot(_low_nibbles(a), _low_nibbles(b)) + _pair_dot(_high_nibbles(a), _high_nibbles(b))


@triton.jit
def _byte_dot(a, b):
    # The 2 products of the E2M1 codes of two bytes (x 2^-28), summed.
    return _fp16_bits(_low_nibbles(a)) * _fp16_bits(_low_nibbles(b)) \
        + _fp16_bits(_high_nibbles(a)) * _fp16_bits(_high_nibbles(b))


@triton.jit
def _e4m3(byte):
    # Sign to fp16 bit 15, the 4 exponent and 3 mantissa bits to bits 13..7: an fp16 of
    # 2^(E-15) * (1 + M/8) (subnormal for E = 0), the E4M3 value x 2^-8, exactly.
    return _fp16_bits(((byte & 0x80) << 8) | ((byte & 0x7F) << 7))


@triton.jit
def _nvfp4_gemv_kernel(
    a_ptr, b_ptr, sa_ptr, sb_ptr, out_ptr,
    M, K_BYTES, ITERS_PER_SPLIT,
    stride_am, stride_ak, stride_al,
    stride_bk, stride_bl,
    stride_sam, stride_sak, stride_sal,
    stride_sbk, stride_sbl,
    stride_os, stride_om, stride_ol,
    BLOCK_M: tl.constexpr, BLOCK_KB: tl.constexpr, EVEN_K: tl.constexpr, WORDS: tl.constexpr,
    PARTIAL: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_l = tl.program_id(1)
    pid_s = tl.program_id(2)
    SCALES: tl.constexpr = BLOCK_KB // 8  # one scale per 8 bytes (16 values)
    # The unit the codes are read in: 32-bit words (K contiguous) or bytes; a block is 8 bytes.
    UNIT_BYTES: tl.constexpr = 4 if WORDS else 1
    PER_BLOCK: tl.constexpr = 8 // UNIT_BYTES

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    # A tile as [rows, blocks, units of a block]: the block sums are a sum over the last axis,
    # with no reshape of a loaded tile.
    kj = tl.arange(0, SCALES)
    ku = kj[:, None] * PER_BLOCK + tl.arange(0, PER_BLOCK)[None, :]
    # 64-bit row and batch offsets: A alone may pass 2^31 bytes.
    rows64 = rows.to(tl.int64)
    l64 = pid_l.to(tl.int64)
    if WORDS:
        # K contiguous and every row and batch 4-byte aligned (checked by the caller).
        a_rows = a_ptr.to(tl.pointer_type(tl.uint32)) + rows64[:, None, None] * (stride_am // 4) \
            + l64 * (stride_al // 4)
        b_col = b_ptr.to(tl.pointer_type(tl.uint32)) + l64 * (stride_bl // 4)
        step_a = 1
        step_b = 1
    else:
        a_rows = a_ptr + rows64[:, None, None] * stride_am + l64 * stride_al
        b_col = b_ptr + l64 * stride_bl
        step_a = stride_ak
        step_b = stride_bk
    sa_rows = sa_ptr + rows64[:, None] * stride_sam + l64 * stride_sal
    sb_col = sb_ptr + l64 * stride_sbl

    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    start = pid_s * ITERS_PER_SPLIT * BLOCK_KB
    for it in range(0, ITERS_PER_SPLIT):
        k0 = start + it * BLOCK_KB
        u = k0 // UNIT_BYTES + ku
        j = k0 // 8 + kj
        if EVEN_K:
            a = tl.load(a_rows + u[None, :, :] * step_a, mask=row_ok[:, None, None], other=0)
            b = tl.load(b_col + u * step_b)
            sa = tl.load(sa_rows + j[None, :] * stride_sak, mask=row_ok[:, None], other=0)
            sb = tl.load(sb_col + j * stride_sbk)
        else:
            u_ok = u < K_BYTES // UNIT_BYTES
            j_ok = j < K_BYTES // 8
            a = tl.load(a_rows + u[None, :, :] * step_a, mask=row_ok[:, None, None] & u_ok[None, :, :], other=0)
            b = tl.load(b_col + u * step_b, mask=u_ok, other=0)
            sa = tl.load(sa_rows + j[None, :] * stride_sak, mask=row_ok[:, None] & j_ok[None, :], other=0)
            sb = tl.load(sb_col + j * stride_sbk, mask=j_ok, other=0)
        if WORDS:
            units = _word_dot(a, b[None, :, :])
        else:
            units = _byte_dot(a.to(tl.int32), b.to(tl.int32)[None, :, :])
        # Even elements meet even ones, odd meet odd; 16 values (8 bytes) make a block.
        blocks = tl.sum(units, axis=2)
        scales = _e4m3(sa.to(tl.int32)) * _e4m3(sb.to(tl.int32))[None, :]
        acc += tl.sum(blocks * scales, axis=1)
    acc = acc * UNDO_DECODE_SCALE

    out = out_ptr + pid_s * stride_os + rows * stride_om + pid_l * stride_ol
    if PARTIAL:
        tl.store(out, acc, mask=row_ok)
    else:
        tl.store(out, acc.to(tl.float16), mask=row_ok)


@triton.jit
def _sum_splits_kernel(part_ptr, c_ptr, M, SPLITS, stride_ps, stride_pm, stride_pl, stride_cm, stride_cl,
                       BLOCK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_l = tl.program_id(1)
    rows = pid_m * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < M
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, SPLITS):
        acc += tl.load(part_ptr + s * stride_ps + rows * stride_pm + pid_l * stride_pl, mask=row_ok, other=0.0)
    tl.store(c_ptr + rows * stride_cm + pid_l * stride_cl, acc.to(tl.float16), mask=row_ok)


def _check(a, b, scale_a, scale_b, c):
    if a.dim() != 3 or b.dim() != 3:
        raise ValueError(f"nvfp4_gemv_triton: a and b must be [M, K/2, L] and [1, K/2, L]; got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    m, kb, l = a.shape
    want = {"b": (1, kb, l), "scale_a": (m, kb // 8, l), "scale_b": (1, kb // 8, l), "c": (m, 1, l)}
    for name, t in (("b", b), ("scale_a", scale_a), ("scale_b", scale_b), ("c", c)):
        if tuple(t.shape) != want[name]:
            raise ValueError(f"nvfp4_gemv_triton: {name} has shape {tuple(t.shape)}; a {tuple(a.shape)} needs "
                             f"{want[name]}")
    if kb % 32:
        raise ValueError(f"nvfp4_gemv_triton: K = {2 * kb} is not a multiple of 64")
    for name, t, dtype in (("a", a, torch.float4_e2m1fn_x2), ("b", b, torch.float4_e2m1fn_x2),
                           ("scale_a", scale_a, torch.float8_e4m3fn), ("scale_b", scale_b, torch.float8_e4m3fn),
                           ("c", c, torch.float16)):
        if t.dtype != dtype:
            raise TypeError(f"nvfp4_gemv_triton: {name} has dtype {t.dtype}; expected {dtype}")


def _word_aligned(t) -> bool:
    """K contiguous, and every row and batch of t starting on a 4-byte boundary."""
    return (t.stride(1) == 1 and t.data_ptr() % 4 == 0
            and all(t.stride(d) % 4 == 0 for d in (0, 2) if t.shape[d] > 1))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _splits(tiles: int, iters: int, device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # triton's CPU interpreter: one program at a time anyway
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return max(1, min(iters, PROGRAMS_PER_SM * sms // tiles))


def nvfp4_gemv(a, b, scale_a, scale_b, c, *, splits=None):
    """c[:] = A @ B per batch, from FP4 ``a`` [M, K/2, L], ``b`` [1, K/2, L], E4M3 ``scale_a``
    [M, K/16, L], ``scale_b`` [1, K/16, L] (any strides) into fp16 ``c`` [M, 1, L]. ``splits``:
    how many programs share each row tile's K (default: enough to fill the GPU). Returns c."""
    _check(a, b, scale_a, scale_b, c)
    m, kb, l = a.shape
    block_kb = min(BLOCK_KB, triton.next_power_of_2(kb))
    iters = triton.cdiv(kb, block_kb)
    row_tiles = triton.cdiv(m, BLOCK_M)
    splits = splits or _splits(row_tiles * l, iters, a.device)
    per_split = triton.cdiv(iters, min(splits, iters))
    splits = triton.cdiv(iters, per_split)  # no split left without work
    even = kb % block_kb == 0 and iters % per_split == 0
    # Triton has no FP4 or (in its interpreter) FP8 pointers: the kernel reads bytes.
    a8, b8, sa8, sb8 = (t.view(torch.uint8) for t in (a, b, scale_a, scale_b))
    if splits == 1:
        out, out_strides = c, (0, c.stride(0), c.stride(2))
    else:
        out = torch.empty((splits, m, l), dtype=torch.float32, device=c.device)
        out_strides = out.stride()
    _nvfp4_gemv_kernel[(row_tiles, l, splits)](
        a8, b8, sa8, sb8, out,
        m, kb, per_split,
        a8.stride(0), a8.stride(1), a8.stride(2),
        b8.stride(1), b8.stride(2),
        sa8.stride(0), sa8.stride(1), sa8.stride(2),
        sb8.stride(1), sb8.stride(2),
        *out_strides,
        BLOCK_M=BLOCK_M, BLOCK_KB=block_kb, EVEN_K=even, WORDS=_word_aligned(a8) and _word_aligned(b8),
        PARTIAL=splits > 1, num_warps=NUM_WARPS,
    )
    if splits > 1:
        block = 128
        _sum_splits_kernel[(triton.cdiv(m, block), l)](
            out, c, m, splits, *out.stride(), c.stride(0), c.stride(2), BLOCK=block)
    return c


def triton_kernel(data):
    """The Solution's entry, one tuple in the Definition's order:
    (a, b, scale_a, scale_b, scale_a_permuted, scale_b_permuted, c) -> c. The permuted scales
    hold the plain ones in the blocked layout; this kernel reads the plain ones."""
    a, b, scale_a, scale_b, _scale_a_permuted, _scale_b_permuted, c = data
    return nvfp4_gemv(a, b, scale_a, scale_b, c)

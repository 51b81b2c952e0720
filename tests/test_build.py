"""What the build contains (build_info), which GPUs its code runs on (_arch_runs_on), the norm
kernel's launch shape (checked on any machine through _C.norm_launch_shape), and that importing
opforge leaves CUDA alone."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

import opforge
from opforge import _C
from opforge._ext import _arch_runs_on

# --- build_info ------------------------------------------------------------------------------


def test_build_info_keys_and_types():
    info = opforge.build_info()
    assert set(info) == {"version", "cuda", "cuda_archs", "cuda_version", "compiler", "commit"}
    assert isinstance(info["version"], str) and info["version"]
    assert isinstance(info["cuda"], bool)
    assert isinstance(info["cuda_archs"], list) and all(isinstance(a, str) and a for a in info["cuda_archs"])
    assert isinstance(info["cuda_version"], str)
    assert isinstance(info["compiler"], str) and info["compiler"]
    assert re.fullmatch(r"([0-9a-f]{7,40}|[\w.-]+)?(\+dirty)?", info["commit"]), info["commit"]


def test_build_info_is_consistent():
    info = opforge.build_info()
    assert bool(info["cuda_archs"]) == info["cuda"]
    if info["cuda"]:
        assert re.fullmatch(r"\d+\.\d+", info["cuda_version"]), info["cuda_version"]
    for arch in info["cuda_archs"]:
        assert re.fullmatch(r"\d+\.\d+[af]?(\+PTX)?", arch), arch
        _arch_runs_on(arch, 90)  # every listed arch is understood


def test_version_matches_the_package():
    assert opforge.__version__ == opforge.build_info()["version"]
    assert opforge.__version__ == importlib.metadata.version("opforge")


# --- which GPUs an arch runs on --------------------------------------------------------------

CCS = (75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121)


@pytest.mark.parametrize(
    "arch, runs_on",
    [
        ("8.0", {80, 86, 87, 89}),  # SASS: same major, same or newer minor
        ("8.6", {86, 87, 89}),
        ("7.5", {75}),
        ("9.0", {90}),
        ("9.0a", {90}),  # arch-specific: that chip only
        ("10.0a", {100}),
        ("10.0f", {100, 103}),  # family-specific: same major, newer minor
        ("12.0f", {120, 121}),
        ("8.0+PTX", {80, 86, 87, 89, 90, 100, 103, 110, 120, 121}),  # PTX: JIT for every newer GPU
        ("9.0+PTX", {90, 100, 103, 110, 120, 121}),
        ("9.0a+PTX", {90}),  # arch-specific PTX cannot be JIT-compiled for other chips
    ],
)
def test_arch_runs_on(arch, runs_on):
    assert {cc for cc in CCS if _arch_runs_on(arch, cc)} == runs_on


# --- the norm kernel's launch shape ----------------------------------------------------------

SMS = (1, 78, 132)
ROWS = (1, 2, 3, 7, 31, 64, 100, 1000, 8192, 1 << 16, 1 << 20)
#: (vec, hidden sizes): vec 8 = bf16/fp16 16-byte accesses, 4 = fp32, 1 = the scalar kernel
HIDDEN_BY_VEC = {
    8: (8, 16, 64, 128, 1024, 4096, 5120, 8192, 16384, 32768, 65536, 131072),
    4: (4, 8, 128, 1000, 4096, 5120, 8192, 16384, 32768, 65536),
    1: (1, 2, 3, 7, 33, 127, 1000, 2048, 2049, 4097, 8192, 65536),
}
CASES = [(vec, h) for vec, hs in HIDDEN_BY_VEC.items() for h in hs]
KERNEL_VPTS = (1, 2, 4, 8)  # the register kernel's instantiations (cuda/norm.cu)


def max_threads(vpt: int) -> int:
    """__launch_bounds__ of the register kernel with `vpt` vectors per thread (cuda/norm.cu)."""
    return 1024 if vpt <= 2 else 512 if vpt <= 4 else 256


def fits_in_registers(hidden: int, vec: int) -> bool:
    nv = hidden // vec
    return any(-(-nv // v) <= max_threads(v) for v in KERNEL_VPTS)


def launch(rows, hidden, vec, sms=132, vpt=-1):
    shape = _C.norm_launch_shape(rows, hidden, vec, sms, vpt)
    assert set(shape) == {"vecs_per_thread", "group", "threads", "blocks"}
    return shape


def check_register_launch(s, rows, hidden, vec, where):
    vpt, group, threads, blocks = s["vecs_per_thread"], s["group"], s["threads"], s["blocks"]
    assert vpt in KERNEL_VPTS, "no kernel for this many vectors per thread: " + where
    assert 1 <= threads <= max_threads(vpt), "block larger than the kernel's launch bounds: " + where
    assert group >= 1 and threads % group == 0, where
    assert group * vpt * vec >= hidden, "a row is not covered: " + where
    if group <= 32:
        assert group & (group - 1) == 0, "sub-warp group is not a power of two: " + where
        assert group == 1 or (group // 2) * vpt * vec < hidden, "group larger than needed: " + where
    else:
        assert group % 32 == 0, "multi-warp group is not whole warps: " + where
        assert (group - 32) * vpt * vec < hidden, "group larger than needed: " + where
    rows_per_block = threads // group
    assert blocks * rows_per_block >= rows, "rows left without a block: " + where
    assert (blocks - 1) * rows_per_block < rows, "a block with no rows: " + where


def check_streaming_launch(s, rows, hidden, vec, where):
    threads = s["threads"]
    assert s["group"] == threads and s["blocks"] == rows, "streaming is one block per row: " + where
    assert 32 <= threads <= 1024 and threads % 32 == 0, where
    assert threads <= max(32, -(-(hidden // vec) // 32) * 32), "idle warps in a streaming block: " + where


@pytest.mark.parametrize("vec, hidden", CASES, ids=[f"vec{v}-h{h}" for v, h in CASES])
def test_launch_shape_invariants(vec, hidden):
    for sms in SMS:
        for rows in ROWS:
            s = launch(rows, hidden, vec, sms)
            where = f"rows={rows} hidden={hidden} vec={vec} sms={sms}: {s}"
            if s["vecs_per_thread"] == 0:
                assert not fits_in_registers(hidden, vec), "streaming chosen though registers suffice: " + where
                check_streaming_launch(s, rows, hidden, vec, where)
            else:
                assert fits_in_registers(hidden, vec), "register path for a row too long: " + where
                check_register_launch(s, rows, hidden, vec, where)


@pytest.mark.parametrize(
    "hidden, vec, streaming",
    [(65536, 8, True), (131072, 8, True), (4096, 8, False), (16384, 8, False), (65536, 4, True), (8192, 4, False),
     (65536, 1, True), (2048, 1, False), (2049, 1, True)],
)
def test_streaming_only_when_registers_do_not_suffice(hidden, vec, streaming):
    for rows in (1, 64, 1 << 16):
        assert (launch(rows, hidden, vec)["vecs_per_thread"] == 0) == streaming


@pytest.mark.parametrize("vec, hidden", [(8, 1024), (8, 4096), (8, 8192), (8, 16384), (4, 4096), (1, 1024)])
def test_small_batches_use_fewer_vectors_per_thread(vec, hidden):
    """Few rows never hold more vectors per thread than many rows (which need the most in flight)."""
    for sms in SMS[1:]:
        few, many = (launch(rows, hidden, vec, sms)["vecs_per_thread"] for rows in (1, 1 << 20))
        assert 0 < few <= many, f"sms={sms}: {few} vectors per thread for 1 row, {many} for 2^20 rows"


@pytest.mark.parametrize("vpt", [1, 2, 4, 8])
@pytest.mark.parametrize("vec, hidden", [(8, 8), (8, 4096), (8, 16384), (4, 5120), (1, 127), (1, 4097)])
def test_forced_vectors_per_thread(vec, hidden, vpt):
    """The tuning override gives that many vectors per thread, or -1 where a row cannot fit."""
    for rows in (1, 1000):
        s = launch(rows, hidden, vec, vpt=vpt)
        where = f"rows={rows} hidden={hidden} vec={vec} vpt={vpt}: {s}"
        if -(-(hidden // vec) // vpt) <= max_threads(vpt):
            assert s["vecs_per_thread"] == vpt, where
            check_register_launch(s, rows, hidden, vec, where)
        else:
            assert s["vecs_per_thread"] == -1, where


def test_narrow_accesses_take_the_one_narrow_kernel():
    """16-bit decode batches of short rows (up to 256 rows of up to 1024 elements, 2^17 elements in
    all) read through 8-byte accesses (4 elements) where their launch is the one kernel built for
    those (2 vectors per thread): on every GPU of 78 SMs or more, and on one SM wherever that
    launch still holds."""
    for rows in (1, 2, 3, 7, 31, 64, 100, 128, 255, 256):
        for hidden in (4, 8, 12, 128, 136, 512, 516, 768, 1000, 1020, 1024):
            for sms in SMS:
                narrow = _C.norm_narrow_access(rows, hidden, 2, sms)
                where = f"rows={rows} hidden={hidden} sms={sms}"
                if rows * hidden > 1 << 17:
                    assert not narrow, where
                    continue
                s = launch(rows, hidden, 4, sms)
                where += f": {s}"
                assert narrow == (s["vecs_per_thread"] == 2), where
                assert narrow or sms == 1, where
                check_register_launch(s, rows, hidden, 4, where)
            assert not _C.norm_narrow_access(rows, hidden, 4, 132)  # fp32 keeps 16-byte accesses


@pytest.mark.parametrize("vec, hidden", [(8, 8), (8, 4096), (8, 65536), (1, 4097)])
def test_forced_streaming(vec, hidden):
    for rows in (1, 1000):
        s = launch(rows, hidden, vec, vpt=0)
        assert s["vecs_per_thread"] == 0
        check_streaming_launch(s, rows, hidden, vec, f"rows={rows} hidden={hidden} vec={vec}: {s}")


# --- importing opforge leaves the GPU alone --------------------------------------------------


def test_import_and_cpu_calls_do_not_initialise_cuda():
    code = (
        "import opforge, torch\n"
        "assert not torch.cuda.is_initialized(), 'import initialised CUDA'\n"
        "opforge.build_info()\n"
        "x, w = torch.randn(2, 8), torch.randn(8)\n"
        "opforge.rmsnorm(x, w); opforge.fused_add_rmsnorm(x, x.clone(), w)\n"
        "opforge.silu_and_mul(x); opforge.scale(x, 2.0); opforge.rmsnorm(x, w, backend='torch')\n"
        "assert not torch.cuda.is_initialized(), 'a CPU call initialised CUDA'\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPFORGE_")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_extension_is_imported_through_ext_only():
    """The compiled module is opforge._C; the package exposes what the docs name."""
    assert opforge._ext._C is _C
    for name in opforge.__all__:
        assert hasattr(opforge, name), name
    assert issubclass(opforge.CudaError, RuntimeError)
    assert issubclass(opforge.BackendError, ValueError)


@pytest.mark.parametrize("hidden, decode, batch_1000", [
    (1536, (2, 96), (1, 192)), (2048, (2, 128), (1, 256)), (4096, (2, 256), (2, 256)), (5120, (2, 320), (4, 160)),
    (7168, (4, 224), (4, 224)), (8192, (4, 256), (4, 256)), (16384, (8, 256), (8, 256))])
def test_decode_batches_use_two_vectors_per_thread_and_a_block_per_row(hidden, decode, batch_1000):
    # RMSNorm and the fused add share the choice (choose_norm_launch takes no residual flag).
    # bf16 rows of `hidden` (8 elements per vector). Decode batches (up to 256 rows, where it was
    # measured): 2 vectors per thread where the group stays within 384 threads, else the fewest
    # vectors per thread that keep it within 256; each row its own block.
    for rows in (1, 8, 64, 256):
        s = launch(rows, hidden, 8, 132)
        assert (s["vecs_per_thread"], s["group"], s["threads"], s["blocks"]) == (*decode, decode[1], rows), s
    # 1000 rows (short of filling the GPU): the fewest vectors per thread within 256 threads.
    s = launch(1000, hidden, 8, 132)
    assert (s["vecs_per_thread"], s["group"]) == batch_1000, s
    # A batch that fills the GPU holds 4 vectors per thread, or 8 where 4 would need a group
    # wider than 256 threads.
    big = launch(65536, hidden, 8, 132)
    assert big["vecs_per_thread"] == (8 if hidden >= 16384 else 4), big


def test_decode_rows_narrower_than_a_warp_share_blocks():
    # bf16 rows of 64 elements: 4 threads with 2 vectors each, 64 rows to a 256-thread block.
    s = launch(200, 64, 8, 132)
    assert (s["vecs_per_thread"], s["group"], s["threads"], s["blocks"]) == (2, 4, 256, 4), s

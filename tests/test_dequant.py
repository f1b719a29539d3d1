"""weights/dequant.c against the gguf package's numpy dequantisers (an independent reference).

Every supported type is checked bit-for-bit on fresh random blocks (scale fields set to random
finite f16 values, covering subnormals and the whole exponent range), the f16/bf16 converters on
all 65536 inputs (inf, nan, subnormals, -0), and a few tensors of the default model against the
gguf package's own reader. Exact equality is expected: ggml's reference (which the numpy code
mirrors) computes each output with the same fp32 operations in the same order as dequant.c.
Run from the repo root: .venv/bin/python -m pytest -q tests/test_dequant.py
"""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "build" / "tests" / "tool_dequant"
MODEL = Path(os.environ.get("SIFT_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL

# type -> (bytes per block, byte offsets of its f16 scale fields)
BLOCKS = {
    T.Q4_0: (18, [0]),
    T.Q4_1: (20, [0, 2]),
    T.Q5_0: (22, [0]),
    T.Q5_1: (24, [0, 2]),
    T.Q8_0: (34, [0]),
    T.Q4_K: (144, [0, 2]),
    T.Q5_K: (176, [0, 2]),
    T.Q6_K: (210, [208]),
}


def run_tool(qtype, raw: bytes, tmp_path) -> np.ndarray:
    if not TOOL.exists():
        pytest.fail(f"{TOOL} missing: run `make build/tests/tool_dequant` first")
    src, dst = tmp_path / "in.bin", tmp_path / "out.f32"
    src.write_bytes(raw)
    subprocess.run([str(TOOL), str(int(qtype)), str(src), str(dst)], check=True)
    return np.fromfile(dst, dtype=np.float32)


def finite_bits(rng, n, bits):
    """n random bit patterns of an IEEE float with `bits` bits whose exponent is not all-ones."""
    exp_bits, top_exp_bit = {16: (0x7C00, 0x4000), 32: (0x7F800000, 0x40000000)}[bits]
    dtype = {16: np.uint16, 32: np.uint32}[bits]
    v = rng.integers(0, 1 << bits, n, dtype=np.uint64).astype(dtype)
    v[(v & exp_bits) == exp_bits] &= dtype(((1 << bits) - 1) ^ top_exp_bit)
    return v


def bf16_finite_bits(rng, n):
    v = rng.integers(0, 1 << 16, n, dtype=np.uint64).astype(np.uint16)
    v[(v & 0x7F80) == 0x7F80] &= np.uint16(0xBFFF)
    return v


def assert_bits_equal(ours, ref):
    ref = np.ascontiguousarray(ref, dtype=np.float32).ravel()
    assert ours.shape == ref.shape
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype", list(BLOCKS), ids=lambda t: t.name)
def test_quantised_random_blocks(qtype, tmp_path):
    rng = np.random.default_rng(int(qtype) * 1000 + 7)
    block_bytes, scale_offsets = BLOCKS[qtype]
    n_blocks = 4096
    blocks = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    for off in scale_offsets:
        blocks[:, off : off + 2] = finite_bits(rng, n_blocks, 16).view(np.uint8).reshape(-1, 2)
    ours = run_tool(qtype, blocks.tobytes(), tmp_path)
    ref = dequantize(blocks, qtype)
    assert np.isfinite(ours).all()
    assert_bits_equal(ours, ref)


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_float_random_values(qtype, tmp_path):
    rng = np.random.default_rng(int(qtype) + 11)
    n = 100_000
    if qtype == T.F32:
        raw = finite_bits(rng, n, 32)
    elif qtype == T.F16:
        raw = finite_bits(rng, n, 16)
    else:
        raw = bf16_finite_bits(rng, n)
    ours = run_tool(qtype, raw.tobytes(), tmp_path)
    assert_bits_equal(ours, dequantize(raw.view(np.uint8), qtype))


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda t: t.name)
def test_every_16_bit_pattern(qtype, tmp_path):
    """All 65536 inputs: zeros, subnormals, normals, infinities and NaNs."""
    raw = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ours = run_tool(qtype, raw.tobytes(), tmp_path)
    ref = np.ascontiguousarray(dequantize(raw.view(np.uint8), qtype)).ravel()
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    # NaN payloads may differ (hardware conversion quiets them); every other value is exact.
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    if qtype == T.F16:
        assert ours[0x0001] == np.float32(2.0**-24)  # smallest subnormal
        assert ours[0x7C00] == np.inf and ours[0xFC00] == -np.inf
        assert np.signbit(ours[0x8000]) and ours[0x8000] == 0


def test_partial_block_rejected(tmp_path):
    src, dst = tmp_path / "in.bin", tmp_path / "out.f32"
    src.write_bytes(bytes(35))
    res = subprocess.run([str(TOOL), str(int(T.Q8_0)), str(src), str(dst)], capture_output=True)
    assert res.returncode != 0 and b"whole number" in res.stderr


# ---- the default model ----


@pytest.fixture(scope="module")
def model():
    if not MODEL.exists():
        pytest.skip(f"{MODEL} absent (fetch it with `make model`)")
    return GGUFReader(str(MODEL))


def tensor(reader, name):
    for t in reader.tensors:
        if t.name == name:
            return t
    raise KeyError(name)


def test_model_token_embd_rows(model, tmp_path):
    t = tensor(model, "token_embd.weight")
    assert t.tensor_type == T.Q8_0
    rows = np.array([0, 1, 2, 100, 12345, 49151])
    raw = np.ascontiguousarray(t.data[rows])  # (rows, 612 bytes)
    ours = run_tool(T.Q8_0, raw.tobytes(), tmp_path)
    assert_bits_equal(ours, dequantize(raw, T.Q8_0))


@pytest.mark.parametrize(
    "name", ["blk.0.attn_q.weight", "blk.29.ffn_down.weight", "output_norm.weight"]
)
def test_model_whole_tensor(model, name, tmp_path):
    t = tensor(model, name)
    raw = np.ascontiguousarray(t.data)
    ours = run_tool(t.tensor_type, raw.view(np.uint8).tobytes(), tmp_path)
    assert_bits_equal(ours, dequantize(raw, t.tensor_type))

"""Synthetic weights and `sift bench`: parameter counts of the named shapes against the published
configs, the CPU weight_synth values against an independent numpy splitmix64, finite activations
through every layer of synthetic SmolLM2-135M, the FLOP / byte formulas against hand
computations, the output formats (json, jsonl, csv, md) and the bad-input cases."""
import csv
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tiny_gguf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIFT = os.path.join(ROOT, "sift")
TOOL = os.path.join(ROOT, "build", "tests", "tool_synth")


def run(*args, exe=SIFT, timeout=300):
    env = dict(os.environ)
    env.pop("SIFT_MODEL", None)
    env.setdefault("OMP_WAIT_POLICY", "passive")
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=timeout)


def assert_error(r, *needles, code=None):
    assert r.returncode > 0, f"exit {r.returncode}\n{r.stderr}"
    if code is not None:
        assert r.returncode == code, r.stderr
    assert "sift: error:" in r.stderr, r.stderr
    for n in needles:
        assert n.lower() in r.stderr.lower(), f"{n!r} not in {r.stderr!r}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # 2 layers, d 64, 4 heads (head dim 16), 2 KV heads, d_ff 128, vocab 262, tied, ctx 256
    return tiny_gguf.write(str(tmp_path_factory.mktemp("m") / "tiny.gguf"))


# ---- the named shapes -------------------------------------------------------------------------

# Parameter counts from the published config.json files (embedding + untied LM head + final norm
# + per layer: 2 norms, q k v o, gate up down, qwen2's q k v biases), worked out by hand:
PUBLISHED = {
    # 49152*576 + 576 + 30*(2*576 + 576*576 + 2*576*192 + 576*576 + 3*576*1536)
    "smollm2-135m": 134_515_008,
    # 128256*2048 + 2048 + 16*(2*2048 + 2048*2048 + 2*2048*512 + 2048*2048 + 3*2048*8192)
    "llama-3.2-1b": 1_235_814_400,
    # 128256*3072 + 3072 + 28*(2*3072 + 3072*3072 + 2*3072*1024 + 3072*3072 + 3*3072*8192)
    "llama-3.2-3b": 3_212_749_824,
    # 2*128256*4096 + 4096 + 32*(2*4096 + 4096*4096 + 2*4096*1024 + 4096*4096 + 3*4096*14336)
    "llama-3.1-8b": 8_030_261_248,
    # 2*128256*8192 + 8192 + 80*(2*8192 + 8192*8192 + 2*8192*1024 + 8192*8192 + 3*8192*28672)
    "llama-3.1-70b": 70_553_706_496,
    # 2*152064*3584 + 3584 + 28*(2*3584 + 3584*3584 + 2*3584*512 + 3584*3584 + 3*3584*18944
    #                            + 3584 + 2*512)
    "qwen2.5-7b": 7_615_616_512,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_synthetic_param_count(name):
    r = run("bench", "-m", f"synthetic:{name}", "-p", "1024", "--dry-run", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows[0]["n_params"] == PUBLISHED[name]


def test_70b_q4_k_plans_to_fit_an_80_gb_gpu():
    """--dry-run --device cuda plans with the bytes a GPU keeps, no GPU needed: Q4_K blocks (144
    bytes per 256 weights) for every matrix, each norm vector as bf16 + an fp32 copy (6 bytes per
    element), bf16 KV (2 x 80 layers x 1024 x 2 bytes per token). Llama-3.1-70B at 8K fits 80 GB."""
    r = run("bench", "-m", "synthetic:llama-3.1-70b", "--wtype", "q4_k", "--device", "cuda", "-p", "8192",
            "-n", "128", "--dry-run", "--format", "json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    vec = (2 * 80 + 1) * 8192
    mats = PUBLISHED["llama-3.1-70b"] - vec
    assert row["device"] == "cuda" and row["elem_bytes"] == 2
    assert row["weight_bytes"] == mats * 144 // 256 + vec * 6
    assert row["kv_token_bytes"] == 2 * 80 * 1024 * 2
    assert row["kv_bytes"] == (8192 + 128) * 2 * 80 * 1024 * 2
    assert row["plan_bytes"] < 80e9, row   # 43.9 GB: weights + KV + prefill activations
    # the same model converted to bf16 would not: 141 GB of weights
    r = run("bench", "-m", "synthetic:llama-3.1-70b", "--device", "cuda", "-p", "8192", "--dry-run",
            "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["weight_bytes"] == (PUBLISHED["llama-3.1-70b"] - vec) * 2 + vec * 6


def test_synthetic_loaded_count_and_message():
    r = run("bench", "-m", "synthetic:smollm2-135m@3", "-p", "8", "-n", "2", "-r", "1", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "134.5M params" in r.stderr and "0.50 GiB" in r.stderr
    assert json.loads(r.stdout)[0]["model"] == "synthetic:smollm2-135m@3"


# ---- weight_synth against numpy ---------------------------------------------------------------

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix(x):
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def synth_uniform(seed, tensor, n):
    with np.errstate(over="ignore"):
        t = np.array([tensor], np.uint64) * np.uint64(0xD1B54A32D192ED03)
        base = splitmix(np.array([seed], np.uint64) ^ t)
        h = splitmix(base + np.arange(n, dtype=np.uint64))
    top = (h >> np.uint64(40)).astype(np.float64)          # 24 bits
    return (top / 8388608.0 - 1.0).astype(np.float32)     # [-1, 1)


@pytest.mark.parametrize("seed,tensor,rows,cols,scale,offset", [
    (0, 0, 3, 5, 1.0, 0.0),
    (135, 17, 4, 33, 0.0721, 0.0),
    (2**63 + 5, 2**40 + 3, 2, 7, 0.1, 1.0),
])
def test_weight_synth_matches_numpy(seed, tensor, rows, cols, scale, offset):
    r = run("values", str(seed), str(tensor), str(rows), str(cols), repr(scale), repr(offset),
            exe=TOOL)
    assert r.returncode == 0, r.stderr
    got = np.array([float(v) for v in r.stdout.split()], np.float32)
    u = synth_uniform(seed, tensor, rows * cols)
    want = np.float32(offset) + np.float32(scale) * u
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-7)
    assert np.all(u >= -1) and np.all(u < 1)


def test_synth_uniform_is_uniform():
    u = synth_uniform(1, 2, 200_000).astype(np.float64)
    assert abs(u.mean()) < 0.01 and abs(u.std() - 1 / np.sqrt(3)) < 0.01


# ---- RoPE frequencies --------------------------------------------------------------------------

def llama3_inv_freq(theta, hd, factor, low, high, orig):
    """Hugging Face's "llama3" rope scaling, written from its description."""
    inv = theta ** -(np.arange(0, hd, 2, dtype=np.float64) / hd)
    if not factor:
        return inv
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > orig / low, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    medium = (wavelen >= orig / high) & (wavelen <= orig / low)
    return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


@pytest.mark.parametrize("name,theta,hd,factor", [
    ("smollm2-135m", 1e5, 64, 0), ("llama-3.2-1b", 5e5, 64, 32), ("llama-3.2-3b", 5e5, 128, 32),
    ("llama-3.1-8b", 5e5, 128, 8), ("qwen2.5-7b", 1e6, 128, 0)])
def test_rope_freqs(name, theta, hd, factor):
    r = run("freqs", f"synthetic:{name}", exe=TOOL)
    assert r.returncode == 0, r.stderr
    got = np.array([float(v) for v in r.stdout.split()])
    want = llama3_inv_freq(theta, hd, factor, 1, 4, 8192)
    assert len(got) == hd // 2
    np.testing.assert_allclose(got, want, rtol=1e-6)
    if factor:   # the lowest frequencies are divided by the factor, the highest kept
        assert got[-1] == pytest.approx(theta ** -((hd - 2) / hd) / factor, rel=1e-6)
        assert got[0] == 1


# ---- activations through every layer ----------------------------------------------------------

def test_synthetic_smollm2_activations_finite():
    r = run("forward", "synthetic:smollm2-135m", "48", "6", exe=TOOL)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert lines[0]["params"] == PUBLISHED["smollm2-135m"]
    layers = [l for l in lines if "layer" in l]
    steps = [l for l in lines if "step" in l]
    assert len(layers) == 30 and len(steps) == 7
    for l in layers:   # O(1) residual stream, neither vanishing nor exploding
        assert l["finite"] == 1 and 0.1 < l["rms"] < 50 and l["max_abs"] < 1000, l
    for s in steps:    # logits finite and spread (std ~1), not a constant
        assert s["finite"] == 1 and 0.3 < s["std"] < 3, s


# ---- FLOP and byte formulas -------------------------------------------------------------------

def test_dry_run_formulas_tiny(tiny):
    r = run("bench", "-m", tiny, "-p", "10,100", "-n", "4", "--dry-run", "--format", "json")
    assert r.returncode == 0, r.stderr
    a, b = json.loads(r.stdout)
    # tiny: L 2, d 64, heads 4 x hd 16 (qd 64), KV heads 2 (kvd 32), d_ff 128, vocab 262, tied.
    # params: 262*64 + 64 + 2*(2*64 + 64*64 + 2*64*32 + 64*64 + 3*64*128) = 16768 + 64 + 2*36992
    assert a["n_params"] == 90816
    # linear FLOPs per token per layer: 2*(64*64 + 2*64*32 + 64*64 + 3*64*128) = 73728
    # P = 10: 2 * (10*73728 + 4*4*16*(10*11/2)) + 2*64*262 = 2*(737280 + 14080) + 33536
    assert a["prefill_flops"] == pytest.approx(1536256, rel=1e-6)
    # P = 100: 2 * (100*73728 + 256*5050) + 33536
    assert b["prefill_flops"] == pytest.approx(2 * (7372800 + 1292800) + 33536, rel=1e-6)
    # a decode step reads every weight once (tied: the table is the LM head), fp32
    assert a["decode_weight_bytes"] == 90816 * 4
    # K and V per token in the CPU's default f16 cache: 2 layers * 2 * 32 * 2 bytes
    assert a["kv_token_bytes"] == 256 and a["kv_bytes"] == 256 * 14 and a["kv_types"] == "f16/f16"
    # KV + activations for 10 rows (x, xb, q, k, v, att, gate, up) + logits, fp32
    assert a["prefill_mem_bytes"] == 256 * 14 + (10 * (64 + 64 + 64 + 64 + 64 + 256) + 262) * 4
    # an f32 cache asked for: 2 layers * 2 * 32 * 4 bytes; and --elem-bytes alone sets the KV
    # element too (its help: bytes per parameter, activation and KV element)
    for flags in (["-ctk", "f32", "-ctv", "f32"], ["--elem-bytes", "4"]):
        r = run("bench", "-m", tiny, "-p", "10", "-n", "4", "--dry-run", "--format", "json", *flags)
        assert r.returncode == 0, r.stderr
        f = json.loads(r.stdout)[0]
        assert f["kv_token_bytes"] == 512 and f["kv_bytes"] == 512 * 14
        assert f["kv_types"] == "f32/f32"
        assert f["prefill_mem_bytes"] == 512 * 14 + (10 * (64 + 64 + 64 + 64 + 64 + 256) + 262) * 4


def test_dry_run_predicted_times_by_hand():
    """--dry-run --strategy LIST: each strategy's predicted TTFT and TPOT (model/cost.c and the
    strategies' cost hooks) against the work worked out here from the specs, for the Llama-3.1-8B
    shape (2 bytes an element) at 32K with unit rates (1 TFLOP/s, 1 GB/s: seconds = TFLOP + GB)."""
    n, g, L, d, qd, kvd, kvh, hd, vocab = 32768, 32, 32, 4096, 4096, 1024, 8, 128, 128256
    lin = 2 * (d * qd + 2 * d * kvd + qd * d + 3 * d * 14336)   # a row through one layer
    head = 2 * d * vocab                                         # the LM head on one row

    def attn(pairs):                                             # one layer's QK^T and PV
        return 4 * qd * pairs

    def causal(r):
        return r * (r + 1) / 2

    W = (8_030_261_248 - vocab * d) * 2        # a decode step's weights (untied: no embedding)
    row = kvh * 2 * hd * 2                     # one entry's K and V over the KV heads, bf16

    def kv(entries):                           # a step's KV at mid-decode: prompt + g / 2 a layer
        return (entries + L * g / 2) * row

    sink, tail, k, T, B = 4, 16, 100, 2048, 1024
    D, chunk, steps = 16, 32, 7                # specprefill: self-draft ceil(L/2), lookahead 8
    m = (-(-(n // chunk) * 3 // 10) + 1) * chunk   # ceil(0.3 chunks) + the last: 309 chunks
    mid = n - sink - tail
    want = {  # strategy: (prefill FLOPs, prefill step bytes, decode bytes)
        "full": (L * (n * lin + attn(causal(n))) + head, 0, W + kv(L * n)),
        # K = ceil(0.875 L) = 28 layers of n rows; above, the anchor and the last row
        "speed": (28 * (n * lin + attn(causal(n))) + 4 * (2 * lin + attn(3)) + head, 0,
                  W + kv(28 * n + 4 * 2)),
        # layers 0..15 n rows, 16..31 T rows; each scores its rows by the 8-row window (QK^T)
        # and keeps B
        "fastkv": (16 * (n * lin + attn(causal(n)) + attn(8 * n) / 2)
                   + 16 * (T * lin + attn(causal(T)) + attn(8 * T) / 2) + head, 0, W + kv(L * B)),
        # l = 16 layers of n rows, every row's K/V for the 16 above, the last row through them
        "swiftkv": (16 * (n * lin + attn(causal(n))) + 16 * n * 4 * d * kvd
                    + 16 * (lin + attn(n)) + head, 0, W + kv(L * n)),
        # D layers of n rows and row 0's scores; 7 lookahead steps (D / L of the weights and
        # their KV); the draft's LM head for each lookahead token (the prompt pass's row and 6
        # steps: the last step's token is never drawn); the main model on m rows
        "specprefill": (D * (n * lin + attn(causal(n)) + attn(n) / 2) + 7 * head
                        + L * (m * lin + attn(causal(m))) + head,
                        steps * W * D / L + sum(D * (n + t + 1) * row for t in range(steps)),
                        W + kv(L * m)),
        # the selector reads every mid K row; the union of 4 query heads' top 100, the anchors
        # and the decode tokens exactly
        "topk": (L * (n * lin + attn(causal(n))) + head, 0,
                 W + L * kvh * (mid * hd * 2 + (4 * k + sink + tail + g / 2) * hd * 4)),
    }
    r = run("bench", "-m", "synthetic:llama-3.1-8b", "--elem-bytes", "2", "--dry-run", "-p", str(n),
            "-n", str(g), "--strategy", ",".join(want), "--rates", "1,1,1,1", "--tsp-len", str(T),
            "--kv-len", str(B), "--topk", str(k), "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = {x["strategy"]: x for x in json.loads(r.stdout)}
    assert list(rows) == list(want)
    for name, (flops, step, dec) in want.items():
        x = rows[name]
        assert x["pred_prefill_flops"] == pytest.approx(flops, rel=1e-9), name
        assert x["pred_ttft_ms"] == pytest.approx(1e3 * (flops / 1e12 + step / 1e9), rel=1e-6), name
        assert x["pred_tpot_ms"] == pytest.approx(1e3 * dec / 1e9, rel=1e-6), name
        assert x["pred_ttft_x_full"] == pytest.approx(rows["full"]["pred_ttft_ms"] / x["pred_ttft_ms"],
                                                      abs=1e-3)
    # full's prediction is the plan's own FLOPs; without rates (the CPU) the times are null
    assert rows["full"]["pred_prefill_flops"] == pytest.approx(rows["full"]["prefill_flops"], rel=1e-6)
    r = run("bench", "-m", "synthetic:llama-3.1-8b", "--dry-run", "-p", "1024", "--format", "json")
    assert r.returncode == 0, r.stderr
    x = json.loads(r.stdout)[0]
    assert x["strategy"] == "full" and x["pred_ttft_ms"] is None and x["pred_tpot_x_full"] is None
    # a 1B draft for the 8B: its 16 layers over the prompt, its weights for the lookahead
    r = run("bench", "-m", "synthetic:llama-3.1-8b", "--device", "cuda", "--dry-run", "-p", str(n),
            "-n", str(g), "--strategy", "full,specprefill", "--draft", "synthetic:llama-3.2-1b",
            "--format", "json")
    assert r.returncode == 0, r.stderr
    self_draft = rows["specprefill"]["pred_prefill_flops"]
    drafted = json.loads(r.stdout)[1]
    assert drafted["pred_prefill_flops"] < 0.6 * self_draft and drafted["pred_ttft_x_full"] > 2


@pytest.mark.parametrize("rates", ["1,2,3", "1,2,3,0", "h100", "1,2,3,4,5", "1,2,3,inf"])
def test_dry_run_bad_rates(rates):
    assert_error(run("bench", "-m", "synthetic:llama-3.1-8b", "--dry-run", "-p", "64", "--rates",
                     rates), "--rates", code=2)
    assert_error(run("bench", "-m", "synthetic:llama-3.1-8b", "-p", "64", "--rates", "h200"),
                 "--rates only applies to --dry-run", code=2)


def test_synthetic_draft(tiny):
    """specprefill --draft synthetic:NAME in a real bench run (the paper's configuration at real
    shapes without weight files): the draft's prompt pass counts in the rows (a same-shape draft:
    all of the prompt's rows plus the kept chunks' of the main model); refusals name the cause."""
    r = run("bench", "-m", "synthetic:smollm2-135m", "--strategy", "full,specprefill", "--draft",
            "synthetic:smollm2-135m@2", "-p", "256", "-n", "2", "-r", "1", "--format", "json")
    assert r.returncode == 0, r.stderr
    full, spec = json.loads(r.stdout)
    assert full["rows_pct_of_full"] == 100
    # the draft's 30 layers over 256 rows (+ 7 lookahead rows each), then 3 + 1 of 8 chunks kept:
    # 128 of 256 rows through the main model
    assert spec["rows_pct_of_full"] == pytest.approx(100 * (256 + 7 + 128) / 256, abs=0.1)
    assert "draft: synthetic smollm2-135m" in r.stderr
    assert_error(run("bench", "-m", "synthetic:smollm2-135m", "--strategy", "specprefill", "--draft",
                     tiny, "-p", "64", "-n", "2"), "no tokenizer", "synthetic:NAME", code=1)
    assert_error(run("bench", "-m", "synthetic:smollm2-135m", "--strategy", "specprefill", "--draft",
                     "synthetic:llama-3.2-1b", "-p", "64", "-n", "2"), "vocabulary of 128256",
                 "the model 49152", code=1)


def test_hook_time_share():
    """hook_ms: the time of TTFT in the strategy's prefill hooks; full has none, fastkv's window
    scoring some, and it is a part of TTFT."""
    r = run("bench", "-m", "synthetic:smollm2-135m", "--strategy", "full,fastkv", "-p", "512", "-n",
            "2", "-r", "1", "--format", "json")
    assert r.returncode == 0, r.stderr
    full, fastkv = json.loads(r.stdout)
    assert full["hook_ms"] == 0 and full["hook_pct_of_ttft"] == 0
    assert 0 < fastkv["hook_ms"] < fastkv["ttft_ms"]
    assert fastkv["hook_pct_of_ttft"] == pytest.approx(100 * fastkv["hook_ms"] / fastkv["ttft_ms"], abs=0.2)


def test_dry_run_bf16_bytes():
    r = run("bench", "-m", "synthetic:llama-3.1-8b", "-p", "130944", "-n", "128", "--dry-run",
            "--elem-bytes", "2", "--format", "json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    # untied: the embedding is gathered, not read; everything else once at 2 bytes
    assert row["decode_weight_bytes"] == (8_030_261_248 - 128256 * 4096) * 2
    # 32 layers * 2 * 8 KV heads * 128 * 2 bytes = 131072 bytes per token
    assert row["kv_token_bytes"] == 131072 and row["kv_bytes"] == 131072 * 131072
    # 32 * (130944*2*(4096*4096 + 2*4096*1024 + 4096*4096 + 3*4096*14336)
    #       + 4*32*128*130944*130945/2) + 2*4096*128256
    lin = 2 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    want = 32 * (130944 * lin + 4 * 32 * 128 * 130944 * 130945 / 2) + 2 * 4096 * 128256
    assert row["prefill_flops"] == pytest.approx(want, rel=1e-6)


def test_dry_run_quantised_synthetic_bytes():
    # --wtype q4_k: the matrices as Q4_K blocks (144 bytes per 256 weights), the 2*16 + 1 norm
    # vectors of d = 2048 as fp32; Llama-3.2-1B is tied, so a decode step reads them all
    r = run("bench", "-m", "synthetic:llama-3.2-1b", "--wtype", "q4_k", "-p", "1024", "-n",
            "128", "--dry-run", "--format", "json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    vec = 33 * 2048
    want = (1_235_814_400 - vec) * 144 // 256 + vec * 4
    assert row["weight_bytes"] == want and row["decode_weight_bytes"] == want
    assert row["plan_bytes"] == want + row["prefill_mem_bytes"]


def test_wtype_errors():
    assert_error(run("bench", "-m", "synthetic:smollm2-135m", "--wtype", "q4_k", "-p", "16",
                     "--dry-run"), "whole blocks of 256", "576", code=1)
    assert_error(run("bench", "-m", "synthetic:smollm2-135m", "--wtype", "q9_9", "-p", "16"),
                 "--wtype must be one of f32, f16", "(got 'q9_9')", code=2)


def test_quantised_synthetic_runs():
    r = run("bench", "-m", "synthetic:smollm2-135m", "--wtype", "q8_0", "-p", "16", "-n", "4",
            "-r", "1", "-t", "2", "--format", "json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    assert row["tg_avg_ts"] > 0 and row["pp_avg_ts"] > 0
    assert "Q8_0" in r.stderr


def test_thread_list_runs_the_table_per_count():
    """-t 1,2: one pass per thread count (its own ceilings), rows in that order; the outputs
    are the same computation (greedy on the same seeded tokens), only faster or slower."""
    r = run("bench", "-m", "synthetic:smollm2-135m", "--wtype", "q8_0", "-p", "16", "-n", "2",
            "-r", "1", "-t", "1,2", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [x["threads"] for x in rows] == [1, 2]
    assert all(x["pp_avg_ts"] > 0 and x["tg_avg_ts"] > 0 for x in rows)
    assert r.stderr.count("bench: ceilings on cpu") == 2
    for bad, msg in (("0", "-t"), ("2000", "-t 2000 is out of range [1, 1024]"), ("1,,2", "empty")):
        assert_error(run("bench", "-m", "synthetic:smollm2-135m", "-p", "16", "-t", bad), msg, code=2)


# ---- output formats ---------------------------------------------------------------------------

FIELDS = ["model", "strategy", "backend", "threads", "n_prompt", "n_gen", "parallel", "reps", "ttft_ms",
          "ttft_stddev_ms", "pp_avg_ts", "pp_stddev_ts", "tpot_ms", "tpot_stddev_ms", "tg_avg_ts",
          "tg_stddev_ts", "agg_tg_ts", "agg_tg_stddev_ts", "agg_x_par1", "kv_bytes", "kv_gib", "hook_ms", "hook_pct_of_ttft", "rows_pct_of_full", "pp_x_full",
          "tg_x_full",
          "prefill_flops_full_eq", "prefill_tflops_full_eq", "peak_tflops", "mfu_pct_full_eq",
          "decode_bytes_per_token", "decode_gbs", "peak_gbs", "mbu_pct", "kv_read_mib", "roofline_ms",
          "device_counters", "prefix_tokens"]
BENCH = ["-p", "16,24", "-n", "4", "-r", "2", "--strategy", "full,streamingllm"]


@pytest.fixture(scope="module")
def bench_json(tiny):
    r = run("bench", "-m", tiny, *BENCH, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def test_json_is_one_document(bench_json):
    rows, err = bench_json
    assert [(x["n_prompt"], x["strategy"]) for x in rows] == [
        (16, "full"), (16, "streamingllm"), (24, "full"), (24, "streamingllm")]
    for x in rows:
        assert list(x) == FIELDS
        assert x["backend"] == "cpu" and x["reps"] == 2 and x["n_gen"] == 4
    full = rows[0]
    assert full["pp_x_full"] == 1 and full["tg_x_full"] == 1 and full["rows_pct_of_full"] == 100
    # measured cache = (16 + 4) tokens * 256 bytes (2 layers * 2 * 32 elements of the default
    # f16 cache); decode reads the weights + mid-decode KV
    assert full["kv_bytes"] == 20 * 256
    assert full["decode_bytes_per_token"] == pytest.approx(90816 * 4 + (20 - 2) * 256, rel=1e-6)
    assert full["prefill_flops_full_eq"] == pytest.approx(
        2 * (16 * 73728 + 256 * 16 * 17 / 2) + 33536, rel=1e-6)
    # the CPU backend measures its ceilings: MFU and MBU are numbers, consistent with the rates
    assert full["peak_tflops"] > 0 and full["peak_gbs"] > 0
    assert full["mfu_pct_full_eq"] == pytest.approx(
        100 * full["prefill_tflops_full_eq"] / full["peak_tflops"], rel=0.02, abs=0.05)
    assert "bench: ctx 24 [2/2] rep 2/2 streamingllm" in err   # progress names the cell


def test_csv_and_jsonl(tiny):
    r = run("bench", "-m", tiny, *BENCH, "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 4 and list(rows[0]) == FIELDS
    assert rows[1]["strategy"] == "streamingllm" and float(rows[0]["pp_x_full"]) == 1
    r = run("bench", "-m", tiny, "-p", "16", "-n", "2", "-r", "1", "--format", "jsonl")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    assert [list(x) for x in rows] == [FIELDS]
    # one repetition, one decode step: TPOT is its time, tok/s its inverse
    assert rows[0]["tpot_ms"] == pytest.approx(1000 / rows[0]["tg_avg_ts"], rel=0.01)
    assert rows[0]["tpot_stddev_ms"] == 0


def test_markdown_table(tiny):
    r = run("bench", "-m", tiny, "-p", "16", "-n", "2", "-r", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("| model | strategy | backend | threads | ctx | gen | par | TTFT ms |")
    assert "MFU % (full-eq)" in lines[0] and "MBU %" in lines[0]
    assert set(lines[1]) <= set("|-:") and len(lines) == 3
    assert lines[2].count("|") == lines[0].count("|")


def test_parallel_rows(tiny):
    # --parallel 1,3: per strategy a row for 1 sequence and one for 3 decoded together; the
    # aggregate rate is the 3 sequences' tokens over the shared steps' time
    r = run("bench", "-m", tiny, "-p", "16", "-n", "6", "-r", "1", "--parallel", "1,3",
            "--strategy", "full,topk", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["parallel"], x["strategy"]) for x in rows] == [
        (1, "full"), (1, "topk"), (3, "full"), (3, "topk")]
    for x in rows:
        assert x["agg_tg_ts"] == pytest.approx(x["parallel"] * x["tg_avg_ts"], rel=1e-3)   # as printed
    assert rows[0]["agg_x_par1"] == 1
    assert rows[2]["agg_x_par1"] == pytest.approx(rows[2]["agg_tg_ts"] / rows[0]["agg_tg_ts"], abs=0.006)
    assert rows[3]["tg_x_full"] == pytest.approx(rows[3]["tg_avg_ts"] / rows[2]["tg_avg_ts"], abs=0.006)
    assert_error(run("bench", "-m", tiny, "--parallel", "0"), "--parallel", code=2)


def test_no_decode_gives_nulls(tiny):
    r = run("bench", "-m", tiny, "-p", "8", "-n", "1", "-r", "1", "--format", "json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    assert row["tpot_ms"] is None and row["tg_avg_ts"] is None and row["mbu_pct"] is None


# ---- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["-p", "1024,,2048"], "empty"),
    (["-p", "12a"], "invalid integer"),
    (["-p", "0"], "out of range"),
    (["-p", ",".join(["8"] * 17)], "more than 16"),
    (["--format", "xml"], "--format must be one of md, json, jsonl, csv"),
    (["-r", "0"], "out of range"),
    (["-p"], "needs a value"),
    (["--elem-bytes", "2"], "--dry-run"),
    (["--bogus", "1"], "unknown flag"),
])
def test_bad_flags(tiny, args, needle):
    assert_error(run("bench", "-m", tiny, *args), needle, code=2)


def test_ctx_beyond_model(tiny):
    assert_error(run("bench", "-m", tiny, "-p", "16,250", "-n", "10"), "260", "context of 256",
                 "largest -p is 246", code=2)
    assert_error(run("bench", "-m", tiny, "-p", "250", "-n", "10", "--dry-run"), "256", code=2)


def test_kv_beyond_memory(tmp_path):
    # one layer, two heads of dimension 1024, a context of 4M tokens: the KV cache alone at 4M
    # tokens is 4M * 2 * 2 * 1024 * 2 bytes (the default f16 cache) = 32 GiB, plus the activations
    # (of 2048 rows: the prefill runs in chunks, so the cache alone must exceed the memory)
    path = tiny_gguf.write(str(tmp_path / "wide.gguf"), n_layer=1, d=2048, n_head=2, n_kv=2,
                           ff=64, ctx=1 << 22)
    avail = int([l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemAvailable")][0])
    if avail * 1024 > 100 << 30:
        pytest.skip("more than 100 GiB available")
    assert_error(run("bench", "-m", path, "-p", "4000000", "-n", "1"), "GiB", "KV cache",
                 "available", code=1)


def test_unknown_synthetic_lists_names():
    assert_error(run("bench", "-m", "synthetic:gpt-5"), "unknown synthetic model", "smollm2-135m",
                 "llama-3.1-8b", "qwen2.5-7b")
    assert_error(run("bench", "-m", "synthetic:smollm2-135m@x1"), "seed")


def test_synthetic_weights_beyond_memory():
    avail = int([l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemAvailable")][0])
    if avail * 1024 > 28 << 30:
        pytest.skip("enough memory for 8B fp32 weights: would really load them")
    assert_error(run("bench", "-m", "synthetic:llama-3.1-8b", "-p", "16", "-n", "2"),
                 "29.92 GiB", "available")   # 8030261248 * 4 / 2**30


def test_synthetic_takes_no_prompt():
    assert_error(run("-m", "synthetic:smollm2-135m", "-p", "hi"), "no tokenizer", "sift bench",
                 code=2)
    assert_error(run("bench", "-m", "synthetic:smollm2-135m", "--draft", "x.gguf"), "tokenizer")


def test_prefix_rows():
    """--prefix N: after each strategy's own row, one whose prefill starts from the prompt's first N
    tokens prefilled once (untimed): its rows processed are the rest's alone, counted against the
    row's own prompt, and full's own row stays the reference (pp x full 1.00 on it)."""
    r = run("bench", "-m", "synthetic:smollm2-135m", "-p", "600", "-n", "2", "-r", "1", "--strategy",
            "full,topk", "--prefix", "512", "--format", "jsonl")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    assert [(x["strategy"], x["prefix_tokens"]) for x in rows] == [("full", 0), ("topk", 0), ("full", 512), ("topk", 512)]
    assert rows[0]["pp_x_full"] == 1 and rows[2]["pp_x_full"] > 1
    assert abs(rows[2]["rows_pct_of_full"] - 100 * (600 - 512) / 600) < 0.1, rows[2]["rows_pct_of_full"]
    bad = run("bench", "-m", "synthetic:smollm2-135m", "-p", "520", "--prefix", "512")
    assert bad.returncode == 2 and "leaves fewer than 17 tokens" in bad.stderr, bad.stderr

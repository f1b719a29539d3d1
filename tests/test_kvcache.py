"""tests/test_kvcache.py — KV cache types end to end (--cache-type-k/-v): perplexity, greedy text
and a needle-in-a-haystack answer of the default model with each type against the f32 cache, the
CPU's default (f16), the bytes the cache takes (counted by hand from GGUF's Q8_0 layout), the
memory plan of the Llama-3.1-8B shape at 128K by formula
(bench --dry-run: nothing allocated), and the refusals. The kernels' error bounds and planted
faults are in tests/test_kvcache.c."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tiny_gguf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIFT = os.path.join(ROOT, "sift")
MODEL = os.path.join(ROOT, os.environ.get("SIFT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
need_model = pytest.mark.skipif(not os.path.exists(MODEL), reason="default model not fetched")
GIB = 1 << 30


def sift(*args):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    env.pop("SIFT_MODEL", None)
    return subprocess.run([SIFT, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=900)


TEXT = ("The river runs past the old mill and into the valley, where the farmers grow wheat and "
        "barley. In spring the water rises and the children watch the boats go by. Every autumn "
        "the village holds a fair with music, bread and apples from the orchards on the hill. "
        "The miller keeps a ledger of every sack of grain, and the baker buys the flour each "
        "Monday before dawn. Last year a storm broke the wooden bridge near the church, so the "
        "council asked a carpenter from the next town to build a stone one instead. It took "
        "him three months, two apprentices and more money than anyone had expected, but the "
        "new bridge survived the floods of March without a crack. Travellers now stop at the "
        "inn beside it; the landlady serves fish from the river, cheese from the dairy on the "
        "eastern road and a dark beer brewed behind the stables. On clear nights the old "
        "astronomer who lives above the post office carries his telescope to the bridge and "
        "tells anyone who will listen about the rings of Saturn, the moons of Jupiter and the "
        "comet he swears he saw in the winter of his tenth year. The schoolteacher, who is "
        "less patient, reminds the children that homework is due on Thursday and that the "
        "library closes at six. In the hills above the village, shepherds move their flocks "
        "between summer pastures, and the sound of bells drifts down on the wind. A railway "
        "was planned once, surveyed and staked out, but the company went bankrupt before a "
        "single rail was laid, and the embankment is now a path lined with blackberries.")


def ppl(tmp_path, t):
    f = tmp_path / "t.txt"
    f.write_text(TEXT)
    r = sift("ppl", "-m", MODEL, "-f", f, "-c", 128, "--json", "-ctk", t, "-ctv", t)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@need_model
def test_ppl_per_cache_type(tmp_path):
    # The same chunks scored with each cache type. The quality bar (not a derived bound): each
    # 16- or 8-bit cache within 1% of the f32 cache's perplexity; the kernels' derived bounds are
    # checked in test_kvcache.c. The tokens scored must be the same.
    ref = ppl(tmp_path, "f32")
    for t in ("bf16", "f16", "q8_0"):
        got = ppl(tmp_path, t)
        assert got["tokens_scored"] == ref["tokens_scored"]
        assert abs(got["ppl"] / ref["ppl"] - 1) < 0.01, (t, got["ppl"], ref["ppl"])
        print(f"ppl f32 {ref['ppl']:.4f} {t} {got['ppl']:.4f}")


@need_model
@pytest.mark.parametrize("k,v", [("bf16", "bf16"), ("f16", "f16"), ("q8_0", "q8_0"),
                                 ("q8_0", "f16")])
def test_greedy_capital_of_france(k, v):
    r = sift("-m", MODEL, "-p", "What is the capital of France?", "--chat", "-n", 16, "--temp", 0,
             "-ctk", k, "-ctv", v, "-q")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout


def run_json(prompt_file, t, n=16):
    r = sift("-m", MODEL, "-f", prompt_file, "--chat", "-n", n, "--temp", 0, "-ctk", t, "-ctv", t,
             "--json", "-q")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[0])


@need_model
def test_needle_per_cache_type(tmp_path):
    # Needle in a haystack: a pass code planted halfway through ~1000 tokens of filler (TEXT's
    # sentences three times over), then the question. The expectation is the planted fact itself:
    # the f32 cache's answer holds the code; each other type answers greedily with the same text.
    # A control without the needle shows the code comes from the cache (not the question), and
    # the records' kv_bytes (rows of 256, 128, 128, 68 bytes: head_dim 64) show each type ran.
    sents = TEXT.split(". ") * 3
    code, fact = "4817", "The pass code for the blue door is 4817"
    question = "\n\nQuestion: What is the pass code for the blue door?"
    f = tmp_path / "needle.txt"
    f.write_text(". ".join(sents[:len(sents) // 2] + [fact] + sents[len(sents) // 2:]) + question)
    ref = run_json(f, "f32")
    assert 900 <= ref["timings"]["prompt_n"] <= 2048
    assert code in ref["text"], ref["text"]
    row = {"f32": 256, "bf16": 128, "f16": 128, "q8_0": 68}
    for t in ("bf16", "f16", "q8_0"):
        got = run_json(f, t)
        assert got["text"] == ref["text"], (t, got["text"], ref["text"])
        assert got["kv_bytes"] * row["f32"] == ref["kv_bytes"] * row[t], t
    f.write_text(". ".join(sents) + question)
    assert code not in run_json(f, "f16")["text"]


@need_model
def test_cache_bytes_by_type():
    # SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64. A row: f32 256 bytes, bf16 128,
    # q8_0 2 blocks of 34 = 68. The record's kv_bytes: layers * heads * capacity * (K row + V row).
    # No flag (auto) is f16 on the CPU: 128 bytes a row.
    seen = {}
    for k, v in (("f32", "f32"), ("q8_0", "bf16"), ("q8_0", "q8_0"), ("auto", "auto"), (None, None)):
        flags = ["-ctk", k, "-ctv", v] if k else []
        r = sift("-m", MODEL, "-p", "hi", "-n", 1, "--json", *flags)
        assert r.returncode == 0, r.stderr
        seen[k, v] = json.loads(r.stdout.splitlines()[0])["kv_bytes"]
    row = {"f32": 256, "bf16": 128, "q8_0": 68, "auto": 128, None: 128}
    cap = seen["f32", "f32"] / (30 * 3 * 512)
    assert cap == int(cap) and cap >= 1
    for (k, v), got in seen.items():
        assert got == 30 * 3 * cap * (row[k] + row[v]), (k, v, got)


def dry(t, p=131071, n=1):
    r = sift("bench", "-m", "synthetic:llama-3.1-8b", "--wtype", "q4_k", "-p", p, "-n", n,
             "--dry-run", "--format", "json", "-ctk", t, "-ctv", t)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]


def test_plan_8b_at_128k_fits_24gib_with_q8_0():
    # Llama-3.1-8B: 32 layers, 8 KV heads, head_dim 128; 131072 tokens of cache.
    # f32: 131072 * 32 * 8 * 2 * 128 * 4 bytes = 32 GiB; q8_0: a row of 128 is 4 blocks of 34 =
    # 136 bytes, so 131072 * 32 * 8 * 2 * 136 = 8.5 GiB.
    f32, q8 = dry("f32"), dry("q8_0")
    assert f32["kv_types"] == "f32/f32" and q8["kv_types"] == "q8_0/q8_0"
    # the default (auto) plans the CPU's f16 cache: 2 bytes an element, 16 GiB
    f16 = dry("auto")
    assert f16["kv_types"] == "f16/f16" and f16["kv_bytes"] == 131072 * 32 * 8 * 2 * 128 * 2 == 16 * GIB
    assert f32["kv_bytes"] == 131072 * 32 * 8 * 2 * 128 * 4 == 32 * GIB
    assert q8["kv_bytes"] == 131072 * 32 * 8 * 2 * 136 == 8.5 * GIB
    assert f32["kv_token_bytes"] == 32 * 8 * 2 * 128 * 4 and q8["kv_token_bytes"] == 32 * 8 * 2 * 136
    # the weights (Q4_K blocks) plus the cache a decode at that depth holds: over 24 GiB with
    # f32, under it with q8_0 (the same weights in both)
    assert f32["weight_bytes"] == q8["weight_bytes"] < 5 * GIB
    assert f32["decode_plan_bytes"] == f32["weight_bytes"] + f32["kv_bytes"] > 24 * GIB
    assert q8["decode_plan_bytes"] == q8["weight_bytes"] + q8["kv_bytes"] < 24 * GIB
    # a prefill of the whole 128K prompt in one pass also holds its activations: counted with the
    # smaller cache too
    assert f32["prefill_mem_bytes"] - q8["prefill_mem_bytes"] == f32["kv_bytes"] - q8["kv_bytes"]


@pytest.mark.parametrize("args,needle", [
    (["-p", "hi", "--cache-type-k", "q4_0"], "--cache-type-k must be one of auto, f32, bf16, f16, q8_0 (got 'q4_0')"),
    (["-p", "hi", "-ctv", "int8"], "-ctv must be one of auto, f32, bf16, f16, q8_0 (got 'int8')"),
    (["ppl", "-f", "x.txt", "--cache-type-v", "fp8"], "--cache-type-v must be one of"),
])
def test_unknown_cache_type_is_one_line(args, needle):
    r = sift(*args)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_cuda_takes_bf16_only():
    r = sift("bench", "-m", "synthetic:llama-3.2-1b", "--device", "cuda", "--dry-run", "-p", 128,
             "-n", 1, "-ctk", "q8_0")
    if "no CUDA backend" in r.stderr:
        pytest.skip("built without nvcc")
    assert r.returncode == 2   # a cache type the device cannot take: a usage error (docs/usage.md's exit codes)
    assert "--cache-type-k q8_0: the cuda backend's KV cache is bf16 only" in r.stderr
    assert sift("bench", "-m", "synthetic:llama-3.2-1b", "--device", "cuda", "--dry-run", "-p", 128,
                "-n", 1, "-ctk", "bf16", "-ctv", "bf16").returncode == 0


def test_q8_0_needs_head_dim_multiple_of_32(tmp_path):
    # tiny_gguf's default: d 64, 4 heads: head_dim 16 (q8_0 blocks are 32 wide); bf16 is fine
    tiny = tiny_gguf.write(str(tmp_path / "tiny.gguf"))
    r = sift("-m", tiny, "-p", "hi", "-n", 2, "--temp", 0, "-ctv", "q8_0")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("sift: error")]
    assert lines == [f"sift: error: --cache-type-v q8_0 needs a head_dim that is a multiple of 32; "
                     f"{tiny} has 16"], r.stderr
    r = sift("-m", tiny, "-p", "hi", "-n", 2, "--temp", 0, "-ctk", "bf16", "-ctv", "f16")
    assert r.returncode == 0, r.stderr

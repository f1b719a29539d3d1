"""tests/test_chunk.py — chunked prefill (--ubatch U): a plain prefill runs its prompt in passes of
at most U rows appending to one cache, so that long prompts run and plan in the activations of U
rows.

* The memory plan by formula (bench --dry-run, nothing allocated): the Llama-3.1-8B shape at 128K
  with a q8_0 cache, its numbers hand-computed from the shape — with the default U = 2048 the
  activations of 2048 rows, weights + KV + activations under 24 GiB; without chunking (--ubatch 0,
  U >= n, or a strategy that keeps one pass) all n rows, over 24 GiB.
* The plan before loading (sift -c N): a -c whose one-pass activations exceed this machine's whole
  memory is refused with the numbers (the rows counted named), and runs with the default U.
* Fidelity on the default model, greedy (tests/tool_logits, the CPU backend): where every chunk's
  row count is of the one-pass row class (fwd_row_class) and above attn_cpu.c's small-query path
  (8 rows), the first-token logits equal one pass bit for bit: the products are the same
  (fwd_row_class), and each query row's attention is the same sgemm dot products over the same
  keys (the cache entries past a row's position add exact zeros). Where the last chunk is one row
  (another row class: the int8 row kernels), the logits equal, bit for bit, a one-pass prefill of
  the other rows followed by a decode step of the last token, the path every generated token takes
  (and differ from one pass: the check sees whether chunking happened). The texts of `sift`
  with U = 64 and 100 (neither dividing the prompt's length) equal one pass's.
* A --prompts job with --parallel 2 and a prompt longer than U (run alone in chunks, the short
  one packed as before): the texts of -ub 0 one by one."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_kvcache import TEXT  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIFT = os.path.join(ROOT, "sift")
TOOL = os.path.join(ROOT, "build", "tests", "tool_logits")
MODEL = os.path.join(ROOT, os.environ.get("SIFT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
need_model = pytest.mark.skipif(not os.path.exists(MODEL), reason="default model not fetched")
need_tool = pytest.mark.skipif(not os.path.exists(TOOL), reason="make test-bins first")
GIB = 1 << 30


def sift(*args, **kw):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    env.pop("SIFT_MODEL", None)
    return subprocess.run([SIFT, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=900, **kw)


def dry(*extra, p=131071):
    r = sift("bench", "-m", "synthetic:llama-3.1-8b", "--wtype", "q4_k", "-p", p, "-n", 1,
             "--dry-run", "--format", "json", "-ctk", "q8_0", "-ctv", "q8_0", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]


# Llama-3.1-8B: 32 layers, d 4096, 32 heads x 128 (qd 4096), 8 KV heads (kvd 1024), d_ff 14336,
# vocab 128256, untied, 8030261248 parameters of which 2*32 + 1 norm vectors of 4096.
N = 131071 + 1                                 # the prompt and the one decoded token
KV_TOK = 32 * 8 * 2 * 136                      # q8_0: a row of 128 is 4 blocks of 34 bytes
PER_ROW = 2 * 4096 + 4096 + 2 * 1024 + 4096 + 2 * 14336   # x, xb, q, k, v, att, gate, up
VEC = 65 * 4096
WEIGHTS = (8_030_261_248 - VEC) * 144 // 256 + VEC * 4     # Q4_K blocks, fp32 norms


def plan(rows):
    """Hand-computed: KV of N tokens + fp32 activations of `rows` rows + one row of logits."""
    return N * KV_TOK + (rows * PER_ROW + 128256) * 4


def test_8b_at_128k_q8_0_plans_under_24gib_in_chunks():
    row = dry()
    assert row["kv_bytes"] == N * KV_TOK == 8.5 * GIB
    assert row["weight_bytes"] == WEIGHTS
    assert row["prefill_rows"] == 2048
    assert row["prefill_mem_bytes"] == plan(2048)
    assert row["plan_bytes"] == WEIGHTS + plan(2048) < 24 * GIB
    assert dry("--ubatch", 4096)["plan_bytes"] == WEIGHTS + plan(4096) < 24 * GIB
    assert dry("--ubatch", 1000)["plan_bytes"] == WEIGHTS + plan(1000)
    # one pass: all 131071 rows of activations (23 GiB of them), over 24 GiB
    for extra in (["--ubatch", 0], ["-ub", 131071], ["--ubatch-size", 200000],
                  ["--strategy", "fastkv"], ["--strategy", "full,speed"]):
        row = dry(*extra)
        assert row["prefill_rows"] == 131071, extra
        assert row["plan_bytes"] == WEIGHTS + plan(131071) > 24 * GIB, extra
    # the decode strategies prefill like full (the prompt but its last token): they chunk
    assert dry("--strategy", "topk,topk+phi,full+topk")["prefill_rows"] == 2048


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    pytest.skip("no /proc/meminfo")


@need_model
def test_plan_refuses_one_pass_and_runs_chunked():
    # SmolLM2-135M: 30 layers, d 576, 9 heads x 64 (qd 576), 3 KV heads (kvd 192), d_ff 1536,
    # vocab 49152. q8_0 KV: 30 * 3 * 2 * 68 bytes a token; fp32 activations 5760 floats a row.
    kv_tok, act = 30 * 3 * 2 * 68, (2 * 576 + 576 + 2 * 192 + 576 + 2 * 1536) * 4
    total = meminfo("MemTotal")
    ctx = total // (kv_tok + act) + 1024   # one pass needs more than the machine has
    if ctx > 1 << 22:
        pytest.skip("more memory than the largest -c can exceed")
    r = sift("-c", ctx, "-ctk", "q8_0", "-ctv", "q8_0", "-ub", 0, "-p", "hi", "-n", 1)
    assert r.returncode != 0
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert f"activations ({ctx} rows) for -c {ctx}: " in line, line
    rest = ctx * kv_tok + ctx * act + 49152 * 4
    assert f"KV cache (K q8_0, V q8_0: {ctx * kv_tok / GIB:.2f} GiB)" in line, line
    assert f"for -c {ctx}: {rest / GIB:.2f} GiB)" in line, line
    # a strategy that keeps one pass is refused whatever --ubatch, and not told to chunk
    r = sift("-c", ctx, "-ctk", "q8_0", "-ctv", "q8_0", "--strategy", "speed", "-p", "hi", "-n", 1)
    assert r.returncode != 0 and f"activations ({ctx} rows)" in r.stderr
    assert "--ubatch" not in r.stderr
    # in chunks of 2048 rows: KV of ctx tokens and the activations of 2048 rows
    chunked = ctx * kv_tok + 2048 * act + 49152 * 4 + 0.2 * GIB   # + the weights, generously
    if meminfo("MemAvailable") < chunked * 1.2:
        pytest.skip("too little memory available now to plan the chunked run")
    r = sift("-c", ctx, "-ctk", "q8_0", "-ctv", "q8_0", "-p", "hi", "-n", 1, "--temp", 0)
    assert r.returncode == 0, r.stderr


def logits(out, ids, ubatch, greedy=1, steps=None):
    import numpy as np
    args = [TOOL, MODEL, str(out), "--strategy", "full", "--greedy", str(greedy), "--ubatch",
            str(ubatch)]
    if steps:
        args += ["--steps", str(steps)]
    r = subprocess.run(args + [str(i) for i in ids], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")))
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=np.float32), r.stdout.split()


def row_class(n):
    r = subprocess.run([TOOL, MODEL, os.devnull, "--class", str(n), "1"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return int(r.stderr.split("class ")[1].split()[1])


@need_model
@need_tool
def test_chunked_logits_equal_one_pass(tmp_path):
    import numpy as np
    ids = [(37 * i + 11) % 40000 + 100 for i in range(300)]
    # the prompt's last token is the greedy continuation of the first 300: a one-pass prefill of
    # those and a decode step of it give its logits along the decode path (row 1 of --steps)
    _, toks = logits(tmp_path / "a.f32", ids, 0, greedy=2, steps=tmp_path / "steps.f32")
    ids.append(int(toks[0]))
    n = len(ids)   # 301
    decode = np.fromfile(tmp_path / "steps.f32", dtype=np.float32).reshape(2, -1)[1]
    whole, g_whole = logits(tmp_path / "w.f32", ids, 0, greedy=8)
    # U = 64 and 128: chunks of 64 (128) rows and a last one of 45, all of the whole pass's class
    for U in (64, 128):
        sizes = {U, n % U, n}
        if len({row_class(s) for s in sizes}) != 1 or min(sizes) <= 8:
            continue   # another machine's kernels draw the classes elsewhere: nothing to assert
        got, g = logits(tmp_path / f"u{U}.f32", ids, U, greedy=8)
        assert np.array_equal(got, whole), (U, np.abs(got - whole).max())
        assert g == g_whole
    # U = 100 and 150: the last chunk is the one row 300, of the decode path's products. Bit for
    # bit where the attention's sgemm gives a row the same sums whatever the call's other rows
    # (OpenBLAS's AVX-512 kernels: tests/run.sh); on a CPU without AVX-512 (its Haswell/Zen
    # kernels) the one row's sums follow the call's shape, so there the fp32 bound (1e-4 of the
    # largest logit, DESIGN.md) and the same greedy tokens
    avx512 = "avx512f" in open("/proc/cpuinfo").read()
    for U in (100, 150):
        got, g = logits(tmp_path / f"u{U}.f32", ids, U, greedy=8)
        if avx512:
            assert np.array_equal(got, decode), (U, np.abs(got - decode).max())
        else:
            assert np.abs(got - decode).max() <= 1e-4 * np.abs(decode).max(), (U, np.abs(got - decode).max())
        assert g == g_whole
    if row_class(1) != row_class(n):   # the check sees a chunked prefill from a whole one
        assert not np.array_equal(decode, whole)


@need_model
def test_chunked_text_equals_one_pass():
    def run(U):
        r = sift("-p", TEXT, "-n", 24, "--temp", 0, "--json", "-ub", U)
        assert r.returncode == 0, r.stderr
        rec = json.loads(r.stdout.strip().splitlines()[-1])
        return rec["text"], rec["prompt_n"] if "prompt_n" in rec else rec["timings"]["prompt_n"]
    text, n = run(0)
    assert n > 200
    for U in (64, 100):
        assert n % U != 0
        assert run(U) == (text, n), U


@need_model
def test_job_with_long_prompt_packs_and_chunks(tmp_path):
    reqs = tmp_path / "r.jsonl"
    with open(reqs, "w") as f:
        for i, text in enumerate([TEXT, TEXT[300:420], TEXT[:300], TEXT[420:560]]):
            f.write(json.dumps({"id": str(i), "prompt": text}) + "\n")

    def run(*extra):
        out = tmp_path / f"o{len(os.listdir(tmp_path))}.jsonl"
        r = sift("--prompts", reqs, "--temp", 0, "-n", 12, "-o", out, *extra)
        assert r.returncode == 0, r.stderr
        with open(out) as f:
            return {j["id"]: j for j in map(json.loads, f)}
    alone = run("-ub", 0)
    assert alone["0"]["timings"]["prompt_n"] > 100 > alone["2"]["timings"]["prompt_n"]
    texts = {k: j["text"] for k, j in alone.items()}
    for extra in (["-ub", 100, "--parallel", 2], ["-ub", 100, "--parallel", 4], ["-ub", 64]):
        got = run(*extra)
        assert {k: j["text"] for k, j in got.items()} == texts, extra
        assert got["0"]["prefill_shared"] == 1   # longer than U: alone, in chunks

"""Packed prefill in batch jobs (jobs/run.c, policies gen_open / gen_prefill_packed): with
--parallel, queued `full` prompts are prefilled together in one forward pass when their row
counts, the pass's and the LM head's share one rounding class (fwd_row_class). The references
are the same requests one at a time (--parallel 1) and --parallel without packing
(SIFT_PACK_ROWS=0): the texts must be equal, greedy and seeded, on a job mixing strategies that
pack (full) and that run alone (fastkv, topk, speed), prompts short (the row kernels' class) and
long (the wide products'). At the pass level, build/tests/tool_batch compares every logit of
every step, packed against alone: bit-identical on native weights."""
import json
import math
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tiny_gguf  # noqa: E402
from test_cli import MODEL, assert_error, need_model, sift  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "build", "tests", "tool_batch")
WORDS = "river stone cloud amber quiet lantern meadow copper violet harbor".split()
CYCLE = ["full", "full", "fastkv", "full", "topk", "full", "speed"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # quantised matrices (Q8_0), so that products take the row kernels or the wide path by rows
    return tiny_gguf.write(str(tmp_path_factory.mktemp("m") / "tiny_q8.gguf"), n_layer=4, ctx=4096,
                           dtype=tiny_gguf.gguf.GGMLQuantizationType.Q8_0)


def requests(seeded):
    """14 requests: prompts of 2 to ~160 words (short ones below 16 tokens, long ones far above),
    strategies cycling through CYCLE, n_predict 4 .. 16 (they finish apart)."""
    out = []
    for i in range(14):
        n = [2, 3, 40, 5, 90, 160, 4, 60, 7, 120, 3, 75, 30, 140][i]
        r = {"id": f"q{i}", "prompt": " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(n)),
             "n_predict": 4 + 3 * (i % 5), "strategy": CYCLE[i % len(CYCLE)]}
        if seeded:
            r.update(temp=0.9, seed=1000 + 17 * i)
        else:
            r.update(temp=0)
        out.append(r)
    return out


def run_job(model, path, parallel, env=None):
    r = sift("-m", model, "--prompts", path, "--json", "-q", "--parallel", str(parallel), env=env)
    assert r.returncode == 0, r.stderr
    return [json.loads(l) for l in r.stdout.splitlines() if l.strip()]


def check_record(r):
    """A well-formed record of a run: its TTFT (timings.prompt_ms) a positive finite time, the
    prompt rate derived from it, prefill_shared a count."""
    t = r["timings"]
    assert isinstance(r["prefill_shared"], int) and r["prefill_shared"] >= 1, r
    assert isinstance(t["prompt_ms"], float) and math.isfinite(t["prompt_ms"]) and t["prompt_ms"] > 0, r
    assert t["prompt_n"] >= 1 and t["predicted_n"] >= 1, r
    # prompt_per_second is prompt_n over the TTFT (both written to 3 decimals: prompt_ms within
    # 0.0005 of the time the rate came from)
    hi = t["prompt_n"] / ((t["prompt_ms"] - 5e-4) / 1e3)
    lo = t["prompt_n"] / ((t["prompt_ms"] + 5e-4) / 1e3)
    assert lo - 1e-3 <= t["prompt_per_second"] <= hi + 1e-3, r


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
def test_packed_job_equals_one_at_a_time(tiny, tmp_path, seeded):
    path = tmp_path / "r.jsonl"
    reqs = requests(seeded)
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    one = run_job(tiny, str(path), 1)
    packed = run_job(tiny, str(path), 4)
    unpacked = run_job(tiny, str(path), 4, env={"SIFT_PACK_ROWS": "0"})
    for recs in (one, packed, unpacked):
        assert [r["id"] for r in recs] == [q["id"] for q in reqs]
        assert [r["strategy"] for r in recs] == [q["strategy"] for q in reqs]
        for r in recs:
            check_record(r)
    text = lambda recs: [(r["text"], r["timings"]["prompt_n"], r["timings"]["predicted_n"]) for r in recs]
    assert text(packed) == text(one)
    assert text(unpacked) == text(one)
    # --parallel 1 and SIFT_PACK_ROWS=0 prefill every prompt alone
    assert all(r["prefill_shared"] == 1 for r in one + unpacked)
    # packed: only full shares a pass, and some full prompts did (not a vacuous comparison)
    assert all(r["prefill_shared"] == 1 for r in packed if r["strategy"] != "full")
    assert max(r["prefill_shared"] for r in packed if r["strategy"] == "full") >= 2
    # a pass's prompts are counted alike: k records say k for each pass of k prompts
    by_k = {}
    for r in packed:
        by_k[r["prefill_shared"]] = by_k.get(r["prefill_shared"], 0) + 1
    assert all(n % k == 0 for k, n in by_k.items()), by_k


def test_pack_rows_cap_and_bad_value(tiny, tmp_path):
    path = tmp_path / "r.jsonl"
    reqs = [dict(r, strategy="full") for r in requests(False)]
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    one = run_job(tiny, str(path), 1)
    # a cap of one row: every pass holds one prompt (the first, whatever its length)
    capped = run_job(tiny, str(path), 6, env={"SIFT_PACK_ROWS": "1"})
    assert [r["text"] for r in capped] == [r["text"] for r in one]
    assert all(r["prefill_shared"] == 1 for r in capped)
    for bad in ("-1", "x", "12rows", str((1 << 20) + 1)):
        r = sift("-m", tiny, "--prompts", str(path), "--json", "-q", "--parallel", "4",
                 env={"SIFT_PACK_ROWS": bad})
        assert_error(r, "SIFT_PACK_ROWS", code=2)
        assert r.stdout == ""


def run_tool(strategies, n, max_rows, env):
    p = subprocess.run([TOOL, MODEL, strategies, str(n), "pack", str(max_rows)], capture_output=True,
                       text=True, env=dict(os.environ, **env), timeout=900)
    assert p.returncode == 0, p.stderr
    rows, passes, packed = [], None, None
    for line in p.stdout.splitlines():
        if line.startswith("batch steps"):
            continue
        if line.startswith("prefill passes"):
            passes = int(line.split()[-1])
            continue
        if line.startswith("packed"):
            packed = int(line.split()[-1])
            continue
        head, batched, diff, _ = line.split("|")
        name, *alone = head.split()[1:]
        rows.append((name, alone, batched.split(), [float(x) for x in diff.split()]))
    return rows, passes, packed


def greedy_passes(lengths, max_rows):
    """Passes of the packing rule when every row count is one class (SIFT_PREFILL=int8): the first
    waiting prompt, then each later one in order while the pass stays within max_rows."""
    wait, passes = list(lengths), 0
    while wait:
        rows, keep = wait[0], []
        for n in wait[1:]:
            if rows + n <= max_rows:
                rows += n
            else:
                keep.append(n)
        wait, passes = keep, passes + 1
    return passes


STRATS = "full,topk,full,fastkv,full,speed"


@need_model
@pytest.mark.parametrize("case", ["native", "int8-cap", "f32"])
def test_packed_prefill_logits_bit_identical(case):
    # tool_batch's pack mode: 9 prompts (lengths 40 + 37 i, every third 4 + i), strategy i % 6
    env = {"SIFT_WEIGHTS": "f32" if case == "f32" else "native"}
    if case == "int8-cap":
        env["SIFT_PREFILL"] = "int8"   # every row count one class: the rule packs by rows alone
    max_rows = 300 if case == "int8-cap" else 2048
    rows, passes, packed = run_tool(STRATS, 9, max_rows, env)
    names = STRATS.split(",")
    assert [r[0] for r in rows] == [names[i % 6] for i in range(9)]
    for name, alone, batched, (max_abs, max_rel) in rows:
        assert alone == batched, name
        if case == "f32":   # the shared decode steps: OpenBLAS over more rows (tests/test_batch.py)
            assert max_rel <= 1e-4, name
        else:
            assert max_abs == 0, name
    full_len = [4 + i if i % 3 == 1 else 40 + 37 * i for i in range(9) if names[i % 6] == "full"]
    assert packed == len(full_len) == 5
    if case == "int8-cap":
        assert passes == greedy_passes(full_len, max_rows) == 3
    elif case == "f32":
        assert passes == packed   # OpenBLAS's rounding may depend on the rows: never packed
    else:   # 40, 114, 262 and 336 rows share one pass (the wide class); 8 rows alone
        assert passes == 2 if wide_from_16() else 1 <= passes <= packed


def wide_from_16():
    """Whether this CPU's wide products start at 16 rows (AVX-512 VNNI or AMX; else sgemm tiles from
    64, whose rounding is OpenBLAS's: not packed)."""
    flags = open("/proc/cpuinfo").read()
    return " avx512_vnni" in flags or " amx_bf16" in flags


def test_packed_job_with_choices_batch_api(tiny, tmp_path):
    # the Batch API's shape: one request of n = 3 choices (its prefill alone, copied by its later
    # choices) among one-answer requests that pack; seeded, so every choice draws its own stream
    lines = []
    for i in range(8):
        body = {"prompt": " ".join(WORDS[(i + j) % len(WORDS)] for j in range([3, 50, 80, 4, 120, 60, 2, 90][i])),
                "max_tokens": 6 + i, "temperature": 0.9, "seed": 40 + i}
        if i == 2:
            body["n"] = 3
        lines.append({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": body})
    path = tmp_path / "b.jsonl"
    path.write_text("".join(json.dumps(l) + "\n" for l in lines))
    def answers(parallel):
        r = sift("-m", tiny, "--prompts", str(path), "--json", "-q", "--parallel", str(parallel))
        assert r.returncode == 0, r.stderr
        recs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
        assert [x["custom_id"] for x in recs] == [l["custom_id"] for l in lines]
        return [[(c["index"], c["text"], c["finish_reason"]) for c in x["response"]["body"]["choices"]]
                for x in recs]
    one, packed = answers(1), answers(4)
    assert packed == one
    assert [len(a) for a in one] == [1, 1, 3, 1, 1, 1, 1, 1]


@pytest.mark.skipif(not wide_from_16(), reason="wide products from 16 rows on AVX-512 VNNI or AMX only")
def test_packed_job_on_k_quants(tmp_path):
    # A Q4_K_M-like file (Q4_K matrices, attn_v, ffn_down and the LM head Q6_K): packed prompts
    # keep the texts of one at a time through the K-quant kernels (Q4_K's 16-row strips below 32
    # rows where the VNNI GEMM is the wide path, the GEMM above). Long prompts (32 rows and more:
    # the chat template makes these 263-395) share a pass; one of 16-31 rows (17, 26) runs alone
    # where Q4_K's row kernels reach 31 rows: with any other prompt its pass has 32 rows or more,
    # where Q4_K takes the GEMM.
    Q = tiny_gguf.gguf.GGMLQuantizationType
    model = tiny_gguf.write(str(tmp_path / "q4km.gguf"), n_layer=2, d=256, n_head=4, n_kv=2, ff=512,
                            ctx=1024, dtype=Q.Q4_K, tied=False,
                            dtypes={"attn_v.weight": Q.Q6_K, "ffn_down.weight": Q.Q6_K,
                                    "token_embd.weight": Q.Q8_0, "output.weight": Q.Q6_K})
    lengths = [3, 40, 18, 4, 60, 20, 2, 50]
    reqs = [{"id": f"k{i}", "prompt": " ".join(WORDS[(i + j) % len(WORDS)] for j in range(n)),
             "n_predict": 5, "temp": 0} for i, n in enumerate(lengths)]
    path = tmp_path / "k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    one = run_job(model, str(path), 1)
    packed = run_job(model, str(path), 8)
    assert [r["text"] for r in packed] == [r["text"] for r in one]
    assert len({r["text"] for r in one}) > 1   # the answers differ: not a constant output
    rows = [r["timings"]["prompt_n"] for r in one]
    strips_to_31 = "amx_bf16" not in open("/proc/cpuinfo").read()
    assert sum(16 <= n < 32 for n in rows) == 2 and sum(n >= 32 for n in rows) == 5, rows
    for r, n in zip(packed, rows):
        if n >= 32:
            assert r["prefill_shared"] >= 2, (n, r["prefill_shared"])
        elif n >= 16 and strips_to_31:
            assert r["prefill_shared"] == 1, (n, r["prefill_shared"])

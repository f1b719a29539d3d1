"""tests/test_ab.py — A/B runs repeated (`--repeat N`, jobs/run.c): every strategy runs N times per
prompt in rotating order after an untimed warm-up; the table shows per strategy the runs, every
column of the single-run table (the timings as medians) and the spreads of TTFT and TPOT, and a
line on how busy the rest of the machine was. The texts and JSON records are repetition 0's
(greedy: every repetition generates the same tokens); the "N prompt tokens" line is printed once
per prompt, not once per strategy and repetition.
Run: .venv/bin/python -m pytest -x -q tests/test_ab.py"""
import json
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIFT = os.path.join(ROOT, "sift")
MODEL = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
PROMPT = "The quick brown fox jumps over the lazy dog. " * 12


def sift(*args):
    return subprocess.run([SIFT, "-m", MODEL, "-p", PROMPT, "-n", "6", "--temp", "0", "-t", "2",
                           *map(str, args)], capture_output=True, text=True, timeout=600)


def table(stdout):
    rows = [l for l in stdout.splitlines() if l.startswith("| ") and not l.startswith("| strategy")]
    return [[c.strip() for c in l.strip("|").split("|")] for l in rows]


def test_repeated_table_medians_and_machine_line():
    r = sift("--strategy", "full,speed", "--repeat", 3, "-q")
    assert r.returncode == 0, r.stderr
    head = next(l for l in r.stdout.splitlines() if l.startswith("| strategy"))
    assert "TTFT ms (median)" in head and "TPOT spread %" in head
    rows = table(r.stdout)
    assert [x[0] for x in rows] == ["full", "speed"]
    for x in rows:
        assert x[1] == "3"                                  # runs
        ttft, spread, tpot = float(x[5]), float(x[6]), float(x[8])
        assert ttft > 0 and tpot > 0 and spread >= 0
        assert abs(float(x[10]) - 1000 / tpot) <= 0.02 * 1000 / tpot   # decode tok/s = 1 / TPOT
    assert rows[0][11] == "yes" and rows[0][12] == "100.0"   # full against itself
    m = re.search(r"^machine: other processes used ([0-9.]+) of (\d+) CPUs? and ([0-9.]+) were stolen",
                  r.stderr, re.M)
    assert m and "machine:" not in r.stdout, r.stderr   # a note, not a result: stderr
    # each strategy's text once (repetition 0), not once per repetition
    assert r.stdout.count("==> full <==") == 1 and r.stdout.count("==> speed <==") == 1


def test_repeated_json_records_once_per_strategy():
    r = sift("--strategy", "full,speed", "--repeat", 2, "--json", "-q")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    assert sorted(x["strategy"] for x in recs if "strategy" in x) == ["full", "speed"]
    one = sift("--strategy", "full,speed", "--json", "-q")
    one_recs = [json.loads(l) for l in one.stdout.splitlines() if l.strip()]
    texts = {x["strategy"]: x["text"] for x in one_recs if "strategy" in x}
    assert {x["strategy"]: x["text"] for x in recs if "strategy" in x} == texts


def test_single_strategy_repeated():
    r = sift("--repeat", 2, "-q")
    assert r.returncode == 0, r.stderr
    rows = table(r.stdout)
    assert len(rows) == 1 and rows[0][0] == "full" and rows[0][1] == "2"


def test_bad_repeat_count():
    for bad in ("0", "-2", "x"):
        r = sift("--repeat", bad)
        assert r.returncode == 2 and "--repeat" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def header(stdout):
    line = next(l for l in stdout.splitlines() if l.startswith("| strategy"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_repeated_table_keeps_every_column_of_the_single_table():
    one = sift("--strategy", "full,topk", "-q")
    rep = sift("--strategy", "full,topk", "--repeat", 2, "-q")
    assert one.returncode == 0 and rep.returncode == 0, one.stderr + rep.stderr
    single, reps = header(one.stdout), header(rep.stdout)
    # every single-run column, in the same order; its timings as medians; runs and spreads added
    assert [c.replace(" (median)", "") for c in reps if c not in
            ("runs", "TTFT spread %", "TPOT spread %")] == single
    assert reps == ["strategy", "runs", "rows % of full", "KV MiB", "KV read/step MiB",
                    "TTFT ms (median)", "TTFT spread %", "prefill tok/s", "TPOT ms (median)",
                    "TPOT spread %", "decode tok/s", "1st token = full", "greedy agree %",
                    "answer (others: where it differs from full)"]
    # KV read per step is the records' kv_read_per_step (bytes) in MiB: topk reads less than full
    recs = [json.loads(l) for l in sift("--strategy", "full,topk", "--json", "-q").stdout.splitlines()]
    want = {x["strategy"]: f'{x["kv_read_per_step"] / 2**20:.2f}' for x in recs}
    got = {x[0]: x[reps.index("KV read/step MiB")] for x in table(rep.stdout)}
    assert got == want and float(got["topk"]) < float(got["full"]), (got, want)


def test_prompt_line_once_per_prompt(tmp_path):
    """3 strategies x 3 repetitions of each of 2 prompts: 2 lines, not 18; the count is the
    records' prompt_n (its own run), the seed the one given."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(PROMPT)
    b.write_text("One two three.")
    args = ["-m", MODEL, "-f", str(a), "-f", str(b), "-n", "6", "--temp", "0", "-t", "2", "-s", "5"]
    r = subprocess.run([SIFT, *args, "--strategy", "full,speed,fastkv", "--repeat", "3"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(l) for l in subprocess.run(
        [SIFT, *args, "--json", "-q"], capture_output=True, text=True, timeout=600).stdout.splitlines()]
    n = {os.path.basename(x["file"]): x["timings"]["prompt_n"] for x in recs}
    lines = [l for l in r.stderr.splitlines() if "prompt token" in l]
    assert lines == [f"sift: {a}: {n['a.txt']} prompt tokens, up to 6 new (seed 5)",
                     f"sift: {b}: {n['b.txt']} prompt tokens, up to 6 new (seed 5)"], r.stderr

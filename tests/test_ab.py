"""tests/test_ab.py — A/B runs repeated (`-r N`, jobs/run.c): every strategy runs N times per
prompt in rotating order after an untimed warm-up; the table shows per strategy the runs, the
median TTFT and TPOT with their spread, and a line on how busy the rest of the machine was. The
texts and JSON records are repetition 0's (greedy: every repetition generates the same tokens).
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
    r = sift("--strategy", "full,speed", "-r", 3, "-q")
    assert r.returncode == 0, r.stderr
    head = next(l for l in r.stdout.splitlines() if l.startswith("| strategy"))
    assert "TTFT ms (median)" in head and "TPOT spread %" in head
    rows = table(r.stdout)
    assert [x[0] for x in rows] == ["full", "speed"]
    for x in rows:
        assert x[1] == "3"                                  # runs
        ttft, spread, tpot = float(x[4]), float(x[5]), float(x[7])
        assert ttft > 0 and tpot > 0 and spread >= 0
        assert abs(float(x[9]) - 1000 / tpot) <= 0.02 * 1000 / tpot   # decode tok/s = 1 / TPOT
    assert rows[0][10] == "yes" and rows[0][11] == "100.0"   # full against itself
    m = re.search(r"^machine: other processes used ([0-9.]+) of (\d+) CPUs and ([0-9.]+) were stolen",
                  r.stdout, re.M)
    assert m, r.stdout
    # each strategy's text once (repetition 0), not once per repetition
    assert r.stdout.count("==> full <==") == 1 and r.stdout.count("==> speed <==") == 1


def test_repeated_json_records_once_per_strategy():
    r = sift("--strategy", "full,speed", "-r", 2, "--json", "-q")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    assert sorted(x["strategy"] for x in recs if "strategy" in x) == ["full", "speed"]
    one = sift("--strategy", "full,speed", "--json", "-q")
    one_recs = [json.loads(l) for l in one.stdout.splitlines() if l.strip()]
    texts = {x["strategy"]: x["text"] for x in one_recs if "strategy" in x}
    assert {x["strategy"]: x["text"] for x in recs if "strategy" in x} == texts


def test_single_strategy_repeated():
    r = sift("-r", 2, "-q")
    assert r.returncode == 0, r.stderr
    rows = table(r.stdout)
    assert len(rows) == 1 and rows[0][0] == "full" and rows[0][1] == "2"


def test_bad_repeat_count():
    for bad in ("0", "-2", "x"):
        r = sift("-r", bad)
        assert r.returncode == 2 and "-r" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

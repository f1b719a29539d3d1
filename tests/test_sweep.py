"""`sift sweep` on the default model with short prompts, checked independently of sift's code:
- bad input: one `sift: error:` line and exit code 2, before any model is loaded;
- a tiny grid end to end: the JSON (sift-sweep/1) has full first and one row per setting in grid
  order, one record per prompt x setting, aggregates that are the means of the records, a
  frontier equal to the Pareto frontier computed here from the aggregates; CSV and SVG agree;
- the --min-agreement command line, run again by `sift ... --json` beside `--strategy full`,
  reproduces that setting's first-token and greedy agreement on the prompt;
- eval tasks (--tasks) carry their answers and an accuracy per record.
Run: .venv/bin/python -m pytest -x -q tests/test_sweep.py
"""
import csv
import json
import math
import os
import re
import shlex
import signal
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIFT = ROOT / "sift"
MODEL = Path(os.environ.get("SIFT_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL
pytestmark = pytest.mark.skipif(not MODEL.exists() or not SIFT.exists(),
                                reason="needs ./sift and the default model")
ENV = dict(os.environ, OMP_WAIT_POLICY="passive")
PROMPTS = ["The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is",
           "List three colours of the rainbow, separated by commas:"]


def sift(*args, timeout=300):
    return subprocess.run([str(SIFT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("prompts")
    paths = []
    for i, text in enumerate(PROMPTS):
        p = d / f"p{i}.txt"
        p.write_text(text)
        paths.append(p)
    return paths


@pytest.mark.parametrize("args, words", [
    ([], "no prompts"),
    (["--tasks", "niah", "-f", "x.txt"], "--tasks"),
    (["-f", "x.txt", "--grid", "fastkv:keep=0.1"], "does not read 'keep'"),
    (["-f", "x.txt", "--grid", "fastkv:nope=1"], "unknown parameter 'nope'"),
    (["-f", "x.txt", "--grid", "warp:kv-rate=0.1"], "unknown strategy 'warp'"),
    (["-f", "x.txt", "--grid", "fastkv+speed"], "two prefill strategies do not compose"),
    (["-f", "x.txt", "--grid", "fastkv+topk:tsp-layer=999"], "--tsp-layer 999 is outside"),
    (["-f", "x.txt", "--grid", "full"], "reference"),
    (["-f", "x.txt", "--grid", "fastkv:kv-rate=0"], "out of range"),
    (["-f", "x.txt", "--grid", "fastkv:kv-rate=0.1,0.1"], "given twice"),
    (["-f", "x.txt", "--grid", "fastkv;;speed"], "empty strategy entry"),
    (["-f", "x.txt", "--grid", "fastkv:kv-rate"], "PARAM=VALUE"),
    (["-f", "x.txt", "--grid", "specprefill:draft=a.gguf;specprefill:draft=b.gguf:keep=0.1"],
     "one draft model"),
    (["-f", "x.txt", "--grid", "speed", "--strategy", "speed"], "exclude each other"),
    (["-f", "x.txt", "--strategy", "warp"], "unknown strategy 'warp'"),
    (["-f", "x.txt", "--fidelity", "accuracy"], "known answers"),
    (["-f", "x.txt", "--fidelity", "bleu"], "--fidelity"),
    (["-f", "x.txt", "--speed", "fast"], "--speed"),
    (["-f", "x.txt", "--min-agreement", "1.5"], "out of range"),
    (["-f", "x.txt", "--plot", "p.png"], "SVG"),
    (["-f", "x.txt", "--n-prompt", "4096"], "go with --tasks"),
    (["-f", "x.txt", "--bogus", "1"], "unknown flag"),
    (["--tasks", "niah", "--system", "be brief"], "chat template"),
])
def test_bad_input(args, words, prompt_files):
    # x.txt: a prompt file that exists (a missing one is refused first, before the grid's checks)
    r = sift("sweep", *[str(prompt_files[0]) if a == "x.txt" else a for a in args])
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sift: error:"), r.stderr
    assert words in lines[0]


def test_help_documents_grid():
    r = sift("sweep", "--help")
    assert r.returncode == 0
    for word in ["--grid", "--min-agreement", "--parallel", "draft-layers=L", "Pareto"]:
        assert word in r.stdout
    assert "sift sweep" in sift("--help").stdout


def pareto(points):
    """Indices not dominated (>= on both axes, > on one) by another point; NaN never on it."""
    on = []
    for i, (x, y) in enumerate(points):
        if x is None or y is None:
            continue
        if not any(j != i and a is not None and b is not None and a >= x and b >= y
                   and (a > x or b > y) for j, (a, b) in enumerate(points)):
            on.append(i)
    return on


@pytest.fixture(scope="module")
def tiny(prompt_files, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    grid = "fastkv:kv-rate=0.1:tsp-rate=0.2,1;speed:speed-depth=8,20"
    r = sift("sweep", "-m", MODEL, "-f", prompt_files[0], "-f", prompt_files[1], "--grid", grid,
             "-n", 6, "-t", 2, "--min-agreement", 0.2, "-o", out / "s.json", "--csv", out / "s.csv",
             "--plot", out / "s.svg")
    assert r.returncode == 0, r.stderr
    return r, json.loads((out / "s.json").read_text()), out


def test_tiny_grid_json(tiny, prompt_files):
    r, j, _ = tiny
    assert j["schema"] == "sift-sweep/1" and j["complete"] and j["n_predict"] == 6
    assert [p["id"] for p in j["prompts"]] == [str(p) for p in prompt_files]
    rows = [(s["strategy"], s["grid"]) for s in j["settings"]]
    assert rows == [("full", ""), ("fastkv", "kv-rate=0.1 tsp-rate=0.2"),
                    ("fastkv", "kv-rate=0.1 tsp-rate=1"), ("speed", "speed-depth=8"),
                    ("speed", "speed-depth=20")]
    assert j["settings"][3]["params"]["speed_depth"] == 8
    recs = j["records"]
    assert len(recs) == 2 * 5 and all(r["ok"] for r in recs)
    assert {(r["prompt"], r["setting"]) for r in recs} == {(p, s) for p in range(2) for s in range(5)}
    for rec in recs:
        assert 1 <= rec["generated"] <= 6 and rec["ttft_ms"] > 0 and rec["kv_bytes"] > 0
        if rec["setting"] == 0:
            assert rec["first_token_agree"] and rec["greedy_agree"] == 1 and rec["kl"] == 0
    for i, s in enumerate(j["settings"]):
        mine = [r for r in recs if r["setting"] == i]
        assert s["prompts"] == 2 and s["failed"] == 0
        assert s["greedy_agree"] == pytest.approx(sum(r["greedy_agree"] for r in mine) / 2, abs=1e-3)
        assert s["first_token_agree"] == pytest.approx(
            sum(r["first_token_agree"] for r in mine) / 2, abs=1e-3)
        assert s["ttft_ms"] == pytest.approx(sum(r["ttft_ms"] for r in mine) / 2, rel=1e-3)
        full_ttft = sum(r["ttft_ms"] for r in recs if r["setting"] == 0) / 2
        assert s["speedup_ttft"] == pytest.approx(full_ttft / s["ttft_ms"], rel=1e-3)
        assert s["fidelity"] == s["greedy_agree"] and s["speedup"] == s["speedup_total"]
    # speed-depth 8 of 30 layers cuts the prompt's rows and its KV
    assert j["settings"][3]["rows_pct_of_full"] < 50
    assert j["settings"][3]["kv_mib"] < j["settings"][0]["kv_mib"]
    points = [(s["speedup"], s["fidelity"]) for s in j["settings"]]
    assert j["frontier"] == pareto(points)
    assert [s["frontier"] for s in j["settings"]] == [i in j["frontier"] for i in range(5)]
    # the table on stdout: a row per setting, the frontier marked
    table = [l for l in r.stdout.splitlines() if l.startswith("| ") and "strategy" not in l]
    assert len(table) == 5
    assert [l.rstrip().endswith("| * |") for l in table] == [s["frontier"] for s in j["settings"]]


def test_tiny_grid_csv_svg(tiny):
    _, j, out = tiny
    rows = list(csv.DictReader(open(out / "s.csv")))
    assert [r["strategy"] for r in rows] == [s["strategy"] for s in j["settings"]]
    assert [int(r["frontier"]) for r in rows] == [int(s["frontier"]) for s in j["settings"]]
    assert float(rows[3]["greedy_agree"]) == pytest.approx(j["settings"][3]["greedy_agree"], abs=1e-4)
    svg = ET.parse(out / "s.svg").getroot()
    ns = "{http://www.w3.org/2000/svg}"
    rings = [c for c in svg.iter(ns + "circle") if c.get("class") == "frontier"]
    assert len(rings) == len(j["frontier"])
    # every setting is named in the picture: its own label, a merged label "A = B" (two settings
    # at one spot, which depends on the measured timings), or a numbered key line (eval/plot.c)
    texts = [t.text or "" for t in svg.iter(ns + "text")]
    def names(t):   # the settings a label or key line ("N  label") names
        t = re.sub(r"^\d+  ", "", t)
        return t.split(" = ")
    for name in ("speed speed-depth=8", "full"):
        assert any(name in names(t) for t in texts), (name, texts)


def test_min_agreement_command_reproduces(tiny, prompt_files):
    r, j, _ = tiny
    best = j["best"]
    assert best["min_agreement"] == 0.2
    ok = [i for i, s in enumerate(j["settings"]) if i > 0 and s["fidelity"] >= 0.2]
    assert best["setting"] == max(ok, key=lambda i: j["settings"][i]["speedup"])
    assert best["command"] in r.stdout.splitlines()
    argv = shlex.split(best["command"])
    assert argv[0] == "sift" and "--temp" in argv and argv[argv.index("-n") + 1] == "6"
    k = argv.index("--strategy")
    name = argv[k + 1]
    assert name == j["settings"][best["setting"]]["strategy"]
    argv[k + 1] = "full," + name
    rerun = subprocess.run([str(SIFT), *argv[1:], "--json", "-q"], capture_output=True, text=True,
                           timeout=300, env=ENV)
    assert rerun.returncode == 0, rerun.stderr
    got = [json.loads(l) for l in rerun.stdout.splitlines()]
    mine_all = [x for x in j["records"] if x["setting"] == best["setting"]]
    assert any(x["greedy_agree"] < 1 for x in mine_all), "a setting that changes the answer"
    for p, path in enumerate(prompt_files):
        rec = next(x for x in got if x.get("id") == str(path) and x.get("strategy") == name)
        mine = next(x for x in j["records"] if x["prompt"] == p and x["setting"] == best["setting"])
        assert rec["first_token_agree"] == mine["first_token_agree"]
        assert rec["greedy_agree_pct"] / 100 == pytest.approx(mine["greedy_agree"], abs=1e-3)


def test_min_agreement_none_keeps_it(prompt_files, tmp_path):
    """When no setting qualifies, the recommendation is full — with its command line to copy, like
    every other outcome (in the text and in the JSON)."""
    r = sift("sweep", "-m", MODEL, "-f", prompt_files[0], "--grid", "speed:speed-depth=1", "-n", 4,
             "-t", 2, "--min-agreement", 1, "-q", "-o", tmp_path / "s.json")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    k = next(i for i, l in enumerate(lines) if "no setting keeps greedy agreement >= 1" in l)
    argv = shlex.split(lines[k + 1])
    assert argv[0] == "sift" and argv[argv.index("--strategy") + 1] == "full"
    assert argv[argv.index("-f") + 1] == str(prompt_files[0]) and "--temp" in argv
    best = json.load(open(tmp_path / "s.json"))["best"]
    assert best["setting"] is None and best["command"] == lines[k + 1]


def test_tasks_accuracy(tmp_path):
    r = sift("sweep", "-m", MODEL, "--tasks", "niah", "--n-prompt", 256, "--samples", 1, "--grid",
             "fastkv:kv-rate=0.5", "-n", 8, "-t", 2, "--fidelity", "accuracy", "--parallel", 2,
             "-o", tmp_path / "t.json", "-q")
    assert r.returncode == 0, r.stderr
    j = json.loads((tmp_path / "t.json").read_text())
    assert j["fidelity"] == "accuracy" and j["tpot_shared"] and j["parallel"] == 2
    assert len(j["prompts"]) == 1 and len(j["prompts"][0]["answers"]) == 1
    assert all(rec["accuracy"] in (0, 1) for rec in j["records"])
    assert j["settings"][1]["fidelity"] == j["settings"][1]["accuracy"]
    assert "TPOT is the batch's" in r.stdout


def test_default_grid_skips_unknown_strategies(prompt_files):
    # --strategy keeps part of the default grid; a composed strategy this build lacks is a note
    r = sift("sweep", "-m", MODEL, "-f", prompt_files[1], "--strategy", "speed,fastkv+topk",
             "-n", 2, "-t", 2)
    assert r.returncode == 0, r.stderr
    table = [l for l in r.stdout.splitlines() if l.startswith("| ") and "strategy" not in l]
    names = [l.split("|")[1].strip() for l in table]
    known = "unknown strategy" not in sift("sweep", "-f", "/nonexistent", "--grid", "fastkv+topk").stderr
    if known:
        assert "fastkv+topk" in names
    else:
        assert "sift: sweep: skipping fastkv+topk" in r.stderr and "fastkv+topk" not in names
    assert names[:3] == ["full", "speed", "speed"]


def test_ctrl_c_reports_what_was_measured(prompt_files, tmp_path):
    out = tmp_path / "i.json"
    args = [str(SIFT), "sweep", "-m", str(MODEL), "-f", str(prompt_files[0]), "-f",
            str(prompt_files[1]), "--grid", "speed:speed-depth=4,8,12,16,20,24,28", "-n", 48,
            "-t", 2, "-o", str(out)]
    p = subprocess.Popen(list(map(str, args)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=ENV)
    for line in p.stderr:   # one line per finished run: interrupt after the second
        if line.startswith("sweep:") and "(2/16 runs" in line:
            p.send_signal(signal.SIGINT)
            break
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 130, stderr
    assert "interrupted" in stderr
    j = json.loads(out.read_text())
    assert not j["complete"] and 2 <= len(j["records"]) < 16
    assert "| full | reference |" in stdout

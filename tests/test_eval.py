"""`sift eval` and `sift ppl` on the default model, checked independently of sift's code:
- the generated prompts (sift eval --dump-prompts): every expected answer is in the prompt as
  often as the task says (counted here), the needle sits at the requested depth (sentences
  counted here), the prompt + answer budget fills --n-prompt within one filler sentence (tokens
  counted with Hugging Face `tokenizers` built from the GGUF's vocabulary and merges), the same
  seed gives the same prompts and another seed other ones, a --haystack file supplies the text;
- an end-to-end run with `full` at ctx 1024 finds the needle, and the JSON / CSV / SVG outputs
  have their stable fields;
- sift ppl equals exp(mean NLL) computed in numpy from build/tests/tool_logits' logits, with
  llama-perplexity's chunking (BOS per chunk, second half scored) done here;
- bad input: one `sift: error:` line and the documented exit code.
Run: SIFT_MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf .venv/bin/python -m pytest -q tests/test_eval.py
"""
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import gguf
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ref_llama  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIFT = ROOT / "sift"
TOOL_LOGITS = ROOT / "build" / "tests" / "tool_logits"
MODEL = Path(os.environ.get("SIFT_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL
pytestmark = pytest.mark.skipif(not MODEL.exists() or not SIFT.exists(),
                                reason="needs ./sift and the default model")
ENV = dict(os.environ, OMP_WAIT_POLICY="passive")
TASKS = ["niah", "multikey", "multivalue", "vt", "cwe"]
N_GEN = {"niah": 12, "multikey": 12, "multivalue": 48, "vt": 32, "cwe": 32}


def sift(*args, timeout=300):
    return subprocess.run([str(SIFT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def dump(*args):
    r = sift("eval", "-m", MODEL, "--dump-prompts", "-t", 2, *args)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.fixture(scope="module")
def tokenizer():
    reader = gguf.GGUFReader(str(MODEL))
    m = types.SimpleNamespace(tokens=reader.get_field("tokenizer.ggml.tokens").contents(),
                              merges=reader.get_field("tokenizer.ggml.merges").contents())
    return ref_llama.hf_tokenizer(m)


@pytest.fixture(scope="module")
def prompts():
    return dump("--n-prompt", "1024,2048", "--samples", 3, "--seed", 7)


def user_part(text):
    """The user message: between the chat template's user header and its end marker."""
    return text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


def test_every_task_context_and_sample(prompts):
    got = [(p["task"], p["ctx"], p["sample"]) for p in prompts]
    want = [(t, c, s) for c in (1024, 2048) for t in TASKS for s in range(3)]
    assert got == want
    assert all(p["seed"] == 7 and p["n_gen"] == N_GEN[p["task"]] for p in prompts)


def test_answers_in_prompt_as_specified(prompts):
    for p in prompts:
        text, ans = p["text"], p["answers"]
        if p["task"] in ("niah", "multikey"):
            assert len(ans) == 1 and re.fullmatch(r"\d{7}", ans[0])
            assert text.count(ans[0]) == 1
            needles = re.findall(r"The secret code for the ([a-z]+ [a-z]+) is (\d{7})\.", text)
            assert len(needles) == (1 if p["task"] == "niah" else 4)
            assert len({k for k, _ in needles}) == len(needles)  # distinct keys
            asked = re.search(r"what is the secret code for the ([a-z]+ [a-z]+)\?", text).group(1)
            assert (asked, ans[0]) in needles
        elif p["task"] == "multivalue":
            assert len(ans) == 4 and len(set(ans)) == 4
            needles = re.findall(r"One of the secret codes for the ([a-z]+ [a-z]+) is (\d{7})\.", text)
            assert sorted(v for _, v in needles) == sorted(ans)
            assert len({k for k, _ in needles}) == 1
            assert all(text.count(a) == 1 for a in ans)
        elif p["task"] == "vt":
            value = re.search(r"hold the value (\d{5})", text).group(1)
            chain = re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d{5})\.", text)
            assert chain[0] == (ans[0], value)
            for i in range(1, 5):  # each assignment names the previous variable, in text order
                assert chain[i] == (ans[i], "VAR " + ans[i - 1])
            assert [text.count(a) for a in ans] == [2, 2, 2, 2, 1]
        else:  # cwe: 5 words 12 times each, every other word fewer times
            words = re.findall(r"^\d+\. ([a-z]+)$", user_part(text), re.M)
            counts = {}
            for w in words:
                counts[w] = counts.get(w, 0) + 1
            top = sorted(counts, key=lambda w: -counts[w])[:5]
            assert sorted(top) == sorted(ans)
            assert all(counts[a] == 12 for a in ans)
            assert max(c for w, c in counts.items() if w not in ans) <= 2
            numbers = [int(n) for n in re.findall(r"^(\d+)\. ", user_part(text), re.M)]
            assert numbers == list(range(1, len(words) + 1))


def test_token_count_fills_context(prompts, tokenizer):
    sentence_tokens = max(len(tokenizer.encode(s).ids) for s in (
        "The travelling tailor polished a stack of firewood while the rain kept falling.",
        "An elderly painter described the blue rowing boat near the edge of the forest."))
    for p in prompts:
        n = len(tokenizer.encode(p["text"]).ids)  # SmolLM2 adds no BOS
        assert n == p["prompt_tokens"], (p["task"], p["ctx"])
        slack = p["ctx"] - n - p["n_gen"]
        unit = sentence_tokens + 2  # one more filler sentence would not fit
        if p["task"] == "cwe":  # one more rare word: two list entries
            entries = re.findall(r"^\d+\. [a-z]+$", user_part(p["text"]), re.M)
            unit = 2 * max(len(tokenizer.encode("\n" + e).ids) for e in entries[-20:])
        assert 0 <= slack <= unit, (p["task"], p["ctx"], slack)


def test_needle_depth(prompts):
    for p in prompts:
        if p["task"] != "niah":
            continue
        assert p["depth"] == pytest.approx((p["sample"] + 0.5) / 3, abs=1e-4)  # printed as %.4f
        body = user_part(p["text"]).split("\n\n")[1]  # preamble / haystack / question
        sentences = re.split(r"(?<=\.) ", body)
        at = [i for i, s in enumerate(sentences) if s.startswith("The secret code")]
        assert len(at) == 1
        n_filler = len(sentences) - 1
        assert abs(at[0] / n_filler - p["depth"]) <= 1.0 / n_filler + 1e-9


def test_same_seed_same_prompts_other_seed_others(prompts):
    again = dump("--n-prompt", "1024,2048", "--samples", 3, "--seed", 7)
    assert again == prompts
    other = dump("--n-prompt", "1024", "--samples", 1, "--seed", 8, "--tasks", "niah")
    assert other[0]["text"] != prompts[0]["text"]
    assert other[0]["answers"] != prompts[0]["answers"]


def test_haystack_file(tmp_path):
    sentences = [f"Sentence number {w} talks about the weather." for w in
                 ("one", "two", "three", "four", "five")]
    hay = tmp_path / "hay.txt"
    hay.write_text("  ".join(sentences[:3]) + "\n" + " ".join(sentences[3:]) + " trailing words")
    [p] = dump("--n-prompt", 512, "--samples", 1, "--tasks", "niah", "--haystack", hay)
    body = user_part(p["text"]).split("\n\n")[1]
    parts = [s for s in re.split(r"(?<=\.) ", body) if not s.startswith("The secret code")]
    assert len(parts) > 10  # the short file repeats, whole sentences only, in order
    assert parts == [sentences[i % 5] for i in range(len(parts))]
    assert "trailing" not in body


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval")
    r = sift("eval", "-m", MODEL, "--strategy", "full", "--tasks", "niah", "--n-prompt", 1024,
             "--samples", 1, "-t", 2, "-o", d / "r.json", "--csv", d / "r.csv", "--plot", d / "r.svg")
    assert r.returncode == 0, r.stderr
    return d, r


def test_e2e_full_finds_the_needle(e2e):
    d, r = e2e
    res = json.loads((d / "r.json").read_text())
    [rec] = res["records"]
    assert rec["expected"][0] in rec["answer"]
    assert rec["score"] == 1.0 and rec["kl"] == 0 and rec["first_token_agree"] is True
    assert "| full | niah | 1024 | 1 | 1.000 |" in r.stdout
    assert "eval: ctx 1024 niah full: accuracy 1.00" in r.stderr  # a plain line per cell


def test_json_schema_is_stable(e2e):
    d, _ = e2e
    res = json.loads((d / "r.json").read_text())
    assert list(res) == ["schema", "model", "seed", "samples", "complete", "query_agnostic", "strategies", "tasks",
                         "ctx", "summary", "cells", "records"]
    assert res["schema"] == "sift-eval/1" and res["complete"] is True
    assert (res["strategies"], res["tasks"], res["ctx"], res["seed"]) == (["full"], ["niah"], [1024], 1)
    agg = ["prompts", "accuracy", "first_token_agree", "greedy_agree", "kl", "ttft_ms", "tpot_ms",
           "kv_mib"]
    assert list(res["summary"][0]) == ["strategy", *agg, "accuracy_vs_full", "prefill_speedup",
                                       "kv_reduction"]
    assert list(res["cells"][0]) == ["strategy", "task", "ctx", *agg]
    assert list(res["records"][0]) == [
        "strategy", "task", "ctx", "sample", "seed", "depth", "prompt_tokens", "expected",
        "answer", "score", "first_token_agree", "greedy_agree", "kl", "ttft_ms", "tpot_ms",
        "kv_mib", "note"]
    rec = res["records"][0]
    assert rec["depth"] == 0.5 and 1000 < rec["prompt_tokens"] <= 1024 - 12
    assert rec["ttft_ms"] > 0 and rec["kv_mib"] > 0


def test_csv_and_svg(e2e):
    d, _ = e2e
    rows = list(csv.DictReader(open(d / "r.csv")))
    assert len(rows) == 1 and rows[0]["strategy"] == "full" and rows[0]["score"] == "1.0000"
    svg = ET.parse(d / "r.svg").getroot()
    ns = "{http://www.w3.org/2000/svg}"
    assert svg.tag == ns + "svg"
    assert len(svg.findall(ns + "polyline")) == 2  # accuracy and TTFT line of the one strategy
    texts = [t.text for t in svg.iter(ns + "text")]
    assert "full" in texts and "1024" in texts


def test_every_registered_strategy_runs(tmp_path):
    """--strategy all iterates the registry; fidelity of full to itself is exact."""
    r = sift("eval", "-m", MODEL, "--tasks", "niah", "--n-prompt", 256, "--samples", 1, "-t", 2,
             "-o", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    names = re.search(r"strategies: (.*)", sift("eval", "--help").stdout).group(1).split(", ")
    assert res["strategies"] == names and names[0] == "full"
    for rec in res["records"]:
        assert rec["kl"] >= 0 and 0 <= rec["greedy_agree"] <= 1
    assert res["records"][0]["greedy_agree"] == 1


def test_interrupt_reports_partial(tmp_path):
    args = ["eval", "-m", MODEL, "--strategy", "full", "--tasks", "niah", "--n-prompt", 512,
            "--samples", 50, "-t", 2, "-o", tmp_path / "r.json"]
    p = subprocess.Popen([str(SIFT), *map(str, args)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    time.sleep(6)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted" in err and "(interrupted: partial results)" in out
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["complete"] is False and len(res["records"]) < 50


# ---- sift ppl ----

PPL_TEXT = ("The river runs past the old mill and into the valley, where the farmers grow wheat "
            "and barley. In spring the water rises and the children watch the boats go by. "
            "Every autumn the village holds a fair with music, bread and apples from the "
            "orchards on the hill. ") * 3


def test_ppl_matches_numpy_from_logits(tmp_path, tokenizer):
    text = tmp_path / "t.txt"
    text.write_text(PPL_TEXT)
    ctx = 64
    # an f32 cache, as tool_logits keeps (the subject is ppl's scoring, not the cache; the CPU's
    # default f16 cache moves this perplexity by ~3e-4 relative, see tests/test_kvcache.py)
    r = sift("ppl", "-m", MODEL, "-f", text, "-c", ctx, "--json", "-t", 2, "-ctk", "f32", "-ctv",
             "f32")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert "second half" in r.stderr
    ids = tokenizer.encode(PPL_TEXT).ids  # SmolLM2 adds no BOS: chunks start as they are
    nll = []
    for c in range(len(ids) // ctx):
        chunk = ids[c * ctx:(c + 1) * ctx]
        out = tmp_path / f"l{c}.f32"
        subprocess.run([str(TOOL_LOGITS), str(MODEL), str(out), *map(str, chunk)], check=True,
                       capture_output=True, env=ENV)
        logits = np.fromfile(out, dtype=np.float32).reshape(ctx, -1).astype(np.float64)
        for i in range(ctx // 2, ctx - 1):
            row = logits[i]
            lse = row.max() + np.log(np.exp(row - row.max()).sum())
            nll.append(lse - row[chunk[i + 1]])
    assert got["chunks"] == len(ids) // ctx and got["tokens_scored"] == len(nll)
    assert got["ppl"] == pytest.approx(float(np.exp(np.mean(nll))), rel=1e-4)


@pytest.mark.parametrize("args,needle,code", [
    (["eval", "--tasks", "niah,qa"], "unknown task 'qa'", 2),
    (["eval", "--plot", "x.png"], "only SVG", 2),
    (["eval", "--n-prompt", "abc"], "invalid integer", 2),
    (["eval", "--n-prompt", "100000"], "beyond the model's context", 2),
    (["eval", "--strategy", "nope"], "unknown strategy 'nope'", 2),
    (["eval", "--haystack", "/nonexistent/h.txt"], "/nonexistent/h.txt", 2),
    (["eval", "-o", "/nonexistent/dir/r.json"], "cannot write -o '/nonexistent/dir/r.json': directory '/nonexistent/dir': No such file or directory", 2),
    (["eval", "--n-prompt", "64", "--tasks", "multivalue"], "more than --n-prompt 64 leaves", 2),
    (["ppl"], "no text", 2),
    (["ppl", "-f", "x.txt", "--strategy", "speed"], "ppl supports: full", 2),
    (["ppl", "-f", "/nonexistent/t.txt"], "/nonexistent/t.txt", 2),
])
def test_bad_input(args, needle, code):
    r = sift(args[0], "-m", MODEL, *args[1:], "--samples", 1) if args[0] == "eval" else \
        sift(args[0], "-m", MODEL, *args[1:])
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("sift: error: ") and needle in lines[-1], r.stderr


def test_ppl_text_shorter_than_a_chunk(tmp_path):
    t = tmp_path / "short.txt"
    t.write_text("Just a few words.")
    r = sift("ppl", "-m", MODEL, "-f", t, "-c", 512)
    assert r.returncode == 1 and "fewer than one chunk of -c 512" in r.stderr


def test_haystack_without_sentences(tmp_path):
    t = tmp_path / "h.txt"
    t.write_text("no sentence end here")
    r = sift("eval", "-m", MODEL, "--haystack", t, "--samples", 1)
    assert r.returncode == 1 and "no whole sentence" in r.stderr

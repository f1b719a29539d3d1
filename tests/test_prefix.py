"""Shared prefixes in batch jobs (--prefix-cache, jobs/prefix.c; policies/generate.c prefix_build,
prefill_run): requests whose tokens start alike prefill the shared part once and copy its cache.
The reference is the same job with --prefix-cache off (every request prefilled whole): the texts
must be equal, greedy and seeded, for full, topk and topk+phi, in one pass and in chunks
(--ubatch); the prefix's length is checked against the longest common prefix of the requests'
tokens computed here from the tokenizer (build/tests/tool_tokenize), cut as the plan says (16
rows before the shortest prefill ends, then to 128-row blocks past the chunk grid), and the work
each record reports against it."""
import json
import os
import struct
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_cli import MODEL, need_model, sift  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZE = os.path.join(ROOT, "build", "tests", "tool_tokenize")
WORDS = "the river city market bridge winter council harbor record merchant tower garden".split()
QUESTIONS = ["What is the secret code?", "Who is the harbor master?", "Summarize the report.",
             "Which word appears most often?", "Name one building in the report."]
N_LAYER = 30   # SmolLM2-135M

pytestmark = need_model


def document(words, seed):
    import random
    r = random.Random(seed)
    body = " ".join(r.choice(WORDS) for _ in range(words))
    return f"Report:\n{body}.\nThe secret code is 4417. The harbor master is named Ilse.\n"


def write_job(path, seeded, other=True):
    doc = document(700, 3)
    reqs = []
    for i, q in enumerate(QUESTIONS):
        r = {"id": f"q{i}", "prompt": f"{doc}Question: {q}\nAnswer:", "n_predict": 24 + 4 * i}
        r.update({"temp": 0.9, "seed": 100 + i} if seeded else {"temp": 0})
        reqs.append(r)
    if other:   # a request over another document: shares nothing worth a prefix
        reqs.insert(2, {"id": "other", "prompt": document(300, 9) + "Question: Who?\nAnswer:",
                        "n_predict": 16, "temp": 0})
    with open(path, "w") as f:
        for r in reqs:
            f.write(json.dumps(r) + "\n")
    return reqs


def tokens(texts):
    data = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    out = subprocess.run([TOKENIZE, MODEL], input=data, capture_output=True, check=True).stdout
    return [[int(x) for x in line.split()] for line in out.decode().splitlines()]


def run(path, *flags):
    summary = path + ".summary.json"
    r = sift("-m", MODEL, "--prompts", path, "--json", "--summary", summary, *flags)
    assert r.returncode == 0, r.stderr
    recs = {}
    for line in r.stdout.splitlines():
        if line.strip():
            j = json.loads(line)
            recs[(j["id"], j["strategy"])] = j
    with open(summary) as f:
        return recs, json.load(f), r.stderr


def prefix_len(toks, bos, ubatch=2048, decode=False):
    """The plan's prefix from the tokens: the longest prefix all the requests' tokens share (BOS,
    when the prompt gets one, shared too), at most the shortest prefill (a decode strategy's is the
    prompt less its last token) less 16 rows, cut to a multiple of 128 past the chunk boundary."""
    lcp = min(next((i for i, (a, b) in enumerate(zip(x, toks[0])) if a != b), min(len(x), len(toks[0])))
              for x in toks[1:]) + bos
    p = min(lcp, min(len(t) for t in toks) + bos - (1 if decode else 0) - 16)
    k0 = p // ubatch * ubatch
    return k0 + (p - k0) // 128 * 128


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
@pytest.mark.parametrize("strategy", ["full", "topk", "topk+phi"])
def test_shared_prefix_answers_as_without(tmp_path, strategy, seeded):
    path = str(tmp_path / "job.jsonl")
    reqs = write_job(path, seeded)
    on, s_on, err = run(path, "--strategy", strategy)
    off, s_off, _ = run(path, "--strategy", strategy, "--prefix-cache", "off")
    toks = tokens([r["prompt"] for r in reqs if r["id"] != "other"])
    bos = on[("q0", strategy)]["timings"]["prompt_n"] - len(toks[0])   # 1 when BOS is added
    want = prefix_len(toks, bos, decode=strategy != "full")
    assert want >= 256, want
    assert "1 shared prefix" in err, err
    for r in reqs:
        a, b = on[(r["id"], strategy)], off[(r["id"], strategy)]
        assert a["text"] == b["text"], (r["id"], a["text"], b["text"])
        assert b["prefix_tokens"] == 0
        n = a["timings"]["prompt_n"]
        if r["id"] == "other":
            assert a["prefix_tokens"] == 0 and a["rows_processed"] == b["rows_processed"]
            continue
        got = a["prefix_tokens"]
        # the shared tokens as counted here (BOS, when added, is shared too)
        assert got == want, (got, want)
        assert got % 128 == 0 and got <= n - 16
        # the prefix's rows are copied, not computed: the rest's rows over every layer
        assert a["rows_processed"] == b["rows_processed"] - got * N_LAYER, (a["rows_processed"], b["rows_processed"])
    pc = s_on["prefix_cache"]
    assert pc["prefixes"] == 1 and pc["reused_tokens"] == 5 * got and pc["peak_bytes"] > 0
    assert s_off["prefix_cache"] is None


def test_chunked_prefix_on_the_grid(tmp_path):
    """--ubatch 256: the prompts run in chunks of 256 rows; the prefix ends on the grid (or 128
    past it) and each request's rest continues along the same grid: answers as without."""
    path = str(tmp_path / "job.jsonl")
    reqs = write_job(path, False, other=False)
    on, _, _ = run(path, "--ubatch", "256", "-n", "24")
    off, _, _ = run(path, "--ubatch", "256", "-n", "24", "--prefix-cache", "off")
    toks = tokens([r["prompt"] for r in reqs])
    bos = on[("q0", "full")]["timings"]["prompt_n"] - len(toks[0])
    want = prefix_len(toks, bos, ubatch=256)
    for r in reqs:
        a, b = on[(r["id"], "full")], off[(r["id"], "full")]
        assert a["text"] == b["text"], r["id"]
        assert a["prefix_tokens"] == want


def test_ab_comparison_shares_only_when_asked(tmp_path):
    """auto is off in an A/B comparison (each strategy's TTFT its own); --prefix-cache on shares
    there too: full's requests the one plain prefix (answers as without), fastkv's the prefix
    fastkv compressed once (a second prefix, labelled query-agnostic)."""
    path = str(tmp_path / "job.jsonl")
    write_job(path, False, other=False)
    auto, s_auto, _ = run(path, "--strategy", "full,fastkv", "-n", "8")
    assert s_auto["prefix_cache"] is None
    assert all(r["prefix_tokens"] == 0 for r in auto.values())
    on, s_on, _ = run(path, "--strategy", "full,fastkv", "-n", "8", "--prefix-cache", "on")
    assert s_on["prefix_cache"]["prefixes"] == 2
    for (i, s), r in on.items():
        assert r["prefix_tokens"] > 0, (i, s)
        assert r["prefix"] == ("exact" if s == "full" else "compressed, query-agnostic"), (i, s)
        if s == "full":
            assert r["text"] == auto[(i, s)]["text"], (i, s)


def test_prefix_min(tmp_path):
    """A shared part shorter than --prefix-min is not shared."""
    path = str(tmp_path / "job.jsonl")
    write_job(path, False, other=False)
    recs, s, err = run(path, "-n", "4", "--prefix-min", "100000")
    assert all(r["prefix_tokens"] == 0 for r in recs.values())
    assert s["prefix_cache"]["prefixes"] == 0 and "shared prefix" not in err


def test_bad_prefix_cache_value():
    r = sift("-m", MODEL, "-p", "hi", "--prefix-cache", "maybe")
    assert r.returncode == 2 and "--prefix-cache" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_two_documents_after_one_preamble(tmp_path):
    """Two documents, three questions each, after one preamble of a few hundred tokens that all six
    share: two prefixes (each document's, the preamble inside both), not one on the preamble."""
    pre = "Instructions: " + document(250, 5)
    docs = [document(400, 11), document(400, 12)]
    path = str(tmp_path / "job.jsonl")
    reqs = []
    with open(path, "w") as f:
        for d in range(2):
            for i, q in enumerate(QUESTIONS[:3]):
                r = {"id": f"d{d}q{i}", "prompt": f"{pre}{docs[d]}Question: {q}\nAnswer:", "n_predict": 8, "temp": 0}
                reqs.append(r)
                f.write(json.dumps(r) + "\n")
    on, s, err = run(path)
    off, _, _ = run(path, "--prefix-cache", "off")
    assert s["prefix_cache"]["prefixes"] == 2, (s, err)
    toks = tokens([r["prompt"] for r in reqs])
    bos = on[("d0q0", "full")]["timings"]["prompt_n"] - len(toks[0])
    for d in range(2):
        want = prefix_len(toks[3 * d:3 * d + 3], bos)
        for i in range(3):
            a, b = on[(f"d{d}q{i}", "full")], off[(f"d{d}q{i}", "full")]
            assert a["prefix_tokens"] == want and a["text"] == b["text"], (d, i, a["prefix_tokens"], want)


# ---- --prompt-cache ---------------------------------------------------------------------------

def one_request(path, i=0, **kw):
    reqs = write_job(str(path) + ".all", False, other=False)
    r = dict(reqs[i], **kw)
    with open(path, "w") as f:
        f.write(json.dumps(r) + "\n")
    return r


def run_one(path, *flags):
    r = sift("-m", MODEL, "--prompts", str(path), "--json", "--summary", str(path) + ".s.json", *flags)
    out = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    s = json.load(open(str(path) + ".s.json")) if r.returncode == 0 else None
    return r, out, s


@pytest.mark.parametrize("strategy", ["full", "topk"])
def test_prompt_cache_saved_then_loaded(tmp_path, strategy):
    """The first run saves its prompt's plain prefill (the longest cut of it); a second run of
    another question over the same document loads it and answers as a run without the file,
    and the file's size is its rows plus a small header."""
    cache = tmp_path / "ctx.bin"
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    one_request(a, 0)
    rb = one_request(b, 1)
    r1, out1, s1 = run_one(a, "--strategy", strategy, "--prompt-cache", str(cache))
    assert r1.returncode == 0, r1.stderr
    saved = s1["prompt_cache"]["saved_tokens"]
    assert saved > 256 and saved % 128 == 0 and out1[0]["prefix_tokens"] == 0
    # K and V rows of every layer: 30 layers x 3 KV heads x 64 x 2 (f16) bytes each, per token
    rows = saved * N_LAYER * 3 * 64 * 2 * 2
    size = os.path.getsize(cache)
    assert rows < size < rows + 4 * saved + 256, (size, rows)
    r2, out2, s2 = run_one(b, "--strategy", strategy, "--prompt-cache", str(cache))
    ref, outr, _ = run_one(b, "--strategy", strategy)
    assert r2.returncode == 0 and ref.returncode == 0, r2.stderr
    toks = tokens([rb["prompt"], one_request(tmp_path / "c.jsonl", 0)["prompt"]])
    bos = out2[0]["timings"]["prompt_n"] - len(toks[0])
    assert out2[0]["prefix_tokens"] == min(saved, prefix_len(toks, bos, decode=strategy != "full"))
    assert out2[0]["text"] == outr[0]["text"]
    assert s2["prompt_cache"]["loaded_tokens"] == out2[0]["prefix_tokens"]
    assert s2["prompt_cache"]["saved_tokens"] == 0   # the file held this prompt's shared part


def test_prompt_cache_refusals(tmp_path):
    """A damaged, truncated or foreign file is refused with one line naming the problem, before any
    request runs (exit non-zero); --prompt-cache-ro never writes; a prefill strategy is refused."""
    cache = tmp_path / "ctx.bin"
    a = tmp_path / "a.jsonl"
    one_request(a, 0, n_predict=2)
    r, _, _ = run_one(a, "--prompt-cache", str(cache))
    assert r.returncode == 0, r.stderr
    good = cache.read_bytes()

    def refused(data, *flags, want):
        cache.write_bytes(data)
        r = sift("-m", MODEL, "--prompts", str(a), "--json", "--prompt-cache", str(cache), *flags)
        errs = [l for l in r.stderr.splitlines() if l.startswith("sift: error")]
        assert r.returncode != 0 and len(errs) == 1 and want in errs[0], r.stderr
        assert r.stdout == ""   # nothing ran

    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x40
    refused(bytes(bad), want="checksum mismatch")
    refused(good[:-100], want="truncated or damaged")
    refused(b"GGUF" + good[4:], want="not a sift prompt cache")
    refused(good[:8] + b"\x09" + good[9:], want="version 9")
    refused(good, "--cache-type-k", "f32", want="K f16, V f16 rows")
    refused(good, "--ubatch", "512", want="--ubatch 2048")
    refused(good, "--weights", "f32", want="--weights native")
    # another model: the same file under the tiny test model
    import tiny_gguf
    tiny = str(tmp_path / "tiny.gguf")
    tiny_gguf.write(tiny, n_layer=2, ctx=2048)
    cache.write_bytes(good)
    r = sift("-m", tiny, "-p", "hello there", "-n", "2", "--prompt-cache", str(cache))
    assert r.returncode != 0 and "another model" in r.stderr, r.stderr
    # read-only: a missing file is an error, an unrelated prompt leaves the file as it was
    r = sift("-m", MODEL, "-p", "hi", "-n", "2", "--prompt-cache", str(tmp_path / "none.bin"), "--prompt-cache-ro")
    assert r.returncode != 0 and "does not exist" in r.stderr
    cache.write_bytes(good)
    r = sift("-m", MODEL, "-p", "Completely different text. " * 60, "-n", "2", "--prompt-cache", str(cache),
             "--prompt-cache-ro")
    assert r.returncode == 0 and cache.read_bytes() == good, r.stderr
    r = sift("-m", MODEL, "-p", "hi", "--prompt-cache-ro")
    assert r.returncode == 2 and "--prompt-cache" in r.stderr
    r = sift("-m", MODEL, "-p", "hi", "--strategy", "fastkv", "--prompt-cache", str(cache))
    assert r.returncode != 0 and "plain prefill" in r.stderr, r.stderr


# ---- compress once, ask many (--prefix-cache on) ------------------------------------------------

@pytest.mark.parametrize("strategy", ["snapkv", "streamingllm", "fastkv", "snapkv+topk"])
def test_compressed_prefix_query_agnostic(tmp_path, strategy):
    """--prefix-cache on: a prefill strategy compresses the shared prefix once, scored by its own
    last tokens, and each request prefills its rest plainly over the kept entries: labelled in the
    record and note, the rest's rows alone computed, the cache as small as the strategy keeps;
    auto leaves such a strategy's requests whole."""
    path = str(tmp_path / "job.jsonl")
    reqs = write_job(path, False)
    on, s_on, err = run(path, "--strategy", strategy, "--prefix-cache", "on", "-n", "8")
    auto, s_auto, _ = run(path, "--strategy", strategy, "-n", "8")
    full, _, _ = run(path, "-n", "8", "--prefix-cache", "off")
    toks = tokens([r["prompt"] for r in reqs if r["id"] != "other"])
    bos = on[("q0", strategy)]["timings"]["prompt_n"] - len(toks[0])
    want = prefix_len(toks, bos)   # a prefill strategy prefills every prompt row
    assert s_on["prefix_cache"]["prefixes"] == 1, err
    assert s_auto["prefix_cache"]["prefixes"] == 0
    pre = strategy.split("+")[0]
    for r in reqs:
        a, b = on[(r["id"], strategy)], auto[(r["id"], strategy)]
        assert b["prefix_tokens"] == 0 and b["prefix"] is None
        if r["id"] == "other":
            assert a["prefix_tokens"] == 0 and a["prefix"] is None
            continue
        assert a["prefix_tokens"] == want and a["prefix"] == "compressed, query-agnostic", a
        assert f"the first {want} tokens compressed once by {pre}" in a["note"], a["note"]
        assert a["rows_processed"] == (a["timings"]["prompt_n"] - want) * N_LAYER
        # the kept prefix plus the rest: a fraction of full's cache (kv_rate 0.1 of the prompt)
        assert a["kv_bytes"] < 0.35 * full[(r["id"], "full")]["kv_bytes"], (a["kv_bytes"], full[(r["id"], "full")]["kv_bytes"])


def test_eval_query_agnostic(tmp_path):
    """sift eval --query-agnostic: a prefill strategy's context is compressed without the question
    (its note says so and the report's flag), full and topk run as by default (the same answers)."""
    out_d, out_q = tmp_path / "d.json", tmp_path / "q.json"
    args = ["eval", "-m", MODEL, "--strategy", "snapkv,topk", "--n-prompt", "512", "--samples", "1",
            "--tasks", "niah"]
    rd = sift(*args, "-o", str(out_d))
    rq = sift(*args, "--query-agnostic", "-o", str(out_q))
    assert rd.returncode == 0 and rq.returncode == 0, rq.stderr
    d, q = json.load(open(out_d)), json.load(open(out_q))
    assert d["query_agnostic"] is False and q["query_agnostic"] is True
    recs_d = {r["strategy"]: r for r in d["records"]}
    recs_q = {r["strategy"]: r for r in q["records"]}
    assert recs_q["full"]["answer"] == recs_d["full"]["answer"]
    assert recs_q["topk"]["answer"] == recs_d["topk"]["answer"]
    assert "compressed once by snapkv" in recs_q["snapkv"]["note"], recs_q["snapkv"]["note"]
    assert "compressed once" not in recs_d["snapkv"]["note"]
    # the first token's distribution: exactly full's when the question is in the window's pass
    # (its rows see every key), not so when the question is prefilled over the compressed context
    assert recs_d["snapkv"]["kl"] == 0 and recs_q["snapkv"]["kl"] > 0


def test_batch_api_job_over_one_document(tmp_path):
    """The Batch API's shape (chat requests over one document): the chat template and document are
    one shared prefix, each output object still validates (the schema and the openai client's own
    models, test_openai.run_batch), and the answers equal those of --prefix-cache off."""
    import test_openai
    doc = document(600, 4)
    rows = [test_openai.chat(f"c{i}", content=f"{doc}\nQuestion: {q}", max_tokens=12)
            for i, q in enumerate(QUESTIONS[:4])]
    on, s_on, _ = test_openai.run_batch(tmp_path, rows, name="on")
    off, s_off, _ = test_openai.run_batch(tmp_path, rows, "--prefix-cache", "off", name="off")
    assert s_on["prefix_cache"]["prefixes"] == 1 and s_on["prefix_cache"]["reused_tokens"] > 4 * 500
    assert s_off["prefix_cache"] is None
    for cid in on:
        assert test_openai.content(on[cid]) == test_openai.content(off[cid]), cid

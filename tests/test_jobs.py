"""Batch jobs through the sift command line (jobs/): --parallel, --prompts JSONL (sift's
fields and the OpenAI Batch API request shape), per-line errors, --output + --resume after a
kill, --shard, --unordered, and the summary record. The references are runs of the same
requests one at a time (--parallel 1) and without interruption or sharding; greedy decoding, so
the texts must be equal."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tiny_gguf  # noqa: E402
from test_cli import MODEL, SIFT, assert_error, need_model, sift  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_gguf.write(str(tmp_path_factory.mktemp("m") / "tiny.gguf"), ctx=4096)


WORDS = "river stone cloud amber quiet lantern meadow copper violet harbor".split()


def requests(n, lo=6):
    """n sift-shaped requests of different lengths and n_predict (they finish apart)."""
    out = []
    for i in range(n):
        text = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(5 + 4 * i))
        out.append({"id": f"r{i}", "prompt": text, "n_predict": lo + 3 * (i % 5)})
    return out


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def records(text):
    """The records of a run's output; the summary never goes among them (stderr, --summary)."""
    rows = [json.loads(l) for l in text.splitlines() if l.strip()]
    assert not any("summary" in r for r in rows), rows
    return rows


def summary(path):
    return json.loads(path.read_text())


def texts(recs):
    return {(r["id"], r.get("strategy")): r.get("text", r.get("error")) for r in recs}


def test_parallel_equals_one_at_a_time(tiny, tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", requests(10))
    base = ["-m", tiny, "--prompts", p, "--temp", "0", "--json", "-q"]
    one = sift(*base, "--parallel", "1")
    four = sift(*base, "--parallel", "4", "--summary", str(tmp_path / "s4.json"))
    assert one.returncode == 0 and four.returncode == 0, four.stderr
    r1, r4, s4 = records(one.stdout), records(four.stdout), [summary(tmp_path / "s4.json")]
    assert [r["id"] for r in r4] == [f"r{i}" for i in range(10)]   # input order
    assert texts(r1) == texts(r4)
    assert [r["timings"]["predicted_n"] for r in r4] == [6 + 3 * (i % 5) for i in range(10)]
    assert s4[0]["parallel"] == 4 and s4[0]["prompts"] == 10 and s4[0]["failed"] == 0
    assert s4[0]["decode_tokens"] == sum(3 * (i % 5) + 5 for i in range(10))


def test_every_strategy_in_a_batch(tiny, tmp_path):
    reqs = requests(9, lo=5)
    names = "full speed fastkv snapkv streamingllm specprefill swiftkv topk+phi topk".split()
    for r, s in zip(reqs, names):
        r["strategy"] = s
        r["prompt"] = (r["prompt"] + " ") * 6   # long enough for every strategy to select
    p = write_jsonl(tmp_path / "r.jsonl", reqs)
    base = ["-m", tiny, "--prompts", p, "--temp", "0", "--json", "-q"]
    one, nine = sift(*base), sift(*base, "--parallel", "9")
    assert one.returncode == 0 and nine.returncode == 0, nine.stderr
    r1 = records(one.stdout)
    r9 = records(nine.stdout)
    assert [r["strategy"] for r in r9] == names
    assert texts(r1) == texts(r9)


def test_ab_mode_batched_equals_sequential(tiny, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text(" ".join(WORDS * 8))
    base = ["-m", tiny, "-f", str(f), "--strategy", "full,fastkv,topk", "-n", "12", "--temp", "0",
            "--json", "-q"]
    seq, bat = sift(*base), sift(*base, "--parallel", "3")
    assert seq.returncode == 0 and bat.returncode == 0
    assert texts(records(seq.stdout)) == texts(records(bat.stdout))


def test_bad_lines_are_error_records(tiny, tmp_path):
    rows = [
        {"id": "ok1", "prompt": "river stone", "n_predict": 3},
        '{"id": "broken", "prompt": ',                       # malformed JSON
        {"id": "t", "prompt": "x", "n_predict": "ten"},       # a field of the wrong type
        {"id": "u", "prompt": "x", "colour": "red"},          # an unknown field
        {"id": "e", "prompt": ""},                            # an empty prompt
        {"id": "ok1", "prompt": "again"},                     # a duplicate id
        {"id": "s", "prompt": "x", "strategy": "nope"},       # an unknown strategy
        {"id": "n", "n_predict": 3},                          # no prompt
        {"id": "ok2", "prompt": "cloud amber", "n_predict": 3},
    ]
    p = write_jsonl(tmp_path / "r.jsonl", rows)
    r = sift("-m", tiny, "--prompts", p, "--temp", "0", "--json", "-q", "--parallel", "3",
             "--summary", str(tmp_path / "s.json"))
    assert r.returncode == 1
    recs, summ = records(r.stdout), [summary(tmp_path / "s.json")]
    # the repeated id's line is named line-6: no id appears twice among the records
    assert [x["id"] for x in recs] == ["ok1", "line-2", "t", "u", "e", "line-6", "s", "n", "ok2"]
    assert [x["line"] for x in recs] == list(range(1, 10))
    want = {2: "invalid JSON", 3: "'n_predict' must be an integer", 4: "unknown field 'colour'",
            5: "is empty", 6: "duplicate id 'ok1' (first at line 1)", 7: "'strategy' must name",
            8: "no prompt"}
    for x in recs:
        if x["line"] in want:
            assert want[x["line"]] in x["error"] and f"line {x['line']}" in x["error"], x
        else:
            assert "text" in x and "error" not in x
    assert summ[0]["failed"] == 7
    assert all("line" in l for l in r.stderr.splitlines() if l.startswith("sift: error"))


# The Batch API's output line (OpenAI's OpenAPI document: BatchRequestOutput) and the body of a
# /v1/chat/completions response (CreateChatCompletionResponse), restated as JSON Schema from the
# documentation: required fields, types, enums and nullability.
CHAT_COMPLETION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "chat.completion"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "system_fingerprint": {"type": "string"},
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["index", "message", "finish_reason", "logprobs"],
            "properties": {
                "index": {"type": "integer"},
                "finish_reason": {"enum": ["stop", "length", "tool_calls", "content_filter",
                                           "function_call"]},
                "logprobs": {"type": ["object", "null"]},
                "message": {"type": "object", "required": ["role", "content", "refusal"],
                            "properties": {"role": {"const": "assistant"},
                                           "content": {"type": ["string", "null"]},
                                           "refusal": {"type": ["string", "null"]}}}}}},
        "usage": {"type": "object",
                  "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
                  "properties": {k: {"type": "integer", "minimum": 0}
                                 for k in ("prompt_tokens", "completion_tokens", "total_tokens")}},
    },
}
BATCH_OUTPUT = {
    "type": "object",
    "required": ["id", "custom_id", "response", "error"],
    "additionalProperties": False,
    "properties": {
        "sift": {"type": "object"},   # sift's documented key (strategy, digests)
        "id": {"type": "string"},
        "custom_id": {"type": "string"},
        "response": {"oneOf": [{"type": "null"}, {
            "type": "object", "required": ["status_code", "request_id", "body"],
            "additionalProperties": False,
            "properties": {"status_code": {"type": "integer"}, "request_id": {"type": "string"},
                           "body": CHAT_COMPLETION}}]},
        "error": {"oneOf": [{"type": "null"}, {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}]},
    },
}


def batch_request(cid, content, max_tokens=8, system="Answer in one word."):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "max_tokens": max_tokens, "temperature": 0,
                     "messages": msgs}}


@need_model
def test_openai_batch_output(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    rows = [batch_request("req-1", "What is the capital of France?"),
            batch_request("req-2", "Write a long story about a river.", max_tokens=5, system=None),
            '{"custom_id": "req-3", "method": "POST", "body": {"messages": "not a list"}}',
            batch_request("req-4", "What is the capital of France?", max_tokens=9000)]
    p = write_jsonl(tmp_path / "r.jsonl", rows)
    out, summ = tmp_path / "out.jsonl", tmp_path / "summary.json"
    r = sift("-m", MODEL, "--prompts", p, "--output", str(out), "--summary", str(summ), "-c", "4096")
    assert r.returncode == 1, r.stderr   # two requests fail
    recs = records(out.read_text())
    for rec in recs:
        jsonschema.validate(rec, BATCH_OUTPUT)
    assert [x["custom_id"] for x in recs] == ["req-1", "req-2", "req-3", "req-4"]
    assert len({x["id"] for x in recs}) == 4 and all(x["id"].startswith("batch_req_") for x in recs)
    ok, length, bad, long = recs
    for x in (ok, length):   # answered: a 200 response, no error
        assert x["error"] is None and x["response"]["status_code"] == 200
        u = x["response"]["body"]["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] > 0
    body = ok["response"]["body"]
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["index"] == 0
    assert length["response"]["body"]["choices"][0]["finish_reason"] == "length"
    assert length["response"]["body"]["usage"]["completion_tokens"] == 5   # max_tokens
    for x, code, what in ((bad, "invalid_request", "'messages' must be an array"),
                          (long, "context_length_exceeded", "exceeds the context size")):
        assert x["response"] is None and x["error"]["code"] == code and what in x["error"]["message"]
    # the summary is its own file, with the run's counts
    s = summary(summ)
    assert (s["prompts"], s["done"], s["failed"], s["format"]) == (4, 4, 2, "openai")
    assert "4 prompts (2 failed)" in r.stderr
    # the same requests in sift's shape (--output-format sift): the same answers and token
    # counts; and in sift's own request fields too
    r2 = sift("-m", MODEL, "--prompts", p, "--json", "-q", "--output-format", "sift", "-c", "4096")
    own = {x["id"]: x for x in records(r2.stdout)}
    assert own["req-1"]["text"] == body["choices"][0]["message"]["content"]
    assert own["req-1"]["timings"]["prompt_n"] == body["usage"]["prompt_tokens"]
    mine = write_jsonl(tmp_path / "o.jsonl", [{"id": "x", "system": "Answer in one word.", "temp": 0,
                                              "prompt": "What is the capital of France?",
                                              "n_predict": 8}])
    (rec2,) = records(sift("-m", MODEL, "--prompts", mine, "--json", "-q").stdout)
    assert rec2["text"] == own["req-1"]["text"] and "strategy" in rec2   # sift's shape
    # --resume on a Batch API output: nothing is run twice
    again = sift("-m", MODEL, "--prompts", p, "--output", str(out), "--resume", "-q", "-c", "4096")
    assert records(out.read_text()) == recs, again.stderr
    # one response per custom_id: an A/B run cannot be written in this shape
    ab = sift("-m", MODEL, "--prompts", p, "--json", "--output-format", "openai", "--strategy", "full,speed")
    assert_error(ab, "--output-format openai writes one response per custom_id")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A slower random model (4 layers, d 256): a job of 40 requests takes seconds, so a signal
    sent after the first records lands mid-run."""
    return tiny_gguf.write(str(tmp_path_factory.mktemp("s") / "small.gguf"), n_layer=4, d=256,
                           n_head=4, n_kv=2, ff=512, ctx=4096)


def start_and_signal(args, out, sig, after=2):
    """Runs sift args writing to out; sends sig once out holds `after` records."""
    e = dict(os.environ)
    e.pop("SIFT_MODEL", None)
    proc = subprocess.Popen([SIFT, *args], env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    t0 = time.time()
    while time.time() - t0 < 120 and (not out.exists() or out.read_text().count("\n") < after):
        time.sleep(0.01)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_resume_after_kill(small, tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", requests(40, lo=60))
    whole = tmp_path / "whole.jsonl"
    base = ["-m", small, "--prompts", p, "--temp", "0", "-q", "--parallel", "3"]
    assert sift(*base, "--output", str(whole)).returncode == 0
    out = tmp_path / "out.jsonl"
    rc, _ = start_and_signal([*base, "--output", str(out), "--summary", str(tmp_path / "s1.json")],
                             out, signal.SIGTERM)
    assert rc == 128 + signal.SIGTERM   # SIGTERM stops the sequences in flight at once
    written = records(out.read_text())   # every line whole
    partial = [x for x in written if x.get("stop") != "interrupted"]
    assert 2 <= len(partial) < 40 and 1 <= len(written) - len(partial) <= 3   # those in flight
    with open(out, "a") as f:   # a record cut short by a harder kill: --resume drops it
        f.write('{"id": "r39", "text": "cut sh')
    again = sift(*base, "--output", str(out), "--resume", "--summary", str(tmp_path / "s2.json"))
    assert again.returncode == 0, again.stderr
    merged = records(out.read_text())
    summaries = [summary(tmp_path / "s1.json"), summary(tmp_path / "s2.json")]
    assert len(merged) == 40 and len({r["id"] for r in merged}) == 40
    assert texts(merged) == texts(records(whole.read_text()))
    assert [s["interrupted"] for s in summaries] == [True, False]
    assert summaries[1]["done_before"] == len(partial) and summaries[1]["done"] == 40 - len(partial)
    # resuming a complete file runs nothing and adds no record
    r = sift(*base, "--output", str(out), "--resume")
    assert r.returncode == 0 and records(out.read_text()) == merged


def test_ctrl_c_stops_in_flight_and_resume_completes(small, tmp_path):
    # one Ctrl-C stops the generation now: the sequences in flight are written with what they
    # made, marked interrupted; exit 130; --resume reruns exactly those and the ones not begun
    p = write_jsonl(tmp_path / "r.jsonl", requests(40, lo=60))
    out, whole = tmp_path / "out.jsonl", tmp_path / "whole.jsonl"
    base = ["-m", small, "--prompts", p, "--temp", "0", "--parallel", "3"]
    assert sift(*base, "-q", "--output", str(whole)).returncode == 0
    rc, err = start_and_signal([*base, "--output", str(out), "--summary", str(tmp_path / "s.json")], out,
                               signal.SIGINT)
    assert rc == 128 + signal.SIGINT and "interrupted (SIGINT)" in err, err
    recs, summ = records(out.read_text()), summary(tmp_path / "s.json")
    stopped = [r for r in recs if r["stop"] == "interrupted"]
    assert summ["interrupted"] and summ["stopped"] == len(stopped) and 2 <= len(recs) < 40
    assert 1 <= len(stopped) <= 3 and all(r["finish_reason"] == "interrupted" for r in stopped)
    ref = {r["id"]: r["text"] for r in records(whole.read_text())}
    for r in stopped:   # what it made so far: a strict beginning of the whole answer
        assert ref[r["id"]].startswith(r["text"]) and len(r["text"]) < len(ref[r["id"]])
        assert r["timings"]["predicted_n"] < 60 + 3 * (int(r["id"][1:]) % 5)
    again = sift(*base, "--output", str(out), "--resume")
    assert again.returncode == 0 and f"{len(stopped)} request" in again.stderr, again.stderr
    assert texts(records(out.read_text())) == texts(records(whole.read_text()))


def test_second_signal_exits_at_once(small, tmp_path):
    # a long prompt's prefill is under way: the first Ctrl-C waits for it, a second exits now
    # and leaves whole records only
    p = write_jsonl(tmp_path / "r.jsonl", requests(40, lo=200))
    out = tmp_path / "out.jsonl"
    e = dict(os.environ)
    e.pop("SIFT_MODEL", None)
    proc = subprocess.Popen([SIFT, "-m", small, "--prompts", p, "--temp", "0", "--output", str(out), "-q"],
                            env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: out.exists() and out.read_text().count("\n") >= 1, "a first record")
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 128 + signal.SIGINT
    records(out.read_text())   # every line a whole record
    assert out.read_text().endswith("\n")


def test_shards_together_equal_one_run(tiny, tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", requests(11))
    base = ["-m", tiny, "--prompts", p, "--temp", "0", "--json", "-q", "--parallel", "2"]
    whole = records(sift(*base).stdout)
    parts = []
    for k in range(3):
        r = sift(*base, "--shard", f"{k}/3")
        assert r.returncode == 0
        parts += records(r.stdout)
    assert [r["id"] for r in parts] == [r["id"] for r in whole]   # concatenation = input order
    assert texts(parts) == texts(whole)


def test_unordered_has_every_record(tiny, tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", requests(8))
    r = sift("-m", tiny, "--prompts", p, "--temp", "0", "--json", "-q", "--parallel", "4",
             "--unordered")
    recs = records(r.stdout)
    assert sorted(x["id"] for x in recs) == sorted(f"r{i}" for i in range(8))


def test_job_flag_errors(tiny, tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", requests(2))
    out = tmp_path / "o.jsonl"
    out.write_text("")
    assert_error(sift("-m", tiny, "--prompts", p, "--output", str(out)), "exists", "--resume", code=2)
    assert_error(sift("-m", tiny, "--prompts", p, "--resume"), "--output", code=2)
    for bad in ("3/3", "1", "a/b", "-1/2", "0/0"):
        assert_error(sift("-m", tiny, "--prompts", p, "--shard", bad), "--shard", code=2)
    assert_error(sift("-m", tiny, "--prompts", p, "--parallel", "0"), "--parallel", code=2)
    assert_error(sift("-m", tiny, "--prompts", str(tmp_path / "none.jsonl")), "none.jsonl")
    assert_error(sift("-m", tiny, "-p", "x", "--prompts", p), "-p", code=2)


def test_ab_strategies_share_one_seed(tiny, tmp_path):
    # no -s: one random seed per request, the same for each strategy of an A/B run
    f = tmp_path / "p.txt"
    f.write_text(" ".join(WORDS * 3))
    r = sift("-m", tiny, "-f", str(f), "--strategy", "full,streamingllm", "-n", "4", "--json", "-q")
    recs = records(r.stdout)
    assert len(recs) == 2 and recs[0]["seed"] == recs[1]["seed"]


def test_resume_keeps_failed_runs(tiny, tmp_path):
    # a strategy run that failed (prompt beyond -c) is a record: --resume does not redo it
    rows = [{"id": "long", "prompt": " ".join(WORDS * 20)}, {"id": "ok", "prompt": "river", "n_predict": 2}]
    p = write_jsonl(tmp_path / "r.jsonl", rows)
    out = tmp_path / "o.jsonl"
    base = ["-m", tiny, "--prompts", p, "--temp", "0", "-q", "-c", "64", "-n", "4", "--output", str(out)]
    assert sift(*base).returncode == 1
    first = records(out.read_text())
    assert [(r["id"], "error" in r) for r in first] == [("long", True), ("ok", False)]
    again = sift(*base, "--resume")   # nothing to run, but the job is not clean: exit 1
    assert again.returncode == 1 and "not clean" in again.stderr, again.stderr
    assert records(out.read_text()) == first


def test_seeded_sampling_is_batch_independent(tiny, tmp_path):
    # temperature 0.9 with a seed per request: each sequence keeps its own sampler, so a batch
    # samples the tokens each request samples alone
    reqs = requests(6, lo=10)
    for i, r in enumerate(reqs):
        r.update(temp=0.9, seed=100 + i)
    p = write_jsonl(tmp_path / "r.jsonl", reqs)
    base = ["-m", tiny, "--prompts", p, "--json", "-q"]
    one, four = records(sift(*base).stdout), records(sift(*base, "--parallel", "4").stdout)
    assert texts(one) == texts(four) and [r["seed"] for r in four] == [100 + i for i in range(6)]


# ---- the records file: one shape per file, resume keeps every valid record, locks, --errors ----

def batch_lines(n, bad=None):
    """n Batch API requests (tiny model, greedy, 3 tokens); line `bad` (1-based) is not JSON."""
    rows = [batch_request(f"req-{i + 1}", f"{WORDS[i % 10]} {WORDS[(i * 3) % 10]}", max_tokens=3)
            for i in range(n)]
    if bad:
        rows[bad - 1] = '{"custom_id": "req-%d", "method": "POST", "body": {' % bad
    return rows


def test_bad_line_keeps_batch_shape_and_fix_resume(tiny, tmp_path):
    # the README mishap: one line that is not JSON used to switch the whole output to sift's shape,
    # and fixing it + --resume appended Batch API records to it (a mixed file, one request twice)
    p, out = tmp_path / "b.jsonl", tmp_path / "out.jsonl"
    write_jsonl(p, batch_lines(12, bad=5))
    base = ["-m", tiny, "--prompts", str(p), "--output", str(out), "-q"]
    assert sift(*base).returncode == 1   # line 5 fails
    recs = records(out.read_text())
    assert all(set(r) - {"sift"} == {"id", "custom_id", "response", "error"} for r in recs)   # one shape
    assert [r["custom_id"] for r in recs] == [f"req-{i}" for i in range(1, 5)] + ["line-5"] + \
        [f"req-{i}" for i in range(6, 13)]
    assert recs[4]["error"]["code"] == "invalid_request" and "line 5" in recs[4]["error"]["message"]
    write_jsonl(p, batch_lines(12))   # the line fixed
    r = sift(*base, "--resume")
    assert r.returncode == 0, r.stderr
    again = records(out.read_text())
    assert [x["custom_id"] for x in again] == [f"req-{i}" for i in range(1, 13)]   # in input order
    assert all(x["error"] is None for x in again)
    assert [x for x in again if x["custom_id"] != "req-5"] == [x for x in recs if x["custom_id"] not in ("line-5",)]
    # a second resume finds the job complete: the file is left as it is
    assert sift(*base, "--resume").returncode == 0 and records(out.read_text()) == again


def test_resume_refuses_another_runs_file(tiny, tmp_path):
    p, out = tmp_path / "b.jsonl", tmp_path / "out.jsonl"
    write_jsonl(p, batch_lines(3))
    assert sift("-m", tiny, "--prompts", str(p), "--output", str(out), "-q").returncode == 0
    before = out.read_bytes()
    # the other shape: refused, naming both files, the file untouched
    r = sift("-m", tiny, "--prompts", str(p), "--output", str(out), "--resume", "--output-format", "sift")
    assert_error(r, str(out), str(p), "shape")
    assert len([l for l in r.stderr.splitlines() if "error" in l]) == 1
    assert out.read_bytes() == before
    # another request file (its ids are not this run's): refused, naming both
    other = write_jsonl(tmp_path / "o.jsonl", [batch_request("zz", "river", max_tokens=3)])
    r = sift("-m", tiny, "--prompts", other, "--output", str(out), "--resume")
    assert_error(r, str(out), other, "'req-1'")
    assert out.read_bytes() == before
    # another shard's records
    r = sift("-m", tiny, "--prompts", str(p), "--output", str(out), "--resume", "--shard", "1/3")
    assert_error(r, str(out), "shard")


def test_resume_keeps_records_after_damage(tiny, tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", requests(8))
    out, whole = tmp_path / "out.jsonl", tmp_path / "whole.jsonl"
    base = ["-m", tiny, "--prompts", p, "--temp", "0", "-q"]
    assert sift(*base, "--output", str(whole)).returncode == 0
    lines = whole.read_bytes().splitlines(keepends=True)
    # damage in the middle: a half record (r2), a foreign line, a second copy of r5, a record of the
    # other shape, an over-long line (beyond 64 MiB: skipped, never held), an empty line
    planted = (lines[:2] + [lines[2][:40] + b"\n", b"\x00\xffnot json\n"] + lines[3:6] + [lines[5]]
               + [b'{"id":"x","custom_id":"r6","response":null,"error":{"code":"c","message":"m"}}\n']
               + [b'"' + b"a" * (65 << 20) + b'"\n', b"\n"] + lines[7:])
    out.write_bytes(b"".join(planted))
    (tmp_path / ".out.jsonl.k1ll3d").write_bytes(lines[0])   # what a rewrite killed midway leaves
    offsets = [sum(len(l) for l in planted[:i]) for i in range(len(planted))]
    r = sift(*base, "--output", str(out), "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    for i in (2, 3, 7, 8, 9, 10):   # each damaged line is reported by line number and byte offset
        assert f"line {i + 1} (byte offset {offsets[i]})" in r.stderr, (i, r.stderr)
    recs = records(out.read_text())
    assert [x["id"] for x in recs] == [f"r{i}" for i in range(8)]   # one each, in input order
    assert texts(recs) == texts(records(whole.read_text()))
    # the valid records before and after the damage were kept as they were (r2 and r6 rerun)
    kept = {json.loads(l)["id"]: l for l in lines}
    assert [l for l in out.read_bytes().splitlines(keepends=True) if json.loads(l)["id"] not in ("r2", "r6")] \
        == [kept[f"r{i}"] for i in (0, 1, 3, 4, 5, 7)]
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".out.jsonl.")]   # no temporary left
    assert not (tmp_path / "out.jsonl.lock").exists()


def test_resume_through_a_symlink(tiny, tmp_path):
    # the records file named through a symlink: the file it names is continued and rewritten,
    # the link stays a link
    p = write_jsonl(tmp_path / "r.jsonl", requests(4))
    real, link = tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    base = ["-m", tiny, "--prompts", p, "--temp", "0", "-q"]
    assert sift(*base, "--output", str(real)).returncode == 0
    whole = real.read_bytes()
    real.write_bytes(whole.replace(b"\n", b"\n\n", 1))   # an empty line: the file is rewritten
    os.symlink(real, link)
    r = sift(*base, "--output", str(link), "--resume")
    assert r.returncode == 0 and "line 2" in r.stderr, r.stderr
    assert os.path.islink(link) and real.read_bytes() == whole


def test_fix_a_bad_line_and_resume_sift_shape(tiny, tmp_path):
    rows = requests(4)
    p, out = tmp_path / "r.jsonl", tmp_path / "out.jsonl"
    write_jsonl(p, rows[:2] + ['{"id": "r2", "prompt": 7}'] + rows[3:])
    base = ["-m", tiny, "--prompts", str(p), "--temp", "0", "-q", "--output", str(out)]
    assert sift(*base).returncode == 1
    assert "error" in records(out.read_text())[2]
    write_jsonl(p, rows)
    assert sift(*base, "--resume").returncode == 0
    recs = records(out.read_text())
    assert [x["id"] for x in recs] == ["r0", "r1", "r2", "r3"] and all("text" in x for x in recs)


def test_errors_file_and_retry_failed(tiny, tmp_path):
    rows = [{"id": "long", "prompt": " ".join(WORDS * 20)}, {"id": "ok", "prompt": "river", "n_predict": 2},
            '{"id": "bad", "prompt": ', {"id": "ok2", "prompt": "stone", "n_predict": 2}]
    p = write_jsonl(tmp_path / "r.jsonl", rows)
    out, errs = tmp_path / "o.jsonl", tmp_path / "e.jsonl"
    base = ["-m", tiny, "--prompts", p, "--temp", "0", "-q", "-n", "4", "--output", str(out), "--errors", str(errs)]
    assert sift(*base, "-c", "64").returncode == 1
    assert [x["id"] for x in records(out.read_text())] == ["ok", "ok2"]
    e1 = records(errs.read_text())
    assert [(x["id"], "error" in x) for x in e1] == [("long", True), ("line-3", True)]
    # --resume reads both: nothing runs again
    r = sift(*base, "-c", "64", "--resume", "--summary", str(tmp_path / "s.json"))
    s = summary(tmp_path / "s.json")   # the failures on file still fail the job
    assert r.returncode == 1 and s["done_before"] == 4 and (s["failed"], s["failed_before"]) == (2, 2)
    assert records(errs.read_text()) == e1
    # --retry-failed: the failed requests run again (here with room for the long prompt); their old
    # error records are removed, the rest kept
    r = sift(*base, "-c", "4096", "--resume", "--retry-failed")
    assert r.returncode == 1   # the bad line fails again
    assert [x["id"] for x in records(out.read_text())] == ["long", "ok", "ok2"]
    assert [x["id"] for x in records(errs.read_text())] == ["line-3"]
    assert_error(sift(*base, "--retry-failed"), "--resume", code=2)


def wait_for(cond, what):
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < 120, what
        time.sleep(0.02)


def test_second_writer_refused_or_waits(small, tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", requests(40, lo=100))
    out, lock = tmp_path / "out.jsonl", tmp_path / "out.jsonl.lock"
    base = ["-m", small, "--prompts", p, "--temp", "0", "-q", "--output", str(out)]
    e = dict(os.environ)
    e.pop("SIFT_MODEL", None)
    first = subprocess.Popen([SIFT, *base], env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(lambda: lock.exists() and lock.read_text().strip() == str(first.pid), "the first holds the lock")
    # a requeued copy of the job while the first still runs: refused with the holder's pid
    r = sift(*base, "--resume")
    assert_error(r, f"pid {first.pid}", "--wait-lock")
    # without --resume: the lock is named first, not "add --resume"
    r = sift(*base)
    assert_error(r, f"pid {first.pid}", "another sift", code=2)
    assert "add --resume" not in r.stderr
    assert first.poll() is None
    # --wait-lock: it waits (says so), then continues the completed file: nothing twice
    second = subprocess.Popen([SIFT, *base, "--resume", "--wait-lock"], env=e, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    assert first.wait(timeout=300) == 0
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0 and "waiting" in err and str(first.pid) in err, err
    recs = records(out.read_text())
    assert sorted(x["id"] for x in recs) == sorted(f"r{i}" for i in range(40)) and len(recs) == 40
    assert not lock.exists()   # removed at exit
    # kill -9 releases the lock (the kernel drops it): a resume takes it over at once
    third = subprocess.Popen([SIFT, *base[:-1], str(tmp_path / "o2.jsonl")], env=e,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: (tmp_path / "o2.jsonl.lock").exists(), "the third holds the lock")
    third.kill()
    third.wait()
    r = sift(*base[:-1], str(tmp_path / "o2.jsonl"), "--resume")
    assert r.returncode == 0, r.stderr


def test_special_outputs(tiny, tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", requests(3))
    base = ["-m", tiny, "--prompts", p, "--temp", "0", "-q"]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert_error(sift(*base, "--output", str(fifo), "--resume"), str(fifo), "not a regular file", code=2)
    try:
        os.mknod(tmp_path / "full", 0o666 | __import__("stat").S_IFCHR, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("mknod refused (not root)")
    full = tmp_path / "full"
    r = sift(*base, "--output", str(full), "--resume")
    assert_error(r, str(full), "not a regular file", code=2)
    # written in place, never replaced: the write fails, named, and the node is still the device
    r = sift(*base, "--output", str(full))
    assert_error(r, str(full), "No space left on device")
    assert r.returncode == 1 and __import__("stat").S_ISCHR(os.stat(full).st_mode)
    assert not (tmp_path / "full.lock").exists()   # a device is not locked
    # stdout on the full device: text mode and JSON records alike exit non-zero, naming stdout
    for extra in ([], ["--json"]):
        with open(full, "w") as fd:
            r = subprocess.run([SIFT, *base, *extra], stdout=fd, stderr=subprocess.PIPE, text=True)
        assert r.returncode == 1 and "stdout" in r.stderr and "No space left" in r.stderr, r.stderr
    with open(full, "w") as fd:   # text to stdout from a single prompt, streamed token by token
        r = subprocess.run([SIFT, "-m", tiny, "-p", "river stone", "-n", "4", "-q"], stdout=fd,
                           stderr=subprocess.PIPE, text=True)
    assert r.returncode == 1 and "stdout" in r.stderr, r.stderr

"""OpenAI Batch API requests (--prompts FILE.jsonl of Batch lines) honoured or refused, field by
field, on the default model at temperature 0 (deterministic) or a fixed seed:

- `stop`: a run without it gives the text; the stop string's first occurrence in that text,
  found here, is where the answer must end (finish_reason "stop"); a stop that never occurs
  changes nothing;
- `n`: n 2 at temperature 0 gives two equal choices (indexes 0 and 1) equal to the n 1 answer; at
  a temperature with a seed, choice 0 is the n 1 answer with that seed; usage and the summary
  count the prompt once (one prefill); --parallel does not change the choices; a strategy whose
  decode state cannot be copied, and sift's own output shape, refuse n > 1 per line;
- `frequency_penalty` / `presence_penalty`: the first token a penalty changes, computed here from
  an independent run's greedy tokens and every step's logits (build/tests/tool_logits) with
  OpenAI's formula, and the greedy repetition gone;
- `/v1/completions`: a text_completion object (cmpl- id, text, logprobs null), the raw prompt
  (no chat template), equal to sift's own raw run;
- every field, URL and method sift does not implement: that line's error, a code from docs/batch.md's
  list, accepted by the openai client's BatchError model, the whole line valid against a JSON
  Schema of the documented Batch output object (written here); the rest of the job answered;
  fields that change nothing (model, user, metadata, defaults, nulls) accepted;
- the emulated CUDA build (build/sift-simt): penalised requests answered as on the CPU (the
  device sampler declines penalised rows and the host draws them).
The formula itself is checked on hand-made logits in tests/test_model.c (test_penalties)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_cli import MODEL, ROOT, need_model, sift  # noqa: E402

TOOL_LOGITS = os.path.join(ROOT, "build", "tests", "tool_logits")
TOOL_TOKENIZE = os.path.join(ROOT, "build", "tests", "tool_tokenize")
SIFT_SIMT = os.path.join(ROOT, "build", "sift-simt")
CODES = {"invalid_request", "unsupported_parameter", "unsupported_url", "unsupported_method",
         "context_length_exceeded", "server_error", "batch_cancelled"}   # docs/batch.md's list
COUNT = "Count from one to ten in words."
REPEAT = "one one one one one one one one"   # greedy continues "-to-many-to-many": a repetition

# The Batch API's output object (BatchRequestOutput) and the two response bodies sift writes
# (CreateChatCompletionResponse, CreateCompletionResponse), restated from the documentation.
USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
         "properties": {k: {"type": "integer", "minimum": 0}
                        for k in ("prompt_tokens", "completion_tokens", "total_tokens")}}
FINISH = {"enum": ["stop", "length", "tool_calls", "content_filter", "function_call"]}
CHAT_COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": {"type": "string", "pattern": "^chatcmpl-"}, "object": {"const": "chat.completion"},
        "created": {"type": "integer"}, "model": {"type": "string"},
        "system_fingerprint": {"type": "string"}, "usage": USAGE,
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["index", "message", "finish_reason", "logprobs"],
            "properties": {
                "index": {"type": "integer", "minimum": 0}, "finish_reason": FINISH,
                "logprobs": {"type": ["object", "null"]},
                "message": {"type": "object", "required": ["role", "content"],
                            "properties": {"role": {"const": "assistant"},
                                           "content": {"type": ["string", "null"]},
                                           "refusal": {"type": ["string", "null"]}}}}}}}}
TEXT_COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": {"type": "string", "pattern": "^cmpl-"}, "object": {"const": "text_completion"},
        "created": {"type": "integer"}, "model": {"type": "string"},
        "system_fingerprint": {"type": "string"}, "usage": USAGE,
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["text", "index", "logprobs", "finish_reason"],
            "additionalProperties": False,
            "properties": {"text": {"type": "string"}, "index": {"type": "integer", "minimum": 0},
                           "logprobs": {"type": ["object", "null"]},
                           "finish_reason": {"enum": ["stop", "length", "content_filter"]}}}}}}
BATCH_OUTPUT = {
    "type": "object", "required": ["id", "custom_id", "response", "error"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string"}, "custom_id": {"type": "string"},
        "response": {"oneOf": [{"type": "null"}, {
            "type": "object", "required": ["status_code", "request_id", "body"],
            "additionalProperties": False,
            "properties": {"status_code": {"type": "integer"}, "request_id": {"type": "string"},
                           "body": {"oneOf": [CHAT_COMPLETION, TEXT_COMPLETION]}}}]},
        "error": {"oneOf": [{"type": "null"}, {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"enum": sorted(CODES)}, "message": {"type": "string"}}}]},
        # sift's own documented key (docs/batch.md): what --resume compares
        "sift": {"type": "object", "required": ["strategy", "request_digest", "options_digest"],
                 "additionalProperties": False,
                 "properties": {"strategy": {"type": "string"},
                                "request_digest": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
                                "options_digest": {"type": "string", "pattern": "^[0-9a-f]{16}$"}}}}}


def chat(cid, content=COUNT, url="/v1/chat/completions", method="POST", **body):
    body.setdefault("max_tokens", 24)
    body.setdefault("temperature", 0)
    return {"custom_id": cid, "method": method, "url": url,
            "body": {"messages": [{"role": "user", "content": content}], **body}}


def completion(cid, prompt=REPEAT, **body):
    body.setdefault("max_tokens", 16)
    body.setdefault("temperature", 0)
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions",
            "body": {"prompt": prompt, **body}}


def run_batch(tmp_path, rows, *args, name="r", binary=None):
    """The job's records by custom_id (each validated against BATCH_OUTPUT), the summary, stderr."""
    jsonschema = pytest.importorskip("jsonschema")
    path, out, summ = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out", tmp_path / f"{name}.summary"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    # the format named, so that each test says which shape it checks
    r = sift("-m", MODEL, "--prompts", str(path), "--output", str(out), "--summary", str(summ),
             "--output-format", "openai", "-q", "-t", "1", *args, **({"sift_bin": binary} if binary else {}))
    assert r.returncode in (0, 1), r.stderr
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    openai_types = pytest.importorskip("openai.types")
    from openai.types.chat import ChatCompletion
    for rec in recs:
        jsonschema.validate(rec, BATCH_OUTPUT)
        # and the openai client's own models (they keep the unknown 'sift' key as an extra)
        if rec["response"]:
            b = rec["response"]["body"]
            m = (openai_types.Completion if b["object"] == "text_completion" else ChatCompletion).model_validate(b)
            assert m.id == b["id"] and len(m.choices) == len(b["choices"])
        else:
            assert openai_types.BatchError.model_validate(rec["error"]).code == rec["error"]["code"]
    ids = [x["custom_id"] for x in recs]
    assert len(ids) == len(set(ids)) == len(rows), ids   # one record per request
    return {x["custom_id"]: x for x in recs}, json.loads(summ.read_text()), r


def body(rec):
    assert rec["error"] is None and rec["response"]["status_code"] == 200, rec
    return rec["response"]["body"]


def content(rec, k=0):
    c = body(rec)["choices"][k]
    return c["message"]["content"] if "message" in c else c["text"]


def finish(rec, k=0):
    return body(rec)["choices"][k]["finish_reason"]


@need_model
def test_stop_string_cut(tmp_path):
    base, _, _ = run_batch(tmp_path, [chat("plain"), completion("raw", REPEAT)], name="base")
    text, raw = content(base["plain"]), content(base["raw"])
    assert finish(base["plain"]) == "length" and len(text) > 12, text
    # a stop from the middle of the text; a list (the answer ends at the first occurrence of any
    # of them); one that never occurs
    mid, late = text[len(text) // 2:len(text) // 2 + 3], text[-3:]
    cut = text.find(mid)
    cut_list = min(text.find(s) for s in (late, mid))
    raw_stop = raw[3:6]
    rows = [chat("one", stop=mid), chat("list", stop=["never-in-it", late, mid]),
            chat("none", stop=["never-in-it"]), chat("null", stop=None),
            completion("raw", REPEAT, stop=raw_stop)]
    got, _, _ = run_batch(tmp_path, rows)
    for cid, at in (("one", cut), ("list", cut_list)):
        assert content(got[cid]) == text[:at] and finish(got[cid]) == "stop", (cid, got[cid], text)
    for cid in ("none", "null"):
        assert content(got[cid]) == text and finish(got[cid]) == "length", (cid, got[cid])
    assert content(got["raw"]) == raw[:raw.find(raw_stop)] and finish(got["raw"]) == "stop"
    # the stop text's tokens were sampled: counted in usage (fewer than without the stop)
    used = body(got["one"])["usage"]["completion_tokens"]
    assert 0 < used < body(base["plain"])["usage"]["completion_tokens"]


@need_model
def test_several_choices_share_one_prefill(tmp_path):
    rows = [chat("one"), chat("two", n=2),
            chat("seed", temperature=0.9, seed=5), chat("seed3", temperature=0.9, seed=5, n=3),
            chat("fastkv2", n=2), chat("topk2", n=2)]
    rows[4]["strategy"] = "fastkv"
    rows[5]["strategy"] = "topk"
    got, summ, _ = run_batch(tmp_path, rows)
    one, two = body(got["one"]), body(got["two"])
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert content(got["two"], 0) == content(got["two"], 1) == content(got["one"])
    # usage: the prompt once, every choice's tokens
    assert two["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert two["usage"]["completion_tokens"] == 2 * one["usage"]["completion_tokens"]
    assert two["usage"]["total_tokens"] == two["usage"]["prompt_tokens"] + two["usage"]["completion_tokens"]
    # a temperature with a seed: choice 0 is the n 1 answer; the others draw their own streams
    three = body(got["seed3"])
    assert [c["index"] for c in three["choices"]] == [0, 1, 2]
    assert content(got["seed3"], 0) == content(got["seed"])
    assert len({content(got["seed3"], k) for k in range(3)}) > 1, three
    assert content(got["fastkv2"], 0) == content(got["fastkv2"], 1)
    # topk keeps per-sequence decode state: refused for this line only
    err = got["topk2"]["error"]
    assert got["topk2"]["response"] is None and err["code"] == "unsupported_parameter"
    assert "cannot be copied" in err["message"] and "line 6" in err["message"], err
    # one prefill per request: the summary's prompt tokens count each prompt once
    # (five requests of the same prompt run, topk2 refused before any prefill; one prefill per
    # choice would make 9)
    assert summ["prompt_tokens"] == 5 * one["usage"]["prompt_tokens"], summ
    # choices decoded side by side (--parallel) are the same choices
    par, _, _ = run_batch(tmp_path, rows, "--parallel", "4", name="par")
    for cid in ("two", "seed3", "fastkv2"):
        assert body(par[cid])["choices"] == body(got[cid])["choices"], cid
    # sift's own shape has one record per (request, strategy): n > 1 is refused there
    path = tmp_path / "own.jsonl"
    path.write_text(json.dumps(chat("two", n=2)) + "\n" + json.dumps(chat("one")) + "\n")
    r = sift("-m", MODEL, "--prompts", str(path), "--json", "-q", "--output-format", "sift")
    recs = {x["id"]: x for x in map(json.loads, r.stdout.splitlines())}
    assert r.returncode == 1 and "n > 1" in recs["two"]["error"] and recs["one"]["text"] == content(got["one"])


@need_model
def test_resume_of_a_finished_job_changes_nothing(tmp_path):
    """Requests refused for what their line says (an empty prompt or message, n > 1 with a
    strategy that keeps decode state) are refused before they run, as the line's error: a
    --resume of the finished job finds every record to be its request's outcome, reports no
    damage, runs nothing and leaves the file byte for byte."""
    rows = [chat("one", max_tokens=4), chat("empty", content=""), chat("topk2", n=2),
            completion("blank", prompt="")]
    rows[2]["strategy"] = "topk"
    got, _, _ = run_batch(tmp_path, rows)
    assert "is empty" in got["empty"]["error"]["message"] and "line 2" in got["empty"]["error"]["message"]
    assert "'prompt' is empty" in got["blank"]["error"]["message"]
    assert got["topk2"]["error"]["code"] == "unsupported_parameter"
    out = tmp_path / "r.out"
    before = out.read_bytes()
    r = sift("-m", MODEL, "--prompts", str(tmp_path / "r.jsonl"), "--output", str(out),
             "--output-format", "openai", "--resume", "-t", "1")
    assert r.returncode == 1 and "3 failures recorded by an earlier run" in r.stderr, r.stderr   # not clean
    assert "--resume:" not in r.stderr, r.stderr   # no line reported as damaged or changed
    assert "0 to run, 4 done before" in r.stderr, r.stderr
    assert out.read_bytes() == before


def tokenize(text):
    b = text.encode()
    p = subprocess.run([TOOL_TOKENIZE, MODEL], input=len(b).to_bytes(4, "little") + b,
                       capture_output=True, timeout=60)
    assert p.returncode == 0 and not p.stdout.startswith(b"ERROR"), p.stderr
    return [int(x) for x in p.stdout.split()]


def detokenize(ids):
    """The text of byte-level BPE tokens, from the GGUF's vocabulary (GPT-2's byte alphabet)."""
    gguf = pytest.importorskip("gguf")
    tokens = gguf.GGUFReader(MODEL).get_field("tokenizer.ggml.tokens").contents()
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra = [b for b in range(256) if b not in printable]
    to_byte = {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(extra)}
    return b"".join(bytes(to_byte[c] for c in tokens[i]) for i in ids).decode("utf-8", "replace")


@need_model
@pytest.mark.skipif(not (os.path.exists(TOOL_LOGITS) and os.path.exists(TOOL_TOKENIZE)),
                    reason="build/tests/tool_logits and tool_tokenize not built")
def test_penalty_changes_greedy_token(tmp_path):
    freq, pres, n = 1.5, 0.5, 16
    # the independent run: greedy tokens of the raw prompt and every step's logits
    ids = tokenize(REPEAT)
    steps = tmp_path / "steps.f32"
    p = subprocess.run([TOOL_LOGITS, MODEL, os.devnull, "--greedy", str(n), "--steps", str(steps),
                        *map(str, ids)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr
    greedy = [int(x) for x in p.stdout.split()]
    logits = np.fromfile(steps, dtype=np.float32).reshape(n, -1)
    # OpenAI's formula along the greedy path until the first step whose penalised argmax differs
    counts = np.zeros(logits.shape[1], np.float32)
    for k in range(n):
        pen = logits[k] - counts * np.float32(freq) - (counts > 0).astype(np.float32) * np.float32(pres)
        x = int(np.argmax(pen))
        if x != greedy[k]:
            break
        counts[x] += 1
    else:
        pytest.fail(f"the penalties change none of the {n} greedy tokens {greedy}")
    top2 = np.sort(pen)[-2:]
    assert top2[1] - top2[0] > 1e-3, "a near-tie: the expectation would hang on rounding"
    want = detokenize(greedy[:k] + [x])
    rows = [completion("plain", max_tokens=n),
            completion("pen", max_tokens=n, frequency_penalty=freq, presence_penalty=pres),
            completion("greedy-pen", max_tokens=n, frequency_penalty=0, presence_penalty=0)]
    got, _, _ = run_batch(tmp_path, rows)
    plain, pen_text = content(got["plain"]), content(got["pen"])
    assert plain.startswith(detokenize(greedy[:k + 1])), (plain, greedy)   # the two runs agree
    assert pen_text.startswith(want) and not plain.startswith(want), (pen_text, want, plain)
    assert content(got["greedy-pen"]) == plain   # zero penalties change nothing
    # the repetition the greedy answer has is gone
    rep = "-to-many"
    assert plain.count(rep) >= 2 and pen_text.count(rep) < plain.count(rep), (plain, pen_text)
    # sift's own request fields take the same penalties
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps({"id": "x", "prompt": REPEAT, "n_predict": n, "temp": 0,
                               "frequency_penalty": freq, "presence_penalty": pres}) + "\n")
    r = sift("-m", MODEL, "--prompts", str(own), "--json", "-q", "-t", "1")
    assert json.loads(r.stdout)["text"] == pen_text, r.stderr


@need_model
def test_completions_object(tmp_path):
    got, _, _ = run_batch(tmp_path, [completion("c", "The capital of France is", max_tokens=12),
                                     completion("n2", "The capital of France is", max_tokens=12, n=2)])
    b = body(got["c"])
    assert b["object"] == "text_completion" and b["id"].startswith("cmpl-")
    (c,) = b["choices"]
    assert c["index"] == 0 and c["logprobs"] is None and set(c) == {"text", "index", "logprobs", "finish_reason"}
    # the raw prompt, no chat template: sift's own raw run of it, and its token count
    r = sift("-m", MODEL, "-p", "The capital of France is", "-n", "12", "--temp", "0", "-q", "-t", "1")
    assert c["text"] == r.stdout.rstrip("\n")
    if os.path.exists(TOOL_TOKENIZE):
        assert b["usage"]["prompt_tokens"] == len(tokenize("The capital of France is"))
    assert [x["text"] for x in body(got["n2"])["choices"]] == [c["text"]] * 2


@need_model
def test_unsupported_become_line_errors(tmp_path):
    openai_types = pytest.importorskip("openai.types")
    refused = [  # (request, code, what the message names)
        (chat("logprobs", logprobs=True), "unsupported_parameter", "logprobs"),
        (chat("top_logprobs", top_logprobs=2), "unsupported_parameter", "top_logprobs"),
        (chat("tools", tools=[{"type": "function", "function": {"name": "f"}}]), "unsupported_parameter", "tools"),
        (chat("tool_choice", tool_choice="auto"), "unsupported_parameter", "tool_choice"),
        (chat("functions", functions=[{"name": "f"}]), "unsupported_parameter", "functions"),
        (chat("response_format", response_format={"type": "json_object"}), "unsupported_parameter", "response_format"),
        (chat("logit_bias", logit_bias={"50256": -100}), "unsupported_parameter", "logit_bias"),
        (chat("stream", stream=True), "unsupported_parameter", "stream"),
        (chat("unknown", frobnicate=1), "unsupported_parameter", "frobnicate"),
        (completion("echo", echo=True), "unsupported_parameter", "echo"),
        (completion("suffix", suffix="!"), "unsupported_parameter", "suffix"),
        (completion("best_of", best_of=3), "unsupported_parameter", "best_of"),
        (completion("prompt_list", ["a", "b"]), "unsupported_parameter", "not a string"),
        (completion("prompt_ids", [1, 2, 3]), "unsupported_parameter", "not a string"),
        (completion("messages_on_completions", messages=[{"role": "user", "content": "x"}]),
         "unsupported_parameter", "messages"),
        (chat("parts", content=[{"type": "text", "text": "hi"}]), "unsupported_parameter", "array of parts"),
        (chat("embeddings", url="/v1/embeddings"), "unsupported_url", "/v1/embeddings"),
        (chat("responses", url="/v1/responses"), "unsupported_url", "/v1/responses"),
        (chat("get", method="GET"), "unsupported_method", "GET"),
        (chat("stop5", stop=["a", "b", "c", "d", "e"]), "invalid_request", "stop"),
        (chat("n0", n=0), "invalid_request", "'n'"),
        (chat("pen3", frequency_penalty=3), "invalid_request", "frequency_penalty"),
        ("{not json", "invalid_request", "invalid JSON"),
    ]
    accepted = [chat("model", model="gpt-4o-mini", user="u1", metadata={"k": "v"}, store=False,
                     service_tier="auto", logprobs=False, stream=False, n=1, logit_bias={}, tools=[],
                     response_format={"type": "text"}, top_logprobs=None, seed=None, stop=None,
                     parallel_tool_calls=True),
                chat("developer", content=COUNT),
                chat("plain")]
    accepted[1]["body"]["messages"].insert(0, {"role": "developer", "content": "Be brief."})
    got, summ, r = run_batch(tmp_path, [x for x, _, _ in refused] + accepted)
    for i, (req, code, what) in enumerate(refused):
        cid = req["custom_id"] if isinstance(req, dict) else f"line-{i + 1}"
        rec = got[cid]
        assert rec["response"] is None and rec["error"]["code"] == code, rec
        assert what in rec["error"]["message"] and f"line {i + 1}:" in rec["error"]["message"], rec
        e = openai_types.BatchError.model_validate(rec["error"])
        assert e.code == code and e.message == rec["error"]["message"]
    # the rest of the job is answered; fields that change nothing leave the answer as it is
    assert content(got["model"]) == content(got["plain"]) and finish(got["plain"]) == "length"
    assert body(got["developer"])["usage"]["prompt_tokens"] != body(got["plain"])["usage"]["prompt_tokens"]
    assert (summ["failed"], summ["done"]) == (len(refused), len(refused) + 3), summ
    assert r.returncode == 1


@need_model
def test_text_mode_prints_choices_and_cut_text(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(chat("a")) + "\n")
    plain = sift("-m", MODEL, "--prompts", str(path), "-q", "-t", "1").stdout.rstrip("\n")
    stop = plain[len(plain) // 2:len(plain) // 2 + 3]
    path.write_text(json.dumps(chat("a", stop=stop)) + "\n" + json.dumps(chat("b", n=2)) + "\n")
    r = sift("-m", MODEL, "--prompts", str(path), "-q", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"==> a <==\n{plain[:plain.find(stop)]}\n==> b [choice 0] <==\n{plain}\n"
                        f"==> b [choice 1] <==\n{plain}\n"), r.stdout


@need_model
@pytest.mark.skipif(not os.path.exists(SIFT_SIMT), reason="no SIMT build (clang++ missing)")
def test_device_path_applies_penalties(tmp_path, monkeypatch):
    """The emulated CUDA build: the device sampler declines penalised rows, the host draws them
    from the step's logits; the answers equal the CPU's on the fp32 reference weights (8 tokens).
    Two choices there copy the prefill's cache on the device: both equal the CPU's answer."""
    rows = [completion("pen", max_tokens=8, frequency_penalty=1.5, presence_penalty=0.5),
            completion("plain", max_tokens=8), completion("two", max_tokens=8, n=2)]
    cpu, _, _ = run_batch(tmp_path, rows, "--device", "cpu", "--weights", "f32", name="cpu")
    # weights as bf16 on the emulated device: its GGUF-block kernels are ~30x slower emulated, and
    # what this test checks is the sampler (test_gpu_simt.py runs the model's blocks)
    monkeypatch.setenv("SIFT_CUDA_WEIGHTS", "bf16")
    gpu, summ, _ = run_batch(tmp_path, rows, "--device", "cuda", name="gpu", binary=SIFT_SIMT)
    assert summ["device"] == "cuda", summ   # no fall back to the CPU
    assert content(cpu["pen"]) != content(cpu["plain"])   # the penalty acts here
    for cid, k in (("pen", 0), ("plain", 0), ("two", 0), ("two", 1)):
        assert content(gpu[cid], k) == content(cpu[cid], k) == content(cpu["plain"] if cid == "two" else cpu[cid]), \
            (cid, k, content(gpu[cid], k), content(cpu[cid], k))

"""Batch jobs that stay true across resumes and signals (issue: records that know their request,
unique custom_ids, exit codes that are the file's truth, OpenAI's defaults, Ctrl-C and SIGTERM,
output that never ends mid-character, the A/B table's differences). The references are other runs
of sift with the values spelled out, hand-made request files, and Python's own UTF-8 decoder."""
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

WORDS = "river stone cloud amber quiet lantern meadow copper violet harbor".split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_gguf.write(str(tmp_path_factory.mktemp("m") / "tiny.gguf"), ctx=4096)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A slower random model: a signal sent after the first records lands mid-run."""
    return tiny_gguf.write(str(tmp_path_factory.mktemp("s") / "small.gguf"), n_layer=4, d=256,
                           n_head=4, n_kv=2, ff=512, ctx=4096)


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def records(path):
    return [json.loads(l) for l in path.read_text().splitlines()]


def words(i, n=6):
    return " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(n + i))


def batch(cid, text, **body):
    body.setdefault("max_tokens", 6)
    body.setdefault("temperature", 0)
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": {"prompt": text, **body}}


def own(rid, text, **f):
    return {"id": rid, "prompt": text, "n_predict": 6, **f}


# ---- 1. resume refuses another strategy or other settings, in both shapes ----------------------

def test_resume_refuses_another_strategy_batch_shape(tiny, tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", [batch(f"job-{i:02d}", words(i)) for i in range(5)])
    out = tmp_path / "o.jsonl"
    base = ["-m", tiny, "--prompts", p, "--output", str(out), "-q"]
    assert sift(*base).returncode == 0
    before = out.read_bytes()
    r = sift(*base, "--resume", "--strategy", "fastkv")
    assert_error(r, "strategy 'full'", "'fastkv'", str(out))
    assert out.read_bytes() == before   # untouched: no record of fastkv among full's
    assert {x["sift"]["strategy"] for x in records(out)} == {"full"}


@pytest.mark.parametrize("shape", ["sift", "openai"])
def test_resume_refuses_other_settings(tiny, tmp_path, shape):
    rows = [batch(f"j{i}", words(i)) if shape == "openai" else own(f"j{i}", words(i)) for i in range(3)]
    p = write_jsonl(tmp_path / "r.jsonl", rows)
    out = tmp_path / "o.jsonl"
    base = ["-m", tiny, "--prompts", p, "--output", str(out), "-q", "--temp", "0", "--strategy", "fastkv"]
    assert sift(*base, "--kv-rate", "0.5").returncode == 0
    before = out.read_bytes()
    assert_error(sift(*base, "--kv-rate", "0.25", "--resume"), "other settings", str(out))
    assert out.read_bytes() == before
    assert sift(*base, "--kv-rate", "0.5", "--resume").returncode == 0   # the same settings: nothing to do
    assert out.read_bytes() == before


# ---- 2. a changed request reruns ---------------------------------------------------------------

@pytest.mark.parametrize("shape", ["sift", "openai"])
def test_changed_request_reruns(tiny, tmp_path, shape):
    def row(i, text, **kw):
        return batch(f"job-{i:02d}", text, **kw) if shape == "openai" else own(f"job-{i:02d}", text, **kw)

    rows = [row(i, words(i)) for i in range(4)]
    p, out = tmp_path / "r.jsonl", tmp_path / "o.jsonl"
    write_jsonl(p, rows)
    base = ["-m", tiny, "--prompts", str(p), "--output", str(out), "--temp", "0"]
    assert sift(*base, "-q").returncode == 0
    first = out.read_text().splitlines()
    # job-00's prompt edited, job-02's sampling changed; the same custom_ids
    rows[0] = row(0, "copper harbor violet meadow")
    rows[2] = row(2, words(2), **({"max_tokens": 3} if shape == "openai" else {"n_predict": 3}))
    write_jsonl(p, rows)
    r = sift(*base, "--resume")
    assert r.returncode == 0 and "2 records of requests that changed" in r.stderr, r.stderr
    assert "2 to run, 2 done before" in r.stderr
    now = out.read_text().splitlines()
    assert now[1] == first[1] and now[3] == first[3]   # the unchanged ones kept byte for byte
    fresh_p = tmp_path / "fresh.jsonl"
    write_jsonl(fresh_p, rows)
    fresh = tmp_path / "fresh.out"
    assert sift("-m", tiny, "--prompts", str(fresh_p), "--output", str(fresh), "--temp", "0", "-q").returncode == 0

    def answer(line):
        x = json.loads(line)
        return x["text"] if shape == "sift" else x["response"]["body"]["choices"][0]["text"]

    assert [answer(l) for l in now] == [answer(l) for l in fresh.read_text().splitlines()]
    assert answer(now[0]) != answer(first[0]) or json.loads(now[0]) != json.loads(first[0])


# ---- 3. duplicate custom_ids, reserved ids -------------------------------------------------------

def test_duplicate_custom_id_keeps_the_first_answer(tiny, tmp_path):
    rows = [batch(f"r{i}", words(i)) for i in range(6)]
    rows.append(batch("r1", "amber lantern"))   # line 7 reuses r1
    p = write_jsonl(tmp_path / "r.jsonl", rows)
    out = tmp_path / "o.jsonl"
    r = sift("-m", tiny, "--prompts", p, "--output", str(out), "-q")
    assert r.returncode == 1
    recs = records(out)
    cids, ids = [x["custom_id"] for x in recs], [x["id"] for x in recs]
    assert len(cids) == len(set(cids)) == 7 and len(ids) == len(set(ids)) == 7
    by = {x["custom_id"]: x for x in recs}
    assert by["r1"]["error"] is None and by["r1"]["response"]["status_code"] == 200
    e = by["line-7"]["error"]
    assert e["code"] == "invalid_request" and "'r1'" in e["message"] and "first at line 2" in e["message"]
    assert "Batch API refuses" in e["message"]


def test_reserved_ids_refused(tiny, tmp_path):
    # line 1 has no id (named line-1); line 2 claims "line-1": it would collide, so refused
    p = write_jsonl(tmp_path / "r.jsonl", ['{"prompt": ', own("line-1", "river stone"), own("ok", "amber")])
    r = sift("-m", tiny, "--prompts", p, "--json", "-q", "--temp", "0")
    recs = [json.loads(l) for l in r.stdout.splitlines()]
    assert [x["id"] for x in recs] == ["line-1", "line-2", "ok"]
    assert "reserved" in recs[1]["error"] and "text" in recs[2]


# ---- 4. exit code and summary are the file's truth --------------------------------------------

def test_resume_does_not_hide_failures(tiny, tmp_path):
    long = " ".join(WORDS * 30)   # beyond -c 64
    rows = [batch("ok0", "river"), batch("bad1", long), batch("bad2", long), batch("ok3", "amber"),
            batch("bad4", long), batch("bad5", long)]
    p = write_jsonl(tmp_path / "r.jsonl", rows)
    out, summ = tmp_path / "o.jsonl", tmp_path / "s.json"
    base = ["-m", tiny, "--prompts", p, "--output", str(out), "-c", "64", "-q", "--summary", str(summ)]
    assert sift(*base).returncode == 1
    assert json.loads(summ.read_text())["failed"] == 4
    r = sift(*base, "--resume")
    s = json.loads(summ.read_text())
    assert r.returncode == 1 and (s["failed"], s["failed_before"], s["done"]) == (4, 4, 0), (r.stderr, s)
    # fixed and retried: clean
    rows = [batch(x["custom_id"], "stone") if x["custom_id"].startswith("bad") else x for x in rows]
    write_jsonl(tmp_path / "r.jsonl", rows)
    r = sift(*base, "--resume", "--retry-failed")
    s = json.loads(summ.read_text())
    assert r.returncode == 0 and s["failed"] == 0, (r.stderr, s)
    assert all(x["error"] is None for x in records(out))


# ---- 5. OpenAI's defaults ------------------------------------------------------------------------

def test_batch_defaults_are_openai_s(tiny, tmp_path):
    # no max_tokens: up to the context (-c 96), not sift's -n 128 nor its default of 128
    text = "river stone cloud"
    p = write_jsonl(tmp_path / "r.jsonl", [{"custom_id": "a", "url": "/v1/completions",
                                           "body": {"prompt": text, "seed": 7}}])
    out = tmp_path / "o.jsonl"
    assert sift("-m", tiny, "--prompts", p, "--output", str(out), "-c", "96", "-q").returncode == 0
    body = records(out)[0]["response"]["body"]
    u = body["usage"]
    assert body["choices"][0]["finish_reason"] == "stop" or u["prompt_tokens"] + u["completion_tokens"] == 96
    # temperature 1, top_p 1, no top-k, no min-p: sift's own sampler with those values spelled out
    q = write_jsonl(tmp_path / "own.jsonl", [{"id": "a", "prompt": text, "seed": 7, "n_predict": 20}])
    ref = sift("-m", tiny, "--prompts", q, "--json", "-q", "--temp", "1", "--top-p", "1", "--top-k", "0",
               "--min-p", "0")
    p2 = write_jsonl(tmp_path / "r2.jsonl", [{"custom_id": "a", "url": "/v1/completions",
                                             "body": {"prompt": text, "seed": 7, "max_tokens": 20}}])
    out2 = tmp_path / "o2.jsonl"
    assert sift("-m", tiny, "--prompts", p2, "--output", str(out2), "-q").returncode == 0
    got = records(out2)[0]["response"]["body"]["choices"][0]["text"]
    assert got == json.loads(ref.stdout)["text"]


@pytest.mark.parametrize("field,value", [("temperature", 2.5), ("temperature", -0.1), ("top_p", 1.5),
                                         ("top_p", -0.5)])
def test_batch_ranges_as_openai(tiny, tmp_path, field, value):
    p = write_jsonl(tmp_path / "r.jsonl", [batch("a", "river", **{field: value})])
    out = tmp_path / "o.jsonl"
    assert sift("-m", tiny, "--prompts", p, "--output", str(out), "-q").returncode == 1
    e = records(out)[0]["error"]
    assert e["code"] == "invalid_request" and field in e["message"]


def test_temperature_two_accepted(tiny, tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", [batch("a", "river", temperature=2, top_p=0)])
    out = tmp_path / "o.jsonl"
    assert sift("-m", tiny, "--prompts", p, "--output", str(out), "-q").returncode == 0


# ---- 6. Ctrl-C and SIGTERM -------------------------------------------------------------------

def start(args, **kw):
    e = dict(os.environ)
    e.pop("SIFT_MODEL", None)
    return subprocess.Popen([SIFT, *args], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_one_signal_stops_a_generation(small, sig):
    # text mode: what was streamed stays, the run stops long before -n 3000
    proc = start(["-m", small, "-p", "river stone", "-n", "3000", "--temp", "0", "-c", "4096"])
    got = b""
    while len(got) < 20:
        got += os.read(proc.stdout.fileno(), 64)
    t0 = time.time()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig and time.time() - t0 < 20
    assert b"interrupted" in err and b"eval time" in err
    full = sift("-m", small, "-p", "river stone", "-n", "3000", "--temp", "0", "-c", "4096", "-q").stdout
    made = (got + out).decode().rstrip("\n")
    assert full.startswith(made) and len(made) < len(full.rstrip("\n"))


def test_one_signal_json_record(small):
    # --json streams nothing: the signal comes after a fixed wait, so the generation must outlast it
    # on a fast CPU too (-n 3000 took 1.4 s on a Zen 4; 30000 tokens at a growing context take far
    # longer than the wait)
    proc = start(["-m", small, "-p", "river stone", "-n", "30000", "-c", "32768", "--temp", "0", "--json"],
                 text=True)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    rec = json.loads(out)
    assert rec["finish_reason"] == "interrupted" and rec["stop"] == "interrupted"
    assert 0 < rec["timings"]["predicted_n"] < 30000 and rec["text"]


def test_slurm_time_limit_then_resume(small, tmp_path):
    # a scheduler's time limit: SIGTERM, then SIGKILL after a short grace; --resume completes
    rows = [own(f"r{i}", words(i), n_predict=40) for i in range(24)]
    p = write_jsonl(tmp_path / "r.jsonl", rows)
    out, whole = tmp_path / "o.jsonl", tmp_path / "whole.jsonl"
    base = ["-m", small, "--prompts", p, "--temp", "0", "-q", "--parallel", "4"]
    assert sift(*base, "--output", str(whole)).returncode == 0
    proc = start([*base, "--output", str(out)])
    t0 = time.time()
    while time.time() - t0 < 120 and (not out.exists() or out.read_text().count("\n") < 3):
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    proc.kill()
    proc.wait()
    r = sift(*base, "--output", str(out), "--resume")
    assert r.returncode == 0, r.stderr
    got = {x["id"]: x["text"] for x in records(out)}
    assert got == {x["id"]: x["text"] for x in records(whole)} and len(records(out)) == 24


def test_interrupted_batch_shape_reruns(small, tmp_path):
    rows = [batch(f"r{i}", words(i), max_tokens=60) for i in range(20)]
    p = write_jsonl(tmp_path / "r.jsonl", rows)
    out, whole = tmp_path / "o.jsonl", tmp_path / "whole.jsonl"
    base = ["-m", small, "--prompts", p, "-q", "--parallel", "3"]
    assert sift(*base, "--output", str(whole)).returncode == 0
    proc = start([*base, "--output", str(out)])
    t0 = time.time()
    while time.time() - t0 < 120 and (not out.exists() or out.read_text().count("\n") < 2):
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    cancelled = [x for x in records(out) if x["error"] and x["error"]["code"] == "batch_cancelled"]
    assert cancelled and all("--resume" in x["error"]["message"] for x in cancelled)
    assert sift(*base, "--output", str(out), "--resume").returncode == 0
    body = lambda x: x["response"]["body"]["choices"][0]["text"]   # noqa: E731
    assert [body(x) for x in records(out)] == [body(x) for x in records(whole)]


# ---- 8. output ---------------------------------------------------------------------------------

def test_repeats_json_has_medians(tiny):
    r = sift("-m", tiny, "-p", "river stone cloud amber", "--strategy", "full,speed", "--repeat", "3",
             "-n", "4", "--temp", "0", "--json", "-q")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(l) for l in r.stdout.splitlines()]
    assert [x["strategy"] for x in recs] == ["full", "speed"]
    for x in recs:
        reps = x["repetitions"]
        assert reps["runs"] == 3 and len(reps["prompt_ms"]) == 3 and len(reps["predicted_per_token_ms"]) == 3
        ms = sorted(reps["prompt_ms"])
        assert reps["prompt_ms_median"] == pytest.approx(ms[1], abs=1e-3)
        spread = 100 * (ms[2] - ms[0]) / ms[1]
        assert reps["prompt_ms_spread_pct"] == pytest.approx(spread, abs=0.05)   # from unrounded times
        assert x["timings"]["prompt_ms"] == pytest.approx(reps["prompt_ms"][0], abs=1e-3)


@need_model
def test_only_results_on_stdout():
    r = sift("-m", MODEL, "-p", "Hi", "--strategy", "full,speed", "-n", "3", "--temp", "0", "-t", "1")
    assert r.returncode == 0
    assert "machine:" not in r.stdout and "machine:" in r.stderr


@need_model
def test_stdout_never_ends_mid_character(tmp_path):
    # a reply in Chinese: the byte-level tokens split characters; each -n ends somewhere
    prompt = "Translate to Chinese, answer only in Chinese characters: good morning, my friend"
    cut = 0
    for n in range(2, 14):
        r = subprocess.run([SIFT, "-m", MODEL, "--chat", "-p", prompt, "-n", str(n), "--temp", "0", "-q",
                            "-t", "1"], capture_output=True, timeout=120)
        assert r.returncode == 0
        r.stdout.decode("utf-8")   # strict: raises on a character cut short
        j = subprocess.run([SIFT, "-m", MODEL, "--chat", "-p", prompt, "-n", str(n), "--temp", "0", "-q",
                            "-t", "1", "--json"], capture_output=True, timeout=120)
        rec = json.loads(j.stdout)
        assert "\ufffd" not in rec["text"]
        assert rec["text"] == r.stdout.decode().rstrip("\n")
        cut += len(rec["text"].encode()) > 0 and rec["timings"]["predicted_n"] > len(rec["text"])
    assert cut   # some -n fell inside a character (more tokens than characters)


@need_model
def test_ab_table_shows_where_answers_differ(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("The harbor town kept its lanterns lit all winter. " * 6 + "Describe the town in two sentences.")
    args = ["-m", MODEL, "-f", str(f), "--chat", "--strategy", "full,speed,fastkv", "-n", "40", "--temp", "0",
            "-q", "-t", "1", "--speed-depth", "20"]
    js = sift(*args, "--json")
    texts = {x["strategy"]: x["text"] for x in map(json.loads, js.stdout.splitlines())}
    table = sift(*args).stdout
    rows = {l.split("|")[1].strip().split(" ")[0]: l.split("|")[-2].strip() for l in table.splitlines()
            if l.startswith("| ") and "---" not in l and "strategy" not in l}
    for s in ("speed", "fastkv"):
        t, ft = texts[s], texts["full"]
        if t == ft:
            assert rows[s] == "= full"
            continue
        d = next(i for i in range(min(len(t), len(ft)) + 1) if i == len(t) or i == len(ft) or t[i] != ft[i])
        while d > 0 and t[d - 1] not in " \n":
            d -= 1
        word = len(t[:d].split()) + 1
        assert rows[s].startswith(f"word {word}:"), (rows[s], t, ft)
        shown = rows[s].split(">>", 1)[1].rstrip("<").rstrip(".")
        assert t[d:].replace("\n", " ").startswith(shown.replace("(ends; full goes on)", "")), (shown, t[d:])
    assert any(rows[s] != "= full" for s in ("speed", "fastkv")), texts   # the test saw a difference


def test_messages_are_accurate(tiny, tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", [own(f"r{i}", words(i)) for i in range(4)])
    out = tmp_path / "o.jsonl"
    r = sift("-m", tiny, "--prompts", p, "--temp", "0", "--shard", "1/2", "--output", str(out))
    assert r.returncode == 0 and "done before" not in r.stderr and "in this shard" in r.stderr
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines + [lines[0]]) + "\n")   # a second record of r2
    r = sift("-m", tiny, "--prompts", p, "--temp", "0", "--shard", "1/2", "--output", str(out), "--resume")
    assert r.returncode == 0 and "a second record of 'r2'" in r.stderr
    assert "the first one is kept" in r.stderr and "its request runs again" not in r.stderr

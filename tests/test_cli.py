"""The sift command line on bad input (one clear line on stderr, non-zero exit, no crash), batch
and JSON behaviour, and the end-to-end chat answer on the default model."""
import json
import os
import shutil
import struct
import subprocess
import sys

import gguf
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tiny_gguf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIFT = os.path.join(ROOT, "sift")
MODEL = os.path.join(ROOT, os.environ.get("SIFT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
need_model = pytest.mark.skipif(not os.path.exists(MODEL), reason="default model not fetched")


def sift(*args, stdin=None, env=None, sift_bin=SIFT):
    e = dict(os.environ)
    e.pop("SIFT_MODEL", None)
    e.update(env or {})
    return subprocess.run([sift_bin, *args], capture_output=True, text=True, input=stdin,
                          env=e, timeout=300)


def assert_error(r, *needles, code=None):
    """A clean failure: non-zero exit (not a signal), one error line naming the problem."""
    assert r.returncode > 0, f"exit {r.returncode}\n{r.stderr}"
    if code is not None:
        assert r.returncode == code
    errs = [l for l in r.stderr.splitlines() if "error" in l]
    assert len(errs) >= 1, r.stderr
    for n in needles:
        assert n.lower() in r.stderr.lower(), f"{n!r} not in {r.stderr!r}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_gguf.write(str(tmp_path_factory.mktemp("m") / "tiny.gguf"))


# ---- bad model files --------------------------------------------------------------------------

def test_missing_model(tmp_path):
    assert_error(sift("-m", str(tmp_path / "nope.gguf"), "-p", "hi"), "cannot open", "nope.gguf")


def test_model_is_directory(tmp_path):
    assert_error(sift("-m", str(tmp_path), "-p", "hi"), str(tmp_path))


def test_wrong_magic(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + b"\0" * 100)
    assert_error(sift("-m", str(p), "-p", "hi"), "magic")


def test_truncated_model(tmp_path, tiny):
    data = open(tiny, "rb").read()
    for cut in (10, 200, len(data) // 2, len(data) - 7):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        r = sift("-m", str(p), "-p", "hi")
        assert_error(r)
        assert "truncated" in r.stderr or "outside the file" in r.stderr, r.stderr


def test_tensor_offset_outside_file(tmp_path, tiny):
    r = gguf.GGUFReader(tiny)
    t = [t for t in r.tensors if t.name == "blk.1.ffn_down.weight"][0]
    pos = int(t.field.offset + sum(p.nbytes for p in t.field.parts[:-1]))
    data = bytearray(open(tiny, "rb").read())
    assert struct.unpack_from("<Q", data, pos)[0] == int(t.field.parts[-1][0])
    struct.pack_into("<Q", data, pos, 1 << 40)
    p = tmp_path / "off.gguf"
    p.write_bytes(bytes(data))
    assert_error(sift("-m", str(p), "-p", "hi"), "blk.1.ffn_down.weight", "outside the file")


def test_absurd_dimensions(tmp_path):
    p = tiny_gguf.write(str(tmp_path / "huge.gguf"), meta={"block_count": 1 << 30})
    assert_error(sift("-m", p, "-p", "hi"), "block_count")
    p = tiny_gguf.write(str(tmp_path / "heads.gguf"), meta={"attention.head_count": 0})
    assert_error(sift("-m", p, "-p", "hi"), "head_count")


def test_unsupported_architecture(tmp_path):
    p = str(tmp_path / "arch.gguf")
    tiny_gguf.write(p)
    data = open(p, "rb").read().replace(b"llama", b"gpt2x")
    open(p, "wb").write(data)
    assert_error(sift("-m", p, "-p", "hi"), "architecture", "gpt2x")


def test_unsupported_tensor_type(tmp_path):
    p = tiny_gguf.write(str(tmp_path / "q2k.gguf"), d=256, n_head=4, n_kv=2, ff=256,
                        dtype=gguf.GGMLQuantizationType.Q2_K)
    assert_error(sift("-m", p, "-p", "hi"), "Q2_K")


def test_missing_tensor(tmp_path):
    p = tiny_gguf.write(str(tmp_path / "miss.gguf"), drop="blk.1.attn_v.weight")
    assert_error(sift("-m", p, "-p", "hi"), "missing tensor", "blk.1.attn_v.weight")


def test_unknown_pretokenizer(tmp_path):
    p = tiny_gguf.write(str(tmp_path / "pre.gguf"), pre="mystery")
    assert_error(sift("-m", p, "-p", "hi"), "mystery")


def test_default_model_missing(tmp_path):
    lone = tmp_path / "sift"
    shutil.copy(SIFT, lone)
    assert_error(sift("-p", "hi", sift_bin=str(lone)), "make model")


def test_fetch_without_network(tmp_path):
    env = dict(os.environ, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="0",
               PIP_TIMEOUT="2", PIP_NO_CACHE_DIR="1")
    r = subprocess.run(["bash", os.path.join(ROOT, "weights/fetch_default.sh"),
                        str(tmp_path / "m.gguf")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode != 0
    assert "could not download" in r.stderr
    assert not (tmp_path / "m.gguf").exists()


# ---- bad prompts and flags ----------------------------------------------------------------------

def test_missing_prompt_file(tiny, tmp_path):
    assert_error(sift("-m", tiny, "-f", str(tmp_path / "none.txt")), "none.txt")


def test_empty_prompt_file(tiny, tmp_path):
    p = tmp_path / "empty.txt"
    p.write_text("")
    assert_error(sift("-m", tiny, "-f", str(p)), "empty")


def test_huge_prompt_file_refused_with_its_size(tiny, tmp_path):
    p = tmp_path / "huge.txt"
    with open(p, "wb") as f:
        f.truncate(300 << 20)   # sparse: no disk used
    assert_error(sift("-m", tiny, "-f", str(p)), "huge.txt", str(300 << 20), "refused")


def test_invalid_utf8_names_offset(tiny, tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"hello \xc3\x28 world")
    assert_error(sift("-m", tiny, "-f", str(p)), "UTF-8", "offset 6")


def test_prompt_over_context(tiny):
    r = sift("-m", tiny, "-p", "x" * 100, "-n", "200", "-c", "256")
    assert_error(r, "100 tokens", "200", "256")


@pytest.mark.parametrize("args,needle", [
    (["--bogus"], "unknown flag"),
    (["-p", "hi", "--strategy", "nosuch"], "unknown strategy"),
    (["-p", "hi", "-f", "x.txt"], "cannot be combined"),
    (["-p", "hi", "-n", "abc"], "invalid integer"),
    (["-p", "hi", "--temp", "-1"], "out of range"),
    (["-p", "hi", "--top-p", "1.5"], "out of range"),
    (["-p", "hi", "--device", "tpu"], "unknown device"),
    (["-p"], "needs a value"),
    ([], "no prompt"),
])
def test_usage_errors(tiny, args, needle):
    assert_error(sift("-m", tiny, *args), needle, code=2)


@pytest.mark.parametrize("data,needle", [
    (b"\0\x01\x02binary", "is binary, not text (a NUL byte at offset 0)"),
    (b"text, then\0", "is binary, not text (a NUL byte at offset 10)"),
    (b"caf\xc3", "is not valid UTF-8 (byte offset 3, 0xc3)"),
    (b"", "is empty"),
])
def test_prompt_file_named_for_what_it_is(tiny, tmp_path, data, needle):
    """A binary file is not reported as empty (it used to be: the text ended at its first NUL);
    the same check guards `sift ppl -f`."""
    f = tmp_path / "p.txt"
    f.write_bytes(data)
    assert_error(sift("-m", tiny, "-f", str(f), "-n", "2"), needle, code=1)
    if data:
        assert_error(sift("ppl", "-m", tiny, "-f", str(f)), needle, code=1)


def test_help_and_version():
    r = sift("--help")
    assert r.returncode == 0 and "--strategy" in r.stdout and "examples" in r.stdout
    r = sift("--version")
    assert r.returncode == 0 and r.stdout.startswith("sift ")


# ---- batch and JSON -----------------------------------------------------------------------------

def test_batch_one_bad_file(tiny, tmp_path):
    d = tmp_path / "batch"
    d.mkdir()
    (d / "a.txt").write_text("the cat")
    (d / "b.txt").write_bytes(b"\xff\xfe")
    (d / "c.txt").write_text("the dog")
    (d / "skip.md").write_text("not a prompt")
    r = sift("-m", tiny, "--batch", str(d), "--json", "-q", "-n", "4", "--temp", "0",
             "--summary", str(tmp_path / "summary.json"))
    assert r.returncode == 1
    lines = [json.loads(l) for l in r.stdout.splitlines()]   # records only: the summary has its file
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["prompts"] == 3 and summary["failed"] == 1
    assert [os.path.basename(l["file"]) for l in lines] == ["a.txt", "b.txt", "c.txt"]
    assert [l["index"] for l in lines] == [0, 1, 2]
    assert "error" in lines[1] and "UTF-8" in lines[1]["error"]
    for l in (lines[0], lines[2]):
        t = l["timings"]
        assert t["prompt_n"] > 0 and 1 <= t["predicted_n"] <= 4
        assert l["strategy"] == "full" and l["device"] == "cpu" and l["kv_bytes"] > 0
        assert set(t) >= {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n",
                          "predicted_ms", "predicted_per_second"}


def test_stdin_and_seed_reproducible(tiny):
    a = sift("-m", tiny, "-f", "-", "--json", "-q", "-n", "8", "--seed", "7", stdin="the cat")
    b = sift("-m", tiny, "-f", "-", "--json", "-q", "-n", "8", "--seed", "7", stdin="the cat")
    assert a.returncode == 0, a.stderr
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert ja["text"] == jb["text"] and ja["seed"] == 7


def test_kv_bytes_measured(tiny):
    # tiny: 2 layers, 2 KV heads, head dim 16, fp32; capacity = prompt + n_predict
    r = sift("-m", tiny, "-p", "the cat", "--json", "-q", "-n", "5", "--temp", "0")
    j = json.loads(r.stdout)
    cap = j["timings"]["prompt_n"] + 5
    assert j["kv_bytes"] == 2 * 2 * 2 * 16 * cap * 4


def test_timing_block(tiny):
    r = sift("-m", tiny, "-p", "the cat", "-n", "4", "--temp", "0")
    assert r.returncode == 0, r.stderr
    for k in ("load time", "prompt eval time", "eval time", "total time", "KV cache",
              "strategy full", "device cpu", "tokens per second"):
        assert k in r.stderr, k


# ---- end to end on the default model ------------------------------------------------------------

@need_model
def test_chat_answer_paris():
    r = sift("-m", MODEL, "-p", "What is the capital of France?", "--chat", "-n", "32",
             "--temp", "0", "-q")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout


# ---- resource limits --------------------------------------------------------------------------

def mem_available_gib():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


@need_model
def test_kv_beyond_memory_fails_up_front():
    # The memory plan at -c 4194304, by hand for SmolLM2-135M (30 layers, d 576, 9 heads and 3 KV
    # heads of 64, d_ff 1536, vocab 49152), fp32: per token the K and V of every layer
    # (30 * 3 * 2 * 64 * 4 bytes) and the prefill activations of one row (residual, normed row,
    # Q, K, V, attention output, gate, up: 576 + 576 + 576 + 2*192 + 576 + 2*1536 floats), plus
    # one row of logits.
    ctx = 4194304
    per_tok = 30 * 3 * 2 * 64 * 4 + (576 * 4 + 2 * 192 + 2 * 1536) * 4
    rest = (ctx * per_tok + 49152 * 4) / 2**30
    if mem_available_gib() > rest * 0.8:
        pytest.skip("this machine could hold the cache")
    r = sift("-m", MODEL, "-p", "hi", "-c", str(ctx), "-n", "-1", "-q")
    assert_error(r, f"-c {ctx}: {rest:.2f} GiB", "GiB is available", "would fit", code=1)
    fit = int(r.stderr.rsplit("-c ", 1)[1].split()[0])      # "...; -c N would fit"
    assert 0 < fit < ctx and fit * per_tok / 2**30 <= mem_available_gib() * 1.05


# ---- usage errors of every subcommand (exit 2, one line, before any model is loaded) ----------

@pytest.mark.parametrize("args, needle", [
    (["-p", "x", "--pool-kernel", "4"], "must be odd"),
    (["-p", "x", "--spec-pool", "2"], "must be odd"),
    (["-p", "x", "--swiftkv-norm", "mine"], "--swiftkv-norm must be own or shared"),
    (["-p", "x", "stray"], "unexpected argument 'stray'"),
    (["--device", "tpu", "-p", "x"], "unknown device 'tpu'"),
    (["bench", "--ctx", "1,,2"], "empty or overlong entry"),
    (["bench", "-o", "yaml"], "-o must be md, json, jsonl or csv"),
    (["bench", "--device", "tpu"], "unknown device 'tpu'"),
    (["eval", "stray"], "eval: unexpected argument 'stray'"),
    (["eval", "--tasks", "niah,niah"], "task 'niah' given twice"),
    (["eval", "--tasks", "nope"], "unknown task 'nope'"),
    (["eval", "--ctx", "0"], "--ctx 0 is out of range"),
    (["eval", "--plot", "r.png"], "only SVG is written"),
    (["eval", "--device", "tpu"], "unknown device 'tpu'"),
    (["ppl"], "no text: give -f FILE"),
    (["ppl", "-f", "a.txt", "stray"], "ppl: unexpected argument 'stray'"),
    (["fit-phi", "--data", "a.txt"], "fit-phi needs --data TEXT and --out FILE.phi"),
    (["fit-phi", "--out"], "fit-phi: --out needs a value"),
    (["fit-phi", "--bogus", "1"], "fit-phi: unknown flag '--bogus'"),
])
def test_usage_errors(args, needle):
    r = sift(*args)
    assert_error(r, needle, code=2)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def model_kv_shape(path):
    """(layers, KV heads, head dim) from the GGUF metadata, read by the gguf package."""
    r = gguf.GGUFReader(path)
    f = {k: r.fields[k].parts[r.fields[k].data[0]][0] for k in
         ("llama.block_count", "llama.attention.head_count_kv", "llama.attention.head_count",
          "llama.embedding_length")}
    return (int(f["llama.block_count"]), int(f["llama.attention.head_count_kv"]),
            int(f["llama.embedding_length"]) // int(f["llama.attention.head_count"]))


@need_model
def test_kv_read_per_step_by_hand(tmp_path):
    """kv_read_per_step against hand counts: full reads every cached entry (the prompt, the
    decoded tokens and the step's own) of every layer; topk --topk 0 reads sink + tail + the
    decode tokens, where the prompt's last token is its first query (a step of its own)."""
    L, kvh, hd = model_kv_shape(MODEL)
    entry = 2 * hd * 4 * kvh * L          # K and V, fp32 on the CPU, every KV head and layer
    p = tmp_path / "p.txt"
    p.write_text("The quick brown fox jumps over the lazy dog. " * 12)
    r = sift("-m", MODEL, "-f", str(p), "-n", "6", "--temp", "0", "--strategy", "full,topk",
             "--topk", "0", "--sink", "3", "--tail", "5", "--json", "-q")
    assert r.returncode == 0, r.stderr
    full, topk = [json.loads(l) for l in r.stdout.splitlines()]
    n, d = full["timings"]["prompt_n"], 5            # 6 tokens: the first from prefill, 5 steps
    assert full["timings"]["predicted_n"] == 6 and topk["timings"]["predicted_n"] == 6
    # full: step t (0-based) reads n + t + 1 entries
    assert full["kv_read_per_step"] == pytest.approx(entry * (n + 1 + (d - 1) / 2), rel=1e-9)
    # topk: steps j = 0 (the last prompt token) .. d read 3 + 5 + (j + 1) entries each
    assert topk["kv_read_per_step"] == pytest.approx(entry * (3 + 5 + 1 + d / 2), rel=1e-9)
    assert full["label"] is None and full["draft_rows"] == 0

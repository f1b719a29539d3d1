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
    (["-p", "hi", "--device", "tpu"], "--device must be one of auto, cpu, cuda"),
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


@pytest.mark.parametrize("flags, elem", [([], 2), (["-ctk", "auto", "-ctv", "auto"], 2),
                                         (["-ctk", "f32", "-ctv", "f32"], 4),
                                         (["-ctk", "bf16", "-ctv", "f32"], (2 + 4) / 2)])
def test_kv_bytes_measured(tiny, flags, elem):
    # tiny: 2 layers, 2 KV heads, head dim 16; capacity = prompt + n_predict; K and V of elem
    # bytes (the CPU's default cache is f16: 2; f32 asked for: 4; bf16 K and f32 V: 2 and 4)
    r = sift("-m", tiny, "-p", "the cat", "--json", "-q", "-n", "5", "--temp", "0", *flags)
    j = json.loads(r.stdout)
    cap = j["timings"]["prompt_n"] + 5
    assert j["kv_bytes"] == 2 * 2 * 2 * 16 * cap * elem


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
@pytest.mark.parametrize("flags, kv_elem", [([], 2), (["-ctk", "f32", "-ctv", "f32"], 4)])
def test_kv_beyond_memory_fails_up_front(flags, kv_elem):
    # The memory plan at -c 4194304, by hand for SmolLM2-135M (30 layers, d 576, 9 heads and 3 KV
    # heads of 64, d_ff 1536, vocab 49152): per token the K and V of every layer
    # (30 * 3 * 2 * 64 * kv_elem bytes: the default f16 cache 2, f32 4) and the fp32 prefill
    # activations of one row (residual, normed row, Q, K, V, attention output, gate, up:
    # 576 + 576 + 576 + 2*192 + 576 + 2*1536 floats), plus one row of logits.
    ctx = 4194304
    per_tok = 30 * 3 * 2 * 64 * kv_elem + (576 * 4 + 2 * 192 + 2 * 1536) * 4
    rest = (ctx * per_tok + 49152 * 4) / 2**30
    if mem_available_gib() > rest * 0.8:
        pytest.skip("this machine could hold the cache")
    # in one pass (--ubatch 0): the activations of all ctx rows
    r = sift("-m", MODEL, "-p", "hi", "-c", str(ctx), "-n", "-1", "-q", "--ubatch", "0", *flags)
    assert_error(r, f"-c {ctx}: {rest:.2f} GiB", "GiB is available", "would fit", code=1)
    fit = int(r.stderr.rsplit("-c ", 1)[1].split()[0])      # "...; -c N would fit"
    assert 0 < fit < ctx and fit * per_tok / 2**30 <= mem_available_gib() * 1.05
    # in chunks of the default 2048 rows (tests/test_chunk.py): the KV of ctx tokens and the
    # activations of 2048 rows; a -c that fits is then bounded by the KV alone
    kv_tok, act = 30 * 3 * 2 * 64 * kv_elem, (576 * 4 + 2 * 192 + 2 * 1536) * 4
    rest = (ctx * kv_tok + 2048 * act + 49152 * 4) / 2**30
    r = sift("-m", MODEL, "-p", "hi", "-c", str(ctx), "-n", "-1", "-q", *flags)
    assert_error(r, f"activations (2048 rows) for -c {ctx}: {rest:.2f} GiB", "would fit", code=1)
    fit = int(r.stderr.rsplit("-c ", 1)[1].split()[0])
    assert 0 < fit < ctx and fit * kv_tok / 2**30 <= mem_available_gib() * 1.05


# ---- usage errors of every subcommand (exit 2, one line, before any model is loaded) ----------

@pytest.mark.parametrize("args, needle", [
    (["-p", "x", "--pool-kernel", "4"], "must be odd"),
    (["-p", "x", "--spec-pool", "2"], "must be odd"),
    (["-p", "x", "--swiftkv-norm", "mine"], "--swiftkv-norm must be own or shared"),
    (["-p", "x", "stray"], "unexpected argument 'stray'"),
    (["--device", "tpu", "-p", "x"], "--device must be one of auto, cpu, cuda (got 'tpu')"),
    (["bench", "-p", "1,,2"], "empty or overlong entry"),
    (["bench", "--format", "yaml"], "--format must be one of md, json, jsonl, csv"),
    (["bench", "--device", "tpu"], "--device must be one of auto, cpu, cuda (got 'tpu')"),
    (["eval", "stray"], "unexpected argument 'stray' (see sift eval --help)"),
    (["eval", "--tasks", "niah,niah"], "task 'niah' given twice"),
    (["eval", "--tasks", "nope"], "unknown task 'nope'"),
    (["eval", "--n-prompt", "0"], "--n-prompt 0 is out of range"),
    (["eval", "--plot", "r.png"], "only SVG is written"),
    (["eval", "--device", "tpu"], "--device must be one of auto, cpu, cuda (got 'tpu')"),
    (["ppl"], "no text: give -f FILE"),
    (["ppl", "-f", "a.txt", "stray"], "unexpected argument 'stray' (see sift ppl --help)"),
    (["fit-phi", "--data", "a.txt"], "fit-phi needs --data TEXT and -o FILE.phi"),
    (["fit-phi", "-o"], "-o needs a value (see sift fit-phi --help)"),
    (["fit-phi", "--bogus", "1"], "unknown flag '--bogus' (see sift fit-phi --help)"),
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
@pytest.mark.parametrize("flags, elem", [([], 2), (["-ctk", "f32", "-ctv", "f32"], 4)])
def test_kv_read_per_step_by_hand(tmp_path, flags, elem):
    """kv_read_per_step against hand counts: full reads every cached entry (the prompt, the
    decoded tokens and the step's own) of every layer; topk --topk 0 reads sink + tail + the
    decode tokens, where the prompt's last token is its first query (a step of its own)."""
    L, kvh, hd = model_kv_shape(MODEL)
    entry = 2 * hd * elem * kvh * L       # K and V (the CPU's default f16, or f32), every head and layer
    p = tmp_path / "p.txt"
    p.write_text("The quick brown fox jumps over the lazy dog. " * 12)
    r = sift("-m", MODEL, "-f", str(p), "-n", "6", "--temp", "0", "--strategy", "full,topk",
             "--topk", "0", "--sink", "3", "--tail", "5", "--json", "-q", *flags)
    assert r.returncode == 0, r.stderr
    full, topk = [json.loads(l) for l in r.stdout.splitlines()]
    n, d = full["timings"]["prompt_n"], 5            # 6 tokens: the first from prefill, 5 steps
    assert full["timings"]["predicted_n"] == 6 and topk["timings"]["predicted_n"] == 6
    # full: step t (0-based) reads n + t + 1 entries
    assert full["kv_read_per_step"] == pytest.approx(entry * (n + 1 + (d - 1) / 2), rel=1e-9)
    # topk: steps j = 0 (the last prompt token) .. d read 3 + 5 + (j + 1) entries each
    assert topk["kv_read_per_step"] == pytest.approx(entry * (3 + 5 + 1 + d / 2), rel=1e-9)
    assert full["label"] is None and full["draft_rows"] == 0


# ---- messages: counts, the model's name, threads, paths, settings (issue 36) ------------------

def stderr_lines(r, needle):
    return [l for l in r.stderr.splitlines() if needle in l]


def test_counts_agree_in_number(tiny):
    """The tiny model's tokenizer is one token per byte (tiny_gguf): "a" is 1 prompt token, "ab" 2.
    llama.cpp's timing lines keep its own shape ("/ 1 tokens"): scripts read them."""
    one = sift("-m", tiny, "-p", "a", "-n", "1", "-t", "1", "--temp", "0", "--parallel", "2")
    assert one.returncode == 0, one.stderr
    assert stderr_lines(one, "sift: 1 prompt (0 failed)")[0].count("prefill 1 token at") == 1, one.stderr
    one = sift("-m", tiny, "-p", "a", "-n", "1", "-t", "1", "--temp", "0")
    assert stderr_lines(one, "prompt token") == [f"sift: prompt: 1 prompt token, up to 1 new "
                                                 f"(seed {json_seed(one)})"], one.stderr
    assert "sift: strategy full, device cpu (1 thread), KV cache" in one.stderr
    assert "sift: loaded tiny (llama, 2 layers," in one.stderr
    assert "prompt eval time =" in one.stderr and "/     1 tokens (" in one.stderr
    two = sift("-m", tiny, "-p", "ab", "-n", "1", "-t", "2", "--temp", "0")
    assert "2 prompt tokens, up to 1 new" in two.stderr and "(2 threads)" in two.stderr
    one_layer = tiny_gguf.write(str(os.path.dirname(tiny) + "/one.gguf"), n_layer=1)
    r = sift("-m", one_layer, "-p", "ab", "-n", "1", "-t", "1")
    assert "sift: loaded one (llama, 1 layer," in r.stderr, r.stderr


def json_seed(r):
    return r.stderr.split("(seed ")[1].split(")")[0]


@need_model
def test_model_named_by_its_file_with_the_gguf_name_beside():
    name = gguf.GGUFReader(MODEL).fields["general.name"]
    inside = bytes(name.parts[name.data[0]]).decode()
    assert inside != "SmolLM2-135M-Instruct.Q4_1"
    r = sift("-m", MODEL, "-p", "hi", "-n", "1", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert f'sift: loaded SmolLM2-135M-Instruct.Q4_1 (named "{inside}" inside; llama, 30 layers,' \
        in r.stderr, r.stderr


def test_threads_above_the_cpus_warn_once(tiny):
    cpus = len(os.sched_getaffinity(0))
    r = sift("-m", tiny, "-p", "ab", "-n", "2", "-t", str(cpus + 1), "--strategy", "full,speed")
    assert r.returncode == 0, r.stderr
    s = "" if cpus == 1 else "s"
    assert stderr_lines(r, "warning") == [
        f"sift: warning: -t {cpus + 1} is more threads than the {cpus} CPU{s} this process may use; "
        "the threads beyond them share CPUs (slower, not faster)"], r.stderr
    r = sift("-m", tiny, "-p", "ab", "-n", "2", "-t", str(cpus))
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_prompt_file_is_a_directory_or_missing(tiny, tmp_path):
    r = sift("-m", tiny, "-f", str(tmp_path), "-n", "2")
    assert_error(r, f"-f '{tmp_path}' is a directory, not a file", code=2)
    assert "read error" not in r.stderr
    r = sift("-m", tiny, "-f", str(tmp_path / "none.txt"), "-n", "2")
    assert_error(r, f"cannot read -f '{tmp_path / 'none.txt'}': No such file or directory", code=2)


@pytest.mark.parametrize("flag", ["--kept-map", "--summary", "--output", "--errors"])
def test_output_into_a_missing_directory_fails_up_front(tiny, tmp_path, flag):
    """Before the model is loaded (no "loaded" line), one line naming the directory."""
    path = tmp_path / "no" / "x.out"
    extra = ["--output", str(tmp_path / "r.jsonl")] if flag == "--errors" else []
    r = sift("-m", tiny, "-p", "ab", "-n", "2", flag, str(path), *extra)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"sift: error: cannot write {flag} '{path}': directory "
                                f"'{tmp_path / 'no'}': No such file or directory"), r.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_failed_eval_prints_no_tables(tiny):
    """niah needs ~300 prompt tokens before its filler; --n-prompt 64 cannot hold them: the error, and
    nothing on stdout after it."""
    r = sift("eval", "-m", tiny, "--n-prompt", "64", "--samples", "1", "-t", "1")
    assert_error(r, "eval: niah needs", "more than --n-prompt 64 leaves", code=2)   # a usage error
    assert r.stdout == ""


def test_settings_echo_shows_what_ran(tmp_path):
    """A 6-layer model, every default: fastkv's TSP layer L/2-1 = 2, speed's depth ceil(0.875 L) =
    6, specprefill's self-draft ceil(L/2) = 3 layers, swiftkv's l = L/2 = 3 and G = 1; choices by
    name; topk's K decided per prompt from --budget (null)."""
    m = tiny_gguf.write(str(tmp_path / "six.gguf"), n_layer=6)
    r = sift("-m", m, "-p", "the cat sat on the mat " * 4, "-n", "2", "-t", "1", "--temp", "0",
             "--strategy", "fastkv,speed,specprefill,topk,swiftkv", "--json", "-q")
    assert r.returncode == 0, r.stderr
    got = {j["strategy"]: j["settings"] for j in map(json.loads, r.stdout.splitlines())}
    assert got == {
        "fastkv": {"tsp_layer": 2, "tsp_rate": 0.2, "kv_rate": pytest.approx(0.1), "window": 8,
                   "pool_kernel": 7, "pool": "max", "kv_len": 0, "tsp_len": 0},
        "speed": {"speed_depth": 6, "anchor": "bos"},
        "specprefill": {"keep": pytest.approx(0.3), "lookahead": 8, "chunk": 32, "spec_pool": 13,
                        "draft": None, "draft_layers": 3, "keep_last": "on"},
        "topk": {"sink": 4, "tail": 16, "topk": None, "budget": pytest.approx(0.02),
                 "selector": "exact", "page_size": 16, "pages": None, "selector_recall": "off"},
        "swiftkv": {"swiftkv_layers": 3, "swiftkv_group": 1, "swiftkv_norm": "shared"}}
    # the same in the text echo of the timing block; given values stand as given
    r = sift("-m", m, "-p", "the cat sat on the mat " * 4, "-n", "2", "-t", "1", "--temp", "0",
             "--strategy", "full,fastkv,topk", "--tsp-layer", "4", "--pool", "avg", "--topk", "5")
    assert r.returncode == 0, r.stderr
    assert stderr_lines(r, "settings:") == [
        "sift: fastkv settings: tsp_layer 4, tsp_rate 0.2, kv_rate 0.1, window 8, pool_kernel 7, "
        "pool avg, kv_len 0, tsp_len 0",
        "sift: topk settings: sink 4, tail 16, topk 5, budget 0.02, selector exact, page_size 16, "
        "pages unset (max(2048, 8 K) keys' worth), selector_recall off"], r.stderr

"""tests/test_gpu_simt.py — the CUDA backend end to end on a machine without a GPU, through the
SIMT emulation build (simt/: the same .cu sources compiled for the CPU, every CUDA thread a
fiber, device memory bounds-checked, shared memory race-checked), against the CPU backend in the
same test:

* build/tests/gpu_check-simt --small --only SECTION, one test per section (ops, attention, topk,
  phi, decode, models) so that a failure names its section: exit 0, "N passed, 0 failed", no FAIL row,
  and the rows the section exists for are there — every attention kernel (fa2w, fa2, wg, flash,
  group, split); for every strategy of the registry and gpu_check's compositions, on both tiny
  models, its logits row and the kept-positions, decode-step-logits and greedy-prefix rows.
  `--small` scales the shapes to CI (docs/tests.md) and leaves the GGUF model to the sift-simt
  tests below; a "skip:" row is gpu_check's own verdict (kept sets that differ on a near-tie make
  logits incomparable).
* build/sift-simt --device cuda answers `make run`'s prompt with the CPU backend's text, and a
  prompt prefilled in chunks (--ubatch 17) with one pass's.
* one batch per backend (--prompts, --parallel 4): every strategy of the registry on one prompt
  (settings under which each of them processes fewer rows, keeps a smaller cache or reads less of
  it than full, checked), and four different short prompts, each record's text equal to the CPU
  backend's.
* sift-simt fit-phi --device cuda (its logging prefill and held-out check, whose topk decode steps
  rewind the cache on the host) on a tiny GGUF: the CPU's quality table, to about bf16's precision.

The CPU side runs --weights f32, the reference: the CUDA backend dequantises the same file to
fp32 and rounds to bf16, where native CPU weights would add their own 8-bit activation products.
Greedy texts must be equal, except where the first token at which they part is a near-tie at the
CUDA backend's output precision: in an independent CPU run (build/tests/tool_logits, every step's
logits), the logit of the CPU's token minus that of the GPU's is below two bf16 steps at that
logit's magnitude (the CUDA backend returns bf16 logits: each of the two is rounded by up to half
a step, and gpu_check measured the per-logit bf16 noise of the 30 layers at about one step);
the texts then agree up to that token by construction. Each divergence is printed (pytest -s). The emulator is slow (every
CUDA thread a fiber): one sift-simt process per test, short generations."""
import json
import math
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_CHECK = os.path.join(ROOT, "build", "tests", "gpu_check-simt")
SIFT_SIMT = os.path.join(ROOT, "build", "sift-simt")
SIFT = os.path.join(ROOT, "sift")
MODEL = os.path.join(ROOT, os.environ.get("SIFT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))

needs_check = pytest.mark.skipif(not os.path.exists(GPU_CHECK), reason="no SIMT build (clang++ missing)")
needs_sift = pytest.mark.skipif(not os.path.exists(SIFT_SIMT) or not os.path.exists(SIFT),
                                reason="no SIMT build (clang++ missing) or no ./sift")
needs_model = pytest.mark.skipif(not os.path.exists(MODEL), reason=f"{MODEL} absent (make model)")

SECTIONS = ["ops", "attention", "topk", "phi", "decode", "models"]
COMPOSED = ["fastkv+topk", "specprefill+topk+phi", "speed+topk"]   # gpu_check's test_model_pair
DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence."   # the Makefile's `make run`


def registry():
    """The strategy registry, as sift names it when refusing an unknown one."""
    p = subprocess.run([SIFT, "--strategy", "no-such-strategy", "-p", "x"], capture_output=True,
                       text=True, timeout=30)
    m = re.search(r"available: (.*?), or all", p.stderr)
    assert p.returncode == 2 and m, p.stderr
    return m.group(1).split(", ")


def rows(out):
    """(check, shape, result) of each table row (as tests/test_gpu_harness.py reads them)."""
    got = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 7 and cells[0] != "check":
            got.append((cells[0], cells[1], cells[6]))
    return got


def strategy_rows(table):
    """{(strategy, model label): [check, ...]}: a strategy's "NAME logits" row (or its "NAME"
    skip row) opens its group, the indented rows after it belong to it."""
    groups, key = {}, None
    for check, shape, result in table:
        label = shape.split(",")[0]
        if check.endswith(" logits") and check != "decode step logits":
            key = (check[: -len(" logits")], label)
        elif result.startswith("skip") and "," in shape and check not in (
                "kept positions agree", "greedy same prefix", "decode step logits"):
            key = (check, label)   # refused by strategy_check on the CPU: no rows follow
            groups[key] = ["refused: " + result]
            continue
        elif key is None or key[1] != label:
            continue
        groups.setdefault(key, []).append(check)
    return groups


@needs_check
@pytest.mark.parametrize("section", SECTIONS)
def test_gpu_check_section(section):
    args = [GPU_CHECK, "--small", "--only", section]
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "SIMT emulator" in p.stdout.splitlines()[0], p.stdout[:300]   # the emulated backend ran
    m = re.search(r"gpu_check: (\d+) passed, 0 failed", p.stdout)
    assert m and int(m.group(1)) > 0, p.stdout[-2000:]
    table = rows(p.stdout)
    assert table
    bad = [r for r in table if r[2] != "ok" and not r[2].startswith("skip")]
    assert not bad, bad
    checks = {c for c, _, _ in table}
    if section == "ops":
        for c in ("embed", "rmsnorm", "matmul", "rope", "swiglu", "add", "gather_rows", "weight_synth"):
            assert c in checks, c
        for t in ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"):
            assert {f"weight {t}: embed", f"weight {t}: matmul"} <= checks, t
    elif section == "attention":
        for k in ("fa2", "fa2w", "wg", "flash", "group", "split"):
            assert f"attention [{k}]" in checks, k
        for c in ("kv_append K", "kv_append V", "kv_append+kv_keep K", "attn_probs"):
            assert c in checks, c
        trap = {c for c, s, _ in table if c.startswith("attention [") and "trap" in s}
        assert len(trap) == 6, trap   # every kernel has a case with keys it must not see
    elif section == "topk":
        assert sum(c == "attn_topk (share agreeing)" for c, _, _ in table) >= 4
    elif section == "phi":
        for c in ("phi_summarize m,u,T", "attn_select", "attn_select + phi"):
            assert sum(ch == c for ch, _, _ in table) >= 4, c
    elif section == "decode":   # both tiny models: the group (head dim 64) and split (32) kernels
        for c in ("decode graph == eager", "decode batched ~ alone", "decode graph ~ CPU"):
            assert sum(ch == c for ch, _, _ in table) == 2, c
    else:
        groups = strategy_rows(table)
        # --small runs the GGUF model's strategies end to end through sift-simt instead (below);
        # where gpu_check runs them too, every strategy must be there as well
        labels = ["tiny-llama", "tiny-qwen2"] + sorted({lb for _, lb in groups} - {"tiny-llama", "tiny-qwen2"})
        for label in labels:
            for s in registry() + COMPOSED:
                got = groups.get((s, label))
                assert got, (s, label, sorted(groups))
                for c in ("kept positions agree", "decode step logits", "greedy same prefix"):
                    assert c in got, (s, label, got)


# ---- sift-simt against sift ---------------------------------------------------------------------

TOOL_LOGITS = os.path.join(ROOT, "build", "tests", "tool_logits")
TOOL_TOKENIZE = os.path.join(ROOT, "build", "tests", "tool_tokenize")
# Decode-time selection (top-K keys per head, on the device from bf16 scores) can take the other
# side of a near-tie in any step, as gpu_check's kept sets do; after that the two runs compute
# different things. Their first token (full's prefill) must still agree.
DECODE_SELECTION = {"topk", "topk+phi"}
NEAR_TIE_ULPS = 2   # bf16 steps (8 significant bits) at the logit's magnitude; see the docstring


def bf16_step(x):
    """The spacing of bf16 values at |x|."""
    m, e = math.frexp(abs(x)) if x else (0.5, -125)
    return math.ldexp(1.0, e - 8)
# Settings under which every strategy acts on NOTE (the defaults are for long prompts: fastkv,
# snapkv and streamingllm would keep everything, topk would retrieve nothing but its anchors);
# tool_logits' --set names of the same values.
SETTINGS = ["--kv-rate", "0.3", "--topk", "8", "--chunk", "16"]
TOOL_SETTINGS = ["--set", "kv_rate=0.3", "--set", "topk=8", "--set", "chunk=16"]
# One prompt for every strategy (123 tokens in the chat template), four short ones for the batch.
NOTE = ("Read the note, then answer the question in one sentence.\n\nNote: The blue notebook is in "
        "the kitchen drawer. The train to Lyon leaves at 7:40 from platform 3. Marie's cat is called "
        "Pistache and sleeps on the red sofa. The library closes at six on Saturdays. The spare key "
        "is under the flower pot by the door.\n\nQuestion: What is the name of Marie's cat?")
SHORT = ["What is the capital of Italy?", "Name one primary colour.", "What is two plus three?",
         "Translate 'bonjour' into English."]


def sift(binary, device, *args, quantised=False):
    """stdout and stderr of one greedy run; the CPU side on the fp32 reference weights, one thread
    (OpenMP's spinning workers run 15x slower while another process holds a core). The emulated
    CUDA side converts the weights to bf16 unless `quantised`: the kernels that decode GGUF blocks
    run every thread's dequantisation in the emulator, ~30x slower than its cuBLASLt, so only the
    one test below meant for them keeps the blocks (gpu_check's weight rows check every type)."""
    cmd = [binary, "-m", MODEL, "--device", device, "--temp", "0", *args]
    if device == "cpu":
        cmd += ["--weights", "f32", "-t", "1"]
    env = dict(os.environ)
    if device == "cuda" and not quantised:
        env["SIFT_CUDA_WEIGHTS"] = "bf16"
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
    assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-3000:])
    return p.stdout, p.stderr


def tokenize(text, special=False):
    b = text.encode()
    p = subprocess.run([TOOL_TOKENIZE, MODEL] + (["--special"] if special else []),
                       input=len(b).to_bytes(4, "little") + b, capture_output=True, timeout=60)
    assert p.returncode == 0 and not p.stdout.startswith(b"ERROR"), p.stderr
    return [int(x) for x in p.stdout.split()]


def not_near_tie(tmp, question, strategy, n_predict, cpu_text, gpu_text):
    """Why the first token where gpu_text leaves cpu_text is no near-tie (None if it is one), from
    an independent CPU run: tool_logits' greedy tokens and every step's logits, --weights f32."""
    if not (os.path.exists(TOOL_LOGITS) and os.path.exists(TOOL_TOKENIZE)):
        return "texts differ, and tool_logits / tool_tokenize are not built to tell whether on a near-tie"
    info = subprocess.run([TOOL_TOKENIZE, MODEL, "--info"], capture_output=True, text=True, timeout=60)
    kv = dict(line.split("=", 1) for line in info.stdout.splitlines() if "=" in line)
    if kv.get("chat") != "chatml":
        return f"texts differ; the near-tie check rebuilds only the chatml template, not {kv.get('chat')}"
    ids = tokenize(f"<|im_start|>system\n{kv['default_system']}<|im_end|>\n<|im_start|>user\n"
                   f"{question}<|im_end|>\n<|im_start|>assistant\n", special=True)
    steps = str(tmp / "steps.f32")
    p = subprocess.run([TOOL_LOGITS, MODEL, os.devnull, "--greedy", str(n_predict), "--strategy", strategy,
                        *TOOL_SETTINGS, "--steps", steps, *map(str, ids)], capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, SIFT_WEIGHTS="f32", OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr
    gen = [int(x) for x in p.stdout.split()]
    with open(steps, "rb") as f:
        raw = f.read()
    vocab = int(kv["n_vocab"])
    logits = [memoryview(raw).cast("f")[i * vocab:(i + 1) * vocab] for i in range(len(raw) // 4 // vocab)]
    cpu, gpu = tokenize(cpu_text), tokenize(gpu_text)
    if gen[:len(cpu)] != cpu:
        return f"texts differ; the independent CPU run's tokens {gen} are not sift's {cpu}: no gap to read"
    k = 0
    while k < len(cpu) and k < len(gpu) and cpu[k] == gpu[k]:
        k += 1
    if k >= len(gen):
        return f"texts differ past the {len(gen)} tokens the CPU run generated"
    if k < len(gpu):
        alt = [gpu[k]]
    else:   # the GPU's text ended there: an end-of-generation token
        alt = [int(x) for x in kv["eog"].split()]
    row = logits[k]
    gap = min(row[gen[k]] - row[t] for t in alt)
    bound = NEAR_TIE_ULPS * bf16_step(row[gen[k]])
    if gap < bound:
        return None
    return (f"token {k}: CPU {gen[k]} ({row[gen[k]]:.4f}), GPU {alt} ({max(row[t] for t in alt):.4f}): "
            f"the CPU's logit gap {gap:.4f} >= {bound:.4f} ({NEAR_TIE_ULPS} bf16 steps), no near-tie")


@needs_sift
@needs_model
def test_default_prompt_same_answer(tmp_path):
    """The default model on the emulated device with its weights kept in their GGUF blocks: the
    device holds about the file's bytes (the load line's GiB: the backend's resident weight bytes;
    bf16 would be 2.7x the file), and the answer is the CPU's."""
    args = ["--chat", "-p", DEFAULT_PROMPT, "-n", "16"]
    cpu, _ = sift(SIFT, "cpu", *args)
    gpu, err = sift(SIFT_SIMT, "cuda", *args, quantised=True)
    assert "SIMT emulator" in err and "device cuda" in err, err[-2000:]   # no fallback to the CPU
    m = re.search(r"params, ([0-9.]+) GiB\) in [0-9]+ ms on cuda", err)
    assert m, err[-2000:]
    file_gib = os.path.getsize(MODEL) / 2**30
    assert 0.8 * file_gib <= float(m.group(1)) <= 1.1 * file_gib, (m.group(0), file_gib)
    assert "Paris" in cpu, cpu
    if gpu != cpu:
        why = not_near_tie(tmp_path, DEFAULT_PROMPT, "full", 16, cpu.rstrip("\n"), gpu.rstrip("\n"))
        assert why is None, (why, cpu, gpu)


@needs_sift
@needs_model
def test_every_strategy_and_parallel_batch_same_text(tmp_path):
    """One process per backend: every registry strategy on NOTE and the four SHORT prompts (full),
    --parallel 4 (prefills alone, decode steps shared), in input order."""
    names = registry()
    reqs = [(f"note/{s}", NOTE, s) for s in names] + [(f"short/{i}", q, "full") for i, q in enumerate(SHORT)]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps({"id": i, "messages": [{"role": "user", "content": q}],
                                        "strategy": s, "n_predict": 12}) + "\n" for i, q, s in reqs))
    out = {}
    for binary, device in ((SIFT, "cpu"), (SIFT_SIMT, "cuda")):
        summ = tmp_path / f"summary-{device}.json"
        stdout, _ = sift(binary, device, "--prompts", str(path), "--parallel", "4", "--json", "-q",
                         "--summary", str(summ), *SETTINGS)
        recs = [json.loads(line) for line in stdout.splitlines() if line.strip()]
        s = json.loads(summ.read_text())
        assert s["parallel"] == 4 and s["failed"] == 0, s
        assert [r.get("id") for r in recs] == [i for i, _, _ in reqs], recs
        for r, (_, _, s) in zip(recs, reqs):
            assert "error" not in r and r["device"] == device and r["strategy"] == s, r
        out[device] = {r["id"]: r for r in recs}
    full = out["cpu"]["note/full"]
    for s in (n for n in names if n != "full"):   # each acted on NOTE: fewer rows, cache or reads
        r = out["cpu"][f"note/{s}"]
        assert "too short" not in (r["note"] or "") and "without compression" not in (r["note"] or ""), r
        assert (r["rows_pct_of_full"] < 100 or r["kv_bytes"] < full["kv_bytes"]
                or r["kv_read_per_step"] < full["kv_read_per_step"]), r
    assert "Pistache" in full["text"]
    differ = []
    for rid, q, s in reqs:
        cpu, gpu = out["cpu"][rid]["text"], out["cuda"][rid]["text"]
        if cpu != gpu and s in DECODE_SELECTION:   # a selection near-tie may part them later
            first = tokenize(cpu)[:1] == tokenize(gpu)[:1]
            print(f"{rid}: CPU {cpu!r}, GPU {gpu!r}: first token {'equal' if first else 'DIFFERS'}")
            if not first:
                differ.append((rid, cpu, gpu, "the first token (from full's prefill) differs"))
        elif cpu != gpu:
            why = not_near_tie(tmp_path, q, s, 12, cpu, gpu)
            print(f"{rid}: CPU {cpu!r}, GPU {gpu!r}: {why or 'first divergent token a near-tie'}")
            if why:
                differ.append((rid, cpu, gpu, why))
    assert not differ, differ


@needs_sift
@needs_model
def test_chunked_prefill_same_text_on_cuda():
    """--ubatch 17 on the emulated device: a 42-token prompt as passes of 17, 17 and 8 rows, the
    later ones attending to the cache entries before them (17 rows take the prefill kernels, 8 the
    split-K decode kernel), gives one pass's text on the device and the CPU's (no near-tie: 4
    greedy tokens of the same prompt on both, measured identical)."""
    prompt = ("The river runs past the old mill and into the valley, where the farmers grow wheat "
              "and barley. In spring the water rises and the children watch the boats go by. "
              "Every autumn the village holds a fair.")
    args = ["-p", prompt, "-n", "4", "--json", "-q"]
    whole, _ = sift(SIFT_SIMT, "cuda", *args, "--ubatch", "0")
    chunked, _ = sift(SIFT_SIMT, "cuda", *args, "--ubatch", "17")
    cpu, _ = sift(SIFT, "cpu", *args, "--ubatch", "0")
    w, c, ref = (json.loads(x.strip().splitlines()[-1]) for x in (whole, chunked, cpu))
    assert w["device"] == c["device"] == "cuda" and w["timings"]["prompt_n"] == 42
    assert c["text"] == w["text"] == ref["text"], (c["text"], w["text"], ref["text"])


@needs_sift
@needs_model
def test_shared_prefix_same_text_on_cuda(tmp_path):
    """--prefix-cache on the emulated device: two requests over one 175-token preamble share a
    prefix of 128 tokens (--prefix-min 128), copied on the device (fwd_kv_copy_caps' row gathers)
    and each request's rest prefilled after it: the texts of --prefix-cache off on the device and
    of the CPU's run."""
    doc = ("The river runs past the old mill and into the valley, where the farmers grow wheat "
           "and barley. In spring the water rises and the children watch the boats go by. Every "
           "autumn the village holds a fair. ") * 4
    path = tmp_path / "job.jsonl"
    with open(path, "w") as f:
        for i, q in enumerate(["Where does the river run?", "What do the farmers grow?"]):
            f.write(json.dumps({"id": f"s{i}", "prompt": doc + "Question: " + q + "\nAnswer:",
                                "n_predict": 4, "temp": 0}) + "\n")
    args = ["--prompts", str(path), "--json", "-q", "--prefix-min", "128"]
    on, _ = sift(SIFT_SIMT, "cuda", *args)
    off, _ = sift(SIFT_SIMT, "cuda", *args, "--prefix-cache", "off")
    cpu, _ = sift(SIFT, "cpu", *args)
    recs = [[json.loads(x) for x in out.strip().splitlines()] for out in (on, off, cpu)]
    for a, b, c in zip(*recs):
        assert a["device"] == "cuda" and a["prefix_tokens"] == 128 and b["prefix_tokens"] == 0, (a, b)
        assert a["text"] == b["text"] == c["text"], (a["text"], b["text"], c["text"])


@needs_sift
@needs_model
def test_prompt_cache_round_trip_on_cuda(tmp_path):
    """--prompt-cache on the emulated device: a prompt's prefill saved from the device's cache
    (fwd_kv_read: its bf16 rows), a second question over the same preamble loading it (fwd_kv_write,
    the device's positions uploaded) answers as without the file; the file names the backend, so
    the CPU refuses it."""
    doc = ("The river runs past the old mill and into the valley, where the farmers grow wheat "
           "and barley. In spring the water rises and the children watch the boats go by. Every "
           "autumn the village holds a fair. ") * 4
    cache = tmp_path / "ctx.bin"
    base = ["-n", "4", "--json", "-q", "--prompt-cache", str(cache)]
    sift(SIFT_SIMT, "cuda", "-p", doc + "Question: Where does the river run?\nAnswer:", *base)
    assert cache.exists()
    q = ["-p", doc + "Question: What do the farmers grow?\nAnswer:", "-n", "4", "--json", "-q"]
    loaded, _ = sift(SIFT_SIMT, "cuda", *q, "--prompt-cache", str(cache), "--prompt-cache-ro")
    plain, _ = sift(SIFT_SIMT, "cuda", *q)
    a, b = (json.loads(x.strip().splitlines()[-1]) for x in (loaded, plain))
    assert a["prefix_tokens"] == 128 and b["prefix_tokens"] == 0, (a["prefix_tokens"], b["prefix_tokens"])
    assert a["text"] == b["text"], (a["text"], b["text"])
    p = subprocess.run([SIFT, "-m", MODEL, *q, "--prompt-cache", str(cache)], capture_output=True, text=True)
    assert p.returncode != 0 and "was made on cuda" in p.stderr, p.stderr


@needs_sift
def test_fit_phi_logging_prefill_on_cuda(tmp_path):
    """fit-phi with --device cuda: the logging prefill and the held-out check (topk's decode
    steps, each comparison rewinding the cache's length on the host) on the emulated backend,
    with the CPU's quality table to about bf16's precision. The check's rewinds caught a device
    KV length that did not follow the host's (an append past the cache, the emulator's bounds
    check)."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import gguf
    import tiny_gguf
    model = str(tmp_path / "tiny-llama.gguf")
    tiny_gguf.write(model, n_layer=4, d=256, n_head=4, n_kv=2, ff=512, ctx=4096,
                    dtype=gguf.GGMLQuantizationType.F16, seed=3)
    means = {}
    for dev, binary in (("cpu", SIFT), ("cuda", SIFT_SIMT)):
        p = subprocess.run([binary, "fit-phi", "-m", model, "--data", os.path.join(ROOT, "README.md"),
                            "-c", "256", "--steps", "2", "--queries", "4", "--check", "64",
                            "--device", dev, "-o", str(tmp_path / f"{dev}.phi"), "-t", "2"],
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, (dev, p.stderr[-3000:])
        row = [ln for ln in p.stdout.splitlines() + p.stderr.splitlines() if ln.startswith("| mean")]
        assert row, (dev, p.stdout[-2000:])
        means[dev] = [float(x) for x in row[0].strip("|").split("|")[1:]]
    assert len(means["cpu"]) == len(means["cuda"]) >= 8
    for a, b in zip(means["cpu"], means["cuda"]):
        assert abs(a - b) <= 0.03 + 0.02 * abs(a), (means["cpu"], means["cuda"])


@needs_check
def test_attention_bounds_hold_under_truncating_tensor_cores():
    """The attention checks under SIMT_TC_ACCUM=trunc: mma.sync and wgmma accumulate as the
    truncating block FMA measured on NVIDIA tensor cores (simt/ptx.cpp), not fp32 round to nearest;
    every kernel's rows must stay within the bounds the default mode passes."""
    p = subprocess.run([GPU_CHECK, "--small", "--only", "attention"], cwd=ROOT, capture_output=True,
                       text=True, timeout=1800, env=dict(os.environ, SIMT_TC_ACCUM="trunc"))
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    m = re.search(r"gpu_check: (\d+) passed, 0 failed", p.stdout)
    assert m and int(m.group(1)) > 100, p.stdout[-2000:]
    t = subprocess.run([os.path.join(ROOT, "build", "tests", "test_simt")], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, SIMT_TC_ACCUM="trunc"))
    assert t.returncode == 0 and "1 + 0 * 2^-23" in t.stdout, t.stdout[-2000:]   # the mode acted


def mixed_gguf(path):
    """A tiny llama GGUF whose matrices take five block types, as real files mix them: q and k
    Q4_0, v Q8_0 (so q|k|v are not fused: their types differ), o Q5_1, gate and up Q4_1 (fused),
    down Q5_0, the embedding (also the tied LM head) Q8_0."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import gguf
    import tiny_gguf
    Q = gguf.GGMLQuantizationType
    tiny_gguf.write(path, n_layer=2, d=256, n_head=4, n_kv=2, ff=512, ctx=2048, dtype=Q.F32, seed=5,
                    dtypes={"attn_q.weight": Q.Q4_0, "attn_k.weight": Q.Q4_0, "attn_v.weight": Q.Q8_0,
                            "attn_output.weight": Q.Q5_1, "ffn_gate.weight": Q.Q4_1,
                            "ffn_up.weight": Q.Q4_1, "ffn_down.weight": Q.Q5_0,
                            "token_embd.weight": Q.Q8_0})


@needs_check
def test_mixed_block_types_model(tmp_path):
    """A model whose weights stay in five GGUF block types on the emulated device: every strategy's
    prefill logits, kept positions, decode step logits and greedy prefix against the CPU backend
    (gpu_check's model rows; the CPU reference dequantises to fp32)."""
    model = str(tmp_path / "mixed.gguf")
    mixed_gguf(model)
    p = subprocess.run([GPU_CHECK, "--small", "--only", "gguf", model], cwd=ROOT, capture_output=True,
                       text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    m = re.search(r"gpu_check: (\d+) passed, 0 failed", p.stdout)
    assert m and int(m.group(1)) >= 20, p.stdout[-3000:]
    assert "greedy same prefix" in p.stdout

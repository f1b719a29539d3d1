"""Native weights (the GGUF blocks kept as stored, 8-bit-digit activation products, qgemm/qgemm.h)
against the fp32 reference path (--weights f32) on the default model, end to end.

The issue's acceptance measures, on a text no test was tuned on (the first 16 KB of the GPL-3 text
Debian ships in /usr/share/common-licenses):
  * perplexity (`sift ppl -c 512`, llama-perplexity's chunks): native within 0.5 % of f32,
    on the default prefill path (this CPU's wide path: AMX bf16 tiles, the two-digit VNNI GEMM or
    sgemm on dequantised tiles) and on `--weights fast` (with AVX-512: one-digit activations, as
    llama.cpp's), and `--weights exact` (every product through the two-digit row kernels) within
    1e-4 of it;
  * top-1 agreement of every position's logits (tool_logits on the first 512 tokens, int8 path)
    with the f32 path on >= 98 % of positions, and every disagreement a near-tie: the f32 logit
    gap between the two tokens within twice that row's largest |native - f32| logit difference
    (the native path's own error on that row, so the flip is explained by it);
  * greedy decoding (the chat question of test_cli) gives the same answer on every ISA path.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SIFT = ROOT / "sift"
TOOL = ROOT / "build" / "tests" / "tool_logits"
MODEL = Path(os.environ.get("SIFT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL
TEXT = Path("/usr/share/common-licenses/GPL-3")


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """The first 16 KB of the text (about 8 chunks of 512 tokens: the suite also runs sanitized)."""
    if not MODEL.exists():
        pytest.skip(f"model {MODEL} absent (make model)")
    if not TEXT.exists():
        pytest.skip(f"{TEXT} absent (Debian's base-files ships it)")
    out = tmp_path_factory.mktemp("native") / "text.txt"
    out.write_bytes(TEXT.read_bytes()[:16384])
    return out


def run(args, env_extra=None, timeout=900):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([str(SIFT)] + args, capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def ppl(text, weights, env_extra=None):
    r = run(["ppl", "-m", str(MODEL), "-f", str(text), "-c", "512", "--json", "-q",
             "--weights", weights], env_extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_perplexity_native_within_half_percent(text):
    ref = ppl(text, "f32")
    for weights in ("native", "fast", "exact"):
        p = ppl(text, weights)
        rel = abs(p["ppl"] / ref["ppl"] - 1)
        print(f"ppl f32 {ref['ppl']:.4f}  {weights} {p['ppl']:.4f}  ({rel:.2e})")
        assert p["chunks"] == ref["chunks"]
        assert rel <= 0.005, f"{weights} ppl {p['ppl']} vs f32 {ref['ppl']}"
        # two-digit activations on every product: within 16-bit rounding of f32
        assert weights != "exact" or rel <= 1e-4, f"exact ppl {p['ppl']} vs f32 {ref['ppl']}"


def logits(ids, weights, out, env_extra=None, model=MODEL):
    env = dict(os.environ, SIFT_WEIGHTS=weights, **(env_extra or {}))
    p = subprocess.run([str(TOOL), str(model), str(out)] + [str(i) for i in ids],
                       capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1).astype(np.float64)


def test_top1_agreement_near_ties_only(text, tmp_path):
    raw = text.read_bytes()[:6000]
    tok = subprocess.run([str(ROOT / "build" / "tests" / "tool_tokenize"), str(MODEL)],
                         input=len(raw).to_bytes(4, "little") + raw, capture_output=True,
                         cwd=ROOT)
    assert tok.returncode == 0, tok.stderr
    ids = [int(t) for t in tok.stdout.split()][:512]
    assert len(ids) >= 400
    f32 = logits(ids, "f32", tmp_path / "f.f32")
    nat = logits(ids, "native", tmp_path / "n.f32", {"SIFT_PREFILL": "int8"})
    a, b = f32.argmax(axis=1), nat.argmax(axis=1)
    agree = float(np.mean(a == b))
    row_err = np.abs(nat - f32).max(axis=1)
    print(f"top-1 agreement {agree:.4f} over {len(ids)} positions; row max |native - f32| "
          f"median {np.median(row_err):.3g}, max {row_err.max():.3g}")
    assert agree >= 0.98
    for r in np.where(a != b)[0]:
        gap = f32[r, a[r]] - f32[r, b[r]]
        assert gap <= 2 * row_err[r], f"position {r}: f32 gap {gap:.3g} is no near-tie " \
                                      f"(row error {row_err[r]:.3g})"


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
def test_chat_answer_every_isa(text, isa):
    r = run(["-m", str(MODEL), "-p", "What is the capital of France?", "--chat", "-n", "16",
             "--temp", "0", "-q"], {"SIFT_ISA": isa})
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout


@pytest.mark.parametrize("var, value, allowed", [
    ("SIFT_ISA", "sse9", "scalar, avx2, avx512"), ("SIFT_PREFILL", "vnni", "int8, tune"),
    ("SIFT_STRIP_PREFETCH", "l3", "l1, l2"), ("SIFT_STRIP_PREFETCH", "L1", "l1, l2"),
    ("SIFT_STRIP_PREFETCH", "", "l1, l2"), ("SIFT_STRIP_ROWS8", "1", "off, on"),
    ("SIFT_STRIP_ROWS8", "ON", "off, on"), ("SIFT_STRIP_ROWS8", "", "off, on")])
def test_bad_cpu_tunable_is_refused(var, value, allowed):
    """A CPU tunable (util/tunables.h) outside its values is a usage error before anything runs:
    one line naming the variable, its value and the accepted ones, exit 2."""
    r = run(["-m", str(MODEL), "-p", "hi", "-n", "1"], {var: value})
    assert r.returncode == 2
    assert r.stderr == f"sift: error: {var}='{value}' is not one of {allowed}\n"


def test_model_larger_than_memory_is_refused_up_front(tmp_path):
    """A GGUF whose weights exceed MemAvailable (a sparse file: tensor data never written) is
    refused by the memory plan with its numbers, exit 1, before any weight is touched."""
    import time

    import gguf

    avail = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo")
                 if line.startswith("MemAvailable:"))
    d, dff, n_layer = 4096, 14336, 1
    per_layer = (4 * d * d + 3 * d * dff) * 4
    while n_layer * per_layer < 1.5 * avail:
        n_layer *= 2
    path = tmp_path / "huge.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, v in (("block_count", n_layer), ("embedding_length", d), ("feed_forward_length", dff),
                   ("attention.head_count", 32), ("attention.head_count_kv", 32),
                   ("context_length", 4096)):
        w.add_uint32(f"llama.{key}", v)
    src = gguf.GGUFReader(str(MODEL))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    f = src.fields["tokenizer.ggml.tokens"]
    w.add_token_list([bytes(f.parts[i]) for i in f.data])
    f = src.fields["tokenizer.ggml.merges"]
    w.add_token_merges([bytes(f.parts[i]) for i in f.data])
    shapes = [("token_embd.weight", (49152, d)), ("output_norm.weight", (d,))]
    for l in range(n_layer):
        for name, shape in (("attn_norm", (d,)), ("attn_q", (d, d)), ("attn_k", (d, d)),
                            ("attn_v", (d, d)), ("attn_output", (d, d)), ("ffn_norm", (d,)),
                            ("ffn_gate", (dff, d)), ("ffn_up", (dff, d)), ("ffn_down", (d, dff))):
            shapes.append((f"blk.{l}.{name}.weight", shape))
    total = 0
    for name, shape in shapes:
        nbytes = int(np.prod(shape)) * 4
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes)
        total += nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    fout.flush()
    end = fout.tell()
    fout.truncate(end + (-end) % 32 + total)   # sparse: the data section is a hole
    fout.close()
    t0 = time.monotonic()
    r = run(["-m", str(path), "-p", "hi", "-n", "4"])
    took = time.monotonic() - t0
    print(f"refused in {took:.3f} s: {r.stderr.strip()}")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sift: error: ")
    want = f"weights {total / 2**30:.2f} GiB"
    assert want in lines[0] and "GiB is available" in lines[0], (want, lines[0])
    assert took < 30   # it read no weights (a load would take minutes and be killed)


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_half_precision_hf_stays_16_bit(tmp_path, dtype):
    """An HF directory of F16 / BF16 safetensors runs natively with its weights kept 16-bit (half
    the fp32 bytes on the load line) and gives the logits of the fp32 reference path on the same
    files: the 16-bit values convert exactly, only the order of the fp32 sums differs (1e-4 of the
    row's largest logit, the fp32 path's tolerance in test_logits.py)."""
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    import hf_convert
    import tiny_gguf

    gg = tiny_gguf.write(str(tmp_path / "m.gguf"))
    hf = tmp_path / "half"
    hf_convert.convert(gg, str(hf), dtype=dtype)
    ids = [1, 40, 7, 200, 33, 95, 260, 12]
    f32 = logits(ids, "f32", tmp_path / "f.f32", model=hf)
    nat = logits(ids, "native", tmp_path / "n.f32", model=hf)
    rel = np.abs(nat - f32).max(axis=1) / np.abs(f32).max(axis=1)
    assert rel.max() <= 1e-4, rel
    planned = {}
    for w in ("f32", "native"):   # the memory plan's weight bytes
        r = run(["bench", "-m", str(hf), "-p", "8", "--dry-run", "--format", "json", "--weights", w])
        assert r.returncode == 0, r.stderr
        planned[w] = json.loads(r.stdout)[0]["weight_bytes"]
    params = json.loads(r.stdout)[0]["n_params"]
    assert planned["f32"] == 4 * params
    assert 2 * params < planned["native"] < 2.1 * params, planned   # vectors stay fp32


def test_tuned_paths_are_listed(text):
    """SIFT_PREFILL=tune times both product paths per shape and sift bench lists every choice."""
    r = run(["bench", "-m", str(MODEL), "-p", "40", "-n", "2", "-r", "1", "--format", "json"],
            {"SIFT_PREFILL": "tune"})
    assert r.returncode == 0, r.stderr
    rows = [l for l in r.stderr.splitlines() if " rows: " in l]
    # SmolLM2's four matrix shapes at 32..63 rows (the 40-token prompt); Q4_1
    assert len(rows) >= 4 and all("Q4_1" in l for l in rows), r.stderr
    assert all(any(p in l.split(":")[1] for p in ("int8", "sgemm tiles", "amx tiles", "vnni gemm"))
               for l in rows)


def blas_line(env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "SIFT_BLAS_DETECTED")}
    env.update(env_extra)
    r = subprocess.run([str(SIFT), "-m", str(MODEL), "-p", "hi", "-n", "1", "-t", "1"],
                       capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stderr.splitlines() if "BLAS " in l]
    assert line, r.stderr
    return line[0].split("BLAS ", 1)[1].split(",")[0]


def test_blas_kernels_match_the_cpu(text):
    """OpenBLAS picks its kernels when it loads; on a CPU newer than the library it falls back to
    SSE3 ("Prescott": 5x slower sgemm on the dev machine). sift runs with the best set the CPU has
    (re-executing itself once with OPENBLAS_CORETYPE), and keeps a set the user chose."""
    flags = set()
    for l in Path("/proc/cpuinfo").read_text().splitlines():
        if l.startswith("flags"):
            flags = set(l.split(":", 1)[1].split())
            break
    if not {"avx2", "fma"} <= flags:
        pytest.skip("the CPU has no AVX2 + FMA: OpenBLAS's fallback is its best")
    core = blas_line({})
    assert core.split()[0] in ("Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"), core
    assert blas_line({"OPENBLAS_CORETYPE": "Prescott"}) == "Prescott"   # the user's choice stands

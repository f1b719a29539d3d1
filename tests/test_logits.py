"""sift's CPU forward pass vs an independent float64 numpy reference (tests/ref_llama.py).

For every prompt below, build/tests/tool_logits writes sift's float32 logits of every prompt
position and prints its greedy continuation. Checks, per prompt:
  * logits, every position r:   max_j |sift[r, j] - ref[r, j]|  /  max_j |ref[r, j]|  <= 1e-4
    (the error of the row relative to the row's largest reference logit magnitude);
  * argmax of every row equal (a different argmax is accepted only on a reference near-tie:
    the reference logit of sift's choice within 2 x tolerance of the reference max);
  * the 16-token greedy continuation identical (same near-tie rule at the first difference;
    a shorter continuation is accepted only if it ends in an end-of-generation token).
Plus two checks of the reference itself: it answers the ChatML France question with Paris, and
its adjacent-pair rope on the stored (permuted) rows equals half-split rope on un-permuted rows.

The model is $SIFT_MODEL (default models/SmolLM2-135M-Instruct.Q4_1.gguf, relative to the
repository root). Prompt ids were produced once with the HF `tokenizers` BPE built from that
GGUF's vocabulary and merges (ref_llama.hf_tokenizer), and are hard-coded here.
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module", autouse=True)
def _f32_weights():
    """the 1e-4 tolerance is the fp32 path's (native weights: test_native.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SIFT_WEIGHTS", "f32")
        yield

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ref_llama  # noqa: E402  (sets numpy's BLAS to one thread before heavy use)
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = Path(os.environ.get("SIFT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL
TOOL = Path(os.environ.get("SIFT_TOOL_LOGITS", ROOT / "build" / "tests" / "tool_logits"))
REL_TOL = 1e-4
N_GREEDY = 16

# SmolLM2 vocabulary ids (tokenizer.ggml.pre = smollm: digits split one by one).
CHAT_FRANCE = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
# "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = {
    # "The quick brown fox jumps over the lazy dog."
    "fox": [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30],
    # "In 1969, Apollo 11 landed on the Moon; Neil Armstrong and Buzz Aldrin walked on its
    #  surface for about 2.5 hours while Michael Collins orbited above."
    "apollo": [788, 216, 33, 41, 38, 41, 28, 17600, 216, 33, 33, 16176, 335, 260, 8872, 43, 27639,
               24955, 284, 42855, 20604, 8873, 13197, 335, 624, 2376, 327, 563, 216, 34, 30, 37,
               2737, 979, 7937, 18976, 12705, 960, 2120, 30],
    # "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n
    #  Name three primary colors.<|im_end|>\n<|im_start|>assistant\n"  (ChatML ids 1 and 2)
    "chatml_system": [1, 9690, 198, 2683, 359, 253, 5356, 11173, 30, 2, 198, 1, 4093, 198, 5820,
                      1296, 3003, 4683, 30, 2, 198, 1, 520, 9531, 198],
    "chat_france": CHAT_FRANCE,
    # "def add(a, b):"
    "code": [1604, 803, 24, 81, 28, 278, 727],
    # arbitrary ids, incl. the first and last embedding rows; for any vocabulary (taken mod vocab)
    "arbitrary": [49151, 0, 17, 31999, 2, 1, 12345, 40000, 7, 48000, 256, 5],
}
ANY_VOCAB = {"arbitrary"}
END_TOKENS = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>"}


@pytest.fixture(scope="module")
def ref():
    if not MODEL.exists():
        pytest.skip(f"model {MODEL} absent (make model fetches the default one)")
    return ref_llama.load(str(MODEL))


def _smollm2_vocab(m):
    return m.vocab == 49152 and m.tokens is not None and m.tokens[1] == "<|im_start|>"


def _prompt(m, name):
    ids = PROMPTS[name]
    if name in ANY_VOCAB:
        return [i % m.vocab for i in ids]
    if not _smollm2_vocab(m):
        pytest.skip(f"prompt {name!r} is hard-coded in SmolLM2 vocabulary ids; {MODEL.name} differs")
    return ids


def _run_tool(ids, out):
    if not TOOL.exists():
        pytest.skip(f"{TOOL} absent (make build/tests/tool_logits)")
    cmd = [str(TOOL), str(MODEL), str(out), "--greedy", str(N_GREEDY)] + [str(i) for i in ids]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"tool_logits failed ({p.returncode}):\n{p.stderr}"
    logits = np.fromfile(out, dtype=np.float32)
    gen = [int(t) for t in p.stdout.split()]
    return logits, gen


def _near_tie(row, chosen, tol_abs):
    """True if the reference logit of `chosen` is within tol_abs of the row's maximum."""
    return row.max() - row[chosen] <= tol_abs


def _rel_err(sift, ref):
    """Per row: max_j |sift - ref| / max_j |ref|."""
    return np.max(np.abs(sift - ref), axis=1) / np.max(np.abs(ref), axis=1)


@pytest.mark.parametrize("name", list(PROMPTS))
def test_logits_match_reference(ref, name, tmp_path):
    ids = _prompt(ref, name)
    flat, gen = _run_tool(ids, tmp_path / "logits.f32")
    n = len(ids)
    assert flat.size == n * ref.vocab, f"tool wrote {flat.size} floats, want {n} x {ref.vocab}"
    sift = flat.reshape(n, ref.vocab).astype(np.float64)
    want = ref_llama.forward(ref, ids)

    bad = np.where(~np.isfinite(sift).all(axis=1))[0]
    assert bad.size == 0, f"{name}: non-finite logits at positions {bad}"
    err = _rel_err(sift, want)
    worst = int(np.argmax(err))
    print(f"{name}: n={n} max row rel err {err.max():.3e} (row {worst})")
    assert err.max() <= REL_TOL, (
        f"{name}: logits differ from the reference: max_j|sift-ref|/max_j|ref| = {err[worst]:.3e} "
        f"at position {worst} (tolerance {REL_TOL}); per-position errors: "
        + " ".join(f"{e:.1e}" for e in err)
    )
    for r in range(n):
        a, b = int(np.argmax(sift[r])), int(np.argmax(want[r]))
        tol_abs = 2 * REL_TOL * np.abs(want[r]).max()
        assert a == b or _near_tie(want[r], a, tol_abs), (
            f"{name}: argmax differs at position {r}: sift {a}, ref {b}"
        )

    expect = ref_llama.greedy(ref, ids, N_GREEDY)
    print(f"{name}: greedy sift {gen}\n{name}: greedy ref  {expect}")
    for k in range(N_GREEDY):
        if k == len(gen):  # sift stopped early: only at an end-of-generation token
            last = ref.tokens[gen[-1]] if gen and ref.tokens else None
            assert last in END_TOKENS, f"{name}: sift generated {len(gen)} < {N_GREEDY} ids: {gen}"
            break
        if gen[k] != expect[k]:
            row = ref_llama.forward(ref, ids + gen[:k])[-1]
            tol_abs = 2 * REL_TOL * np.abs(row).max()
            assert _near_tie(row, gen[k], tol_abs), (
                f"{name}: greedy diverges at step {k}: sift {gen[k]}, ref {expect[k]} "
                f"(ref logits {row[gen[k]]:.4f} vs {row[expect[k]]:.4f}); sift {gen}, ref {expect}"
            )
            break  # a genuine near-tie: the continuations may differ from here on
    assert len(gen) <= N_GREEDY, f"{name}: sift printed {len(gen)} ids for --greedy {N_GREEDY}"


def test_reference_answers_paris(ref):
    """The reference on its own: greedy ChatML answer to the France question names Paris."""
    if not _smollm2_vocab(ref):
        pytest.skip("ChatML prompt ids are SmolLM2's")
    out = ref_llama.greedy(ref, CHAT_FRANCE, 8)
    text = "".join(ref.tokens[i] for i in out).replace("\u0120", " ")
    assert "Paris" in text, f"reference answered {text!r}"


def test_reference_rope_layout(ref):
    """Adjacent-pair rope on the stored `llama` rows == half-split rope on un-permuted rows,
    and half-split rope on the stored rows (the trap) is far off: the logits test can see it."""
    if ref.arch != "llama":
        pytest.skip("only `llama` GGUFs have permuted Q/K rows")
    ids = [i % ref.vocab for i in PROMPTS["arbitrary"]]
    base = ref_llama.forward(ref, ids)
    assert _rel_err(ref_llama.forward(ref_llama.as_neox(ref), ids), base).max() < 1e-12
    wrong = ref_llama.forward(dataclasses.replace(ref, rope_neox=True), ids)
    assert _rel_err(wrong, base).max() > 100 * REL_TOL


# ---- other architectures and tensor types, on tiny models written by tests/tiny_gguf.py --------
import gguf  # noqa: E402
import tiny_gguf  # noqa: E402

Q = gguf.GGMLQuantizationType
TINY = {
    "llama_f32_tied": dict(),
    "llama_rope_freqs": dict(rope_freqs=True),            # llama3 rope scaling factors
    "llama_f16_untied": dict(dtype=Q.F16, tied=False),
    "llama_q8_0_mha": dict(dtype=Q.Q8_0, n_kv=4),
    "qwen2_bias_neox": dict(arch="qwen2", dtype=Q.Q8_0, tied=False),
}


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_models_match_reference(name, tmp_path):
    if not TOOL.exists():
        pytest.skip(f"{TOOL} absent (make build/tests/tool_logits)")
    path = tiny_gguf.write(str(tmp_path / f"{name}.gguf"), seed=3, **TINY[name])
    m = ref_llama.load(path)
    ids = [5, 70, 71, 3, 200, 9, 0, 258, 100, 33, 34, 35, 1, 2] * 3
    out = tmp_path / "l.f32"
    p = subprocess.run([str(TOOL), path, str(out), "--greedy", "8"] + [str(i) for i in ids],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    sift = np.fromfile(out, dtype=np.float32).reshape(len(ids), m.vocab).astype(np.float64)
    err = _rel_err(sift, ref_llama.forward(m, ids))
    assert err.max() <= REL_TOL, f"{name}: max row rel err {err.max():.3e}"
    assert [int(t) for t in p.stdout.split()] == ref_llama.greedy(m, ids, 8)

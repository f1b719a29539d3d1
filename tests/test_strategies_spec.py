"""Strategies `speed` and `specprefill` (specs/speed.md, specs/specprefill.md).

* Identity: speed with speed_depth = L, specprefill with keep = 1 (self-draft of all L layers, or
  --draft = the same file) give full's first-token logits (max|a - b| / max|b| <= 1e-5) and full's
  greedy continuation (decode positions N + t), on a tiny model and on the default model.
* Against an independent float64 numpy pass (tests/ref_llama.py weights, the visibility rules
  written here from the specs): speed at K < L with and without the anchor (prefill logits and a
  greedy continuation over the short upper caches); specprefill's whole pipeline — the
  self-draft's attention of the last prompt row and its greedy lookahead rows over the context
  keys, average pool (padding counted), max over layers and heads, mean over rows, chunk
  selection — then the main prefill of the kept tokens at their original positions and decoding
  at M + t.
* Measured KV bytes and prefill rows (sift --json) equal the specs' formulas, computed here.
* Bad parameters are refused with a clear error: speed_depth > L, draft_layers > L, no
  speculator, a draft whose vocabulary differs.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ref_llama  # noqa: E402  (sets numpy's BLAS to one thread before heavy use)
import tiny_gguf  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIFT = ROOT / "sift"
TOOL = ROOT / "build" / "tests" / "tool_logits"
MODEL = Path(os.environ.get("SIFT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL
need_model = pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched")

L_TINY = 6
N_GEN = 6
ID_TOL = 1e-5   # identity: the same arithmetic, up to summation order
REF_TOL = 1e-4  # float32 sift vs the float64 reference


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_gguf.write(str(tmp_path_factory.mktemp("m") / "tiny.gguf"), n_layer=L_TINY,
                           ctx=512, seed=5)


@pytest.fixture(scope="module")
def ref(tiny):
    return ref_llama.load(tiny)


def tiny_ids(n, seed=0):
    return [int(i) for i in np.random.default_rng(seed).integers(3, 262, n)]


def tool(model, ids, strategy="full", sets=(), draft=None, greedy=0, tmp=None, temp=None, seed=0):
    """(first-token logits (vocab,), greedy ids) from build/tests/tool_logits; with temp, the
    prefill of a request sampled at that temperature and seed (and the sampled id)."""
    out = Path(tmp) / "logits.f32"
    args = [str(TOOL), str(model), str(out), "--strategy", strategy]
    for s in sets:
        args += ["--set", s]
    if draft:
        args += ["--draft", str(draft)]
    if greedy:
        args += ["--greedy", str(greedy)]
    if temp is not None:
        args += ["--temp", str(temp), "--seed", str(seed)]
    r = subprocess.run(args + [str(i) for i in ids], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=np.float32), [int(t) for t in r.stdout.split()]


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def sift(*args):
    e = {k: v for k, v in os.environ.items() if k != "SIFT_MODEL"}
    return subprocess.run([str(SIFT), *map(str, args)], capture_output=True, text=True, env=e,
                          timeout=600)


# ---- an independent dense reference with explicit visibility ----------------------------------

def ref_pass(m, ids, pos, visible=None, depth=None, rows=()):
    """float64 pass of ids at positions pos through the first `depth` layers (then final norm +
    LM head). Key j is visible to query i when pos[j] <= pos[i] and visible(l)[i, j].
    Returns (logits [n, vocab], per layer the raw scores [heads, len(rows), n] of rows)."""
    ids, pos = np.asarray(ids), np.asarray(pos)
    n, hd, nh, nkv = len(ids), m.head_dim, m.n_head, m.n_kv
    x = m.tok_embd[ids].copy()
    scores = []
    for li, L in enumerate(m.layers[:depth]):
        h = ref_llama._rmsnorm(x, L.attn_norm, m.eps)
        q = ref_llama._linear(h, L.wq, L.bq).reshape(n, nh, hd)
        k = ref_llama._linear(h, L.wk, L.bk).reshape(n, nkv, hd)
        v = ref_llama._linear(h, L.wv, L.bv).reshape(n, nkv, hd)
        ref_llama._rope(m, q, pos)
        ref_llama._rope(m, k, pos)
        kq = np.repeat(k, nh // nkv, axis=1)
        vq = np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("ihd,jhd->hij", q, kq) / np.sqrt(hd)
        mask = pos[None, :] <= pos[:, None]
        if visible is not None:
            mask = mask & visible(li)
        s = np.where(mask[None], s, -np.inf)
        scores.append(s[:, list(rows), :])
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        o = np.einsum("hij,jhd->ihd", p, vq).reshape(n, nh * hd)
        x = x + ref_llama._linear(o, L.wo)
        h = ref_llama._rmsnorm(x, L.ffn_norm, m.eps)
        x = x + ref_llama._linear(ref_llama._silu(ref_llama._linear(h, L.w_gate)) *
                                  ref_llama._linear(h, L.w_up), L.w_down)
    return ref_llama._linear(ref_llama._rmsnorm(x, m.out_norm, m.eps), m.lm_head), scores


def ref_greedy(m, ids, pos, next_pos, n, visible=None):
    """First-token logits and n greedy ids; token t is decoded at position next_pos + t."""
    ids, pos = list(ids), list(pos)
    first, out = None, []
    for t in range(n):
        logits = ref_pass(m, ids, pos, visible(len(ids)) if visible else None)[0][-1]
        first = logits if first is None else first
        out.append(int(np.argmax(logits)))
        ids.append(out[-1])
        pos.append(next_pos + t)
    return first, out


def speed_visible(K, n, anchor):
    """specs/speed.md: in layers >= K a token at index >= n-1 (the last prompt token and decode
    tokens) sees the anchor (index 0), the last prompt token and decode tokens. Rows of other
    prompt tokens in those layers are never read, so their visibility does not matter."""
    def vis(total):
        j = np.arange(total)
        upper = (j >= n - 1) | ((j == 0) & bool(anchor))
        full = np.ones((total, total), bool)
        return lambda l: full if l < K else (upper[None, :] | np.eye(total, dtype=bool))
    return vis


def ref_specprefill(m, ids, depth, lookahead, pool, chunk, keep, keep_last=True):
    """Kept indices I of specs/specprefill.md steps A-F, self-draft of the first `depth` layers;
    the last chunk is added when keep_last (sift's --keep-last on), else the top chunks alone
    (the authors' code)."""
    M, toks = len(ids), list(ids)
    for _ in range(lookahead - 1):   # B: greedy lookahead with the draft
        toks.append(int(np.argmax(ref_pass(m, toks, range(len(toks)), depth=depth)[0][-1])))
    rows = range(M - 1, len(toks))
    _, scores = ref_pass(m, toks, range(len(toks)), depth=depth, rows=rows)
    s = np.zeros((len(rows), M))
    for z in scores:   # C-E: softmax over the M context keys, pool, max over layers and heads
        p = np.exp(z[:, :, :M] - z[:, :, :M].max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        pooled = np.apply_along_axis(lambda r: np.convolve(r, np.ones(pool) / pool, "same"), -1, p)
        s = np.maximum(s, pooled.max(axis=0))
    score = s.mean(axis=0)
    nc = -(-M // chunk)   # F
    cs = [score[c * chunk:(c + 1) * chunk].mean() for c in range(nc)]
    k = math.ceil(round(nc * keep, 6))
    top = set(sorted(range(nc), key=lambda c: (-cs[c], c))[:k]) | ({nc - 1} if keep_last else set())
    return [i for c in sorted(top) for i in range(c * chunk, min((c + 1) * chunk, M))]


# ---- identity: keep-everything parameters reproduce full --------------------------------------

def identity_variants(model, L):
    return {"speed K=L": ("speed", [f"speed_depth={L}"]),
            "speed K=L anchor none": ("speed", [f"speed_depth={L}", "anchor=0"]),
            "specprefill keep=1 self-draft L": ("specprefill", ["keep=1", f"draft_layers={L}"]),
            "specprefill keep=1 short self-draft": ("specprefill", ["keep=1", "draft_layers=1"]),
            "specprefill keep=1 --draft same": ("specprefill", ["keep=1", "lookahead=3"], model)}


def check_identity(model, ids, variants, tmp_path, n_greedy):
    want, want_gen = tool(model, ids, greedy=n_greedy, tmp=tmp_path)
    for name, (strategy, sets, *draft) in variants.items():
        got, gen = tool(model, ids, strategy, sets, *draft, greedy=n_greedy, tmp=tmp_path)
        assert rel_err(got, want) <= ID_TOL, name
        assert gen == want_gen, name


def test_identity_tiny(tiny, tmp_path):
    check_identity(tiny, tiny_ids(150), identity_variants(tiny, L_TINY), tmp_path, N_GEN)


@need_model
def test_identity_default_model(tmp_path):
    ids = [int(i) for i in np.random.default_rng(1).integers(3, 49152, 300)]
    variants = identity_variants(MODEL, 30)
    for name in ("speed K=L anchor none", "specprefill keep=1 short self-draft"):
        del variants[name]   # the tiny model covers these
    variants["specprefill keep=1 self-draft L"][1].append("lookahead=2")   # time
    check_identity(MODEL, ids, variants, tmp_path, 3)


# ---- against the reference --------------------------------------------------------------------

@pytest.mark.parametrize("K,anchor", [(2, 1), (4, 1), (3, 0), (1, 1)])
def test_speed_matches_reference(tiny, ref, tmp_path, K, anchor):
    ids = tiny_ids(60, seed=K)
    got, gen = tool(tiny, ids, "speed", [f"speed_depth={K}", f"anchor={anchor}"], greedy=N_GEN,
                    tmp=tmp_path)
    want, want_gen = ref_greedy(ref, ids, range(len(ids)), len(ids), N_GEN,
                                speed_visible(K, len(ids), anchor))
    assert rel_err(got, want) <= REF_TOL
    assert gen == want_gen
    # and it is not full: the upper layers really lost the prompt
    assert rel_err(got, ref_pass(ref, ids, range(len(ids)))[0][-1]) > 1e-3


@pytest.mark.parametrize("keep,lookahead,chunk,depth,keep_last", [
    (0.3, 1, 16, 2, 1), (0.4, 4, 8, 3, 1), (0.5, 3, 32, 6, 1), (0.5, 8, 4, 2, 1), (0.3, 8, 2, 3, 1),
    (0.2, 8, 2, 6, 1), (0.3, 1, 16, 2, 0), (0.4, 4, 8, 3, 0), (0.5, 8, 4, 2, 0), (0.2, 8, 2, 6, 0)])
def test_specprefill_matches_reference(tiny, ref, tmp_path, keep, lookahead, chunk, depth,
                                       keep_last):
    ids = tiny_ids(100, seed=7)
    sets = [f"keep={keep}", f"lookahead={lookahead}", f"chunk={chunk}", f"draft_layers={depth}",
            f"keep_last={keep_last}"]
    got, gen = tool(tiny, ids, "specprefill", sets, greedy=N_GEN, tmp=tmp_path)
    kept = ref_specprefill(ref, ids, depth, lookahead, 13, chunk, keep, keep_last)
    assert len(kept) < len(ids)
    if not keep_last:   # the last prompt token is dropped: the first token comes from the last
        assert kept[-1] < len(ids) - 1   # kept row, and decoding still starts at position M
    want, want_gen = ref_greedy(ref, [ids[i] for i in kept], kept, len(ids), N_GEN)
    assert rel_err(got, want) <= REF_TOL
    assert gen == want_gen


def test_specprefill_lookahead_sampling(tiny, tmp_path):
    """Lookahead tokens follow the request's sampling: greedy at temperature 0 (as the spec),
    drawn at temperature > 0 by a generator seeded from the request's seed."""
    ids = tiny_ids(100, seed=7)
    sets = ["keep=0.3", "lookahead=8", "chunk=4", "draft_layers=3"]
    greedy, _ = tool(tiny, ids, "specprefill", sets, tmp=tmp_path)
    assert np.array_equal(tool(tiny, ids, "specprefill", sets, tmp=tmp_path, temp=0, seed=5)[0],
                          greedy)
    # the tiny model's next-token distributions are sharp: at temperature 1 every draw is the
    # argmax; at 20 they spread
    runs = {seed: tool(tiny, ids, "specprefill", sets, tmp=tmp_path, temp=20, seed=seed)[0]
            for seed in range(1, 5)}
    assert np.array_equal(tool(tiny, ids, "specprefill", sets, tmp=tmp_path, temp=20, seed=3)[0],
                          runs[3])   # a fixed seed repeats
    # the draws change what is kept, hence the first-token logits, for some seeds
    assert sum(rel_err(r, greedy) > 1e-3 for r in runs.values()) >= 2
    # and only through the lookahead: without it (N = 1) the seed changes nothing
    no_lookahead = ["keep=0.3", "lookahead=1", "chunk=4", "draft_layers=3"]
    base, _ = tool(tiny, ids, "specprefill", no_lookahead, tmp=tmp_path)
    for seed in (1, 2):
        got, _ = tool(tiny, ids, "specprefill", no_lookahead, tmp=tmp_path, temp=20, seed=seed)
        assert np.array_equal(got, base)


def test_specprefill_sampled_run_repeats(tiny, tmp_path):
    prompt, _ = byte_prompt(tmp_path, 100)
    flags = ["--strategy", "specprefill", "--chunk", 4, "--draft-layers", 3]
    r = sift("-m", tiny, "--json", "-q", "-n", N_GEN, "--temp", 20, "--seed", 11, "-f", prompt,
             *flags)
    again = sift("-m", tiny, "--json", "-q", "-n", N_GEN, "--temp", 20, "--seed", 11, "-f",
                 prompt, *flags)
    assert r.returncode == 0 and again.returncode == 0, r.stderr + again.stderr
    a, b = json.loads(r.stdout), json.loads(again.stdout)
    assert (a["text"], a["rows_processed"], a["kv_bytes"]) == \
        (b["text"], b["rows_processed"], b["kv_bytes"])


# ---- measured KV bytes and rows ----------------------------------------------------------------

def byte_prompt(tmp_path, n):
    """A text the tiny tokenizer maps to one token per byte (no 't', 'h', 'e': no merges)."""
    text = ("abcdfgijklmnopqrsuvwxyz" * 20)[:n]
    p = tmp_path / "prompt.txt"
    p.write_text(text)
    return p, [3 + b for b in text.encode()]


def run_json(tiny, prompt, *flags):
    r = sift("-m", tiny, "--json", "-q", "-n", N_GEN, "--temp", 0, "-f", prompt, *flags)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# elem: bytes of a cached element, 2 in the CPU's default f16 cache, 4 with -ctk/-ctv f32
F32 = ("-ctk", "f32", "-ctv", "f32")


@pytest.mark.parametrize("K,anchor,cache,elem", [(2, "bos", (), 2), (5, "bos", (), 2),
                                                 (3, "none", (), 2), (L_TINY, "bos", (), 2),
                                                 (2, "bos", F32, 4)])
def test_speed_kv_bytes_and_rows(tiny, ref, tmp_path, K, anchor, cache, elem):
    prompt, ids = byte_prompt(tmp_path, 90)
    j = run_json(tiny, prompt, "--strategy", "speed", "--speed-depth", K, "--anchor", anchor,
                 *cache)
    N, L, A = len(ids), L_TINY, int(anchor == "bos")
    assert j["timings"]["prompt_n"] == N
    assert j["kv_bytes"] == 2 * ref.n_kv * ref.head_dim * elem * (
        K * (N + N_GEN) + (L - K) * (A + 1 + N_GEN))
    assert j["rows_processed"] == K * N + (L - K) * (A + 1)


def test_speed_default_depth(tiny, tmp_path):
    prompt, ids = byte_prompt(tmp_path, 90)
    j = run_json(tiny, prompt, "--strategy", "speed")   # ceil(0.875 * 6) = 6 = L: full
    assert j["rows_processed"] == len(ids) * L_TINY


def ref_lookahead(m, ids, depth, lookahead):
    """The self-draft's greedy lookahead tokens (step B, before any end of generation)."""
    toks = list(ids)
    for _ in range(lookahead - 1):
        toks.append(int(np.argmax(ref_pass(m, toks, range(len(toks)), depth=depth)[0][-1])))
    return toks[len(ids):]


@pytest.mark.parametrize("keep,chunk,lookahead,keep_last", [(1, 32, 1, "on"), (0.3, 16, 1, "on"),
                                                            (0.5, 8, 1, "on"), (0.3, 16, 4, "on"),
                                                            (0.3, 16, 4, "off")])
def test_specprefill_kv_bytes_and_rows(tiny, ref, tmp_path, keep, chunk, lookahead, keep_last):
    prompt, ids = byte_prompt(tmp_path, 100)
    # The chunks kept follow the self-draft's attention, which the float64 reference below
    # recomputes: an fp32 cache (4 bytes an element) keeps that comparison to the strategy, not
    # the cache's rounding; keep = 1 keeps every chunk whatever the scores, so it runs on the
    # default f16 cache (2 bytes).
    cache, elem = ((), 2) if keep == 1 else (F32, 4)
    j = run_json(tiny, prompt, "--strategy", "specprefill", "--keep", keep, "--chunk", chunk,
                 "--lookahead", lookahead, "--draft-layers", 2, "--keep-last", keep_last, *cache)
    kept = ref_specprefill(ref, ids, 2, lookahead, 13, chunk, keep, keep_last == "on")
    if keep == 1:
        assert len(kept) == len(ids)
    assert 2 not in ref_lookahead(ref, ids, 2, lookahead)   # no end of text: all N-1 steps run
    # the self-draft: M prompt rows and N-1 lookahead rows through its 2 layers; then the main
    # model's kept rows through all 6
    draft = 2 * (len(ids) + lookahead - 1)
    assert j["rows_processed"] == draft + len(kept) * L_TINY
    assert j["kv_bytes"] == 2 * ref.n_kv * ref.head_dim * elem * L_TINY * (len(kept) + N_GEN)
    assert j["note"] == f"self-draft: first 2 of {L_TINY} layers"
    assert j["settings"]["keep_last"] == keep_last   # by its name, as the flag takes it


def test_specprefill_draft_rows_in_main_model_layer_rows(tiny, ref, tmp_path):
    """A --draft of another shape (same tokenizer): its layer rows count at its FLOPs per row and
    layer (model/cost.h: 2 (d qd + 2 d kvd + qd d + 3 d d_ff)) over the main model's."""
    draft = tiny_gguf.write(str(tmp_path / "draft-small.gguf"), n_layer=2, d=32, n_head=2, n_kv=1,
                            ff=48, ctx=512, seed=9)
    prompt, ids = byte_prompt(tmp_path, 100)
    j = run_json(tiny, prompt, "--strategy", "specprefill", "--draft", draft, "--lookahead", 1,
                 "--keep", 1)

    def flops(d, qd, kvd, ff):
        return 2 * (d * qd + 2 * d * kvd + qd * d + 3 * d * ff)
    main = flops(ref.d, ref.n_head * ref.head_dim, ref.n_kv * ref.head_dim, ref.ffn)
    small = flops(32, 32, 16, 48)
    assert (ref.d, ref.ffn) == (64, 128) and small < main
    draft_rows = math.floor(2 * len(ids) * small / main + 0.5)   # its 2 layers, no lookahead
    assert j["rows_processed"] == draft_rows + len(ids) * L_TINY
    assert j["note"] == "draft: draft-small.gguf"


def test_specprefill_default_draft_is_half_of_the_layers(tiny, ref, tmp_path):
    ids = tiny_ids(100, seed=7)
    got, _ = tool(tiny, ids, "specprefill", ["keep=0.3", "chunk=4", "lookahead=1"], tmp=tmp_path)
    kept = ref_specprefill(ref, ids, math.ceil(L_TINY / 2), 1, 13, 4, 0.3)
    others = [ref_specprefill(ref, ids, d, 1, 13, 4, 0.3) for d in (1, L_TINY)]
    assert kept not in others   # the check below can tell the depths apart
    want = ref_pass(ref, [ids[i] for i in kept], kept)[0][-1]
    assert rel_err(got, want) <= REF_TOL


def test_specprefill_short_prompt_runs_full(tiny, tmp_path):
    prompt, ids = byte_prompt(tmp_path, 32)
    j = run_json(tiny, prompt, "--strategy", "specprefill", "--keep", 0.1, "--draft-layers", 2)
    assert j["rows_processed"] == len(ids) * L_TINY
    assert "ran full" in j["note"]


# ---- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("flags,needles", [
    (["--strategy", "speed", "--speed-depth", L_TINY + 1], ["--speed-depth 7", "6 layers"]),
    (["--strategy", "full,specprefill", "--draft-layers", L_TINY + 1],
     ["--draft-layers 7", "6 layers"]),
])
def test_bad_parameters_refused(tiny, flags, needles):
    r = sift("-m", tiny, "-p", "abc", "-n", 2, *flags)
    assert r.returncode == 2 and "error" in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


@need_model
def test_draft_other_vocabulary_refused(tiny, tmp_path):
    r = sift("-m", MODEL, "--draft", tiny, "--strategy", "specprefill", "-p", "hi", "-n", 2)
    assert r.returncode > 0 and "error" in r.stderr and "vocabulary" in r.stderr, r.stderr
    # without main.c's tokenizer comparison (tool_logits), the strategy still refuses prompt
    # tokens the draft's embedding has no row for
    r = subprocess.run([str(TOOL), str(MODEL), str(tmp_path / "o.f32"), "--strategy",
                        "specprefill", "--set", "keep=1", "--draft", str(tiny)] +
                       [str(i) for i in range(1000, 1040)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "vocabulary" in r.stderr, r.stderr

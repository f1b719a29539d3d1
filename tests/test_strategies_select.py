"""fastkv, snapkv and streamingllm (specs/fastkv.md) end to end.

* Identity: fastkv with tsp_rate = kv_rate = 1, snapkv and streamingllm with kv_rate = 1 give
  full's first-token logits (<= 1e-5 relative) and full's greedy continuation; on a tiny model
  and on the default model with a ~300-token prompt.
* Compression happens after each layer's attention, so it changes decode only: snapkv's and
  streamingllm's first-token logits equal full's at any kv_rate, and so do fastkv's with
  tsp_rate = 1.
* An independent float64 numpy reference of the three strategies (window-softmax scores, max- or
  average-pooled per head as the FastKV authors' F.max_pool1d / F.avg_pool1d with padding k//2,
  per-KV-group top-k plus window, TSP, rate or fixed (--kv-len, --tsp-len) budgets, sinks +
  recent), written here from the spec on top of ref_llama's weights: sift's first-token logits
  (<= 1e-4) and greedy ids match.
* The KV bytes and prompt rows `sift --json` reports equal the spec's formulas, computed here:
  B_l = floor(n_l * rho_l) or the fixed --kv-len, bytes = sum_l 2 * n_kv * head_dim * e *
  (min(B_l, n_l) + n_gen) with e the cache's bytes per element (the CPU's default f16: 2; f32: 4), rows = (L_TSP + 1) * N + (L - L_TSP - 1) * T; too-short prompts run
  uncompressed with a note, and so do prompts that fit the fixed budgets.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ref_llama  # noqa: E402  (sets numpy's BLAS to one thread)
import tiny_gguf  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIFT = ROOT / "sift"
TOOL = ROOT / "build" / "tests" / "tool_logits"
MODEL = Path(os.environ.get("SIFT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL
L_TINY, N_KV, HD = 4, 2, 16
SINKS = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny_gguf model with Q, K and the attention output scaled by 2: peaked attention, so
    what a layer's cache keeps changes what decode generates (with tiny_gguf's scales the greedy
    ids hardly depend on the context)."""
    add = gguf.GGUFWriter.add_tensor

    def scaled(self, name, arr, *a, **k):
        if name.endswith(("attn_q.weight", "attn_k.weight", "attn_output.weight")):
            arr = (arr * 2).astype(np.float32)
        return add(self, name, arr, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.GGUFWriter, "add_tensor", scaled)
        return tiny_gguf.write(str(tmp_path_factory.mktemp("m") / "tiny.gguf"), n_layer=L_TINY,
                               d=64, n_head=4, n_kv=N_KV, ff=128, ctx=512)


def ids_for(n, seed=1, vocab=262):
    return [int(i) for i in np.random.default_rng(seed).integers(3, vocab, n)]


def tool(model, ids, tmp_path, strategy=None, greedy=0, **sets):
    out = tmp_path / "logits.f32"
    args = [str(TOOL), str(model), str(out)]
    if greedy:
        args += ["--greedy", str(greedy)]
    if strategy:
        args += ["--strategy", strategy]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    # a tiny model runs faster on one thread (much faster on a busy machine)
    env = None if Path(model) == MODEL else dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(args + [str(i) for i in ids], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stderr
    logits = np.fromfile(out, dtype=np.float32)
    return logits, [int(t) for t in r.stdout.split()]


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def full_last(model, ids, tmp_path):
    all_rows, _ = tool(model, ids, tmp_path)
    return all_rows.reshape(len(ids), -1)[-1]


IDENTITY = [("fastkv", {"tsp_rate": 1, "kv_rate": 1}), ("snapkv", {"kv_rate": 1}),
            ("streamingllm", {"kv_rate": 1})]


def test_identity_tiny(tiny, tmp_path):
    ids = ids_for(150)
    full = full_last(tiny, ids, tmp_path)
    _, full_greedy = tool(tiny, ids, tmp_path, "full", greedy=8)
    for name, sets in IDENTITY:
        logits, greedy = tool(tiny, ids, tmp_path, name, greedy=8, **sets)
        assert rel(logits, full) <= 1e-5, name
        assert greedy == full_greedy, name


def test_compression_changes_decode_only(tiny, tmp_path):
    ids = ids_for(200, seed=2)
    full = full_last(tiny, ids, tmp_path)
    for name, sets in [("snapkv", {}), ("streamingllm", {}), ("fastkv", {"tsp_rate": 1})]:
        logits, _ = tool(tiny, ids, tmp_path, name, **sets)
        assert rel(logits, full) <= 1e-5, name
    logits, _ = tool(tiny, ids, tmp_path, "fastkv")   # TSP changes the upper layers' rows
    assert rel(logits, full) > 1e-3


@pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched")
def test_identity_default_model(tmp_path):
    """fastkv keeping everything == full; snapkv at its default rate scores and compresses every
    layer of the real model, and its prefill logits still equal full's. (Each run loads the
    model: about 6 s on 2 cores.)"""
    ids = ids_for(300, seed=3, vocab=49152)
    full, _ = tool(MODEL, ids, tmp_path, "full")
    for name, sets in [("fastkv", {"tsp_rate": 1, "kv_rate": 1}), ("snapkv", {})]:
        logits, _ = tool(MODEL, ids, tmp_path, name, **sets)
        assert rel(logits, full) <= 1e-5, name


# ---- independent float64 reference ------------------------------------------------------------

def f32_budget(n, rate):
    """floor(n * rate) with a float32 rate, multiplied in float32 (as the spec's budgets)."""
    return int(np.floor(np.float32(n) * np.float32(rate)))


def topk_plus_window(score, n, w, k):
    """top (k - w) of score over [0, n - w), ties to the lower index, plus the window; ascending."""
    top = np.argsort(-score, kind="stable")[: k - w]
    return np.concatenate([np.sort(top), np.arange(n - w, n)])


def window_pooled(p, w, kernel, pool=0):
    """p [heads, n, n] attention probabilities -> pooled window scores [heads, n - w]: pool 0
    max over the kernel's span clipped to [0, n - w); pool 1 the kernel's sum with zero padding
    over the kernel (torch's avg_pool1d, count_include_pad)."""
    n = p.shape[-1]
    s = p[:, n - w:, : n - w].sum(axis=1)
    r = kernel // 2
    if pool == 1:
        padded = np.pad(s, ((0, 0), (r, r)))
        return np.stack([[padded[h, j: j + kernel].sum() / kernel for j in range(n - w)]
                         for h in range(s.shape[0])])
    return np.stack([[s[h, max(0, j - r): j + r + 1].max() for j in range(n - w)]
                     for h in range(s.shape[0])])


def kv_budget(strategy, li, n, n_all, l_tsp, tsp_rate, kv_rate, kv_len, tsp_len):
    """B_l of layer li running n of the prompt's n_all rows: the fixed kv_len; else fastkv's
    floor(n R_KV) up to L_TSP and above it floor(n R_KV / R_TSP) (floor(N R_KV) with a fixed
    tsp_len); snapkv's and streamingllm's floor(N R_KV)."""
    if kv_len:
        return kv_len
    if strategy != "fastkv":
        return f32_budget(n_all, kv_rate)
    if li <= l_tsp:
        return f32_budget(n, kv_rate)
    if tsp_len:
        return f32_budget(n_all, kv_rate)
    return f32_budget(n, np.float32(kv_rate) / np.float32(tsp_rate))


def reference(m, ids, strategy, n_gen, tsp_layer=-1, tsp_rate=0.2, kv_rate=0.1, window=8,
              pool_kernel=7, pool=0, kv_len=0, tsp_len=0):
    """First-token logits and n_gen greedy ids of `strategy`, float64, from the spec."""
    n_all, L, w = len(ids), m.n_layer, window
    group = m.n_head // m.n_kv
    l_tsp = tsp_layer if tsp_layer >= 0 else max(L // 2 - 1, 0)
    t = (tsp_len or f32_budget(n_all, tsp_rate)) if strategy == "fastkv" else n_all
    x, pos, cache = m.tok_embd[ids].copy(), np.arange(n_all), []
    for li, ly in enumerate(m.layers):
        n = len(pos)
        h = ref_llama._rmsnorm(x, ly.attn_norm, m.eps)
        q = ref_llama._rope(m, ref_llama._linear(h, ly.wq, ly.bq).reshape(n, m.n_head, -1), pos)
        k = ref_llama._rope(m, ref_llama._linear(h, ly.wk, ly.bk).reshape(n, m.n_kv, -1), pos)
        v = ref_llama._linear(h, ly.wv, ly.bv).reshape(n, m.n_kv, -1)
        kq = np.repeat(k, group, axis=1)
        s = np.einsum("ihd,jhd->hij", q, kq) / np.sqrt(m.head_dim)
        s = np.where(pos[None, None, :] <= pos[None, :, None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = np.einsum("hij,jhd->ihd", p, np.repeat(v, group, axis=1)).reshape(n, -1)
        # KV compression: per KV head g, kept entry indices sel[g]
        b = kv_budget(strategy, li, n, n_all, l_tsp, tsp_rate, kv_rate, kv_len, tsp_len)
        sel = [np.arange(n)] * m.n_kv
        if strategy in ("fastkv", "snapkv"):
            pooled = window_pooled(p, w, pool_kernel, pool)
            if b < n:
                sel = [topk_plus_window(pooled[g * group:(g + 1) * group].sum(0), n, w, max(b, w))
                       for g in range(m.n_kv)]
        elif b < n:
            sel = [np.concatenate([np.arange(SINKS), np.arange(n - b + SINKS, n)])] * m.n_kv
        cache.append([[k[sel[g], g] for g in range(m.n_kv)], [v[sel[g], g] for g in range(m.n_kv)]])
        x = x + ref_llama._linear(o, ly.wo)
        h = ref_llama._rmsnorm(x, ly.ffn_norm, m.eps)
        x = x + ref_llama._linear(ref_llama._silu(ref_llama._linear(h, ly.w_gate)) *
                                  ref_llama._linear(h, ly.w_up), ly.w_down)
        if strategy == "fastkv" and li == l_tsp and t < n:   # TSP
            rows = topk_plus_window(pooled.sum(0), n, w, t)
            x, pos = x[rows], pos[rows]
    logits = ref_llama._linear(ref_llama._rmsnorm(x[-1:], m.out_norm, m.eps), m.lm_head)[0]
    first, out = logits, [int(np.argmax(logits))]
    for step in range(n_gen - 1):   # plain decode over the compressed caches, position N + t
        p_now = np.array([n_all + step])
        x = m.tok_embd[[out[-1]]].copy()
        for li, ly in enumerate(m.layers):
            h = ref_llama._rmsnorm(x, ly.attn_norm, m.eps)
            q = ref_llama._rope(m, ref_llama._linear(h, ly.wq, ly.bq).reshape(1, m.n_head, -1),
                                p_now)
            k = ref_llama._rope(m, ref_llama._linear(h, ly.wk, ly.bk).reshape(1, m.n_kv, -1), p_now)
            v = ref_llama._linear(h, ly.wv, ly.bv).reshape(1, m.n_kv, -1)
            ks, vs = cache[li]
            for g in range(m.n_kv):
                ks[g], vs[g] = np.concatenate([ks[g], k[:, g]]), np.concatenate([vs[g], v[:, g]])
            o = []
            for hh in range(m.n_head):
                g = hh // group
                a = ks[g] @ q[0, hh] / np.sqrt(m.head_dim)
                a = np.exp(a - a.max())
                o.append((a / a.sum()) @ vs[g])
            x = x + ref_llama._linear(np.concatenate(o)[None], ly.wo)
            h = ref_llama._rmsnorm(x, ly.ffn_norm, m.eps)
            x = x + ref_llama._linear(ref_llama._silu(ref_llama._linear(h, ly.w_gate)) *
                                      ref_llama._linear(h, ly.w_up), ly.w_down)
        logits = ref_llama._linear(ref_llama._rmsnorm(x, m.out_norm, m.eps), m.lm_head)[0]
        out.append(int(np.argmax(logits)))
    return first, out


CASES = [("fastkv", {}), ("snapkv", {}), ("streamingllm", {}),
         ("fastkv", {"tsp_layer": 0, "tsp_rate": 0.3, "kv_rate": 0.15, "window": 4,
                     "pool_kernel": 5}),
         ("snapkv", {"kv_rate": 0.3, "window": 16, "pool_kernel": 3}),
         ("streamingllm", {"kv_rate": 0.05}),
         # average pooling (the authors' F.avg_pool1d, zero padding)
         ("fastkv", {"pool": 1}), ("snapkv", {"pool": 1, "kv_rate": 0.2, "pool_kernel": 5}),
         # fixed budgets: both; KV alone (T from the rate); T alone (floor(N R_KV) above L_TSP);
         # a prompt that fits --kv-len (TSP only); snapkv's
         ("fastkv", {"kv_len": 24, "tsp_len": 50}),
         ("fastkv", {"kv_len": 30, "pool": 1, "window": 4}),
         ("fastkv", {"tsp_len": 60, "kv_rate": 0.15, "tsp_layer": 2}),
         ("fastkv", {"kv_len": 250, "tsp_len": 60}),
         ("snapkv", {"kv_len": 33, "window": 5})]


@pytest.mark.parametrize("name,sets", CASES)
def test_against_reference(tiny, tmp_path, name, sets):
    m = ref_llama.load(tiny)
    ids = ids_for(200, seed=4)
    logits, greedy = tool(tiny, ids, tmp_path, name, greedy=16, **sets)
    ref_first, ref_greedy = reference(m, ids, name, 16, **sets)
    assert rel(logits, ref_first) <= 1e-4
    assert greedy == ref_greedy


# ---- KV bytes and rows: the spec's formulas ---------------------------------------------------

def sift_json(model, text, tmp_path, strategy, n_gen, *flags):
    f = tmp_path / "prompt.txt"
    f.write_text(text)
    r = subprocess.run([str(SIFT), "-m", str(model), "--strategy", strategy, "--json", "-q",
                        "-n", str(n_gen), "--temp", "0", "-t", "1", "-f", str(f), *flags],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[0])


def expected(strategy, n, n_gen, tsp_layer=1, tsp_rate=0.2, kv_rate=0.1, window=8, kv_len=0,
             tsp_len=0, elem=2):
    """(kv_bytes, rows) from the spec: per-layer budgets and row counts; elem bytes per cached
    element (2: the CPU's default f16 cache)."""
    t = tsp_len or f32_budget(n, tsp_rate)
    lengths, rows = [], 0
    for li in range(L_TINY):
        n_l = n if strategy != "fastkv" or li <= tsp_layer or t >= n else t
        b = kv_budget(strategy, li, n_l, n, tsp_layer, tsp_rate, kv_rate, kv_len, tsp_len)
        if strategy == "fastkv":
            b = max(b, window)
        lengths.append(min(b, n_l))
        rows += n_l
    return sum(2 * N_KV * HD * elem * (b + n_gen) for b in lengths), rows


TEXT = ("Sift reads a prompt, runs one strategy over a small model and prints what it wrote. "
        "Every layer keeps a budget of keys and values; fastkv also drops most rows halfway up. "
        "A window of eight recent rows votes on which earlier rows matter most to the answer.")


@pytest.mark.parametrize("strategy,flags,params", [
    ("fastkv", [], {}),
    ("fastkv", ["--tsp-layer", "2", "--tsp-rate", "0.3", "--kv-rate", "0.07"],
     {"tsp_layer": 2, "tsp_rate": 0.3, "kv_rate": 0.07}),
    ("fastkv", ["--kv-len", "20", "--tsp-len", "64"], {"kv_len": 20, "tsp_len": 64}),
    ("fastkv", ["--tsp-len", "64", "--kv-rate", "0.15", "--pool", "avg"],
     {"tsp_len": 64, "kv_rate": 0.15}),
    ("snapkv", [], {}),
    ("snapkv", ["--kv-rate", "0.25"], {"kv_rate": 0.25}),
    ("snapkv", ["--kv-len", "40", "--pool", "avg"], {"kv_len": 40}),
    ("streamingllm", [], {}),
    ("streamingllm", ["--kv-rate", "0.5"], {"kv_rate": 0.5}),
    # an f32 cache asked for: 4 bytes an element
    ("fastkv", ["-ctk", "f32", "-ctv", "f32"], {"elem": 4}),
    ("snapkv", ["--kv-rate", "0.25", "-ctk", "f32", "-ctv", "f32"], {"kv_rate": 0.25, "elem": 4}),
])
def test_kv_bytes_and_rows(tiny, tmp_path, strategy, flags, params):
    j = sift_json(tiny, TEXT, tmp_path, strategy, 4, *flags)
    n = j["timings"]["prompt_n"]
    assert n > 200
    kv, rows = expected(strategy, n, 4, **params)
    assert j["kv_bytes"] == kv
    assert j["rows_processed"] == rows
    assert j["note"] == ""
    cache = flags[flags.index("-ctk"):] if "-ctk" in flags else []   # full with the same cache
    full = sift_json(tiny, TEXT, tmp_path, "full", 4, *cache)
    assert j["kv_bytes"] < full["kv_bytes"]


@pytest.mark.parametrize("strategy", ["fastkv", "snapkv", "streamingllm"])
def test_short_prompt_runs_uncompressed(tiny, tmp_path, strategy):
    j = sift_json(tiny, "a short prompt", tmp_path, strategy, 4)
    full = sift_json(tiny, "a short prompt", tmp_path, "full", 4)
    assert "too short" in j["note"] and strategy in j["note"]
    assert j["kv_bytes"] == full["kv_bytes"] and j["rows_processed"] == full["rows_processed"]
    assert j["text"] == full["text"]


@pytest.mark.parametrize("strategy,flags,says", [
    ("fastkv", ["--kv-len", "5000", "--tsp-len", "5000"], "fits --kv-len and --tsp-len: ran it "
     "without compression"),
    ("snapkv", ["--kv-len", "5000"], "fits --kv-len 5000: ran it without compression"),
])
def test_prompt_fitting_fixed_budgets_runs_uncompressed(tiny, tmp_path, strategy, flags, says):
    j = sift_json(tiny, TEXT, tmp_path, strategy, 4, *flags)
    full = sift_json(tiny, TEXT, tmp_path, "full", 4)
    assert says in j["note"]
    assert j["kv_bytes"] == full["kv_bytes"] and j["rows_processed"] == full["rows_processed"]
    assert j["text"] == full["text"]


@pytest.mark.parametrize("strategy,flags,says", [
    ("fastkv", ["--kv-len", "8"], "--kv-len 8 must exceed --window 8"),
    ("fastkv", ["--tsp-len", "3", "--window", "4"], "--tsp-len 3 must exceed --window 4"),
    ("snapkv", ["--kv-len", "16", "--window", "16"], "--kv-len 16 must exceed --window 16"),
    ("fastkv", ["--pool", "mean"], "--pool must be max or avg, not 'mean'"),
])
def test_fixed_budget_and_pool_errors(tiny, tmp_path, strategy, flags, says):
    f = tmp_path / "p.txt"
    f.write_text(TEXT)
    r = subprocess.run([str(SIFT), "-m", str(tiny), "--strategy", strategy, *flags, "-f", str(f),
                        "-n", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode > 0 and says in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_tsp_layer_out_of_range(tiny, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text(TEXT)
    r = subprocess.run([str(SIFT), "-m", str(tiny), "--strategy", "fastkv", "--tsp-layer", "4",
                        "-f", str(f), "-n", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode > 0 and "--tsp-layer 4" in r.stderr and "4 layers" in r.stderr

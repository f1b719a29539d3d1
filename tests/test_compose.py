"""Composed strategies PREFILL+DECODE (policies/compose.c), against independent references.

* Identities (build/tests/tool_logits --greedy --steps: greedy ids and every generated token's
  logits): X+topk with a top-K covering every kept entry (--topk 1000000) decodes as X alone for
  each prefill strategy X; a small top-K does not (so the decode hooks really run); full+topk is
  topk and full+topk+phi is topk+phi bit for bit, and on the command line (text, rows, KV bytes).
* An independent float64 numpy reference of fastkv+topk (and snapkv+topk, and topk alone =
  full+topk) written here from specs/fastkv.md and specs/topk-phi.md on ref_llama's weights: the
  prefill's per-KV-head kept sets, then top-K decode over each head's kept entries (sink / tail /
  mid by entry index within the head's entries, top-K per QUERY head by q.k/sqrt(d), query head h
  reading KV head h // (H / H_kv)), sift's greedy ids forced. The case is built so that the kept
  sets differ per KV head and K is smaller than every layer's mid region (asserted), and wrong
  readings computed in numpy (head 0's kept set for every head; a top-K per KV head instead of per
  query head; no selection at all) are asserted to disagree with sift, so the test can fail.
* Refusals (exit 2, one line naming why), refused compositions in --prompts lines become error
  records, and a composed strategy's JSON settings echo both parts' parameters.

Tolerances: sift runs in fp32, the reference in float64. Logit rows are compared as max |diff| /
max |ref| <= 1e-4 (DESIGN.md's fp32-vs-float64 bound; measured ~1e-6 here). The identities
compare two fp32 runs of sift that differ only in summation order (the selected attention sums
top-K, sink, then tail and decode entries; plain attention sums in cache order): <= 1e-5
(measured < 1e-6).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ref_llama  # noqa: E402
import test_strategies_select as tss  # noqa: E402  (its tiny model, tool runner, fastkv helpers)
from test_strategies_select import tiny  # noqa: E402,F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent
SIFT = ROOT / "sift"
TOOL = ROOT / "build" / "tests" / "tool_logits"
REF_TOL = 1e-4      # fp32 sift vs float64 numpy
SAME_TOL = 1e-5     # fp32 vs fp32, another summation order
N_GEN = 6


def steps(model, ids, tmp_path, strategy, n_gen=N_GEN, **sets):
    """sift's greedy ids and the logits (n_gen, vocab) each was chosen from."""
    out, rows = tmp_path / "first.f32", tmp_path / "steps.f32"
    args = [str(TOOL), str(model), str(out), "--greedy", str(n_gen), "--steps", str(rows),
            "--strategy", strategy]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    r = subprocess.run(args + [str(i) for i in ids], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    toks = [int(t) for t in r.stdout.split()]
    logits = np.fromfile(rows, dtype=np.float32).reshape(n_gen, -1)
    first = np.fromfile(out, dtype=np.float32)
    assert np.array_equal(first, logits[0])
    assert toks == [int(np.argmax(row)) for row in logits]
    return toks, logits


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# ---- identities -------------------------------------------------------------------------------

PREFILLS = [("speed", {"speed_depth": 2}), ("fastkv", {}), ("fastkv", {"kv_rate": 0.25}),
            ("snapkv", {}), ("streamingllm", {}), ("specprefill", {"keep": 0.5, "chunk": 16}),
            ("swiftkv", {}), ("swiftkv", {"swiftkv_layers": 2, "swiftkv_group": 2})]


@pytest.mark.parametrize("name,sets", PREFILLS)
def test_topk_covering_everything_is_the_prefill_alone(tiny, tmp_path, name, sets):
    ids = tss.ids_for(200, seed=4)
    alone_ids, alone = steps(tiny, ids, tmp_path, name, **sets)
    wide = dict(sets, topk=1000000, sink=1, tail=2)
    got_ids, got = steps(tiny, ids, tmp_path, name + "+topk", **wide)
    assert got_ids == alone_ids
    assert np.array_equal(got[0], alone[0])   # the first token is the prefill's
    for t in range(1, N_GEN):
        assert rel(got[t], alone[t]) <= SAME_TOL, t
    # the hooks run: a top-2 reads less and decodes otherwise
    _, narrow = steps(tiny, ids, tmp_path, name + "+topk", **dict(sets, topk=2, sink=1, tail=2))
    assert np.array_equal(narrow[0], alone[0])
    assert max(rel(narrow[t], alone[t]) for t in range(1, N_GEN)) > 100 * SAME_TOL


@pytest.mark.parametrize("decode", ["topk", "topk+phi"])
@pytest.mark.parametrize("sets", [{"topk": 5, "sink": 2, "tail": 4}, {}])
def test_full_plus_decode_is_decode_alone(tiny, tmp_path, decode, sets):
    ids = tss.ids_for(150, seed=5)
    a_ids, a = steps(tiny, ids, tmp_path, decode, **sets)
    b_ids, b = steps(tiny, ids, tmp_path, "full+" + decode, **sets)
    assert a_ids == b_ids and np.array_equal(a, b)
    _, full = steps(tiny, ids, tmp_path, "full")   # and it is not full (the first query is topk's)
    assert rel(a[0], full[0]) > 100 * SAME_TOL


@pytest.mark.parametrize("decode", ["topk", "topk+phi"])
def test_full_plus_decode_on_a_short_prompt(tiny, tmp_path, decode):
    """A prompt too short for the regions (N - 1 <= sink + tail): the decode strategy alone runs
    full and says so; full+Y does the same, bit for bit, with the same note."""
    ids = tss.ids_for(10, seed=6)
    a_ids, a = steps(tiny, ids, tmp_path, decode)
    b_ids, b = steps(tiny, ids, tmp_path, "full+" + decode)
    assert a_ids == b_ids and np.array_equal(a, b)
    for name in (decode, "full+" + decode):
        r = sift(tiny, "--strategy", name, "--json", "-q", "-n", 4, "--temp", 0, "-p", "short one")
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout.splitlines()[0])
        assert "has no mid region" in j["note"] and "ran full" in j["note"], j["note"]


def sift(model, *args, text=None, tmp_path=None):
    cmd = [str(SIFT), "-m", str(model), "-t", "1", *map(str, args)]
    if text is not None:
        f = tmp_path / "prompt.txt"
        f.write_text(text)
        cmd += ["-f", str(f)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


TEXT = ("Sift reads a prompt, runs one strategy over a small model and prints what it wrote. "
        "Every layer keeps a budget of keys and values; fastkv also drops most rows halfway up. "
        "A window of eight recent rows votes on which earlier rows matter most to the answer.")


def record(model, strategy, tmp_path, *flags):
    r = sift(model, "--strategy", strategy, "--json", "-q", "-n", 6, "--temp", 0, *flags,
             text=TEXT, tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[0])


@pytest.mark.parametrize("decode", ["topk", "topk+phi"])
def test_full_plus_decode_on_the_command_line(tiny, tmp_path, decode):
    a = record(tiny, decode, tmp_path, "--topk", 6, "--sink", 2, "--tail", 8)
    b = record(tiny, "full+" + decode, tmp_path, "--topk", 6, "--sink", 2, "--tail", 8)
    assert a["timings"]["prompt_n"] > 200
    for key in ("text", "rows_processed", "kv_bytes", "settings"):
        assert a[key] == b[key], key
    assert b["strategy"] == "full+" + decode
    n = a["timings"]["prompt_n"]
    assert a["rows_processed"] == tss.L_TINY * n   # N - 1 prefilled rows + the first query's


# ---- refusals and settings ---------------------------------------------------------------------

REFUSED = [("fastkv+speed", "two prefill strategies do not compose"),
           ("topk+fastkv", "the decode strategy goes second (fastkv+topk)"),
           ("fastkv+full", "decoding with full attention is what fastkv does alone"),
           ("topk+topk", "two decode strategies do not compose"),
           ("topk+phi+topk", "two decode strategies do not compose")]


@pytest.mark.parametrize("name,why", REFUSED)
def test_refused_composition(tiny, tmp_path, name, why):
    r = sift(tiny, "--strategy", name, "-n", 2, text=TEXT, tmp_path=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("sift: error:"), r.stderr
    assert name in r.stderr and why in r.stderr, r.stderr


def test_unknown_part_is_not_a_refusal(tiny, tmp_path):
    r = sift(tiny, "--strategy", "fastkv+nope", "-n", 2, text=TEXT, tmp_path=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "unknown strategy 'fastkv+nope'" in r.stderr


def test_refused_composition_in_prompts_file(tiny, tmp_path):
    lines = [{"id": "ok", "prompt": "hello there", "strategy": "fastkv+topk"}] + \
            [{"id": f"bad{i}", "prompt": "hello there", "strategy": name}
             for i, (name, _) in enumerate(REFUSED)]
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = sift(tiny, "--prompts", p, "--json", "-q", "-n", 3, "--temp", 0, "--summary", tmp_path / "s.json")
    assert r.returncode != 0   # some requests failed
    out = [json.loads(x) for x in r.stdout.splitlines()]
    recs = {j["id"]: j for j in out if "id" in j}
    assert set(recs) == {x["id"] for x in lines}
    assert json.loads((tmp_path / "s.json").read_text())["failed"] == len(REFUSED)
    assert "error" not in recs["ok"] and recs["ok"]["strategy"] == "fastkv+topk"
    for i, (name, why) in enumerate(REFUSED):
        e = recs[f"bad{i}"]["error"]
        assert f"line {i + 2}" in e and name in e and why in e, e


FASTKV_KEYS = {"tsp_layer", "tsp_rate", "kv_rate", "window", "pool_kernel", "pool", "kv_len",
               "tsp_len"}
TOPK_KEYS = {"sink", "tail", "topk", "budget", "selector", "page_size", "pages", "selector_recall"}
SPEC_KEYS = {"keep", "lookahead", "chunk", "spec_pool", "draft", "draft_layers", "keep_last"}


@pytest.mark.parametrize("strategy,keys,flags,values", [
    ("fastkv+topk", FASTKV_KEYS | TOPK_KEYS,
     ["--kv-rate", "0.25", "--tsp-layer", "2", "--topk", "7", "--sink", "3", "--tail", "5"],
     {"kv_rate": 0.25, "tsp_layer": 2, "topk": 7, "sink": 3, "tail": 5, "tsp_rate": 0.2}),
    ("specprefill+topk+phi", SPEC_KEYS | TOPK_KEYS | {"phi"},
     ["--keep", "0.5", "--budget", "0.1", "--tail", "6"],
     {"keep": 0.5, "budget": 0.1, "tail": 6, "phi": None, "chunk": 32}),
    ("streamingllm+topk", {"kv_rate"} | TOPK_KEYS, ["--kv-rate", "0.5", "--topk", "3"],
     {"kv_rate": 0.5, "topk": 3, "sink": 4}),
])
def test_settings_echo_both_parts(tiny, tmp_path, strategy, keys, flags, values):
    j = record(tiny, strategy, tmp_path, *flags)
    assert j["strategy"] == strategy
    assert set(j["settings"]) == keys
    for k, v in values.items():
        assert j["settings"][k] == (pytest.approx(v) if isinstance(v, float) else v), k


# ---- independent numpy reference of PREFILL+topk ------------------------------------------------

def prefill(m, ids, strategy, shared_sel=False, tsp_layer=-1, tsp_rate=0.2, kv_rate=0.1, window=8,
            pool_kernel=7, pool=0, kv_len=0, tsp_len=0):
    """float64 prefill from specs/fastkv.md: the first-token logits, per layer and KV head the kept
    (keys, values, original positions), and per layer the kept index sets. strategy "full" keeps
    every token. shared_sel: a wrong cache for the negative control, every KV head keeping KV
    head 0's set."""
    n_all, w = len(ids), window
    group = m.n_head // m.n_kv
    l_tsp = tsp_layer if tsp_layer >= 0 else max(m.n_layer // 2 - 1, 0)
    t = (tsp_len or tss.f32_budget(n_all, tsp_rate)) if strategy == "fastkv" else n_all
    x, pos, cache, sets = m.tok_embd[ids].copy(), np.arange(n_all), [], []
    for li, ly in enumerate(m.layers):
        n = len(pos)
        h = ref_llama._rmsnorm(x, ly.attn_norm, m.eps)
        q = ref_llama._rope(m, ref_llama._linear(h, ly.wq, ly.bq).reshape(n, m.n_head, -1), pos)
        k = ref_llama._rope(m, ref_llama._linear(h, ly.wk, ly.bk).reshape(n, m.n_kv, -1), pos)
        v = ref_llama._linear(h, ly.wv, ly.bv).reshape(n, m.n_kv, -1)
        s = np.einsum("ihd,jhd->hij", q, np.repeat(k, group, axis=1)) / np.sqrt(m.head_dim)
        s = np.where(pos[None, None, :] <= pos[None, :, None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = np.einsum("hij,jhd->ihd", p, np.repeat(v, group, axis=1)).reshape(n, -1)
        sel = [np.arange(n)] * m.n_kv
        if strategy in ("fastkv", "snapkv"):
            b = tss.kv_budget(strategy, li, n, n_all, l_tsp, tsp_rate, kv_rate, kv_len, tsp_len)
            pooled = tss.window_pooled(p, w, pool_kernel, pool)
            if b < n:
                sel = [tss.topk_plus_window(pooled[g * group:(g + 1) * group].sum(0), n, w,
                                            max(b, w)) for g in range(m.n_kv)]
        if shared_sel:
            sel = [sel[0]] * m.n_kv
        sets.append([pos[s_] for s_ in sel])
        cache.append([[k[sel[g], g] for g in range(m.n_kv)], [v[sel[g], g] for g in range(m.n_kv)],
                      [pos[sel[g]] for g in range(m.n_kv)]])
        x = x + ref_llama._linear(o, ly.wo)
        h = ref_llama._rmsnorm(x, ly.ffn_norm, m.eps)
        x = x + ref_llama._linear(ref_llama._silu(ref_llama._linear(h, ly.w_gate)) *
                                  ref_llama._linear(h, ly.w_up), ly.w_down)
        if strategy == "fastkv" and li == l_tsp and t < n:   # TSP
            rows = tss.topk_plus_window(pooled.sum(0), n, w, t)
            x, pos = x[rows], pos[rows]
    logits = ref_llama._linear(ref_llama._rmsnorm(x[-1:], m.out_norm, m.eps), m.lm_head)[0]
    return logits, cache, sets


def regions(n_prompt, sink, tail, topk):
    """specs/topk-phi.md's regions over a head's n_prompt kept entries, by entry index: sink,
    tail (clamped as the prompt allows), mid, and K = min(topk, mid)."""
    s = min(sink, n_prompt)
    t = min(tail, n_prompt - s)
    n_mid = n_prompt - s - t
    return s, t, n_mid, min(topk, n_mid)


def topk_of(scores, k):
    """Indices of the k largest, ties to the lower index."""
    return np.sort(np.argsort(-scores, kind="stable")[:k])


def decode_step(m, cache, n_prompt, tok, position, sink, tail, topk, mode="query", n_all=0):
    """One decode step over the per-KV-head caches (appending this token's K/V): the logits.
    mode "query": specs/topk-phi.md's topk (per query head); "kv": the wrong reading, one top-K
    per KV head (the group's summed scores); "pos": the wrong regions, by original position
    (sink: positions < sink, tail: positions >= n_all - tail, of the prompt's n_all) instead of by
    entry index within each head's kept entries; "all": no selection (plain attention)."""
    group = m.n_head // m.n_kv
    x = m.tok_embd[[tok]].copy()
    p_now = np.array([position])
    for li, ly in enumerate(m.layers):
        h = ref_llama._rmsnorm(x, ly.attn_norm, m.eps)
        q = ref_llama._rope(m, ref_llama._linear(h, ly.wq, ly.bq).reshape(1, m.n_head, -1), p_now)
        k = ref_llama._rope(m, ref_llama._linear(h, ly.wk, ly.bk).reshape(1, m.n_kv, -1), p_now)
        v = ref_llama._linear(h, ly.wv, ly.bv).reshape(1, m.n_kv, -1)
        ks, vs, ps = cache[li]
        for g in range(m.n_kv):
            ks[g], vs[g] = np.concatenate([ks[g], k[:, g]]), np.concatenate([vs[g], v[:, g]])
            ps[g] = np.concatenate([ps[g], p_now])
        n_p = n_prompt[li]
        s_, t_, n_mid, kk = regions(n_p, sink, tail, topk)
        scores = [ks[hh // group] @ q[0, hh] / np.sqrt(m.head_dim) for hh in range(m.n_head)]
        o = []
        for hh in range(m.n_head):
            g = hh // group
            n_len = len(ks[g])
            if mode == "all":
                chosen = np.arange(n_len)
            elif mode == "pos":
                pp = ps[g][:n_p]
                mid = np.flatnonzero((pp >= sink) & (pp < n_all - tail))
                edge = np.setdiff1d(np.arange(n_len), mid)
                chosen = np.concatenate([mid[topk_of(scores[hh][mid], min(topk, len(mid)))], edge])
            else:
                basis = scores[hh] if mode == "query" else \
                    sum(scores[g * group + i] for i in range(group))
                top = s_ + topk_of(basis[s_: s_ + n_mid], kk)
                chosen = np.concatenate([top, np.arange(s_), np.arange(n_p - t_, n_len)])
            a = scores[hh][chosen]
            a = np.exp(a - a.max())
            o.append((a / a.sum()) @ vs[g][chosen])
        x = x + ref_llama._linear(np.concatenate(o)[None], ly.wo)
        h = ref_llama._rmsnorm(x, ly.ffn_norm, m.eps)
        x = x + ref_llama._linear(ref_llama._silu(ref_llama._linear(h, ly.w_gate)) *
                                  ref_llama._linear(h, ly.w_up), ly.w_down)
    return ref_llama._linear(ref_llama._rmsnorm(x, m.out_norm, m.eps), m.lm_head)[0]


def reference(m, ids, pre, forced, sink, tail, topk, mode="query", shared_sel=False, **sets):
    """PREFILL+topk in float64 with sift's ids `forced` as the decode inputs: rows (len(forced),
    vocab), row t the logits of generated token t. pre "full" is topk alone (= full+topk): the
    prompt but its last token prefilled, the last token the first query."""
    n = len(ids)
    if pre == "full":
        _, cache, kept = prefill(m, ids[:-1], "full")
        inputs, pos0 = [ids[-1]] + list(forced[:-1]), n - 1
    else:
        first, cache, kept = prefill(m, ids, pre, shared_sel=shared_sel, **sets)
        inputs, pos0 = list(forced[:-1]), n
    n_prompt = [len(c[0][0]) for c in cache]
    rows = [] if pre == "full" else [first]
    for t, tok in enumerate(inputs):
        rows.append(decode_step(m, cache, n_prompt, tok, pos0 + t, sink, tail, topk, mode, n))
    return np.array(rows), kept


REF_CASES = [
    # TSP after layer 1 (40 of 200 rows go on), 50 entries per KV head in layers 0-1, all 40
    # in layers 2-3: mid 42 and 32, K = 8 of them
    ("fastkv", {"kv_rate": 0.25}, {"sink": 2, "tail": 6, "topk": 8}),
    # fixed budgets and average pooling: 30 entries per KV head in every layer, mid 24, K = 5
    ("fastkv", {"kv_len": 30, "tsp_len": 60, "pool": 1, "window": 4}, {"sink": 3, "tail": 3,
                                                                       "topk": 5}),
    ("snapkv", {"kv_rate": 0.3}, {"sink": 1, "tail": 8, "topk": 6}),
    ("full", {}, {"sink": 4, "tail": 16, "topk": 10}),   # topk alone
]


@pytest.mark.parametrize("pre,sets,topk_sets", REF_CASES)
def test_against_reference(tiny, tmp_path, pre, sets, topk_sets):
    m = ref_llama.load(tiny)
    ids = tss.ids_for(200, seed=4)
    name = "topk" if pre == "full" else pre + "+topk"
    toks, got = steps(tiny, ids, tmp_path, name, **sets, **topk_sets)
    want, kept = reference(m, ids, pre, toks, **topk_sets, **sets)
    for t in range(N_GEN):
        assert rel(got[t], want[t]) <= REF_TOL, t
        assert int(np.argmax(want[t])) == toks[t], t
    # the case is one where the reading matters: K below every layer's mid region ...
    for per_head in kept:
        _, _, n_mid, kk = regions(len(per_head[0]), **topk_sets)
        assert 0 < kk < n_mid
    # ... and a top-K of the mid region is not everything: plain attention disagrees
    plain, _ = reference(m, ids, pre, toks, **topk_sets, mode="all", **sets)
    assert max(rel(got[t], plain[t]) for t in range(1, N_GEN)) > 100 * REF_TOL
    # a top-K per KV head (the group's summed scores) instead of per query head disagrees
    by_kv, _ = reference(m, ids, pre, toks, **topk_sets, mode="kv", **sets)
    assert max(rel(got[t], by_kv[t]) for t in range(1, N_GEN)) > 100 * REF_TOL
    if pre in ("fastkv", "snapkv"):
        # the kept sets differ per KV head (in some layer) ...
        assert any(not np.array_equal(per_head[0], per_head[g]) for per_head in kept
                   for g in range(1, m.n_kv))
        # ... regions by original position instead of entry index disagree ...
        by_pos, _ = reference(m, ids, pre, toks, **topk_sets, mode="pos", **sets)
        assert max(rel(got[t], by_pos[t]) for t in range(1, N_GEN)) > 100 * REF_TOL
        # ... and head 0's kept set read for every head disagrees
        wrong, _ = reference(m, ids, pre, toks, **topk_sets, shared_sel=True, **sets)
        assert max(rel(got[t], wrong[t]) for t in range(1, N_GEN)) > 100 * REF_TOL


def test_composed_strategies_in_a_batch(tiny, tmp_path):
    """Composed strategies decoding in one --parallel pass (each sequence with its own paired
    hooks) write what they write one at a time."""
    names = ["fastkv+topk", "snapkv+topk", "streamingllm+topk+phi", "swiftkv+topk", "speed+topk",
             "specprefill+topk", "full+topk", "fastkv+topk+phi"]
    words = TEXT.split()
    reqs = [{"id": f"r{i}", "strategy": s, "n_predict": 6 + i,
             "prompt": " ".join(words[(3 * i) % len(words):] + words[: (3 * i) % len(words)])}
            for i, s in enumerate(names)]
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    base = ["--prompts", p, "--temp", 0, "--json", "-q", "--topk", 4, "--sink", 2, "--tail", 4]
    one, many = sift(tiny, *base, "--parallel", 1), sift(tiny, *base, "--parallel", len(names))
    assert one.returncode == 0 and many.returncode == 0, many.stderr
    recs = [[json.loads(x) for x in r.stdout.splitlines()] for r in (one, many)]
    assert [r["strategy"] for r in recs[1]] == names
    assert [r["text"] for r in recs[0]] == [r["text"] for r in recs[1]]
    assert [r["timings"]["predicted_n"] for r in recs[1]] == [6 + i for i in range(len(names))]

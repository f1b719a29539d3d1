"""topk+phi against float64 numpy references written from specs/topk-phi.md.

build/tests/tool_phi drives the C kernels (attn/phi_cpu.c) and the decode path:
  * feature maps (one-block ReZero MLP with exact GELU; positive random features), the
    completion cache m, u~, T~ built in ONE pass (running max + rescale) against the two-pass
    definition, and one decode step (exact set, subtraction of the retrieved tokens, clamp of
    u~_R, single normalisation in the log domain) against the spec's equations; also the
    selection-only (`topk`) output. Tolerance: 1e-4 relative to the largest reference magnitude
    (an fp32 path, DESIGN.md), 1e-5 for the cache build.
  * exactness on the default model: with K covering the whole mid region, topk+phi and topk give
    full's logits at every decode step (<= 1e-5 relative), whatever phi is.
"""

import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "build" / "tests" / "tool_phi"
MODEL = Path(os.environ.get("SIFT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL
EPS = 1e-6  # PHI_EPS: clamp of u~_R
MLP, PRF = 1, 2

erf = np.vectorize(math.erf)


def n_par(kind, d, e, h, f):
    return f * d if kind == PRF else e * d + e + h * e + h + e * h + e + 1 + f * e + f


def log_phi(kind, par, x, d, e, h, f):
    """log phi(x) (f,) in float64, from the spec's definitions."""
    par = par.astype(np.float64)
    x = x.astype(np.float64)
    if kind == PRF:
        w = par.reshape(f, d)
        xt = x / d ** 0.25
        return w @ xt - xt @ xt / 2 - math.log(f) / 2
    o = 0
    take = lambda n: par[o:o + n]  # noqa: E731
    ws = take(e * d).reshape(e, d); o += e * d
    bs = take(e); o += e
    w1 = take(h * e).reshape(h, e); o += h * e
    b1 = take(h); o += h
    w2 = take(e * h).reshape(e, h); o += e * h
    b2 = take(e); o += e
    alpha = par[o]; o += 1
    wo = take(f * e).reshape(f, e); o += f * e
    bo = take(f)
    g0 = ws @ x + bs
    z = w1 @ g0 + b1
    dd = w2 @ (0.5 * z * (1 + erf(z / math.sqrt(2)))) + b2
    return wo @ (g0 + alpha * dd) + bo


def lse(a):
    mx = np.max(a)
    return mx + math.log(np.sum(np.exp(a - mx)))


def reference(kind, shape, par_q, par_k, q, K, V, sel, n_sub, lo, hi):
    d, e, h, f = shape
    lq = log_phi(kind, par_q, q, d, e, h, f)
    A = np.stack([log_phi(kind, par_k, K[i], d, e, h, f) for i in range(lo, hi)])  # (n_R0, f)
    m = A.max(axis=0)                                                               # two passes
    W = np.exp(A - m)
    u = W.sum(axis=0)
    T = W.T @ V[lo:hi].astype(np.float64)
    s = K[sel].astype(np.float64) @ q.astype(np.float64) / math.sqrt(d)
    log_ze = lse(s)
    y_e = np.exp(s - log_ze) @ V[sel].astype(np.float64)                             # N_E / Z_E
    ret = sel[:n_sub]
    AK = np.stack([log_phi(kind, par_k, K[i], d, e, h, f) for i in ret]) if n_sub else np.zeros((0, f))
    WK = np.exp(AK - m)
    u_r_raw = u - WK.sum(axis=0)
    u_r = np.maximum(u_r_raw, EPS)
    T_r = T - WK.T @ V[ret].astype(np.float64)
    a = lq + m + np.log(u_r)
    log_zr = lse(a)
    y_r = np.exp(a - log_zr) @ (T_r / u_r[:, None])                                  # N^_R / Z^_R
    mstar = max(log_ze, log_zr)
    we, wr = math.exp(log_ze - mstar), math.exp(log_zr - mstar)
    y = (we * y_e + wr * y_r) / (we + wr)
    return dict(lq=lq, m=m, u=u, T=T, y=y, y_topk=y_e, clamped=int((u_r_raw < EPS).sum()))


def run_tool(tmp_path, kind, shape, par_q, par_k, q, K, V, sel, n_sub, lo, hi):
    d, e, h, f = shape
    inp, out = tmp_path / "in.bin", tmp_path / "out.bin"
    hdr = np.array([kind, d, e, h, f, len(K), len(sel), n_sub, lo, hi], dtype=np.int32)
    with open(inp, "wb") as fp:
        for arr in (hdr, par_q, par_k, q, K, V):
            fp.write(np.ascontiguousarray(arr, dtype=np.int32 if arr is hdr else np.float32).tobytes())
        fp.write(np.asarray(sel, dtype=np.int32).tobytes())
    subprocess.run([str(TOOL), "attend", str(inp), str(out)], check=True)
    r = np.fromfile(out, dtype=np.float32)
    parts, o = {}, 0
    for name, n in (("lq", f), ("m", f), ("u", f), ("T", f * d), ("y", d), ("y_topk", d)):
        parts[name] = r[o:o + n].astype(np.float64)
        o += n
    assert o == len(r)
    parts["T"] = parts["T"].reshape(f, d)
    return parts


def rel_err(got, want):
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def random_case(rng, kind, n=160, d=16, e=16, h=32, f=24, lo=4, tail=12, n_sub=10, qscale=1.0):
    shape = (d, e, h, f)
    npar = n_par(kind, d, e, h, f)
    if kind == PRF:
        par_q = rng.standard_normal(npar)
        par_k = par_q.copy()
    else:
        par_q = rng.standard_normal(npar) * 0.3
        par_k = rng.standard_normal(npar) * 0.3
        for p in (par_q, par_k):   # alpha: a non-zero residual branch
            p[e * d + e + h * e + h + e * h + e] = 0.7
    q = rng.standard_normal(d) * qscale
    K = rng.standard_normal((n, d))
    V = rng.standard_normal((n, d))
    hi = n - tail
    ret = rng.choice(np.arange(lo, hi), size=n_sub, replace=False)
    sel = np.concatenate([ret, np.arange(lo), np.arange(hi, n)]).astype(np.int32)
    return shape, par_q, par_k, q, K, V, sel, n_sub, lo, hi


@pytest.mark.parametrize("kind", [MLP, PRF])
@pytest.mark.parametrize("qscale", [1.0, 8.0])
def test_completion_matches_reference(tmp_path, kind, qscale):
    rng = np.random.default_rng(100 * kind + int(qscale))
    case = random_case(rng, kind, qscale=qscale)
    ref = reference(kind, *case)
    got = run_tool(tmp_path, kind, *case)
    assert rel_err(got["lq"], ref["lq"]) <= 1e-5
    assert rel_err(got["m"], ref["m"]) <= 1e-5
    assert rel_err(got["u"], ref["u"]) <= 1e-5, "single-pass u~ vs two-pass"
    assert rel_err(got["T"], ref["T"]) <= 1e-5, "single-pass T~ vs two-pass"
    assert rel_err(got["y"], ref["y"]) <= 1e-4
    assert rel_err(got["y_topk"], ref["y_topk"]) <= 1e-4
    if qscale == 1.0:   # with q x 8 a few exact scores dominate and the completion's share vanishes
        assert rel_err(ref["y"], ref["y_topk"]) > 1e-3, "the completion must change the output"


def test_single_pass_with_rising_maxima(tmp_path):
    """Keys ordered by growing norm: the running max rises at almost every row (many rescales)."""
    rng = np.random.default_rng(7)
    shape, par_q, par_k, q, K, V, sel, n_sub, lo, hi = random_case(rng, PRF)
    K = K * np.linspace(0.2, 3.0, len(K))[:, None]
    case = (shape, par_q, par_k, q, K, V, sel, n_sub, lo, hi)
    ref, got = reference(PRF, *case), run_tool(tmp_path, PRF, *case)
    assert rel_err(got["u"], ref["u"]) <= 1e-5
    assert rel_err(got["T"], ref["T"]) <= 1e-5
    assert rel_err(got["y"], ref["y"]) <= 1e-4


def test_subtraction_clamp(tmp_path):
    """Retrieving all of R0 but one negligible key drives u~_R below eps for some features."""
    rng = np.random.default_rng(11)
    shape, par_q, par_k, q, K, V, sel, n_sub, lo, hi = random_case(rng, PRF, n=40, lo=4, tail=4)
    K[lo] *= 12.0   # |x~|^2 / 2 makes this key's features tiny
    ret = np.arange(lo + 1, hi)
    sel = np.concatenate([ret, np.arange(lo), np.arange(hi, len(K))]).astype(np.int32)
    case = (shape, par_q, par_k, q, K, V, sel, len(ret), lo, hi)
    ref, got = reference(PRF, *case), run_tool(tmp_path, PRF, *case)
    assert ref["clamped"] > 0, "the case must exercise the clamp"
    assert np.all(np.isfinite(got["y"]))
    assert rel_err(got["y"], ref["y"]) <= 1e-4


def test_whole_region_retrieved_is_selection_only(tmp_path):
    """R0 fully retrieved: nothing is estimated, the output is the exact softmax over E."""
    rng = np.random.default_rng(3)
    shape, par_q, par_k, q, K, V, sel, n_sub, lo, hi = random_case(rng, MLP, n=30, lo=2, tail=3)
    ret = np.arange(lo, hi)
    sel = np.concatenate([ret, np.arange(lo), np.arange(hi, len(K))]).astype(np.int32)
    got = run_tool(tmp_path, MLP, shape, par_q, par_k, q, K, V, sel, len(ret), lo, hi)
    s = K @ q / math.sqrt(shape[0])
    full = np.exp(s - lse(s)) @ V
    assert rel_err(got["y"], full) <= 1e-5
    assert rel_err(got["y_topk"], full) <= 1e-5


# ---- decode path on the default model ----

PROMPT = [(i * 7919 + 13) % 40000 + 100 for i in range(96)]   # 96 arbitrary in-vocabulary ids
CONT = [504, 2365, 6354, 16438]


def decode_logits(tmp_path, strategy, *sets):
    out = tmp_path / f"{strategy}.f32"
    cmd = [str(TOOL), "decode", str(MODEL), str(out), "--strategy", strategy]
    for s in sets:
        cmd += ["--set", s]
    for c in CONT:
        cmd += ["--cont", str(c)]
    subprocess.run(cmd + [str(i) for i in PROMPT], check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    return np.fromfile(out, dtype=np.float32).reshape(1 + len(CONT), -1).astype(np.float64)


@pytest.fixture(scope="module")
def full_logits(tmp_path_factory):
    if not MODEL.exists():
        pytest.skip(f"model {MODEL} missing (make model)")
    return decode_logits(tmp_path_factory.mktemp("full"), "full")


@pytest.mark.parametrize("strategy", ["topk+phi", "topk"])
def test_exact_when_k_covers_mid(tmp_path, full_logits, strategy):
    got = decode_logits(tmp_path, strategy, "topk=100000")
    for r in range(len(got)):
        assert rel_err(got[r], full_logits[r]) <= 1e-5, f"row {r}"


def test_small_k_changes_decode_only(tmp_path, full_logits):
    """A small K leaves the prefill's logits alone and changes decode (the mechanism is on)."""
    got = decode_logits(tmp_path, "topk", "topk=2")
    assert rel_err(got[0], full_logits[0]) <= 1e-6
    assert rel_err(got[1:], full_logits[1:]) > 1e-3

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


@pytest.fixture(scope="module", autouse=True)
def _f32_weights():
    """exactness checks across different row counts hold on the fp32 path."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SIFT_WEIGHTS", "f32")
        yield

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
    # the retrieved entries are R0's top n_sub by score, so the rest sum to at most
    # (|R0| - n_sub) exp(lowest retrieved score)
    bound = math.log(hi - lo - n_sub) + s[:n_sub].min() if n_sub and hi - lo > n_sub else math.inf
    bounded = log_zr > bound
    log_zr = min(log_zr, bound)
    mstar = max(log_ze, log_zr)
    we, wr = math.exp(log_ze - mstar), math.exp(log_zr - mstar)
    y = (we * y_e + wr * y_r) / (we + wr)
    return dict(lq=lq, m=m, u=u, T=T, y=y, y_topk=y_e, clamped=int((u_r_raw < EPS).sum()),
                bounded=bounded)


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
    for name, n in (("lq", f), ("m", f), ("u", f), ("T", f * d), ("y", d), ("y_topk", d), ("y_memo", d)):
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
    ret = top_of_region(q, K, lo, hi, n_sub)
    sel = np.concatenate([ret, np.arange(lo), np.arange(hi, n)]).astype(np.int32)
    return shape, par_q, par_k, q, K, V, sel, n_sub, lo, hi


def top_of_region(q, K, lo, hi, k):
    """The k entries of [lo, hi) with the largest scores (what decode retrieves)."""
    s = K[lo:hi].astype(np.float64) @ q.astype(np.float64)
    return lo + np.argsort(-s, kind="stable")[:k]


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
    assert rel_err(got["y_memo"], ref["y"]) <= 1e-4, "completion from memoised key features"
    assert rel_err(got["y_topk"], ref["y_topk"]) <= 1e-4
    if qscale == 1.0:   # with q x 8 a few exact scores dominate and the completion's share vanishes
        assert rel_err(ref["y"], ref["y_topk"]) > 1e-3, "the completion must change the output"


def test_top_k_bound_clamps_an_overestimate(tmp_path):
    """A map whose mass estimate is e^40 too large: the remainder's mass is clamped to the bound
    (|R0| - K) exp(lowest retrieved score), so the output stays between the exact part and the
    estimated mean instead of collapsing onto the estimate."""
    rng = np.random.default_rng(21)
    shape, par_q, par_k, q, K, V, sel, n_sub, lo, hi = random_case(rng, MLP)
    d, e, h, f = shape
    par_q = par_q.copy()
    par_q[-f:] += 40.0   # bo: log phi_q + 40
    case = (shape, par_q, par_k, q, K, V, sel, n_sub, lo, hi)
    ref, got = reference(MLP, *case), run_tool(tmp_path, MLP, *case)
    assert ref["bounded"], "the case must exercise the bound"
    assert rel_err(got["y"], ref["y"]) <= 1e-4
    assert rel_err(got["y_memo"], ref["y"]) <= 1e-4


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
    # a long key against q: |x~|^2 / 2 makes its features tiny and its score the region's
    # lowest, so retrieving every other key is the top K
    K[lo] = -q / np.linalg.norm(q) * 12.0 * np.linalg.norm(K[lo])
    ret = np.arange(lo + 1, hi)
    assert set(ret) == set(top_of_region(q, K, lo, hi, len(ret)))
    sel = np.concatenate([ret, np.arange(lo), np.arange(hi, len(K))]).astype(np.int32)
    case = (shape, par_q, par_k, q, K, V, sel, len(ret), lo, hi)
    ref, got = reference(PRF, *case), run_tool(tmp_path, PRF, *case)
    assert ref["clamped"] > 0, "the case must exercise the clamp"
    assert np.all(np.isfinite(got["y"]))
    assert rel_err(got["y"], ref["y"]) <= 1e-4
    assert rel_err(got["y_memo"], ref["y"]) <= 1e-4


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


def random_phi_file(path, seed):
    """Random MLP maps of SmolLM2's shape (30 layers, 9/3 heads, head dim 64), small inner sizes."""
    d, e, h, f = 64, 8, 8, 16
    body = np.random.default_rng(seed).standard_normal(30 * 12 * n_par(MLP, d, e, h, f)) * 0.2
    hdr = np.array([1, MLP, 30, 9, 3, d, e, h, f, 0], dtype="<u4")
    path.write_bytes(b"SIFTPHI\0" + hdr.tobytes() + body.astype("<f4").tobytes())
    return path


@pytest.mark.parametrize("strategy", ["topk+phi", "topk+phi random MLP", "topk"])
def test_exact_when_k_covers_mid(tmp_path, full_logits, strategy):
    sets = ["topk=100000"]
    if strategy.endswith("random MLP"):
        strategy = "topk+phi"
        sets.append(f"phi={random_phi_file(tmp_path / 'r.phi', 1)}")
    got = decode_logits(tmp_path, strategy, *sets)
    for r in range(len(got)):
        assert rel_err(got[r], full_logits[r]) <= 1e-5, f"row {r}"


def test_completion_on_in_decode(tmp_path, full_logits):
    """With K below the mid region, the phi completion changes topk's output."""
    topk = decode_logits(tmp_path, "topk", "topk=8")
    phi = decode_logits(tmp_path, "topk+phi", "topk=8", f"phi={random_phi_file(tmp_path / 'r.phi', 2)}")
    assert rel_err(phi, topk) > 1e-3


def test_small_k_changes_every_query(tmp_path, full_logits):
    """A small K changes the logits from the prompt's last token on (it is the first query)."""
    got = decode_logits(tmp_path, "topk", "topk=2")
    for r in range(len(got)):
        assert rel_err(got[r], full_logits[r]) > 1e-3, f"row {r}"


# ---- fitting the maps (fit/phi_fit.c) ----

def read_phi(path):
    """The .phi format parsed independently: header, then q and k parameter blocks."""
    raw = Path(path).read_bytes()
    assert raw[:8] == b"SIFTPHI\0"
    version, kind, n_layer, n_head, n_kv, d, e, h, f, zero = np.frombuffer(raw[8:48], dtype="<u4")
    assert version == 1 and zero == 0
    npar = n_par(kind, d, e, h, f)
    body = np.frombuffer(raw[48:], dtype="<f4")
    assert len(body) == n_layer * (n_head + n_kv) * npar
    nq = n_layer * n_head * npar
    return int(kind), (int(d), int(e), int(h), int(f)), body[:nq].reshape(n_layer, n_head, npar), \
        body[nq:].reshape(n_layer, n_kv, npar)


def huber(x):
    return np.where(np.abs(x) <= 1, 0.5 * x * x, np.abs(x) - 0.5)


def spec_loss(r, rh):
    """L = 0.99 KL + 0.01 (L_top + 2 L_fp + 4 L_Z), tau = 1, for one query (float64)."""
    lp, lph = r - lse(r), rh - lse(rh)
    kl = float(np.sum(np.exp(lp) * (lp - lph)))
    top, far = r >= -8, r < -8
    l_top = float(np.mean(huber(rh[top] - r[top]))) if top.any() else 0.0
    l_fp = float(np.mean(huber(np.maximum(rh[far] + 8, 0)))) if far.any() else 0.0
    l_z = float(huber(max(lse(rh) - lse(r), 0.0)))
    return 0.99 * kl + 0.01 * (l_top + 2 * l_fp + 4 * l_z), kl


def query_scores(kind, shape, pq, pk, Q, K, ends, lo, rows):
    """Per query i in rows: (s, s^) over its support, the teacher q.k/sqrt(d) and the student
    log <phi_q(q), phi_k(k)> (float64)."""
    d = shape[0]
    LK = np.stack([log_phi(kind, pk, k, *shape) for k in K])
    for i in rows:
        kk, lk = K[lo:ends[i]], LK[lo:ends[i]]
        lq = log_phi(kind, pq, Q[i], *shape)
        t = lq[None, :] + lk
        mx = t.max(axis=1)
        yield (kk.astype(np.float64) @ Q[i].astype(np.float64) / math.sqrt(d),
               mx + np.log(np.exp(t - mx[:, None]).sum(axis=1)))


def losses(kind, shape, pq, pk, Q, K, ends, lo, rows):
    out = [spec_loss(s - s.max(), sh - s.max())
           for s, sh in query_scores(kind, shape, pq, pk, Q, K, ends, lo, rows)]
    return np.array(out)   # (rows, 2): loss, KL


def remainder_bias(kind, shape, pq, pk, Q, K, ends, lo, rows, frac):
    """Mean and standard deviation over queries of LSE(r^) - LSE(r) over each query's support
    minus its top ceil(frac n) keys by r."""
    out = []
    for s, sh in query_scores(kind, shape, pq, pk, Q, K, ends, lo, rows):
        keep = np.ones(len(s), bool)
        top = math.ceil(frac * len(s))
        if 0 < top < len(s):
            keep[np.argsort(-s, kind="stable")[:top]] = False
        out.append(lse(sh[keep]) - lse(s[keep]))
    return float(np.mean(out)), float(np.std(out))


def prf_params(rng, d, f):
    """Positive random features with orthogonal Gaussian rows (numpy's own draw)."""
    blocks = []
    for _ in range(0, f, d):
        qm, _ = np.linalg.qr(rng.standard_normal((d, d)))
        blocks.append(qm.T * np.sqrt(rng.chisquare(d, size=d))[:, None])
    return np.concatenate(blocks)[:f].reshape(-1)


def test_fit_decreases_loss_and_beats_random_features(tmp_path):
    rng = np.random.default_rng(5)
    d, e, h, f = 16, 16, 32, 32
    n_keys, n_q, n_train, lo = 256, 96, 64, 4
    centres = rng.standard_normal((8, d)) * 1.5   # clustered keys: peaky, structured attention
    K = (centres[rng.integers(0, 8, n_keys)] + 0.6 * rng.standard_normal((n_keys, d))).astype(np.float32)
    Q = (centres[rng.integers(0, 8, n_q)] + 0.6 * rng.standard_normal((n_q, d))).astype(np.float32)
    ends = rng.integers(n_keys // 2, n_keys + 1, n_q).astype(np.int32)
    hdr = np.array([d, e, h, f, n_keys, n_q, n_train, 400, 9, lo], dtype=np.int32)
    inp = tmp_path / "fit.bin"
    inp.write_bytes(hdr.tobytes() + K.tobytes() + Q.tobytes() + ends.tobytes())
    init, fitted = tmp_path / "init.phi", tmp_path / "fit.phi"
    out = subprocess.run([str(TOOL), "fit", str(inp), str(init), str(fitted)], check=True,
                         capture_output=True, text=True).stdout.split()
    c_before, c_after, first, last = map(float, out)
    train, held = range(n_train), range(n_train, n_q)

    kind, shape, pq, pk = read_phi(init)
    assert kind == MLP and shape == (d, e, h, f)
    ref_before = losses(kind, shape, pq[0, 0], pk[0, 0], Q, K, ends, lo, train)[:, 0].mean()
    assert abs(c_before - ref_before) <= 1e-4 * abs(ref_before), "sift's loss vs the spec's"
    _, _, fq, fk = read_phi(fitted)
    fit_train = losses(kind, shape, fq[0, 0], fk[0, 0], Q, K, ends, lo, train)[:, 0].mean()
    assert abs(c_after - fit_train) <= 1e-4 * abs(fit_train)
    assert fit_train < 0.5 * ref_before, f"loss {ref_before:.4f} -> {fit_train:.4f}"
    assert last < first

    # Remainder calibration: the mass bias over each query's support minus its top share of
    # keys (the part decode estimates) vs numpy, and zero after phi_fit_calibrate at that share.
    # With a margin the mean lands margin standard deviations below 0.
    for frac, margin in ((0.0, 0.0), (0.05, 0.0), (0.2, 0.0), (0.05, 1.0)):
        cal = tmp_path / f"cal{frac}_{margin}.phi"
        out = subprocess.run([str(TOOL), "calibrate", str(inp), str(fitted), str(frac), str(margin),
                              str(cal)], check=True, capture_output=True, text=True).stdout.split()
        before, after, sd = map(float, out)
        ref, ref_sd = remainder_bias(kind, shape, fq[0, 0], fk[0, 0], Q, K, ends, lo, train, frac)
        assert abs(before - ref) <= 1e-4 * max(1.0, abs(ref)), (frac, before, ref)
        assert abs(sd - ref_sd) <= 1e-4 * max(1.0, ref_sd) and ref_sd > 0.01, (sd, ref_sd)
        _, _, cq, ck = read_phi(cal)
        ref_after, _ = remainder_bias(kind, shape, cq[0, 0], ck[0, 0], Q, K, ends, lo, train, frac)
        assert abs(ref_after + margin * ref_sd) <= 1e-4 and abs(after - ref_after) <= 1e-4, \
            (frac, margin, ref_after, after, ref_sd)
        assert np.array_equal(ck, fk), "calibration moves only the query map's output bias"

    kl_fit = losses(kind, shape, fq[0, 0], fk[0, 0], Q, K, ends, lo, held)[:, 1].mean()
    kl_prf = np.mean([losses(PRF, (d, 0, 0, f), w, w, Q, K, ends, lo, held)[:, 1].mean()
                      for w in (prf_params(np.random.default_rng(s), d, f) for s in range(3))])
    print(f"held-out KL: fitted {kl_fit:.4f}, random features {kl_prf:.4f}")
    assert kl_fit < 0.5 * kl_prf

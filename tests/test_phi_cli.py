"""sift's topk+phi / topk / fit-phi on the command line: bad .phi files and bad fit-phi input give
one `sift: error:` line and a non-zero exit; fit-phi's output loads; a resumed fit-phi equals an
uninterrupted one byte for byte (seeded); the decode accounting line is printed; fit-phi's
end-to-end check reports a deliberately damaged map as losing, treats a random-feature file
exactly as the fallback, records its verdict in the file, and topk+phi prints it."""

import json
import math
import os
import re
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SIFT = ROOT / "sift"
MODEL = Path(os.environ.get("SIFT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL
ENV = {**os.environ, "OMP_NUM_THREADS": "2"}
TEXT = ("The river carried stones from the mountains to the sea, and every stone remembered "
        "a different winter. ") * 40

pytestmark = pytest.mark.skipif(not MODEL.exists(), reason="default model missing (make model)")


def sift(*args):
    sub = [args[0]] if args and args[0] == "fit-phi" else []
    return subprocess.run([str(SIFT), *sub, "-m", str(MODEL), *map(str, args[len(sub):])],
                          capture_output=True, text=True, env=ENV, timeout=600)


def one_error(r, *words):
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.startswith("sift: error:")]
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def phi_header(kind, n_layer, n_head, n_kv, d, e, h, f):
    return b"SIFTPHI\0" + struct.pack("<10I", 1, kind, n_layer, n_head, n_kv, d, e, h, f, 0)


def mlp_floats(n_layer, n_head, n_kv, d, e, h, f):
    npar = e * d + e + h * e + h + e * h + e + 1 + f * e + f
    return n_layer * (n_head + n_kv) * npar


@pytest.fixture(scope="module")
def prompt(tmp_path_factory):
    p = tmp_path_factory.mktemp("p") / "prompt.txt"
    p.write_text(TEXT + "Where did the river carry the stones?")
    return p


def params(path, npar):
    """The parameter blocks of a .phi file (without its verdict record)."""
    b = path.read_bytes()
    n = (len(b) - 48) // (4 * npar) * npar
    return np.frombuffer(b[48:48 + 4 * n], "<f4").reshape(-1, npar)


def verdict(path):
    """The verdict record of a .phi file of the default model's shape, or None."""
    shape = (30, 9, 3, 64, 64, 128, 64)
    b = path.read_bytes()
    end = 48 + 4 * mlp_floats(*shape)
    if len(b) == end:
        return None
    n = struct.unpack("<I", b[end:end + 4])[0]
    assert len(b) == end + 4 + n
    return b[end + 4:].decode()


def check_rows(out):
    """fit-phi's end-to-end table: {row label: mean KL}."""
    rows = re.findall(r"^\| (topk[^|]*) \| ([0-9.]+) \| (\d+) % \|$", out, re.M)
    return {label.strip(): float(kl) for label, kl, _ in rows}


def run_phi(prompt, phi_path):
    return sift("-f", prompt, "-n", 2, "--temp", 0, "--strategy", "topk+phi", "--phi", phi_path)


def test_missing_phi_file(prompt, tmp_path):
    one_error(run_phi(prompt, tmp_path / "none.phi"), "cannot open phi file")


def test_not_a_phi_file(prompt, tmp_path):
    p = tmp_path / "x.phi"
    p.write_bytes(b"GGUF" + bytes(100))
    one_error(run_phi(prompt, p), "not a phi file")


def test_phi_for_another_model(prompt, tmp_path):
    shape = (2, 4, 2, 16, 16, 32, 16)
    p = tmp_path / "other.phi"
    p.write_bytes(phi_header(1, *shape) + np.zeros(mlp_floats(*shape), "<f4").tobytes())
    one_error(run_phi(prompt, p), "is for 2 layers", "the model has 30 layers")


def test_truncated_phi_file(prompt, tmp_path):
    shape = (30, 9, 3, 64, 64, 128, 64)
    p = tmp_path / "short.phi"
    p.write_bytes(phi_header(1, *shape) + np.zeros(1000, "<f4").tobytes())
    one_error(run_phi(prompt, p), "bytes; its header says")


def test_phi_bad_verdict_record(prompt, tmp_path):
    shape = (30, 9, 3, 64, 64, 128, 64)
    body = phi_header(1, *shape) + np.zeros(mlp_floats(*shape), "<f4").tobytes()
    p = tmp_path / "v.phi"
    p.write_bytes(body + struct.pack("<I", 1000) + b"x" * 10)
    one_error(run_phi(prompt, p), "bad verdict record")
    p.write_bytes(body + struct.pack("<I", 3) + b"a\nb")
    one_error(run_phi(prompt, p), "verdict is not printable")


def test_phi_bad_version_and_nan(prompt, tmp_path):
    shape = (30, 9, 3, 64, 64, 128, 64)
    body = np.zeros(mlp_floats(*shape), "<f4")
    p = tmp_path / "v2.phi"
    p.write_bytes(phi_header(1, *shape).replace(struct.pack("<I", 1), struct.pack("<I", 2), 1) + body.tobytes())
    one_error(run_phi(prompt, p), "version 2")
    body[12345] = np.nan
    p.write_bytes(phi_header(1, *shape) + body.tobytes())
    one_error(run_phi(prompt, p), "not finite")


def test_fit_phi_bad_input(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("too short")
    one_error(sift("fit-phi", "--data", short, "-o", tmp_path / "o.phi"), "need")
    one_error(sift("fit-phi", "--data", tmp_path / "none.txt", "-o", tmp_path / "o.phi"), "cannot read")
    r = sift("fit-phi", "-o", tmp_path / "o.phi")
    assert r.returncode == 2 and r.stderr.startswith("sift: error:")
    r = sift("fit-phi", "--data", short, "-o", tmp_path / "o.phi", "--device", "tpu")
    assert r.returncode == 2 and "--device must be one of auto, cpu, cuda (got 'tpu')" in r.stderr


FIT = ["-c", 160, "--steps", 3, "--queries", 8, "--seed", 3, "--positions", 160]


def test_fit_phi_resume_is_identical_and_loads(prompt, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    a, b = tmp_path / "a.phi", tmp_path / "b.phi"
    r = sift("fit-phi", "--data", data, "-o", a, *FIT)
    assert r.returncode == 0, r.stderr
    assert "| mean |" in r.stdout and "held-out queries: KL" in r.stdout
    assert not Path(str(a) + ".progress").exists()
    # An interrupted run: b holds the first 10 layers as a run saves them (before the check's
    # offset: the same fit with --check 0) and a progress note saying so.
    r = sift("fit-phi", "--data", data, "-o", b, *FIT, "--check", 0)
    assert r.returncode == 0, r.stderr
    key = f"{MODEL.name} 160 3 8 16 0.003 3 64 4 16 0.02 1 160"
    Path(str(b) + ".progress").write_text(f"10 {key}\n")
    r = sift("fit-phi", "--data", data, "-o", b, *FIT)
    assert r.returncode == 0, r.stderr
    assert "resuming" in r.stderr and "at layer 11" in r.stderr
    assert a.read_bytes() == b.read_bytes()
    r = run_phi(prompt, a)
    assert r.returncode == 0, r.stderr
    assert "phi: fitted maps" in r.stderr and "KiB of KV per step per layer" in r.stderr
    # The file records the fit's 160 tokens; a longer prompt is told it is beyond them.
    assert struct.unpack("<I", a.read_bytes()[44:48])[0] == 160
    n_prompt = int(re.search(r"(\d+) prompt tokens", r.stderr).group(1))
    assert n_prompt > 160 and f"fitted on 160 tokens: prompt of {n_prompt} is beyond" in r.stderr


def test_accounting_and_fallback_label(prompt):
    r = sift("-f", prompt, "-n", 3, "--temp", 0, "--strategy", "topk+phi,topk", "--topk", 8)
    assert r.returncode == 0, r.stderr
    assert "random features (training-free fallback" in r.stderr
    assert r.stderr.count("KiB of KV per step per layer (cached") == 2


def test_budget_floor(prompt):
    """The spec's accounting on this ~700-token prompt: ceil(0.02 n) = 15 reads, less sink 4 +
    tail 16 (+ the phi cache's ceil(64/2 + 64/64) = 33) leaves no key; the default K is raised to
    the floor 16 and the note says so; an explicit --topk stands."""
    r = sift("-f", prompt, "-n", 2, "--temp", 0, "--strategy", "topk+phi,topk", "--json", "-q")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(l) for l in r.stdout.splitlines()]
    n = recs[0]["timings"]["prompt_n"]
    assert math.ceil(0.02 * n) - 20 <= 0
    for rec in recs:
        assert "top-16 of" in rec["note"], rec["note"]
        assert f"K raised by 16 to the floor 16: --budget 0.02 of {n} tokens left 0" in rec["note"]
    assert "+ the phi cache" in recs[0]["note"] and "+ the phi cache" not in recs[1]["note"]
    r = sift("-f", prompt, "-n", 2, "--temp", 0, "--strategy", "topk+phi", "--topk", 0, "--json", "-q")
    note = json.loads(r.stdout)["note"]
    assert "top-0 of" in note and "raised" not in note


def test_fit_phi_recalibrate_moves_only_the_query_biases(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    a, b = tmp_path / "a.phi", tmp_path / "b.phi"
    r = sift("fit-phi", "--data", data, "-o", a, *FIT)
    assert r.returncode == 0, r.stderr
    b.write_bytes(a.read_bytes())
    r = sift("fit-phi", "--data", data, "-o", b, *FIT, "--recalibrate", "--margin", 3)
    assert r.returncode == 0, r.stderr
    shape = (30, 9, 3, 64, 64, 128, 64)
    npar = mlp_floats(1, 1, 0, *shape[3:])   # one parameter block
    pa = params(a, npar)
    pb = params(b, npar)
    nq = shape[0] * shape[1]
    assert np.array_equal(pa[nq:], pb[nq:]), "key maps unchanged"
    assert np.array_equal(pa[:nq, :-64], pb[:nq, :-64]), "query maps unchanged but for bo"
    shift = pb[:nq, -64:] - pa[:nq, -64:]
    # the calibration, the gate and the check each add one offset per head (their signs depend
    # on what the gate then finds best, so only the form is checked here)
    assert np.allclose(shift, shift[:, :1], atol=1e-4), "one shift per head"
    assert np.any(shift != 0)
    one_error(sift("fit-phi", "--data", data, "-o", tmp_path / "none.phi", "--recalibrate"),
              "recalibrate", "cannot open")


def test_fit_phi_check_verdict(prompt, tmp_path):
    """The end-to-end check on the text after the fit's tokens: a verdict in the file and in
    topk+phi's note; a map damaged on purpose (every query head's log-mass + 30: the completion
    swamps the exact part) is reported as losing; a file holding the random features themselves
    scores exactly what the fallback scores (same K, same positions, same steps)."""
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    a = tmp_path / "a.phi"
    r = sift("fit-phi", "--data", data, "-o", a, *FIT, "--check", 600)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr, "off a terminal: no bar"
    assert "fit-phi: layer 1/30 fitted" in r.stderr and "fit-phi: layer 30/30 fitted" in r.stderr
    rows = check_rows(r.stdout)
    assert "topk" in rows and "topk+phi, random features (no --phi)" in rows
    kept = [k for k in rows if "(kept)" in k]
    assert len(kept) == 1 and rows[kept[0]] == min(v for k, v in rows.items() if "fitted" in k)
    v = verdict(a)
    assert v and v in r.stdout and "fit-phi check on 600 held-out tokens" in v
    r = run_phi(prompt, a)
    assert r.returncode == 0, r.stderr
    assert v in r.stderr, "topk+phi prints the file's verdict"
    # damage: + 30 on every query head's output bias
    shape = (30, 9, 3, 64, 64, 128, 64)
    npar = mlp_floats(1, 1, 0, *shape[3:])
    p = params(a, npar).copy()
    p[:30 * 9, -64:] += 30
    bad = tmp_path / "bad.phi"
    bad.write_bytes(a.read_bytes()[:48] + p.tobytes())
    r = sift("fit-phi", "--data", data, "-o", bad, *FIT, "--check", 600, "--verify")
    assert r.returncode == 0, r.stderr
    rows = check_rows(r.stdout)
    damaged = rows[f"topk+phi, the maps in {bad}"]
    assert damaged > rows["topk+phi, random features (no --phi)"] and damaged > rows["topk"]
    assert "verdict: the fitted maps lose to both" in r.stdout
    assert "warning: the maps in" in r.stderr and "lose to random features" in r.stderr
    assert verdict(bad).startswith("the fitted maps lose to both")
    assert np.array_equal(params(bad, npar), p), "--verify leaves the maps as they are"
    r = run_phi(prompt, bad)
    assert r.returncode == 0 and "the fitted maps lose to both" in r.stderr
    # the fallback's own maps in a file: exactly the fallback's score
    prf = tmp_path / "prf.phi"
    t = subprocess.run([str(ROOT / "build" / "tests" / "tool_phi"), "prf", str(MODEL), str(prf)],
                       capture_output=True, text=True)
    assert t.returncode == 0, t.stderr
    r = sift("fit-phi", "--data", data, "-o", prf, *FIT, "--check", 600, "--verify")
    assert r.returncode == 0, r.stderr
    rows = check_rows(r.stdout)
    assert rows[f"topk+phi, the maps in {prf}"] == rows["topk+phi, random features (no --phi)"]
    assert "lose to random features" not in r.stdout


def test_fit_phi_too_little_text_for_the_check(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text(TEXT[:len(TEXT) // 3])
    a = tmp_path / "a.phi"
    r = sift("fit-phi", "--data", data, "-o", a, *FIT)
    assert r.returncode == 0, r.stderr
    assert "warning:" in r.stderr and "the end-to-end check needs 512" in r.stderr
    assert verdict(a).startswith("unchecked:")

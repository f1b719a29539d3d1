"""tests/test_gpu_harness.py — the GPU harness (build/tests/gpu_check, built when nvcc exists)
on a machine without a GPU: `--self` runs every check with the CPU backend on both sides, so
every row must be there and pass; `--self-fault` gives the second side an off-by-one attention
mask, and every attention kernel's row of every trap case (keys a query must not see, made large
enough to dominate its softmax) must then fail. What runs on a GPU is `make test-gpu`."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "tests", "gpu_check")

pytestmark = pytest.mark.skipif(not os.path.exists(BIN), reason="no CUDA build (nvcc not found)")


def rows(out):
    """(check, shape, result) of each table row."""
    got = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 7 and cells[0] != "check":
            got.append((cells[0], cells[1], cells[6]))
    return got


def run(*args, timeout=600):
    return subprocess.run([BIN, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_self_every_row_passes():
    p = run("--self")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert re.search(r"gpu_check: (\d+) passed, 0 failed", p.stdout)
    table = rows(p.stdout)
    checks = {c for c, _, _ in table}
    for k in ("fa2", "fa2w", "wg", "flash", "group", "split"):
        assert f"attention [{k}]" in checks, k
    # every strategy: prefill logits, kept positions, decode step logits, greedy prefix
    for c in ("kept positions agree", "decode step logits", "greedy same prefix"):
        n = sum(1 for ch, _, _ in table if ch == c)
        assert n >= 2 * 9, (c, n)   # two tiny models x the registry (9 strategies today)
    assert all(r == "ok" for _, _, r in table if not r.startswith("skip"))


def test_self_fault_fails_every_trap_case():
    p = run("--self-fault", "--ops-only")
    assert p.returncode == 1, p.stdout[-3000:]
    trap = [(c, s, r) for c, s, r in rows(p.stdout) if c.startswith("attention [") and "trap" in s]
    # prefill trap cases: hd128 x 3 kernels, 2 x hd64 x 2, hd96 x 1; decode trap cases: 5 x 1
    assert len(trap) >= 3 + 2 * 2 + 1 + 5
    assert all(r == "FAIL" for _, _, r in trap), [t for t in trap if t[2] != "FAIL"]
    # the other checks do not read the attention op: still passing
    others = [r for c, _, r in rows(p.stdout) if c.startswith(("rmsnorm", "matmul", "kv_append"))]
    assert others and all(r == "ok" for r in others)

"""tests/test_layers.py — tests/layers.py, the include-graph check: on a small tree with one planted
upward include, one circle and one oversized room it reports each of them (and fails); the real
tree passes."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "layers.py")


def run(root):
    return subprocess.run([sys.executable, SCRIPT, "--root", str(root)], capture_output=True, text=True)


def write(root, rel, includes, lines=5):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    body = [f'#include "{i}"' for i in includes] + [f"int x{n};" for n in range(lines)]
    path.write_text("\n".join(body) + "\n")


def test_planted_violations(tmp_path):
    write(tmp_path, "util/check.h", [])
    write(tmp_path, "util/check.c", ["check.h"])
    write(tmp_path, "weights/gguf.c", ["../util/check.h"])
    write(tmp_path, "kv/kv.c", ["../model/model.h"])                          # upward: kv -> model
    write(tmp_path, "kv/kv.h", ["../tok/tok.h"])                              # circle: kv <-> tok
    write(tmp_path, "tok/tok.h", ["../kv/kv.h"])
    write(tmp_path, "model/model.h", ["../util/check.h", "../weights/gguf.c"])
    write(tmp_path, "cmd/cli.c", ["../model/model.h"], lines=200)            # oversized: cmd
    write(tmp_path, "main.c", ["cmd/cli.c"])
    write(tmp_path, "tests/test_x.c", ["../main.c", "../cmd/nothing.h"])      # not a room: not read
    p = run(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    errs = p.stderr.splitlines()
    assert any(e.startswith("layers: upward include: kv -> model (kv/kv.c") for e in errs), errs
    assert "layers: circle: kv <-> tok include each other" in errs, errs
    assert any(e.startswith("layers: peer include: kv -> tok") for e in errs), errs
    assert any(e.startswith("layers: oversized room: cmd holds 201 of") for e in errs), errs
    assert len(errs) == 5, errs   # the four above and tok -> kv, nothing else (tests/ is no room)
    for room in ("util", "weights", "kv", "tok", "model", "cmd", "main.c"):
        assert any(line.split()[:1] == [room] for line in p.stdout.splitlines()), p.stdout


def test_unresolved_and_unknown(tmp_path):
    write(tmp_path, "util/check.c", ["missing.h"])
    write(tmp_path, "attic/old.c", ["../util/check.c"])
    for room in ("weights", "tok", "kv", "model", "cmd"):
        write(tmp_path, f"{room}/a.c", [])
    errs = run(tmp_path).stderr.splitlines()
    assert 'layers: unresolved include: util/check.c: #include "missing.h" names no file of the tree' in errs, errs
    assert "layers: unknown room: attic is in no layer of tests/layers.py's LAYERS" in errs, errs


def test_real_tree_passes():
    p = run(ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stderr == ""


def test_dot():
    p = subprocess.run([sys.executable, SCRIPT, "--dot"], capture_output=True, text=True)
    assert p.stdout.startswith("digraph sift {") and '"cmd" -> "policies";' in p.stdout, p.stdout

"""`--kept-map FILE.html` (jobs/keptmap.c): the data against hand-computed kept sets, and the page
in a real headless browser (Debian's chromium): it loads without a console error or a script
error, and the cells it draws as kept equal the counts from the JSON.

Hand-computed kept sets (specs): full keeps every token in every layer and KV head; speed keeps
the whole prompt in its first K layers and only the anchor (token 0) and the last prompt token
above them; streamingllm keeps the first 4 tokens and the last floor(N * kv_rate) - 4 in every
layer and head; topk decodes over a full cache and reads its sink and tail entries exactly at
every step, by every KV head (a step per generated token: the prompt's last token is its first
query)."""
import html
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tiny_gguf  # noqa: E402
from test_cli import SIFT, assert_error, sift  # noqa: E402

N_LAYER, N_KV, N_GEN = 4, 2, 6
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_gguf.write(str(tmp_path_factory.mktemp("m") / "tiny.gguf"), n_layer=N_LAYER,
                           n_kv=N_KV, ctx=4096)


@pytest.fixture(scope="module")
def kept(tiny, tmp_path_factory):
    """One A/B run over two prompts with --kept-map: (page path, JSON data, the run)."""
    d = tmp_path_factory.mktemp("km")
    words = "river stone cloud amber quiet lantern meadow copper violet harbor </script> & <b>".split()
    for name, n in (("a", 180), ("b", 260)):
        (d / f"{name}.txt").write_text(" ".join(words[(i * 7) % len(words)] for i in range(n)))
    page = d / "map.html"
    r = sift("-m", tiny, "-f", str(d / "a.txt"), "-f", str(d / "b.txt"), "--temp", "0", "-n", str(N_GEN),
             "--strategy", "full,speed,streamingllm,topk", "--speed-depth", "3", "--kv-rate", "0.25",
             "--kept-map", str(page), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads((d / "map.json").read_text())
    return page, data, r


def nonzero(rows):
    return sum(1 for row in rows for v in row if v > 0)


def test_data_matches_hand_computed_kept_sets(kept):
    _, data, r = kept
    generated = {(os.path.basename(x["file"]), x["strategy"]): x["timings"]["predicted_n"]
                 for x in map(json.loads, r.stdout.splitlines())}
    assert data["format"] == "sift-kept-map/1"
    assert [os.path.basename(p["id"]) for p in data["prompts"]] == ["a.txt", "b.txt"]
    for p in data["prompts"]:
        n = len(p["tokens"])
        by = {s["strategy"]: s for s in p["strategies"]}
        assert list(by) == ["full", "speed", "streamingllm", "topk"]
        for s in by.values():
            assert s["cache_layers"] == N_LAYER and s["kv_heads"] == N_KV
            assert len(s["kept"]) == N_LAYER and all(len(row) == n for row in s["kept"])
        assert by["full"]["kept"] == [[N_KV] * n] * N_LAYER and by["full"]["selected"] is None
        assert by["full"]["greedy_agree_pct"] == 100.0
        speed = by["speed"]["kept"]
        assert speed[:3] == [[N_KV] * n] * 3
        assert speed[3] == [N_KV if t in (0, n - 1) else 0 for t in range(n)]
        b = math.floor(n * 0.25)
        want = [N_KV if t < 4 or t >= n - (b - 4) else 0 for t in range(n)]
        assert by["streamingllm"]["kept"] == [want] * N_LAYER
        topk = by["topk"]
        assert topk["kept"] == [[N_KV] * n] * N_LAYER   # a full cache: decode selects from it
        steps = generated[(os.path.basename(p["id"]), "topk")]
        assert 1 <= steps <= N_GEN
        assert topk["selected_of"] == [steps * N_KV] * N_LAYER
        for row in topk["selected"]:
            assert all(0 <= v <= steps * N_KV for v in row)
            assert row[:4] == [steps * N_KV] * 4 and row[-16:] == [steps * N_KV] * 16  # sink, tail
            assert 0 < sum(1 for v in row[4:-16] if v) < n - 20   # a top K of the middle
        # the tokens are the prompt's pieces: they join into its text
        assert open(p["id"]).read() in "".join(p["tokens"])


def test_page_embeds_the_same_data(kept):
    page, data, r = kept
    text = page.read_text()
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S)
    assert m and json.loads(m.group(1)) == data   # "</script>" in a prompt is escaped, not cut
    assert "http://" not in text.split("</title>")[1] and "https://" not in text and "<link" not in text
    assert "<script src" not in text   # self-contained: no external script or style
    assert "kept map of 8 runs written to" in r.stderr


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (tests/setup.sh installs it)")
def test_page_in_headless_chromium(kept, tmp_path):
    page, data, _ = kept
    r = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                        "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
                        "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    console = [l for l in r.stderr.splitlines() if "CONSOLE" in l]
    assert not console, console   # no console message at all (errors print as CONSOLE lines)
    assert 'data-ready="1"' in dom, dom[-2000:]   # the script ran to its end
    errors = re.search(r'<div id="errors">(.*?)</div>', dom, re.S)
    assert errors and errors.group(1) == "", errors
    drawn = {(html.unescape(p), s): int(v) for p, s, v in re.findall(
        r'<span class="drawn" data-prompt="([^"]*)" data-strategy="([^"]*)">(\d+)</span>', dom)}
    want = {}
    for p in data["prompts"]:
        for s in p["strategies"]:
            # a cell is drawn when its value is above zero: decode's reads where counted, else
            # the KV heads holding the token
            want[(p["id"], s["strategy"])] = nonzero(s["selected"] if s["selected"] else s["kept"])
    assert drawn == want
    # the prompt text is readable under each grid: one span per token
    n_tokens = sum(len(p["tokens"]) * len(p["strategies"]) for p in data["prompts"])
    assert dom.count('title="token ') == n_tokens


def test_bad_kept_map_path(tiny, tmp_path):
    r = sift("-m", tiny, "-p", "river stone", "-n", "2", "--kept-map", str(tmp_path / "no" / "x.html"))
    assert_error(r, "cannot write")

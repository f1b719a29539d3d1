"""`--kept-map FILE.html` (jobs/keptmap.c): the data against hand-computed kept sets, and the page
in a real headless browser (Debian's chromium): it loads without a console error or a script
error, and the cells it draws as kept equal the counts from the JSON; measured in the browser at
1400 and 900 px wide: no horizontal scrolling, every strategy's grid (full's too, every cell
kept) shows each token of each layer inside the window, read back from the canvases' pixels
against the JSON, a ~1.8K-token prompt wrapped into bands of consecutive tokens; every grid has
axis titles, tick numbers at their rows' and columns' centres that do not touch, and a 0-to-1
legend for its shade.

Hand-computed kept sets (specs): full keeps every token in every layer and KV head; speed keeps
the whole prompt in its first K layers and only the anchor (token 0) and the last prompt token
above them; streamingllm keeps the first 4 tokens and the last floor(N * kv_rate) - 4 in every
layer and head; topk decodes over a full cache and reads its sink and tail entries exactly at
every step, by every KV head (a step per generated token: the prompt's last token is its first
query)."""
import html
import itertools
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
    for name, n in (("a", 180), ("b", 290)):   # b: about 1.8K tokens
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
    n_tokens = sum(len(p["tokens"]) for p in data["prompts"] for s in p["strategies"])
    assert dom.count('title="token ') == n_tokens


# Appended to a copy of the page: after its own script has drawn it, the geometry of each
# strategy's box as the browser laid it out, and what each grid's canvas shows at the centre of
# each cell (1: coloured, 0: white), into <pre id="geom"> for --dump-dom.
MEASURE = """<pre id="geom"></pre><script>
const box = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
const texts = (root, sel) => [...root.querySelectorAll(sel)].map(e => ({text: e.textContent, box: box(e)}));
const shown = c => {   // rows (canvas.dataset.rows) x columns (dataset.count) sampled at cell centres
  const w = c.width, h = c.height, n = +c.dataset.count, L = +c.dataset.rows;
  const px = c.getContext('2d').getImageData(0, 0, w, h).data, rows = [];
  for (let l = 0; l < L; l++) {
    let r = '';
    for (let t = 0; t < n; t++) {
      const i = (Math.floor((l + 0.5) * h / L) * w + Math.floor((t + 0.5) * w / n)) * 4;
      r += px[i] < 250 || px[i + 1] < 250 || px[i + 2] < 250 ? '1' : '0';
    }
    rows.push(r);
  }
  return rows;
};
document.getElementById('geom').textContent = JSON.stringify({
  inner_width: window.innerWidth,
  scroll_width: document.documentElement.scrollWidth,
  sections: [...document.querySelectorAll('section')].map(sec => [...sec.querySelectorAll('.strategy')].map(s => ({
    strategy: s.dataset.strategy,
    bands: [...s.querySelectorAll('.fig')].map(f => {
      const c = f.querySelector('canvas.grid');
      return {grid: box(c), first: +c.dataset.first, count: +c.dataset.count, rows: +c.dataset.rows,
              shown: shown(c), axis: texts(f, '.axis-label'), xticks: texts(f, '.ticks.x .tick'),
              yticks: texts(f, '.ticks.y .tick')};
    }),
    legend: texts(s, '.legend-title'),
    legend_bar: [...s.querySelectorAll('.legend-bar canvas')].map(box),
    legend_ticks: texts(s, '.legend-bar .tick'),
  })))});
</script>"""


def overlap(a, b):
    return a[0] < b[2] - 0.5 and b[0] < a[2] - 0.5 and a[1] < b[3] - 0.5 and b[1] < a[3] - 0.5


def measure_page(page, tmp_path, width):
    copy = tmp_path / "measure.html"
    copy.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    r = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000",
                        f"--window-size={width},1000", "--dump-dom", copy.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="geom">(.*?)</pre>', r.stdout, re.S)
    assert m and m.group(1), r.stdout[-2000:]
    shots = os.environ.get("SIFT_PLOT_SHOTS")
    if shots:
        subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
                        f"--window-size={width},2400",
                        f"--screenshot={os.path.join(shots, f'kept-map-{width}.png')}", page.as_uri()],
                       capture_output=True, timeout=120)
    return json.loads(html.unescape(m.group(1)))


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (tests/setup.sh installs it)")
@pytest.mark.parametrize("width", [1400, 900])
def test_page_fits_the_window_and_draws_every_cell(kept, tmp_path, width):
    """Measured in the browser at a window `width` px wide: no horizontal scrolling, and every
    strategy's grid (full's too: a grid of every cell, not a line) shows each prompt token of
    every cache layer, the last token inside the window; a prompt too long for one row of cells
    is wrapped into bands of consecutive tokens, each band every layer."""
    page, data, _ = kept
    geom = measure_page(page, tmp_path, width)
    assert geom["inner_width"] == width
    assert geom["scroll_width"] <= width   # nothing reaches past the window's right edge
    assert len(geom["sections"]) == len(data["prompts"])
    grids = [x["grid"] for boxes in geom["sections"] for b in boxes for x in b["bands"]]
    assert grids and all(g[0] >= 0 and g[2] <= width for g in grids), grids   # each inside the window
    wrapped = 0
    for p, boxes in zip(data["prompts"], geom["sections"]):
        n = len(p["tokens"])
        assert [b["strategy"] for b in boxes] == [s["strategy"] for s in p["strategies"]]
        for s, b in zip(p["strategies"], boxes):
            bands = b["bands"]
            assert bands, s["strategy"]
            # the bands: consecutive tokens from 0 to the last, every band all layers
            assert bands[0]["first"] == 0 and sum(x["count"] for x in bands) == n
            for a, c in zip(bands, bands[1:]):
                assert c["first"] == a["first"] + a["count"] and c["grid"][1] > a["grid"][3]
            wrapped += len(bands) > 1
            cw = (bands[0]["grid"][2] - bands[0]["grid"][0]) / bands[0]["count"]
            assert cw >= 1.9, cw   # a cell at least 2 px wide, the same in every band
            for x in bands:
                g = x["grid"]
                assert x["rows"] == N_LAYER and len(x["shown"]) == N_LAYER
                assert abs((g[2] - g[0]) / x["count"] - cw) < 0.01
                assert g[0] >= 0 and g[2] <= width   # the band's last token's cell is in the window
            # what each cell shows: coloured exactly where the data's value is above zero
            grid = s["selected"] if s["selected"] else s["kept"]
            for l in range(N_LAYER):
                shown = "".join(x["shown"][l] for x in bands)
                assert shown == "".join("1" if v > 0 else "0" for v in grid[l]), (s["strategy"], l)
            if s["strategy"] == "full":   # a full grid: every layer x token cell kept and drawn
                assert all(set("".join(x["shown"])) == {"1"} for x in bands)
    assert wrapped, "no prompt long enough to wrap at this width"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (tests/setup.sh installs it)")
def test_page_axes_and_legend(kept, tmp_path):
    """Measured in the browser at 1400 px: every grid (full's too) has its axis titles, tick
    numbers at the centres of their rows and columns (in a wrapped grid, each band numbered by the
    tokens it holds) that do not touch, and a legend from 0 to 1 saying what its shade means."""
    page, data, _ = kept
    geom = measure_page(page, tmp_path, 1400)
    for p, boxes in zip(data["prompts"], geom["sections"]):
        for s, b in zip(p["strategies"], boxes):
            labels = []
            for i, x in enumerate(b["bands"]):
                last = i == len(b["bands"]) - 1
                assert [a["text"] for a in x["axis"]] == ["cache layer"] + ["prompt token"] * last
                g = x["grid"]
                ch, cw = (g[3] - g[1]) / N_LAYER, (g[2] - g[0]) / x["count"]
                for axis, ticks, lo, hi in (("y", x["yticks"], 0, N_LAYER),
                                            ("x", x["xticks"], x["first"], x["first"] + x["count"])):
                    values = [int(t["text"]) for t in ticks]
                    assert values and values == sorted(set(values)) and lo <= values[0] and values[-1] < hi
                    assert len(values) >= 2 or (axis == "x" and last), (axis, values)   # a short last band
                    for t, v in zip(ticks, values):   # each number at the centre of its row or column
                        x0, y0, x1, y1 = t["box"]
                        if axis == "y":
                            assert abs((y0 + y1) / 2 - (g[1] + (v + 0.5) * ch)) < 1.5 and x1 <= g[0]
                        else:
                            assert abs((x0 + x1) / 2 - (g[0] + (v - lo + 0.5) * cw)) < 1.5 and y0 >= g[3]
                # the axis titles: left of the layer numbers, under the token numbers
                assert x["axis"][0]["box"][2] <= min(t["box"][0] for t in x["yticks"]) + 0.5
                if last:
                    assert x["axis"][1]["box"][1] >= max(t["box"][3] for t in x["xticks"]) - 0.5
                labels += x["axis"] + x["xticks"] + x["yticks"]
            for a, c in itertools.combinations(labels, 2):   # no two numbers or titles touch
                assert not overlap(a["box"], c["box"]), (s["strategy"], a, c)
            # the legend: what the shade means (kept, or decode's reads), 0 to 1 under a bar
            read = s["selected"] is not None
            assert len(b["legend"]) == 1 and len(b["legend_bar"]) == 1
            assert ("read the key" if read else "kept the token") in b["legend"][0]["text"]
            lt = b["legend_ticks"]
            bar = b["legend_bar"][0]
            assert [t["text"] for t in lt] == ["0", "0.5", "1"]
            assert abs((lt[0]["box"][0] + lt[0]["box"][2]) / 2 - bar[0]) < 1.5
            assert abs((lt[-1]["box"][0] + lt[-1]["box"][2]) / 2 - bar[2]) < 1.5
            for a, c in zip(lt, lt[1:]):
                assert not overlap(a["box"], c["box"])


def test_bad_kept_map_path(tiny, tmp_path):
    r = sift("-m", tiny, "-p", "river stone", "-n", "2", "--kept-map", str(tmp_path / "no" / "x.html"))
    assert_error(r, "cannot write")

"""The SVG plots of `sift sweep --plot` and `sift eval --plot` (eval/plot.c), measured in a real
headless browser (Debian's chromium): each SVG is put inline in a page whose script reads the
geometry the browser laid out (getBoundingClientRect) and writes it into the page, which
chromium --dump-dom returns. Checked on every plot:
- no two texts intersect (labels, numbers, ticks, axis titles, legend, key, notes), and each lies
  inside the picture;
- every point lies inside a plot frame, and no label covers a point;
- no point hides another: sweep points are at least a marker's radius apart (closer ones are
  merged into one point), eval points do not touch at all;
- sweep plots: every dot and frontier ring at least MARGIN px inside the frame (an agreement of 1
  or the fastest setting too), the frontier a line through its rings in x order or, when it is
  one point, a title saying so, and a legend under the plot with an entry for each kind of mark
  (a dot per colour named after its strategy, the ring, the line, leader lines), each drawn in
  the mark's own colour.
Inputs: real small runs on the 135M model (a sweep whose short prompt makes several settings run
alike; an eval at one context), and crafted data through build/tests/tool_plot (crowded
near-equal settings, two identical settings, too many settings in one spot for labels, a single
point, a one-point frontier, points at both ends of both axes, one context, many contexts and
strategies).
SIFT_PLOT_SHOTS=DIR also writes a PNG screenshot of each plot into DIR, to look at.
Run: .venv/bin/python -m pytest -q tests/test_plots.py
"""
import html
import itertools
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIFT = ROOT / "sift"
TOOL = ROOT / "build" / "tests" / "tool_plot"
MODEL = Path(os.environ.get("SIFT_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (tests/setup.sh installs it)")
need_tool = pytest.mark.skipif(not TOOL.exists(), reason="needs build/tests/tool_plot (make test-bins)")
need_model = pytest.mark.skipif(not MODEL.exists() or not SIFT.exists(), reason="needs ./sift and the default model")
ENV = dict(os.environ, OMP_WAIT_POLICY="passive")

MEASURE = """<!doctype html><html><head><meta charset="utf-8"></head><body style="margin:0">
%s
<pre id="geom"></pre>
<script>
const svg = document.querySelector('svg');
const box = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
document.getElementById('geom').textContent = JSON.stringify({
  svg: box(svg),
  areas: [...svg.querySelectorAll('rect.plot-area')].map(box),
  texts: [...svg.querySelectorAll('text')].map(t =>
    ({cls: t.getAttribute('class') || '', text: t.textContent, box: box(t)})),
  points: [...svg.querySelectorAll('circle.point')].map(c =>
    ({label: c.dataset.label || '', strategy: c.dataset.strategy || '', ctx: c.dataset.ctx || '',
      r: +c.getAttribute('r'), fill: c.getAttribute('fill'), box: box(c)})),
  circles: [...svg.querySelectorAll('circle')].map(c =>
    ({cls: c.getAttribute('class') || '', fill: c.getAttribute('fill'), stroke: c.getAttribute('stroke'),
      box: box(c)})),
  leaders: [...svg.querySelectorAll('line.leader')].map(l => ({stroke: l.getAttribute('stroke')})),
  polylines: [...svg.querySelectorAll('polyline')].map(l => {
    const m = l.getScreenCTM();
    return {cls: l.getAttribute('class') || '', stroke: l.getAttribute('stroke'),
            points: [...l.points].map(p => [m.a * p.x + m.c * p.y + m.e, m.b * p.x + m.d * p.y + m.f])};
  }),
  legend: [...svg.querySelectorAll('g.legend-entry')].map(g => {
    const mk = g.querySelector('.legend-mark');
    return {mark: g.dataset.mark, text: g.querySelector('text').textContent, tag: mk.tagName,
            fill: mk.getAttribute('fill'), stroke: mk.getAttribute('stroke'), box: box(g)};
  }),
});
</script></body></html>
"""


def chromium(url, tmp_path, *extra):
    return subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", *extra, url],
                          capture_output=True, text=True, timeout=120)


def measure(svg_path, tmp_path):
    """The geometry of the SVG at svg_path as the browser laid it out."""
    page = tmp_path / (svg_path.stem + "-measure.html")
    page.write_text(MEASURE % svg_path.read_text())
    r = chromium(page.as_uri(), tmp_path, "--virtual-time-budget=5000", "--dump-dom")
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="geom">(.*?)</pre>', r.stdout, re.S)
    assert m and m.group(1), r.stdout[-2000:]
    shots = os.environ.get("SIFT_PLOT_SHOTS")
    if shots:
        w, h = re.search(r'width="(\d+)" height="(\d+)"', svg_path.read_text()).groups()
        chromium(svg_path.as_uri(), tmp_path, f"--window-size={w},{h}",
                 f"--screenshot={Path(shots) / (svg_path.stem + '.png')}")
    return json.loads(html.unescape(m.group(1)))


def intersect(a, b, tol=0.5):
    """Boxes [left, top, right, bottom] overlap by more than tol pixels both ways."""
    return a[0] < b[2] - tol and b[0] < a[2] - tol and a[1] < b[3] - tol and b[1] < a[3] - tol


def within(a, b, tol=0.5):
    return a[0] >= b[0] - tol and a[1] >= b[1] - tol and a[2] <= b[2] + tol and a[3] <= b[3] + tol


def centre(b):
    return (b[0] + b[2]) / 2, (b[1] + b[3]) / 2


def check_readable(g, sweep):
    texts = [t for t in g["texts"] if t["text"].strip()]
    assert texts and g["points"] and g["areas"]
    for a, b in itertools.combinations(texts, 2):
        assert not intersect(a["box"], b["box"]), (a, b)
    for t in texts:
        assert within(t["box"], g["svg"]), t
    for p in g["points"]:
        assert any(within(p["box"], area, tol=0) for area in g["areas"]), p   # not even on the frame
        for t in texts:
            if "label" in t["cls"].split():
                assert not intersect(t["box"], p["box"]), (t, p)
    for a, b in itertools.combinations(g["points"], 2):
        if sweep:   # never one centre inside the other's marker: a separate point stays visible
            (ax, ay), (bx, by) = centre(a["box"]), centre(b["box"])
            assert math.hypot(ax - bx, ay - by) >= a["r"] - 0.1, (a, b)
        else:
            assert not intersect(a["box"], b["box"], tol=0), (a, b)


MARGIN = 12   # px between a sweep mark (a dot, a frontier ring) and its frame's edges, at least


def check_marks(g):
    """A sweep plot's marks: every dot and ring well inside the plot frame (not on its edge); the
    frontier a line through its rings in x order, or, when it is one ring, a title saying so
    (and no line); a legend entry, drawn with the mark's own colour, for each kind of mark."""
    (area,) = g["areas"]
    marks = [c for c in g["circles"] if c["cls"] in ("point", "frontier")]
    assert marks
    for c in marks:
        b = c["box"]
        assert b[0] >= area[0] + MARGIN and b[2] <= area[2] - MARGIN, (c, area)
        assert b[1] >= area[1] + MARGIN and b[3] <= area[3] - MARGIN, (c, area)
    rings = sorted(centre(c["box"]) for c in g["circles"] if c["cls"] == "frontier")
    line = [l for l in g["polylines"] if "frontier-line" in l["cls"].split()]
    (title,) = texts_of(g, "title")
    if len(rings) >= 2:
        assert len(line) == 1 and len(line[0]["points"]) == len(rings), line
        for (x, y), (rx, ry) in zip(sorted(line[0]["points"]), rings):
            assert abs(x - rx) < 0.6 and abs(y - ry) < 0.6
        assert "frontier connected" in title, title
    else:
        assert len(rings) == 1 and not line
        assert "one point" in title and "connected" not in title, title
    legend = g["legend"]
    area_bottom = area[3]
    for e in legend:
        assert e["box"][1] > area_bottom, e   # the legend under the plot, not over it
    by = lambda mark: [e for e in legend if e["mark"] == mark]
    # a dot per colour, named after the strategy whose points are drawn in it
    colours = {p["fill"] for p in g["points"]}
    assert {e["fill"] for e in by("dot")} == colours, (by("dot"), colours)
    for e in by("dot"):
        assert e["tag"] == "circle"
        assert any(name.split(" ")[0] == e["text"] for p in g["points"] if p["fill"] == e["fill"]
                   for name in p["label"].split(" = ")), e
    ring = [c for c in g["circles"] if c["cls"] == "frontier"][0]
    (r,) = by("ring")
    assert r["tag"] == "circle" and r["fill"] == "none" and r["stroke"] == ring["stroke"]
    assert "Pareto frontier" in r["text"]
    if line:
        (e,) = by("line")
        assert e["tag"] == "line" and e["stroke"] == line[0]["stroke"] and "frontier" in e["text"]
    else:
        assert not by("line")
    if g["leaders"]:
        (e,) = by("leader")
        assert e["tag"] == "line" and e["stroke"] == g["leaders"][0]["stroke"] and "label" in e["text"]
    else:
        assert not by("leader")


def texts_of(g, cls):
    return [t["text"] for t in g["texts"] if cls in t["cls"].split()]


def named(g, name):
    """name is drawn: a point's label (alone or merged), or a key line."""
    return any(name in p["label"].split(" = ") for p in g["points"]) and (
        any(name in t.split(" = ") for t in texts_of(g, "label")) or
        any(re.fullmatch(r"\d+  (.*?)( \(.*\))?", t) and name in re.fullmatch(
            r"\d+  (.*?)( \(.*\))?", t).group(1).split(" = ") for t in texts_of(g, "key")))


def plot(spec, tmp_path, name):
    r = subprocess.run([str(TOOL)], input=spec, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    path = tmp_path / f"{name}.svg"
    path.write_text(r.stdout)
    return measure(path, tmp_path)


def scatter_spec(rows):
    return "scatter\n" + "".join(f"{x} {y} {g} {on} {label}\n" for x, y, g, on, label in rows)


# ---- crafted sweeps ----

@need_tool
def test_sweep_crowded_and_identical(tmp_path):
    rows = [(1, 1, 0, 1, "full")]
    rows += [(1.02 + 0.004 * i, 0.9 - 0.003 * i, 1 + i % 3, int(i % 4 == 0), f"fastkv kv-rate=0.{i + 1:02d} tsp-rate=0.2")
             for i in range(14)]
    rows += [(1.3, 0.5, 4, 1, "speed speed-depth=8"), (1.3, 0.5, 4, 1, "speed speed-depth=4"),
             (0.95, 0.75, 5, 0, "streamingllm kv-rate=0.5")]
    g = plot(scatter_spec(rows), tmp_path, "sweep-crowded")
    check_readable(g, sweep=True)
    check_marks(g)
    assert g["leaders"]   # labels set apart: the legend says what their lines are
    for row in rows:
        assert named(g, row[4]), row[4]
    # the two identical settings: one point named after both, and a note saying so
    both = [p for p in g["points"] if "speed speed-depth=8" in p["label"]]
    assert len(both) == 1 and both[0]["label"] == "speed speed-depth=8 = speed speed-depth=4"
    notes = texts_of(g, "note")
    assert any("speed speed-depth=8" in n and "speed speed-depth=4" in n and "ran identically" in n
               for n in notes), notes
    # the near-equal fastkv settings are 6 px or more apart on this axis: each its own point
    assert len(g["points"]) == len(rows) - 1


@need_tool
def test_sweep_too_crowded_for_labels_uses_numbered_key(tmp_path):
    # 40 settings in a 48 x 30 px block (each ~6 px from its neighbours), plus two far points
    rows = [(0.5, 0.0, 0, 0, "lo"), (3.0, 1.0, 0, 1, "full")]
    rows += [(1 + 0.025 * (i % 8), 0.5 + 0.015 * (i // 8), 1 + i % 5, 0, f"fastkv kv-rate={i / 100:.2f}")
             for i in range(40)]
    g = plot(scatter_spec(rows), tmp_path, "sweep-numbered")
    check_readable(g, sweep=True)
    check_marks(g)
    numbers = texts_of(g, "number")
    keys = [t for t in texts_of(g, "key") if t != "key (numbered points)"]
    assert numbers and "key (numbered points)" in texts_of(g, "key")
    assert sorted(int(k.split()[0]) for k in keys) == list(range(1, len(keys) + 1))
    for n in numbers:   # each number at a point has its line in the key
        assert any(k.startswith(n + "  ") for k in keys), n
    for row in rows:
        assert named(g, row[4]), row[4]
    # the key lies beside the plot, not over it
    area = g["areas"][0]
    assert all(t["box"][0] > area[2] for t in g["texts"] if "key" in t["cls"].split())


@need_tool
def test_sweep_single_point_centred(tmp_path):
    g = plot(scatter_spec([(1, 1, 0, 1, "full")]), tmp_path, "sweep-single")
    check_readable(g, sweep=True)
    check_marks(g)
    (p,), area = g["points"], g["areas"][0]
    x, _ = centre(p["box"])
    assert abs(x - (area[0] + area[2]) / 2) < 2   # one speedup: the middle of its axis


@need_tool
def test_sweep_one_point_frontier_says_so(tmp_path):
    # full is faster and closer than every other setting: the frontier is full alone
    rows = [(1, 1, 0, 1, "full"), (0.8, 0.6, 1, 0, "fastkv kv-rate=0.1"),
            (0.9, 0.9, 2, 0, "speed speed-depth=20"), (0.7, 1, 3, 0, "topk budget=0.05")]
    g = plot(scatter_spec(rows), tmp_path, "sweep-one-frontier")
    check_readable(g, sweep=True)
    check_marks(g)
    assert len([c for c in g["circles"] if c["cls"] == "frontier"]) == 1
    assert {e["text"] for e in g["legend"] if e["mark"] == "dot"} == {"full", "fastkv", "speed", "topk"}


@need_tool
def test_sweep_extremes_inside_the_frame(tmp_path):
    # agreement 1 and 0, the slowest and the fastest setting: each at an end of an axis
    rows = [(1, 1, 0, 1, "full"), (2.5, 0, 1, 1, "speed speed-depth=4"), (1.5, 0.5, 2, 1, "fastkv kv-rate=0.1"),
            (0.5, 1, 3, 0, "topk budget=0.5"), (0.5, 0, 3, 0, "topk budget=0.01")]
    g = plot(scatter_spec(rows), tmp_path, "sweep-extremes")
    check_readable(g, sweep=True)
    check_marks(g)
    assert len(g["points"]) == len(rows)


# ---- crafted evals ----

EVAL_ONE = """eval
strategies full speed streamingllm topk fastkv+topk+phi
ctxs 1024
rec full 1024 1 300
rec speed 1024 1 150
rec streamingllm 1024 0 100
rec topk 1024 1 300
rec fastkv+topk+phi 1024 0.5 120
"""


@need_tool
def test_eval_one_context_centred_and_side_by_side(tmp_path):
    g = plot(EVAL_ONE, tmp_path, "eval-one-context")
    check_readable(g, sweep=False)
    assert len(g["points"]) == 2 * 5   # two panels, every strategy in each
    for area in g["areas"]:
        mine = [p for p in g["points"] if within(p["box"], area)]
        assert len(mine) == 5
        mid = (area[0] + area[2]) / 2
        for p in mine:   # near the middle of the panel, never at its left edge
            assert abs(centre(p["box"])[0] - mid) < 30, (p, area)
    notes = texts_of(g, "note")
    # full, speed and topk all score 1; full and topk take 300 ms: named, and drawn apart
    assert any(n.startswith("accuracy at context 1024:") and all(s in n for s in ("full", "speed", "topk"))
               for n in notes), notes
    assert any(n.startswith("TTFT at context 1024:") and "full" in n and "topk" in n for n in notes), notes
    assert {t for t in texts_of(g, "legend")} == {"full", "speed", "streamingllm", "topk", "fastkv+topk+phi"}


@need_tool
def test_eval_many_contexts_and_strategies(tmp_path):
    strategies = ["full", "fastkv+topk+phi", "specprefill+topk", "streamingllm", "snapkv+topk+phi",
                  "speed", "swiftkv", "window_score+topk"]
    ctxs = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
    lines = ["eval", "strategies " + " ".join(strategies), "ctxs " + " ".join(map(str, ctxs))]
    for si, s in enumerate(strategies):
        for ci, c in enumerate(ctxs):
            score = 1 if si % 3 == 0 else round(1 - 0.1 * ((si * ci) % 7), 2)   # ties at 1 and elsewhere
            lines.append(f"rec {s} {c} {score} {100 * (ci + 1) + 7 * si}")
    g = plot("\n".join(lines) + "\n", tmp_path, "eval-many")
    check_readable(g, sweep=False)
    assert len(g["points"]) == 2 * len(strategies) * len(ctxs)
    assert set(texts_of(g, "legend")) == set(strategies)


# ---- real runs on the 135M model ----

@need_model
def test_sweep_real_run(tmp_path):
    # a 20-token prompt: streamingllm's rates keep nearly the same cache, so those points crowd
    p = tmp_path / "p.txt"
    p.write_text("The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is")
    out = tmp_path / "sweep-real.svg"
    r = subprocess.run([str(SIFT), "sweep", "-m", str(MODEL), "-f", str(p), "--grid",
                        "streamingllm:kv-rate=0.3,0.5,0.7,0.9;speed:speed-depth=8,16,24", "-n", "2", "-t", "1",
                        "-q", "-o", str(tmp_path / "s.json"), "--plot", str(out)],
                       capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr
    g = measure(out, tmp_path)
    check_readable(g, sweep=True)
    check_marks(g)
    settings = json.loads((tmp_path / "s.json").read_text())["settings"]
    for s in settings:
        assert named(g, f"{s['strategy']} {s['grid']}".strip()), s
    merged = [p for p in g["points"] if " = " in p["label"]]
    notes = texts_of(g, "note")
    assert len(notes) == len(merged)   # one note per merged point, naming all of it
    for p in merged:
        assert any(all(name in n for name in p["label"].split(" = ")) for n in notes), (p, notes)


@need_model
def test_eval_real_run_one_context(tmp_path):
    out = tmp_path / "eval-real.svg"
    r = subprocess.run([str(SIFT), "eval", "-m", str(MODEL), "--strategy", "full,speed,streamingllm,topk",
                        "--tasks", "niah", "--n-prompt", "256", "--samples", "1", "-t", "1", "-q",
                        "-o", str(tmp_path / "e.json"), "--plot", str(out)],
                       capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr
    g = measure(out, tmp_path)
    check_readable(g, sweep=False)
    assert len(g["points"]) == 2 * 4
    for area in g["areas"]:
        mid = (area[0] + area[2]) / 2
        for p in g["points"]:
            if within(p["box"], area):
                assert abs(centre(p["box"])[0] - mid) < 30, (p, area)
    assert "256" in texts_of(g, "tick")

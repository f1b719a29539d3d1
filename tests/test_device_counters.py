"""tests/test_device_counters.py — what each strategy asks of the GPU, from the CUDA backend's own
counters (backend/backend.h: bk_counters; util/cuda_util.cuh counts every copy, wait,
allocation, launch and graph replay of the CUDA files), through the SIMT emulation build: the
same sources, so the same counts a device run prints, without a GPU.

One sift-simt batch (--parallel 1, greedy): a warm-up request (full) that grows the backend's
workspaces, then every strategy of the registry and gpu_check's compositions on one prompt. Each
record's "device_counters" must show a strategy that keeps its work on the device:

* per decode step after the first (decode_step, the mean): at most one synchronisation, at most
  16 bytes each way beyond the sampled token (4 bytes: the token down, the token up), exactly one
  graph replay (every step after the first recorded: no eager step);
* per prefill: at most 2 device allocations inside its passes: the cache and the kept entries'
  buffers are made before them, so what remains is the first use in the process of a workspace
  that grows on demand (the warm-up grows full's; fastkv is the first to grow the window
  probabilities' buffer, speed the dropped rows' index upload); an allocation per layer makes 30
  here. And at most 16 KiB to the host beyond the logits (vocab x 4 bytes). The
  issue's bound is 1 MiB at a 32K prompt; per-token data at this 60-token prompt and 30 layers
  (window probabilities: 8 rows x 9 heads x 60 keys x 4 bytes = 17 KiB a layer) is caught by 16
  KiB, and what a device-only selection sends back (fastkv's TSP rows) is a few hundred bytes.

EXPECTED_FAIL lists the strategies whose device path does not meet a bound yet, with the bound:
the test fails when one of them starts meeting it (update the list) as when any other misses
one. It is empty: every strategy and composition keeps its work on the device. topk's and
topk+phi's steps run whole in backend memory (attn_topk_step: the selection, the attention over
it and the anchors, topk+phi's completion from summaries and maps resident there, the read
counts; the length the device's) and replay, alone and composed; swiftkv's decode hooks are
recordable (device products appended to the group leaders' caches); specprefill pools and folds
its speculator's attention on the device (window_scores, score_fold_max), copies the prompt's
scores to the host once, and draws each lookahead token where the logits are (fwd_run_draw: the
token comes back, not the logits)."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIFT_SIMT = os.path.join(ROOT, "build", "sift-simt")
SIFT = os.path.join(ROOT, "sift")
MODEL = os.path.join(ROOT, os.environ.get("SIFT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
VOCAB = 49152

COMPOSED = ["fastkv+topk", "specprefill+topk+phi", "speed+topk"]   # gpu_check's, as test_gpu_simt
SETTINGS = ["--kv-rate", "0.3", "--topk", "8", "--chunk", "16"]
PROMPT = ("Note: The train to Lyon leaves at 7:40 from platform 3. Marie's cat is called Pistache "
          "and sleeps on the red sofa. The spare key is under the flower pot.\n\nQuestion: What is "
          "the name of Marie's cat?")
N_PREDICT = 5   # the first token from the prefill, then 4 steps: 3 counted after the first

# strategy -> the bounds it does not meet yet (names as check() reports them)
EXPECTED_FAIL = {}


def check(dc):
    """The names of the bounds device_counters dc misses."""
    miss = set()
    pre, dec = dc["prefill"], dc["decode_step"]
    if pre["allocs"] > 2:
        miss.add("prefill_allocs")
    if pre["d2h_bytes"] - 4 * VOCAB > 16 * 1024:
        miss.add("prefill_d2h")
    if dec is None:
        return miss | {"decode_missing"}
    if dec["syncs"] > 1:
        miss.add("decode_syncs")
    if dec["h2d_bytes"] > 4 + 16:
        miss.add("decode_h2d")
    if dec["d2h_bytes"] > 4 + 16:
        miss.add("decode_d2h")
    if dec["graph_replays"] != 1:
        miss.add("decode_replays")
    return miss


def registry():
    p = subprocess.run([SIFT, "--strategy", "no-such-strategy", "-p", "x"], capture_output=True,
                       text=True, timeout=30)
    return p.stderr.split("available: ")[1].split(", or all")[0].split(", ")


@pytest.mark.skipif(not os.path.exists(SIFT_SIMT) or not os.path.exists(SIFT),
                    reason="no SIMT build (clang++ missing) or no ./sift")
@pytest.mark.skipif(not os.path.exists(MODEL), reason=f"{MODEL} absent (make model)")
def test_every_strategy_keeps_its_work_on_the_device(tmp_path):
    names = registry() + COMPOSED
    reqs = [("warm-up", "full")] + [(s, s) for s in names]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps({"id": i, "messages": [{"role": "user", "content": PROMPT}],
                                        "strategy": s, "n_predict": N_PREDICT}) + "\n"
                            for i, s in reqs))
    env = dict(os.environ, SIFT_CUDA_WEIGHTS="bf16")   # the emulator's fast path (test_gpu_simt)
    p = subprocess.run([SIFT_SIMT, "-m", MODEL, "--device", "cuda", "--temp", "0", "--prompts",
                        str(path), "--parallel", "1", "--json", "-q", *SETTINGS], cwd=ROOT,
                       capture_output=True, text=True, timeout=1800, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = {r["id"]: r for r in map(json.loads, p.stdout.splitlines())}
    assert sorted(recs) == sorted(i for i, _ in reqs), recs.keys()
    got, report = {}, []
    for s in names:
        r = recs[s]
        assert "error" not in r and r["device"] == "cuda" and r["strategy"] == s, r
        assert "too short" not in (r["note"] or "") and "without compression" not in (r["note"] or ""), r
        dc = r["device_counters"]
        assert dc and set(dc["prefill"]) == {"h2d_bytes", "d2h_bytes", "syncs", "allocs", "launches",
                                             "graph_replays"}, dc
        got[s] = check(dc)
        report.append(f"{s}: {json.dumps(dc)} misses {sorted(got[s]) or 'nothing'}")
    print("\n".join(report))
    want = {s: EXPECTED_FAIL.get(s, set()) for s in names}
    assert got == want, "\n".join(report)
    # the counters count: a plain prefill reads its logits back, a decode step its token
    full = recs["full"]["device_counters"]
    assert full["prefill"]["d2h_bytes"] >= 4 * VOCAB and full["prefill"]["launches"] > 30
    assert full["decode_step"]["d2h_bytes"] >= 4 and full["decode_step"]["syncs"] == 1


@pytest.mark.skipif(not os.path.exists(SIFT_SIMT) or not os.path.exists(SIFT),
                    reason="no SIMT build (clang++ missing) or no ./sift")
@pytest.mark.skipif(not os.path.exists(MODEL), reason=f"{MODEL} absent (make model)")
def test_page_selector_keeps_its_work_on_the_device(tmp_path):
    """--selector pages (attn/pages.h): the bounds built at attach, each step's page bounds, page
    top-k, exact scores of the chosen pages and the attention all in the recorded step. Pages of
    8 over the ~40-entry mid region, 2 of 5 read: the paged path, not every page (the note says
    which)."""
    names = ["topk", "topk+phi", "speed+topk"]
    reqs = [("warm-up", "full")] + [(s, s) for s in names]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps({"id": i, "messages": [{"role": "user", "content": PROMPT}],
                                        "strategy": s, "n_predict": N_PREDICT}) + "\n"
                            for i, s in reqs))
    env = dict(os.environ, SIFT_CUDA_WEIGHTS="bf16")
    p = subprocess.run([SIFT_SIMT, "-m", MODEL, "--device", "cuda", "--temp", "0", "--prompts",
                        str(path), "--parallel", "1", "--json", "-q", *SETTINGS, "--selector", "pages",
                        "--page-size", "8", "--pages", "2"], cwd=ROOT, capture_output=True, text=True,
                       timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = {r["id"]: r for r in map(json.loads, p.stdout.splitlines())}
    for s in names:
        r = recs[s]
        assert "error" not in r and r["device"] == "cuda", r
        assert "selector pages: 8 keys a page, 2 of" in r["note"] and "(all: exact)" not in r["note"], r["note"]
        assert check(r["device_counters"]) == set(), (s, r["device_counters"])

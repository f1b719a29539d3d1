"""--parallel measured against one sequence at a time (jobs/tune.c): each decode step and each
prefill of several queued prompts runs shared or one at a time, whichever the job's own pairs of
passes measured cheaper. The way moves time only: the texts with --parallel N equal the same
requests one at a time (--parallel 1), whether the runner measures (the default), is told to share
every pass (SIFT_PARALLEL_WAY=together: the runner before the measurement) or to run every pass
alone (SIFT_PARALLEL_WAY=alone: the fallback's passes, which a machine whose shared passes lose
takes). The decision itself (pairs, medians, intervals, the note) is tests/test_tune.c's; speed
is bench/RESULTS.md's."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tiny_gguf  # noqa: E402
from test_cli import MODEL, assert_error, need_model, sift  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = "river stone cloud amber quiet lantern meadow copper violet harbor".split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # quantised matrices (Q8_0): short prompts share a rounding class, so queued ones pack
    return tiny_gguf.write(str(tmp_path_factory.mktemp("m") / "tiny_q8.gguf"), n_layer=4, ctx=4096,
                           dtype=tiny_gguf.gguf.GGMLQuantizationType.Q8_0)


def write_job(path, n, seeded):
    """n requests of 3 to ~60 words, n_predict 6 .. 30 (they finish apart), greedy or seeded."""
    rows = []
    for i in range(n):
        words = [3, 9, 40, 5, 60, 12, 4, 25, 7, 50, 6, 18][i % 12]
        r = {"id": f"t{i}", "prompt": " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(words)),
             "n_predict": 6 + 6 * (i % 5)}
        r.update(temp=0.8, seed=500 + 11 * i) if seeded else r.update(temp=0)
        rows.append(r)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run_job(model, path, parallel, way=None):
    env = {"SIFT_PARALLEL_WAY": way} if way else None
    r = sift("-m", model, "--prompts", path, "--json", "-q", "--parallel", str(parallel), env=env)
    assert r.returncode == 0, r.stderr
    return [json.loads(l) for l in r.stdout.splitlines() if l.strip()]


def texts(recs):
    return [(r["id"], r["text"], r["timings"]["predicted_n"]) for r in recs]


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
def test_every_way_equals_one_at_a_time(tiny, tmp_path, seeded):
    path = write_job(tmp_path / "r.jsonl", 12, seeded)
    one = texts(run_job(tiny, path, 1))
    for parallel in (2, 4, 8):
        for way in (None, "measure", "together", "alone"):
            recs = run_job(tiny, path, parallel, way)
            assert texts(recs) == one, (parallel, way)
            if way == "alone":   # every prompt prefilled by itself
                assert all(r["prefill_shared"] == 1 for r in recs)
            if way == "together" and parallel >= 4:   # not vacuous: queued prompts packed
                assert max(r["prefill_shared"] for r in recs) >= 2


def test_bad_way_is_a_usage_error(tiny, tmp_path):
    path = write_job(tmp_path / "r.jsonl", 2, False)
    for bad in ("", "fast", "Alone", "shared"):
        r = sift("-m", tiny, "--prompts", path, "--json", "-q", "--parallel", "2",
                 env={"SIFT_PARALLEL_WAY": bad})
        assert_error(r, "SIFT_PARALLEL_WAY", code=2)
        assert r.stdout == ""


@need_model
def test_default_model_job_equals_one_at_a_time(tmp_path):
    # the kind of job, smaller: prompts of 60-240 words, -n 8, greedy
    words = open(os.path.join(ROOT, "README.md")).read().split()
    rows = []
    for i in range(6):
        n = 60 + 36 * i
        rows.append({"id": f"d{i}", "prompt": " ".join(words[40 * i:40 * i + n])})
    path = tmp_path / "job.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["--prompts", str(path), "-n", "8", "--temp", "0", "--json", "-q"]
    one = sift(*base, "--parallel", "1")
    assert one.returncode == 0, one.stderr
    ref = [json.loads(l)["text"] for l in one.stdout.splitlines()]
    for way in ("measure", "alone"):
        r = sift(*base, "--parallel", "4", env={"SIFT_PARALLEL_WAY": way})
        assert r.returncode == 0, r.stderr
        assert [json.loads(l)["text"] for l in r.stdout.splitlines()] == ref, way

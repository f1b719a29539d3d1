"""Crash torture of a batch job's records file (jobs/resume.c, jobs/run.c), in the spirit of
SQLite's crash tests. A batch of 30 short requests on the 135M model (greedy, -n 6) is killed with
SIGKILL at seeded points drawn over an uninterrupted run's measured duration and resumed after
each kill (--parallel 4 in sift's record shape, --parallel 1 in the Batch API's); writes are made
to fail by means that also catch stdio's own writes: ENOSPC on a small tmpfs mounted for the test,
EFBIG under `ulimit -f` with SIGXFSZ ignored, a private full device node (mknod 1 7). After every
sequence the file must hold exactly one valid record per request, in input order, each answer
equal to the uninterrupted run's, and the same after a damaged middle line is planted and the job
resumed. Each test prints what it survived (kill points, faults). SIFT_CRASH_SEED picks the seed."""
import json
import os
import random
import resource
import signal
import stat
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_cli import MODEL, SIFT, need_model  # noqa: E402

pytestmark = need_model
SEED = int(os.environ.get("SIFT_CRASH_SEED", "35"))
N_REQ = 30
WORDS = "river stone cloud amber quiet lantern meadow copper violet harbor".split()


def env():
    e = dict(os.environ)
    e.pop("SIFT_MODEL", None)
    return e


def prompt(i):
    return " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(3 + i % 4))


def write_requests(path, shape):
    with open(path, "w") as f:
        for i in range(N_REQ):
            if shape == "sift":
                f.write(json.dumps({"id": f"q{i}", "prompt": prompt(i)}) + "\n")
            else:
                f.write(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                                    "body": {"max_tokens": 6, "temperature": 0,
                                             "messages": [{"role": "user", "content": prompt(i)}]}}) + "\n")
    return str(path)


def answer(rec, shape):
    """(id, answer) of a record of the shape; a record of the other shape fails the test."""
    if shape == "sift":
        assert set(rec) >= {"id", "index", "text", "strategy"} and "custom_id" not in rec, rec
        return rec["id"], (rec["text"], rec["stop"])
    assert set(rec) - {"sift"} == {"id", "custom_id", "response", "error"} and rec["error"] is None, rec
    ch = rec["response"]["body"]["choices"][0]
    return rec["custom_id"], (ch["message"]["content"], ch["finish_reason"])


def check_partial(path, shape):
    """After a kill: every line that ends in a newline is a whole record of the shape, no request
    twice; only a last line may be cut short. Returns (records, whether the tail was cut)."""
    if not os.path.exists(path):
        return 0, False
    data = open(path, "rb").read()
    lines = data.split(b"\n")
    torn = lines[-1] != b""
    ids = [answer(json.loads(l), shape)[0] for l in lines[:-1]]
    assert len(ids) == len(set(ids)), ids
    return len(ids), torn


def check_final(path, shape, ref):
    """Exactly one valid record per request, in input order, each answer the reference's; no
    temporary or lock file left beside it."""
    lines = open(path, "rb").read().split(b"\n")
    assert lines[-1] == b"", "the file ends in a whole record"
    got = [answer(json.loads(l), shape) for l in lines[:-1]]
    assert [i for i, _ in got] == [f"q{i}" for i in range(N_REQ)]
    assert dict(got) == ref
    d, base = os.path.split(path)
    assert sorted(f for f in os.listdir(d) if f.startswith(base) or f.startswith("." + base)) == [base]


def base_args(prompts, par):
    return ["-m", MODEL, "--prompts", prompts, "--temp", "0", "-n", "6", "-q", "--parallel", str(par),
            "-c", "512"]


def reference(tmp_path, shape, par):
    """An uninterrupted run: its answers and its wall time (from the start of the process)."""
    import time
    prompts = write_requests(tmp_path / f"req-{shape}.jsonl", shape)
    out = str(tmp_path / f"ref-{shape}.jsonl")
    t0 = time.monotonic()
    r = subprocess.run([SIFT, *base_args(prompts, par), "--output", out], env=env(), capture_output=True,
                       text=True, timeout=300)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    ref = dict(answer(json.loads(l), shape) for l in open(out))
    assert len(ref) == N_REQ
    return prompts, ref, took


def plant_damage(path, rng):
    """Cuts a middle record in half (its newline kept): a damaged line with valid records on both
    sides. Returns its 1-based line number and byte offset."""
    lines = open(path, "rb").read().splitlines(keepends=True)
    k = rng.randrange(3, len(lines) - 3)
    off = sum(len(l) for l in lines[:k])
    lines[k] = lines[k][: len(lines[k]) // 2] + b"\n"
    open(path, "wb").write(b"".join(lines))
    return k + 1, off


def report(capsys, line):
    with capsys.disabled():
        sys.stderr.write(f"\n{line}\n")


def test_kill_and_resume_torture(tmp_path, capsys):
    rng = random.Random(SEED)
    kills, sequences, torn, damaged, finished_early = 0, 0, 0, 0, 0
    on_file = []   # whole records on file at each kill: the kills spread over the job
    for shape, par, want in (("sift", 4, 20), ("openai", 1, 20)):
        prompts, ref, took = reference(tmp_path, shape, par)
        args = base_args(prompts, par)
        n_kills = 0
        while n_kills < want:
            out = str(tmp_path / f"seq{sequences}" / "out.jsonl")
            os.makedirs(os.path.dirname(out))
            resume = []
            while True:   # run, kill at a drawn time, resume ... until a run ends by itself
                at = rng.uniform(0.05, 1.0) * took
                p = subprocess.Popen([SIFT, *args, "--output", out, *resume], env=env(),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                try:
                    _, err = p.communicate(timeout=at)
                except subprocess.TimeoutExpired:
                    p.send_signal(signal.SIGKILL)
                    p.communicate()
                    n_kills += 1
                    n, cut = check_partial(out, shape)
                    torn += cut
                    on_file.append(n)
                    resume = ["--resume"]
                    continue
                assert p.returncode == 0, err
                finished_early += 1
                break
            check_final(out, shape, ref)
            # a damaged middle line: reported by line and offset, only its request runs again
            line, off = plant_damage(out, rng)
            r = subprocess.run([SIFT, *args, "--output", out, "--resume"], env=env(), capture_output=True,
                               text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            assert f"line {line} (byte offset {off})" in r.stderr, r.stderr
            check_final(out, shape, ref)
            damaged += 1
            sequences += 1
        kills += n_kills
    assert kills >= 40
    mid = sum(0 < n < N_REQ for n in on_file)
    report(capsys, f"crash torture (seed {SEED}): {kills} SIGKILL points survived in {sequences} "
           f"sequences ({mid} with 1..{N_REQ - 1} of {N_REQ} records on file, {torn} cut-short last "
           f"records), {damaged} damaged middle lines repaired; every file: one record per request, "
           f"answers equal to an uninterrupted run's")


def run_fault(args, out, preexec=None):
    return subprocess.run([SIFT, *args, "--output", out], env=env(), capture_output=True, text=True,
                          timeout=300, preexec_fn=preexec)


def check_after_fault(r, out, shape, what):
    """A failed write: exit 1, one error naming the file and the reason; the file holds whole
    records only (cut back to the last one)."""
    assert r.returncode == 1, r.stderr
    assert out in r.stderr and what in r.stderr, r.stderr
    n, torn = check_partial(out, shape)
    assert not torn and n < N_REQ
    return n


def test_enospc_on_a_small_tmpfs(tmp_path, capsys):
    prompts, ref, _ = reference(tmp_path, "sift", 4)
    args = base_args(prompts, 4)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    survived = []
    for kib in (8, 12, 20):
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): the ENOSPC runs need root")
        try:
            out = str(mnt / "out.jsonl")
            n = check_after_fault(run_fault(args, out), out, "sift", "No space left on device")
            # room again (the same file system, bigger): the job resumes from the whole records
            subprocess.run(["mount", "-o", "remount,size=4m", str(mnt)], check=True)
            r = run_fault([*args, "--resume"], out)
            assert r.returncode == 0, r.stderr
            check_final(out, "sift", ref)
            survived.append(n)
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
    report(capsys, f"crash torture: {len(survived)} ENOSPC faults survived (tmpfs full after "
           f"{survived} whole records), each resumed to one record per request")


def test_efbig_under_ulimit(tmp_path, capsys):
    prompts, ref, _ = reference(tmp_path, "sift", 4)
    args = base_args(prompts, 4)
    survived = []
    for limit in (2500, 6000, 11000):
        def small_files(limit=limit):
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        out = str(tmp_path / f"efbig{limit}" / "out.jsonl")
        os.makedirs(os.path.dirname(out))
        n = check_after_fault(run_fault(args, out, small_files), out, "sift", "File too large")
        assert os.path.getsize(out) <= limit
        r = run_fault([*args, "--resume"], out)
        assert r.returncode == 0, r.stderr
        check_final(out, "sift", ref)
        survived.append(n)
    report(capsys, f"crash torture: {len(survived)} EFBIG faults survived (ulimit -f, after {survived} "
           f"whole records), each resumed to one record per request")


def test_full_device_node(tmp_path, capsys):
    prompts, ref, _ = reference(tmp_path, "sift", 4)
    args = base_args(prompts, 4)
    full = tmp_path / "full"
    try:
        os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except PermissionError as e:
        pytest.skip(f"mknod refused ({e}): the full-device runs need root")
    faults = 0
    # --output on the device: written in place, the failure named, the node left a device
    r = run_fault(args, str(full))
    assert r.returncode == 1 and str(full) in r.stderr and "No space left" in r.stderr, r.stderr
    assert stat.S_ISCHR(os.stat(full).st_mode)
    faults += 1
    # --errors on the device: the first failed request's record cannot be written; the answers
    # before it are whole, and the job resumes with --errors on a file
    bad = tmp_path / "bad.jsonl"
    lines = open(prompts).read().splitlines(keepends=True)
    lines[12] = '{"id": "q12", "prompt": 12}\n'   # not a string: an error record
    bad.write_text("".join(lines))
    bargs = base_args(str(bad), 4)
    out = str(tmp_path / "out.jsonl")
    r = subprocess.run([SIFT, *bargs, "--output", out, "--errors", str(full)], env=env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1 and f"--errors '{full}'" in r.stderr and "No space left" in r.stderr, r.stderr
    assert stat.S_ISCHR(os.stat(full).st_mode)
    assert check_partial(out, "sift") == (12, False)   # the answers before line 13, in order
    errs = str(tmp_path / "errs.jsonl")
    r = subprocess.run([SIFT, *bargs, "--output", out, "--errors", errs, "--resume"], env=env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr   # q12's line is still bad: its error record, in --errors
    got = [json.loads(l) for l in open(out)]
    assert [x["id"] for x in got] == [f"q{i}" for i in range(N_REQ) if i != 12]
    assert {x["id"]: (x["text"], x["stop"]) for x in got} == {k: v for k, v in ref.items() if k != "q12"}
    assert [(x["id"], "error" in x) for x in map(json.loads, open(errs))] == [("q12", True)]
    faults += 1
    # text to stdout on the device
    with open(full, "w") as fd:
        r = subprocess.run([SIFT, *args], stdout=fd, stderr=subprocess.PIPE, text=True, env=env(), timeout=300)
    assert r.returncode == 1 and "stdout" in r.stderr, r.stderr
    faults += 1
    report(capsys, f"crash torture: {faults} full-device faults survived (--output, --errors, stdout "
           f"on a private mknod 1 7 node, left a device)")

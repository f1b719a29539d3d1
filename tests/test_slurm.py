"""examples/slurm/sift-array.sbatch on a real Slurm: a single-node cluster (slurmctld + slurmd +
munged from Debian's packages, on localhost, in a temporary directory, ports chosen free) runs a
4-task array over one requests file; one task is cancelled mid-run (after its first record) and
requeued; it resumes its shard (--resume), and the shards concatenated in task order equal one
process's run of the whole file record for record (every field but the timings). Skipped, with
the reason, when the daemons are not installed (tests/setup.sh installs them), when not root
(slurmd must be), or when the node is not idle within a minute."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tiny_gguf  # noqa: E402
from test_cli import ROOT, SIFT  # noqa: E402

SBATCH = os.path.join(ROOT, "examples", "slurm", "sift-array.sbatch")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
TASKS, REQUESTS = 4, 24
# fields of a record that depend on the machine's speed, not on the request
TIMING = ("timings", "load_ms")
# what a request's prefill computed (not its answer) depends on which requests share its process:
# a shared prefix (--prefix-cache) is found among the requests of one shard
WORK = ("rows_processed", "rows_pct_of_full", "prefix_tokens", "prefix")


def path_without_sift():
    """$PATH less the directories that hold a sift."""
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not os.access(os.path.join(d, "sift"), os.X_OK))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stray_stepds(conf):
    """slurmstepd processes of this cluster (SLURM_CONF=conf) still running."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f, open(f"/proc/{pid}/environ", "rb") as e:
                mine = f"SLURM_CONF={conf}".encode() in e.read().split(b"\0")
                if f.read().strip() == "slurmstepd" and mine:
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def tail(path, n=5):
    try:
        return " | ".join(open(path, errors="replace").read().splitlines()[-n:])
    except OSError:
        return "(no log)"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running single-node Slurm: the environment its commands need."""
    missing = [d for d in DAEMONS if not shutil.which(d)]
    if missing:
        pytest.skip(f"Slurm not installed ({', '.join(missing)} missing; tests/setup.sh installs "
                    "slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root to start jobs")
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool", "munge"):
        (d / sub).mkdir()
    os.chmod(d / "munge", 0o700)
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    sock = d / "munge" / "sock"
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(f"""ClusterName=sifttest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:{TASKS}
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = []
    try:
        procs.append(subprocess.Popen(
            ["munged", "-F", "-f", f"--socket={sock}", f"--key-file={key}",
             f"--log-file={d}/munged.log", f"--pid-file={d}/munge/munged.pid",
             f"--seed-file={d}/munge/seed"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(["slurmctld", "-D", "-c", "-i"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(["slurmd", "-D", "-N", host], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        t0, state = time.time(), ""
        while time.time() - t0 < 60:
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True,
                               timeout=20)
            state = r.stdout.strip() or r.stderr.strip()
            if state == "idle":
                break
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.5)
        if state != "idle":
            dead = [f"{n} exited with {p.returncode}" for n, p in
                    zip(("munged", "slurmctld", "slurmd"), procs) if p.poll() is not None]
            why = ", ".join(dead) or f"node: {state!r}"
            pytest.skip(f"Slurm did not start within 60 s ({why}; slurmctld: "
                        f"{tail(d / 'slurmctld.log')}; slurmd: {tail(d / 'slurmd.log')})")
        yield env
    finally:
        # end every job while slurmctld and slurmd are up: a job step whose controller is gone
        # retries its completion message for ever (slurmstepd would outlive the test)
        if len(procs) == 3 and all(p.poll() is None for p in procs):
            subprocess.run(["scancel", "-p", "debug"], env=env, timeout=30)
            t0 = time.time()
            while time.time() - t0 < 30 and subprocess.run(
                    ["squeue", "-h"], env=env, capture_output=True, text=True,
                    timeout=20).stdout.strip():
                time.sleep(0.5)
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for pid in stray_stepds(conf):   # left only when the jobs did not drain in time
            os.kill(pid, 9)


def squeue(env, job):
    """{task: state} of the array job's tasks still known to squeue; None when squeue itself
    failed (a busy slurmctld answers "Socket timed out"): no answer is not "no tasks left"."""
    r = subprocess.run(["squeue", "-h", "-j", job, "-o", "%K %T"], env=env, capture_output=True,
                       text=True, timeout=20)
    if r.returncode != 0:
        return None
    return dict(line.split() for line in r.stdout.splitlines() if line.strip())


def wait(what, cond, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def lines(path):
    return path.read_text().count("\n") if path.exists() else 0


def test_array_job_with_a_cancelled_and_requeued_task(slurm, tmp_path):
    # a 4-layer random model: each request decodes for about half a second, each shard for a few
    model = tiny_gguf.write(str(tmp_path / "small.gguf"), n_layer=4, d=256, n_head=4, n_kv=2,
                            ff=512, ctx=4096)
    words = "river stone cloud amber quiet lantern meadow copper violet harbor".split()
    req = tmp_path / "req.jsonl"
    req.write_text("".join(json.dumps({
        "id": f"r{i}", "prompt": " ".join(words[(i * 7 + j) % len(words)] for j in range(5 + 4 * i)),
        "n_predict": 800 + 50 * (i % 5)}) + "\n" for i in range(REQUESTS)))
    flags = ["-t", "1", "--temp", "0", "-s", "1"]
    ref = tmp_path / "ref.jsonl"
    r = subprocess.run([SIFT, "-m", model, "--prompts", str(req), "--output", str(ref), "-q", *flags],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr

    out = tmp_path / "out"
    # no SIFT=: the script finds sift in the directory sbatch ran from (SLURM_SUBMIT_DIR), not on
    # PATH (taken out of it) nor beside the spooled copy of itself that Slurm runs
    submit = tmp_path / "submit"
    submit.mkdir()
    (submit / "sift").symlink_to(SIFT)
    env = {**slurm, "PROMPTS": str(req), "OUT_DIR": str(out), "MODEL": model,
           "SIFT_ARGS": " ".join(flags), "PATH": path_without_sift()}
    env.pop("SIFT", None)
    r = subprocess.run(["sbatch", "--parsable", f"--array=0-{TASKS - 1}", f"--chdir={tmp_path}",
                        "--export=ALL", SBATCH], env=env, cwd=submit, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    victim = out / "shard-1.jsonl"
    try:
        # cancel task 1 once it has written its first record: mid-shard (6 requests)
        wait("task 1's first record", lambda: lines(victim) >= 1)
        subprocess.run(["scancel", f"{job}_1"], env=slurm, check=True, timeout=30)
        wait("task 1 to stop", lambda: (q := squeue(slurm, job)) is not None and "1" not in q)
        # the request in flight when SIGTERM came is written as interrupted (it runs again)
        recs = [json.loads(l) for l in victim.read_text().splitlines()]
        cut = sum(x.get("stop") != "interrupted" for x in recs)
        assert len(recs) - cut <= 1, recs
        assert 1 <= cut < REQUESTS // TASKS, f"task 1 was not stopped mid-shard ({cut} records)"
        subprocess.run(["scontrol", "requeue", f"{job}_1"], env=slurm, check=True, timeout=30)
        # a requeued job waits two minutes before it is eligible again; let it start now
        task = re.search(r"JobId=(\d+)", subprocess.run(
            ["scontrol", "show", "job", f"{job}_1"], env=slurm, capture_output=True, text=True,
            timeout=30).stdout).group(1)
        subprocess.run(["scontrol", "update", f"jobid={task}", "StartTime=now"], env=slurm,
                       check=True, timeout=30)
        # the requeued task must have started again (its log says so) before "no task left in
        # squeue" means the array is done: requeueing is asynchronous
        log_path = tmp_path / f"sift-{job}_1.log"
        wait("the requeued task to start",
             lambda: log_path.exists() and "restart 1" in log_path.read_text(), timeout=300)
        wait("the array to finish", lambda: squeue(slurm, job) == {}, timeout=300)
    finally:
        subprocess.run(["scancel", job], env=slurm, timeout=30)
    log = log_path.read_text()
    assert "restart 1" in log, log[-3000:]
    assert f"6 requests in this shard: {6 - cut} to run, {cut} done before (--resume)" in log, log[-3000:]

    def records(text):
        return [{k: v for k, v in json.loads(l).items() if k not in TIMING + WORK} for l in text.splitlines()]

    merged = "".join((out / f"shard-{k}.jsonl").read_text() for k in range(TASKS))
    assert records(merged) == records(ref.read_text())
    for k in range(TASKS):
        s = json.loads((out / f"shard-{k}.summary.json").read_text())
        assert s["shard"] == [k, TASKS] and s["failed"] == 0 and not s["interrupted"]


# ---- where the script finds sift (bash alone, with the variables Slurm sets) -----------------

def run_task(tmp_path, submit, path=None, sift=None):
    """The script as task 0 of 1 would run it, from submit (SLURM_SUBMIT_DIR)."""
    model = tiny_gguf.write(str(tmp_path / "tiny.gguf"))
    req = tmp_path / "req.jsonl"
    req.write_text(json.dumps({"id": "a", "prompt": "the cat"}) + "\n")
    env = {"PATH": path or path_without_sift(), "PROMPTS": str(req), "OUT_DIR": str(tmp_path / "out"),
           "MODEL": model, "SIFT_ARGS": "-n 2 -t 1 --temp 0 -q", "SLURM_ARRAY_TASK_ID": "0",
           "SLURM_ARRAY_TASK_COUNT": "1", "SLURM_ARRAY_JOB_ID": "7", "SLURM_SUBMIT_DIR": str(submit)}
    if sift:
        env["SIFT"] = sift
    return subprocess.run(["bash", SBATCH], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def test_script_finds_sift_in_the_submit_dir(tmp_path):
    submit = tmp_path / "repo"
    submit.mkdir()
    (submit / "sift").symlink_to(SIFT)
    r = run_task(tmp_path, submit)
    assert r.returncode == 0, r.stderr
    rec = json.loads((tmp_path / "out" / "shard-0.jsonl").read_text())
    assert rec["id"] == "a" and rec["strategy"] == "full"


def test_script_prefers_sift_on_path(tmp_path):
    """sift on PATH comes before the submit directory's (here a stand-in that says it ran)."""
    bin_dir, submit = tmp_path / "bin", tmp_path / "repo"
    bin_dir.mkdir(), submit.mkdir()
    (submit / "sift").symlink_to(SIFT)
    (bin_dir / "sift").write_text("#!/bin/sh\necho \"path sift $*\" >&2\n")
    (bin_dir / "sift").chmod(0o755)
    r = run_task(tmp_path, submit, path=f"{bin_dir}{os.pathsep}{path_without_sift()}")
    assert r.returncode == 0 and "path sift -m" in r.stderr, r.stderr


def test_script_without_sift_names_sift_variable(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_task(tmp_path, empty)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"sift-array: error: no sift on PATH nor in the submit directory "
                                f"({empty}); set SIFT=/path/to/sift (--export=ALL,SIFT=...)")
    assert not (tmp_path / "out" / "shard-0.jsonl").exists()

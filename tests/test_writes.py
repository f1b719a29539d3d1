"""Every write is checked: the files sift produces whole (--summary, --kept-map, eval and sweep
reports and plots, fit-phi maps) and stdout.

- A target that is a private full device (mknod, major 1 minor 7; never the system's /dev/full):
  a non-zero exit, one `sift: error:` line naming the flag, the file and "No space left on
  device", and the node is still the same character device (not replaced by a regular file).
- A symlink target stays a symlink; its target gets the whole content.
- Nothing is modified before the run has something to write: an old summary, kept map or report
  is intact when the run fails before writing (a missing model, a prompt file that is not there).
- No fixed FILE.tmp: a leftover FILE.tmp is untouched, two concurrent writers of one summary both
  succeed and leave one whole summary and no temporary.
- A regular file replaced keeps its mode; a failed write (a full tmpfs mounted for the test)
  leaves the old file as it was and no temporary.
- A link to /proc/self/fd/1 (/dev/stdout's target; the test never names a system path) gets the
  summary after the text, through stdout (not over it); a FIFO is written in place.
- stdout to the full device: a non-zero exit and "cannot write to stdout: No space left on device".
Tests run as root (CI); the node and the tmpfs cases are skipped with the reason where the machine
refuses them. Runs are tiny: the 135M test model, -n 2."""
import json
import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIFT = ROOT / "sift"
MODEL = Path(os.environ.get("SIFT_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
ENV = {**os.environ, "OMP_NUM_THREADS": "2"}
ENV.pop("SIFT_MODEL", None)
FULL_DEV = os.makedev(1, 7)
DATA = ("The river carried stones from the mountains to the sea, and every stone remembered "
        "a different winter. ") * 40
FIT = ["-c", 160, "--steps", 3, "--queries", 8, "--seed", 3, "--positions", 160, "--check", 0]
SUMMARY_KEYS = {"prompts", "done", "failed", "left", "wall_s", "decode_tokens", "model", "format"}

pytestmark = pytest.mark.skipif(not MODEL.exists(), reason="default model missing (make model)")


def sift(*args, stdout=subprocess.PIPE, **kw):
    return subprocess.run([str(SIFT), *map(str, args)], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, env=ENV, timeout=600, **kw)


def prompt(*args, **kw):
    """A two-token greedy answer to "hi"."""
    return sift("-m", MODEL, "-p", "hi", "-n", 2, "--temp", 0, "-q", *args, **kw)


def full_node(path):
    """A private stand-in for /dev/full at path (skips the test where mknod is refused)."""
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, FULL_DEV)
    except OSError as e:
        pytest.skip(f"mknod refused: {e}")
    return path


def assert_still_node(path):
    st = os.lstat(path)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == FULL_DEV, f"{path} was replaced"


def assert_full_error(r, flag, path):
    """A non-zero exit and one error line: cannot write FLAG 'PATH': No space left on device."""
    assert r.returncode != 0, r.stderr
    errors = [l for l in r.stderr.splitlines() if l.startswith("sift: error:")]
    assert errors == [f"sift: error: cannot write {flag} '{path}': No space left on device"], r.stderr


def temporaries(d):
    return sorted(p.name for p in Path(d).iterdir() if ".tmp" in p.name)


def eval_args(tmp_path):
    return ["eval", "-m", MODEL, "--strategy", "full", "--tasks", "niah", "--n-prompt", 256,
            "--samples", 1, "-t", 2, "-q"]


def sweep_args(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("The river flows past the old stone bridge and into the quiet valley.")
    return ["sweep", "-m", MODEL, "-f", p, "--grid", "speed:speed-depth=1", "-n", 2, "-t", 2, "-q"]


# ---- a full device as the target ----

def test_summary_to_full_device(tmp_path):
    node = full_node(tmp_path / "full")
    r = prompt("--summary", node)
    assert_full_error(r, "--summary", node)
    assert_still_node(node)
    assert temporaries(tmp_path) == []


def test_kept_map_to_full_device(tmp_path):
    node = full_node(tmp_path / "map.html")
    r = prompt("--kept-map", node)
    assert_full_error(r, "--kept-map", node)
    assert_still_node(node)
    assert not (tmp_path / "map.json").exists()   # the page failed: the data file is not written
    assert temporaries(tmp_path) == []


@pytest.mark.parametrize("flag,name", [("-o", "r.json"), ("--csv", "r.csv"), ("--plot", "r.svg")])
def test_eval_report_to_full_device(tmp_path, flag, name):
    node = full_node(tmp_path / name)
    r = sift(*eval_args(tmp_path), flag, node)
    assert_full_error(r, flag, node)
    assert_still_node(node)


@pytest.mark.parametrize("flag,name", [("-o", "s.json"), ("--csv", "s.csv"), ("--plot", "s.svg")])
def test_sweep_report_to_full_device(tmp_path, flag, name):
    node = full_node(tmp_path / name)
    r = sift(*sweep_args(tmp_path), flag, node)
    assert_full_error(r, flag, node)
    assert_still_node(node)


def test_fit_phi_maps_to_full_device(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text(DATA)
    node = full_node(tmp_path / "maps.phi")
    r = sift("fit-phi", "-m", MODEL, "--data", data, "-o", node, *FIT)
    assert r.returncode != 0
    errors = [l for l in r.stderr.splitlines() if l.startswith("sift: error:")]
    assert errors == [f"sift: error: fit-phi: cannot write phi file '{node}': No space left on device"]
    assert_still_node(node)
    assert temporaries(tmp_path) == []


def test_stdout_to_full_device(tmp_path):
    node = full_node(tmp_path / "full")
    with open(node, "w") as out:
        r = prompt(stdout=out)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == ["sift: error: cannot write to stdout: No space left on device"]
    for help in (["--help"], ["bench", "--help"], ["fit-phi", "--help"]):   # help text too
        with open(node, "w") as out:
            r = sift(*help, stdout=out)
        assert r.returncode == 1 and "cannot write to stdout: No space left on device" in r.stderr, help
    with open(node, "w") as out:   # a subcommand's tables (a write failed inside printf: stdio
        r = sift(*eval_args(tmp_path), stdout=out)   # keeps no errno for it, only the error flag)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() in (
        ["sift: error: cannot write to stdout: No space left on device"],
        ["sift: error: cannot write to stdout: an earlier write failed"]), r.stderr
    assert_still_node(node)


def test_summary_and_stdout_both_failing_say_it_once(tmp_path):
    """A failed --summary makes the exit code non-zero; the final stdout check then stays quiet."""
    node = full_node(tmp_path / "full")
    with open(node, "w") as out:
        r = prompt("--summary", node, stdout=out)
    assert r.returncode == 1
    assert len([l for l in r.stderr.splitlines() if l.startswith("sift: error:")]) == 1, r.stderr


# ---- links, FIFOs, /dev/stdout ----

def test_symlink_summary_stays_a_link(tmp_path):
    target, link = tmp_path / "real.json", tmp_path / "link.json"
    target.write_text("x" * 5000)   # longer than a summary: the new content must not keep a tail
    link.symlink_to("real.json")
    r = prompt("--summary", link)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == "real.json"
    s = json.loads(target.read_text())
    assert SUMMARY_KEYS <= s.keys() and s["prompts"] == 1 and s["done"] == 1 and s["failed"] == 0
    assert temporaries(tmp_path) == []


def test_symlink_kept_map_stays_a_link(tmp_path):
    (tmp_path / "pages").mkdir()
    link = tmp_path / "map.html"
    link.symlink_to(tmp_path / "pages" / "real.html")   # dangling: its target does not exist yet
    r = prompt("--kept-map", link)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink()
    page = (tmp_path / "pages" / "real.html").read_text()
    assert page.rstrip().endswith("</html>") and "sift-kept-map/1" in page
    assert json.loads((tmp_path / "map.json").read_text())["format"] == "sift-kept-map/1"


def test_symlink_to_full_device(tmp_path):
    node = full_node(tmp_path / "full")
    link = tmp_path / "s.json"
    link.symlink_to(node)
    r = prompt("--summary", link)
    assert_full_error(r, "--summary", link)
    assert link.is_symlink() and os.readlink(link) == str(node)
    assert_still_node(node)


def test_summary_to_stdout_link_follows_the_text(tmp_path):
    """--summary through a link to /proc/self/fd/1 (what /dev/stdout is; a private link, so that a
    writer that replaced links would replace only this one, never the system's /dev/stdout) with
    stdout in a file: the answer, as a run without --summary writes it, then the summary, through
    stdout — not written over the text."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    alone, both = tmp_path / "alone.txt", tmp_path / "both.txt"
    with open(alone, "w") as f:
        assert prompt(stdout=f).returncode == 0
    with open(both, "w") as f:
        r = prompt("--summary", link, stdout=f)
    assert r.returncode == 0, r.stderr
    answer, text = alone.read_text(), both.read_text()
    assert answer.strip() and text.startswith(answer)
    s = json.loads(text[len(answer):])
    assert SUMMARY_KEYS <= s.keys() and s["done"] == 1
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


def prompt_into_fifo(fifo, flag):
    """Runs prompt() with `flag` naming a new FIFO; (the result, what a reader got from it)."""
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    r = prompt(flag, fifo)
    reader.join(60)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and got
    return r, got[0]


def test_summary_to_fifo(tmp_path):
    _, got = prompt_into_fifo(tmp_path / "s.fifo", "--summary")
    assert json.loads(got)["done"] == 1


def test_kept_map_to_fifo_writes_no_data_file_beside_it(tmp_path):
    """A device or pipe has no "beside": the page (which holds the data inline) goes into it, and
    no FILE.json appears next to it (for /dev/stdout that would be /dev/stdout.json)."""
    _, got = prompt_into_fifo(tmp_path / "map.html", "--kept-map")
    assert got.startswith("<!doctype html>") and '"sift-kept-map/1"' in got
    assert sorted(os.listdir(tmp_path)) == ["map.html"]


# ---- nothing modified before there is something to write ----

def test_old_files_intact_when_the_run_fails_early(tmp_path):
    summ, page, data = tmp_path / "s.json", tmp_path / "map.html", tmp_path / "map.json"
    for p in (summ, page, data):
        p.write_text(f"old {p.name}\n")
    r = sift("-m", tmp_path / "no-such-model.gguf", "-p", "hi", "-n", 2, "--summary", summ,
             "--kept-map", page)
    assert r.returncode != 0 and "no-such-model.gguf" in r.stderr
    for p in (summ, page, data):
        assert p.read_text() == f"old {p.name}\n"


def test_old_reports_intact_when_eval_and_sweep_fail_early(tmp_path):
    olds = {tmp_path / n: f"old {n}\n" for n in ("r.json", "r.csv", "r.svg", "s.json")}
    for p, t in olds.items():
        p.write_text(t)
    r = sift("eval", "-m", MODEL, "--n-prompt", 100000, "-o", tmp_path / "r.json", "--csv",
             tmp_path / "r.csv", "--plot", tmp_path / "r.svg")
    assert r.returncode == 2 and "beyond the model's context" in r.stderr
    r = sift("sweep", "-m", MODEL, "-f", tmp_path / "none.txt", "-n", 2, "-o", tmp_path / "s.json")
    assert r.returncode != 0 and "none.txt" in r.stderr
    for p, t in olds.items():
        assert p.read_text() == t


def test_unwritable_path_fails_before_the_run(tmp_path):
    bad = tmp_path / "no" / "s.json"
    r = prompt("--summary", bad)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"sift: error: cannot write --summary '{bad}': directory "
                                f"'{tmp_path / 'no'}': No such file or directory")


# ---- temporaries: unique names, modes, a failed write ----

def test_leftover_tmp_and_concurrent_writers(tmp_path):
    summ, leftover = tmp_path / "s.json", tmp_path / "s.json.tmp"
    leftover.write_text("someone else's\n")
    procs = [subprocess.Popen([str(SIFT), "-m", str(MODEL), "-p", "hi", "-n", "2", "--temp", "0",
                               "-q", "--summary", str(summ)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=ENV) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    s = json.loads(summ.read_text())   # one whole summary: the last rename's
    assert SUMMARY_KEYS <= s.keys() and s["done"] == 1
    assert leftover.read_text() == "someone else's\n"
    assert temporaries(tmp_path) == ["s.json.tmp"]


def test_modes(tmp_path):
    summ = tmp_path / "s.json"
    r = prompt("--summary", summ, preexec_fn=lambda: os.umask(0o027))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(summ).st_mode) == 0o640   # 0666 less the umask, as open() gives
    os.chmod(summ, 0o604)
    r = prompt("--summary", summ)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(summ).st_mode) == 0o604   # a replaced file keeps its mode


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 64 KiB tmpfs mounted for the test (skipped where mounting is refused)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_full_disk_keeps_the_old_summary(small_tmpfs):
    summ = small_tmpfs / "s.json"
    summ.write_text("old summary\n")
    fd = os.open(small_tmpfs / "filler", os.O_WRONLY | os.O_CREAT)   # every page taken
    try:
        while os.write(fd, b"\0" * 4096) > 0:
            pass
    except OSError:
        pass
    os.close(fd)
    r = prompt("--summary", summ)
    assert_full_error(r, "--summary", summ)
    assert summ.read_text() == "old summary\n"
    assert temporaries(small_tmpfs) == []

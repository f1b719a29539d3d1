"""The one flag table (cmd/flags.c): every subcommand's --help, the bash and zsh completions, the
man page and docs/usage.md's table list exactly the table's flags (the table read from `sift
--list-flags`, never from the outputs compared); every flag of the table runs through every
subcommand (accepted where it applies, refused naming the subcommands that take it elsewhere);
the cases of issue 36 with their messages; the command lines of bench/gpu.sh, bench/bench.sh,
README.md and every docs/ page still parse (SIFT_PARSE_ONLY=1); docs/usage.md's exit codes; make
install. Parse errors come before any model is loaded, so most cases need none."""
import os
import re
import shlex
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIFT = os.path.join(ROOT, "sift")
MODEL = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
SUBS = ["run", "bench", "eval", "sweep", "ppl", "fit-phi"]


def sift(*args, parse_only=False, cwd=None):
    env = dict(os.environ)
    env.pop("SIFT_MODEL", None)
    env.pop("SIFT_PARSE_ONLY", None)
    if parse_only:
        env["SIFT_PARSE_ONLY"] = "1"
    return subprocess.run([SIFT, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=120, cwd=cwd)


def sub_argv(sub, *args):
    return list(args) if sub == "run" else [sub, *args]


def table():
    """{sub: {name: (type, list|choices|-)}} from sift --list-flags."""
    r = sift("--list-flags")
    assert r.returncode == 0, r.stderr
    t = {s: {} for s in SUBS}
    for line in r.stdout.splitlines():
        sub, name, typ, extra = line.split("\t")
        t[sub][name] = (typ, extra)
    return t


TABLE = table()


def test_table_has_the_issues_shape():
    """Hand-written expectations of the table itself: -c, -o, -q, -v and --device in every
    subcommand; -p in run (the prompt) and bench (the prompt length) only; lists where the issue
    names them; the strategy parameters in the four subcommands that run strategies."""
    for sub in SUBS:
        for name in ("-c", "--ctx-size", "-o", "--output", "-q", "-v", "-h", "--device", "-t"):
            assert name in TABLE[sub], (sub, name)
    assert [s for s in SUBS if "-p" in TABLE[s]] == ["run", "bench"]
    assert TABLE["bench"]["-t"][1] == "list" and TABLE["bench"]["--parallel"][1] == "list"
    assert TABLE["bench"]["-p"][1] == "list" and TABLE["eval"]["--n-prompt"][1] == "list"
    assert TABLE["run"]["-t"][1] == "-" and TABLE["run"]["--parallel"][1] == "-"
    assert TABLE["sweep"]["--n-prompt"][1] == "-"
    for sub in ("run", "bench", "eval", "sweep"):
        assert "--kv-rate" in TABLE[sub] and "--budget" in TABLE[sub]
    assert "--kv-rate" not in TABLE["ppl"] and "--sink" in TABLE["fit-phi"]
    assert "--batch" in TABLE["run"] and "--batch" not in TABLE["fit-phi"]
    assert "--fit-batch" in TABLE["fit-phi"] and "--format" in TABLE["bench"]
    assert "--chunks" in TABLE["ppl"] and "--temp" in TABLE["run"]
    for old in ("--ctx", "--reps", "--out", "-ngl"):
        assert all(old not in TABLE[s] for s in SUBS), old


# ---- the generated outputs list exactly the table's flags ----------------------------------------

def help_flags(text):
    """Names in --help's flag lines: '  -n, --n-predict N   text ... also --n-gen'."""
    names, entry = set(), None
    entries = []
    for line in text.splitlines():
        m = re.match(r"^  (?:(-[\w-]+), )?\s*(--[\w-]+)", line)
        if m and not line.startswith(" " * 20):
            entry = [line]
            entries.append(entry)
            names.update(n for n in m.groups() if n)
        elif line.startswith(" " * 20) and entry is not None:
            entry.append(line)
        else:
            entry = None
    for e in entries:
        names.update(re.findall(r"; also (-[\w-]+)", " ".join(x.strip() for x in e)))
    return names


@pytest.mark.parametrize("sub", SUBS)
def test_help_lists_the_table(sub):
    r = sift(*sub_argv(sub, "--help"))
    assert r.returncode == 0 and r.stderr == ""
    assert help_flags(r.stdout) == set(TABLE[sub])


def test_bash_completion_lists_the_table(tmp_path):
    r = sift("--completion", "bash")
    assert r.returncode == 0
    f = tmp_path / "sift.bash"
    f.write_text(r.stdout)
    assert subprocess.run(["bash", "-n", str(f)]).returncode == 0
    got = dict(re.findall(r'^\s+([\w-]+)\) opts="([^"]*)";;', r.stdout, re.M))
    assert set(got) == set(SUBS)
    for sub in SUBS:
        assert sorted(got[sub].split()) == sorted(TABLE[sub]), sub
    # completing for real: `sift bench --n-p<TAB>` and `sift --device <TAB>`
    script = (f"source {f}; COMP_WORDS=(sift bench --n-p); COMP_CWORD=2; _sift; echo ${{COMPREPLY[@]}};"
              f"COMP_WORDS=(sift --device ''); COMP_CWORD=2; _sift; echo ${{COMPREPLY[@]}}")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout.splitlines()
    assert out == ["--n-predict --n-prompt", "auto cpu cuda"]


def test_zsh_completion_lists_the_table(tmp_path):
    r = sift("--completion", "zsh")
    assert r.returncode == 0 and r.stdout.startswith("#compdef sift")
    blocks = re.findall(r"^    ([\w-]+)\)\n        _arguments(.*?);;", r.stdout, re.M | re.S)
    assert [b[0] for b in blocks] == SUBS
    for sub, body in blocks:
        assert sorted(re.findall(r"'\*?(-[\w-]+)=?\[", body)) == sorted(TABLE[sub]), sub
    if not shutil.which("zsh"):
        pytest.skip("zsh is not installed (the names are checked above; zsh -n needs zsh)")
    f = tmp_path / "_sift"
    f.write_text(r.stdout)
    assert subprocess.run(["zsh", "-n", str(f)]).returncode == 0


def test_man_page_lists_the_table(tmp_path):
    r = sift("--man")
    assert r.returncode == 0 and r.stdout.startswith(".TH SIFT 1")
    sections = [s for s in re.split(r'^\.SH ', r.stdout, flags=re.M) if s.startswith('"')]
    assert [s[1:].split('"')[0] for s in sections] == ["SIFT (RUN)"] + SUBS[1:]
    for sub, sec in zip(SUBS, sections):
        names = set()
        for head in re.findall(r"^\.TP\n(.*)$", sec, re.M):
            names.update(n.replace("\\-", "-") for n in re.findall(r"\\fB(.*?)\\fR", head))
        assert names == set(TABLE[sub]), sub
    if shutil.which("groff"):
        f = tmp_path / "sift.1"
        f.write_text(r.stdout)
        g = subprocess.run(["groff", "-man", "-ww", "-z", str(f)], capture_output=True, text=True)
        assert g.returncode == 0 and g.stderr == "", g.stderr


def test_usage_doc_table_is_the_generated_one():
    r = sift("--help-markdown")
    usage = open(os.path.join(ROOT, "docs", "usage.md")).read()
    m = re.search(r"<!-- flags:begin \(sift --help-markdown\) -->\n(.*?)<!-- flags:end -->", usage, re.S)
    assert m, "docs/usage.md has no generated flag table"
    assert m.group(1) == r.stdout
    # the manual holds the one copy: README links to it rather than keeping another
    assert "flags:begin" not in open(os.path.join(ROOT, "README.md")).read()
    # one row per flag: every long name of the table has its row
    longs = {n for s in SUBS for n in TABLE[s] if n.startswith("--")}
    rows = set(re.findall(r"^\| `(?:-[\w-]+(?: \(bench\))?, )?(--[\w-]+)", r.stdout, re.M))
    assert longs - rows <= {n for s in SUBS for n in TABLE[s] if "also `" + n in r.stdout}


# ---- every flag through every subcommand ---------------------------------------------------------

VALUES = {"--rates": "h200", "--n-prompt": "128", "-p": "128", "--queries": "8", "--positions": "128", "-c": "128",
          "--ctx-size": "128", "--shard": "0/2", "--grid": "fastkv:kv-rate=0.1", "--plot": "p.svg",
          "--fidelity": "first", "--device": "cpu", "--min-agreement": "0.5", "--seed": "3",
          "-s": "3", "--tasks": "niah", "--strategy": "full", "--output-format": "sift",
          "--anchor": "none", "--pool": "avg", "--keep-last": "off", "--selector": "pages", "--selector-recall": "on", "--swiftkv-norm": "own",
          "--pool-kernel": "5", "--spec-pool": "5", "--kv-rate": "0.2", "--tsp-rate": "0.2",
          "--keep": "0.2", "--budget": "0.05", "--top-p": "0.5", "--min-p": "0.1",
          "--temp": "0.5", "--lr": "0.001", "--calibrate": "0.1", "--margin": "1",
          "--repeat": "2", "-r": "2", "--repetitions": "2", "--format": "csv", "--wtype": "f32",
          "--weights": "f32", "--speed": "ttft", "--batch": "dir", "--data": "t.txt",
          "--system": "Be brief.", "--system-prompt": "Be brief."}


def value_for(name, typ, extra):
    if name in VALUES:
        return VALUES[name]
    if typ == "enum":
        return extra.split("|")[0]
    if typ in ("int", "strategy"):
        return "4"
    if typ == "float":
        return "0.5"
    return "x.txt"


SOURCES = ("-f", "--file", "--batch", "--prompts", "-p", "--prompt")
USER_PROMPTS = ("-f", "--file", "--batch", "--prompts", "--chat", "--system", "--system-prompt")


def base_args(sub, name):
    """The least each subcommand needs besides the flag tested (without clashing with it)."""
    if sub == "run":
        return [] if name in SOURCES else ["-p", "x"]
    if sub == "sweep":   # the user's prompts or generated tasks, whichever the flag goes with
        return ["-f", "x.txt"] if name in USER_PROMPTS else ["--tasks", "niah"]
    if sub == "ppl":
        return [] if name in ("-f", "--file") else ["-f", "x.txt"]
    if sub == "fit-phi":
        return (["-o", "m.phi"] if name == "--data" else
                ["--data", "t.txt"] if name in ("-o", "--output") else ["--data", "t.txt", "-o", "m.phi"])
    return []


ALL = {n: v for s in SUBS for n, v in TABLE[s].items()}
# flags whose parse needs a partner flag
PARTNERS = {"--resume": ["-o", "r.jsonl"], "--retry-failed": ["--resume", "-o", "r.jsonl"],
            "--errors": ["--json"], "--unordered": ["--json"], "--elem-bytes": ["--dry-run"],
            "--rates": ["--dry-run"], "--prompt-cache-ro": ["--prompt-cache", "c.bin"],
            "--wtype": ["-m", "synthetic:smollm2-135m"]}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("flags")
    (d / "dir").mkdir()
    (d / "dir" / "a.txt").write_text("hello")
    return d


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_flag_in_every_subcommand(name, workdir):
    typ, extra = ALL[name]
    for sub in SUBS:
        args = [name] if typ == "switch" else [name, value_for(name, typ, extra)]
        partner = PARTNERS.get(name, []) if name in TABLE[sub] else []
        r = sift(*sub_argv(sub, *base_args(sub, name), *partner, *args), parse_only=True, cwd=workdir)
        if name in TABLE[sub]:
            assert r.returncode == 0, (sub, name, r.stderr)
            if name not in ("-h", "--help", "--version"):
                assert "the command line parses" in r.stderr, (sub, name, r.stderr)
        elif (sub, name) == ("fit-phi", "--batch"):   # its old meaning there: refused, renamed
            assert r.returncode == 2 and "--batch is now --fit-batch in sift fit-phi" in r.stderr
        else:
            takers = [s for s in SUBS if name in TABLE[s]]
            assert r.returncode == 2, (sub, name, r.stderr)
            word = "sift" if sub == "run" else f"sift {sub}"
            assert f"{word} does not take {name} (a flag of: " in r.stderr, (sub, name, r.stderr)
            for t in takers:
                assert ("sift (run)" if t == "run" else f"sift {t}") in r.stderr
            assert f"(see {word} --help)" in r.stderr
            assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---- issue 36's cases -----------------------------------------------------------------------------

def one_error(r, *needles, code=2):
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sift: error: "), r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def test_bench_o_format_is_refused_naming_format():
    one_error(sift("bench", "-o", "md"), "-o is the output file now", "use --format md",
              "(see sift bench --help)")
    one_error(sift("bench", "--output", "json"), "--format json")


def test_o_is_a_file_everywhere(tmp_path):
    r = sift("eval", "-o", "md", parse_only=True)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "t.md"
    r = sift("bench", "-m", "synthetic:llama-3.1-8b", "-p", "64", "--dry-run", "--format", "csv",
             "-o", out)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert out.read_text().startswith("model,")


@pytest.mark.parametrize("sub", ["bench", "eval", "sweep"])
def test_c_is_the_context_size_everywhere(sub):
    extra = ["--tasks", "niah"] if sub == "sweep" else []
    r = sift(sub, *extra, "-c", "2048", parse_only=True)
    assert r.returncode == 0, r.stderr


def test_c_limits_bench_prompt_length():
    """-c 100 against -p 96 + -n 8 = 104 tokens: refused by the hand sum, before loading."""
    one_error(sift("bench", "-m", "synthetic:smollm2-135m", "-p", "96", "-n", "8", "-c", "100",
                   "--dry-run"), "-p 96 + -n 8 = 104 tokens exceed the context size -c of 100",
              "the largest -p is 92")


def test_bench_q_is_quiet():
    args = ["bench", "-m", "synthetic:smollm2-135m", "-p", "8", "-n", "2", "-r", "1", "-t", "1",
            "--format", "json"]
    loud = sift(*args)
    assert loud.returncode == 0 and "bench:" in loud.stderr, loud.stderr
    quiet = sift(*args, "-q")
    assert quiet.returncode == 0, quiet.stderr
    assert "bench:" not in quiet.stderr and quiet.stdout.startswith("[{")


def test_llama_flags_refused_with_what_to_use():
    one_error(sift("-ngl", "99", "-p", "x"), "-ngl is llama.cpp's", "--device cuda")
    one_error(sift("--n-gpu-layers", "99", "-p", "x"), "--device cuda")
    one_error(sift("-p", "x", "--repeat-penalty", "1.1"), "frequency_penalty")
    one_error(sift("-p", "x", "-e"), "no escapes")
    one_error(sift("-p", "x", "--no-display-prompt"), "never prints the prompt")
    one_error(sift("-cnv"), "not interactive")
    one_error(sift("bench", "-fa"), "(see sift bench --help)")


def test_llama_names_are_aliases():
    r = sift("-p", "x", "--system-prompt", "be brief", "--temp", "0", "--top-k", "5", "--top-p",
             "0.9", "--min-p", "0.1", "--ctx-size", "512", "--threads", "1", "--n-predict", "4",
             "--seed", "3", "--file", "a.txt", parse_only=True)
    assert r.returncode == 2 and "-p cannot be combined" in r.stderr   # --file and -p: the run's rule
    r = sift("bench", "--n-prompt", "16", "--n-gen", "2", "--repetitions", "1", parse_only=True)
    assert r.returncode == 0, r.stderr


def test_chunks_in_ppl(tmp_path):
    r = sift("ppl", "-f", "x.txt", "--chunks", "2", parse_only=True)
    assert r.returncode == 0, r.stderr
    if not os.path.exists(MODEL):
        pytest.skip("default model not fetched")
    r = sift("ppl", "-m", MODEL, "-f", os.path.join(ROOT, "LICENSE"), "-c", "64", "--chunks", "2",
             "--json", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert '"chunks":2,' in r.stdout and '"tokens_scored":62,' in r.stdout   # 2 x (64 - 1 - 32)


def test_did_you_mean():
    one_error(sift("--n-predit", "5", "-p", "x"), "unknown flag '--n-predit'; did you mean --n-predict?",
              "(see sift --help)")
    one_error(sift("bench", "--dry-rn"), "did you mean --dry-run?", "(see sift bench --help)")
    one_error(sift("eval", "--sample", "3"), "did you mean --samples?")
    # only the subcommand's own flags are suggested: --samples is eval's, not bench's
    one_error(sift("bench", "--sample", "3"), "unknown flag '--sample' (see sift bench --help)")
    one_error(sift("--zzzzzz", "1"), "unknown flag '--zzzzzz' (see sift --help)")


def test_strategy_parameter_no_strategy_reads_warns():
    r = sift("-p", "x", "--kv-rate", "0.1", "--strategy", "full", parse_only=True)
    assert r.returncode == 0
    assert ("sift: warning: --kv-rate is read by fastkv, snapkv, streamingllm; no chosen strategy "
            "(full) reads it: ignored") in r.stderr
    r = sift("-p", "x", "--kv-rate", "0.1", "--strategy", "full,fastkv", parse_only=True)
    assert r.returncode == 0 and "warning" not in r.stderr
    r = sift("bench", "--budget", "0.1", "--strategy", "fastkv", parse_only=True)
    assert "--budget is read by topk+phi, topk" in r.stderr
    # sweep: the grid's strategies, else --strategy's, else the default grid's
    r = sift("sweep", "--tasks", "niah", "--swiftkv-group", "2", "--grid", "fastkv:kv-rate=0.1",
             parse_only=True)
    assert r.returncode == 0 and "no chosen strategy (fastkv) reads it" in r.stderr
    r = sift("sweep", "--tasks", "niah", "--kv-rate", "0.2", parse_only=True)
    assert r.returncode == 0 and "warning" not in r.stderr


def test_threads_above_cores_warn():
    r = sift("-p", "x", "-t", "999", parse_only=True)
    assert r.returncode == 0 and "sift: warning: -t 999 is more threads than the" in r.stderr
    r = sift("bench", "-t", "1,999", parse_only=True)
    assert r.stderr.count("-t 999 is more threads") == 1


def test_lists_where_the_table_says():
    one_error(sift("-p", "x", "-t", "1,2"), "-t takes one value in sift run (a list in: bench)")
    one_error(sift("-p", "x", "--parallel", "1,4,16"), "--parallel takes one value")
    assert sift("bench", "-t", "1,2", "--parallel", "1,4,16", "-p", "16,32", parse_only=True).returncode == 0
    assert sift("eval", "--n-prompt", "128,256", parse_only=True).returncode == 0
    one_error(sift("sweep", "--tasks", "niah", "--n-prompt", "128,256"), "--n-prompt takes one value")


def test_old_spellings():
    r = sift("eval", "--ctx", "128", parse_only=True)
    assert r.returncode == 0
    assert "sift: warning: --ctx is now --n-prompt (the prompt length); the old name still works" in r.stderr
    r = sift("ppl", "-f", "x", "--ctx", "128", parse_only=True)
    assert r.returncode == 0 and "--ctx is now --ctx-size" in r.stderr
    r = sift("bench", "--reps", "2", parse_only=True)
    assert r.returncode == 0 and "--reps is now --repeat" in r.stderr
    r = sift("fit-phi", "--data", "t", "--out", "m.phi", parse_only=True)
    assert r.returncode == 0 and "--out is now --output" in r.stderr
    one_error(sift("fit-phi", "--data", "t", "-o", "m", "--batch", "4"),
              "--batch is now --fit-batch in sift fit-phi")


def test_verbosity_levels():
    r = sift("bench", "-v", parse_only=True)
    assert "sift: bench flags:" in r.stderr and " --n-predict 128* " in r.stderr
    assert " --format md* " in r.stderr and " --repeat 5* " in r.stderr
    r = sift("bench", "-q", parse_only=True)
    assert "flags:" not in r.stderr
    one_error(sift("bench", "-q", "-v"), "-q and -v exclude each other")
    assert "flags:" in sift("-vv", "-p", "x", parse_only=True).stderr


def test_every_error_names_the_subcommands_help():
    for sub, args in [("bench", ["-r", "0"]), ("eval", ["--tasks", "nope"]),
                      ("sweep", ["--fidelity", "best"]), ("ppl", []), ("fit-phi", ["--steps", "x"])]:
        r = sift(sub, *args)
        assert r.returncode == 2 and f"(see sift {sub} --help)" in r.stderr, r.stderr


# ---- the repo's command lines still parse --------------------------------------------------------

def gpu_sh_commands():
    text = open(os.path.join(ROOT, "bench/gpu.sh")).read()
    m = re.search(r"^BENCH=\((.*?)^\)", text, re.S | re.M)
    bench = subprocess.run(["bash", "-c", f"BENCH=({m.group(1)}); printf '%s\\n' \"${{BENCH[@]}}\""],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    cmds = [["bench", *shlex.split(b)] for b in bench]
    for line in text.replace("\\\n", " ").splitlines():
        if not line.strip().startswith("step ") or '"$SIFT"' not in line or " $b" in line:
            continue
        rest = line.split('"$SIFT"', 1)[1]
        for dev in ("cpu", "cuda"):
            argv = subprocess.run(["bash", "-c", f'TINY=t.gguf OUT=out dev={dev}; '
                                   f'for a in {rest}; do printf "%s\\0" "$a"; done'],
                                  capture_output=True, text=True, check=True).stdout
            cmds.append(argv.split("\0")[:-1])
    return cmds


def test_gpu_sh_commands_parse():
    cmds = gpu_sh_commands()
    assert len([c for c in cmds if c[0] == "bench"]) >= 5 and any(c[0] == "fit-phi" for c in cmds)
    for c in cmds:
        r = sift(*c, parse_only=True)
        assert r.returncode == 0 and "the command line parses" in r.stderr, (c, r.stderr)
        assert "warning: --" not in r.stderr, (c, r.stderr)   # no old spelling left


def doc_paths():
    """README.md and every page of the manual (docs/*.md)."""
    docs = sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    assert docs, "docs/ has no pages"
    return ["README.md"] + docs


def test_readme_docs_and_bench_sh_commands_parse(workdir):
    lines = []
    for path in doc_paths() + ["bench/bench.sh"]:
        for line in open(os.path.join(ROOT, path)):
            m = re.match(r"^(?:cat \S+ \| )?\./sift (.*)$", line.strip())
            if m:
                cmd = re.split(r"\s{2,}#|\s[>|]\s", m.group(1))[0].replace('"$reps"', "3").replace('"$threads"', "2").replace("$JOB_COMPLETION_INDEX", "0")
                lines.append(shlex.split(cmd))
    assert len(lines) >= 15
    (workdir / "prompts").mkdir(exist_ok=True)
    (workdir / "prompts" / "a.txt").write_text("hi")
    for c in lines:
        r = sift(*c, parse_only=True, cwd=workdir)
        assert r.returncode == 0 and "warning: --" not in r.stderr, (c, r.stderr)


def test_make_install(tmp_path):
    for args, root in [([f"PREFIX={tmp_path}/a"], tmp_path / "a"),
                       (["PREFIX=/usr", f"DESTDIR={tmp_path}/b"], tmp_path / "b/usr")]:
        # -o sift: install the binary the suite runs, never relink it here (a relink while another
        # worker executes ./sift fails that test: the file is not executable until linked)
        r = subprocess.run(["make", "-s", "-o", "sift", "install", *args], cwd=ROOT, capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        for f in ("bin/sift", "share/man/man1/sift.1", "share/bash-completion/completions/sift",
                  "share/zsh/site-functions/_sift", "share/fish/vendor_completions.d/sift.fish"):
            assert (root / f).is_file() and (root / f).stat().st_size > 0, f
        assert os.access(root / "bin/sift", os.X_OK)
        assert (root / "share/man/man1/sift.1").read_text() == sift("--man").stdout


# ---- issue 7: --flag=value, sift help, did-you-mean, --stop / -r, exit 2 for every usage error ----

def test_equals_form_in_every_subcommand(workdir):
    """--flag=value reads as --flag value in every subcommand (-v shows the value parsed); a switch
    given =value and NAME=VALUE on a one-dash name are refused."""
    for sub, extra in [("run", ["-p", "x"]), ("bench", []), ("eval", []), ("sweep", ["--tasks", "niah"]),
                       ("ppl", ["-f", "x.txt"]), ("fit-phi", ["--data", "t.txt", "-o", "m.phi"])]:
        r = sift(*sub_argv(sub, *extra, "--device=cpu", "--ctx-size=256", "-v"), parse_only=True, cwd=workdir)
        assert r.returncode == 0, (sub, r.stderr)
        assert " --device cpu " in r.stderr and " --ctx-size 256 " in r.stderr, (sub, r.stderr)
    r = sift("-p", "x", "--top-p=0.5", "--seed=-1", "--system=a=b", "-v", parse_only=True)
    assert r.returncode == 0 and " --top-p 0.5 " in r.stderr and " --system a=b " in r.stderr, r.stderr
    one_error(sift("-p", "x", "--chat=yes"), "--chat is a switch: it takes no value (got '--chat=yes')")
    one_error(sift("bench", "--dry-run=1"), "--dry-run is a switch", "(see sift bench --help)")
    one_error(sift("-p", "x", "-ctk=f16"), "--cache-type-k=f16 or -ctk f16")
    one_error(sift("-p", "x", "--top-p=2"), "--top-p 2 is out of range")
    one_error(sift("-p", "x", "--n-gpu-layers=99"), "llama.cpp's", "--device cuda")
    r = sift("--completion=bash")
    assert r.returncode == 0 and "complete -o default -F _sift sift" in r.stdout


def test_help_subcommand():
    for sub in SUBS:
        want = sift(*sub_argv(sub, "--help"))
        got = sift("help", sub)
        assert got.returncode == 0 and got.stdout == want.stdout and got.stderr == "", sub
    assert sift("help").stdout == sift("--help").stdout
    one_error(sift("help", "bnech"), "unknown subcommand 'bnech'; did you mean 'bench'?")
    one_error(sift("help", "zzz"), "unknown subcommand 'zzz'")
    one_error(sift("help", "bench", "eval"), "sift help takes one subcommand")
    one_error(sift("bnech", "-p", "5"), "unknown subcommand 'bnech'; did you mean 'bench'?")


@pytest.mark.parametrize("args,needle", [
    (["-p", "x", "--ctx", "5"], "unknown flag '--ctx'; did you mean --ctx-size?"),
    (["-p", "x", "--temperature", "1"], "unknown flag '--temperature'; did you mean --temp?"),
    (["-p", "x", "--top", "1"], "did you mean --top-k, --top-p"),
    (["-p", "x", "--seeed", "1"], "did you mean --seed?"),
    (["-p", "x", "--chta"], "did you mean --chat?"),          # a swap: one edit (Damerau)
    (["-p", "x", "--strategy", "fastkvv"], "unknown strategy 'fastkvv'; did you mean 'fastkv'?"),
    (["-p", "x", "--strategy", "full,sepcprefill"], "did you mean 'specprefill'?"),
    (["-p", "x", "--device", "cdua"], "(got 'cdua'); did you mean 'cuda'?"),
    (["-p", "x", "--weights", "exakt"], "did you mean 'exact'?"),
    (["-p", "x", "--anchor", "nonee"], "did you mean 'none'?"),
    (["eval", "--tasks", "niah,multikye"], "unknown task 'multikye'; did you mean 'multikey'?"),
    (["bench", "--format", "josn"], "did you mean 'json'?"),
    (["bench", "--stop", "x"], "sift bench does not take --stop (a flag of: sift (run))"),
])
def test_suggestions(args, needle):
    one_error(sift(*args), needle)


def test_no_far_fetched_suggestion():
    for args in (["-p", "x", "--zzzzzz", "1"], ["-p", "x", "--device", "gpu"], ["-p", "x", "-y"]):
        r = sift(*args)
        assert r.returncode == 2 and "did you mean" not in r.stderr, r.stderr


def test_stop_and_reverse_prompt():
    """--stop is run's (repeatable), -r and --reverse-prompt its llama-cli names; bench keeps -r as
    --repeat (llama-bench's). Run's -r with digits notes the change once."""
    r = sift("-p", "x", "--stop", "END", "-r", "User:", "--reverse-prompt=\n\n", "-vv", parse_only=True)
    assert r.returncode == 0, r.stderr
    reads = re.findall(r"^sift: run: '(.*?)' read as (\S+)$", r.stderr, re.M)
    assert ("--stop END", "--stop") in reads and ("-r User:", "--stop") in reads, r.stderr
    assert "note: -r" not in r.stderr
    r = sift("-p", "x", "-r", "3", parse_only=True)
    assert r.returncode == 0
    notes = [l for l in r.stderr.splitlines() if l.startswith("sift: note:")]
    assert notes == ["sift: note: -r is --reverse-prompt (llama-cli's) in sift run: '3' is a stop "
                     "string; for repetitions use --repeat 3"], r.stderr
    r = sift("-p", "x", "--repeat", "3", "-v", parse_only=True)
    assert r.returncode == 0 and " --repeat 3 " in r.stderr and "note" not in r.stderr
    r = sift("bench", "-r", "3", "-v", parse_only=True)
    assert r.returncode == 0 and " --repeat 3 " in r.stderr and "note" not in r.stderr
    assert TABLE["run"]["-r"][0] == "string" and TABLE["bench"]["-r"][0] == "int"
    assert TABLE["run"]["--reverse-prompt"][0] == "string" and "--stop" not in TABLE["bench"]
    one_error(sift("-p", "x", "--stop", ""), "--stop needs a value")


def test_every_usage_error_exits_2(tmp_path):
    """One bad command line per class of usage error: exit 2 and one line, before any model is
    loaded (except --n-prompt too small for a task, which needs the model's tokenizer)."""
    missing = tmp_path / "none.txt"
    ok = tmp_path / "ok.txt"
    ok.write_text("The quick brown fox.")
    cases = [
        ["-p", "x", "--bogus"],                                  # unknown flag
        ["-p", "x", "-n"],                                       # missing value
        ["-p", "x", "-n", "many"],                               # not an integer
        ["-p", "x", "--top-p", "7"],                             # out of range
        ["-p", "x", "--device", "tpu"],                          # not one of the choices
        ["-p", "x", "--strategy", "nope"],                       # unknown strategy
        ["-p", "x", "--json=1"],                                 # a switch given a value
        ["help", "nope"],                                        # unknown subcommand
        ["-p", "x", "stray"],                                    # unexpected argument
        ["-p", "x", "-q", "-v"],                                 # flags that exclude each other
        [],                                                      # no prompt
        ["-p", "x", "-f", ok],                                   # two prompt sources
        ["-p", "x", "--resume"],                                 # a flag missing its partner
        ["-f", missing],                                         # missing input file
        ["-f", tmp_path],                                        # input is a directory
        ["--prompts", missing],                                  # missing --prompts file
        ["-p", "x", "-o", tmp_path / "no" / "out.jsonl"],        # missing output directory
        ["bench", "-o", "md"],                                   # an old meaning refused
        ["bench", "-m", "synthetic:smollm2-135m", "-p", "96", "-n", "8", "-c", "100", "--dry-run"],
        ["bench", "-m", "synthetic:smollm2-135m", "--dry-run", "-o", tmp_path / "no" / "t.md"],
        ["eval", "--haystack", missing],                         # missing --haystack
        ["eval", "-o", tmp_path / "no" / "r.json"],
        ["sweep", "--tasks", "niah", "--csv", tmp_path / "no" / "r.csv"],
        ["ppl", "-f", missing],
        ["ppl", "-f", ok, "-o", tmp_path / "no" / "p.txt"],
        ["fit-phi", "--data", missing, "-o", tmp_path / "m.phi"],
        ["fit-phi", "--data", ok, "-o", tmp_path / "no" / "m.phi"],
        ["eval", "-m", MODEL, "--n-prompt", "100", "--tasks", "niah", "--samples", "1", "-q"],
    ]
    for args in cases:
        if MODEL in args and not os.path.exists(MODEL):
            continue
        r = sift(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("sift: error: "), (args, r.stderr)
    r = sift("eval", "-m", MODEL, "--n-prompt", "100", "--tasks", "niah", "--samples", "1", "-q")
    assert "more than --n-prompt 100 leaves" in r.stderr


def test_usage_doc_has_the_exit_codes():
    usage = open(os.path.join(ROOT, "docs", "usage.md")).read()
    table = dict(re.findall(r"^\| (\d[\d, ]*) \| (.*) \|$", usage, re.M))
    assert set(table) == {"0", "1", "2", "130, 143"}, table
    assert "usage" in table["2"] and "SIGINT" in table["130, 143"] and "128 +" in table["130, 143"]


# ---- issue 9: completion of values, zsh's and fish's descriptions, the man page's sections ----

def bash_complete(script, *words):
    words = list(words)
    cmd = (f"source {script}; COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); "
           f"COMP_CWORD={len(words) - 1}; _sift; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_bash_completes_values(tmp_path):
    f = tmp_path / "sift.bash"
    f.write_text(sift("--completion", "bash").stdout)
    got = bash_complete(f, "sift", "--strategy", "")
    assert "fastkv" in got and "full" in got and "all" in got and not any(g.startswith("-") for g in got)
    assert bash_complete(f, "sift", "--strategy", "fast") == ["fastkv"]
    assert bash_complete(f, "sift", "--strategy", "full,spec") == ["full,specprefill"]
    assert bash_complete(f, "sift", "--strategy", "=", "fast") == ["fastkv"]   # --strategy=fast
    assert bash_complete(f, "sift", "--device", "") == ["auto", "cpu", "cuda"]
    assert bash_complete(f, "sift", "bench", "--format", "") == ["md", "json", "jsonl", "csv"]
    assert bash_complete(f, "sift", "eval", "--tasks", "multi") == ["multikey", "multivalue"]
    assert bash_complete(f, "sift", "--anchor", "") == ["bos", "none"]
    assert bash_complete(f, "sift", "-ctk", "q") == ["q8_0"]
    assert bash_complete(f, "sift", "help", "be") == ["bench"]
    (tmp_path / "prompt_one.txt").write_text("x")
    assert bash_complete(f, "sift", "-f", str(tmp_path / "prompt_")) == [str(tmp_path / "prompt_one.txt")]


def test_zsh_descriptions_survive(tmp_path):
    """zsh itself reads the specs (its _arguments stubbed to print them): apostrophes, colons and
    brackets come through escaped for _arguments, and a cut description ends on a whole word."""
    if not shutil.which("zsh"):
        pytest.skip("zsh is not installed")
    f = tmp_path / "_sift"
    f.write_text(sift("--completion", "zsh").stdout)
    r = subprocess.run(["zsh", "-f", "-c", f"_arguments() {{ print -rl -- \"$@\" }}; words=(sift -p); "
                        f"CURRENT=3; source {f}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    specs = {}
    for spec in r.stdout.splitlines():
        m = re.match(r"^\*?(-[\w-]+)=?\[(.*?)(?<!\\)\]", spec)
        assert m, spec
        specs[m.group(1)] = m.group(2).replace("\\:", ":").replace("\\[", "[").replace("\\]", "]")
    assert specs["--summary"].startswith("the run's summary (prompts, failures")
    assert specs["--seed"].startswith("run: the sampling seed")
    assert "llama.cpp's" in specs["--weights"]
    words = set(re.findall(r"[\w.'-]+", " ".join(
        subprocess.run([SIFT, "--help"], capture_output=True, text=True).stdout.split())))
    for name, d in specs.items():
        if d.endswith("…"):
            last = d[:-1].split()[-1].strip(",;:()")
            assert last in words, (name, d)


def test_fish_completion(tmp_path):
    r = sift("--completion", "fish")
    assert r.returncode == 0
    lines = [l for l in r.stdout.splitlines() if l.startswith("complete -c sift -n 'test (__sift_sub) = ")]
    for sub in SUBS:
        names = set()
        for l in lines:
            if l.startswith(f"complete -c sift -n 'test (__sift_sub) = {sub}'"):
                for kind, n in re.findall(r" -([slo]) ([\w-]+)", l.split(" -d ")[0]):
                    names.add(("--" if kind == "l" else "-") + n)
        assert names == set(TABLE[sub]), sub
    strat = [l for l in lines if " -l strategy " in l][0]
    assert "-a 'all full speed fastkv" in strat
    assert any(" -l device " in l and "-a 'auto cpu cuda'" in l for l in lines)
    if not shutil.which("fish"):
        pytest.skip("fish is not installed (apt-get install fish; tests/setup.sh installs it)")
    f = tmp_path / "sift.fish"
    f.write_text(r.stdout)
    assert subprocess.run(["fish", "-n", str(f)]).returncode == 0
    def fish_complete(line):   # fish's own completion of line: the candidates (without descriptions)
        out = subprocess.run(["fish", "--no-config", "-c", f"source {f}; complete -C {shlex.quote(line)}"],
                             capture_output=True, text=True).stdout
        return [c.split("\t")[0] for c in out.splitlines()]
    assert fish_complete("sift --device ") == ["auto", "cpu", "cuda"]
    assert fish_complete("sift --strategy fa") == ["fastkv"]
    assert fish_complete("sift bench --dry") == ["--dry-run"] and fish_complete("sift --dry") == []


def test_man_page_sections(tmp_path):
    r = sift("--man")
    heads = re.findall(r"^\.SH (.*)$", r.stdout, re.M)
    for want in ("EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES"):
        assert want in heads, heads
    body = {h: t for h, t in zip(heads, re.split(r"^\.SH .*$", r.stdout, flags=re.M)[1:])}
    assert re.findall(r"^\.TP\n(.*)$", body["EXIT STATUS"], re.M) == ["0", "1", "2", "130, 143"]
    env = re.findall(r"^\.TP\n\.B (.*)$", body["ENVIRONMENT"], re.M)
    assert {"SIFT_MODEL", "OMP_NUM_THREADS", "SIFT_PARSE_ONLY"} <= set(env), env
    examples = body["EXAMPLES"].replace("\\-", "-")
    for line in ("sift bench -p 512,2048 -n 128 -r 3 -t 2", "sift ppl -f wiki.test.raw -c 512",
                 "sift fit-phi --data corpus.txt -c 1024 -o smollm2.phi"):
        assert line in examples
    if not shutil.which("groff"):
        pytest.skip("groff is not installed")
    f = tmp_path / "sift.1"
    f.write_text(r.stdout)
    g = subprocess.run(["groff", "-man", "-ww", "-z", str(f)], capture_output=True, text=True)
    assert g.returncode == 0 and g.stderr == "", g.stderr
    text = subprocess.run(["groff", "-man", "-Tutf8", "-P-c", str(f)], capture_output=True,
                          text=True).stdout
    text = re.sub(".\b", "", text)   # the terminal's overstrikes (bold, underline)
    assert "EXIT STATUS" in text and "128 + the signal" in text.replace("\u2010", "-")

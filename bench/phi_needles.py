"""topk+phi end to end on needle prompts (bench/EVAL.md, section "topk+phi: the default fit").

Not a test: a measurement. Prompts: ChatML (SmolLM2's default system prompt, as `sift --chat`
writes it), filler from licence texts (/usr/share/common-licenses, never the fit's data), a
5-digit "special magic number" (RULER's wording; "code" reads as source code in a licence,
and full answered with section names) at depth 0.3-0.6, the question at the end; lengths 4K-8K tokens.
Per prompt one full prefill (build/tests/tool_phi compare): full decodes --rows greedy tokens,
every variant decodes the same tokens (forced; KL to full per row, greedy agreement), then its
own greedy tokens (free; "found" = the code's digits appear in them). Variants at the default 2 %
budget: topk (K = n - sink - tail), topk+phi with random features and with each --phi map
(K = n - sink - tail - ceil(R_phi)); a map may be given as FILE:DELTA (log phi_q shifted).
Defaults (`--defaults`): the spec's K and sift's default K (the spec's, raised to the floor
min(16, mid) when the budget leaves fewer: policies/topk_phi.c budget_k) for topk and topk+phi
with random features, on prompts of `--words LO-HI` filler words.
usage: .venv/bin/python bench/phi_needles.py --phi m.phi [--phi m.phi:-2] [--prompts 12]
       [--exclude Apache-2.0] [--cache out.json] [--rows 16] [--free 24] [--words 3300-6500]
       .venv/bin/python bench/phi_needles.py --defaults --words 1400-1600
"""

import argparse
import json
import math
import random
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "build" / "tests" / "tool_phi"
TOK = ROOT / "build" / "tests" / "tool_tokenize"
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
LICENCES = Path("/usr/share/common-licenses")
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def tokenize(text, special=True):
    rec = text.encode()
    out = subprocess.run([str(TOK), str(MODEL)] + (["--special"] if special else []),
                         input=struct.pack("<I", len(rec)) + rec, capture_output=True, check=True)
    return [int(x) for x in out.stdout.split()]


def fillers(exclude):
    # distinct texts only (GPL = GPL-3, LGPL = LGPL-3, GFDL = GFDL-1.3 are links or copies)
    seen, out = set(), []
    for f in sorted(LICENCES.iterdir()):
        t = f.read_text(errors="replace")
        if f.name in exclude or t in seen or len(t.split()) < 900:
            continue
        seen.add(t)
        out.append(" ".join(t.split()))
    return " ".join(out)


def make_prompt(words, start, n_words, code, depth):
    body = " ".join(words[start:start + n_words])
    cut = body.find(" ", int(len(body) * depth))
    body = body[:cut] + f" The special magic number is {code}." + body[cut:]
    text = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{body}\n\n"
            "What is the special magic number mentioned in the text?<|im_end|>\n<|im_start|>assistant\n")
    return tokenize(text)


def contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phi", action="append", default=[])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--exclude", action="append", default=["Apache-2.0"])
    ap.add_argument("--cache", default=str(ROOT / "build" / "phi_needles.json"))
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--free", type=int, default=24)
    ap.add_argument("--budget", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--words", default="3300-6500", help="filler words per prompt, LO-HI")
    ap.add_argument("--defaults", action="store_true",
                    help="compare the spec's K with sift's floored default K (topk, topk+phi)")
    a = ap.parse_args()
    w_lo, _, w_hi = a.words.partition("-")
    w_lo, w_hi = int(w_lo), int(w_hi or w_lo)
    cache = json.loads(Path(a.cache).read_text()) if Path(a.cache).exists() else {}
    words = fillers(set(a.exclude)).split()
    rng = random.Random(a.seed)
    names = ["topk", "topk+phi random features"] + [f"topk+phi {p}" for p in a.phi]
    if a.defaults:
        names = ["topk, spec K", "topk, default K (floored)", "topk+phi random features, spec K",
                 "topk+phi random features, default K (floored)"]
    res = {n: [] for n in ["full"] + names}
    for pi in range(a.prompts):
        n_words = rng.randint(w_lo, w_hi)   # default: ~4K-8K tokens
        start = rng.randint(0, len(words) - n_words)
        code, depth = str(rng.randint(10000, 99999)), rng.uniform(0.3, 0.6)
        ids = make_prompt(words, start, n_words, code, depth)
        n = len(ids)
        total = math.ceil(a.budget * n)
        k_topk, k_hyb = max(total - 20, 0), max(total - 20 - math.ceil(64 / 2 + 64 / 64), 0)
        specs = [f"topk:{k_topk}", f"prf:{k_hyb}"]
        if a.defaults:   # sift's floor: K >= min(16, mid tokens) when K comes from the budget
            floor = min(16, n - 20)
            specs = [f"topk:{k_topk}", f"topk:{max(k_topk, floor)}", f"prf:{k_hyb}",
                     f"prf:{max(k_hyb, floor)}"]
        for p in a.phi:
            path, _, delta = p.partition(":")
            specs.append(f"{path}:{k_hyb}:{delta or 0}")
        key = f"{pi}:{n}:{code}:{a.rows}:{a.free}"
        todo = [s for s in specs if f"{key}:{s}" not in cache]
        if todo:
            out = subprocess.run([str(TOOL), "compare", str(MODEL), str(a.rows), str(a.free), "0"] +
                                 todo + ["--"] + [str(i) for i in ids], capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"tool_phi compare failed: {out.stderr.strip()}")
            r = json.loads(out.stdout)
            cache[f"{key}:full"] = {"free": r["full_free"]}
            for s, v in zip(todo, r["variants"]):
                cache[f"{key}:{s}"] = v
            Path(a.cache).write_text(json.dumps(cache))
        want = tokenize(code, special=False)
        res["full"].append((0.0, 1.0, contains(cache[f"{key}:full"]["free"], want)))
        for nm, s in zip(names, specs):
            v = cache[f"{key}:{s}"]
            res[nm].append((sum(v["kl"]) / len(v["kl"]), v["agree"], contains(v["free"], want)))
        print(f"prompt {pi}: {n} tokens, code {code} at depth {depth:.2f}, K topk {k_topk} / "
              f"topk+phi {k_hyb}; found: " + ", ".join(f"{nm} {int(res[nm][-1][2])}" for nm in res),
              file=sys.stderr)
    print(f"| config | found the code | mean KL to full ({a.rows} rows) | greedy agreement |")
    print("|---|---:|---:|---:|")
    for nm, rs in res.items():
        kl = sum(r[0] for r in rs) / len(rs)
        ag = sum(r[1] for r in rs) / len(rs)
        print(f"| {nm} | {sum(r[2] for r in rs)}/{len(rs)} | {kl:.4f} | {100 * ag:.0f} % |")


if __name__ == "__main__":
    main()

"""topk vs topk+phi fidelity to full on long passkey prompts (bench/EVAL.md, section topk+phi).

Not a test: a measurement. For each prompt (ChatML; filler text from ../shared/seeds/003 and 004,
which fit-phi did not train on; a 5-digit passkey at a given depth; the question at the end):
`full` runs with 8 greedy tokens; every configuration then runs with full's tokens forced
(build/tests/tool_phi decode), so each row compares the same context. Reported per config, over
prompts: mean KL(full || config) of the first generated token (the prompt's last token is the
method's first query), mean KL over all 9 rows, greedy agreement with full over the 9 rows, and
whether the config's greedy tokens spell the passkey (under full's forced context). Results are cached in a JSON file (reruns skip done
runs).
usage: .venv/bin/python bench/phi_fidelity.py --phi FILE.phi [--len WORDS] [--prompts 3]
       [--skip SUBSTRING] [--cache out.json]     (--len 2900 gives ~4K-token prompts)
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "build" / "tests" / "tool_phi"
TOK = ROOT / "build" / "tests" / "tool_tokenize"
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SEEDS = ROOT.parent / "shared" / "seeds"
N_GEN = 8


def tokenize(text, special=True):
    rec = text.encode()
    out = subprocess.run([str(TOK), str(MODEL)] + (["--special"] if special else []),
                         input=struct.pack("<I", len(rec)) + rec, capture_output=True, check=True)
    return [int(x) for x in out.stdout.split()]


def make_prompt(filler, n_tokens, key, depth):
    words = filler.split()
    body = " ".join(words[: int(n_tokens * 0.72)])
    cut = int(len(body) * depth)
    body = body[:cut] + f" The passkey is {key}. Remember it: {key}. " + body[cut:]
    text = ("<|im_start|>user\n" + body + "\nWhat is the passkey? Answer with the number only."
            "<|im_end|>\n<|im_start|>assistant\nThe passkey is ")
    return tokenize(text)


def run(ids, strategy, sets=(), cont=None, greedy=0):
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"phi_fid_{os.getpid()}.f32"
    cmd = [str(TOOL), "decode", str(MODEL), str(out), "--strategy", strategy]
    for s in sets:
        cmd += ["--set", s]
    if greedy:
        cmd += ["--greedy", str(greedy)]
    for c in cont or []:
        cmd += ["--cont", str(c)]
    subprocess.run(cmd + [str(i) for i in ids], check=True, capture_output=True)
    x = np.fromfile(out, dtype=np.float32).astype(np.float64)
    out.unlink()
    return x.reshape(-1, x.size // (1 + (greedy or len(cont or []))))


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kl_rows(ref, got):
    lp, lq = log_softmax(ref), log_softmax(got)
    return (np.exp(lp) * (lp - lq)).sum(axis=-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phi", required=True)
    ap.add_argument("--len", type=int, default=4000)
    ap.add_argument("--cache", default=str(ROOT / "build" / "phi_fidelity.json"))
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--skip", default="", help="skip configs whose name contains this")
    a = ap.parse_args()
    cache = json.loads(Path(a.cache).read_text()) if Path(a.cache).exists() else {}
    fillers = [(SEEDS / f).read_text() for f in sorted(os.listdir(SEEDS)) if f[:3] in ("003", "004")]
    prompts = [(fillers[0], "48213", 0.3), (fillers[1], "70596", 0.6), (fillers[0][20000:], "31874", 0.8)]
    configs = []
    for pct in (1, 2, 5):
        b = f"budget={pct / 100}"
        configs += [(f"topk @{pct}%", "topk", (b,)), (f"topk+phi fitted @{pct}%", "topk+phi", (b, f"phi={a.phi}"))]
    configs += [("topk+phi random features @2%", "topk+phi", ("budget=0.02",))]
    for k in (21, 62):
        configs += [(f"topk K={k}", "topk", (f"topk={k}",)),
                    (f"topk+phi fitted K={k}", "topk+phi", (f"topk={k}", f"phi={a.phi}")),
                    (f"topk+phi random features K={k}", "topk+phi", (f"topk={k}",))]
    configs += [("sink+tail only (topk K=0)", "topk", ("topk=0",))]
    rows = {}
    if a.skip:
        configs = [c for c in configs if a.skip not in c[0]]
    for pi, (filler, key, depth) in enumerate(prompts[:a.prompts]):
        ids = make_prompt(filler, a.len, key, depth)
        ck = f"{pi}:{len(ids)}"
        if ck + ":full" not in cache:
            full = run(ids, "full", greedy=N_GEN)
            cache[ck + ":full"] = {"logits_argmax": full.argmax(axis=1).tolist()}
            np.save(Path(a.cache).with_suffix(f".full{pi}.npy"), full.astype(np.float32))
        full = np.load(Path(a.cache).with_suffix(f".full{pi}.npy")).astype(np.float64)
        toks = cache[ck + ":full"]["logits_argmax"]
        want = tokenize(key, special=False)
        rows.setdefault("full", []).append(({"kl_first": 0.0, "kl_mean": 0.0, "agree": 1.0},
                                            toks[:len(want)] == want))
        for name, strat, sets in configs:
            kk = f"{ck}:{name}"
            if kk not in cache:
                got = run(ids, strat, sets, cont=toks[:N_GEN])
                kl = kl_rows(full, got)
                cache[kk] = {"kl_first": float(kl[0]), "kl_mean": float(kl.mean()),
                             "agree": float((got.argmax(axis=1) == full.argmax(axis=1)).mean()),
                             "first5": got.argmax(axis=1)[:5].tolist()}
                Path(a.cache).write_text(json.dumps(cache))
                print(f"prompt {pi} ({len(ids)} tokens) {name}: {cache[kk]}", file=sys.stderr)
            rows.setdefault(name, []).append((cache[kk], cache[kk]["first5"][:len(want)] == want))
        print(f"prompt {pi}: {len(ids)} tokens, passkey {key} at depth {depth}", file=sys.stderr)
    print("| config | first-token KL to full | mean KL (9 rows) | greedy agreement | passkey retrieved |")
    print("|---|---:|---:|---:|---:|")
    for name, rs in rows.items():
        kf = np.mean([r["kl_first"] for r, _ in rs])
        km = np.mean([r["kl_mean"] for r, _ in rs])
        ag = np.mean([r["agree"] for r, _ in rs])
        print(f"| {name} | {kf:.4f} | {km:.4f} | {100 * ag:.0f} % | {sum(s for _, s in rs)}/{len(rs)} |")


if __name__ == "__main__":
    main()

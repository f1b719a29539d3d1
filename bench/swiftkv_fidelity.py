"""Fidelity of training-free swiftkv vs full on the default model (for bench/EVAL.md).

For each prompt and setting, build/tests/tool_logits gives the first-token logits and a 16-token
greedy continuation of `full` and of `swiftkv`; reported: first-token KL(full || swiftkv) in
nats, whether the first token agrees, the share of the 16 greedy tokens equal to full's at the
same position, and how many leading greedy tokens equal full's.

    .venv/bin/python bench/swiftkv_fidelity.py [MODEL]
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOOL = Path(os.environ.get("SIFT_TOOL_LOGITS", ROOT / "build" / "tests" / "tool_logits"))
TOKENIZE = ROOT / "build" / "tests" / "tool_tokenize"
MODEL = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
N = 16

TEXTS = {
    "fox": "The quick brown fox jumps over the lazy dog. The dog",
    "apollo": "In 1969, Apollo 11 landed on the Moon; Neil Armstrong and Buzz Aldrin walked on its "
              "surface for about 2.5 hours while Michael Collins orbited above. The mission",
    "chat_capital": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                    "<|im_start|>assistant\n",
    "chat_colors": "<|im_start|>user\nName three primary colors.<|im_end|>\n<|im_start|>assistant\n",
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "passkey": "<|im_start|>user\n" + "The grass is green. The sky is blue. " * 20 +
               "The pass key is 71432. Remember it. " + "The sun is bright. The sea is deep. " * 20 +
               "What is the pass key?<|im_end|>\n<|im_start|>assistant\nThe pass key is",
}


def ids_of(text):
    data = text.encode()
    res = subprocess.run([str(TOKENIZE), MODEL, "--special"],
                         input=len(data).to_bytes(4, "little") + data, capture_output=True, check=True)
    return [int(x) for x in res.stdout.split()]


def run(ids, strategy, sets=()):
    out = ROOT / "build" / "swiftkv_fidelity.f32"
    args = [str(TOOL), MODEL, str(out), "--greedy", str(N), "--strategy", strategy]
    for s in sets:
        args += ["--set", s]
    res = subprocess.run(args + [str(i) for i in ids], capture_output=True, text=True, check=True)
    return np.fromfile(out, dtype=np.float32).astype(np.float64), [int(t) for t in res.stdout.split()]


def kl(p_logits, q_logits):
    p = np.exp(p_logits - p_logits.max()); p /= p.sum()
    lq = q_logits - q_logits.max(); lq -= np.log(np.exp(lq).sum())
    lp = np.log(p)
    return float((p * (lp - lq)).sum())


def main():
    settings = [("l=15 (50%) own", ["swiftkv_layers=15", "swiftkv_fold=1"]),
                ("l=15 (50%) shared", ["swiftkv_layers=15", "swiftkv_fold=0"]),
                ("l=23 (23%) own", ["swiftkv_layers=23", "swiftkv_fold=1"]),
                ("l=23 (23%) shared", ["swiftkv_layers=23", "swiftkv_fold=0"]),
                ("l=15 G=3 own", ["swiftkv_layers=15", "swiftkv_group=3", "swiftkv_fold=1"])]
    rows = {name: [] for name, _ in settings}
    for pname, text in TEXTS.items():
        ids = ids_of(text)
        full, g_full = run(ids, "full")
        for name, sets in settings:
            lg, g = run(ids, "swiftkv", sets)
            same = sum(a == b for a, b in zip(g, g_full)) / len(g_full)
            prefix = next((i for i, (a, b) in enumerate(zip(g, g_full)) if a != b), len(g_full))
            rows[name].append((kl(full, lg), int(lg.argmax() == full.argmax()), same, prefix))
            print(f"{pname:13} {len(ids):4} tok  {name:18} KL {rows[name][-1][0]:7.3f}  "
                  f"first {rows[name][-1][1]}  greedy {100 * same:5.1f}%  prefix {prefix:2d}",
                  flush=True)
    print(f"\n| setting | mean first-token KL (nats) | first token = full | greedy tokens = full "
          f"(same position, of {N}) | mean leading tokens = full |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        a = np.array(r)
        print(f"| {name} | {a[:, 0].mean():.3f} | {int(a[:, 1].sum())}/{len(a)} | "
              f"{100 * a[:, 2].mean():.1f} % | {a[:, 3].mean():.1f} |")


if __name__ == "__main__":
    main()

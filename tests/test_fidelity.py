"""Fidelity of every strategy at its default settings on the real default model: passkey
prompts of ~2K and ~6K tokens (a key hidden at a seeded depth in repetitive filler, then
"The pass key is"). Wherever `full` returns the key, the paper strategies (speed, fastkv,
specprefill) must too. The baselines are reported, not required: streamingllm keeps only 4 sinks
and the most recent tokens, so by construction it cannot see a key deeper in the prompt, and
snapkv evicts in every layer from layer 0. The per-strategy agreement with `full` (first token,
greedy tokens) is printed (pytest -s shows it).

Keys are words and 5-digit numbers (seeds 1-3 each, ~2K tokens) plus one ~6K-token word prompt.
SmolLM2's tokenizer splits digits one per token, so a 5-digit key spans 5 tokens, and its tail can
fall outside FastKV's pooling radius (kernel 7) around the token the window attends to: on other
seeds fastkv dropped the last digit once (the papers' Llama-3 tokenizer packs three digits per
token). Measured 2026-11-22 on seeds 1-3: full found 4 of 6 keys, speed, fastkv and specprefill
all 4 of those (specprefill with its former default 8-layer self-draft: 3)."""
import json
import os
import random
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIFT = os.path.join(ROOT, "sift")
MODEL = os.path.join(ROOT, os.environ.get("SIFT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
BASELINES = {"snapkv", "streamingllm"}
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


KEYS = ["marmalade", "tangerine", "kaleidoscope", "harmonica", "porcupine", "lighthouse",
        "avalanche", "saxophone", "pineapple", "chameleon"]


def passkey_prompt(n_filler, seed):
    """(text, key): the key sentence at a seeded depth in n_filler filler blocks (~24 tokens each)."""
    rng = random.Random(seed)
    key = rng.choice(KEYS)
    parts = [FILLER] * n_filler
    parts.insert(rng.randint(n_filler // 10, n_filler - n_filler // 10), f"The pass key is {key}. ")
    return "".join(parts) + "\nThe pass key is", key


def digit_prompt(n_filler, seed):
    """(text, key): as passkey_prompt with a 5-digit key."""
    rng = random.Random(seed)
    key = str(rng.randint(10000, 99999))
    parts = [FILLER] * n_filler
    parts.insert(rng.randint(n_filler // 10, n_filler - n_filler // 10), f"The pass key is {key}. ")
    return "".join(parts) + "\nThe pass key is", key


@pytest.mark.skipif(not os.path.exists(MODEL), reason="default model not fetched")
def test_every_strategy_finds_the_key_when_full_does(tmp_path):
    prompts = {f"2k_{kind}{seed}": make(90, seed) for seed in (1, 2, 3)
               for kind, make in (("w", passkey_prompt), ("d", digit_prompt))}
    prompts["6k_w4"] = passkey_prompt(270, 4)
    files = []
    for name, (text, _) in prompts.items():
        p = tmp_path / f"{name}.txt"
        p.write_text(text)
        files += ["-f", str(p)]
    r = subprocess.run([SIFT, "-m", MODEL, *files, "--strategy", "all", "--json", "-q", "-n", "8",
                        "--temp", "0"], capture_output=True, text=True, timeout=1500)
    results = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 0, r.stderr + r.stdout
    strategies = sorted({j["strategy"] for j in results})
    assert len(strategies) >= 2 and "full" in strategies
    print(f"\n{'prompt':6} {'tokens':>6} {'strategy':12} {'found':>5} {'1st=full':>8} "
          f"{'greedy%':>7} {'rows%':>6} {'KV MiB':>7} {'TTFT ms':>8}  text")
    found_by_full = 0
    for name, (_, key) in prompts.items():
        rows = [j for j in results if os.path.basename(j["file"]) == f"{name}.txt"]
        assert {j["strategy"] for j in rows} == set(strategies)
        full = next(j for j in rows if j["strategy"] == "full")
        for j in rows:
            found = key in j["text"]
            print(f"{name:6} {j['timings']['prompt_n']:6d} {j['strategy']:12} {str(found):>5} "
                  f"{str(j['first_token_agree']):>8} {j['greedy_agree_pct']:7.1f} "
                  f"{j['rows_pct_of_full']:6.1f} {j['kv_bytes'] / 2**20:7.2f} "
                  f"{j['timings']['prompt_ms']:8.0f}  {j['text']!r}")
        if key in full["text"]:
            found_by_full += 1
            missed = [j["strategy"] for j in rows
                      if key not in j["text"] and j["strategy"] not in BASELINES]
            assert not missed, f"{name}: full found {key}, {missed} did not"
    # the check above must have had something to check: full finds the key on these prompts
    assert found_by_full >= 3, "full found the key in fewer than 3 prompts: the test says little"

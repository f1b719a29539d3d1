"""Hugging Face model directories: the default GGUF converted to an HF directory by
tests/hf_convert.py (gguf + numpy + safetensors; llama.cpp's Q/K permutation undone, two shards
with an index, tokenizer.json from the GGUF vocabulary) must give sift
  * the same logits at every prompt position (max |diff| <= 1e-5 of the row's largest logit)
    and the same greedy tokens,
  * the same token ids for every string of tests/data/tok_strings.jsonl as the GGUF vocabulary,
    and the ids Hugging Face `tokenizers` gives for that tokenizer.json (except the two strings
    where HF and llama.cpp disagree, see test_tokenizer.py),
  * the same tokenizer facts (BOS/EOS, end-of-generation ids, chat template family),
  * the same text from `sift -m DIR`.
And malformed directories (truncated header, offsets past the end, a dtype/size mismatch, a
missing shard, bad config.json, an unsupported dtype, no tokenizer.json) fail with one line
"sift: error: ..." and exit code 1.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import hf_convert  # noqa: E402

MODEL = Path(os.environ.get("SIFT_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL
LOGITS = ROOT / "build" / "tests" / "tool_logits"
TOKENIZE = ROOT / "build" / "tests" / "tool_tokenize"
SIFT = ROOT / "sift"
# the HF and GGUF loaders are compared exactly, on the fp32 reference path of the test tools
ENV = dict(os.environ, OMP_WAIT_POLICY="passive", SIFT_WEIGHTS="f32")

pytestmark = pytest.mark.skipif(not (MODEL.exists() and LOGITS.exists() and TOKENIZE.exists()),
                                reason="needs the default model and build/tests tools")

PROMPTS = {
    "fox": [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30],
    "chat_france": [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
}
# Where Hugging Face and llama.cpp disagree (test_tokenizer.py); sift follows llama.cpp.
HF_DIFFERS = {"!!\u0004!!", "..\u001d.."}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "smollm2"
    hf_convert.convert(str(MODEL), str(out), shards=2)
    return out


def logits(model, ids, tmp_path, greedy=0):
    out = tmp_path / f"logits_{abs(hash(str(model))) % 10**8}.f32"
    args = [str(LOGITS), str(model), str(out)] + (["--greedy", str(greedy)] if greedy else [])
    res = subprocess.run(args + [str(i) for i in ids], capture_output=True, text=True, env=ENV,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1), res.stdout.split()


@pytest.mark.parametrize("name", list(PROMPTS))
def test_logits_and_greedy_match_gguf(hf_dir, tmp_path, name):
    ids = PROMPTS[name]
    a, greedy_a = logits(MODEL, ids, tmp_path, greedy=8)
    b, greedy_b = logits(hf_dir, ids, tmp_path, greedy=8)
    assert a.shape == b.shape
    assert np.isfinite(b).all()
    # Per row, relative to the row's largest logit: both are fp32 passes over the same numbers,
    # but half-split vs adjacent-pair rotation sums q.k in another order.
    rel = np.abs(a - b).max(axis=1) / np.abs(a).max(axis=1)
    assert rel.max() <= 1e-5
    assert greedy_a == greedy_b


def records(texts):
    return b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in texts)


def encode(model, texts, *flags):
    res = subprocess.run([str(TOKENIZE), str(model), *flags], input=records(texts),
                         capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr.decode()
    lines = res.stdout.decode().split("\n")[:-1]
    assert len(lines) == len(texts) and not any(x.startswith("ERROR") for x in lines)
    return [[int(x) for x in line.split()] for line in lines]


@pytest.fixture(scope="module")
def strings():
    with open(ROOT / "tests" / "data" / "tok_strings.jsonl", encoding="ascii") as f:
        return [json.loads(line)["text"] for line in f]


def test_tokenizer_json_ids_match_gguf_and_hugging_face(hf_dir, strings):
    from tokenizers import Tokenizer
    from_dir = encode(hf_dir, strings)
    assert from_dir == encode(MODEL, strings)
    assert encode(hf_dir, strings, "--special") == encode(MODEL, strings, "--special")
    # HF always matches added tokens in the text: compare with sift's special-token parsing.
    ref = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    differ = {s for s, ids in zip(strings, encode(hf_dir, strings, "--special"))
              if ids != ref.encode(s, add_special_tokens=False).ids}
    assert differ == HF_DIFFERS
    chat = ["<|im_start|>user\nhi<|im_end|>\n", "a<|im_end|>b<|endoftext|>"]
    assert encode(hf_dir, chat, "--special") == encode(MODEL, chat, "--special")
    assert encode(hf_dir, chat, "--special") == [ref.encode(s).ids for s in chat]


def info(model):
    res = subprocess.run([str(TOKENIZE), str(model), "--info"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return dict(line.split("=", 1) for line in res.stdout.splitlines())


def test_tokenizer_facts_match_gguf(hf_dir):
    a, b = info(MODEL), info(hf_dir)
    for key in ("n_vocab", "bos", "eos", "add_bos", "chat", "default_system", "eog"):
        assert a[key] == b[key], key


def run_sift(*args):
    return subprocess.run([str(SIFT), *args], capture_output=True, text=True, env=ENV, timeout=600)


@pytest.mark.skipif(not SIFT.exists(), reason="sift not built")
def test_sift_cli_same_text(hf_dir):
    args = ["--chat", "-p", "What is 2+2?", "-n", "8", "--temp", "0", "-q"]
    a, b = run_sift("-m", str(MODEL), *args), run_sift("-m", str(hf_dir), *args)
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    assert a.stdout == b.stdout and a.stdout.strip()


# ---- malformed inputs ------------------------------------------------------------------------

def st_bytes(header, data=b""):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def tiny_dir(path, weights, config=None, tokenizer_from=None):
    path.mkdir()
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4, "intermediate_size": 8,
           "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 8}
    (path / "config.json").write_text(config if config is not None else json.dumps(cfg))
    if weights is not None:
        (path / "model.safetensors").write_bytes(weights)
    if tokenizer_from is not None:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer_from / f, path / f)
    return path


F32_4 = np.arange(4, dtype=np.float32).tobytes()
CASES = {
    "truncated_header": (st_bytes({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})[:20],
                         None, "header length"),
    "offsets_past_end": (st_bytes({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}, F32_4),
                         None, "past the end"),
    "dtype_size_mismatch": (st_bytes({"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 16]}}, F32_4),
                            None, "does not fit"),
    "unknown_dtype": (st_bytes({"a": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}}, F32_4),
                      None, "unknown dtype"),
    "header_not_json": (struct.pack("<Q", 5) + b"{oops" + F32_4, None, "not a JSON object"),
    "overflowing_shape": (st_bytes({"a": {"dtype": "F32", "shape": [2**62, 2**62],
                                          "data_offsets": [0, 16]}}, F32_4), None, "overflowing"),
    "bad_config": (st_bytes({}), "{\"hidden_size\": ", "config.json"),
    "no_weights": (None, None, "neither model.safetensors"),
}


@pytest.mark.skipif(not SIFT.exists(), reason="sift not built")
@pytest.mark.parametrize("case", list(CASES))
def test_malformed_directory(tmp_path, case):
    weights, config, message = CASES[case]
    d = tiny_dir(tmp_path / case, weights, config)
    res = run_sift("-m", str(d), "-p", "hi", "-n", "1")
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sift: error:") and message in lines[0], res.stderr


@pytest.mark.skipif(not SIFT.exists(), reason="sift not built")
def test_missing_shard(tmp_path):
    d = tiny_dir(tmp_path / "sharded", None)
    (d / "model-00001-of-00002.safetensors").write_bytes(
        st_bytes({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, F32_4))
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    res = run_sift("-m", str(d), "-p", "hi", "-n", "1")
    assert res.returncode == 1 and "missing shard" in res.stderr and res.stderr.count("\n") == 1


@pytest.mark.skipif(not SIFT.exists(), reason="sift not built")
def test_unsupported_dtype_and_missing_tokenizer(tmp_path, hf_dir):
    i64 = np.zeros(32, dtype=np.int64).tobytes()
    w = st_bytes({"model.embed_tokens.weight": {"dtype": "I64", "shape": [8, 4],
                                                "data_offsets": [0, 256]}}, i64)
    d = tiny_dir(tmp_path / "i64", w, tokenizer_from=hf_dir)
    res = run_sift("-m", str(d), "-p", "hi", "-n", "1")
    assert res.returncode == 1 and "dtype I64" in res.stderr and res.stderr.count("\n") == 1
    d = tiny_dir(tmp_path / "notok", w)
    res = run_sift("-m", str(d), "-p", "hi", "-n", "1")
    assert res.returncode == 1 and "tokenizer.json" in res.stderr and res.stderr.count("\n") == 1


# ---- small models: Qwen2 (QKV bias), untied LM head, llama3 rope scaling ----------------------

def llama3_factors(hd, base, factor, lo, hi, orig):
    """rope_freqs (divisors of the inverse frequencies) for HF's rope_scaling llama3."""
    inv = base ** (-np.arange(0, hd, 2) / hd)
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > orig / lo, inv / factor, inv)
    smooth = (orig / wavelen - lo) / (hi - lo)
    mid = (wavelen <= orig / lo) & (wavelen >= orig / hi)
    scaled = np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv / scaled


@pytest.mark.parametrize("kind", ["qwen2", "llama_untied", "llama3_rope"])
def test_small_models_match_gguf(tmp_path, kind):
    import tiny_gguf
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}
    kw = {"qwen2": dict(arch="qwen2"), "llama_untied": dict(tied=False),
          "llama3_rope": dict(rope_freqs=llama3_factors(16, 10000.0, 8.0, 1.0, 4.0, 64))}[kind]
    gg = tiny_gguf.write(str(tmp_path / "m.gguf"), **kw)
    d = tmp_path / "hf"
    hf_convert.convert(gg, str(d))
    if kind == "llama3_rope":
        cfg = json.loads((d / "config.json").read_text())
        cfg["rope_scaling"] = rope
        (d / "config.json").write_text(json.dumps(cfg))
    ids = [1, 40, 7, 200, 33, 95, 260, 12, 5, 77, 150, 3, 64, 201, 9, 18, 44, 120, 8, 2]
    a, greedy_a = logits(gg, ids, tmp_path, greedy=6)
    b, greedy_b = logits(d, ids, tmp_path, greedy=6)
    rel = np.abs(a - b).max(axis=1) / np.abs(a).max(axis=1)
    assert rel.max() <= 1e-5 and greedy_a == greedy_b
    texts = ["Hello world 12345", "don't STOP 'til 2024!\n\n  x", "<|im_start|>user\nhi<|im_end|>"]
    assert encode(d, texts) == encode(gg, texts)
    assert encode(d, texts, "--special") == encode(gg, texts, "--special")


def test_llama3_style_tokenizer_json(tmp_path):
    """Split regex + ByteLevel(use_regex false), merges as pairs, ignore_merges, BOS added by a
    TemplateProcessing post-processor, chat_template as a list, eos ids from
    generation_config.json — ids as Hugging Face `tokenizers` gives them."""
    from tokenizers import Tokenizer
    import test_swiftkv as sk
    vocab = {sk.byte_char(b): b for b in range(256)}
    merges = [["Ġ", "t"], ["h", "e"], ["Ġt", "he"], ["1", "2"]]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    specials = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
    added = [{"id": len(vocab) + i, "content": s, "special": True, "single_word": False,
              "lstrip": False, "rstrip": False, "normalized": False} for i, s in enumerate(specials)]
    tok = {"version": "1.0", "added_tokens": added, "normalizer": None,
           "pre_tokenizer": hf_convert.pre_tokenizer("llama-bpe"),
           "post_processor": {"type": "Sequence", "processors": [
               {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
               {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                                                         "ids": [added[0]["id"]],
                                                         "tokens": ["<|begin_of_text|>"]}}}]},
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                       "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                     "byte_fallback": False, "ignore_merges": True, "vocab": vocab, "merges": merges}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    tmpl = "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>' }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
         "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": tmpl}]}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [added[1]["id"], 7]}))
    facts = info(tmp_path)
    assert facts["bos"] == str(added[0]["id"]) and facts["add_bos"] == "1"
    assert facts["eos"] == str(added[1]["id"]) and facts["chat"] == "llama3"
    assert facts["eog"].split() == sorted({str(added[1]["id"]), "7"}, key=int)
    texts = ["the theme 12 123 1234", "Hello<|eot_id|>  the\n\n 12", "ÄÖÜ 12x the'S"]
    ref = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert encode(tmp_path, texts, "--special") == [ref.encode(s, add_special_tokens=False).ids
                                                    for s in texts]


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_half_precision_safetensors(tmp_path, dtype):
    """F16 / BF16 files give exactly the logits of F32 files holding the same rounded values."""
    import tiny_gguf
    gg = tiny_gguf.write(str(tmp_path / "m.gguf"))
    hf_convert.convert(gg, str(tmp_path / "half"), dtype=dtype)
    hf_convert.convert(gg, str(tmp_path / "f32"), rounded_to=dtype)
    ids = [1, 40, 7, 200, 33, 95, 260, 12]
    a, ga = logits(tmp_path / "f32", ids, tmp_path, greedy=4)
    b, gb = logits(tmp_path / "half", ids, tmp_path, greedy=4)
    assert np.array_equal(a, b) and ga == gb
    full, _ = logits(gg, ids, tmp_path)
    assert np.abs(full - a).max() > 0   # the rounding is real

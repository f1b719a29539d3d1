"""tok/ (through build/tests/tool_tokenize) against two independent tokenizers on the default model:
- golden ids written once by llama.cpp's llama-tokenize (tests/data/tok_golden_smollm2.jsonl,
  see tests/data/README.md) for the strings of tests/data/tok_strings.jsonl;
- Hugging Face `tokenizers`, built here from the GGUF's own vocabulary and merges (read with the
  gguf package) with SmolLM2's published pre-tokenizer and decoder.
Also: decode(encode(s)) == s, special-token parsing, a 100K-character prompt, tokenizer metadata.
Run from the repo root: .venv/bin/python -m pytest -q tests/test_tokenizer.py
"""
import json
import os
import random
import struct
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "build" / "tests" / "tool_tokenize"
DATA = ROOT / "tests" / "data"
MODEL = Path(os.environ.get("SIFT_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL
DEFAULT_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = pytest.mark.skipif(not TOOL.exists(),
                                reason=f"{TOOL} not built (make {TOOL.relative_to(ROOT)})")
needs_model = pytest.mark.skipif(not MODEL.exists(),
                                 reason=f"model {MODEL} absent (make model fetches it)")
# The golden ids and the HF pre-tokenizer below are SmolLM2's: compare only on that model.
def smollm2_only(fn):
    return needs_model(pytest.mark.skipif(MODEL.name != DEFAULT_MODEL,
                                          reason=f"golden data is for {DEFAULT_MODEL}")(fn))


def load_strings():
    with open(DATA / "tok_strings.jsonl", encoding="ascii") as f:
        return [json.loads(line)["text"] for line in f]


def records(texts):
    out = bytearray()
    for s in texts:
        b = s.encode("utf-8")
        out += struct.pack("<I", len(b)) + b
    return bytes(out)


def sift_encode(texts, special=False, model=MODEL):
    args = [str(TOOL), str(model)] + (["--special"] if special else [])
    res = subprocess.run(args, input=records(texts), capture_output=True, check=True, timeout=120)
    lines = res.stdout.decode().split("\n")[:-1]
    assert len(lines) == len(texts), res.stderr.decode()
    assert not any(line.startswith("ERROR") for line in lines), lines
    return [[int(x) for x in line.split()] for line in lines]


def sift_roundtrip(texts):
    res = subprocess.run([str(TOOL), str(MODEL), "--roundtrip"], input=records(texts),
                         capture_output=True, check=True, timeout=120)
    out, pos = [], 0
    while pos < len(res.stdout):
        (n,) = struct.unpack_from("<I", res.stdout, pos)
        assert n != 0xFFFFFFFF, "tok_encode failed"
        out.append(res.stdout[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


@pytest.fixture(scope="module")
def vocab():
    from gguf import GGUFReader
    r = GGUFReader(str(MODEL))

    def strs(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    f = r.fields["tokenizer.ggml.token_type"]
    return {"tokens": strs("tokenizer.ggml.tokens"), "merges": strs("tokenizer.ggml.merges"),
            "types": [int(f.parts[i][0]) for i in f.data]}


@pytest.fixture(scope="module")
def hf(vocab):
    """SmolLM2's tokenizer as its tokenizer.json describes it, from the GGUF's vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    ids = {tok: i for i, tok in enumerate(vocab["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in vocab["merges"]]
    t = Tokenizer(models.BPE(vocab=ids, merges=merges))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    t.decoder = decoders.ByteLevel()
    return t


@pytest.fixture(scope="module")
def strings():
    return load_strings()


@pytest.fixture(scope="module")
def sift_ids(strings):
    return sift_encode(strings)


@smollm2_only
def test_matches_llama_cpp_golden(strings, sift_ids):
    with open(DATA / "tok_golden_smollm2.jsonl", encoding="ascii") as f:
        golden = [json.loads(line) for line in f]
    assert len(golden) == len(strings)
    bad = [(g["id"], strings[g["id"]], g["ids"], sift_ids[g["id"]]) for g in golden
           if g["ids"] != sift_ids[g["id"]]]
    assert not bad, f"{len(bad)} strings differ from llama.cpp, first: {bad[0]!r}"


# Where Hugging Face and llama.cpp disagree (see tests/data/README.md); sift follows llama.cpp.
# A byte the vocabulary has no token for (here 0x04, 0x1D) inside a pre-token: both drop it, but
# HF drops it before merging, so "!!" + "!!" merge across it into "!!!!"; llama.cpp keeps it as a
# symbol that blocks merges and emits nothing for it.
HF_DIFFERS = {"!!\u0004!!", "..\u001d.."}


@pytest.fixture(scope="module")
def missing_bytes(vocab):
    present = set(vocab["tokens"])
    return {b for b in range(256) if byte_char(b) not in present}


def byte_char(b):
    """GPT-2's bytes_to_unicode, one byte."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    if b in printable:
        return chr(b)
    return chr(256 + [c for c in range(256) if c not in printable].index(b))


@smollm2_only
def test_matches_hugging_face(strings, sift_ids, hf):
    differ = {s for s, ids in zip(strings, sift_ids)
              if ids != hf.encode(s, add_special_tokens=False).ids}
    assert differ == HF_DIFFERS


@needs_model
def test_roundtrip(strings, missing_bytes):
    decoded = sift_roundtrip(strings)
    assert len(decoded) == len(strings)
    for s, d in zip(strings, decoded):
        # A byte with no token in the vocabulary produces nothing and cannot come back.
        want = bytes(b for b in s.encode("utf-8") if b not in missing_bytes)
        assert d == want, (s, d)


@needs_model
def test_special_tokens(vocab):
    tokens = vocab["tokens"]
    start, end = tokens.index("<|im_start|>"), tokens.index("<|im_end|>")
    text = "<|im_start|>user\nhi<|im_end|>"
    with_special = sift_encode([text], special=True)[0]
    assert with_special[0] == start and end in with_special
    plain = sift_encode([text])[0]
    assert start not in plain and end not in plain
    assert b"".join(sift_roundtrip([text])) == text.encode()


@needs_model
def test_special_longest_match_and_neighbours(vocab):
    tokens = vocab["tokens"]
    ids = sift_encode(["a<|im_end|><|im_end|>b<|im_start|>"], special=True)[0]
    end, start = tokens.index("<|im_end|>"), tokens.index("<|im_start|>")
    assert ids[1:3] == [end, end] and ids[-1] == start
    assert [tokens[i] for i in ids[:1]] == ["a"] and tokens[ids[3]] == "b"


@smollm2_only
def test_long_prompt(hf):
    rng = random.Random(7)
    parts = ["The quick brown fox", " jumps", "  over\n", "12345", "naïve", "東京", " 😀",
             "\t", "def f(x): return x**2\n", "    ", "'s", "...", "\r\n"]
    text = ""
    while len(text) < 100_000:
        text += rng.choice(parts)
    text += " " * 5000 + "end"  # one long whitespace pre-token
    t0 = time.perf_counter()
    ids = sift_encode([text])[0]
    elapsed = time.perf_counter() - t0
    assert ids == hf.encode(text, add_special_tokens=False).ids
    assert elapsed < 30, f"100K characters took {elapsed:.1f} s"


@smollm2_only
def test_metadata():
    out = subprocess.run([str(TOOL), str(MODEL), "--info"], capture_output=True, text=True,
                         check=True).stdout
    info = dict(line.split("=", 1) for line in out.splitlines())
    assert info["n_vocab"] == "49152" and info["bos"] == "1" and info["eos"] == "2"
    assert info["add_bos"] == "0" and info["pre"] == "smollm" and info["chat"] == "chatml"
    assert info["default_system"] == ("You are a helpful AI assistant named SmolLM, "
                                      "trained by Hugging Face")
    assert info["eog"].split() == ["0", "2"]  # <|endoftext|>, <|im_end|>


# ---- synthetic tokenizers: behaviour the default model does not exercise, and load errors ----

def byte_tokens():
    return [byte_char(b) for b in range(256)]


def write_tok_gguf(path, model="gpt2", pre="llama-bpe", extra=(("ab", 1),), merges=("a b",),
                   meta=None):
    """A tokenizer-only GGUF: control tokens, the 256 byte tokens, then `extra` (text, type)."""
    import gguf
    specials = [("<|begin_of_text|>", 3), ("<|eot_id|>", 3), ("<|im_end|>", 3), ("<tool>", 4)]
    toks = specials + [(t, 1) for t in byte_tokens()] + list(extra)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list([t for t, _ in toks])
    w.add_token_types([k for _, k in toks])
    w.add_token_merges(list(merges))
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    for key, value in (meta or {}).items():
        w.add_uint32(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return [t for t, _ in toks]


def test_ignore_merges(tmp_path):
    # Only "a b" is a merge, but "abc" is in the vocabulary: llama3 emits the whole pre-token,
    # smollm (no ignore_merges) merges what the merges allow.
    extra, merges = [("ab", 1), ("abc", 1)], ["a b"]
    toks = write_tok_gguf(tmp_path / "l3.gguf", pre="llama-bpe", extra=extra, merges=merges)
    write_tok_gguf(tmp_path / "sm.gguf", pre="smollm", extra=extra, merges=merges)
    assert sift_encode(["abc"], model=tmp_path / "l3.gguf") == [[toks.index("abc")]]
    assert sift_encode(["abc"], model=tmp_path / "sm.gguf") == [[toks.index("ab"), toks.index("c")]]


def test_user_defined_always_control_on_request(tmp_path):
    toks = write_tok_gguf(tmp_path / "t.gguf")
    text = "x<tool><|eot_id|>"
    plain = sift_encode([text], model=tmp_path / "t.gguf")[0]
    assert toks.index("<tool>") in plain and toks.index("<|eot_id|>") not in plain
    special = sift_encode([text], special=True, model=tmp_path / "t.gguf")[0]
    assert special == [toks.index("x"), toks.index("<tool>"), toks.index("<|eot_id|>")]


def test_synthetic_metadata(tmp_path):
    write_tok_gguf(tmp_path / "t.gguf", meta={"tokenizer.ggml.eot_token_id": 1})
    out = subprocess.run([str(TOOL), str(tmp_path / "t.gguf"), "--info"], capture_output=True,
                         text=True, check=True).stdout
    info = dict(line.split("=", 1) for line in out.splitlines())
    assert info["add_bos"] == "1" and info["bos"] == "0" and info["pre"] == "llama-bpe"
    assert info["eog"].split() == ["1", "2"]  # <|eot_id|> (EOT), <|im_end|> (EOS)
    assert info["chat"] == "none" and info["default_system"] == ""


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "llama"}, "unsupported tokenizer model 'llama' (only byte-level BPE 'gpt2')"),
    ({"pre": None}, "no tokenizer.ggml.pre"),
    ({"pre": "gpt-4o"}, "unknown pre-tokenizer 'gpt-4o'"),
    ({"merges": ()}, "no tokenizer.ggml.merges"),
    ({"meta": {"tokenizer.ggml.eos_token_id": 99999}}, "tokenizer.ggml.eos_token_id"),
])
def test_load_errors(tmp_path, kwargs, message):
    write_tok_gguf(tmp_path / "bad.gguf", **kwargs)
    res = subprocess.run([str(TOOL), str(tmp_path / "bad.gguf"), "--info"], capture_output=True,
                         text=True)
    assert res.returncode == 1 and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@needs_model
def test_invalid_utf8_is_an_error():
    b = b"ok \xc3\x28"
    res = subprocess.run([str(TOOL), str(MODEL)], input=struct.pack("<I", len(b)) + b,
                         capture_output=True, check=True)
    assert res.stdout.decode().startswith("ERROR text is not valid UTF-8 (byte offset 3)")

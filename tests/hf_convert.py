"""Write a Hugging Face model directory from a GGUF file, independently of sift.

Uses the `gguf` package (reader + numpy dequantisers), `numpy` and `safetensors` (numpy API).
Every tensor is dequantised to float32 (or written as F16/BF16 when asked) under its HF name;
llama.cpp's Q/K row permutation (made for adjacent-pair RoPE) is undone so the rows are in HF's
half-split order. tokenizer.json is built from the GGUF vocabulary, merges and token types, with
the pre_tokenizer HF uses for that tokenizer.ggml.pre; tokenizer_config.json and
generation_config.json carry BOS/EOS, add_bos_token and the chat template.

    python tests/hf_convert.py MODEL.gguf OUT_DIR [--shards N]
"""

import json
import os
import sys

import numpy as np
import gguf
from gguf.quants import dequantize
from safetensors.numpy import save_file

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def field(r, key, default=None):
    f = r.get_field(key)
    return default if f is None else f.contents()


def hf_name(name):
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    _, layer, rest = name.split(".", 2)
    return f"model.layers.{layer}.{LAYER_NAMES[rest]}"


def unpermute(w, n_head):
    """Inverse of llama.cpp's permute(): rows (head, pair, 2) -> (head, 2, pair)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensors_of(r, arch, n_head, n_kv):
    out = {}
    for t in r.tensors:
        if t.name == "rope_freqs.weight":
            continue
        w = dequantize(t.data, t.tensor_type).reshape(tuple(int(x) for x in reversed(t.shape)))
        w = np.ascontiguousarray(w, dtype=np.float32)
        if arch == "llama" and t.name.endswith("attn_q.weight"):
            w = unpermute(w, n_head)
        if arch == "llama" and t.name.endswith("attn_k.weight"):
            w = unpermute(w, n_kv)
        if w.ndim == 2 and w.shape[0] == 1:
            w = w.reshape(-1)
        out[hf_name(t.name)] = w
    return out


def pre_tokenizer(pre):
    if pre == "smollm":
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    regex = {"llama-bpe": LLAMA3_RE, "llama3": LLAMA3_RE, "qwen2": QWEN2_RE}[pre]
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}


def tokenizer_files(r):
    tokens = list(field(r, "tokenizer.ggml.tokens"))
    types = field(r, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = list(field(r, "tokenizer.ggml.merges"))
    pre = field(r, "tokenizer.ggml.pre")
    vocab, added = {}, []
    for i, (text, ty) in enumerate(zip(tokens, types)):
        vocab.setdefault(text, i)
        if ty in (3, 4):  # control, user-defined
            added.append({"id": i, "content": text, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": ty == 4, "special": ty == 3})
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": pre_tokenizer(pre),
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": pre in ("llama-bpe", "llama3"), "vocab": vocab, "merges": merges},
    }
    bos, eos = field(r, "tokenizer.ggml.bos_token_id"), field(r, "tokenizer.ggml.eos_token_id")
    cfg = {"add_bos_token": bool(field(r, "tokenizer.ggml.add_bos_token", False)),
           "bos_token": tokens[bos] if bos is not None else None,
           "eos_token": tokens[eos] if eos is not None else None,
           "chat_template": field(r, "tokenizer.chat_template")}
    gen = {"bos_token_id": bos, "eos_token_id": eos}
    return tok, cfg, gen


def model_config(r, arch, tensors):
    a = lambda k, d=None: field(r, f"{arch}.{k}", d)  # noqa: E731
    n_head = int(a("attention.head_count"))
    return {
        "architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"],
        "model_type": arch,
        "hidden_size": int(a("embedding_length")),
        "intermediate_size": int(a("feed_forward_length")),
        "num_hidden_layers": int(a("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(a("attention.head_count_kv", n_head)),
        "rms_norm_eps": float(a("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(a("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(a("context_length", 4096)),
        "vocab_size": int(tensors["model.embed_tokens.weight"].shape[0]),
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def round_to(w, dtype):
    """float32 w rounded to F16 or BF16 (round to nearest even), still as float32."""
    if dtype == "F16":
        return w.astype(np.float16).astype(np.float32)
    if dtype == "BF16":
        u = w.astype(np.float32).view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.astype(np.uint32).view(np.float32)
    return w


def save_bf16(tensors, path):
    """safetensors with every tensor as BF16 (numpy has no bfloat16: written by hand)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        raw = (round_to(tensors[name], "BF16").view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def save_weights(tensors, out, shards=1, dtype="F32"):
    """model.safetensors, or `shards` files with model.safetensors.index.json; dtype F32, F16
    or BF16 (single file)."""
    if dtype == "BF16":
        save_bf16(tensors, os.path.join(out, "model.safetensors"))
        return
    if dtype == "F16":
        tensors = {k: v.astype(np.float16) for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, os.path.join(out, "model.safetensors"))
        return
    names = sorted(tensors)
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))},
             "weight_map": {}}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, os.path.join(out, file))
        index["weight_map"].update({n: file for n in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)


def write_json(out, name, obj):
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)


def convert(gguf_path, out, shards=1, dtype="F32", rounded_to=None):
    """rounded_to: store values rounded to F16/BF16 (in the file's dtype), for comparisons."""
    r = gguf.GGUFReader(gguf_path)
    arch = field(r, "general.architecture")
    n_head = int(field(r, f"{arch}.attention.head_count"))
    n_kv = int(field(r, f"{arch}.attention.head_count_kv", n_head))
    os.makedirs(out, exist_ok=True)
    tensors = tensors_of(r, arch, n_head, n_kv)
    if rounded_to:
        tensors = {k: round_to(v, rounded_to) for k, v in tensors.items()}
    save_weights(tensors, out, shards, dtype)
    write_json(out, "config.json", model_config(r, arch, tensors))
    tok, cfg, gen = tokenizer_files(r)
    write_json(out, "tokenizer.json", tok)
    write_json(out, "tokenizer_config.json", cfg)
    write_json(out, "generation_config.json", gen)


if __name__ == "__main__":
    shards = int(sys.argv[sys.argv.index("--shards") + 1]) if "--shards" in sys.argv else 1
    convert(sys.argv[1], sys.argv[2], shards)

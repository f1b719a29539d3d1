#!/usr/bin/env python3
"""Writes a random-weight GGUF of a real Llama shape, for measuring speed and memory at real scale
on the CPU (sift vs llama.cpp) without downloading a model.

    .venv/bin/python bench/make_gguf.py llama-3.2-1b OUT.gguf [--wtype q4_k] [--tok models/X.gguf]

Shapes are the published config.json numbers (the same as weights/synthetic.c). Weights: every
2-D projection in --wtype (q4_k, q4_0, q4_1, q5_0, q5_1, q5_k, q6_k, q8_0) as random blocks with
scales chosen so each weight has std ~ 1/sqrt(fan_in); the token embedding / LM head in Q6_K as a
Q4_K_M file has them; norms F32 1.0. The tokenizer is the --tok model's (default: the default
model), its token list padded with control tokens to the shape's vocabulary so that llama.cpp
accepts the embedding's row count. Tensors are written one at a time (memory: one tensor).
"""
import argparse
import sys

import numpy as np
import gguf

SHAPES = {  # layers, d, heads, kv heads, d_ff, vocab, ctx, tied, theta, llama3 (factor, lo, hi, orig)
    "llama-3.2-1b": (16, 2048, 32, 8, 8192, 128256, 131072, True, 500000.0, (32.0, 1.0, 4.0, 8192)),
    "llama-3.2-3b": (28, 3072, 24, 8, 8192, 128256, 131072, True, 500000.0, (32.0, 1.0, 4.0, 8192)),
    "llama-3.1-8b": (32, 4096, 32, 8, 14336, 128256, 131072, False, 500000.0, (8.0, 1.0, 4.0, 8192)),
}
Q = gguf.GGMLQuantizationType
TYPES = {"q4_0": Q.Q4_0, "q4_1": Q.Q4_1, "q5_0": Q.Q5_0, "q5_1": Q.Q5_1, "q8_0": Q.Q8_0,
         "q4_k": Q.Q4_K, "q5_k": Q.Q5_K, "q6_k": Q.Q6_K, "f16": Q.F16}


def f16(a):
    return np.asarray(a, np.float16).view(np.uint8).reshape(-1, 2)


def random_blocks(qt, n_blocks, std, rng):
    """n_blocks random blocks of type qt whose dequantised values have roughly std `std`."""
    u8 = lambda k: rng.integers(0, 256, size=(n_blocks, k), dtype=np.uint8)
    ones = np.ones(n_blocks)
    if qt in (Q.Q4_0, Q.Q5_0):          # (q - 8|16) * d, q uniform: std = d * 4.6 | 9.2
        d = std / (4.6 if qt == Q.Q4_0 else 9.2) * ones
        parts = [f16(d)] + ([u8(4)] if qt == Q.Q5_0 else []) + [u8(16)]
    elif qt in (Q.Q4_1, Q.Q5_1):        # q * d + m, m = -mean
        half = 7.5 if qt == Q.Q4_1 else 15.5
        d = std / (4.6 if qt == Q.Q4_1 else 9.2) * ones
        parts = [f16(d), f16(-half * d)] + ([u8(4)] if qt == Q.Q5_1 else []) + [u8(16)]
    elif qt == Q.Q8_0:
        parts = [f16(std / 73.9 * ones), u8(32)]
    elif qt in (Q.Q4_K, Q.Q5_K):        # (d*sc) * q - dmin*m, sc and m 6-bit
        levels = 16 if qt == Q.Q4_K else 32
        d = std / (40.0 * levels / 16) * ones
        parts = [f16(d), f16(d * levels / 2 * 40 / 32), u8(12)]
        parts += ([u8(32)] if qt == Q.Q5_K else []) + [u8(128)]
    elif qt == Q.Q6_K:                  # (d*sc) * (q - 32), sc int8: keep them in 1..31
        sc = rng.integers(1, 32, size=(n_blocks, 16), dtype=np.int8).view(np.uint8)
        parts = [u8(128), u8(64), sc, f16(std / (18.5 * 16) * ones)]
    elif qt == Q.F16:
        return (rng.standard_normal(n_blocks) * std).astype(np.float16).view(np.uint8).reshape(-1, 2)
    else:
        raise SystemExit(f"make_gguf: no random blocks for {qt.name}")
    return np.concatenate(parts, axis=1)


def tensor_bytes(qt, rows, cols, std, rng):
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    if cols % bs:
        raise SystemExit(f"make_gguf: {cols} columns are not a multiple of {qt.name}'s {bs}")
    data = random_blocks(qt, rows * cols // bs, std, rng)
    assert data.shape[1] == ts, (qt, data.shape)
    return data.reshape(rows, cols // bs * ts)


def llama3_freqs(hd, theta, factor, lo, hi, orig):
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    wl = 2 * np.pi / inv
    lo_wl, hi_wl = orig / lo, orig / hi
    smooth = (orig / wl - lo) / (hi - lo)
    f = np.where(wl < hi_wl, 1.0, np.where(wl > lo_wl, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    return f.astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out")
    ap.add_argument("--wtype", default="q4_k", choices=sorted(TYPES))
    ap.add_argument("--tok", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    L, d, nh, nkv, dff, vocab, ctx, tied, theta, rs = SHAPES[a.shape]
    hd = d // nh
    wt = TYPES[a.wtype]
    rng = np.random.default_rng(a.seed)

    src = gguf.GGUFReader(a.tok)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"random {a.shape} {a.wtype}")
    w.add_block_count(L)
    w.add_context_length(ctx)
    w.add_embedding_length(d)
    w.add_feed_forward_length(dff)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    # tokenizer: the source model's, token list padded with control tokens to `vocab`
    tokens = [bytes(src.fields["tokenizer.ggml.tokens"].parts[i]) for i in src.fields["tokenizer.ggml.tokens"].data]
    types = [int(src.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in src.fields["tokenizer.ggml.token_type"].data]
    merges = [bytes(src.fields["tokenizer.ggml.merges"].parts[i]) for i in src.fields["tokenizer.ggml.merges"].data]
    n_src = len(tokens)
    tokens += [f"<|pad_{i}|>".encode() for i in range(vocab - n_src)]
    types += [3] * (vocab - n_src)
    w.add_tokenizer_model(bytes(src.fields["tokenizer.ggml.model"].parts[-1]).decode())
    pre = src.fields.get("tokenizer.ggml.pre")
    if pre is not None:
        w.add_tokenizer_pre(bytes(pre.parts[-1]).decode())
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, setter in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                        ("padding_token_id", w.add_pad_token_id)):
        f = src.fields.get("tokenizer.ggml." + key)
        if f is not None:
            setter(int(f.parts[-1][0]))
    tmpl = src.fields.get("tokenizer.chat_template")
    if tmpl is not None:
        w.add_chat_template(bytes(tmpl.parts[-1]).decode())

    # tensor infos first (shapes and types), then the data one tensor at a time
    plan = []  # (name, rows, cols, type, std); rows 0 = vector
    plan.append(("token_embd.weight", vocab, d, Q.Q6_K if tied else wt, 1.0))
    plan.append(("output_norm.weight", 0, d, Q.F32, None))
    if not tied:
        plan.append(("output.weight", vocab, d, Q.Q6_K, d ** -0.5))
    plan.append(("rope_freqs.weight", 0, hd // 2, Q.F32, "rope"))
    for l in range(L):
        b = f"blk.{l}."
        plan += [(b + "attn_norm.weight", 0, d, Q.F32, None),
                 (b + "attn_q.weight", nh * hd, d, wt, d ** -0.5),
                 (b + "attn_k.weight", nkv * hd, d, wt, d ** -0.5),
                 (b + "attn_v.weight", nkv * hd, d, wt, d ** -0.5),
                 (b + "attn_output.weight", d, nh * hd, wt, (nh * hd) ** -0.5 / L ** 0.5),
                 (b + "ffn_norm.weight", 0, d, Q.F32, None),
                 (b + "ffn_gate.weight", dff, d, wt, d ** -0.5),
                 (b + "ffn_up.weight", dff, d, wt, d ** -0.5),
                 (b + "ffn_down.weight", d, dff, wt, dff ** -0.5 / L ** 0.5)]
    for name, rows, cols, qt, _ in plan:
        if qt == Q.F32:
            w.add_tensor_info(name, (cols,), np.dtype(np.float32), cols * 4, raw_dtype=qt)
        else:
            bs, ts = gguf.GGML_QUANT_SIZES[qt]
            w.add_tensor_info(name, (rows, cols // bs * ts), np.dtype(np.uint8),
                              rows * cols // bs * ts, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (name, rows, cols, qt, std) in enumerate(plan):
        if qt == Q.F32:
            data = (llama3_freqs(hd, theta, *rs) if std == "rope" else np.ones(cols, np.float32))
        else:
            data = tensor_bytes(qt, rows, cols, std, rng)
        w.write_tensor_data(data)
        print(f"\rmake_gguf: {i + 1}/{len(plan)} tensors", end="", file=sys.stderr)
    print(file=sys.stderr)
    w.close()


if __name__ == "__main__":
    main()

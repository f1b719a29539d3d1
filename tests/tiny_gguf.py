"""Writes tiny Llama-family GGUF models with the `gguf` package, for tests that need a model with
a particular shape, architecture, tensor type or defect. Weights are seeded random, scaled so
activations stay O(1). The vocabulary is the 256 byte tokens (GPT-2 byte-to-unicode) plus
<|endoftext|>, <|im_start|>, <|im_end|>, and a few merges."""
import numpy as np
import gguf

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}")


def byte_tokens():
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = 0
    mapping = {}
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def tokenizer_fields(w, pre):
    toks = SPECIALS + byte_tokens()
    merges = ["Ġ t", "h e", "Ġt he"]
    toks += ["Ġt", "he", "Ġthe"]
    types = [3] * len(SPECIALS) + [1] * (len(toks) - len(SPECIALS))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    return len(toks)


def write(path, arch="llama", n_layer=2, d=64, n_head=4, n_kv=2, ff=128, ctx=256,
          dtype=gguf.GGMLQuantizationType.F32, rope_freqs=False, tied=True, drop=None,
          meta=None, seed=0, pre=None, dtypes=None):
    """Writes a model; `drop` names a tensor to leave out, `meta` overrides metadata ints;
    `dtypes` maps a tensor name's suffix ("attn_v.weight", "token_embd.weight") to its type, in
    place of `dtype` (files mix types: a Q4_K_M keeps attn_v and ffn_down at Q6_K)."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    meta = dict(meta or {})
    ints = {"block_count": n_layer, "context_length": ctx, "embedding_length": d,
            "feed_forward_length": ff, "attention.head_count": n_head,
            "attention.head_count_kv": n_kv}
    ints.update(meta)
    for k, v in ints.items():
        w.add_uint32(f"{arch}.{k}", v) if v >= 0 else w.add_int64(f"{arch}.{k}", v)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    vocab = tokenizer_fields(w, pre or ("qwen2" if arch == "qwen2" else "smollm"))
    hd = d // n_head

    def mat(rows, cols, scale=None):
        return (rng.standard_normal((rows, cols)) * (scale or 1 / np.sqrt(cols))).astype(np.float32)

    def add(name, arr):
        if name == drop:
            return
        dtype_of = next((t for k, t in (dtypes or {}).items() if name.endswith(k)), dtype)
        Q = gguf.GGMLQuantizationType
        # f16 super-block scales of the K-quants written as random blocks: their byte offsets
        scales = {Q.Q2_K: [], Q.Q3_K: [], Q.Q4_K: [0, 2], Q.Q6_K: [208]}
        if arr.ndim == 2 and dtype_of in scales:
            # no quantiser in the gguf package: random blocks of the right size; where the scales'
            # offsets are given, those set so that rows have about unit norm (Q2_K and Q3_K keep
            # random scales: the tests only load them to see them refused)
            block, size = gguf.GGML_QUANT_SIZES[dtype_of]
            raw = rng.integers(0, 256, (arr.shape[0], arr.shape[1] // block * size), np.uint8)
            d = np.float16(1.0 / np.sqrt(arr.shape[1]) / (500.0 if dtype_of == Q.Q4_K else 2000.0))
            blocks = raw.reshape(arr.shape[0], -1, size)
            for o in scales[dtype_of]:
                blocks[:, :, o:o + 2] = np.frombuffer(d.tobytes(), np.uint8)
            w.add_tensor(name, raw, raw_dtype=dtype_of)
        elif arr.ndim == 2 and dtype_of != gguf.GGMLQuantizationType.F32:
            q = gguf.quants.quantize(arr, dtype_of)
            w.add_tensor(name, q, raw_dtype=dtype_of)
        else:
            w.add_tensor(name, arr)

    add("token_embd.weight", mat(vocab, d, 1.0))
    add("output_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    if not tied:
        add("output.weight", mat(vocab, d))
    if rope_freqs is not False and rope_freqs is not None:   # True: a made-up ramp; or the values
        ramp = np.linspace(1.0, 8.0, hd // 2) if rope_freqs is True else rope_freqs
        add("rope_freqs.weight", np.asarray(ramp, dtype=np.float32))
    for l in range(n_layer):
        p = f"blk.{l}."
        add(p + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
        add(p + "attn_q.weight", mat(n_head * hd, d))
        add(p + "attn_k.weight", mat(n_kv * hd, d))
        add(p + "attn_v.weight", mat(n_kv * hd, d))
        add(p + "attn_output.weight", mat(d, n_head * hd))
        add(p + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
        add(p + "ffn_gate.weight", mat(ff, d))
        add(p + "ffn_up.weight", mat(ff, d))
        add(p + "ffn_down.weight", mat(d, ff))
        if arch == "qwen2":
            for t, n in (("q", n_head), ("k", n_kv), ("v", n_kv)):
                add(p + f"attn_{t}.bias", (0.1 * rng.standard_normal(n * hd)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

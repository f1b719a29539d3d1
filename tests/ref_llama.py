"""Independent float64 numpy reference forward pass for Llama-family GGUF models.

Shares no code with sift: weights come from the `gguf` PyPI package (GGUFReader and
gguf.quants.dequantize), everything else is written here from the model definition.

Supported: architectures `llama` (Llama 3.x, SmolLM2) and `qwen2` (Qwen2.5); GQA; tied
embeddings (no output.weight -> token_embd.weight is the LM head); rms_norm_eps; rope freq_base;
llama3 rope scaling through a `rope_freqs.weight` tensor (inverse frequencies divided by it);
Qwen2 QKV biases.

API:
    m = load(path)                 # dequantises every weight once, caches it as float64
    logits = forward(m, ids)       # [n, vocab] float64, full causal attention, positions 0..n-1
    out = greedy(m, ids, n)        # n argmax ids, one at a time (with a KV cache)

Run as a script for a sanity check:  python tests/ref_llama.py [MODEL]
(needs the HF `tokenizers` package to build the tokenizer from the GGUF vocabulary).

Memory: every weight is held as float64 (SmolLM2-135M: ~1.1 GB, of which the 49152 x 576
embedding is 226 MB). Activations are [n, d]-sized; attention scores are [heads, n, n].
"""

import glob
import os
import sys
from dataclasses import dataclass, field

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # effective only if numpy is not imported yet
import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"


def _blas_single_thread():
    """Our matmuls are small ([<=64, 576] x [576, 1536]); on a 2-core machine OpenBLAS threads
    make them 5-70x slower than one thread. numpy may already be imported (other tests), so
    also set numpy's bundled OpenBLAS to one thread directly when its symbol is found."""
    import ctypes

    libdir = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for lib in glob.glob(os.path.join(libdir, "*openblas*.so*")):
        try:
            so = ctypes.CDLL(lib)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                    "openblas_set_num_threads"):
            fn = getattr(so, sym, None)
            if fn is not None:
                fn(ctypes.c_int(1))
                break


_blas_single_thread()


@dataclass
class Layer:
    attn_norm: np.ndarray
    wq: np.ndarray  # [n_head * head_dim, d]   (rows = output features)
    wk: np.ndarray  # [n_kv * head_dim, d]
    wv: np.ndarray  # [n_kv * head_dim, d]
    wo: np.ndarray  # [d, n_head * head_dim]
    bq: np.ndarray | None
    bk: np.ndarray | None
    bv: np.ndarray | None
    ffn_norm: np.ndarray
    w_gate: np.ndarray  # [ffn, d]
    w_up: np.ndarray  # [ffn, d]
    w_down: np.ndarray  # [d, ffn]


@dataclass
class Model:
    arch: str
    n_layer: int
    d: int
    n_head: int
    n_kv: int
    head_dim: int
    n_rot: int
    ffn: int
    vocab: int
    eps: float
    rope_base: float
    rope_neox: bool  # True: pairs (i, i + n_rot/2); False: adjacent pairs (2i, 2i+1)
    inv_freq: np.ndarray  # [n_rot / 2]
    tok_embd: np.ndarray  # [vocab, d]
    out_norm: np.ndarray  # [d]
    lm_head: np.ndarray  # [vocab, d] (the same array as tok_embd when tied)
    layers: list = field(default_factory=list)
    tokens: list | None = None  # token strings (for the sanity script)
    merges: list | None = None


def _field(reader, key, default=None):
    f = reader.get_field(key)
    if f is None:
        if default is None:
            raise KeyError(f"GGUF metadata key {key!r} missing")
        return default
    return f.contents()


def _tensor(tensors, name, required=True):
    """Dequantise one tensor to float64 with numpy shape [ne1, ne0] (rows = output features)."""
    t = tensors.get(name)
    if t is None:
        if required:
            raise KeyError(f"GGUF tensor {name!r} missing")
        return None
    w = dequantize(t.data, t.tensor_type)
    # GGUF lists dims fastest-first (ne0, ne1, ...); numpy wants them reversed.
    shape = tuple(int(x) for x in reversed(t.shape))
    return np.ascontiguousarray(w.reshape(shape), dtype=np.float64)


def load(path=DEFAULT_MODEL):
    r = gguf.GGUFReader(path)
    arch = _field(r, "general.architecture")
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"unsupported architecture {arch!r} (reference knows llama, qwen2)")
    a = lambda k, dflt=None: _field(r, f"{arch}.{k}", dflt)  # noqa: E731
    d = int(a("embedding_length"))
    n_head = int(a("attention.head_count"))
    n_kv = int(a("attention.head_count_kv", n_head))
    head_dim = int(a("attention.key_length", d // n_head))
    n_rot = int(a("rope.dimension_count", head_dim))
    tensors = {t.name: t for t in r.tensors}

    tok_embd = _tensor(tensors, "token_embd.weight")
    lm_head = _tensor(tensors, "output.weight", required=False)
    if lm_head is None:  # tied embeddings
        lm_head = tok_embd

    # RoPE inverse frequencies theta_i = base^(-2i / n_rot), i = 0 .. n_rot/2 - 1.
    base = float(a("rope.freq_base", 10000.0))
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    rope_freqs = _tensor(tensors, "rope_freqs.weight", required=False)
    if rope_freqs is not None:  # llama3 scaling: per-frequency divisors, precomputed by the converter
        inv_freq = inv_freq / rope_freqs.reshape(-1)[: n_rot // 2]

    m = Model(
        arch=arch,
        n_layer=int(a("block_count")),
        d=d,
        n_head=n_head,
        n_kv=n_kv,
        head_dim=head_dim,
        n_rot=n_rot,
        ffn=int(a("feed_forward_length")),
        vocab=tok_embd.shape[0],
        eps=float(a("attention.layer_norm_rms_epsilon")),
        rope_base=base,
        # llama.cpp's converter permutes Q/K rows of `llama` models (see _rope); qwen2 is not permuted.
        rope_neox=(arch == "qwen2"),
        inv_freq=inv_freq,
        tok_embd=tok_embd,
        out_norm=_tensor(tensors, "output_norm.weight"),
        lm_head=lm_head,
    )
    for i in range(m.n_layer):
        g = lambda n, req=True: _tensor(tensors, f"blk.{i}.{n}", req)  # noqa: E731
        m.layers.append(
            Layer(
                attn_norm=g("attn_norm.weight"),
                wq=g("attn_q.weight"),
                wk=g("attn_k.weight"),
                wv=g("attn_v.weight"),
                wo=g("attn_output.weight"),
                bq=g("attn_q.bias", False),
                bk=g("attn_k.bias", False),
                bv=g("attn_v.bias", False),
                ffn_norm=g("ffn_norm.weight"),
                w_gate=g("ffn_gate.weight"),
                w_up=g("ffn_up.weight"),
                w_down=g("ffn_down.weight"),
            )
        )
    assert m.layers[0].wq.shape == (n_head * head_dim, d), m.layers[0].wq.shape
    assert m.layers[0].wk.shape == (n_kv * head_dim, d), m.layers[0].wk.shape
    f = r.get_field("tokenizer.ggml.tokens")
    if f is not None:
        m.tokens = f.contents()
        mf = r.get_field("tokenizer.ggml.merges")
        m.merges = mf.contents() if mf is not None else []
    return m


def _rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(m, x, pos):
    """Rotate x [n, heads, head_dim] in place by positions pos [n].

    HF Llama rotates the pairs (i, i + n_rot/2) of each head ("rotate_half", NEOX layout).
    For `llama` GGUFs, llama.cpp's converter reorders the Q and K rows of every head so that
    HF row s * n_rot/2 + i (s in {0, 1}) is stored at row 2i + s: the HF pair (i, i + n_rot/2)
    becomes the ADJACENT pair (2i, 2i + 1), with the same frequency theta_i. We therefore
    rotate adjacent pairs on the GGUF rows as stored ("NORM" rope) rather than un-permuting.
    Q and K are permuted identically within each head and V / attn_output are untouched, so
    q . k — and everything downstream — is the same as HF's. `qwen2` GGUFs are stored
    unpermuted, so they use the half-split pairs directly.
    """
    ang = pos.astype(np.float64)[:, None] * m.inv_freq[None, :]  # [n, n_rot/2]
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    half = m.n_rot // 2
    if m.rope_neox:
        a = x[..., :half].copy()
        b = x[..., half : m.n_rot].copy()
        x[..., :half] = a * cos - b * sin
        x[..., half : m.n_rot] = a * sin + b * cos
    else:
        a = x[..., 0 : m.n_rot : 2].copy()
        b = x[..., 1 : m.n_rot : 2].copy()
        x[..., 0 : m.n_rot : 2] = a * cos - b * sin
        x[..., 1 : m.n_rot : 2] = a * sin + b * cos
    return x


def _linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def _silu(x):
    return x / (1.0 + np.exp(-x))


def new_cache(m):
    """Per-layer post-RoPE K and V, each [n_kv, len, head_dim]."""
    return [[np.zeros((m.n_kv, 0, m.head_dim)), np.zeros((m.n_kv, 0, m.head_dim))] for _ in m.layers]


def hidden(m, ids, cache=None, start=0, trace=None):
    """Run the layer stack on ids at positions start.. ; returns final-normed rows [n, d].

    With a cache, the new rows attend to the cached keys plus themselves (causally).
    trace, if a list, receives (name, array) pairs per layer for debugging.
    """
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    if cache is None:
        cache = new_cache(m)
    pos = np.arange(start, start + n)
    hd, nh, nkv = m.head_dim, m.n_head, m.n_kv
    group = nh // nkv
    x = m.tok_embd[ids].copy()  # [n, d]
    if trace is not None:
        trace.append(("embd", x.copy()))
    for li, L in enumerate(m.layers):
        h = _rmsnorm(x, L.attn_norm, m.eps)
        q = _linear(h, L.wq, L.bq).reshape(n, nh, hd)
        k = _linear(h, L.wk, L.bk).reshape(n, nkv, hd)
        v = _linear(h, L.wv, L.bv).reshape(n, nkv, hd)
        _rope(m, q, pos)
        _rope(m, k, pos)
        kc = np.concatenate([cache[li][0], k.transpose(1, 0, 2)], axis=1)  # [nkv, T, hd]
        vc = np.concatenate([cache[li][1], v.transpose(1, 0, 2)], axis=1)
        cache[li][0], cache[li][1] = kc, vc
        T = kc.shape[1]
        # query head j uses kv head j // group (GQA)
        kq = np.repeat(kc, group, axis=0)  # [nh, T, hd]
        vq = np.repeat(vc, group, axis=0)
        s = np.einsum("nhd,htd->hnt", q, kq) / np.sqrt(hd)  # [nh, n, T]
        key_pos = np.arange(T)
        s = np.where(key_pos[None, None, :] <= pos[None, :, None], s, -np.inf)
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        o = np.einsum("hnt,htd->nhd", p, vq).reshape(n, nh * hd)
        x = x + _linear(o, L.wo)
        h = _rmsnorm(x, L.ffn_norm, m.eps)
        x = x + _linear(_silu(_linear(h, L.w_gate)) * _linear(h, L.w_up), L.w_down)
        if trace is not None:
            trace.append((f"blk.{li}", x.copy()))
    return _rmsnorm(x, m.out_norm, m.eps)


def forward(m, ids, trace=None):
    """Logits [n, vocab] (float64) for every position of ids, full causal attention."""
    return _linear(hidden(m, ids, trace=trace), m.lm_head)


def greedy(m, ids, n):
    """n greedily generated ids (argmax, lowest id on ties), one token at a time with a KV cache."""
    cache = new_cache(m)
    h = hidden(m, ids, cache, 0)
    out = []
    cur = len(ids)
    for _ in range(n):
        nxt = int(np.argmax(_linear(h[-1:], m.lm_head)[0]))
        out.append(nxt)
        h = hidden(m, [nxt], cache, cur)
        cur += 1
    return out


def as_neox(m):
    """A copy of a `llama` GGUF model with Q/K rows put back in HF order (GGUF row 2i + s of a
    head -> HF row s * n_rot/2 + i) and half-split rope: must give the same logits as `m`."""
    import copy

    def unperm(w, heads):
        rows = w.reshape(heads, m.head_dim, -1)
        rot = rows[:, : m.n_rot].reshape(heads, m.n_rot // 2, 2, -1).swapaxes(1, 2)
        rows = np.concatenate([rot.reshape(heads, m.n_rot, -1), rows[:, m.n_rot :]], axis=1)
        return rows.reshape(w.shape)

    out = copy.copy(m)
    out.rope_neox = True
    out.layers = []
    for L in m.layers:
        L2 = copy.copy(L)
        L2.wq, L2.wk = unperm(L.wq, m.n_head), unperm(L.wk, m.n_kv)
        if L.bq is not None:
            L2.bq = unperm(L.bq, m.n_head)
        if L.bk is not None:
            L2.bk = unperm(L.bk, m.n_kv)
        out.layers.append(L2)
    return out


# ---- sanity script: tokenizer built from the GGUF vocabulary with HF `tokenizers` ----


def hf_tokenizer(m):
    """Byte-level BPE from the GGUF vocab/merges, smollm pre-tokenizer (digits split, GPT-2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(m.tokens)}
    merges = [tuple(x.split(" ", 1)) for x in m.merges]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tk.decoder = decoders.ByteLevel()
    specials = [t for t in m.tokens if t.startswith("<|") and t.endswith("|>")]
    tk.add_special_tokens(specials)
    return tk


def _main():
    import time

    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODEL
    t0 = time.time()
    m = load(path)
    print(f"loaded {path}: arch={m.arch} L={m.n_layer} d={m.d} heads={m.n_head}/{m.n_kv} "
          f"hd={m.head_dim} ffn={m.ffn} vocab={m.vocab} ({time.time() - t0:.1f}s)")
    tk = hf_tokenizer(m)
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ids = tk.encode(prompt).ids
    print("prompt ids:", ids)
    t0 = time.time()
    out = greedy(m, ids, 24)
    print(f"greedy ({time.time() - t0:.1f}s):", out)
    print(repr(tk.decode(out)))


if __name__ == "__main__":
    _main()

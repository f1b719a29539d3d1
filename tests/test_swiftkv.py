"""swiftkv (specs/swiftkv.md) against an independent float64 numpy implementation of the spec.

Small random Llama models are written here as Hugging Face directories (numpy + safetensors):
  * llama_swiftkv checkpoints with random *_swiftkv weights (not copies of the originals), with
    and without the original upper q/k/v projections, AcrossKV groups of 1 and 2;
  * a plain Llama for the training-free init (both norm variants, groups of 1, 2 and 3), and a
    Qwen2 (q/k/v biases: a group's bias is the mean of its layers').
The reference runs every token (prompt, then generated) by the spec's decode rule — layers < l
normally, the group K/V from RMSNorm(x_l; norm_swiftkv), layers >= l with Q' over the group's
cache — which is exactly what the spec's prefill computes for the last prompt token.
Checked: sift's first-token logits (<= 1e-4 of the largest, relative) and every greedily chosen
token (the reference, fed sift's tokens, must rank it within 1e-3 of its best logit). Plus:
swiftkv with l = L equals full on the default model; measured KV bytes and prefill rows equal
the spec's formulas; bad configurations fail with one line.
"""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "build" / "tests" / "tool_logits"
SIFT = ROOT / "sift"
MODEL = Path(os.environ.get("SIFT_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
if not MODEL.is_absolute():
    MODEL = ROOT / MODEL
ENV = dict(os.environ, OMP_WAIT_POLICY="passive")
pytestmark = pytest.mark.skipif(not TOOL.exists(), reason="build/tests/tool_logits not built")

L, D, H, HKV, HD, FF, VOCAB, EPS, THETA = 6, 64, 4, 2, 16, 96, 300, 1e-5, 10000.0
PROMPT = [5, 17, 250, 3, 99, 42, 7, 180, 64, 11, 0, 299]
N_GREEDY = 6


# ---- writing small models --------------------------------------------------------------------

def random_weights(rng, swiftkv=None, upper_qkv=True, bias=False):
    """HF-named float32 tensors. swiftkv = (l, G): add the checkpoint's extra tensors; bias: q/k/v
    biases (Qwen2)."""
    def mat(o, i):
        return (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    def gamma():
        return (1 + 0.3 * rng.standard_normal(D)).astype(np.float32)
    w = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, D)).astype(np.float32),
         "model.norm.weight": gamma(), "lm_head.weight": mat(VOCAB, D)}
    for j in range(L):
        p = f"model.layers.{j}."
        w.update({p + "input_layernorm.weight": gamma(), p + "post_attention_layernorm.weight": gamma(),
                  p + "self_attn.o_proj.weight": mat(D, H * HD), p + "mlp.gate_proj.weight": mat(FF, D),
                  p + "mlp.up_proj.weight": mat(FF, D), p + "mlp.down_proj.weight": mat(D, FF)})
        if swiftkv is None or upper_qkv or j < swiftkv[0]:
            w.update({p + "self_attn.q_proj.weight": mat(H * HD, D),
                      p + "self_attn.k_proj.weight": mat(HKV * HD, D),
                      p + "self_attn.v_proj.weight": mat(HKV * HD, D)})
            if bias:
                for t, n in (("q", H), ("k", HKV), ("v", HKV)):
                    w[p + f"self_attn.{t}_proj.bias"] = (0.5 * rng.standard_normal(n * HD)).astype(np.float32)
    if swiftkv is not None:
        l, G = swiftkv
        w["model.norm_swiftkv.weight"] = gamma()
        for j in range(l, L):
            p = f"model.layers.{j}.self_attn."
            w[p + "q_proj_swiftkv.weight"] = mat(H * HD, D)
            if (j - l) % G == 0:
                w[p + "k_proj_swiftkv.weight"] = mat(HKV * HD, D)
                w[p + "v_proj_swiftkv.weight"] = mat(HKV * HD, D)
    return w


def write_model(path, weights, swiftkv=None, arch="LlamaForCausalLM"):
    path.mkdir(parents=True)
    cfg = {"architectures": [arch], "model_type": "llama", "hidden_size": D,
           "intermediate_size": FF, "num_hidden_layers": L, "num_attention_heads": H,
           "num_key_value_heads": HKV, "rms_norm_eps": EPS, "rope_theta": THETA,
           "vocab_size": VOCAB, "tie_word_embeddings": False, "hidden_act": "silu",
           "max_position_embeddings": 256}
    if swiftkv is not None:
        cfg.update({"architectures": ["LlamaSwiftKVForCausalLM"], "model_type": "llama_swiftkv",
                    "num_key_value_layers": swiftkv[0], "key_value_group_size": swiftkv[1],
                    "swiftkv": True})
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(weights, str(path / "model.safetensors"))
    write_byte_tokenizer(path)
    return path


def byte_char(b):
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    return chr(b) if b in printable else chr(256 + [c for c in range(256) if c not in printable].index(b))


def write_byte_tokenizer(path):
    """A byte-level BPE with the 256 byte tokens, no merges, and <|end|> (id 256)."""
    vocab = {byte_char(b): b for b in range(256)}
    tok = {"added_tokens": [{"id": 256, "content": "<|end|>", "special": True}],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "model": {"type": "BPE", "vocab": vocab, "merges": []}}
    (path / "tokenizer.json").write_text(json.dumps(tok))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))


# ---- the reference ---------------------------------------------------------------------------

def rmsnorm(x, g):
    return x / np.sqrt((x * x).mean() + EPS) * g


INV_FREQ = THETA ** (-np.arange(0, HD, 2, dtype=np.float64) / HD)


def rope(x, pos):
    """x (heads, HD), half-split rotation at position pos."""
    c, s = np.cos(pos * INV_FREQ), np.sin(pos * INV_FREQ)
    a, b = x[:, :HD // 2], x[:, HD // 2:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=1)


def attend(q, ks, vs):
    """q (H, HD) over cached ks, vs (t, HKV, HD) (all visible), GQA."""
    k, v = np.array(ks), np.array(vs)
    out = np.empty_like(q)
    for h in range(H):
        g = h // (H // HKV)
        sc = k[:, g, :] @ q[h] / np.sqrt(HD)
        p = np.exp(sc - sc.max())
        out[h] = (p / p.sum()) @ v[:, g, :]
    return out


def silu(x):
    return x / (1 + np.exp(-x))


class Reference:
    """The spec's per-token rule. kv(j, x_l) -> (k, v) for a group leader j >= l."""

    def __init__(self, w, l, G, q_upper, kv_upper):
        self.w = {k: v.astype(np.float64) for k, v in w.items()}
        self.l, self.G, self.q_upper, self.kv_upper = l, G, q_upper, kv_upper
        self.cache = {j: ([], []) for j in range(L)}

    def bias(self, j, t):
        return self.w.get(f"model.layers.{j}.self_attn.{t}_proj.bias", 0.0)

    def proj(self, j, t, a):
        return self.w[f"model.layers.{j}.self_attn.{t}_proj.weight"] @ a + self.bias(j, t)

    def step(self, tok, pos):
        w, x = self.w, self.w["model.embed_tokens.weight"][tok].copy()
        for j in range(L):
            p = f"model.layers.{j}."
            if j == self.l:
                for lead in range(self.l, L, self.G):
                    k, v = self.kv_upper(lead, x)
                    self.cache[lead][0].append(rope(k.reshape(HKV, HD), pos))
                    self.cache[lead][1].append(v.reshape(HKV, HD))
            a = rmsnorm(x, w[p + "input_layernorm.weight"])
            if j < self.l:
                q = self.proj(j, "q", a)
                self.cache[j][0].append(rope(self.proj(j, "k", a).reshape(HKV, HD), pos))
                self.cache[j][1].append(self.proj(j, "v", a).reshape(HKV, HD))
                ks, vs = self.cache[j]
            else:
                q = self.q_upper(j) @ a + self.bias(j, "q")
                ks, vs = self.cache[j - (j - self.l) % self.G]
            att = attend(rope(q.reshape(H, HD), pos), ks, vs)
            x = x + w[p + "self_attn.o_proj.weight"] @ att.reshape(-1)
            m = rmsnorm(x, w[p + "post_attention_layernorm.weight"])
            x = x + w[p + "mlp.down_proj.weight"] @ (silu(w[p + "mlp.gate_proj.weight"] @ m) *
                                                    (w[p + "mlp.up_proj.weight"] @ m))
        return w["lm_head.weight"] @ rmsnorm(x, w["model.norm.weight"])


def checkpoint_reference(w, l, G):
    W = {k: v.astype(np.float64) for k, v in w.items()}
    a = "model.layers.{}.self_attn."

    def kv(j, x):
        hs = rmsnorm(x, W["model.norm_swiftkv.weight"])
        return W[a.format(j) + "k_proj_swiftkv.weight"] @ hs, W[a.format(j) + "v_proj_swiftkv.weight"] @ hs
    return Reference(w, l, G, lambda j: W[a.format(j) + "q_proj_swiftkv.weight"], kv)


def training_free_reference(w, l, G, own_norm):
    """Q' = Q; K'/V' of a group = mean of its layers' K/V weights (and biases); norm = layer l's
    input norm, or (own_norm) each layer's own input norm applied before its K/V weights (gamma
    folded)."""
    W = {k: v.astype(np.float64) for k, v in w.items()}
    p = "model.layers.{}."

    def kv(lead, x):
        ks, vs, kb, vb = [], [], [], []
        for j in range(lead, lead + G):
            g = W[p.format(j if own_norm else l) + "input_layernorm.weight"]
            ks.append(W[p.format(j) + "self_attn.k_proj.weight"] * g[None, :])
            vs.append(W[p.format(j) + "self_attn.v_proj.weight"] * g[None, :])
            kb.append(W.get(p.format(j) + "self_attn.k_proj.bias", 0.0))
            vb.append(W.get(p.format(j) + "self_attn.v_proj.bias", 0.0))
        xn = x / np.sqrt((x * x).mean() + EPS)
        return (np.mean(ks, axis=0) @ xn + np.mean(kb, axis=0),
                np.mean(vs, axis=0) @ xn + np.mean(vb, axis=0))
    return Reference(w, l, G, lambda j: W[p.format(j) + "self_attn.q_proj.weight"], kv)


# ---- running sift ----------------------------------------------------------------------------

def sift(model, tmp_path, sets=(), strategy="swiftkv", ids=PROMPT, greedy=N_GREEDY):
    out = tmp_path / "logits.f32"
    args = [str(TOOL), str(model), str(out), "--greedy", str(greedy), "--strategy", strategy]
    for s in sets:
        args += ["--set", s]
    res = subprocess.run(args + [str(i) for i in ids], capture_output=True, text=True, env=ENV,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    return np.fromfile(out, dtype=np.float32), [int(t) for t in res.stdout.split()]


def check_against(ref, logits, greedy):
    for pos, tok in enumerate(PROMPT):
        want = ref.step(tok, pos)
    assert np.abs(logits - want).max() <= 1e-4 * np.abs(want).max()
    for t, tok in enumerate(greedy):
        assert want[tok] >= want.max() - 1e-3, f"step {t}: token {tok} is not the reference's best"
        if t + 1 < len(greedy):
            want = ref.step(tok, len(PROMPT) + t)


@pytest.mark.parametrize("l,G,upper_qkv", [(2, 2, True), (3, 1, False), (4, 1, True)])
def test_checkpoint_matches_reference(tmp_path, l, G, upper_qkv):
    rng = np.random.default_rng(100 * l + 10 * G + upper_qkv)
    w = random_weights(rng, swiftkv=(l, G), upper_qkv=upper_qkv)
    d = write_model(tmp_path / "ckpt", w, swiftkv=(l, G))
    logits, greedy = sift(d, tmp_path)
    check_against(checkpoint_reference(w, l, G), logits, greedy)


@pytest.mark.parametrize("l,G,own", [(2, 2, 1), (2, 2, 0), (3, 1, 1), (3, 3, 0)])
def test_training_free_matches_reference(tmp_path, l, G, own):
    rng = np.random.default_rng(7 + l + G + own)
    w = random_weights(rng)
    d = write_model(tmp_path / "plain", w)
    sets = [f"swiftkv_layers={l}", f"swiftkv_group={G}", f"swiftkv_fold={own}"]
    logits, greedy = sift(d, tmp_path, sets)
    check_against(training_free_reference(w, l, G, own), logits, greedy)


@pytest.mark.parametrize("own", [0, 1])
def test_training_free_qwen2_biases(tmp_path, own):
    """Qwen2 (q/k/v biases): a group's K/V bias is the mean of its layers' biases."""
    w = random_weights(np.random.default_rng(11 + own), bias=True)
    d = write_model(tmp_path / "qwen", w, arch="Qwen2ForCausalLM")
    logits, greedy = sift(d, tmp_path, ["swiftkv_layers=2", "swiftkv_group=2", f"swiftkv_fold={own}"])
    check_against(training_free_reference(w, 2, 2, own), logits, greedy)


def test_all_layers_is_full(tmp_path):
    """l = L: no SwiftKV layers, so swiftkv is full exactly (default model)."""
    if not MODEL.exists():
        pytest.skip("default model absent")
    ids = [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30]
    full, g_full = sift(MODEL, tmp_path, strategy="full", ids=ids, greedy=8)
    swift, g_swift = sift(MODEL, tmp_path, ["swiftkv_layers=30"], ids=ids, greedy=8)
    assert np.array_equal(full, swift) and g_full == g_swift


def run_cli(model, *args):
    return subprocess.run([str(SIFT), "-m", str(model), "-p", "hi", "-n", "2", "--temp", "0",
                           "--strategy", "swiftkv", *args], capture_output=True, text=True,
                          errors="replace", env=ENV, timeout=300)


def one_error_line(res, message):
    lines = res.stderr.strip().splitlines()
    return (res.returncode in (1, 2) and len(lines) == 1 and lines[0].startswith("sift: error:")
            and message in lines[0])


@pytest.mark.skipif(not SIFT.exists(), reason="sift not built")
def test_bad_configurations(tmp_path):
    rng = np.random.default_rng(3)
    w = random_weights(rng, swiftkv=(2, 2))
    for k in [k for k in w if "k_proj_swiftkv" in k][:1]:
        del w[k]
    d = write_model(tmp_path / "no_swiftkv", w, swiftkv=(2, 2))
    assert one_error_line(run_cli(d), "k_proj_swiftkv.weight' is missing")
    good = write_model(tmp_path / "good", random_weights(rng, swiftkv=(2, 2)), swiftkv=(2, 2))
    assert run_cli(good).returncode == 0
    assert one_error_line(run_cli(good, "--swiftkv-layers", "3"), "distilled for --swiftkv-layers 2")
    plain = write_model(tmp_path / "plain", random_weights(rng))
    assert one_error_line(run_cli(plain, "--swiftkv-layers", "2", "--swiftkv-group", "3"),
                          "does not divide")
    assert one_error_line(run_cli(plain, "--swiftkv-layers", "7"), "outside [1, 6]")
    no_qkv = write_model(tmp_path / "no_qkv", random_weights(rng, swiftkv=(2, 1), upper_qkv=False),
                         swiftkv=(2, 1))
    res = subprocess.run([str(SIFT), "-m", str(no_qkv), "-p", "hi", "-n", "2"], errors="replace",
                         capture_output=True,
                         text=True, env=ENV, timeout=300)
    assert one_error_line(res, "no q/k/v projections")


@pytest.mark.skipif(not SIFT.exists(), reason="sift not built")
def test_measured_kv_and_rows(tmp_path):
    """KV bytes: layers l..L-1 keep one cache per group (AcrossKV saves (L-l)(1-1/G)/L); prefill
    rows: n prompt rows through l layers, then only the last row through L - l."""
    l, G, text = 2, 2, "twenty byte prompt!!"
    d = write_model(tmp_path / "ckpt", random_weights(np.random.default_rng(5), swiftkv=(l, G)),
                    swiftkv=(l, G))
    res = subprocess.run([str(SIFT), "-m", str(d), "-p", text, "-n", "3", "--temp", "0", "--json",
                          "-q", "--strategy", "full,swiftkv"], capture_output=True, text=True,
                         errors="replace", env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    runs = {j["strategy"]: j for j in map(json.loads, res.stdout.splitlines())}
    n = runs["full"]["timings"]["prompt_n"]
    assert n == len(text)
    assert runs["swiftkv"]["kv_bytes"] * L == runs["full"]["kv_bytes"] * (L - (L - l) * (G - 1) // G)
    assert runs["swiftkv"]["rows_pct_of_full"] == pytest.approx(100 * (n * l + L - l) / (n * L), abs=0.05)

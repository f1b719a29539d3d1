#!/usr/bin/env python3
"""bench/torch_peer.py — the PyTorch peer for `sift bench --device cuda` (issue: sift's TTFT and
TPOT against PyTorch's on the same shapes, in the same device call).

A Llama forward pass written directly in PyTorch: random bf16 weights of a named shape (the
shapes of weights/synthetic.c), torch.matmul for every linear layer (separate q, k, v, gate, up
as sift runs them), RMSNorm, RoPE, scaled_dot_product_attention (causal for the prefill, the
preallocated cache for each decode step), greedy argmax on the device. Times, per context:
TTFT = prefill of the whole prompt plus the first token's logits; TPOT = the mean of the decode
steps after it, two ways: the step captured once as a CUDA graph and replayed (positions and the
token on the device, attention over the whole preallocated cache under a mask: the launch gaps of
a Python loop gone, as sift's graphs remove its own), and eager after warm-up steps (what a plain
PyTorch loop gives). Prints a markdown table and, with --json, one JSON object per context.

usage: python bench/torch_peer.py [--shape llama-3.1-8b] [--ctx 8192,32768] [-n 32] [--json]
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {  # d_model, n_layer, heads, kv_heads, head_dim, d_ff, vocab, rope_theta
    "llama-3.2-1b": (2048, 16, 32, 8, 64, 8192, 128256, 500000.0),
    "llama-3.1-8b": (4096, 32, 32, 8, 128, 14336, 128256, 500000.0),
}


def make_weights(shape, dev):
    d, L, H, KV, hd, ff, vocab, _ = shape
    g = torch.Generator(device=dev).manual_seed(1)

    def w(o, i):
        return (torch.randn(o, i, device=dev, generator=g, dtype=torch.float32) / math.sqrt(i)).to(torch.bfloat16)

    layers = [dict(norm1=torch.ones(d, device=dev, dtype=torch.bfloat16), wq=w(H * hd, d),
                   wk=w(KV * hd, d), wv=w(KV * hd, d), wo=w(d, H * hd),
                   norm2=torch.ones(d, device=dev, dtype=torch.bfloat16), wg=w(ff, d), wu=w(ff, d),
                   wd=w(d, ff)) for _ in range(L)]
    emb = w(vocab, d)
    return dict(layers=layers, emb=emb, norm=torch.ones(d, device=dev, dtype=torch.bfloat16), head=emb)


def rmsnorm(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_tables(hd, theta, n, dev):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float64) / hd))
    ang = torch.arange(n, device=dev, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope(x, cos, sin):   # x (n, heads, hd), pairs (2j, 2j + 1) as GGUF Llama
    xf = x.float().view(*x.shape[:-1], -1, 2)
    a, b = xf[..., 0], xf[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2).to(x.dtype)


class Model:
    def __init__(self, shape, cap, dev):
        self.shape, self.dev = shape, dev
        d, L, H, KV, hd, ff, vocab, theta = shape
        self.w = make_weights(shape, dev)
        self.cos, self.sin = rope_tables(hd, theta, cap, dev)
        self.k = torch.zeros(L, KV, cap, hd, device=dev, dtype=torch.bfloat16)
        self.v = torch.zeros_like(self.k)
        self.len = 0

    @torch.inference_mode()
    def forward(self, ids):
        d, L, H, KV, hd, ff, vocab, _ = self.shape
        n, p0 = ids.shape[0], self.len
        cos, sin = self.cos[p0:p0 + n], self.sin[p0:p0 + n]
        x = self.w["emb"][ids]
        for l, w in enumerate(self.w["layers"]):
            h = rmsnorm(x, w["norm1"])
            q = rope(torch.matmul(h, w["wq"].t()).view(n, H, hd), cos, sin)
            k = rope(torch.matmul(h, w["wk"].t()).view(n, KV, hd), cos, sin)
            v = torch.matmul(h, w["wv"].t()).view(n, KV, hd)
            self.k[l, :, p0:p0 + n] = k.transpose(0, 1)
            self.v[l, :, p0:p0 + n] = v.transpose(0, 1)
            K, V = self.k[l, :, :p0 + n], self.v[l, :, :p0 + n]
            o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], K[None], V[None],
                                               is_causal=n > 1 and p0 == 0, enable_gqa=True)
            x = x + torch.matmul(o[0].transpose(0, 1).reshape(n, H * hd), w["wo"].t())
            h = rmsnorm(x, w["norm2"])
            x = x + torch.matmul(F.silu(torch.matmul(h, w["wg"].t())) * torch.matmul(h, w["wu"].t()),
                                 w["wd"].t())
        self.len += n
        last = rmsnorm(x[-1:], self.w["norm"])
        return torch.matmul(last, self.w["head"].t()).float().argmax(-1)

    @torch.inference_mode()
    def step(self, tok, pos):
        """One decode step with every shape fixed (capturable): token tok (1,) at position pos (1,)
        (device tensors), attention over the whole cache with keys after pos masked; writes the
        next token into tok and advances pos."""
        d, L, H, KV, hd, ff, vocab, _ = self.shape
        cap = self.k.shape[2]
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        mask = (torch.arange(cap, device=pos.device) <= pos)[None, None, None, :]
        x = self.w["emb"][tok]
        for l, w in enumerate(self.w["layers"]):
            h = rmsnorm(x, w["norm1"])
            q = rope(torch.matmul(h, w["wq"].t()).view(1, H, hd), cos, sin)
            k = rope(torch.matmul(h, w["wk"].t()).view(1, KV, hd), cos, sin)
            v = torch.matmul(h, w["wv"].t()).view(1, KV, hd)
            self.k[l].index_copy_(1, pos, k.transpose(0, 1))
            self.v[l].index_copy_(1, pos, v.transpose(0, 1))
            o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], self.k[l][None], self.v[l][None],
                                               attn_mask=mask, enable_gqa=True)
            x = x + torch.matmul(o[0].transpose(0, 1).reshape(1, H * hd), w["wo"].t())
            h = rmsnorm(x, w["norm2"])
            x = x + torch.matmul(F.silu(torch.matmul(h, w["wg"].t())) * torch.matmul(h, w["wu"].t()),
                                 w["wd"].t())
        last = rmsnorm(x, self.w["norm"])
        tok.copy_(torch.matmul(last, self.w["head"].t()).float().argmax(-1))
        pos.add_(1)


def run(shape_name, ctx, n_gen, dev):
    shape = SHAPES[shape_name]
    m = Model(shape, ctx + n_gen, dev)
    ids = torch.randint(0, shape[6], (ctx,), device=dev)
    m.forward(ids[:256])   # warm-up: kernels, cuBLAS handles, allocator
    m.len = 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tok = m.forward(ids)
    torch.cuda.synchronize()
    ttft = time.perf_counter() - t0
    # eager decode: three warm-up steps (kernels of the one-row shapes), then n_gen - 1 timed
    for _ in range(3):
        m.forward(tok)
    m.len = ctx
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    for _ in range(n_gen - 1):
        tok = m.forward(tok)
    torch.cuda.synchronize()
    tpot_eager = (time.perf_counter() - t1) / max(n_gen - 1, 1)
    # graph decode: warm up on a side stream, capture one step, replay it from position ctx
    try:
        stok, spos = tok.clone().view(1), torch.tensor([ctx], device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                m.step(stok, spos)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            m.step(stok, spos)
        spos.fill_(ctx)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        for _ in range(n_gen - 1):
            graph.replay()
        torch.cuda.synchronize()
        tpot = (time.perf_counter() - t2) / max(n_gen - 1, 1)
    except Exception as e:   # report the eager number alone rather than nothing
        print(f"torch_peer: graph decode failed at ctx {ctx}: {e}", file=sys.stderr)
        tpot = float("nan")
    del m
    torch.cuda.empty_cache()
    return dict(peer="pytorch " + torch.__version__, shape=shape_name, ctx=ctx, ttft_s=ttft,
                tpot_ms=tpot * 1e3, tpot_eager_ms=tpot_eager * 1e3, prefill_tok_s=ctx / ttft,
                decode_tok_s=1.0 / tpot,
                device=torch.cuda.get_device_name(0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--ctx", default="8192,32768")
    ap.add_argument("-n", type=int, default=32, help="tokens generated per context")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_peer: no CUDA device visible to PyTorch")
    rows = [run(a.shape, int(c), a.n, "cuda") for c in a.ctx.split(",")]
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return
    print("| peer | shape | ctx | TTFT s | prefill tok/s | TPOT ms (graph) | decode tok/s | TPOT ms (eager) |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['peer']} | {r['shape']} | {r['ctx']} | {r['ttft_s']:.3f} | {r['prefill_tok_s']:.0f} | "
              f"{r['tpot_ms']:.2f} | {r['decode_tok_s']:.1f} | {r['tpot_eager_ms']:.2f} |")


if __name__ == "__main__":
    main()

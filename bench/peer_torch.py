#!/usr/bin/env python3
"""bench/peer_torch.py — the PyTorch peer of bench_base_cuda: the same Llama-3-8B steps on the
same GPU with the kernels vLLM and SGLang build on, and the join of both runs' points.

    python3 bench/peer_torch.py [--quick] [--steps N] [--max-seconds S] [--output-file F]
    python3 bench/peer_torch.py --join OURS.jsonl PEER.jsonl

The model: Llama-3-8B's shapes (hidden 4096, 32 layers, 32 heads of 128, 8 KV heads, MLP 14336,
vocab 128256, untied lm_head), random bf16 weights, written out here layer by layer (no
transformers): the embedding gather, RMSNorm (F.rms_norm where torch has it), q/k/v as one stacked GEMM
and gate/up as another (as vLLM stacks them), RoPE with Llama-3.1's frequency scaling, SiLU·mul,
o and down GEMMs with the residual adds, the final norm, lm_head on the rows that sample, greedy
argmax. GEMMs are F.linear (cuBLAS); RoPE, SiLU·mul and the adds are PyTorch's own elementwise
kernels, unfused as HF runs them (vLLM and SGLang fuse some of them).

Points, as bench_base_cuda's:
- decode: batch B x cached context C, one token per sequence; the KV cache is contiguous,
  (B, 8, C + 1, 128) per layer for K and V; the step writes the new K/V at position C and
  attends the C + 1 positions with F.scaled_dot_product_attention, each KV head's 4 query heads
  as 4 query rows (exact GQA without copying K/V), or flash_attn_with_kvcache when flash_attn is
  installed. The whole step, argmax included, is captured once in a CUDA graph
  (torch.cuda.CUDAGraph) and replayed: median of STEPS replays after WARM, timed with CUDA
  events. A replay reruns position C (a graph's shapes are fixed), so every step attends C + 1.
- prefill: a prompt of P tokens in one step, causal SDPA (enable_gqa where the flash kernel
  takes it, else K/V expanded to 32 heads), K/V written to a cache, lm_head and argmax on the
  last token; not graphed (its launches are few against its work); median of 5 after 1.
  SDPA never falls back to its math kernel here (it would materialise P x P scores).
There is no chunked-prefill or LoRA point: PyTorch has no paged mixed step or multi-LoRA
kernel of its own.

Every point is skipped, saying so, when its KV cache does not fit the free memory, when it runs
out of memory, or when --max-seconds (default 240) have passed. Before the points, the peer
checks its attention against an expanded-head reference and a graph replay against the eager
step, and stops (exit 1) when they differ.

--output-file gets one JSON object a line as each point ends, with bench_base_cuda's keys (impl
"torch"; bw_gbs and tflops as measured here). --join prints each point as "ours / peer / floor"
with the ratios, then the targets of docs/benchmarks.md's base-path section.
"""
import argparse
import json
import math
import statistics
import sys
import time

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 32, 8, 128, 128256
EPS, THETA = 1e-5, 500000.0
ROPE = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max=8192)

BATCHES, CTXS, PROMPTS = [1, 2, 4, 8, 32, 64, 128, 256], [128, 1024, 4096, 16384], [512, 2048, 8192]
QUICK_BATCHES, QUICK_CTXS, QUICK_PROMPTS = [1, 64, 256], [128, 4096], [2048]
WARM, PREFILL_RUNS = 3, 5
MARGIN = 4 << 30  # memory a point leaves beside its KV cache: activations, logits, the graph pool


def log(t0, msg):
    print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", flush=True)


class Peer:
    def __init__(self, torch, attn):
        import torch.nn.functional as F
        self.torch, self.F, self.attn = torch, F, attn
        dev, bf = "cuda", torch.bfloat16
        self.dev, self.bf = dev, bf
        qkv = (HEADS + 2 * KV_HEADS) * HEAD_DIM

        def w(out, inp):  # U(-1, 1)·1.7/sqrt(in), as the engine's dummy weights
            return torch.empty(out, inp, dtype=bf, device=dev).uniform_(-1, 1).mul_(1.7 / math.sqrt(inp))

        def norm():
            return torch.empty(HIDDEN, dtype=bf, device=dev).uniform_(0.9, 1.1)

        self.embed = torch.empty(VOCAB, HIDDEN, dtype=bf, device=dev).uniform_(-1, 1)
        self.layers = [dict(ln1=norm(), wqkv=w(qkv, HIDDEN), wo=w(HIDDEN, HEADS * HEAD_DIM),
                            ln2=norm(), wgu=w(2 * INTER, HIDDEN), wdown=w(HIDDEN, INTER))
                       for _ in range(LAYERS)]
        self.lnf, self.lm_head = norm(), w(VOCAB, HIDDEN)
        self.inv_freq = self._inv_freq()

    def _inv_freq(self):
        # Llama-3.1's rope_scaling (rope_type llama3), as HF's _compute_llama3_parameters
        torch = self.torch
        inv = 1.0 / (THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
        f, lo, hi, orig = ROPE["factor"], ROPE["low_freq_factor"], ROPE["high_freq_factor"], ROPE["original_max"]
        wavelen = 2 * math.pi / inv
        smooth = (orig / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > orig / lo, inv / f, inv)
        mid = (wavelen <= orig / lo) & (wavelen >= orig / hi)
        return torch.where(mid, (1 - smooth) * inv / f + smooth * inv, scaled).to(self.dev)

    def rope(self, pos):
        # pos (T,) int positions -> cos, sin (T, 1, HEAD_DIM) fp32, halves repeated as HF's
        freqs = pos.float()[:, None] * self.inv_freq[None, :]
        emb = self.torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None, :], emb.sin()[:, None, :]

    def rms(self, x, wt):
        # x (T, HIDDEN) bf16; one fused kernel where this torch has it
        if hasattr(self.F, "rms_norm"):
            return self.F.rms_norm(x, (HIDDEN,), wt, EPS)
        xf = x.float()
        return wt * (xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(self.bf)

    def rotate(self, x, cos, sin):
        # x (T, heads, HEAD_DIM) bf16; cos, sin (T, 1, HEAD_DIM)
        h = HEAD_DIM // 2
        rot = self.torch.cat((-x[..., h:], x[..., :h]), dim=-1)
        return (x.float() * cos + rot.float() * sin).to(self.bf)

    def forward_layers(self, x, cos, sin, attend):
        # x (T, HIDDEN) -> (T, HIDDEN) through every layer; attend(l, q (T, HEADS, HEAD_DIM), k, v (T, KV_HEADS, HEAD_DIM)) -> (T, HEADS * HEAD_DIM)
        F = self.F
        T = x.shape[0]
        for l, p in enumerate(self.layers):
            qkv = F.linear(self.rms(x, p["ln1"]), p["wqkv"])
            q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
            q = self.rotate(q.view(T, HEADS, HEAD_DIM), cos, sin)
            k = self.rotate(k.view(T, KV_HEADS, HEAD_DIM), cos, sin)
            x = x + F.linear(attend(l, q, k, v.view(T, KV_HEADS, HEAD_DIM)), p["wo"])
            g, u = F.linear(self.rms(x, p["ln2"]), p["wgu"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(g) * u, p["wdown"])
        return x

    def logits(self, x):
        # x (R, HIDDEN) -> logits (R, VOCAB) fp32
        return self.F.linear(self.rms(x, self.lnf), self.lm_head).float()

    # ---- decode: a cache of C + 1 positions a sequence, the new token at position C
    def decode_cache(self, batch, ctx):
        torch = self.torch
        shape = (batch, ctx + 1, KV_HEADS, HEAD_DIM) if self.attn == "flash_attn" else \
                (batch, KV_HEADS, ctx + 1, HEAD_DIM)
        return [(torch.zeros(shape, dtype=self.bf, device=self.dev),
                 torch.zeros(shape, dtype=self.bf, device=self.dev)) for _ in range(LAYERS)]

    def decode_attend(self, q, k, v, kc, vc, ctx):
        # q (B, HEADS, HEAD_DIM), k and v (B, KV_HEADS, HEAD_DIM) of position ctx, written into
        # kc and vc (decode_cache's) -> attention over positions 0..ctx, (B, HEADS * HEAD_DIM)
        B = q.shape[0]
        if self.attn == "flash_attn":
            from flash_attn import flash_attn_with_kvcache
            o = flash_attn_with_kvcache(q[:, None], kc, vc, k=k[:, None], v=v[:, None],
                                        cache_seqlens=self.seqlens[:B])
            return o.reshape(B, HEADS * HEAD_DIM)
        kc[:, :, ctx] = k
        vc[:, :, ctx] = v
        # query head h reads KV head h // 4 (HF's repeat_kv): each KV head's 4 queries as rows
        o = self.F.scaled_dot_product_attention(q.view(B, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM), kc, vc)
        return o.reshape(B, HEADS * HEAD_DIM)

    def decode_step(self, tok, cache, ctx, cos, sin):
        # tok (B,) int64, in place: the step's tokens, then its greedy samples; -> logits (B, VOCAB)
        def attend(l, q, k, v):
            return self.decode_attend(q, k, v, cache[l][0], cache[l][1], ctx)

        logits = self.logits(self.forward_layers(self.embed[tok], cos, sin, attend))
        tok.copy_(logits.argmax(-1))
        return logits

    def decode_setup(self, batch, ctx):
        torch = self.torch
        cache = self.decode_cache(batch, ctx)
        tok = (torch.arange(batch, device=self.dev, dtype=torch.int64) + 1) * 2654435761 % VOCAB
        cos, sin = self.rope(torch.full((batch,), ctx, device=self.dev))
        self.seqlens = torch.full((batch,), ctx, dtype=torch.int32, device=self.dev)
        return cache, tok, cos, sin

    def decode_graph(self, batch, ctx):
        torch = self.torch
        cache, tok, cos, sin = self.decode_setup(batch, ctx)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self.decode_step(tok, cache, ctx, cos, sin)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            logits = self.decode_step(tok, cache, ctx, cos, sin)
        return g, tok, cache, logits

    # ---- prefill: the whole prompt in one step
    def prefill_step(self, tok, cache, cos, sin):
        # tok (P,) int64; cache: per layer (K, V), each (1, KV_HEADS, P, HEAD_DIM)
        F, torch = self.F, self.torch
        P = tok.shape[0]

        def attend(l, q, k, v):
            kc, vc = cache[l]
            kc[0].copy_(k.transpose(0, 1))
            vc[0].copy_(v.transpose(0, 1))
            qh = q.transpose(0, 1)[None]  # (1, HEADS, P, HEAD_DIM)
            if self.gqa:
                o = F.scaled_dot_product_attention(qh, kc, vc, is_causal=True, enable_gqa=True)
            else:
                rep = HEADS // KV_HEADS
                o = F.scaled_dot_product_attention(qh, kc.repeat_interleave(rep, 1),
                                                   vc.repeat_interleave(rep, 1), is_causal=True)
            return o[0].transpose(0, 1).reshape(P, HEADS * HEAD_DIM)

        x = self.forward_layers(self.embed[tok], cos, sin, attend)
        return self.logits(x[-1:]).argmax(-1)


def fast_sdpa(torch):
    # the SDPA kernels that do not materialise the scores; the math one is never taken
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                        SDPBackend.EFFICIENT_ATTENTION])


def self_check(torch, peer, t0):
    """The decode and prefill attention against an expanded-head fp32 reference, and a graph
    replay against the eager step; exits 1 when any differs. Sets peer.gqa: whether the
    flash kernel takes enable_gqa for prefill."""
    F = torch.nn.functional
    bf, rep = torch.bfloat16, HEADS // KV_HEADS
    g = torch.Generator(device="cuda").manual_seed(1)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", dtype=bf, generator=g)

    def ref(q, k, v, causal):
        # q (1|B, HEADS, T, HEAD_DIM); k, v (B, KV_HEADS, L, HEAD_DIM)
        return F.scaled_dot_product_attention(q.float(), k.repeat_interleave(rep, 1).float(),
                                              v.repeat_interleave(rep, 1).float(), is_causal=causal)

    B, C, P = 3, 37, 45
    q, k, v = rnd(B, HEADS, HEAD_DIM), rnd(B, KV_HEADS, HEAD_DIM), rnd(B, KV_HEADS, HEAD_DIM)
    peer.decode_setup(B, C)  # the cache lengths flash_attn reads
    kc, vc = peer.decode_cache(B, C)[0]
    past_k, past_v = rnd(B, KV_HEADS, C, HEAD_DIM), rnd(B, KV_HEADS, C, HEAD_DIM)
    if peer.attn == "flash_attn":
        kc[:, :C].copy_(past_k.transpose(1, 2))
        vc[:, :C].copy_(past_v.transpose(1, 2))
    else:
        kc[:, :, :C].copy_(past_k)
        vc[:, :, :C].copy_(past_v)
    want = ref(q[:, :, None], torch.cat((past_k, k[:, :, None]), 2), torch.cat((past_v, v[:, :, None]), 2),
               False)[:, :, 0].reshape(B, HEADS * HEAD_DIM)
    with fast_sdpa(torch):
        got = peer.decode_attend(q, k, v, kc, vc, C)
    err_d = (got.float() - want).abs().max().item()

    qp, kp, vp = rnd(1, HEADS, P, HEAD_DIM), rnd(1, KV_HEADS, P, HEAD_DIM), rnd(1, KV_HEADS, P, HEAD_DIM)
    try:
        with fast_sdpa(torch):
            gotp = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
        peer.gqa = True
    except (RuntimeError, TypeError):
        peer.gqa = False
        with fast_sdpa(torch):
            gotp = F.scaled_dot_product_attention(qp, kp.repeat_interleave(rep, 1),
                                                  vp.repeat_interleave(rep, 1), is_causal=True)
    err_p = (gotp.float() - ref(qp, kp, vp, True)).abs().max().item()

    # a graph replay against the eager step at a small point, on fresh caches and the same tokens
    with torch.inference_mode(), fast_sdpa(torch):
        cache, tok, cos, sin = peer.decode_setup(4, 64)
        first = tok.clone()
        eager = peer.decode_step(tok, cache, 64, cos, sin).clone()
        gr, gtok, _, glogits = peer.decode_graph(4, 64)
        gtok.copy_(first)
        gr.replay()
        torch.cuda.synchronize()
        err_g = ((glogits - eager).abs().max() / eager.abs().max()).item()
        del gr, cache
    log(t0, f"self-check: decode attention ({peer.attn}) max |diff| {err_d:.2e}, prefill attention "
            f"{err_p:.2e} ({'enable_gqa' if peer.gqa else 'K/V expanded'}); graph replay against the "
            f"eager step: max |diff| / max |logit| {err_g:.2e}")
    if not (err_d < 2e-2 and err_p < 2e-2 and err_g < 1e-2):
        print("peer_torch: self-check failed (bounds 2e-2, 2e-2, 1e-2)", file=sys.stderr)
        sys.exit(1)


def measure(torch):
    """Copy bandwidth (GB/s, bytes read + written of a 2 GiB copy, best of 8) and bf16
    tensor-core rate (TFLOP/s, 8192^3 matmul on random data, best of 6 after 2), as
    bench_base_cuda measures them."""
    a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda").fill_(1)
    b = torch.empty_like(a)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = 1e30
    for _ in range(8):
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1))
    bw = 2 * a.numel() / (best * 1e-3) / 1e9
    del a, b
    n = 8192
    x = torch.empty(n, n, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
    y = torch.empty_like(x).uniform_(-1, 1)
    times = []
    for _ in range(8):
        e0.record()
        for _ in range(5):
            x @ y
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return bw, 5 * 2 * n ** 3 / (min(times[2:]) * 1e-3) / 1e12


def run(args):
    t0 = time.perf_counter()
    import torch
    if not torch.cuda.is_available():
        print("peer_torch: no CUDA device", file=sys.stderr)
        sys.exit(1)
    card = torch.cuda.get_device_name()
    attn = "sdpa"
    try:
        import flash_attn  # noqa: F401
        attn = "flash_attn"
    except ImportError:
        pass
    bw, tflops = measure(torch)
    log(t0, f"{card}: torch {torch.__version__}, attention {attn}; copy bandwidth {bw:.0f} GB/s, "
            f"bf16 matmul {tflops:.0f} TFLOP/s")
    with torch.inference_mode():
        peer = Peer(torch, attn)
    torch.cuda.synchronize()
    log(t0, "Llama-3-8B shapes, random bf16 weights on the GPU")
    with torch.inference_mode():
        self_check(torch, peer, t0)
    steps = args.steps or (10 if args.quick else 20)
    batches, ctxs, prompts = (QUICK_BATCHES, QUICK_CTXS, QUICK_PROMPTS) if args.quick else (BATCHES, CTXS, PROMPTS)
    kv_pos = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2  # bytes of one position's K and V, bf16
    failed = []
    out = open(args.output_file, "w") if args.output_file else None
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def point(section, batch, ctx, prompt, need, fn):
        rec = dict(impl="torch", card=card, section=section, batch=batch, ctx=ctx, prompt=prompt,
                   adapters=0)
        free = torch.cuda.mem_get_info()[0]
        why = None
        if time.perf_counter() - t0 > args.max_seconds:
            why = f"past --max-seconds {args.max_seconds:.0f}"
        elif need + MARGIN > free:
            why = f"KV cache {need / 1e9:.1f} GB + {MARGIN / 1e9:.0f} GB margin > {free / 1e9:.1f} GB free"
        else:
            if args.settle > 0:  # as bench_base_cuda --settle: the GPU idle before the point
                torch.cuda.synchronize()
                time.sleep(args.settle)
            try:
                with torch.inference_mode(), fast_sdpa(torch):
                    ms, tokens = fn()
                rec.update(step_ms=round(ms, 4), tok_s=round(tokens / ms * 1e3, 1), bw_gbs=round(bw, 1),
                           tflops=round(tflops, 1), attn=attn + ("" if section == "decode" or peer.gqa else ", K/V expanded"))
                log(t0, f"{section} batch {batch} ctx {ctx} prompt {prompt}: {ms:.3f} ms")
            except torch.cuda.OutOfMemoryError:
                why = "out of memory"
            except RuntimeError as e:  # a kernel refused the shape: said, and the run fails
                why = f"error: {str(e).splitlines()[0][:200]}"
                failed.append(why)
        torch.cuda.empty_cache()
        if why:
            rec["skipped"] = why
            log(t0, f"{section} batch {batch} ctx {ctx} prompt {prompt}: skipped ({why})")
        if out:  # a line as each point ends, so a run cut short keeps what it finished
            out.write(json.dumps(rec) + "\n")
            out.flush()

    def timed(fn, warm, runs):
        t = []
        for i in range(warm + runs):
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            t.append(e0.elapsed_time(e1))
        return statistics.median(t[warm:])

    def decode(batch, ctx):
        g, tok, cache, logits = peer.decode_graph(batch, ctx)
        ms = timed(g.replay, WARM, steps)
        del g, tok, cache, logits
        return ms, batch

    def prefill(prompt):
        cache = [(torch.zeros(1, KV_HEADS, prompt, HEAD_DIM, dtype=torch.bfloat16, device="cuda"),
                  torch.zeros(1, KV_HEADS, prompt, HEAD_DIM, dtype=torch.bfloat16, device="cuda"))
                 for _ in range(LAYERS)]
        tok = torch.arange(prompt, device="cuda", dtype=torch.int64) * 2246822519 % VOCAB
        cos, sin = peer.rope(torch.arange(prompt, device="cuda"))
        ms = timed(lambda: peer.prefill_step(tok, cache, cos, sin), 1, PREFILL_RUNS)
        del cache
        return ms, prompt

    # as bench_base_cuda: prefill first, the decode grid last, so --max-seconds cuts its largest points
    for prompt in prompts:
        point("prefill", 1, 0, prompt, prompt * kv_pos, lambda: prefill(prompt))
    for ctx in ctxs:
        for batch in batches:
            point("decode", batch, ctx, 0, batch * (ctx + 1) * kv_pos, lambda: decode(batch, ctx))
    if out:
        out.close()
    log(t0, "done" + (f"; {len(failed)} point(s) failed" if failed else ""))
    if failed:
        sys.exit(1)


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def join(ours_path, peer_path):
    """Each point of either run as ours / peer / floor, then the targets. Exit 0 whatever they
    say: they are results."""
    key = lambda r: (r["section"], r["batch"], r["ctx"], r["prompt"], r.get("adapters", 0))
    ours, peer = load(ours_path), load(peer_path)
    by_peer = {key(r): r for r in peer}
    cards = {r["card"] for r in ours + peer}
    print(f"cards: {', '.join(sorted(cards))}" + ("  (NOT THE SAME CARD: do not compare)" if len(cards) > 1 else ""))
    for r in ours[:1]:
        print(f"floors from bench_base_cuda's run: copy bandwidth {r.get('bw_gbs', '?')} GB/s, "
              f"bf16 tensor-core rate {r.get('tflops', '?')} TFLOP/s")
    print(f"{'point':<44} {'ours ms':>9} {'peer ms':>9} {'floor ms':>9} {'bound':<5} "
          f"{'ours/peer':>9} {'ours/floor':>10} {'peer/floor':>10}")

    def fmt(x, spec):
        return format(x, spec) if x is not None else "-".rjust(int(spec.split(".")[0]))

    ours_keys = {key(o) for o in ours}
    for r in ours + [p for p in peer if key(p) not in ours_keys]:
        k = key(r)
        o = r if r["impl"] != "torch" else None
        p = by_peer.get(k)
        name = f"{k[0]} b={k[1]} ctx={k[2]} prompt={k[3]}" + (f" adapters={k[4]}" if k[4] else "")
        om = o.get("step_ms") if o else None
        pm = p.get("step_ms") if p else None
        fl = o.get("floor_ms") if o else None
        line = (f"{name:<44} {fmt(om, '9.3f')} {fmt(pm, '9.3f')} {fmt(fl, '9.3f')} "
                f"{(o or {}).get('bound', '-'):<5} {fmt(om / pm if om and pm else None, '9.3f')} "
                f"{fmt(om / fl if om and fl else None, '10.3f')} {fmt(pm / fl if pm and fl else None, '10.3f')}")
        notes = [f"{who} skipped: {x['skipped']}" for who, x in (("ours", o), ("peer", p)) if x and "skipped" in x]
        if o and "decode_ratio" in o:
            notes.append(f"decode ratio {o['decode_ratio']:.3f}")
        if o and "apart" in o:
            notes.append(f"decodes alone {o['decode_ms']:.3f} ms, chunk alone {o['chunk_ms']:.3f} ms, "
                         f"mixed/apart {o['apart']:.3f}")
        print(line + ("  (" + "; ".join(notes) + ")" if notes else ""))
    print("\ntargets (docs/benchmarks.md, the base path):")
    run_o = [r for r in ours if "step_ms" in r]
    dec = [r for r in run_o if r["section"] == "decode" and not r.get("adapters")]

    def verdict(name, rows, ok, show):
        if not rows:
            print(f"  {name}: no points")
            return
        bad = [r for r in rows if not ok(r)]
        print(f"  {name}: {len(rows) - len(bad)} of {len(rows)} met" +
              (f"; not: {', '.join(show(r) for r in bad)}" if bad else ""))

    def pt(r):
        return f"b={r['batch']} ctx={r['ctx']}" if r["section"] != "prefill" else f"prompt={r['prompt']}"

    verdict("decode <= 1.15x floor, batch 1-64, ctx <= 4K",
            [r for r in dec if r["batch"] <= 64 and r["ctx"] <= 4096], lambda r: r["x_floor"] <= 1.15,
            lambda r: f"{pt(r)} {r['x_floor']:.2f}x")
    verdict("decode <= 1.2x floor at 16K", [r for r in dec if r["ctx"] >= 16384],
            lambda r: r["x_floor"] <= 1.2, lambda r: f"{pt(r)} {r['x_floor']:.2f}x")
    verdict("prefill >= 60% of the tensor-core rate at 2K",
            [r for r in run_o if r["section"] == "prefill" and r["prompt"] == 2048],
            lambda r: r["flops"] / (r["step_ms"] * 1e-3) / (r["tflops"] * 1e12) >= 0.6,
            lambda r: f"{pt(r)} {100 * r['flops'] / (r['step_ms'] * 1e-3) / (r['tflops'] * 1e12):.0f}%")
    verdict("decode ratio >= 0.95, 8 distinct adapters",
            [r for r in run_o if r.get("adapters")], lambda r: r["decode_ratio"] >= 0.95,
            lambda r: f"{pt(r)} {r['decode_ratio']:.3f}")
    both = [(r, by_peer[key(r)]) for r in run_o if "step_ms" in by_peer.get(key(r), {})]
    verdict("ahead of the PyTorch peer", both, lambda rp: rp[0]["step_ms"] < rp[1]["step_ms"],
            lambda rp: f"{rp[0]['section']} {pt(rp[0])} {rp[0]['step_ms'] / rp[1]['step_ms']:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="batch 1, 64, 256 x ctx 128, 4K; prompts of 2K; 10 steps")
    ap.add_argument("--steps", type=int, default=0, help="timed decode steps a point (default 20, --quick 10)")
    ap.add_argument("--max-seconds", type=float, default=240, help="skip the points left after this")
    ap.add_argument("--output-file", help="JSON lines, one a point")
    ap.add_argument("--settle", type=float, default=0,
                    help="seconds the GPU idles before each point (bench_base_cuda --settle)")
    ap.add_argument("--join", nargs=2, metavar=("OURS", "PEER"), help="join two runs' JSON lines")
    args = ap.parse_args()
    if args.join:
        join(*args.join)
    else:
        run(args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Independent check of tests/fixtures with plain Python (no torch, no numpy).

Re-implements the forward pass of the four fixture architectures from the
stored safetensors/config/adapter files (float64 math, PEFT scaling and
rank_pattern/alpha_pattern rules, trainable tokens, Llama-3.1 rope scaling, q/k
norm, qkv bias, tied embeddings, GQA) and compares every prompt position of the chosen rows
with reference.safetensors, plus hidden_row0 for row 0.  Also checks that the
first greedy token of every row is the argmax of last_logits.  It is slow (pure
Python): a few seconds per row.

    python3 tools/check_fixtures.py                 # all archs, every row
    python3 tools/check_fixtures.py llama 0 4       # one arch, some rows
"""
import json
import math
import os
import re
import struct
import sys


def load_st(p):
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        raw = data[a:b]
        dt = v["dtype"]
        if dt == "F32":
            arr = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        elif dt == "BF16":
            arr = list(struct.unpack(f"<{len(raw) // 2}f", b"".join(
                b"\x00\x00" + raw[i:i + 2] for i in range(0, len(raw), 2))))
        elif dt == "F16":
            arr = list(struct.unpack(f"<{len(raw) // 2}e", raw))
        elif dt == "I32":
            arr = list(struct.unpack(f"<{len(raw) // 4}i", raw))
        else:
            raise ValueError(dt)
        out[k] = (v["shape"], arr)
    return out


def mat(t):
    shp, a = t
    r, c = shp
    return [a[i * c:(i + 1) * c] for i in range(r)]


def mv(W, x):
    return [sum(w * xx for w, xx in zip(row, x)) for row in W]


def check_arch(arch, rows, root="tests/fixtures"):
    d = f"{root}/{arch}"
    ref = json.load(open(f"{d}/reference.json"))
    cfg = json.load(open(f"{d}/model/config.json"))
    W = {}
    for fn in sorted(os.listdir(f"{d}/model")):
        if fn.endswith(".safetensors"):
            W.update(load_st(f"{d}/model/{fn}"))
    R = load_st(f"{d}/reference.safetensors")
    H = cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps, theta, rs = cfg["rms_norm_eps"], cfg["rope_theta"], cfg.get("rope_scaling")
    inv = [1.0 / theta ** (2 * i / hd) for i in range(hd // 2)]
    if rs and rs.get("rope_type") == "llama3":
        f, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        o = []
        for x in inv:
            wl = 2 * math.pi / x
            if wl < old / hi:
                o.append(x)
            elif wl > old / lo:
                o.append(x / f)
            else:
                s = (old / wl - lo) / (hi - lo)
                o.append((1 - s) * x / f + s * x)
        inv = o

    def rms(x, w):
        r = 1 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
        return [v * r * ww for v, ww in zip(x, w)]

    def rope(v, pos):
        half = hd // 2
        out = [0.0] * hd
        for i in range(half):
            c, s = math.cos(pos * inv[i]), math.sin(pos * inv[i])
            out[i] = v[i] * c - v[i + half] * s
            out[i + half] = v[i + half] * c + v[i] * s
        return out

    M = {k: (mat(v) if len(v[0]) == 2 else v[1]) for k, v in W.items()}
    if cfg.get("tie_word_embeddings"):
        M["lm_head.weight"] = M["model.embed_tokens.weight"]

    def tokens_for(ac, t):
        """Trainable tokens: {module: {id: row}} for model.embed_tokens and lm_head, the rows
        replacing the base rows (a tied lm_head takes the embedding's unless named itself)."""
        tti = ac.get("trainable_token_indices")
        if not tti:
            return {}
        named = {"model.embed_tokens": tti} if isinstance(tti, list) else {
            ("lm_head" if k.endswith("lm_head") else "model.embed_tokens"): v for k, v in tti.items()}
        out = {}
        for mod, ids in named.items():
            rows = mat(t[f"base_model.model.{mod}.token_adapter.trainable_tokens_delta"])
            assert len(rows) == len(ids), (mod, len(rows), len(ids))
            out[mod] = dict(zip(ids, rows))
        if cfg.get("tie_word_embeddings") and "lm_head" not in out and "model.embed_tokens" in out:
            out["lm_head"] = out["model.embed_tokens"]
        return out

    def lora_for(adapter):
        if adapter is None:
            return {}
        ad = f"{d}/adapters/{adapter}"
        ac = json.load(open(f"{ad}/adapter_config.json"))
        t = load_st(f"{ad}/adapter_model.safetensors")
        out = {"__tokens__": tokens_for(ac, t)}
        for k in t:
            if ".lora_A." in k:
                mod = k[len("base_model.model."):-len(".lora_A.weight")]
            elif k.endswith(".lora_embedding_A"):  # the embedding: A (r, vocab), B (hidden, r)
                mod = k[len("base_model.model."):-len(".lora_embedding_A")]
            else:
                continue
            r, alpha = ac["r"], ac["lora_alpha"]
            for pk, pv in (ac.get("rank_pattern") or {}).items():
                if re.match(rf"(.*\.)?({pk})$", mod):
                    r = pv
                    break
            for pk, pv in (ac.get("alpha_pattern") or {}).items():
                if re.match(rf"(.*\.)?({pk})$", mod):
                    alpha = pv
                    break
            sc = alpha / math.sqrt(r) if ac.get("use_rslora") else alpha / r
            A, B = mat(t[k]), mat(t[k.replace("lora_A", "lora_B").replace("lora_embedding_A", "lora_embedding_B")])
            assert len(A) == r, (mod, len(A), r)
            want = ref["adapters"][adapter]["modules"][mod]
            assert want["r"] == r and abs(want["scaling"] - sc) < 1e-9, (mod, want, r, sc)
            out[mod] = (A, B, sc)
        assert set(out) - {"__tokens__"} == set(ref["adapters"][adapter]["modules"]), adapter
        want = ref["adapters"][adapter].get("token_modules", {})
        assert {m: sorted(r) for m, r in out["__tokens__"].items()} == {m: sorted(i) for m, i in want.items()}, adapter
        return out

    def lin(name, x, L):
        y = mv(M[name + ".weight"], x)
        for v, row in L.get("__tokens__", {}).get(name, {}).items():  # lm_head's own rows
            y[v] = sum(a * b for a, b in zip(row, x))
        if name + ".bias" in M:
            y = [a + b for a, b in zip(y, M[name + ".bias"])]
        if name in L:
            A, B, sc = L[name]
            y = [a + sc * b for a, b in zip(y, mv(B, mv(A, x)))]
        return y

    def forward(ids, adapter):
        L = lora_for(adapter)
        T = len(ids)
        own = L.get("__tokens__", {}).get("model.embed_tokens", {})
        xs = [list(own.get(t, M["model.embed_tokens.weight"][t])) for t in ids]
        if "model.embed_tokens" in L:  # delta = scaling · B · A[:, t]
            A, B, sc = L["model.embed_tokens"]
            xs = [[a + sc * b for a, b in zip(x, mv(B, [row[t] for row in A]))] for x, t in zip(xs, ids)]
        hid = [[list(x) for x in xs]]
        for li in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{li}."
            hn = [rms(x, M[p + "input_layernorm.weight"]) for x in xs]
            q = [lin(p + "self_attn.q_proj", h, L) for h in hn]
            k = [lin(p + "self_attn.k_proj", h, L) for h in hn]
            v = [lin(p + "self_attn.v_proj", h, L) for h in hn]
            qh = [[q[t][h * hd:(h + 1) * hd] for h in range(nh)] for t in range(T)]
            kh = [[k[t][h * hd:(h + 1) * hd] for h in range(nkv)] for t in range(T)]
            vh = [[v[t][h * hd:(h + 1) * hd] for h in range(nkv)] for t in range(T)]
            if p + "self_attn.q_norm.weight" in M:
                qh = [[rms(x, M[p + "self_attn.q_norm.weight"]) for x in r] for r in qh]
                kh = [[rms(x, M[p + "self_attn.k_norm.weight"]) for x in r] for r in kh]
            qh = [[rope(x, t) for x in qh[t]] for t in range(T)]
            kh = [[rope(x, t) for x in kh[t]] for t in range(T)]
            att = []
            for t in range(T):
                o = []
                for h in range(nh):
                    g = h // (nh // nkv)
                    sc = [sum(a * b for a, b in zip(qh[t][h], kh[s][g])) / math.sqrt(hd)
                          for s in range(t + 1)]
                    m = max(sc)
                    e = [math.exp(x - m) for x in sc]
                    z = sum(e)
                    o += [sum(e[s] / z * vh[s][g][i] for s in range(t + 1)) for i in range(hd)]
                att.append(o)
            xs = [[a + b for a, b in zip(x, lin(p + "self_attn.o_proj", o, L))] for x, o in zip(xs, att)]
            hn = [rms(x, M[p + "post_attention_layernorm.weight"]) for x in xs]
            mlp = []
            for h in hn:
                gg, uu = lin(p + "mlp.gate_proj", h, L), lin(p + "mlp.up_proj", h, L)
                mlp.append(lin(p + "mlp.down_proj", [a / (1 + math.exp(-a)) * b for a, b in zip(gg, uu)], L))
            xs = [[a + b for a, b in zip(x, m)] for x, m in zip(xs, mlp)]
            hid.append([list(x) for x in xs])
        fn = [rms(x, M["model.norm.weight"]) for x in xs]
        hid.append(fn)
        return [lin("lm_head", x, L) for x in fn], hid

    V, Lp = cfg["vocab_size"], ref["prompt_len"]
    al, ll, g = R["all_logits"][1], R["last_logits"][1], R["greedy_ids"][1]
    worst = 0.0
    for i, row in enumerate(ref["rows"]):
        seg = ll[i * V:(i + 1) * V]
        am = max(range(V), key=lambda j: seg[j])
        assert am == row["greedy_ids"][0] == g[i * ref["n_new"]], (arch, i)
    for row in rows if rows is not None else range(len(ref["rows"])):
        ids, ad = ref["rows"][row]["prompt_ids"], ref["rows"][row]["adapter"]
        logits, hid = forward(ids, ad)
        mx = max(abs(al[(row * Lp + t) * V + j] - logits[t][j]) for t in range(Lp) for j in range(V))
        worst = max(worst, mx)
        msg = f"{arch} row {row} ({ad}): max |reference - python| over all positions {mx:.2e}"
        if row == 0:
            hs = R["hidden_row0"][1]
            Hh = len(hid[0][0])
            mh = max(abs(hs[(i * Lp + t) * Hh + j] - hid[i][t][j])
                     for i in range(len(hid)) for t in range(Lp) for j in range(Hh))
            worst = max(worst, mh)
            msg += f"; hidden_row0 {mh:.2e}"
        print(msg, flush=True)
    return worst


def main():
    archs = ["llama", "qwen2", "qwen3", "mistral"]
    rows = None  # every row
    if len(sys.argv) > 1:
        archs = [sys.argv[1]]
        if len(sys.argv) > 2:
            rows = [int(x) for x in sys.argv[2:]]
    worst = max(check_arch(a, rows) for a in archs)
    print(f"worst abs diff {worst:.2e}")
    sys.exit(0 if worst < 1e-4 else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reference parity fixtures for the loraserve C/CUDA engine.

For each architecture (Llama with Llama-3.1 rope scaling, Qwen2, Qwen3, Mistral)
this builds a tiny random model with a fixed seed, saves it in HF format, builds
3-4 PEFT LoRA adapters with randomized A and B, and records reference outputs
computed in fp32 math (no TF32, eager attention) from exactly the stored weights:

  tests/fixtures/<arch>/model/                 HF model (config.json, safetensors)
  tests/fixtures/<arch>/adapters/<name>/       PEFT adapter (adapter_config.json,
                                               adapter_model.safetensors)
  tests/fixtures/<arch>/reference.safetensors  f32 logits / hidden states
  tests/fixtures/<arch>/reference.json         prompts, adapters per row, greedy
                                               tokens, top-2 gaps, versions, notes

--mix and --added make references over an existing fixture, without rebuilding it:
mix.safetensors / mix.json (PEFT's add_weighted_adapter), and added.safetensors /
added.json with adapters/added_vocab (an adapter with added vocabulary: see ADDED).

Needs torch, transformers (5.x), peft, safetensors and a CUDA GPU (falls back
to CPU with a warning).  Run from the repository root:

    PYTHONUNBUFFERED=1 python3 tools/make_fixtures.py [--out tests/fixtures]
    PYTHONUNBUFFERED=1 python3 tools/make_fixtures.py --added      # llama: added vocabulary
"""

import argparse
import json
import math
import os
import shutil
import sys
import time

import torch

ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTN4 = ["q_proj", "k_proj", "v_proj", "o_proj"]

N_PROMPT = 12      # prompt length (all rows equal, no padding)
N_NEW = 16         # greedy continuation length

# ---------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------
ARCHS = {
    "llama": dict(
        cls="LlamaForCausalLM",
        seed=1001,
        save_dtype="bfloat16",
        shard=None,
        config=dict(
            vocab_size=384, hidden_size=64, intermediate_size=160,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0,
                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64},
            tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
            hidden_act="silu", bos_token_id=1, eos_token_id=2,
        ),
        adapters=[
            ("all_r8", dict(r=8, lora_alpha=16, target_modules=ALL7), None),
            ("attn_r4_bf16", dict(r=4, lora_alpha=8, target_modules=ATTN4), "bfloat16"),
            ("regex_r16_rslora",
             dict(r=16, lora_alpha=8, use_rslora=True,
                  target_modules=r".*\.layers\.[02]\.(self_attn\.(q_proj|v_proj)|mlp\.(up_proj|down_proj))"),
             None),
            ("patterns",
             dict(r=8, lora_alpha=16, target_modules=ALL7,
                  rank_pattern={"v_proj": 16, "layers.1.mlp.down_proj": 4},
                  alpha_pattern={"o_proj": 4, "gate_proj": 32}),
             None),
            # LoRA on the embedding (lora_embedding_A/B) and lm_head beside q, v; saved as
            # PEFT saves it by default (save_embedding_layers "auto": the base layers' copies too)
            ("embed_head",
             dict(r=8, lora_alpha=16, target_modules=["embed_tokens", "lm_head", "q_proj", "v_proj"],
                  rank_pattern={"embed_tokens": 4}, alpha_pattern={"lm_head": 4}),
             None),
            # trainable tokens (PEFT's TrainableTokensLayer beside LoRA): the adapter's own rows
            # of the embedding and of the untied lm_head, one id in both, stored in bf16 as a
            # bf16 training run saves them
            ("tokens",
             dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                  trainable_token_indices={"embed_tokens": [7, 60, 150, 301], "lm_head": [12, 60, 222]}),
             "bfloat16"),
        ],
    ),
    "qwen2": dict(
        cls="Qwen2ForCausalLM",
        seed=2002,
        save_dtype="float32",
        shard=None,
        config=dict(
            vocab_size=448, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, rms_norm_eps=1e-6,
            rope_theta=1000000.0, tie_word_embeddings=True,
            use_sliding_window=False, hidden_act="silu",
            bos_token_id=1, eos_token_id=2,
        ),
        adapters=[
            ("mlp_r16_rslora", dict(r=16, lora_alpha=16, use_rslora=True,
                                    target_modules=["gate_proj", "up_proj", "down_proj"]), None),
            ("attn_r8", dict(r=8, lora_alpha=32, target_modules=ATTN4), None),
            ("regex_r4", dict(r=4, lora_alpha=4,
                              target_modules=r".*\.layers\.1\.self_attn\.(q_proj|k_proj|o_proj)"), None),
            ("all_r8_patterns",
             dict(r=8, lora_alpha=8, target_modules=ALL7,
                  rank_pattern={"q_proj": 4, "layers.0.mlp.up_proj": 16},
                  alpha_pattern={"down_proj": 24}),
             None),
            # trainable tokens, the list form (the input embedding) on a tied model: PEFT ties
            # lm_head to the same rows
            ("tokens_tied", dict(r=8, lora_alpha=16, target_modules=ATTN4,
                                 trainable_token_indices=[9, 77, 300]), None),
        ],
    ),
    "qwen3": dict(
        cls="Qwen3ForCausalLM",
        seed=3003,
        save_dtype="bfloat16",
        shard="100KB",
        config=dict(
            vocab_size=512, hidden_size=64, intermediate_size=176,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6,
            rope_theta=1000000.0, tie_word_embeddings=False,
            attention_bias=False, use_sliding_window=False, hidden_act="silu",
            bos_token_id=1, eos_token_id=2,
        ),
        adapters=[
            ("all_r16", dict(r=16, lora_alpha=32, target_modules=ALL7), None),
            ("attn_r8_rslora_bf16", dict(r=8, lora_alpha=16, use_rslora=True,
                                         target_modules=ATTN4), "bfloat16"),
            ("regex_r4", dict(r=4, lora_alpha=16,
                              target_modules=r".*\.layers\.0\.(self_attn\.k_proj|mlp\.gate_proj)|.*\.layers\.1\.self_attn\.o_proj"), None),
            ("patterns",
             dict(r=8, lora_alpha=16, target_modules=ALL7,
                  rank_pattern={"o_proj": 4, "layers.1.mlp.gate_proj": 16},
                  alpha_pattern={"q_proj": 2, "layers.0.mlp.down_proj": 64}),
             None),
        ],
    ),
    "mistral": dict(
        cls="MistralForCausalLM",
        seed=4004,
        save_dtype="float16",
        shard=None,
        config=dict(
            vocab_size=320, hidden_size=64, intermediate_size=144,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, rms_norm_eps=1e-5,
            rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False,
            hidden_act="silu", bos_token_id=1, eos_token_id=2,
        ),
        adapters=[
            ("all_r8_fp16", dict(r=8, lora_alpha=16, target_modules=ALL7), "float16"),
            ("attn_r16", dict(r=16, lora_alpha=16, target_modules=ATTN4), None),
            ("regex_r4_rslora", dict(r=4, lora_alpha=8, use_rslora=True,
                                     target_modules=r".*\.layers\.\d+\.mlp\.(gate_proj|down_proj)"), None),
        ],
    ),
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

WEIGHT_STD = 0.06
EMBED_STD = 0.1
HEAD_STD = 0.1
BIAS_STD = 0.05
NORM_JITTER = 0.1
LORA_STD = 0.1
TOKEN_STD = 0.3  # trainable tokens' rows: PEFT starts them as copies of the base rows


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
def llama3_inv_freq(head_dim, theta, rs):
    """Independent implementation of the Llama-3.1 rope frequency rule."""
    inv = [1.0 / (theta ** (2 * i / head_dim)) for i in range(head_dim // 2)]
    factor = rs["factor"]
    lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    lo_wl, hi_wl = old / lo, old / hi
    out = []
    for f in inv:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(f)
        elif wl > lo_wl:
            out.append(f / factor)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append((1 - s) * f / factor + s * f)
    return out, inv


def default_inv_freq(head_dim, theta):
    return [1.0 / (theta ** (2 * i / head_dim)) for i in range(head_dim // 2)]


def legacy_config(path, want_theta, want_scaling, save_dtype, with_rope_parameters=False):
    """Rewrite config.json the way real checkpoints look (rope_theta and
    rope_scaling at top level, torch_dtype), whatever transformers wrote."""
    p = os.path.join(path, "config.json")
    with open(p) as f:
        cfg = json.load(f)
    cfg.pop("rope_parameters", None)
    cfg["rope_theta"] = want_theta
    cfg["rope_scaling"] = want_scaling
    cfg["torch_dtype"] = save_dtype
    cfg["dtype"] = save_dtype
    if with_rope_parameters:
        rp = dict(want_scaling or {"rope_type": "default"})
        rp["rope_theta"] = want_theta
        cfg["rope_parameters"] = rp
    with open(p, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    return cfg


def init_random(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                v = 1.0 + NORM_JITTER * torch.randn(p.shape, generator=g)
            elif name.endswith(".bias"):
                v = BIAS_STD * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                v = EMBED_STD * torch.randn(p.shape, generator=g)
            elif "lm_head" in name:
                v = HEAD_STD * torch.randn(p.shape, generator=g)
            else:
                v = WEIGHT_STD * torch.randn(p.shape, generator=g)
            p.copy_(v.to(p.dtype))


def manual_shard(path, max_bytes):
    """Fallback sharding if save_pretrained(max_shard_size=...) did not shard."""
    from safetensors.torch import load_file, save_file
    single = os.path.join(path, "model.safetensors")
    sd = load_file(single)
    shards, cur, cur_bytes = [], {}, 0
    for k in sorted(sd):
        nb = sd[k].numel() * sd[k].element_size()
        if cur and cur_bytes + nb > max_bytes:
            shards.append(cur)
            cur, cur_bytes = {}, 0
        cur[k] = sd[k]
        cur_bytes += nb
    if cur:
        shards.append(cur)
    n = len(shards)
    wmap, total = {}, 0
    for i, sh in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({k: v.contiguous() for k, v in sh.items()}, os.path.join(path, fn),
                  metadata={"format": "pt"})
        for k, v in sh.items():
            wmap[k] = fn
            total += v.numel() * v.element_size()
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
    os.remove(single)


def fixture_adapter_dir(ad, arch):
    """A saved PEFT adapter as the fixtures keep it: no empty model card, its config pointing at
    the fixture's base, relative to the repo root."""
    if os.path.exists(os.path.join(ad, "README.md")):
        os.remove(os.path.join(ad, "README.md"))
    acp = os.path.join(ad, "adapter_config.json")
    with open(acp) as f:
        acfg = json.load(f)
    acfg["base_model_name_or_path"] = f"tests/fixtures/{arch}/model"
    with open(acp, "w") as f:
        json.dump(acfg, f, indent=2, sort_keys=True)
        f.write("\n")


def st_header(path):
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def lora_modules_info(pm, adapter):
    info = {}
    for name, m in pm.named_modules():
        if not hasattr(m, "r"):
            continue
        if adapter in getattr(m, "lora_A", {}):
            a, b = m.lora_A[adapter].weight, m.lora_B[adapter].weight
        elif adapter in getattr(m, "lora_embedding_A", {}):  # an Embedding: A (r, vocab), B (hidden, r)
            a, b = m.lora_embedding_A[adapter], m.lora_embedding_B[adapter]
        else:
            continue
        short = name
        for pre in ("base_model.model.",):
            if short.startswith(pre):
                short = short[len(pre):]
        info[short] = {"r": int(m.r[adapter]), "scaling": float(m.scaling[adapter]),
                       "in": int(a.shape[1]), "out": int(b.shape[0])}
    return info


# ---------------------------------------------------------------------------
# per-architecture build
# ---------------------------------------------------------------------------
def build_arch(arch, spec, out_root, device):
    import transformers
    import peft
    from transformers import AutoConfig, AutoModelForCausalLM
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file, save_file

    t0 = time.time()
    root = os.path.join(out_root, arch)
    if os.path.exists(root):
        shutil.rmtree(root)
    mdir = os.path.join(root, "model")
    os.makedirs(mdir)
    notes = []

    # ---- base model -------------------------------------------------------
    ccfg = dict(spec["config"])
    rope_theta = ccfg.pop("rope_theta")
    rope_scaling = ccfg.pop("rope_scaling", None)
    model_type = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                  "Qwen3ForCausalLM": "qwen3", "MistralForCausalLM": "mistral"}[spec["cls"]]
    config = AutoConfig.for_model(model_type, **ccfg)
    config.architectures = [spec["cls"]]
    torch.manual_seed(spec["seed"])
    model = AutoModelForCausalLM.from_config(config).float()
    init_random(model, spec["seed"])
    model = model.to(DTYPES[spec["save_dtype"]])
    kw = {}
    if spec["shard"]:
        kw["max_shard_size"] = spec["shard"]
    model.save_pretrained(mdir, **kw)
    del model
    if spec["shard"] and not os.path.exists(os.path.join(mdir, "model.safetensors.index.json")):
        notes.append("save_pretrained did not shard; sharded manually")
        manual_shard(mdir, 100 * 1000)

    def load_base():
        m = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32,
                                                 attn_implementation="eager")
        return m.float().to(device).eval()

    # config.json in the legacy layout; verify the reloaded model reads the rope
    # settings the C engine will read (independent formula)
    head_dim = ccfg.get("head_dim") or ccfg["hidden_size"] // ccfg["num_attention_heads"]
    if rope_scaling:
        want, unscaled = llama3_inv_freq(head_dim, rope_theta, rope_scaling)
        changed = sum(1 for a, b in zip(want, unscaled) if abs(a - b) > 1e-12 * max(abs(b), 1e-30))
        notes.append(f"llama3 rope scaling changes {changed} of {len(want)} inverse frequencies "
                     f"(original_max_position_embeddings={rope_scaling['original_max_position_embeddings']})")
    else:
        want = default_inv_freq(head_dim, rope_theta)
    for attempt in ("legacy", "legacy+rope_parameters"):
        cfg_json = legacy_config(mdir, rope_theta, rope_scaling, spec["save_dtype"],
                                 with_rope_parameters=(attempt != "legacy"))
        base = load_base()
        inv_hf = base.model.rotary_emb.inv_freq.detach().double().cpu().tolist()
        err = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(inv_hf, want))
        log(f"{arch}: config {attempt}: inv_freq rel err vs independent formula {err:.2e}")
        if err <= 1e-5:
            break
        notes.append(f"transformers did not read the '{attempt}' config.json rope settings as intended")
        del base
    else:
        raise SystemExit(f"{arch}: rope config not understood by transformers: hf={inv_hf} want={want}")
    att_scale = getattr(base.model.rotary_emb, "attention_scaling", 1.0)
    if abs(float(att_scale) - 1.0) > 1e-9:
        notes.append(f"rotary attention_scaling = {att_scale}")
    # exactness: weights in memory must equal the stored ones
    stored = {}
    for fn in sorted(os.listdir(mdir)):
        if fn.endswith(".safetensors"):
            stored.update(load_file(os.path.join(mdir, fn)))
    sdm = base.state_dict()
    for k, v in stored.items():
        if k not in sdm or not torch.equal(sdm[k].cpu(), v.float()):
            log(f"WARNING {arch}: loaded weight {k} differs from stored / missing")
            notes.append(f"WARNING: loaded weight {k} differs from stored or is missing")
    tensor_names = sorted(stored)

    # ---- adapters ----------------------------------------------------------
    adir_root = os.path.join(root, "adapters")
    adapter_meta = {}
    for ai, (name, lkw, adtype) in enumerate(spec["adapters"]):
        m = load_base()
        lcfg = LoraConfig(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **lkw)
        pm = get_peft_model(m, lcfg)
        g = torch.Generator().manual_seed(spec["seed"] * 100 + ai)
        with torch.no_grad():
            for pn, p in pm.named_parameters():
                if "lora_A" in pn or "lora_B" in pn or "lora_embedding_" in pn:
                    p.copy_((LORA_STD * torch.randn(p.shape, generator=g)).to(p.dtype))
                elif "trainable_tokens_delta" in pn:  # the rows themselves, despite the name
                    p.copy_((TOKEN_STD * torch.randn(p.shape, generator=g)).to(p.dtype))
        ad = os.path.join(adir_root, name)
        # PEFT's default ("auto") saves copies of the base embedding/lm_head beside a targeted
        # one; the loader checks their shape and reads them no further
        embeds = any(t in ("embed_tokens", "lm_head") for t in lkw["target_modules"])
        pm.save_pretrained(ad, save_embedding_layers="auto" if embeds else False)
        fixture_adapter_dir(ad, arch)
        wp = os.path.join(ad, "adapter_model.safetensors")
        if adtype:
            sd = load_file(wp)
            save_file({k: v.to(DTYPES[adtype]).contiguous() for k, v in sd.items()}, wp,
                      metadata={"format": "pt"})
        hdr = st_header(wp)
        dts = sorted({v["dtype"] for k, v in hdr.items() if k != "__metadata__"})
        adapter_meta[name] = {"dir": f"adapters/{name}", "stored_dtype": dts,
                              "peft_kwargs": lkw, "n_tensors": len(hdr) - ("__metadata__" in hdr)}
        del pm, m
        log(f"{arch}: adapter {name} saved ({dts})")

    # ---- reference: one PeftModel with the LoRA adapters loaded from disk, and one of its own
    # for each adapter with trainable tokens: PEFT loads none beside a LoRA embedding (TypeError),
    # and its mixed batch asks the token layer for every row's adapter (KeyError)
    names = [a[0] for a in spec["adapters"]]
    kw_of = {a[0]: a[1] for a in spec["adapters"]}
    tok_names = [n for n in names if kw_of[n].get("trainable_token_indices")]
    lora_names = [n for n in names if n not in tok_names]

    def load_peft(base, ns):
        m = PeftModel.from_pretrained(base, os.path.join(adir_root, ns[0]), adapter_name=ns[0])
        for n in ns[1:]:
            m.load_adapter(os.path.join(adir_root, n), adapter_name=n)
        return m.eval()

    base = load_base()
    pm = load_peft(base, lora_names)
    pm_of = {n: pm for n in lora_names}
    pm_of.update({n: load_peft(load_base(), [n]) for n in tok_names})
    max_rank = 0
    for n in names:
        info = lora_modules_info(pm_of[n], n)
        adapter_meta[n]["modules"] = info
        # the modules PEFT gave trainable tokens, with their ids (lm_head of a tied model too)
        toks = {}
        for mn, mod in pm_of[n].named_modules():
            ti = getattr(mod, "token_indices", None)
            if isinstance(ti, dict) and n in ti and mn.endswith("token_adapter"):
                toks[mn[len("base_model.model."):-len(".token_adapter")]] = list(ti[n])
        if toks:
            adapter_meta[n]["token_modules"] = toks
        adapter_meta[n]["max_rank"] = max(v["r"] for v in info.values())
        max_rank = max(max_rank, adapter_meta[n]["max_rank"])
        if not info:
            raise SystemExit(f"{arch}/{n}: no LoRA modules")
    # verify loaded LoRA weights equal the stored ones
    for n in names:
        sd = load_file(os.path.join(adir_root, n, "adapter_model.safetensors"))
        psd = pm_of[n].state_dict()
        for k, v in sd.items():
            if k.endswith(".base_layer.weight"):  # save_embedding_layers' copy of the base
                kk = k
            else:
                kk = k.replace(".lora_A.weight", f".lora_A.{n}.weight").replace(
                    ".lora_B.weight", f".lora_B.{n}.weight")
                if ".lora_embedding_" in k or k.endswith(".trainable_tokens_delta"):
                    kk = f"{k}.{n}"
            if kk not in psd or not torch.equal(psd[kk].cpu(), v.float()):
                log(f"WARNING {arch}/{n}: loaded LoRA tensor {k} differs from stored / missing")
                notes.append(f"WARNING: adapter {n}: loaded LoRA tensor {k} differs from stored or is missing")

    # rows: the base, every LoRA adapter, the first adapter again (two rows of one adapter), and
    # the base again, 6 in all: one mixed batch; then a row of each adapter with trainable
    # tokens, each alone in its own model. The mixed batch's rows, prompts and shapes are those
    # of the fixtures made before trainable tokens, so their references stay as they were.
    row_adapters = ["__base__"] + lora_names + [lora_names[0]]
    if len(row_adapters) < 6:
        row_adapters.append("__base__")
    row_adapters = row_adapters[:6]
    M = len(row_adapters)
    row_adapters += tok_names
    R = len(row_adapters)
    V = ccfg["vocab_size"]
    g = torch.Generator().manual_seed(spec["seed"] + 7)
    prompts = torch.cat([torch.randint(3, V, (M, N_PROMPT), generator=g),
                         torch.randint(3, V, (R - M, N_PROMPT), generator=g)])
    # a row of an adapter with trainable tokens has some of its embedding ids in its prompt,
    # the last position among them
    for i, a in enumerate(row_adapters):
        tti = kw_of.get(a, {}).get("trainable_token_indices")
        if tti:
            emb = tti if isinstance(tti, list) else tti["embed_tokens"]
            for pos, t in zip((3, 7, N_PROMPT - 1), emb):
                prompts[i, pos] = t
    ids = prompts.to(device)

    # hidden-state capture for row 0 (base)
    inner = pm.get_base_model().model
    captured = []

    def hook(_m, _i, o):
        captured.append((o[0] if isinstance(o, tuple) else o).detach().float().cpu())

    def logits(seq):
        """(R, L, V): the mixed batch's rows, then each trainable-tokens row alone"""
        lo = [pm(input_ids=seq[:M], adapter_names=row_adapters[:M]).logits]
        lo += [pm_of[row_adapters[i]](input_ids=seq[i:i + 1]).logits for i in range(M, R)]
        return torch.cat(lo).float()

    with torch.no_grad():
        all_logits = logits(ids).cpu()
        # per-row single-adapter cross-check of the mixed batch
        diffs = []
        for i, a in enumerate(row_adapters[:M]):
            if a == "__base__":
                with pm.disable_adapter():
                    lo = pm(input_ids=ids[i:i + 1]).logits.float().cpu()
            else:
                pm.set_adapter(a)
                lo = pm(input_ids=ids[i:i + 1]).logits.float().cpu()
            diffs.append(float((lo[0] - all_logits[i]).abs().max()))
        # LoRA effect sizes (how much each adapter moves the last logits)
        with pm.disable_adapter():
            base_all = torch.cat([pm(input_ids=ids[:M]).logits] +
                                 ([pm(input_ids=ids[M:]).logits] if R > M else [])).float().cpu()
        effect = [float((all_logits[i, -1] - base_all[i, -1]).abs().max()) for i in range(R)]
        # hidden states of row 0 through the base model
        handles = [inner.embed_tokens.register_forward_hook(hook)]
        for layer in inner.layers:
            handles.append(layer.register_forward_hook(hook))
        handles.append(inner.norm.register_forward_hook(hook))
        with pm.disable_adapter():
            lo0 = pm(input_ids=ids[0:1]).logits.float().cpu()
        for h in handles:
            h.remove()
        hidden_row0 = torch.stack([c[0] for c in captured])  # (n_layers+2, L, H)
        # greedy continuation, mixed batch, full recompute each step
        seq = ids.clone()
        gaps = [[] for _ in range(R)]
        for step in range(N_NEW):
            lo = logits(seq)[:, -1]
            top = torch.topk(lo, 2, dim=-1)
            for i in range(R):
                gaps[i].append(float(top.values[i, 0] - top.values[i, 1]))
            seq = torch.cat([seq, top.indices[:, :1]], dim=1)
        greedy = seq[:, N_PROMPT:].cpu()
    pm.set_adapter(lora_names[0])

    tensors = {
        "last_logits": all_logits[:, -1].clone(),
        "all_logits": all_logits.clone(),
        "all_logits_row0": all_logits[0].clone(),
        "all_logits_row1": all_logits[1].clone(),
        "hidden_row0": hidden_row0.contiguous(),
        "prompt_ids": prompts.to(torch.int32).contiguous(),
        "greedy_ids": greedy.to(torch.int32).contiguous(),
    }
    save_file(tensors, os.path.join(root, "reference.safetensors"), metadata={"format": "pt"})
    hid_diff = float((lo0[0] - all_logits[0]).abs().max())
    notes += [
        "All reference numbers were computed in fp32 math on the GPU "
        "(torch.backends.cuda.matmul.allow_tf32=False, cudnn.allow_tf32=False, "
        "attn_implementation='eager') from exactly the stored weights "
        "(bf16/fp16 checkpoints and adapters loaded, then upcast to fp32).",
        f"last_logits[i] = logits at the last prompt position of row i; rows 0-{M - 1} in ONE mixed batch "
        "(PEFT adapter_names=row_adapters, '__base__' = no LoRA), each later row (an adapter with "
        "trainable tokens) alone in a PeftModel holding only its adapter (PEFT loads no trainable "
        "tokens beside a LoRA embedding, and its mixed batch does not run them beside other "
        "adapters). all_logits = (rows, L, V) "
        "for every prompt position; all_logits_row0/row1 are rows 0 and 1 of it.",
        f"max |mixed-batch - single-row| logits diff (rows 0-{M - 1}) = {max(diffs):.3e} (per row {['%.1e' % d for d in diffs]})",
        f"max |last logits with adapter - base| per row = {['%.3f' % e for e in effect]} "
        "(how strongly each adapter moves the logits)",
        "hidden_row0 = (n_layers+2, L, hidden): [0] embedding output, [1..n_layers] output of "
        "each decoder layer (residual stream), [n_layers+1] after the final RMSNorm; base model, row 0 "
        f"(consistency with all_logits_row0: {hid_diff:.1e}).",
        "greedy_ids: 16 greedy tokens per row, computed as its logits (full recompute each step, "
        "no KV cache, no EOS stop). top2_gaps[i][t] = logit(top1) - logit(top2) at step t; "
        "a C implementation may legitimately pick a different token only where that gap is "
        "tiny (< ~1e-3); compare tokens only up to the first such step.",
        "PEFT scaling: lora_alpha/r (use_rslora: lora_alpha/sqrt(r)); rank_pattern / alpha_pattern "
        "keys are matched against the module name as a suffix regex '(.*\\.)?(KEY)$' "
        "(a module in rank_pattern but not alpha_pattern keeps lora_alpha). adapters.<name>.modules "
        "lists every LoRA module with its effective r and scaling as PEFT computed them.",
        "Trainable tokens (trainable_token_indices): the stored "
        "'<module>.token_adapter.trainable_tokens_delta' (n_ids, hidden) are the rows that replace "
        "the base rows of those ids (PEFT's index_copy), randomized N(0, 0.3) here; "
        "adapters.<name>.token_modules lists the modules PEFT gave them (on a tied model lm_head "
        "too, with the embedding's ids and rows). Such a row's prompt holds some of its "
        "embedding ids, the last position among them.",
        "String target_modules is matched with re.fullmatch against the full module name "
        "(e.g. 'model.layers.0.self_attn.q_proj').",
        "config.json is written in the legacy layout of real checkpoints (top-level rope_theta, "
        "rope_scaling, torch_dtype); the script checked that transformers reads it back to the "
        "intended inverse frequencies.",
    ]
    ref = {
        "arch": spec["cls"],
        "model_dir": "model",
        "model_dtype": spec["save_dtype"],
        "sharded": bool(spec["shard"]),
        "config": cfg_json,
        "model_tensors": tensor_names,
        "prompt_len": N_PROMPT,
        "n_new": N_NEW,
        "rows": [
            {"prompt_ids": prompts[i].tolist(),
             "adapter": None if row_adapters[i] == "__base__" else row_adapters[i],
             "greedy_ids": greedy[i].tolist(),
             "top2_gaps": gaps[i],
             "min_top2_gap": min(gaps[i])}
            for i in range(R)
        ],
        "adapters": adapter_meta,
        "max_lora_rank": max_rank,
        "reference_tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                              for k, v in tensors.items()},
        "math": "fp32 (no TF32), eager attention, device " + (
            torch.cuda.get_device_name(0) if device == "cuda" else "cpu"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__, "python": sys.version.split()[0]},
        "seed": spec["seed"],
        "tolerance": {"fp32_rel": 1e-4, "fp32_abs_logits": 1e-4,
                      "note": "see tests/fixtures/README.md"},
        "notes": notes,
    }
    with open(os.path.join(root, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    log(f"{arch}: done in {time.time() - t0:.1f}s; mixed-vs-single {max(diffs):.2e}; "
        f"effects {['%.2f' % e for e in effect]}; min gaps {[round(min(x), 4) for x in gaps]}")
    del pm, pm_of, base
    if device == "cuda":
        torch.cuda.empty_cache()


# Mixes of adapters (docs/lora-mixing.md): what tests/engine/engine_checks.c's ec_mix runs,
# (adapter, weight) lists, each on the prompt of one reference row.
MIXES = [
    dict(row=0, adapters=[("all_r8", 0.7), ("attn_r4_bf16", 0.3)]),
    dict(row=4, adapters=[("attn_r4_bf16", 0.5), ("all_r8", 0.25)]),
]


def build_mix(arch, out_root, device):
    """--mix: PEFT's add_weighted_adapter(combination_type="cat") of the MIXES over the
    existing fixture of arch (model and adapters as stored, not rebuilt): last-position logits
    and 16 greedy tokens (full recompute) of each mix on its row's prompt, into
    <arch>/mix.safetensors ("last_logits" (n_mixes, V), "greedy_ids" (n_mixes, N_NEW)) and
    <arch>/mix.json (the mixes, top-2 gaps, versions)."""
    import peft
    import transformers
    from peft import PeftModel
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    root = os.path.join(out_root, arch)
    with open(os.path.join(root, "reference.json")) as f:
        ref = json.load(f)
    base = AutoModelForCausalLM.from_pretrained(os.path.join(root, "model"), dtype=torch.float32,
                                                attn_implementation="eager").float().to(device).eval()
    names = sorted({a for m in MIXES for a, _ in m["adapters"]})
    adir = os.path.join(root, "adapters")
    pm = PeftModel.from_pretrained(base, os.path.join(adir, names[0]), adapter_name=names[0])
    for n in names[1:]:
        pm.load_adapter(os.path.join(adir, n), adapter_name=n)
    last, greedy, gaps = [], [], []
    for k, mix in enumerate(MIXES):
        name = f"mix{k}"
        pm.add_weighted_adapter([a for a, _ in mix["adapters"]], [w for _, w in mix["adapters"]], name,
                                combination_type="cat")
        pm.set_adapter(name)
        pm.eval()
        seq = torch.tensor([ref["rows"][mix["row"]]["prompt_ids"]], device=device)
        g = []
        with torch.no_grad():
            last.append(pm(input_ids=seq).logits[0, -1].float().cpu())
            for _ in range(N_NEW):
                lo = pm(input_ids=seq).logits[0, -1].float()
                top = torch.topk(lo, 2)
                g.append(float(top.values[0] - top.values[1]))
                seq = torch.cat([seq, top.indices[None, :1]], dim=1)
        greedy.append(seq[0, -N_NEW:].cpu())
        gaps.append(g)
        log(f"{arch}: {name} {mix['adapters']} on row {mix['row']}: min top-2 gap {min(g):.4f}")
    save_file({"last_logits": torch.stack(last).contiguous(),
               "greedy_ids": torch.stack(greedy).to(torch.int32).contiguous()},
              os.path.join(root, "mix.safetensors"), metadata={"format": "pt"})
    out = {
        "mixes": [{"row": m["row"], "adapters": [{"name": a, "weight": w} for a, w in m["adapters"]],
                   "greedy_ids": greedy[k].tolist(), "top2_gaps": gaps[k]} for k, m in enumerate(MIXES)],
        "combination_type": "cat",
        "math": "fp32 (no TF32), eager attention, device " + (
            torch.cuda.get_device_name(0) if device == "cuda" else "cpu"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__, "python": sys.version.split()[0]},
        "notes": ["PEFT add_weighted_adapter(combination_type='cat') of the stored adapters, one new "
                  "adapter per mix; last_logits[k] at the last prompt position of mix k's row, "
                  "greedy_ids[k] 16 greedy tokens (full recompute, no EOS stop)."],
    }
    with open(os.path.join(root, "mix.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


# Added vocabulary (docs/adapters.md): an adapter whose tokenizer adds tokens past the base
# vocabulary, made as a user makes one: the base resized for them (resize_token_embeddings),
# LoRA on q and v with trainable tokens naming the new ids (and one base id), saved by PEFT with
# save_embedding_layers="auto", which saves the resized embedding and lm_head whole since the
# vocabulary changed. lm_head lists two of the three new ids: the third's row is the resized
# lm_head's. The fixture has no tokenizer (a random model), so the tokens go into
# added_tokens.json as a tokenizer's save_pretrained writes it for tokens past its vocabulary.
ADDED = dict(arch="llama", name="added_vocab", tokens=["<ext0>", "<ext1>", " ext2"], base_ids=[11],
             lm_head_new=2, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], seed=4242)


def build_added(arch, out_root, device):
    """--added: the ADDED adapter over the existing fixture of arch (model as stored, not rebuilt)
    into <arch>/adapters/<name>, and PEFT's reference on the resized model: last-position logits
    (1, vocab_size + n_added), every position's, and 16 greedy tokens (full recompute) of a
    prompt holding the added ids, into <arch>/added.safetensors and <arch>/added.json."""
    import peft
    import transformers
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    spec = ADDED
    root = os.path.join(out_root, arch)
    mdir = os.path.join(root, "model")
    ad = os.path.join(root, "adapters", spec["name"])
    if os.path.exists(ad):
        shutil.rmtree(ad)

    def load_resized():
        m = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager").float()
        m.resize_token_embeddings(V + n_added)
        return m

    base = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager")
    V = base.config.vocab_size
    n_added = len(spec["tokens"])
    new_ids = list(range(V, V + n_added))
    del base
    g = torch.Generator().manual_seed(spec["seed"])
    m = load_resized()
    if m.config.tie_word_embeddings:
        raise SystemExit(f"{arch}: ADDED expects an untied model (lm_head's rows of its own)")
    with torch.no_grad():  # the new rows, as training would leave them (resize's init is random)
        for w in (m.get_input_embeddings().weight, m.get_output_embeddings().weight):
            w[V:] = TOKEN_STD * torch.randn((n_added, w.shape[1]), generator=g)
    lm_head_ids = new_ids[:spec["lm_head_new"]]
    lcfg = LoraConfig(r=spec["r"], lora_alpha=spec["lora_alpha"], lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM", target_modules=spec["target_modules"],
                      trainable_token_indices={"embed_tokens": new_ids + spec["base_ids"],
                                               "lm_head": lm_head_ids})
    pm = get_peft_model(m.to(device), lcfg)
    with torch.no_grad():
        for pn, p in pm.named_parameters():
            if "lora_A" in pn or "lora_B" in pn:
                p.copy_((LORA_STD * torch.randn(p.shape, generator=g)).to(p.dtype))
            elif "trainable_tokens_delta" in pn:  # the rows themselves, despite the name
                p.copy_((TOKEN_STD * torch.randn(p.shape, generator=g)).to(p.dtype))
    pm.save_pretrained(ad, save_embedding_layers="auto")
    fixture_adapter_dir(ad, arch)
    sd = load_file(os.path.join(ad, "adapter_model.safetensors"))
    resized = {k: list(v.shape) for k, v in sd.items() if k.endswith("base_layer.weight")}
    if len(resized) != 2 or any(s[0] != V + n_added for s in resized.values()):
        raise SystemExit(f"{arch}: PEFT did not save the resized embedding and lm_head: {resized} "
                         "(save_embedding_layers='auto' needs the base config.json at base_model_name_or_path)")
    with open(os.path.join(ad, "added_tokens.json"), "w") as f:
        json.dump({t: V + k for k, t in enumerate(spec["tokens"])}, f, indent=2)
        f.write("\n")
    del pm, m
    log(f"{arch}: adapter {spec['name']} saved; resized matrices {resized}")

    # the reference: as a user loads it, the base resized first, then the adapter from disk
    pm = PeftModel.from_pretrained(load_resized().to(device), ad).eval()
    psd = pm.state_dict()
    for k, v in sd.items():  # what PEFT runs is what the file holds
        kk = k if k.endswith("base_layer.weight") else (
            k.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
            if ".lora_" in k else f"{k}.default")
        if kk not in psd or not torch.equal(psd[kk].cpu(), v.float()):
            raise SystemExit(f"{arch}: loaded tensor {k} ({kk}) differs from stored or is missing")
    gp = torch.Generator().manual_seed(spec["seed"] + 1)
    prompt = torch.randint(3, V, (1, N_PROMPT), generator=gp)
    for pos, t in zip((2, 5, N_PROMPT - 1), new_ids):  # every added id, the last position among them
        prompt[0, pos] = t
    prompt[0, 8] = spec["base_ids"][0]
    seq = prompt.to(device)
    gaps = []
    with torch.no_grad():
        all_logits = pm(input_ids=seq).logits.float().cpu()
        with pm.disable_adapter():
            base_last = pm(input_ids=seq[:, :-1]).logits[0, -1].float().cpu()  # no added ids for the base
        for _ in range(N_NEW):
            lo = pm(input_ids=seq).logits[0, -1].float()
            top = torch.topk(lo, 2)
            gaps.append(float(top.values[0] - top.values[1]))
            seq = torch.cat([seq, top.indices[None, :1]], dim=1)
    greedy = seq[0, N_PROMPT:].cpu()
    added_cols = all_logits[0, -1, V:]
    save_file({"last_logits": all_logits[:, -1].clone(), "all_logits": all_logits.contiguous(),
               "prompt_ids": prompt.to(torch.int32).contiguous(),
               "greedy_ids": greedy[None].to(torch.int32).contiguous()},
              os.path.join(root, "added.safetensors"), metadata={"format": "pt"})
    out = {
        "adapter": spec["name"],
        "vocab_size": V,
        "added_tokens": {t: V + k for k, t in enumerate(spec["tokens"])},
        "prompt_ids": prompt[0].tolist(),
        "greedy_ids": greedy.tolist(),
        "top2_gaps": gaps,
        "min_top2_gap": min(gaps),
        "greedy_added": sum(1 for t in greedy.tolist() if t >= V),
        "math": "fp32 (no TF32), eager attention, device " + (
            torch.cuda.get_device_name(0) if device == "cuda" else "cpu"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__, "python": sys.version.split()[0]},
        "notes": [
            f"The base model resized to {V + n_added} (resize_token_embeddings), its new rows set to "
            f"N(0, {TOKEN_STD}); LoRA r={spec['r']} on {spec['target_modules']}; trainable_token_indices "
            f"embed_tokens {new_ids + spec['base_ids']}, lm_head {lm_head_ids}; saved with "
            "save_embedding_layers='auto' (the resized embedding and lm_head whole, their base rows the "
            f"base model's). lm_head's row of id {new_ids[-1]} is the resized lm_head's.",
            "last_logits (1, vocab_size + n_added) at the last prompt position (an added id), all_logits "
            "(1, L, vocab_size + n_added); greedy_ids 16 tokens (full recompute, no EOS stop), "
            "top2_gaps as reference.json's.",
            f"The added columns of the last position: {['%.3f' % x for x in added_cols.tolist()]}; "
            f"the base model's last logit max moves by {float((all_logits[0, -2, :V] - base_last[:V]).abs().max()):.3f} "
            "at the position before (how much the adapter moves the logits).",
        ],
    }
    with open(os.path.join(root, "added.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    log(f"{arch}: added-vocabulary reference written; {out['greedy_added']} of the greedy tokens are added "
        f"ids; min top-2 gap {min(gaps):.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--arch", action="append", help="only these archs (default all)")
    ap.add_argument("--mix", action="store_true",
                    help="only the mixes' references (mix.safetensors, mix.json) of existing fixtures "
                         "(default arch: llama)")
    ap.add_argument("--added", action="store_true",
                    help="only the added-vocabulary adapter and its reference (adapters/added_vocab, "
                         "added.safetensors, added.json) of the existing llama fixture")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        torch.set_float32_matmul_precision("highest")
    except Exception:
        pass
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        log("WARNING: no CUDA device; computing references on the CPU")
    if args.mix:
        for arch in (args.arch or ["llama"]):
            build_mix(arch, args.out, device)
        log("mix references written to", args.out)
        return
    if args.added:
        build_added(ADDED["arch"], args.out, device)
        log("added-vocabulary reference written to", args.out)
        return
    os.makedirs(args.out, exist_ok=True)
    failed = []
    for arch in (args.arch or list(ARCHS)):
        try:
            build_arch(arch, ARCHS[arch], args.out, device)
        except BaseException as e:  # keep going with the other archs
            import traceback
            traceback.print_exc()
            failed.append(arch)
    if failed:
        log("FAILED:", failed)
        sys.exit(1)
    log("all fixtures written to", args.out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Train the loraserve demo: a small Llama with its own byte-level BPE tokenizer,
plus four PEFT LoRA adapters that each change what the SAME prompt does.

Prompt (raw completion form, the tokenizer adds <|begin_of_text|>):
    "input: pear 3 fig\\noutput:"
or the same string as the user message of the ChatML (Qwen2) chat template.

    base     -> " pear 3 fig"          (repeat the list)
    reverse  -> " fig 3 pear"          (reverse the order)
    upper    -> " PEAR 3 FIG"          (uppercase)
    sort     -> " 3 fig pear"          (sort, Python string order: digits first)
    digits   -> " pear three fig"      (each digit to its English word)

The answer is followed by <|end_of_text|> (raw) or <|im_end|> (chat); both are in
generation_config.json's eos_token_id.

The base model is trained on the task-free prompt (-> repeat) and also on
task-tagged prompts ("task: reverse\\ninput: ...\\noutput:") so it already holds
each transformation; each adapter then learns to apply one transformation to
the task-free prompt.  Output: examples/demo/ (model, tokenizer, adapters,
eval.json with held-out prompts only).

Needs torch, transformers 5.x, peft, tokenizers, safetensors, a CUDA GPU.
    PYTHONUNBUFFERED=1 python3 tools/train_demo.py [--out examples/demo]
"""

import argparse
import json
import math
import os
import random
import shutil
import sys
import time

import torch
import torch.nn.functional as F

WORDS = """apple pear fig plum lime kiwi grape melon peach berry lemon mango olive bean
corn rice bread cake milk tea salt soup egg ham jam cat dog cow pig hen fox owl bee ant
bat rat elk yak frog fish bird duck goat lamb deer bear wolf lion mouse horse red blue
green pink gold gray tan sun moon star rain snow wind fire ice rock sand tree leaf rose
lily moss hill lake sea road door desk lamp book pen cup bowl fork box bag hat coat shoe
sock ring bell drum kite ship boat car bus train house""".split()
DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
DIGITS = [str(i) for i in range(10)]
TASKS = ["reverse", "upper", "sort", "digits"]
ADAPTER_RANK = {"reverse": 8, "upper": 8, "sort": 16, "digits": 8}
ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

BOS, EOS, IM_START, IM_END = "<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"
SPECIALS = [BOS, EOS, IM_START, IM_END]
QWEN2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHAT_PREFIX = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
CHAT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"

MODEL_CFG = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                 rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                 hidden_act="silu")
VOCAB_SIZE = 1024
MAXLEN = 64

SEED = 1234


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


# ---------------------------------------------------------------------------
# task rules
# ---------------------------------------------------------------------------
def transform(items, task):
    if task is None or task == "repeat":
        return list(items)
    if task == "reverse":
        return list(items)[::-1]
    if task == "upper":
        return [w.upper() for w in items]
    if task == "sort":
        return sorted(items)
    if task == "digits":
        return [DIGIT_NAMES[int(w)] if w.isdigit() else w for w in items]
    raise ValueError(task)


def prompt_text(items, tag=None):
    s = "input: " + " ".join(items) + "\noutput:"
    if tag:
        s = "task: " + tag + "\n" + s
    return s


def answer_text(items, task):
    return " " + " ".join(transform(items, task))


def sample_items(rng, lo=2, hi=5, p_digit=0.3):
    n = rng.randint(lo, hi)
    words = rng.sample(WORDS, n)
    return [str(rng.randint(0, 9)) if rng.random() < p_digit else w for w in words]


def canon(items):
    return tuple(sorted(items))


def make_eval_lists(rng, n):
    """Held-out lists: 3-5 items, >=1 digit, >=2 words, every transform visibly
    different from the plain repeat."""
    out, seen = [], set()
    while len(out) < n:
        items = sample_items(rng, 3, 5, 0.35)
        nd = sum(w.isdigit() for w in items)
        if nd < 1 or len(items) - nd < 2:
            continue
        if transform(items, "sort") == items or transform(items, "reverse") == items:
            continue
        if canon(items) in seen:
            continue
        seen.add(canon(items))
        out.append(items)
    return out


# ---------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------
def build_tokenizer(rng, out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    corpus = []
    for _ in range(30000):
        items = sample_items(rng)
        task = rng.choice([None] + TASKS)
        p = prompt_text(items, task if (task and rng.random() < 0.5) else None)
        corpus.append(p + answer_text(items, task) + EOS)
        corpus.append(CHAT_PREFIX + p + CHAT_SUFFIX + answer_text(items, task) + IM_END)
    for w in WORDS + DIGIT_NAMES:
        corpus += [" " + w, " " + w.upper()] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=f"{BOS}:0 $A:0",
            pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1",
            special_tokens=[(BOS, bos_id)]),
    ])
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    added = {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True} for t in SPECIALS}
    tcfg = {
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "chat_template": QWEN2_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": MODEL_CFG["max_position_embeddings"],
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=2)
        f.write("\n")
    single = sum(len(tok.encode(" " + w, add_special_tokens=False).ids) == 1 for w in WORDS)
    single_u = sum(len(tok.encode(" " + w.upper(), add_special_tokens=False).ids) == 1 for w in WORDS)
    log(f"tokenizer: vocab {tok.get_vocab_size()}, specials {ids}, single-token words "
        f"{single}/{len(WORDS)} lower, {single_u}/{len(WORDS)} upper")
    return tok, ids


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------
class Encoder:
    def __init__(self, tok, ids):
        self.tok, self.ids = tok, ids

    def prompt_ids(self, prompt, mode, bos):
        if mode == "raw":
            ids = self.tok.encode(prompt, add_special_tokens=False).ids
        else:
            ids = self.tok.encode(CHAT_PREFIX + prompt + CHAT_SUFFIX, add_special_tokens=False).ids
        return ([self.ids[BOS]] if bos else []) + ids

    def answer_ids(self, answer, mode):
        term = self.ids[EOS] if mode == "raw" else self.ids[IM_END]
        return self.tok.encode(answer, add_special_tokens=False).ids + [term]


def make_examples(rng, n, task_mix, exclude):
    """task_mix: list of (weight, tag_in_prompt, task).  Returns (prompt, answer, mode, bos)."""
    weights = [w for w, _, _ in task_mix]
    ex = []
    while len(ex) < n:
        items = sample_items(rng)
        if canon(items) in exclude:
            continue
        _, tag, task = rng.choices(task_mix, weights)[0]
        mode = "raw" if rng.random() < 0.5 else "chat"
        bos = (rng.random() < 0.8) if mode == "raw" else (rng.random() < 0.2)
        ex.append((prompt_text(items, tag), answer_text(items, task), mode, bos))
    return ex


def tensorize(enc, examples, device):
    pad = enc.ids[EOS]
    pstr = [p if mode == "raw" else CHAT_PREFIX + p + CHAT_SUFFIX for p, _, mode, _ in examples]
    penc = enc.tok.encode_batch(pstr, add_special_tokens=False)
    aenc = enc.tok.encode_batch([a for _, a, _, _ in examples], add_special_tokens=False)
    xs, ys = [], []
    for (p, a, mode, bos), pe, ae in zip(examples, penc, aenc):
        pi = ([enc.ids[BOS]] if bos else []) + pe.ids
        ai = ae.ids + [enc.ids[EOS] if mode == "raw" else enc.ids[IM_END]]
        seq = pi + ai
        assert len(seq) <= MAXLEN, (p, a, len(seq))
        fill = MAXLEN - len(seq)
        xs.append(seq + [pad] * fill)
        # label at position t = token t (the loss shifts by one)
        ys.append([-100] * len(pi) + ai + [-100] * fill)
    return (torch.tensor(xs, dtype=torch.long).to(device),
            torch.tensor(ys, dtype=torch.long).to(device))


def lm_loss_and_exact(model, X, Y):
    logits = model(input_ids=X).logits[:, :-1].float()
    tgt = Y[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)
    with torch.no_grad():
        pred = logits.argmax(-1)
        ok = ((pred == tgt) | (tgt == -100)).all(dim=1)
    return loss, ok


@torch.no_grad()
def teacher_forced_acc(model, X, Y, bs=512):
    model.eval()
    oks = []
    for i in range(0, X.shape[0], bs):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, ok = lm_loss_and_exact(model, X[i:i + bs], Y[i:i + bs])
        oks.append(ok)
    model.train()
    return torch.cat(oks).float().mean().item()


def train_loop(model, params, X, Y, vals, *, lr, steps, warmup, bs, time_cap, label,
               early_stop_after=None, check_every=250, wd=0.01):
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=wd)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(
            min(s, steps) / steps * math.pi))))
    g = torch.Generator(device=X.device).manual_seed(SEED)
    model.train()
    t0 = time.time()
    streak = 0
    step = 0
    for step in range(1, steps + 1):
        idx = torch.randint(0, X.shape[0], (bs,), device=X.device, generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = lm_loss_and_exact(model, X[idx], Y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % check_every == 0 or step == steps:
            accs = {k: teacher_forced_acc(model, vx, vy) for k, (vx, vy) in vals.items()}
            log(f"{label} step {step} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.2e} "
                f"val {json.dumps({k: round(v, 4) for k, v in accs.items()})} "
                f"{time.time() - t0:.0f}s")
            if all(v == 1.0 for v in accs.values()):
                streak += 1
            else:
                streak = 0
            if early_stop_after is not None and step >= early_stop_after and streak >= 2:
                log(f"{label}: early stop at step {step}")
                break
        if time.time() - t0 > time_cap:
            log(f"{label}: time cap hit at step {step}")
            break
    model.eval()
    return step, time.time() - t0


# ---------------------------------------------------------------------------
# saving helpers
# ---------------------------------------------------------------------------
def legacy_config(path, theta):
    p = os.path.join(path, "config.json")
    with open(p) as f:
        cfg = json.load(f)
    cfg.pop("rope_parameters", None)
    cfg["rope_theta"] = theta
    cfg["rope_scaling"] = None
    cfg["torch_dtype"] = "bfloat16"
    cfg["dtype"] = "bfloat16"
    with open(p, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------------------
# evaluation (saved checkpoint, fp32 math, greedy)
# ---------------------------------------------------------------------------
@torch.no_grad()
def greedy(model, enc, prompt_ids, max_new=24):
    stop = {enc.ids[EOS], enc.ids[IM_END]}
    seq = torch.tensor([prompt_ids], device="cuda")
    out, gaps = [], []
    for _ in range(max_new):
        top = torch.topk(model(input_ids=seq).logits[0, -1].float(), 2)
        nxt = int(top.indices[0])
        gaps.append(float(top.values[0] - top.values[1]))
        out.append(nxt)
        if nxt in stop:
            break
        seq = torch.cat([seq, torch.tensor([[nxt]], device="cuda")], dim=1)
    return out, gaps


def run_eval(out_dir, enc, eval_lists, device):
    from transformers import AutoModelForCausalLM
    from peft import PeftModel
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    base = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32,
                                                attn_implementation="eager").float().to(device).eval()
    pm = PeftModel.from_pretrained(base, os.path.join(out_dir, "adapters", TASKS[0]),
                                   adapter_name=TASKS[0])
    for t in TASKS[1:]:
        pm.load_adapter(os.path.join(out_dir, "adapters", t), adapter_name=t)
    pm.eval()
    results = {}
    for name in ["base"] + TASKS:
        task = None if name == "base" else name
        rows, n_ok, extra_ok, extra_n = [], 0, 0, 0

        def gen(pids):
            if name == "base":
                with pm.disable_adapter():
                    return greedy(pm, enc, pids)
            pm.set_adapter(name)
            return greedy(pm, enc, pids)

        for items in eval_lists:
            prompt = prompt_text(items)
            expected = answer_text(items, task)
            row = {"input": " ".join(items), "prompt": prompt, "expected": expected}
            all_ok = True
            for mode, bos, term in (("raw", True, EOS), ("chat", False, IM_END)):
                pids = enc.prompt_ids(prompt, mode, bos)
                g, gaps = gen(pids)
                ended = bool(g) and g[-1] in (enc.ids[EOS], enc.ids[IM_END])
                text = enc.tok.decode(g[:-1] if ended else g, skip_special_tokens=False)
                ok = ended and text == expected
                all_ok &= ok
                row[mode] = {"prompt_ids": pids, "output": text, "output_ids": g,
                             "terminator": enc.tok.id_to_token(g[-1]) if ended else None,
                             "min_top2_gap": round(min(gaps), 4), "ok": ok}
            # robustness variants (BOS the other way round): counted, not listed
            for mode, bos in (("raw", False), ("chat", True)):
                g, _ = gen(enc.prompt_ids(prompt, mode, bos))
                ended = bool(g) and g[-1] in (enc.ids[EOS], enc.ids[IM_END])
                extra_n += 1
                extra_ok += int(ended and enc.tok.decode(g[:-1], skip_special_tokens=False) == expected)
            n_ok += int(all_ok)
            rows.append(row)
        min_gap = min(min(r[m]["min_top2_gap"] for m in ("raw", "chat")) for r in rows)
        results[name] = {"adapter": None if name == "base" else f"adapters/{name}",
                         "min_top2_gap": min_gap,
                         "rule": {"base": "repeat the list", "reverse": "reverse the order",
                                  "upper": "uppercase every item",
                                  "sort": "sort (Python string order: digits before letters)",
                                  "digits": "each digit -> its English word"}[name],
                         "accuracy": n_ok / len(eval_lists),
                         "accuracy_other_bos_variants": extra_ok / max(1, extra_n),
                         "prompts": rows}
        log(f"eval {name}: accuracy {n_ok}/{len(eval_lists)}, other-BOS variants {extra_ok}/{extra_n}, "
            f"min top-2 logit gap on the greedy paths {min_gap:.3f}")
    return results


# ---------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="examples/demo")
    ap.add_argument("--base-steps", type=int, default=10000)
    ap.add_argument("--base-time", type=float, default=240.0)
    ap.add_argument("--lora-steps", type=int, default=2000)
    ap.add_argument("--lora-time", type=float, default=60.0)
    ap.add_argument("--n-eval", type=int, default=16)
    args = ap.parse_args()
    T0 = time.time()
    assert len(WORDS) == 100 and len(set(WORDS)) == 100, len(WORDS)
    assert not set(WORDS) & set(DIGIT_NAMES)
    import transformers
    import peft
    import tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM
    from peft import LoraConfig, get_peft_model
    device = "cuda"
    random.seed(SEED)
    torch.manual_seed(SEED)
    out = args.out
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)

    rng = random.Random(SEED)
    eval_lists = make_eval_lists(random.Random(SEED + 1), args.n_eval)
    val_lists_rng = random.Random(SEED + 2)
    exclude = {canon(x) for x in eval_lists}
    tok, ids = build_tokenizer(random.Random(SEED + 3), out)
    enc = Encoder(tok, ids)

    # validation sets (held-out from training too)
    val_items = []
    while len(val_items) < 600:
        it = sample_items(val_lists_rng)
        if canon(it) not in exclude:
            val_items.append(it)
    exclude |= {canon(x) for x in val_items}

    def val_set(tag, task, mode, bos):
        exs = [(prompt_text(it, tag), answer_text(it, task), mode, bos) for it in val_items]
        return tensorize(enc, exs, device)

    # ---------------- base model ----------------
    base_mix = [(0.3, None, None)] + [(0.175, t, t) for t in TASKS]
    t = time.time()
    train_ex = make_examples(rng, 300000, base_mix, exclude)
    X, Y = tensorize(enc, train_ex, device)
    log(f"base data: {X.shape} in {time.time() - t:.1f}s")
    vals = {"repeat_raw": val_set(None, None, "raw", True),
            "repeat_chat": val_set(None, None, "chat", False)}
    for tname in TASKS:
        vals[f"{tname}_tag"] = val_set(tname, tname, "raw" if tname in ("reverse", "sort") else "chat",
                                       tname in ("reverse", "sort"))
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), bos_token_id=ids[BOS],
                      eos_token_id=[ids[EOS], ids[IM_END]], pad_token_id=ids[EOS], **MODEL_CFG)
    cfg.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg).float().to(device)
    nparam = sum(p.numel() for p in model.parameters())
    log(f"model params {nparam / 1e6:.2f}M")
    steps, secs = train_loop(model, list(model.parameters()), X, Y, vals, lr=2e-3,
                             steps=args.base_steps, warmup=300, bs=256, time_cap=args.base_time,
                             label="base", early_stop_after=None, check_every=500)
    base_log = {"steps": steps, "seconds": round(secs, 1)}
    model = model.to(torch.bfloat16)
    model.config.eos_token_id = [ids[EOS], ids[IM_END]]
    model.save_pretrained(out)
    legacy_config(out, MODEL_CFG["rope_theta"])
    gen_cfg = {"bos_token_id": ids[BOS], "eos_token_id": [ids[EOS], ids[IM_END]],
               "pad_token_id": ids[EOS], "do_sample": False, "max_new_tokens": 32,
               "transformers_version": transformers.__version__}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen_cfg, f, indent=2)
        f.write("\n")
    del model, X, Y
    torch.cuda.empty_cache()

    # ---------------- adapters ----------------
    adapter_log = {}
    for ti, tname in enumerate(TASKS):
        from transformers import AutoModelForCausalLM
        base = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                    attn_implementation="sdpa").float().to(device)
        r = ADAPTER_RANK[tname]
        lcfg = LoraConfig(r=r, lora_alpha=2 * r, target_modules=ALL7, lora_dropout=0.0,
                          bias="none", task_type="CAUSAL_LM")
        torch.manual_seed(SEED + 10 + ti)
        pm = get_peft_model(base, lcfg)
        mix = [(1.0, None, tname)]
        ex = make_examples(random.Random(SEED + 100 + ti), 60000, mix, exclude)
        X, Y = tensorize(enc, ex, device)
        lvals = {"raw": val_set(None, tname, "raw", True), "chat": val_set(None, tname, "chat", False)}
        params = [p for p in pm.parameters() if p.requires_grad]
        steps, secs = train_loop(pm, params, X, Y, lvals, lr=3e-3, steps=args.lora_steps, warmup=50,
                                 bs=256, time_cap=args.lora_time, label=f"lora-{tname}",
                                 early_stop_after=400, check_every=100, wd=0.0)
        adapter_log[tname] = {"r": r, "lora_alpha": 2 * r, "steps": steps, "seconds": round(secs, 1)}
        ad = os.path.join(out, "adapters", tname)
        pm.save_pretrained(ad, save_embedding_layers=False)
        if os.path.exists(os.path.join(ad, "README.md")):
            os.remove(os.path.join(ad, "README.md"))  # PEFT's empty model card
        acp = os.path.join(ad, "adapter_config.json")
        with open(acp) as f:
            acfg = json.load(f)
        acfg["base_model_name_or_path"] = "examples/demo"
        with open(acp, "w") as f:
            json.dump(acfg, f, indent=2, sort_keys=True)
            f.write("\n")
        del pm, base, X, Y
        torch.cuda.empty_cache()

    # ---------------- evaluation of the saved files ----------------
    checks = {}
    try:
        from transformers import AutoTokenizer
        at = AutoTokenizer.from_pretrained(out)
        p = prompt_text(eval_lists[0])
        rendered = at.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True)
        checks["chat_template_matches_manual_render"] = rendered == CHAT_PREFIX + p + CHAT_SUFFIX
        checks["autotokenizer_encode_matches"] = at(p)["input_ids"] == enc.prompt_ids(p, "raw", True)
    except Exception as e:  # informative only
        checks["autotokenizer_error"] = repr(e)
    log("checks", checks)
    results = run_eval(out, enc, eval_lists, device)
    evj = {
        "description": "Held-out prompts (word lists never seen in training or validation). "
                       "'expected' is computed by the rule; raw = prompt tokenized with the "
                       "tokenizer's post-processor (adds <|begin_of_text|>), answer ends with "
                       "<|end_of_text|>; chat = Qwen2 ChatML template with the prompt as the user "
                       "message, no BOS, answer ends with <|im_end|>. Outputs are greedy, from the "
                       "saved bf16 checkpoint and saved adapters, fp32 math (no TF32), eager attention.",
        "prompt_format": "input: <items separated by spaces>\\noutput:",
        "chat_prefix": CHAT_PREFIX, "chat_suffix": CHAT_SUFFIX,
        "stop_token_ids": [ids[EOS], ids[IM_END]],
        "special_token_ids": ids,
        "results": results,
        "training": {"base": base_log, "adapters": adapter_log, "params": nparam,
                     "seed": SEED, "total_seconds": round(time.time() - T0, 1)},
        "checks": checks,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__, "tokenizers": tokenizers.__version__},
    }
    with open(os.path.join(out, "eval.json"), "w") as f:
        json.dump(evj, f, indent=1)
        f.write("\n")
    accs = {k: v["accuracy"] for k, v in results.items()}
    log("accuracies", accs, f"total {time.time() - T0:.0f}s")
    if not all(a == 1.0 for a in accs.values()):
        log("WARNING: not all held-out accuracies are 100%")
        sys.exit(2)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes a Llama-3-8B model directory without weights, for serving with --load-format dummy.

    tools/make_dummy_model.py OUT_DIR

OUT_DIR gets config.json (Llama-3.1-8B's shapes and rope), generation_config.json,
tokenizer_config.json and a tokenizer.json the size of Llama 3's: a byte-level BPE of
128,000 tokens (the 256 byte symbols and 127,744 merges drawn from a fixed seed) and the
256 special tokens at 128000-128255 (<|begin_of_text|>, <|end_of_text|>, <|eot_id|>, the
reserved ones). Its merges are not Llama 3's — no model hub is reachable here — but every id
the model can produce decodes, so the whole graph (tokenizer, detokenizer, streaming) runs
at the real vocabulary size. Deterministic: the same files every time.
"""
import json
import os
import random
import sys

VOCAB = 128256
BASE = 128000  # ordinary tokens; the rest are special

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": VOCAB, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001,
    "torch_dtype": "bfloat16", "hidden_act": "silu",
}


def byte_symbols():
    """GPT-2's byte -> printable character map (the ByteLevel pre-tokenizer's alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def special_name(i):
    named = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128006: "<|start_header_id|>",
             128007: "<|end_header_id|>", 128009: "<|eot_id|>"}
    return named.get(i, "<|reserved_special_token_%d|>" % (i - BASE))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(20261125)
    tokens = byte_symbols()
    seen = set(tokens)
    merges = []
    # Merge an existing token with a byte symbol: words grow a byte at a time, like real BPE
    # vocabularies, and short tokens are favoured so the lengths stay realistic.
    while len(tokens) < BASE:
        a = tokens[int(len(tokens) * rng.random() ** 3)]
        b = tokens[rng.randrange(256)]
        if a + b in seen or len(a + b) > 16:
            continue
        merges.append([a, b])
        tokens.append(a + b)
        seen.add(a + b)
    vocab = {t: i for i, t in enumerate(tokens)}
    added = [{"id": i, "content": special_name(i), "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i in range(BASE, VOCAB)]
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 128000, "eos_token_id": [128001, 128009]}, f, indent=2)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                   "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"},
                  f, indent=2)


if __name__ == "__main__":
    main()

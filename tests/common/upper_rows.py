"""tests/common/upper_rows.py — the demo model's `upper` adapter with trainable-token rows,
as PEFT saves them (a bf16 trainable_tokens_delta of the embedding beside the LoRA), for the
registry's shell tests over HTTP (tests/registry/tokens.sh, vocab.sh)."""
import json
import struct


def read(path):
    """A safetensors file's header (dict) and data bytes."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def embedding(demo):
    """The demo model's embedding: (vocab, hidden, its bf16 bytes row by row)."""
    h, data = read(demo + "/model.safetensors")
    e = h["model.embed_tokens.weight"]
    vocab, hidden = e["shape"]
    return vocab, hidden, data[e["data_offsets"][0]:e["data_offsets"][1]]


def with_rows(demo, rows, ids):
    """upper's safetensors with the bf16 rows (len(ids) of them) appended as the embedding's
    trainable-token delta, and upper's config with trainable_token_indices = ids."""
    up = demo + "/adapters/upper"
    h, data = read(up + "/adapter_model.safetensors")
    h.pop("__metadata__", None)
    h["base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"] = {
        "dtype": "BF16", "shape": [len(ids), len(rows) // (2 * len(ids))],
        "data_offsets": [len(data), len(data) + len(rows)]}
    head = json.dumps(h).encode()
    head += b" " * (-len(head) % 8)
    cfg = json.load(open(up + "/adapter_config.json"))
    cfg["trainable_token_indices"] = list(ids)
    return struct.pack("<Q", len(head)) + head + data + bytes(rows), cfg

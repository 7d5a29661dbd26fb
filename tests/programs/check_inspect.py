#!/usr/bin/env python3
"""infer-inspect as a user runs it: the default model's tensor table against gguf-py's, a file with
tensors of the block types the default model does not use, and bad input.

usage: check_inspect.py BIN_DIR MODEL FIXTURES_DIR"""
import json
import os
import struct
import subprocess
import sys

from harness import check, finish
import tempfile

bin_dir, model, fixtures = sys.argv[1:4]
exe = os.path.join(bin_dir, "infer-inspect")
def run(*args):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


# --json: one document; every tensor with the type, shape and size gguf-py reads
r = run(model, "--json")
check(r.returncode == 0, f"--json exits 0 (got {r.returncode}: {r.stderr})")
doc = json.loads(r.stdout)
ref = json.load(open(os.path.join(fixtures, "smollm2", "tensor_table.json")))
check(doc["format"] == "gguf" and doc["version"] == ref["version"], "format gguf, version 3")
check(doc["architecture"] == "llama", "architecture llama")
check(len(doc["tensors"]) == len(ref["tensors"]) == 272, f"272 tensors (got {len(doc['tensors'])})")
for mine, theirs in zip(doc["tensors"], ref["tensors"]):
    same = (mine["name"] == theirs["name"] and mine["type"].upper() == theirs["type"]
            and mine["shape"] == theirs["shape"] and mine["bytes"] == theirs["bytes"])
    check(same, f"tensor {theirs} listed as {mine}")
cfg = doc["config"]
check(cfg["num_layers"] == "30" and cfg["hidden_size"] == "576" and cfg["num_kv_heads"] == "3",
      f"config from metadata: {cfg}")
check(doc["metadata"]["tokenizer.ggml.tokens"]["value"]["count"] == 49152, "long arrays abbreviated with their count")
check(doc["metadata"]["llama.rope.freq_base"] == {"type": "f32", "value": 100000.0}, "typed metadata values")

# text: a line per tensor with its type and shape
r = run(model)
check(r.returncode == 0, "text mode exits 0")
lines = r.stdout.splitlines()
for t in ref["tensors"]:
    shape = "[" + ", ".join(str(d) for d in t["shape"]) + "]"
    row = [ln for ln in lines if ln.split()[:1] == [t["name"]]]
    check(len(row) == 1 and t["type"].lower() in row[0] and shape in row[0] and str(t["bytes"]) in row[0],
          f"text row for {t['name']}: {row}")


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf(path, metadata, tensors):
    """A GGUF v3 file: metadata {key: (value type id, struct format, value)}, tensors [(name, ggml type id,
    shape fastest first, data bytes)]; data aligned to 32 bytes."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, (vtype, fmt, value) in metadata.items():
        out += gguf_string(key) + struct.pack("<I", vtype)
        out += gguf_string(value) if vtype == 8 else struct.pack("<" + fmt, value)
    data, offsets = b"", []
    for name, ggml_type, shape, blob in tensors:
        offsets.append(len(data))
        data += blob + b"\0" * (-len(blob) % 32)
    for (name, ggml_type, shape, blob), offset in zip(tensors, offsets):
        out += gguf_string(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
        out += struct.pack("<IQ", ggml_type, offset)
    out += b"\0" * (-len(out) % 32)
    with open(path, "wb") as f:
        f.write(out + data)


# A tiny llama file with tensors of Q5_0, Q5_1, IQ4_NL and IQ4_XS (ids and block sizes from gguf-py's
# GGMLQuantizationType and GGML_QUANT_SIZES): each listed by its name, with the bytes its shape takes.
blocks = {"q5_0": (6, 32, 22), "q5_1": (7, 32, 24), "iq4_nl": (20, 32, 18), "iq4_xs": (23, 256, 136)}
u32 = lambda v: (4, "I", v)
meta = {"general.architecture": (8, None, "llama"), "llama.block_count": u32(1), "llama.context_length": u32(64),
        "llama.embedding_length": u32(256), "llama.feed_forward_length": u32(512),
        "llama.attention.head_count": u32(4), "llama.attention.layer_norm_rms_epsilon": (6, "f", 1e-5),
        "llama.vocab_size": u32(32)}
tensors = [(f"w.{name}", ggml_id, [2 * elems, 3], bytes(6 * nbytes)) for name, (ggml_id, elems, nbytes) in blocks.items()]
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "blocks.gguf")
    write_gguf(path, meta, tensors)
    r = run(path, "--json")
    check(r.returncode == 0, f"block types file: --json exits 0 (got {r.returncode}: {r.stderr})")
    if r.returncode == 0:
        listed = {t["name"]: t for t in json.loads(r.stdout)["tensors"]}
        for name, (ggml_id, elems, nbytes) in blocks.items():
            t = listed.get(f"w.{name}")
            check(t is not None and t["type"] == name and t["shape"] == [2 * elems, 3] and t["bytes"] == 6 * nbytes,
                  f"{name} tensor listed with its type and {6 * nbytes} bytes: {t}")
    r = run(path)
    rows = {ln.split()[0]: ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith("  w.")}
    for name, (ggml_id, elems, nbytes) in blocks.items():
        check(rows.get(f"w.{name}") == [name, f"[{2 * elems},", "3]", str(6 * nbytes)],
              f"text row for the {name} tensor: {rows.get(f'w.{name}')}")

# bad input: a typed error naming the problem, exit 1, nothing on stdout
with tempfile.TemporaryDirectory() as tmp:
    truncated = os.path.join(tmp, "cut.gguf")
    with open(model, "rb") as src, open(truncated, "wb") as dst:
        dst.write(src.read(4096))
    r = run(truncated)
    check(r.returncode == 1 and "format error" in r.stderr and "cut.gguf" in r.stderr and not r.stdout,
          f"truncated GGUF: {r.returncode} {r.stderr!r}")
    garbage = os.path.join(tmp, "garbage.bin")
    open(garbage, "wb").write(b"\x01" * 64)
    r = run(garbage)
    check(r.returncode == 1 and "error" in r.stderr and not r.stdout, f"not a model file: {r.stderr!r}")
    r = run(os.path.join(tmp, "missing.gguf"))
    check(r.returncode == 1 and "missing.gguf" in r.stderr, f"missing file: {r.stderr!r}")

finish()

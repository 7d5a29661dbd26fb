#!/usr/bin/env python3
"""Write the reference data that infer's tests compare against (committed under tests/fixtures/).

What it writes, and from what:
  smollm2/tokenizer.json        HF `transformers` converted from the GGUF's tokenizer.ggml.* metadata
  smollm2/encode_reference.json  token ids for tokenizer/corpus.json from that HF tokenizer
  smollm2/chat_reference.json    HF apply_chat_template output with the GGUF's own template
  tokenizer/pretokenize_reference.json  HF `tokenizers` Split() of the corpus by the GPT-2, Llama-3
                                 and Qwen2 pre-tokenizer regexes (what infer's PCRE2 patterns must match)
  smollm2/tensor_table.json     every tensor's name, type, shape (GGUF order) and byte size, read by `gguf`
  smollm2/dequant_reference.json values of a few of the model's tensors, dequantized by `gguf` (llama.cpp's)
  quant/random_blocks.json       random blocks of every supported GGUF type and their `gguf` dequantization

Needs: gguf, numpy, tokenizers, transformers 4.4x, jinja2 (all from PyPI). transformers refuses GGUF
without torch even for the tokenizer, which reads metadata only: with --no-torch we lift that check.
Usage: python3 scripts/make_references.py models/SmolLM2-135M-Instruct.Q4_1.gguf [--no-torch]
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
model_path = os.path.abspath(sys.argv[1])

if "--no-torch" in sys.argv:
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    gguf_utils.is_torch_available = lambda: True

from transformers import AutoTokenizer
from tokenizers import Regex, pre_tokenizers


def dump(rel, obj):
    path = os.path.join(root, rel)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", os.path.relpath(path))


corpus = json.load(open(os.path.join(root, "tokenizer", "corpus.json"), encoding="utf-8"))

# --- tokenizer ------------------------------------------------------------------------------------
tok = AutoTokenizer.from_pretrained(os.path.dirname(model_path), gguf_file=os.path.basename(model_path))
tok.backend_tokenizer.save(os.path.join(root, "smollm2", "tokenizer.json"), pretty=False)
print("wrote tests/fixtures/smollm2/tokenizer.json")
dump("smollm2/encode_reference.json", {
    "source": f"transformers {__import__('transformers').__version__} AutoTokenizer(gguf_file), "
              "add_special_tokens=False (the GGUF says add_bos_token=false)",
    "cases": [{"text": t, "ids": tok(t, add_special_tokens=False)["input_ids"]} for t in corpus],
})

conversations = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye 👋"}],
]
dump("smollm2/chat_reference.json", {
    "template": tok.chat_template,
    "cases": [{"messages": c, "add_generation_prompt": g,
               "text": tok.apply_chat_template(c, tokenize=False, add_generation_prompt=g)}
              for c in conversations for g in (True, False)],
})

# The pre-tokenizer regexes as the HF tokenizer.json files of these model families write them.
patterns = {
    "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
splits = {}
for name, pat in patterns.items():
    pre = pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False)
    splits[name] = {"pattern": pat, "cases": [{"text": t, "pieces": [p for p, _ in pre.pre_tokenize_str(t)]}
                                              for t in corpus]}
dump("tokenizer/pretokenize_reference.json", splits)

# --- tensors of the model -------------------------------------------------------------------------
reader = gguf.GGUFReader(model_path)
dump("smollm2/tensor_table.json", {
    "source": "gguf-py GGUFReader", "version": int(reader.fields["GGUF.version"].contents()),
    "tensors": [{"name": t.name, "type": t.tensor_type.name, "shape": [int(x) for x in t.shape],
                 "bytes": int(t.n_bytes)} for t in reader.tensors]})
wanted = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight", "blk.29.ffn_down.weight",
          "output_norm.weight"]
tensors = []
for t in reader.tensors:
    if t.name not in wanted:
        continue
    values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
    rng = np.random.default_rng(len(tensors))
    idx = sorted(set(rng.integers(0, values.size, 48).tolist()))
    tensors.append({"name": t.name, "type": t.tensor_type.name, "shape": [int(x) for x in t.shape],
                    "head": values[:32].tolist(), "indices": idx, "values": values[idx].tolist(),
                    "sum": float(values.sum()), "sum_abs": float(np.abs(values).sum())})
dump("smollm2/dequant_reference.json", {"source": "gguf-py dequantize", "tensors": tensors})

# --- random blocks of every type --------------------------------------------------------------------
rng = np.random.default_rng(1234)
blocks = []
# New types go at the end of the list: the generator then draws the earlier types' blocks as before.
for qt in [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K, T.Q6_K, T.Q5_0, T.Q5_1, T.IQ4_NL, T.IQ4_XS]:
    elems, nbytes = gguf.GGML_QUANT_SIZES[qt]
    n_blocks = 3 if elems > 1 else 40
    raw = rng.integers(0, 256, size=n_blocks * nbytes, dtype=np.uint8)
    if qt in (T.F32, T.F16, T.BF16):
        vals = rng.standard_normal(n_blocks).astype(np.float32)
        raw = {T.F32: vals, T.F16: vals.astype(np.float16),
               T.BF16: (vals.view(np.uint32) >> 16).astype(np.uint16)}[qt].view(np.uint8)
    else:
        # Keep the f16 scales finite and modest: random bits would give inf/NaN scales.
        # (IQ4_XS's other u16, at 2, holds scale bits: any value is valid.)
        scale_offsets = {T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
                         T.Q6_K: [208], T.Q5_0: [0], T.Q5_1: [0, 2], T.IQ4_NL: [0], T.IQ4_XS: [0]}[qt]
        for b in range(n_blocks):
            for off in scale_offsets:
                h = np.array([rng.uniform(-0.05, 0.05)], dtype=np.float16).view(np.uint8)
                raw[b * nbytes + off: b * nbytes + off + 2] = h
    values = gguf.quants.dequantize(raw, qt).astype(np.float64).reshape(-1)
    blocks.append({"type": qt.name, "hex": raw.tobytes().hex(), "values": values.tolist()})
dump("quant/random_blocks.json", {"source": "gguf-py dequantize", "cases": blocks})

#!/usr/bin/env python3
"""Reference generations from HF transformers (torch), committed under tests/fixtures/, that infer's decoder
must reproduce. Run where torch and transformers are installed (the GPU machine has both; `gguf` travels as
a wheel). Runs on the CPU in float32 so no TF32 or reduced-precision GEMM blurs the reference.

What it writes:
  tiny_llama/{config.json, model.safetensors, reference.json}   random Llama (GQA, Llama-3 RoPE scaling)
  tiny_qwen2/{config.json, model.safetensors, reference.json}   random Qwen2 (q/k/v biases)
  smollm2/generate_reference.json   greedy continuations of SmolLM2-135M-Instruct Q4_1 (dequantized by
                                    transformers) for varied prompts
Each reference holds prompt ids, greedy output ids and the logits of the first generated position.

usage: make_model_references.py MODEL.gguf [--new-tokens 64]
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

torch.set_num_threads(os.cpu_count() or 4)
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
model_path = os.path.abspath(sys.argv[1])
new_tokens = int(sys.argv[sys.argv.index("--new-tokens") + 1]) if "--new-tokens" in sys.argv else 64


def dump(rel, obj):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", os.path.relpath(path, os.path.join(root, "..", "..")), flush=True)


@torch.no_grad()
def greedy(model, prompt_ids, n):
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         num_beams=1, output_logits=True, return_dict_in_generate=True,
                         pad_token_id=0, eos_token_id=None)
    tokens = out.sequences[0, len(prompt_ids):].tolist()
    first_logits = out.logits[0][0].float()
    return tokens, first_logits


def tiny(kind, config, prompts):
    torch.manual_seed(1234)
    model = (LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM)(config).float().eval()
    # Wide weights make the logits peaked, so greedy choices are far from ties and the comparison is sharp.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5 if p.dim() > 1 else 0.1)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    folder = os.path.join(root, f"tiny_{kind}")
    model.save_pretrained(folder, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(folder, extra)):
            os.remove(os.path.join(folder, extra))
    cases = []
    for ids in prompts:
        tokens, logits = greedy(model, ids, 24)
        cases.append({"prompt_ids": ids, "greedy_ids": tokens, "first_logits": logits.tolist()})
    dump(f"tiny_{kind}/reference.json", {"source": f"transformers {__import__('transformers').__version__}, "
                                         f"torch {torch.__version__}, float32 CPU", "cases": cases})


prompts = [[1, 5, 17, 42, 99, 3], [7], [200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212, 213,
                                         214, 215, 216, 217, 218, 219, 220, 221, 222, 223, 224, 225, 226, 227, 228,
                                         229, 230, 231, 232, 233, 234, 235, 236, 237]]
tiny("llama", LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                          bos_token_id=1, eos_token_id=2), prompts)
tiny("qwen2", Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                          use_sliding_window=False, bos_token_id=1, eos_token_id=2), prompts)

# --- SmolLM2 from its GGUF -----------------------------------------------------------------------------
folder, name = os.path.dirname(model_path), os.path.basename(model_path)
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
texts = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "机器学习是",
    "1, 2, 3, 4, 5,",
]
chats = [[{"role": "user", "content": "What is the tallest mountain in the world?"}],
         [{"role": "user", "content": "Write a haiku about the sea."}]]
cases = []
for t in texts:
    cases.append({"kind": "text", "text": t, "prompt_ids": tok(t, add_special_tokens=False)["input_ids"]})
for c in chats:
    text = tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
    cases.append({"kind": "chat", "messages": c, "text": text,
                  "prompt_ids": tok(text, add_special_tokens=False)["input_ids"]})
for case in cases:
    tokens, logits = greedy(model, case["prompt_ids"], new_tokens)
    top = torch.topk(logits, 20)
    case["greedy_ids"] = tokens
    case["greedy_text"] = tok.decode(tokens)
    case["first_top_ids"] = top.indices.tolist()
    case["first_top_logits"] = top.values.tolist()
    print(repr(case["text"][:40]), "->", repr(case["greedy_text"][:60]), flush=True)
dump("smollm2/generate_reference.json", {
    "source": f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
              "float32 CPU, GGUF dequantized by transformers, greedy (do_sample=False), EOS ignored",
    "new_tokens": new_tokens, "cases": cases})

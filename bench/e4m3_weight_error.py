#!/usr/bin/env python3
"""How much of an FP8 (e4m3) weight's error the scale's granularity decides, on a GGUF model's weights.

  python3 bench/e4m3_weight_error.py models/SmolLM2-135M-Instruct.Q4_1.gguf      (needs numpy and gguf-py)

Every 2-D weight but the embedding is dequantized (gguf-py), scaled so that its group's max is e4m3's 448,
rounded to the nearest e4m3 value (3 mantissa bits, subnormals below 2^-6) and scaled back; printed is the
mean over the tensors of ||w_e4m3 - w|| / ||w|| for one scale per tensor, per output row (what infer::Fp8
does), per 1 x 128 group and per 128 x 128 block (DeepSeek's FP8 checkpoints) where the shape allows.
Why: if the error were the scale's, finer scales would shrink it; if it is the mantissa's, they cannot."""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def e4m3(v):
    a = np.abs(v)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 1e-30))), -6)  # below 2^-6: subnormal, fixed step 2^-9
    step = 2.0 ** (e - 3)
    return np.sign(v) * np.minimum(np.round(a / step) * step, 448.0)


def rel_error(w, amax):
    s = np.where(amax > 0, amax / 448.0, 1.0)
    return float(np.linalg.norm(e4m3(w / s) * s - w) / np.linalg.norm(w))


def main():
    reader = GGUFReader(sys.argv[1])
    errors = {"per tensor": [], "per output row": [], "per 1 x 128": [], "per row, same": [], "per 128 x 128": []}
    for t in reader.tensors:
        if len(t.shape) != 2 or "token_embd" in t.name:
            continue
        out, inn = int(t.shape[1]), int(t.shape[0])
        w = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(out, inn)
        errors["per tensor"].append(rel_error(w, np.abs(w).max()))
        errors["per output row"].append(rel_error(w, np.abs(w).max(1, keepdims=True)))
        if inn % 128 == 0:
            g = w.reshape(out, inn // 128, 128)
            errors["per 1 x 128"].append(rel_error(g, np.abs(g).max(2, keepdims=True)))
            errors["per row, same"].append(errors["per output row"][-1])  # the same tensors, per row
            if out % 128 == 0:
                b = w.reshape(out // 128, 128, inn // 128, 128)
                errors["per 128 x 128"].append(rel_error(b, np.abs(b).max((1, 3), keepdims=True)))
    for k, v in errors.items():
        print(f"{k:>16}: {len(v):>3} tensors" + (f", mean relative error {np.mean(v):.4f}" if v else " (no shape allows it)"))


if __name__ == "__main__":
    main()

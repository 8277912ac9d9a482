#!/usr/bin/env python3
"""Fixture for the end-to-end GPTQ benchmark (issue 6): a randomly initialised Llama (or Qwen3-MoE) model
written by transformers (never committed), and a pre-tokenized calibration file of variable-length samples.

    python3 bench/make_random_llama.py OUT_DIR --shape llama3-8b --calib calib.jsonl

The weights come from transformers' own initialisation (normal, std = initializer_range) on the GPU
when there is one; the calibration samples are uniform random token ids, lengths uniform in
[min_len, max_len], one JSON array per line (marlinc's `--calib-format tokens`). Both are seeded.
"""
import argparse
import json
import random
import time

import torch
import transformers

SHAPES = {
    # Llama-3-8B dimensions (hidden 4096, 32 blocks, GQA 32/8, MLP 14336, vocab 128256).
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
                      max_position_embeddings=8192, bos_token_id=128000, eos_token_id=128001),
    # The same block shapes, 2 blocks: for a quick check of the script itself.
    "llama3-8b-2": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
                        max_position_embeddings=8192, bos_token_id=128000, eos_token_id=128001),
    # Qwen3-30B-A3B's block shapes (128 experts of 768, top-8 renormalised, GQA 32/4 with head_dim 128), 2 blocks:
    # the MoE calibration path at a real model's expert count.
    "qwen3-30b-a3b-2": dict(config="Qwen3MoeConfig", model="Qwen3MoeForCausalLM", hidden_size=2048,
                            intermediate_size=6144, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=4,
                            head_dim=128, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                            norm_topk_prob=True, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
                            max_position_embeddings=32768, bos_token_id=151643, eos_token_id=151645),
    # Mixtral-8x7B's block shapes (8 experts of 14336, top-2, GQA 32/8), 2 blocks: few, wide experts.
    "mixtral-8x7b-2": dict(config="MixtralConfig", model="MixtralForCausalLM", hidden_size=4096,
                           intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
                           num_local_experts=8, num_experts_per_tok=2, vocab_size=32000, rope_theta=1000000.0,
                           rms_norm_eps=1e-5, max_position_embeddings=32768, bos_token_id=1, eos_token_id=2),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--calib", help="also write this pre-tokenized JSONL")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--min-len", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=1536)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    t0 = time.time()
    dims = dict(SHAPES[a.shape])
    cfg_cls, model_cls = dims.pop("config", "LlamaConfig"), dims.pop("model", "LlamaForCausalLM")
    cfg = getattr(transformers, cfg_cls)(tie_word_embeddings=False, **dims)
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(a.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = getattr(transformers, model_cls)(cfg)
    model.save_pretrained(a.out, safe_serialization=True, max_shard_size="5GB")
    print(f"model: {a.shape} {a.dtype} written to {a.out} in {time.time() - t0:.1f} s")

    if a.calib:
        rng = random.Random(a.seed)
        tokens = 0
        with open(a.calib, "w") as f:
            for _ in range(a.samples):
                n = rng.randint(a.min_len, a.max_len)
                ids = [dims["bos_token_id"]] + [rng.randrange(dims["vocab_size"] - 256) for _ in range(n - 1)]
                tokens += n
                f.write(json.dumps(ids) + "\n")
        print(f"calibration: {a.samples} samples, {tokens} tokens in {a.calib}")


if __name__ == "__main__":
    main()

"""Writes the built-in sample checkpoint (data/sample/model) with Hugging Face transformers.

A randomly initialised Llama-architecture model whose every linear layer has Marlin-friendly shapes
(k % 128 == 0 and n % 256 == 0), so the whole pipeline (quantize, pack, verify) runs on it in
seconds. Run once on a machine with torch + transformers (the GPU machine has them):

    python3 data/sample/make_sample.py data/sample/model
"""
import json
import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 20261122


def main(out_dir: str) -> None:
    torch.manual_seed(SEED)
    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=256,          # q/k/v/o: k = n = 256
        intermediate_size=768,    # gate/up: 256 -> 768, down: 768 -> 256
        num_hidden_layers=2,
        num_attention_heads=4,    # head_dim 64
        num_key_value_heads=4,    # no GQA: k/v keep n = 256 (n % 256 == 0)
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,  # a separate lm_head, which quantizers must leave alone
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(cfg).to(torch.float16).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    # Record provenance beside the weights.
    with open(f"{out_dir}/PROVENANCE.json", "w") as f:
        json.dump({"script": "data/sample/make_sample.py", "seed": SEED,
                   "transformers": transformers.__version__, "torch": torch.__version__,
                   "dtype": "float16", "init": "transformers default (normal, std=initializer_range)"},
                  f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/sample/model")

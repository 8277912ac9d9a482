#!/usr/bin/env python3
"""Golden forward outputs of transformers for tiny random models of each architecture the calibration
forward pass supports (quantizer/calib/llama.h): Llama 3 (llama3 RoPE scaling, GQA), Mistral (a sliding
window shorter than the sequence), Qwen2 (q/k/v biases) and Qwen3 (per-head q/k RMSNorm, head_dim !=
hidden / heads, tied embeddings). tests/calib/test_forward_arch.cpp checks marlinc's CPU forward against
them, tests/gpu/test_forward_cuda.cpp its GPU forward ([gpu][forward]).

Needs torch and transformers (the GPU machine has both); the outputs are committed, so the tests never
need Python. Each model is written in fp16 (small files) and run by transformers in fp32 after reloading
those fp16 weights, so the golden logits belong to exactly the stored weights.

    python3 tests/calib/make_arch_golden.py OUT_DIR
"""
import json
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, rms_norm_eps=1e-5,
              initializer_range=0.15, hidden_act="silu")

MODELS = {
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               dict(rope_theta=500000.0, tie_word_embeddings=False,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_max_position_embeddings=64))),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(rope_theta=10000.0, sliding_window=8, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(rope_theta=1000000.0, head_dim=32, use_sliding_window=False, tie_word_embeddings=True,
                   attention_bias=False)),
}
SEQ_LENS = (24, 7)


def main(out_root: Path) -> None:
    torch.manual_seed(1234)
    for name, (cfg_cls, model_cls, extra) in MODELS.items():
        cfg = getattr(transformers, cfg_cls)(**COMMON, **extra)
        model = getattr(transformers, model_cls)(cfg).eval()
        with torch.no_grad():
            # Norm weights and biases start at 1 and 0; perturb them so that the test sees them.
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                elif pname.endswith(".bias"):
                    p.copy_(0.3 * torch.randn_like(p))
        out = out_root / name
        model.half().save_pretrained(out, safe_serialization=True)
        model = getattr(transformers, model_cls).from_pretrained(out, torch_dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
        golden = {}
        for s, T in enumerate(SEQ_LENS):
            tokens = torch.randint(0, cfg.vocab_size, (1, T))
            with torch.no_grad():
                r = model(tokens, output_hidden_states=True)
            golden[f"seq{s}.tokens"] = tokens[0].to(torch.int32).contiguous()
            golden[f"seq{s}.logits"] = r.logits[0].float().contiguous()
            golden[f"seq{s}.hidden_layer0"] = r.hidden_states[1][0].float().contiguous()
        save_file(golden, str(out / "golden.safetensors"),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__})
        (out / "generation_config.json").unlink(missing_ok=True)
        print(name, json.load(open(out / "config.json"))["architectures"], "transformers", transformers.__version__)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

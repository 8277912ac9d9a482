#!/usr/bin/env python3
"""Golden forward outputs of transformers for tiny random models of each architecture the calibration
forward pass supports (quantizer/calib/llama.h): Llama 3 (llama3 RoPE scaling, GQA), Mistral (a sliding
window shorter than the sequence), Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm, head_dim !=
hidden / heads, tied embeddings), Gemma 1/2/3 (text) and Phi-3/Phi-4 (fused qkv_proj / gate_up_proj; phi3:
partial rotary, LongRoPE with an original length between the two sequences' lengths so that one takes the
short factors and the other the long ones, a sliding window; phi4: plain RoPE, tied embeddings, MQA) and
Granite 3 (embedding, residual, attention and logit multipliers, biases on every linear), SmolLM3 (a layer
without RoPE) and the mixture-of-experts Mixtral, Qwen2-MoE (a shared expert, a dense layer) and Qwen3-MoE.
tests/calib/test_forward_arch.cpp and test_forward_moe.cpp check marlinc's CPU forward against them,
tests/gpu/test_forward_cuda.cpp its GPU forward ([gpu][forward]; the dense ones).

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

# Phi3Config's token ids default to Phi-3's 32000-token vocabulary.
PHI = dict(pad_token_id=None, bos_token_id=1, eos_token_id=2)

GEMMA = dict(head_dim=32, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
             tie_word_embeddings=True)

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
    # Gemma: (1 + w) RMSNorm, embeddings times sqrt(hidden), GeGLU (tanh gelu), head_dim != hidden / heads, MQA.
    "gemma": ("GemmaConfig", "GemmaForCausalLM",
              dict(GEMMA, num_key_value_heads=1, rope_theta=10000.0)),
    # Gemma 2: four norms per block, query_pre_attn_scalar, attention and final logit soft-caps small enough
    # to bite at these weights' scale, sliding window on even layers.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(GEMMA, rope_theta=10000.0, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                    final_logit_softcapping=3.0, sliding_window=8)),
    # Gemma 3 (text): Gemma 2's block with (1 + w) q/k norms, no soft-caps, an explicit non-periodic layer
    # pattern, local RoPE base for sliding layers and linear scaling on the global ones.
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(GEMMA, num_hidden_layers=3, query_pre_attn_scalar=24, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    # Phi-3.5 / Phi-4-mini style: head_dim 16, rotary over its first 8 dims, longrope factors for 4
    # frequencies, original length 16 (seq0 = 24 tokens takes the long factors, seq1 = 7 the short ones),
    # attention factor from max / original = 16; a window of 8 on every layer.
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(PHI, rope_theta=10000.0, sliding_window=8, tie_word_embeddings=False, partial_rotary_factor=0.5,
                  original_max_position_embeddings=16,
                  rope_scaling=dict(type="longrope", short_factor=[1.0, 1.25, 1.6, 2.2],
                                    long_factor=[1.0, 2.0, 4.5, 9.0]))),
    # Phi-4 style: plain RoPE over the whole head, tied embeddings (as Phi-4-mini), one KV head.
    "phi4": ("Phi3Config", "Phi3ForCausalLM",
             dict(PHI, rope_theta=250000.0, tie_word_embeddings=True, num_key_value_heads=1)),
    # Granite 3: the four multipliers away from 1 (attention_multiplier instead of head_dim^-1/2), and
    # biases on q/k/v/o and the MLP so that the residual multiplier is seen to scale them too.
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(PHI, rope_theta=10000.0, tie_word_embeddings=True, embedding_multiplier=6.0,
                     residual_multiplier=0.4, attention_multiplier=0.1, logits_scaling=4.0, attention_bias=True,
                     mlp_bias=True)),
    # SmolLM3: the middle one of three layers attends without RoPE (no_rope_layers 0).
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM",
                dict(PHI, num_hidden_layers=3, rope_theta=50000.0, tie_word_embeddings=True, no_rope_layers=[1, 0, 1],
                     use_sliding_window=False)),
    # Mixtral: 4 experts, top-2 with the top weights renormalised; the experts' size is intermediate_size.
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(PHI, rope_theta=1000000.0, num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
                     sliding_window=None, tie_word_embeddings=False)),
    # Qwen2-MoE: 4 routed experts (top-2, weights not renormalised) plus a shared expert behind a sigmoid
    # gate, q/k/v biases; layer 1 is dense (mlp_only_layers) with the dense intermediate_size.
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(rope_theta=1000000.0, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=64, norm_topk_prob=False, mlp_only_layers=[1],
                       decoder_sparse_step=1, use_sliding_window=False, tie_word_embeddings=False)),
    # Qwen3-MoE: 8 experts, top-2 renormalised (norm_topk_prob), per-head q/k norms, head_dim 32.
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(rope_theta=1000000.0, head_dim=32, num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
                       use_sliding_window=False, tie_word_embeddings=False, attention_bias=False)),
}
# What every Gemma entry shares on top of COMMON.
GEMMA_ROPE3 = dict(
    new=dict(rope_parameters={"full_attention": dict(rope_type="linear", factor=2.0, rope_theta=1000000.0),
                               "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}),
    old=dict(rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=dict(rope_type="linear", factor=2.0)))
SEQ_LENS = (24, 7)


def main(out_root: Path) -> None:
    # One stream for all models, in MODELS' order: models added at the end leave the earlier fixtures as
    # they were.
    torch.manual_seed(1234)
    for name, (cfg_cls, model_cls, extra) in MODELS.items():
        args = {**COMMON, **extra}
        if name == "gemma3":  # transformers 5 takes per-layer-type RoPE parameters; 4.x the older keys
            try:
                cfg = getattr(transformers, cfg_cls)(**args, **GEMMA_ROPE3["new"])
                assert cfg.rope_parameters["full_attention"]["factor"] == 2.0
            except Exception:
                cfg = getattr(transformers, cfg_cls)(**args, **GEMMA_ROPE3["old"])
        else:
            cfg = getattr(transformers, cfg_cls)(**args)
        model = getattr(transformers, model_cls)(cfg).eval()
        if name.startswith("phi"):  # what the config became in this transformers (printed for the record)
            rot = model.model.rotary_emb
            print(name, "rope", dict(cfg.rope_parameters), "inv_freq", rot.inv_freq.tolist(),
                  "attention_scaling", rot.attention_scaling)
        with torch.no_grad():
            # Norm weights and biases start at 1 and 0; perturb them so that the test sees them.
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):  # Gemma's norms scale by (1 + w): perturb around 0
                    p.copy_((0.0 if name.startswith("gemma") else 1.0) + 0.2 * torch.randn_like(p))
                elif pname.endswith(".bias"):
                    p.copy_(0.3 * torch.randn_like(p))
                elif "experts" in pname or pname.endswith("gate.weight"):
                    # MoE routers and experts: some start at zero or uninitialised (torch.empty); routers
                    # get a spread wide enough that no two experts tie for a token.
                    p.copy_((0.5 if pname.endswith("gate.weight") else 0.15) * torch.randn_like(p))
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
        if "moe" in name or name == "mixtral":  # the names save_pretrained wrote (per-expert, as on the Hub)
            from safetensors import safe_open
            with safe_open(str(out / "model.safetensors"), "pt") as f:
                print(name, sorted(k for k in f.keys() if "layers.0.mlp" in k or "layers.0.block_sparse" in k)[:8])
        print(name, json.load(open(out / "config.json"))["architectures"], "transformers", transformers.__version__)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

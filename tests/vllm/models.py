"""Tiny random-weight models with GatedDeltaNet layers, written to a local directory at test
time (no hub, no tokenizer): vLLM serves them with ``skip_tokenizer_init=True`` and token-id
prompts. One expert, top-1: with several, routing near-ties flip greedy tokens whatever the GDN
layers do. A_log and dt_bias are spread (transformers initialises them to constants), so that
every head decays at its own rate."""

import torch

VOCAB = 256


def _spread_gates(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                # A = exp(A_log) from 0.5 to 16, the range transformers draws it from
                p.copy_(torch.linspace(0.5, 16.0, p.numel()).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.linspace(-1.0, 1.0, p.numel()))


def qwen3_next(path, seed=0):
    """Qwen3-Next: three GatedDeltaNet layers and one full-attention layer, K = 4 conv taps,
    Hk = 2, Hv = 4, Dk = Dv = 64, a one-expert MoE in every layer; saved in bf16 to ``path``."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    config = Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=128, num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention",
                     "full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=1024, num_experts=1,
        num_experts_per_tok=1, moe_intermediate_size=128, shared_expert_intermediate_size=128,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config).eval()
    _spread_gates(model)
    model.to(torch.bfloat16).save_pretrained(path)
    return config


def qwen3_5(path, seed=0):
    """Qwen3.5 (dense, text only): three GatedDeltaNet layers and one full-attention layer, the
    same GDN shapes as ``qwen3_next``, [q | k | v | z] projections (no interleaving)."""
    from transformers.models.qwen3_5 import configuration_qwen3_5, modeling_qwen3_5
    config = configuration_qwen3_5.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=128, num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention",
                     "full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=1024,
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = modeling_qwen3_5.Qwen3_5ForCausalLM(config).eval()
    _spread_gates(model)
    model.to(torch.bfloat16).save_pretrained(path)
    return config


def qwen3_5_moe(path, seed=0):
    """Qwen3.5 MoE (text only): ``qwen3_5``'s layers and GDN shapes, each layer's MLP a one-expert
    MoE (top-1) beside a shared expert, as ``qwen3_next``'s."""
    from transformers.models.qwen3_5_moe import configuration_qwen3_5_moe, modeling_qwen3_5_moe
    config = configuration_qwen3_5_moe.Qwen3_5MoeTextConfig(
        vocab_size=VOCAB, hidden_size=128, num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention",
                     "full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=1024, num_experts=1,
        num_experts_per_tok=1, moe_intermediate_size=128, shared_expert_intermediate_size=128,
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = modeling_qwen3_5_moe.Qwen3_5MoeForCausalLM(config).eval()
    _spread_gates(model)
    model.to(torch.bfloat16).save_pretrained(path)
    return config

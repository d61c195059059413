"""Small transformers models with GatedDeltaNet layers and random weights (no download), for the
gdn.torch.patch tests: Qwen3-Next, Qwen3.5 and Qwen3.5-MoE (transformers 5.24), K = 4 conv taps
as in the released models, a vocabulary of 97 tokens."""

import pytest
import torch

VOCAB = 97
_LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
               linear_conv_kernel_dim=4)
_ATTENTION = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                  max_position_embeddings=256)


def qwen3_next(seed=0):
    """Four layers, three of them GatedDeltaNet; dense MLPs (MoE grouped matmuls have no
    float64)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    config = Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention",
                     "full_attention"],
        linear_value_head_dim=24, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[0, 1, 2, 3],
        **_LINEAR, **_ATTENTION)
    torch.manual_seed(seed)
    return Qwen3NextForCausalLM(config).eval()


def qwen3_5(seed=0):
    cfg = pytest.importorskip("transformers.models.qwen3_5.configuration_qwen3_5")
    mod = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    config = cfg.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"], linear_value_head_dim=16, **_LINEAR,
        **_ATTENTION)
    torch.manual_seed(seed)
    return mod.Qwen3_5ForCausalLM(config).eval()


def qwen3_5_moe(seed=0):
    """Every MLP a mixture of experts (float32 only: its grouped matmuls have no float64)."""
    cfg = pytest.importorskip("transformers.models.qwen3_5_moe.configuration_qwen3_5_moe")
    mod = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")
    config = cfg.Qwen3_5MoeTextConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"], linear_value_head_dim=16,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, **_LINEAR, **_ATTENTION)
    torch.manual_seed(seed)
    return mod.Qwen3_5MoeForCausalLM(config).eval()

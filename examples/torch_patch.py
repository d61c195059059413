# A transformers Qwen3-Next model (small, random weights) with its GDN layers on gdn's kernels.
import torch, transformers, gdn.torch

config = transformers.Qwen3NextConfig(
    vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
    num_attention_heads=2, num_key_value_heads=1, head_dim=64, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
    shared_expert_intermediate_size=64)
model = transformers.Qwen3NextForCausalLM(config).eval()
ids = torch.randint(0, 1000, (1, 200))
with torch.no_grad():
    want = model(ids).logits          # transformers' own functions

gdn.torch.patch(model)                # every GatedDeltaNet layer now runs on gdn
with torch.no_grad():
    got = model(ids).logits
    tokens = model.generate(ids, max_new_tokens=8, do_sample=False)
model.train()
model(ids, labels=ids).loss.backward()  # training: gdn's backward
print("logits error", float((got - want).norm() / want.norm()), "generated", tokens.shape)

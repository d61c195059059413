"""gdn.jax.nn's GatedDeltaNet block against transformers' Qwen3NextGatedDeltaNet on the same
weights: random weights in HF's layout written to a .safetensors file, loaded by
load_hf_params, then the block's output and every gradient (float32) against transformers'
layer run in float64; continuing from returned states, and decode through the serving step,
against the full-sequence forward."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from gdn.jax import nn  # noqa: E402
from conftest import assert_close  # noqa: E402

TOL = 1e-4
PREFIX = "model.layers.0.linear_attn."


def _hf_layer():
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet
    config = Qwen3NextConfig(hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=16, linear_value_head_dim=8,
                             linear_conv_kernel_dim=4, num_hidden_layers=1,
                             layer_types=["linear_attention"])
    torch.manual_seed(0)
    layer = Qwen3NextGatedDeltaNet(config, layer_idx=0).double()
    with torch.no_grad():  # moderate gates: transformers' float64 chunked function is the truth
        layer.A_log.copy_(torch.linspace(-1.0, 0.5, 4))
        layer.dt_bias.copy_(torch.randn(4) * 0.5)
        layer.norm.weight.copy_(1 + 0.1 * torch.randn(8))
        for p in (layer.in_proj_qkvz.weight, layer.in_proj_ba.weight, layer.out_proj.weight):
            p.copy_(torch.randn_like(p) * 0.15)
    return config, layer


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    config, layer = _hf_layer()
    path = str(tmp_path_factory.mktemp("weights") / "model.safetensors")
    tensors = {PREFIX + n: p.detach().float().numpy() for n, p in layer.named_parameters()}
    tensors["model.embed_tokens.weight"] = np.zeros((3, 64), np.float32)  # not the block's
    safetensors_numpy.save_file(tensors, path)
    cfg = nn.GatedDeltaNetConfig.from_hf(config)
    return config, layer, cfg, nn.load_hf_params(path, cfg, prefix=PREFIX), path


def _x(batch=2, tokens=37, seed=1):
    return np.random.default_rng(seed).standard_normal((batch, tokens, 64)).astype(np.float32)


def test_loaded_params_have_hf_names_and_values(hf):
    _, layer, cfg, params, _ = hf
    assert set(params) == set(nn.PARAM_NAMES) == {n for n, _ in layer.named_parameters()}
    for name, p in layer.named_parameters():
        np.testing.assert_array_equal(np.asarray(params[name]), p.detach().float().numpy())
    assert cfg.param_shapes() == {n: tuple(p.shape) for n, p in layer.named_parameters()}


def test_block_output_and_gradients_match_transformers_in_float64(hf):
    _, layer, cfg, params, _ = hf
    x = _x()
    w = np.random.default_rng(2).standard_normal((2, 37, 64))

    def loss(p, xx):
        return jnp.sum(nn.gated_delta_net(p, xx, cfg) * w.astype(np.float32))

    y = nn.gated_delta_net(params, jnp.asarray(x), cfg)
    grads, dx = jax.grad(loss, argnums=(0, 1))(params, jnp.asarray(x))
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    layer.zero_grad()
    yt = layer(xt)
    (yt * torch.tensor(w)).sum().backward()
    assert_close(y, yt, TOL, "y")
    assert_close(dx, xt.grad, TOL, "d x")
    for name, p in layer.named_parameters():
        assert_close(grads[name], p.grad, TOL, "d " + name)


def test_continuing_from_returned_states_equals_one_call(hf):
    _, _, cfg, params, _ = hf
    x = jnp.asarray(_x(tokens=30))
    whole = nn.gated_delta_net(params, x, cfg)
    y1, (conv, rec) = nn.gated_delta_net(params, x[:, :17], cfg, return_state=True)
    y2 = nn.gated_delta_net(params, x[:, 17:], cfg, conv_state=conv, recurrent_state=rec)
    assert_close(jnp.concatenate([y1, y2], axis=1), whole, 1e-5, "prefill + continuation")


def test_decode_through_the_serving_step_equals_the_full_sequence(hf):
    _, _, cfg, params, _ = hf
    x = jnp.asarray(_x(batch=2, tokens=16))
    whole = nn.gated_delta_net(params, x, cfg)
    slots = jnp.array([3, 1], jnp.int32)  # slot 0 is the null slot
    conv_pool = jnp.zeros((4, cfg.conv_kernel_size - 1, cfg.conv_dim), jnp.float32)
    rec_pool = jnp.zeros((4, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim), jnp.float32)
    # a prefill of 12 tokens for both sequences, then 4 one-token decodes
    prompt = x[:, :12].reshape(24, 64)
    (conv_pool, rec_pool), y = nn.gated_delta_net_step(
        params, prompt, cfg, conv_pool, rec_pool, jnp.array([0, 12, 24], jnp.int32), slots,
        jnp.array([0, 2, 2], jnp.int32), jnp.array([12, 12], jnp.int32))
    outs = [y.reshape(2, 12, 64)]
    for t in range(12, 16):
        (conv_pool, rec_pool), y = nn.gated_delta_net_step(
            params, x[:, t], cfg, conv_pool, rec_pool, jnp.array([0, 1, 2], jnp.int32), slots,
            jnp.array([2, 2, 2], jnp.int32), jnp.array([t + 1, t + 1], jnp.int32))
        outs.append(y[:, None])
    assert_close(jnp.concatenate(outs, axis=1), whole, 1e-5, "prefill + 4 decode steps")


def test_bf16_checkpoint_loads(hf, tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    _, layer, cfg, params, _ = hf
    path = str(tmp_path / "bf16.safetensors")  # Qwen3-Next checkpoints ship in bf16
    safetensors_torch.save_file({PREFIX + n: p.detach().to(torch.bfloat16).contiguous()
                                 for n, p in layer.named_parameters()}, path)
    loaded = nn.load_hf_params(path, cfg, prefix=PREFIX)
    for name, p in layer.named_parameters():
        assert loaded[name].dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(loaded[name], np.float32),
                                      p.detach().to(torch.bfloat16).float().numpy())


def test_config_from_hf_and_load_errors(hf, tmp_path):
    config, _, cfg, _, path = hf
    assert nn.GatedDeltaNetConfig.from_hf(config.to_dict()) == cfg
    assert nn.GatedDeltaNetConfig.from_hf({"text_config": config.to_dict()}) == cfg
    with pytest.raises(KeyError, match="argument 'prefix': expected .* to hold tensor "
                       "'other.in_proj_qkvz.weight'.*given prefix 'other.'") as missing:
        nn.load_hf_params(path, cfg, prefix="other.")
    assert repr(PREFIX + "in_proj_qkvz.weight") in str(missing.value)  # the near miss, named
    wrong = nn.GatedDeltaNetConfig(64, 2, 4, 16, 16)
    with pytest.raises(ValueError, match="in_proj_qkvz.weight.*expected shape"):
        nn.load_hf_params(path, wrong, prefix=PREFIX)
    params = nn.init_params(jax.random.PRNGKey(0), cfg)
    assert {n: p.shape for n, p in params.items()} == cfg.param_shapes()


def test_hybrid_precision_bf16_against_the_float64_block(hf):
    _, _, cfg, params, _ = hf
    x = _x(batch=1, tokens=300, seed=4)
    w = np.random.default_rng(5).standard_normal(x.shape)

    def grads(param_dtype, dtype):
        p = {k: v.astype(param_dtype) for k, v in params.items()}

        def loss(p):
            y = nn.gated_delta_net(p, jnp.asarray(x, param_dtype), cfg, dtype=dtype)
            return jnp.sum(y.astype(param_dtype) * jnp.asarray(w, param_dtype)), y
        (_, y), g = jax.value_and_grad(loss, has_aux=True)(p)
        return y, g

    y64, g64 = grads(jnp.float64, None)
    y, g = grads(jnp.float32, jnp.bfloat16)
    assert y.dtype == jnp.bfloat16 and all(v.dtype == jnp.float32 for v in g.values())
    for name in ("A_log", "dt_bias"):
        a, b = np.asarray(g[name], np.float64), np.asarray(g64[name], np.float64)
        cosine = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
        assert cosine >= 0.999, (name, cosine)
    assert_close(y, y64, 2e-2, "y in hybrid precision")  # bf16 activations: 2^-9 per rounding

"""A Qwen3-Next GatedDeltaNet block in plain JAX over a parameter pytree, with the
parameter names and shapes of Hugging Face's ``linear_attn.*`` weights, on gdn's fused layer op.

The block, for hidden states x [B, T, hidden]::

    qkvz = x @ in_proj_qkvz.weight.T      # HF's head-interleaved layout, per key head:
    ba   = x @ in_proj_ba.weight.T        #   [q (Dk) | k (Dk) | v (g Dv) | z (g Dv)],
                                          #   [b (g) | a (g)]
    q, k, v, z, b, a = the fix-up of that layout (g = Hv / Hk value heads per key head)
    o    = gdn.jax.fused_gdn([q | k | v], a, b, conv1d.weight, A_log, dt_bias)
           (conv1d + SiLU, beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), L2-normed
           q and k, the gated delta rule)
    y    = out_proj(RMSNorm(o per value head) * norm.weight * SiLU(z))

Parameters (a dict, HF's names relative to a layer's ``linear_attn.`` prefix):

    in_proj_qkvz.weight  [2 Hk Dk + 2 Hv Dv, hidden]
    in_proj_ba.weight    [2 Hv, hidden]
    conv1d.weight        [D, 1, K], D = 2 Hk Dk + Hv Dv
    dt_bias, A_log       [Hv]
    norm.weight          [Dv]
    out_proj.weight      [hidden, Hv Dv]

``load_hf_params`` reads them from a ``.safetensors`` file, bf16 checkpoints included.
Qwen3.5's layers split the projections differently (in_proj_qkv, in_proj_z, in_proj_b,
in_proj_a) and are not covered yet.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp

from gdn.jax._layer import batched_context_parallel, fused_gdn
from gdn.jax._serving import fused_conv1d_gdn

PARAM_NAMES = ("in_proj_qkvz.weight", "in_proj_ba.weight", "conv1d.weight", "dt_bias", "A_log",
               "norm.weight", "out_proj.weight")


@dataclasses.dataclass(frozen=True)
class GatedDeltaNetConfig:
    """The block's sizes (HF's ``linear_*`` config fields) and its norm epsilon."""

    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel_size: int = 4
    rms_norm_eps: float = 1e-6

    @classmethod
    def from_hf(cls, config: Any) -> "GatedDeltaNetConfig":
        """From a transformers Qwen3-Next config (an object or a dict, such as a checkpoint's
        config.json); a ``text_config`` inside is looked into. Raises ValueError naming a
        missing field."""
        if isinstance(config, dict):
            config = config.get("text_config", config)
            get = config.get
        else:
            config = getattr(config, "text_config", None) or config
            get = lambda k, d=None: getattr(config, k, d)  # noqa: E731
        fields = {"hidden_size": "hidden_size", "num_k_heads": "linear_num_key_heads",
                  "num_v_heads": "linear_num_value_heads", "head_k_dim": "linear_key_head_dim",
                  "head_v_dim": "linear_value_head_dim"}
        values = {}
        for ours, theirs in fields.items():
            values[ours] = get(theirs)
            if values[ours] is None:
                raise ValueError(f"gdn: argument 'config': expected a Qwen3-Next config with "
                                 f"'{theirs}', given one without it")
        return cls(**values, conv_kernel_size=get("linear_conv_kernel_dim", 4),
                   rms_norm_eps=get("rms_norm_eps", 1e-6))

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        hk, hv, dk, dv, h = (self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim,
                             self.hidden_size)
        return {"in_proj_qkvz.weight": (2 * hk * dk + 2 * hv * dv, h),
                "in_proj_ba.weight": (2 * hv, h),
                "conv1d.weight": (self.conv_dim, 1, self.conv_kernel_size),
                "dt_bias": (hv,), "A_log": (hv,), "norm.weight": (dv,),
                "out_proj.weight": (h, hv * dv)}


def init_params(key: jax.Array, cfg: GatedDeltaNetConfig, dtype=jnp.float32) -> dict:
    """Random parameters with HF's shapes: projections N(0, 0.02), the conv like nn.Conv1d's
    default, A = exp(A_log) uniform in [1, 16], dt_bias 1, norm.weight 1."""
    shapes = cfg.param_shapes()
    keys = jax.random.split(key, 5)
    k = cfg.conv_kernel_size
    return {
        "in_proj_qkvz.weight": 0.02 * jax.random.normal(keys[0], shapes["in_proj_qkvz.weight"],
                                                        dtype),
        "in_proj_ba.weight": 0.02 * jax.random.normal(keys[1], shapes["in_proj_ba.weight"], dtype),
        "conv1d.weight": jax.random.uniform(keys[2], shapes["conv1d.weight"], dtype,
                                            -k ** -0.5, k ** -0.5),
        "dt_bias": jnp.ones(shapes["dt_bias"], dtype),
        "A_log": jnp.log(jax.random.uniform(keys[3], shapes["A_log"], dtype, 1.0, 16.0)),
        "norm.weight": jnp.ones(shapes["norm.weight"], dtype),
        "out_proj.weight": 0.02 * jax.random.normal(keys[4], shapes["out_proj.weight"], dtype),
    }


def load_hf_params(path: str, cfg: GatedDeltaNetConfig, prefix: str = "",
                   dtype: Optional[Any] = None) -> dict:
    """The block's parameters from a ``.safetensors`` file: the tensors named ``prefix +``
    each of PARAM_NAMES (e.g. prefix ``"model.layers.0.linear_attn."``), checked against the
    config's shapes; cast to ``dtype`` when given. Raises KeyError naming a missing tensor and
    ValueError naming one of the wrong shape.

    Example::

        cfg = GatedDeltaNetConfig.from_hf(json.load(open("config.json")))
        params = load_hf_params("model-00001-of-00041.safetensors", cfg,
                                prefix="model.layers.0.linear_attn.")
    """
    tensors, held = _read_safetensors(path, [prefix + n for n in PARAM_NAMES])
    params = {}
    for name, shape in cfg.param_shapes().items():
        full = prefix + name
        if full not in tensors:
            near = sorted(n for n in held if n.endswith("." + name) or n == name)[:3]
            raise KeyError(f"gdn: argument 'prefix': expected {path} to hold tensor '{full}' "
                           f"(the block needs {[prefix + n for n in PARAM_NAMES]}), given "
                           f"prefix {prefix!r}: no tensor '{full}' among its {len(held)}"
                           + (f"; it has {near}" if near else ""))
        value = tensors[full]
        if tuple(value.shape) != shape:
            raise ValueError(f"gdn: tensor '{full}': expected shape {list(shape)} for this "
                             f"config, given {list(value.shape)}")
        params[name] = jnp.asarray(value, dtype=dtype)
    return params


_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _read_safetensors(path: str, names):
    """The named tensors of a .safetensors file (those present) as NumPy arrays, and the names
    of every tensor the file holds. The format is
    an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte offsets
    after the header) and the raw little-endian data. Read here rather than by the safetensors
    package's NumPy loader, which cannot return bf16 (NumPy has no bf16; ml_dtypes, which jax
    requires, has)."""
    import json

    import ml_dtypes
    import numpy as np

    with open(path, "rb") as f:
        (length,) = np.frombuffer(f.read(8), "<u8")
        header = json.loads(f.read(int(length)))
        data = np.memmap(f, dtype=np.uint8, mode="r", offset=8 + int(length))
    out = {}
    for name in names:
        entry = header.get(name)
        if entry is None:
            continue
        kind = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if kind is None:
            raise ValueError(f"gdn: tensor '{name}': expected dtype F64, F32, F16 or BF16, given "
                             f"{entry['dtype']}")
        dt = ml_dtypes.bfloat16 if kind == "bfloat16" else np.dtype(kind).newbyteorder("<")
        lo, hi = entry["data_offsets"]
        out[name] = np.array(data[lo:hi].view(dt).reshape(entry["shape"]))
    return out, [n for n in header if n != "__metadata__"]


def _matmul(x, weight):
    """x @ weight.T with the weight cast to x's dtype (bf16 operands in hybrid precision) and
    float32 accumulation, rounded to x's dtype."""
    acc = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    return jnp.matmul(x, weight.T.astype(x.dtype), preferred_element_type=acc).astype(x.dtype)


def _split_projections(params, x, cfg: GatedDeltaNetConfig):
    """HF's fix-up of its head-interleaved projections: (qkv [.., D] = [q | k | v] by heads, z
    [.., Hv, Dv], b, a [.., Hv])."""
    hk, hv, dk, dv = cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
    g = hv // hk
    lead = x.shape[:-1]
    qkvz = _matmul(x, params["in_proj_qkvz.weight"]).reshape(*lead, hk, 2 * dk + 2 * g * dv)
    ba = _matmul(x, params["in_proj_ba.weight"]).reshape(*lead, hk, 2 * g)
    q, k = qkvz[..., :dk], qkvz[..., dk:2 * dk]
    v, z = qkvz[..., 2 * dk:2 * dk + g * dv], qkvz[..., 2 * dk + g * dv:]
    b, a = ba[..., :g].reshape(*lead, hv), ba[..., g:].reshape(*lead, hv)
    qkv = jnp.concatenate([q.reshape(*lead, hk * dk), k.reshape(*lead, hk * dk),
                           v.reshape(*lead, hv * dv)], axis=-1)
    return qkv, z.reshape(*lead, hv, dv), b, a


def _output(params, o, z, cfg: GatedDeltaNetConfig, dtype):
    """The gated RMSNorm per value head (in float32, as HF; float64 for float64) and
    out_proj."""
    wide = jnp.float64 if dtype == jnp.float64 else jnp.float32
    o = o.reshape(z.shape).astype(wide)
    o = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + cfg.rms_norm_eps)
    o = params["norm.weight"].astype(wide) * o
    o = (o * jax.nn.silu(z.astype(wide))).astype(dtype)
    return _matmul(o.reshape(*z.shape[:-2], -1), params["out_proj.weight"])


def gated_delta_net(params: dict, x: jax.Array, cfg: GatedDeltaNetConfig, *,
                    conv_state: Optional[jax.Array] = None,
                    recurrent_state: Optional[jax.Array] = None, return_state: bool = False,
                    dtype: Optional[Any] = None, residuals: str = "all", threads: int = 0,
                    cp_axis: Optional[str] = None):
    """The block's forward on x [B, T, hidden] (HF's Qwen3NextGatedDeltaNet without an
    attention mask): each batch row one sequence, continuing from its conv_state [B, K - 1, D]
    and recurrent_state [B, Hv, Dk, Dv] when given (zeros otherwise). Differentiable in x and
    every parameter (gdn's C++ backward inside). Returns y [B, T, hidden] in x's dtype, and with
    ``return_state`` also (conv_state, recurrent_state) after the last token, the states a
    later call continues from (float32; float64 for float64 x).

    Hybrid precision (MaxText's ``dtype`` / ``param_dtype`` split): with ``dtype=jnp.bfloat16``
    and float32 parameters, x and the projection weights are cast to bf16 for the matmuls
    (float32 accumulation), bf16 activations go into the op, and the conv weight, A_log,
    dt_bias, the states, the gates, softplus and every sum inside stay float32; the norm runs in
    float32; y is bf16 and the parameters' gradients float32. Without ``dtype`` everything runs
    in x's dtype.

    Context parallelism: inside ``jax.shard_map`` with x [B, T, hidden] sharded along T over
    mesh axis ``cp_axis`` (each device a contiguous segment of at least K - 1 tokens), the op
    runs as ``fused_gdn(cp_axis=...)`` does; y and every gradient equal the unsharded block's
    to float32 rounding; the states given enter the first segment and those returned leave
    the last.

    Example::

        y = gated_delta_net(params, x, cfg)
        loss, grads = jax.value_and_grad(lambda p: gated_delta_net(p, x, cfg).sum())(params)
    """
    if dtype is not None:
        x = x.astype(dtype)
    batch, tokens = x.shape[0], x.shape[1]
    qkv, z, b, a = _split_projections(params, x, cfg)
    flat = lambda t: t.reshape(batch * tokens, *t.shape[2:])  # noqa: E731
    if cp_axis is not None:
        o, conv_out, rec_out = batched_context_parallel(
            qkv, a, b, params["conv1d.weight"], params["A_log"], params["dt_bias"],
            conv_state=conv_state, recurrent_state=recurrent_state,
            num_k_heads=cfg.num_k_heads, num_v_heads=cfg.num_v_heads,
            head_k_dim=cfg.head_k_dim, head_v_dim=cfg.head_v_dim, residuals=residuals,
            threads=threads, cp_axis=cp_axis)
        y = _output(params, o, z, cfg, x.dtype)
        return (y, (conv_out, rec_out)) if return_state else y
    cu = jnp.arange(batch + 1, dtype=jnp.int32) * tokens
    o, conv_out, rec_out = fused_gdn(
        flat(qkv), flat(a), flat(b), params["conv1d.weight"], params["A_log"], params["dt_bias"],
        conv_state=conv_state, recurrent_state=recurrent_state, cu_seqlens=cu,
        num_k_heads=cfg.num_k_heads, num_v_heads=cfg.num_v_heads, head_k_dim=cfg.head_k_dim,
        head_v_dim=cfg.head_v_dim, residuals=residuals, threads=threads)
    y = _output(params, o.reshape(batch, tokens, -1), z, cfg, x.dtype)
    return (y, (conv_out, rec_out)) if return_state else y


def gated_delta_net_step(params: dict, x: jax.Array, cfg: GatedDeltaNetConfig,
                         conv_pool: jax.Array, recurrent_pool: jax.Array,
                         query_start_loc: jax.Array, state_indices: jax.Array,
                         distribution: jax.Array, seq_lens: jax.Array, *, threads: int = 0):
    """One serving step of the block over pools of state slots (gdn.jax.fused_conv1d_gdn, with
    its batch description): x [T, hidden] packed tokens of decodes and prefills. Returns
    ((conv_pool, recurrent_pool), y [T, hidden]); the pools are updated (donated inside the
    serving call).

    Example::

        (conv_pool, rec_pool), y = gated_delta_net_step(
            params, x_t, cfg, conv_pool, rec_pool, query_start_loc, state_indices,
            distribution, seq_lens)
    """
    qkv, z, b, a = _split_projections(params, x, cfg)
    pools, o = fused_conv1d_gdn(
        qkv, b, a, conv_pool, recurrent_pool, params["conv1d.weight"], None, params["A_log"],
        params["dt_bias"], query_start_loc, state_indices, distribution, seq_lens,
        n_kq=cfg.num_k_heads, n_v=cfg.num_v_heads, d_k=cfg.head_k_dim, d_v=cfg.head_v_dim,
        kernel_size=cfg.conv_kernel_size, threads=threads)
    return pools, _output(params, o, z, cfg, x.dtype)

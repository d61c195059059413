"""gdn.jax.fused_gdn (the layer op) against the pure-JAX reference (jax_reference.py):
forward, every gradient, residual policies and names, hybrid precision (errors: test_jax_validation.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_policies

import gdn.jax
import jax_reference as ref
from conftest import assert_close, results_asked

TOL_F32 = 1e-4

# (id, hk, hv, dk, dv, taps, cu_seqlens (None: one sequence of `tokens`), tokens, bias,
#  initial states, weight layout [D, 1, K])
CASES = [
    ("varlen_zero_one_two_token_states_bias", 1, 2, 16, 8, 4, [0, 0, 1, 3, 40, 75], 75, True,
     True, True),
    ("one_sequence_gva_dk_ne_dv_no_states", 2, 4, 8, 12, 4, None, 50, False, False, False),
    ("varlen_k2_states_no_bias", 1, 1, 12, 12, 2, [0, 17, 18, 60], 60, False, True, False),
]
IDS = [c[0] for c in CASES]


class LayerProblem:
    def __init__(self, case, seed=0):
        (_, self.hk, self.hv, self.dk, self.dv, self.taps, cu, self.tokens, bias, states,
         three_d) = case
        rng = np.random.default_rng(seed)
        d = 2 * self.hk * self.dk + self.hv * self.dv
        n = 1 if cu is None else len(cu) - 1
        t = self.tokens
        f = np.float32
        self.qkv = rng.standard_normal((t, d)).astype(f)
        self.a = rng.standard_normal((t, self.hv)).astype(f)
        self.b = rng.standard_normal((t, self.hv)).astype(f)
        w = (rng.standard_normal((d, self.taps)) * 0.5).astype(f)
        self.conv_weight = w[:, None, :] if three_d else w
        self.A_log = np.log(rng.uniform(1, 16, self.hv)).astype(f)
        self.dt_bias = (0.1 * rng.standard_normal(self.hv)).astype(f)
        self.conv_bias = (0.1 * rng.standard_normal(d)).astype(f) if bias else None
        self.conv_state = rng.standard_normal((n, self.taps - 1, d)).astype(f) if states else None
        self.rec_state = ((0.5 * rng.standard_normal((n, self.hv, self.dk, self.dv))).astype(f)
                          if states else None)
        self.cu = None if cu is None else jnp.asarray(cu, jnp.int32)
        self.d_out = rng.standard_normal((t, self.hv * self.dv)).astype(f)
        self.d_conv = rng.standard_normal((n, self.taps - 1, d)).astype(f)
        self.d_rec = rng.standard_normal((n, self.hv, self.dk, self.dv)).astype(f)

    def heads(self):
        return dict(num_k_heads=self.hk, num_v_heads=self.hv, head_k_dim=self.dk,
                    head_v_dim=self.dv)

    def diff_args(self, dtype=np.float32):
        xs = (self.qkv, self.a, self.b, self.conv_weight, self.A_log, self.dt_bias,
              self.conv_bias, self.conv_state, self.rec_state)
        return tuple(None if x is None else jnp.asarray(x, dtype) for x in xs)

    def loss(self, fn, **extra):
        def loss(qkv, a, b, w, A_log, dt_bias, bias, conv_state, rec_state):
            out, conv_out, rec_out = fn(qkv, a, b, w, A_log, dt_bias, conv_bias=bias,
                                        conv_state=conv_state, recurrent_state=rec_state,
                                        cu_seqlens=self.cu, **self.heads(), **extra)
            return (jnp.sum(out * self.d_out) + jnp.sum(conv_out * self.d_conv)
                    + jnp.sum(rec_out * self.d_rec))
        return loss

    def argnums(self):
        return tuple(i for i, x in enumerate(self.diff_args()) if x is not None)


def gdn_layer(*args, chunk_size=16, **kw):
    return gdn.jax.fused_gdn(*args, chunk_size=chunk_size, **kw)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_matches_reference(case):
    p = LayerProblem(case)
    qkv, a, b, w, A_log, dt_bias, bias, cs, rs = p.diff_args()
    got = jax.jit(lambda *x: gdn_layer(*x[:6], conv_bias=x[6], conv_state=x[7],
                                       recurrent_state=x[8], cu_seqlens=p.cu, **p.heads()))(
        qkv, a, b, w, A_log, dt_bias, bias, cs, rs)
    r = p.diff_args(np.float64)
    want = ref.fused_gdn(*r[:6], conv_bias=r[6], conv_state=r[7], recurrent_state=r[8],
                         cu_seqlens=p.cu, **p.heads())
    for name, x, y in zip(("out", "conv_state_out", "recurrent_state_out"), got, want):
        assert_close(x, y, TOL_F32, name)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_gradient_matches_jax_grad_of_reference(case):
    p = LayerProblem(case)
    argnums = p.argnums()
    got = jax.jit(jax.grad(p.loss(gdn_layer), argnums=argnums))(*p.diff_args())
    want = jax.grad(p.loss(ref.fused_gdn), argnums=argnums)(*p.diff_args(np.float64))
    names = ("d_qkv", "d_a", "d_b", "d_conv_weight", "d_A_log", "d_dt_bias", "d_conv_bias",
             "d_conv_state", "d_recurrent_state")
    for i, x, y in zip(argnums, got, want):
        assert x.shape == y.shape, names[i]
        assert_close(x, y, TOL_F32, names[i])


def test_residual_policies_and_checkpoint_names_give_identical_gradients():
    p = LayerProblem(CASES[0])
    argnums = p.argnums()
    base = jax.jit(jax.grad(p.loss(gdn_layer), argnums=argnums))(*p.diff_args())
    variants = {
        "t_inv": jax.grad(p.loss(gdn_layer, residuals="t_inv"), argnums=argnums),
        "none": jax.grad(p.loss(gdn_layer, residuals="none"), argnums=argnums),
        "names_kept": jax.grad(jax.checkpoint(p.loss(gdn_layer), policy=(
            checkpoint_policies.save_only_these_names(*gdn.jax.RESIDUAL_NAMES))),
            argnums=argnums),
        "full_remat": jax.grad(jax.checkpoint(
            p.loss(gdn_layer), policy=checkpoint_policies.nothing_saveable), argnums=argnums),
    }
    for name, f in variants.items():
        for x, y in zip(jax.jit(f)(*p.diff_args()), base):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)
    jaxpr = str(jax.make_jaxpr(jax.grad(p.loss(gdn_layer), argnums=(0,)))(*p.diff_args()))
    for name in (*gdn.jax.RESIDUAL_NAMES, gdn.jax.OUTPUT_NAME):
        assert f"name={name}" in jaxpr, name


# What the gdn_layer_forward calls of jax.value_and_grad ask for (o: out, C: conv state out,
# R: recurrent state out, S: chunk states, T: T^-1) per checkpoint policy and per what the
# loss reads ("all": <out, d_out> and both states; "o_read": also |out|, so that the backward
# reads out, with an exact cotangent; "out_only": <out, d_out> alone): as the core op's
# (test_jax_core.py, REMAT_CALLS), a call computes only what is read, and a replay never the
# final states.
LAYER_REMAT_CALLS = [
    ("no_checkpoint", None, "all", ["oCRST"]),
    ("names_kept", (*gdn.jax.RESIDUAL_NAMES,), "all", ["oCRST"]),
    ("output_kept", (gdn.jax.OUTPUT_NAME,), "all", ["ST", "oCR"]),
    ("full_remat", (), "all", ["ST", "oCR"]),
    ("names_kept_o_read", (*gdn.jax.RESIDUAL_NAMES,), "o_read", ["o", "oCRST"]),
    ("full_remat_o_read", (), "o_read", ["oCR", "oST"]),
    ("full_remat_out_only", (), "out_only", ["ST", "o"]),
]


@pytest.mark.parametrize("policy_id, saved, reads, calls", LAYER_REMAT_CALLS,
                         ids=[c[0] for c in LAYER_REMAT_CALLS])
def test_remat_replays_only_what_the_backward_reads_with_identical_gradients(
        policy_id, saved, reads, calls):
    p = LayerProblem(CASES[0])
    argnums = p.argnums()

    def loss(qkv, a, b, w, A_log, dt_bias, bias, conv_state, rec_state):
        out, conv_out, rec_out = gdn_layer(qkv, a, b, w, A_log, dt_bias, conv_bias=bias,
                                           conv_state=conv_state, recurrent_state=rec_state,
                                           cu_seqlens=p.cu, **p.heads())
        value = jnp.sum(out * p.d_out)
        if reads != "out_only":
            value = value + jnp.sum(conv_out * p.d_conv) + jnp.sum(rec_out * p.d_rec)
        return value + jnp.sum(jnp.abs(out)) if reads == "o_read" else value

    f = loss if saved is None else jax.checkpoint(
        loss, policy=checkpoint_policies.save_only_these_names(*saved))
    value_and_grad = jax.jit(jax.value_and_grad(f, argnums=argnums))
    text = value_and_grad.lower(*p.diff_args()).as_text()
    letters = {"o": "want_out", "C": "want_conv_state_out", "R": "want_recurrent_state_out",
               "S": "want_chunk_states", "T": "want_t_inv"}
    assert results_asked(text, "gdn_layer_forward", letters) == calls
    value, grads = value_and_grad(*p.diff_args())
    want_value, want = jax.jit(jax.value_and_grad(loss, argnums=argnums))(*p.diff_args())
    # The loss's own sums may be fused differently per program; the op's results may not.
    np.testing.assert_allclose(np.asarray(value), np.asarray(want_value), rtol=1e-6)
    for i, x, y in zip(argnums, grads, want):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(i))


def test_hybrid_precision_bf16_activations_and_bf16_parameters():
    p = LayerProblem(CASES[1])
    qkv, a, b = (jnp.asarray(x, jnp.bfloat16) for x in (p.qkv, p.a, p.b))
    w, A_log, dt_bias = (jnp.asarray(x, jnp.bfloat16) for x in (p.conv_weight, p.A_log,
                                                                 p.dt_bias))
    out, conv_out, rec_out = gdn_layer(qkv, a, b, w, A_log, dt_bias, **p.heads())
    assert out.dtype == jnp.bfloat16 and rec_out.dtype == jnp.float32
    r = [jnp.asarray(x, jnp.float64) for x in (qkv, a, b, w, A_log, dt_bias)]
    want, _, rec_want = ref.fused_gdn(*r, **p.heads())
    assert_close(out, want, 2.0 ** -8, "out")
    assert_close(rec_out, rec_want, TOL_F32, "recurrent_state_out")
    d_out = jnp.asarray(p.d_out)
    argnums = (0, 1, 2, 3, 4, 5)
    grads = jax.grad(lambda *x: jnp.sum(gdn_layer(*x, **p.heads())[0] * d_out),
                     argnums=argnums)(qkv, a, b, w, A_log, dt_bias)
    grads_ref = jax.grad(lambda *x: jnp.sum(ref.fused_gdn(*x, **p.heads())[0] * d_out),
                         argnums=argnums)(*r)
    names = ("d_qkv", "d_a", "d_b", "d_conv_weight", "d_A_log", "d_dt_bias")
    for name, x, y in zip(names, grads, grads_ref):
        assert x.dtype == jnp.bfloat16, name
        assert_close(x, y, 2.0 ** -6, name)


def test_vmap_runs_each_layer_call_alone():
    p1, p2 = LayerProblem(CASES[1], seed=1), LayerProblem(CASES[1], seed=2)
    a1, a2 = p1.diff_args()[:6], p2.diff_args()[:6]
    stacked = [jnp.stack([x, y]) for x, y in zip(a1, a2)]
    got = jax.vmap(lambda *x: gdn_layer(*x, **p1.heads()))(*stacked)
    for i, args in enumerate((a1, a2)):
        for x, y in zip(got, gdn_layer(*args, **p1.heads())):
            np.testing.assert_array_equal(np.asarray(x[i]), np.asarray(y))

"""gdn.jax.chunk_gated_delta_rule against the pure-JAX scan reference (jax_reference.py):
forward, every gradient, remat policies and residual names, vmap, 16-bit and float64
activations (errors: test_jax_validation.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_policies

import gdn
import gdn.jax
import jax_reference as ref
from conftest import Problem, assert_close, results_asked

TOL_F32 = 1e-4

# (id, batch, tokens, hk, hv, dk, dv, cu_seqlens, h0, l2norm, chunk)
CASES = [
    ("batched_h0_gva_dk_ne_dv", 2, 67, 2, 4, 16, 24, None, True, True, 16),
    ("varlen_zero_and_one_token_h0", 1, 90, 1, 2, 20, 12, [0, 0, 1, 40, 40, 89, 90], True, False,
     16),
    ("varlen_no_h0_gva3", 1, 70, 2, 6, 8, 8, [0, 1, 2, 33, 70], False, True, 32),
    ("one_sequence_c64_short_last_chunk", 1, 130, 1, 1, 32, 16, None, False, True, 64),
]
IDS = [c[0] for c in CASES]


def make(case, seed=0):
    _, batch, tokens, hk, hv, dk, dv, cu, h0, l2, chunk = case
    n = batch if cu is None else len(cu) - 1
    p = Problem(seed, batch, tokens, hk, hv, dk, dv, num_seqs=n, h0=h0)
    if not l2:
        p.q *= dk ** -0.5  # keep the unnormalised recurrence stable (beta |k|^2 < 2)
        p.k *= dk ** -0.5
    kw = dict(use_qk_l2norm_in_kernel=l2,
              cu_seqlens=None if cu is None else jnp.asarray(cu, jnp.int32))
    return p, kw, chunk


def loss_of(fn, p, kw):
    """<o, d_o> + <final_state, d_ht>, as a function of (q, k, v, g, beta, h0)."""

    def loss(q, k, v, g, beta, h0):
        o, ht = fn(q, k, v, g, beta, initial_state=h0, **kw)
        return jnp.sum(o * p.d_o) + jnp.sum(ht * p.d_ht)

    return loss


def gdn_fn(chunk, **extra):
    def fn(q, k, v, g, beta, **kw):
        return gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                              chunk_size=chunk, **kw, **extra)
    return fn


def ref_fn(q, k, v, g, beta, **kw):
    return ref.chunk_gated_delta_rule(q, k, v, g, beta, **kw)


def f64(*xs):
    return tuple(None if x is None else jnp.asarray(x, jnp.float64) for x in xs)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_matches_scan_reference(case):
    p, kw, chunk = make(case)
    h0 = None if p.h0 is None else jnp.asarray(p.h0)
    o, ht = jax.jit(lambda *a: gdn_fn(chunk)(*a[:5], initial_state=a[5], **kw))(*p.args(), h0)
    o_ref, ht_ref = ref_fn(*f64(p.q, p.k, p.v, p.g, p.beta), initial_state=f64(p.h0)[0], **kw)
    assert o.dtype == jnp.float32 and ht.dtype == jnp.float32
    assert_close(o, o_ref, TOL_F32, "o")
    assert_close(ht, ht_ref, TOL_F32, "final_state")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradients_match_jax_grad_of_scan_reference(case):
    p, kw, chunk = make(case)
    argnums = (0, 1, 2, 3, 4, 5) if p.h0 is not None else (0, 1, 2, 3, 4)
    h0 = None if p.h0 is None else jnp.asarray(p.h0)
    grads = jax.jit(jax.grad(loss_of(gdn_fn(chunk), p, kw), argnums=argnums))(*p.args(), h0)
    grads_ref = jax.grad(loss_of(ref_fn, p, kw), argnums=argnums)(
        *f64(p.q, p.k, p.v, p.g, p.beta, p.h0))
    for name, x, r in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads, grads_ref):
        assert x.dtype == jnp.float32, name
        assert_close(x, r, TOL_F32, name)


def test_float64_activations_match_reference_to_1e10():
    p, kw, chunk = make(CASES[1])
    args = f64(p.q, p.k, p.v, p.g, p.beta, p.h0)
    o, ht = gdn_fn(chunk)(*args[:5], initial_state=args[5], **kw)
    o_ref, ht_ref = ref_fn(*args[:5], initial_state=args[5], **kw)
    assert o.dtype == jnp.float64
    assert_close(o, o_ref, 1e-10, "o")
    assert_close(ht, ht_ref, 1e-10, "final_state")
    grads = jax.grad(loss_of(gdn_fn(chunk), p, kw), argnums=(0, 1, 2, 3, 4, 5))(*args)
    grads_ref = jax.grad(loss_of(ref_fn, p, kw), argnums=(0, 1, 2, 3, 4, 5))(*args)
    for name, x, r in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads, grads_ref):
        assert_close(x, r, 1e-10, name)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
def test_16bit_activations_within_their_rounding(dtype):
    p, kw, chunk = make(CASES[0])
    q, k, v = (jnp.asarray(x, dtype) for x in (p.q, p.k, p.v))
    o, ht = gdn_fn(chunk)(q, k, v, jnp.asarray(p.g), jnp.asarray(p.beta),
                          initial_state=jnp.asarray(p.h0), **kw)
    assert o.dtype == dtype and ht.dtype == jnp.float32
    o_ref, ht_ref = ref_fn(*f64(q, k, v, p.g, p.beta), initial_state=f64(p.h0)[0], **kw)
    unit = 2.0 ** -8 if dtype == jnp.bfloat16 else 2.0 ** -11  # one rounding of o
    assert_close(o, o_ref, unit, "o")
    assert_close(ht, ht_ref, TOL_F32, "final_state")
    argnums = (0, 1, 2, 3, 4, 5)
    grads = jax.grad(loss_of(gdn_fn(chunk), p, kw), argnums=argnums)(
        q, k, v, jnp.asarray(p.g), jnp.asarray(p.beta), jnp.asarray(p.h0))
    grads_ref = jax.grad(loss_of(ref_fn, p, kw), argnums=argnums)(
        *f64(q, k, v, p.g, p.beta, p.h0))
    for name, x, r in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads, grads_ref):
        assert x.dtype == (dtype if name in ("dq", "dk", "dv") else jnp.float32), name
        assert_close(x, r, 4 * unit, name)  # measured: 2e-3 (bf16), 2e-4 (f16)


def test_residual_policies_give_bit_identical_gradients():
    p, kw, chunk = make(CASES[1])
    args = (*p.args(), jnp.asarray(p.h0))
    grads = {r: jax.jit(jax.grad(loss_of(gdn_fn(chunk, residuals=r), p, kw),
                                 argnums=(0, 1, 2, 3, 4, 5)))(*args)
             for r in ("all", "t_inv", "none")}
    for r in ("t_inv", "none"):
        for x, y in zip(grads[r], grads["all"]):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=r)


def test_checkpoint_policies_keep_or_drop_names_with_identical_gradients():
    p, kw, chunk = make(CASES[0])
    args = (*p.args(), jnp.asarray(p.h0))
    loss = loss_of(gdn_fn(chunk), p, kw)
    policies = {
        "no_checkpoint": None,
        "names_kept": checkpoint_policies.save_only_these_names(*gdn.jax.RESIDUAL_NAMES),
        "names_dropped": checkpoint_policies.save_only_these_names("some_other_name"),
        "full_remat": checkpoint_policies.nothing_saveable,
    }
    results = {}
    for name, policy in policies.items():
        f = loss if policy is None else jax.checkpoint(loss, policy=policy)
        results[name] = jax.jit(jax.grad(f, argnums=(0, 1, 2, 3, 4, 5)))(*args)
    for name in policies:
        for x, y in zip(results[name], results["no_checkpoint"]):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)


def _saved_residual_names(loss, args, policy):
    """The checkpoint names among the residuals jax.checkpoint(loss, policy) saves."""
    from jax._src.ad_checkpoint import saved_residuals  # the helper print_saved_residuals uses

    saved = saved_residuals(jax.checkpoint(loss, policy=policy), *args)
    return {name for name in gdn.jax.RESIDUAL_NAMES
            if any(name in str(where) for _, where in saved)}


def test_residual_names_appear_in_the_jaxpr_and_the_saved_set():
    p, kw, chunk = make(CASES[0])
    args = (*p.args(), jnp.asarray(p.h0))
    loss = loss_of(gdn_fn(chunk), p, kw)
    jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(*args))
    for name in gdn.jax.RESIDUAL_NAMES:
        assert f"name={name}" in jaxpr, name
    kept = _saved_residual_names(
        loss, args, checkpoint_policies.save_only_these_names(*gdn.jax.RESIDUAL_NAMES))
    assert kept == set(gdn.jax.RESIDUAL_NAMES)
    assert _saved_residual_names(loss, args, checkpoint_policies.nothing_saveable) == set()
    t_inv_only = loss_of(gdn_fn(chunk, residuals="t_inv"), p, kw)
    jaxpr = str(jax.make_jaxpr(jax.grad(t_inv_only, argnums=(0,)))(*args))
    assert "name=gdn_t_inv" in jaxpr and "name=gdn_chunk_states" not in jaxpr


# Under jax.value_and_grad of a loss reading o linearly (<o, d_o>) or also through |o| (so
# that the rest of the backward reads o; the cotangent sign(o) is exact, so no program's fusion
# of the loss rounds the op's cotangent differently), and the final state or not, what the
# gdn_forward calls of the compiled program ask for (o, F: final state, S: chunk states, T:
# T^-1), per checkpoint policy. A result nobody reads is not computed: when the backward needs
# only the residuals, its replay is the C++ forward without o, i.e. the backward's own rebuild
# of them; o needed again is replayed alone; a replay never asks for the final state (the
# backward reads its cotangent, not its value), nor does a forward whose final state is unused.
FORWARD_RESULTS = {"o": "want_o", "F": "want_final_state", "S": "want_chunk_states",
                   "T": "want_t_inv"}
REMAT_CALLS = [
    # policy id, saved names, o read by the backward, final state read, the calls
    ("no_checkpoint", None, False, True, ["oFST"]),
    ("names_kept", "residuals", False, True, ["oFST"]),
    ("output_kept", "output", False, True, ["ST", "oF"]),
    ("names_dropped", ("some_other_name",), False, True, ["ST", "oF"]),
    ("full_remat", (), False, True, ["ST", "oF"]),
    ("no_checkpoint_o_read", None, True, True, ["oFST"]),
    ("names_kept_o_read", "residuals", True, True, ["o", "oFST"]),
    ("output_kept_o_read", "output", True, True, ["ST", "oF"]),
    ("all_kept_o_read", "all", True, True, ["oFST"]),
    ("full_remat_o_read", (), True, True, ["oF", "oST"]),
    ("no_checkpoint_final_state_unused", None, False, False, ["oST"]),
    ("full_remat_final_state_unused", (), False, False, ["ST", "o"]),
]


@pytest.mark.parametrize("policy_id, saved, o_read, ht_read, calls", REMAT_CALLS,
                         ids=[c[0] for c in REMAT_CALLS])
def test_remat_replays_only_what_the_backward_reads_with_identical_gradients(
        policy_id, saved, o_read, ht_read, calls):
    p, kw, chunk = make(CASES[0])
    args = (*p.args(), jnp.asarray(p.h0))

    def loss(q, k, v, g, beta, h0):
        o, ht = gdn_fn(chunk)(q, k, v, g, beta, initial_state=h0, **kw)
        value = jnp.sum(o * p.d_o)
        if ht_read:
            value = value + jnp.sum(ht * p.d_ht)
        return value + jnp.sum(jnp.abs(o)) if o_read else value

    names = {"residuals": gdn.jax.RESIDUAL_NAMES, "output": (gdn.jax.OUTPUT_NAME,),
             "all": (*gdn.jax.RESIDUAL_NAMES, gdn.jax.OUTPUT_NAME)}.get(saved, saved)
    f = loss if saved is None else jax.checkpoint(
        loss, policy=checkpoint_policies.save_only_these_names(*names))
    argnums = (0, 1, 2, 3, 4, 5)
    value_and_grad = jax.jit(jax.value_and_grad(f, argnums=argnums))
    text = value_and_grad.lower(*args).as_text()
    assert results_asked(text, "gdn_forward", FORWARD_RESULTS) == calls
    value, grads = value_and_grad(*args)
    want_value, want = jax.jit(jax.value_and_grad(loss, argnums=argnums))(*args)
    # The loss's own sums may be fused differently per program; the op's results may not.
    np.testing.assert_allclose(np.asarray(value), np.asarray(want_value), rtol=1e-6)
    for name, x, y in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads, want):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)


@pytest.mark.parametrize("wrap", ["vmap", "scan", "shard_map"])
def test_remat_rule_reaches_the_calls_inside_vmap_scan_and_shard_map(wrap):
    p1, kw, chunk = make(CASES[0], seed=1)
    p2, _, _ = make(CASES[0], seed=2)
    d_o, d_ht = jnp.asarray(p1.d_o), jnp.asarray(p1.d_ht)

    def one(q, k, v, g, beta, h0):
        o, ht = gdn_fn(chunk)(q, k, v, g, beta, initial_state=h0, **kw)
        return jnp.sum(o * d_o) + jnp.sum(ht * d_ht)

    if wrap in ("vmap", "scan"):
        args = tuple(jnp.stack([a, b]) for a, b in zip((*p1.args(), jnp.asarray(p1.h0)),
                                                       (*p2.args(), jnp.asarray(p2.h0))))

        def loss(*a):
            if wrap == "vmap":
                return jnp.sum(jax.vmap(one)(*a))
            # As MaxText's scan_layers: one body, the layers' inputs stacked.
            return jax.lax.scan(lambda acc, x: (acc + one(*x), None), 0.0, a)[0]
    else:
        args = (*p1.args(), jnp.asarray(p1.h0))
        mesh = jax.make_mesh((1,), ("x",))
        loss = jax.shard_map(one, mesh=mesh, in_specs=jax.P(), out_specs=jax.P(),
                             check_vma=False)
    argnums = (0, 1, 2, 3, 4, 5)
    remat = jax.checkpoint(loss, policy=checkpoint_policies.save_only_these_names())
    value_and_grad = jax.jit(jax.value_and_grad(remat, argnums=argnums))
    text = value_and_grad.lower(*args).as_text()
    assert results_asked(text, "gdn_forward", FORWARD_RESULTS) == ["ST", "oF"]
    _, grads = value_and_grad(*args)
    _, want = jax.jit(jax.value_and_grad(loss, argnums=argnums))(*args)
    for name, x, y in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads, want):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)


def test_final_state_is_none_unless_asked():
    p, kw, chunk = make(CASES[0])
    o, ht = gdn.jax.chunk_gated_delta_rule(*p.args(), chunk_size=chunk, **kw)
    assert ht is None and o.shape == p.v.shape


def test_vmap_runs_each_problem_alone():
    p1, kw, chunk = make(CASES[0], seed=1)
    p2, _, _ = make(CASES[0], seed=2)
    stacked = [jnp.stack([a, b]) for a, b in zip(p1.args(), p2.args())]
    fn = gdn_fn(chunk)
    o, ht = jax.vmap(lambda *a: fn(*a, **kw))(*stacked)
    for i, p in enumerate((p1, p2)):
        o1, ht1 = fn(*p.args(), **kw)
        np.testing.assert_array_equal(np.asarray(o[i]), np.asarray(o1))
        np.testing.assert_array_equal(np.asarray(ht[i]), np.asarray(ht1))


def test_chunk_size_zero_takes_the_plans_chunk():
    p, kw, _ = make(CASES[1])
    planned = gdn._gdn.core_shape(
        *((x.shape[1:], "float32") for x in (p.q, p.k, p.v, p.g, p.beta)), None,
        ((len(kw["cu_seqlens"]),), "int32"), 0.25, False, 0, False, 0)["chunk_size"]
    assert planned in (16, 32, 64, 128)
    args = (*p.args(), jnp.asarray(p.h0))
    zero = jax.grad(loss_of(gdn_fn(0), p, kw), argnums=tuple(range(6)))(*args)
    explicit = jax.grad(loss_of(gdn_fn(planned), p, kw), argnums=tuple(range(6)))(*args)
    for x, y in zip(zero, explicit):  # the same chunking, so the same bits
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    o, _ = gdn_fn(0)(*args[:5], initial_state=args[5], **kw)
    o_ref, _ = ref_fn(*f64(p.q, p.k, p.v, p.g, p.beta), initial_state=f64(p.h0)[0], **kw)
    assert_close(o, o_ref, TOL_F32, "o")


def test_packed_residual_rows_past_the_batchs_chunks_are_zero():
    from gdn.jax import _core

    # 2 sequences of 10 and 60 tokens at C = 16: 1 + 4 chunks; the shape allows
    # min(70, ceil(70 / 16) + 2 - 1) = 6.
    p = Problem(3, 1, 70, 1, 2, 8, 8)
    cu = jnp.asarray([0, 10, 70], jnp.int32)
    q, k, v, g, beta = (x[0] for x in p.args())
    st = _core._Static(scale=8 ** -0.5, l2norm=True, chunk_size=16, bf16_matmul=False,
                       threads=0, has_h0=False, want_final_state=False,
                       keep_states=True, keep_t_inv=True, num_seqs=2, max_chunks=6,
                       compute_dtype="float32")
    _, _, states, t_inv = _core._forward_call(st, q, k, v, g, beta, None, cu, residuals=True)
    assert states.shape[0] == 6 and t_inv.shape[0] == 6
    np.testing.assert_array_equal(np.asarray(states[5:]), 0)
    np.testing.assert_array_equal(np.asarray(t_inv[5:]), 0)
    assert np.all(np.asarray(t_inv[:5]).diagonal(axis1=-2, axis2=-1)[..., 0] == 1)
    shape = gdn._gdn.core_shape(*(((70,) + x.shape[2:], "float32") for x in (
        p.q, p.k, p.v, p.g, p.beta)), None, ((3,), "int32"), 0.25, True, 16, False, 0)
    assert shape["max_chunks"] == 6 and shape["num_seqs"] == 2


def test_bf16_matmul_operands_within_their_tolerance():
    p, kw, chunk = make(CASES[0])
    o, _ = gdn_fn(chunk, matmul_precision="bf16")(*p.args(), initial_state=jnp.asarray(p.h0),
                                                 **kw)
    o_ref, _ = ref_fn(*f64(p.q, p.k, p.v, p.g, p.beta), initial_state=f64(p.h0)[0], **kw)
    assert_close(o, o_ref, 2e-2, "o")


def test_int64_cu_seqlens_give_the_int32_result():
    p, kw, chunk = make(CASES[1])
    o32, ht32 = gdn_fn(chunk)(*p.args(), **kw)
    kw64 = {**kw, "cu_seqlens": jnp.asarray(kw["cu_seqlens"], jnp.int64)}
    o64, ht64 = gdn_fn(chunk)(*p.args(), **kw64)
    np.testing.assert_array_equal(np.asarray(o32), np.asarray(o64))
    np.testing.assert_array_equal(np.asarray(ht32), np.asarray(ht64))

"""gdn.jax.fused_conv1d_gdn (Tokamax's serving call) against the pure-JAX step reference
(jax_reference.py): mixed decode / prefill / padding batches, speculative windows, prefix
caching, pools updated in place (errors: test_jax_validation.py)."""

import jax
import jax.numpy as jnp
import numpy as np

import gdn.jax
import jax_reference as ref
from conftest import assert_close

TOL_F32 = 1e-4
HK, HV, DK, DV, K = 1, 2, 16, 8, 4
D = 2 * HK * DK + HV * DV
SLOTS = 10
STATIC = dict(n_kq=HK, n_v=HV, d_k=DK, d_v=DV, kernel_size=K)


class Batch:
    """Random tokens, parameters and pools (every slot filled: stale slots hold garbage that a
    fresh sequence must not read)."""

    def __init__(self, seed, tokens, query_start_loc, state_indices, distribution, seq_lens,
                 read_state_indices=None, read_offsets=None, pool_dtype=np.float32):
        rng = np.random.default_rng(seed)
        f = np.float32
        self.qkv = rng.standard_normal((tokens, D)).astype(f)
        self.b = rng.standard_normal((tokens, HV)).astype(f)
        self.a = rng.standard_normal((tokens, HV)).astype(f)
        self.conv_weight = (0.5 * rng.standard_normal((D, 1, K))).astype(f)
        self.conv_bias = (0.1 * rng.standard_normal(D)).astype(f)
        self.a_log = np.log(rng.uniform(1, 16, HV)).astype(f)
        self.dt_bias = (0.1 * rng.standard_normal(HV)).astype(f)
        self.conv_pool = np.asarray(jnp.asarray(
            rng.standard_normal((SLOTS, K - 1, D)), pool_dtype))
        self.rec_pool = np.asarray(jnp.asarray(
            0.5 * rng.standard_normal((SLOTS, HV, DK, DV)), pool_dtype))
        i32 = lambda x: None if x is None else np.asarray(x, np.int32)  # noqa: E731
        self.meta = (i32(query_start_loc), i32(state_indices), i32(distribution), i32(seq_lens),
                     i32(read_state_indices), i32(read_offsets))

    def run(self, **extra):
        qsl, slots, dist, lens, reads, offsets = (None if m is None else jnp.asarray(m)
                                                  for m in self.meta)
        return gdn.jax.fused_conv1d_gdn(
            jnp.asarray(self.qkv), jnp.asarray(self.b), jnp.asarray(self.a),
            jnp.asarray(self.conv_pool), jnp.asarray(self.rec_pool), jnp.asarray(self.conv_weight),
            jnp.asarray(self.conv_bias), jnp.asarray(self.a_log), jnp.asarray(self.dt_bias), qsl,
            slots, dist, lens, reads, offsets, **{**STATIC, **extra})

    def reference(self, num_spec_tokens=0):
        f64 = lambda x: jnp.asarray(np.asarray(x, np.float64))  # noqa: E731
        return ref.serving_step(
            f64(self.qkv), f64(self.b), f64(self.a), f64(self.conv_pool), f64(self.rec_pool),
            f64(self.conv_weight), f64(self.conv_bias), f64(self.a_log), f64(self.dt_bias),
            *self.meta, n_kq=HK, n_v=HV, d_k=DK, d_v=DV, num_spec_tokens=num_spec_tokens)


def check(batch, num_spec_tokens=0, pool_tol=TOL_F32, out_tol=TOL_F32):
    (conv, rec), out = batch.run(num_spec_tokens=num_spec_tokens)
    (conv_ref, rec_ref), out_ref = batch.reference(num_spec_tokens)
    assert out.shape == (batch.qkv.shape[0], HV * DV)
    assert_close(out, out_ref, out_tol, "out")
    for slot in range(SLOTS):
        assert_close(conv[slot], conv_ref[slot], pool_tol, f"conv_state slot {slot}")
        assert_close(rec[slot], rec_ref[slot], pool_tol, f"recurrent_state slot {slot}")
    return conv, rec, out


def mixed_batch(seed=0, **kw):
    # decodes: history (slot 3), fresh over a stale slot (5); prefills: fresh 20 tokens (2),
    # continued 7 tokens (7), continued 2 tokens, shorter than K - 1 (8); one padding
    # sequence; 3 padding tokens.
    return Batch(seed, 34, [0, 1, 2, 22, 29, 31, 31], [3, 5, 2, 7, 8, 0], [2, 5, 5],
                 [10, 1, 20, 30, 9, 0], **kw)


def test_mixed_decode_prefill_padding_batch_matches_reference():
    batch = mixed_batch()
    conv, rec, out = check(batch)
    np.testing.assert_array_equal(np.asarray(out[31:]), 0)
    for untouched in (0, 1, 4, 6, 9):  # slots no live sequence writes keep their bits
        np.testing.assert_array_equal(np.asarray(conv[untouched]), batch.conv_pool[untouched])
        np.testing.assert_array_equal(np.asarray(rec[untouched]), batch.rec_pool[untouched])


def test_speculative_windows_with_read_offsets_match_reference():
    # decode 0: a 3-token window over slots 1..3, reading slot 2 (offset 1); decode 1: a
    # 2-token window over slots 5..6, reading slot 5; a fresh prefill into slot 8.
    batch = Batch(1, 12, [0, 3, 5, 12], [1, 5, 8], [2, 3, 3], [13, 9, 7],
                  read_offsets=[1, 0, 0])
    check(batch, num_spec_tokens=2)


def test_prefix_caching_reads_one_slot_and_writes_another():
    # a continued prefill reads slot 4 and writes slot 6; a decode reads 2, writes 9.
    batch = Batch(2, 9, [0, 1, 9], [9, 6], [1, 2, 2], [5, 20], read_state_indices=[2, 4])
    conv, rec, _ = check(batch)
    for read_slot in (2, 4):
        np.testing.assert_array_equal(np.asarray(rec[read_slot]), batch.rec_pool[read_slot])


def test_pools_are_donated_and_updated_in_place():
    batch = mixed_batch()
    qsl, slots, dist, lens = (jnp.asarray(m) for m in batch.meta[:4])
    conv_pool, rec_pool = jnp.asarray(batch.conv_pool), jnp.asarray(batch.rec_pool)
    pointers = (conv_pool.unsafe_buffer_pointer(), rec_pool.unsafe_buffer_pointer())
    (conv, rec), _ = gdn.jax.fused_conv1d_gdn(
        jnp.asarray(batch.qkv), jnp.asarray(batch.b), jnp.asarray(batch.a), conv_pool, rec_pool,
        jnp.asarray(batch.conv_weight), None, jnp.asarray(batch.a_log),
        jnp.asarray(batch.dt_bias), qsl, slots, dist, lens, **STATIC)
    assert (conv.unsafe_buffer_pointer(), rec.unsafe_buffer_pointer()) == pointers
    assert conv_pool.is_deleted() and rec_pool.is_deleted()


def test_bf16_pools_give_the_float32_pools_result_rounded_once():
    bf16 = mixed_batch(pool_dtype=jnp.bfloat16)
    (conv16, rec16), out16 = bf16.run()
    assert conv16.dtype == jnp.bfloat16 and rec16.dtype == jnp.bfloat16
    f32 = mixed_batch(pool_dtype=jnp.bfloat16)  # the same bf16 values, held as float32
    f32.conv_pool = f32.conv_pool.astype(np.float32)
    f32.rec_pool = f32.rec_pool.astype(np.float32)
    (conv32, rec32), out32 = f32.run()
    np.testing.assert_array_equal(np.asarray(out16), np.asarray(out32))
    np.testing.assert_array_equal(np.asarray(conv16), np.asarray(conv32.astype(jnp.bfloat16)))
    np.testing.assert_array_equal(np.asarray(rec16), np.asarray(rec32.astype(jnp.bfloat16)))
    check(bf16, pool_tol=2.0 ** -8)  # against the float64 step on the same bf16 start values


def test_tokamax_padded_metadata_decreasing_tail_and_clamped_distribution():
    # Tokamax's padded_mixed_prefill: live offsets, then a tail of 1s; padding entries hold
    # seq_lens 0 and slot 0. And its prefill case: N = 1 with distribution [0, 0, 3].
    lens = [20, 10, 5, 3, 2]
    qsl = [0, 20, 30, 35, 38, 40] + [1] * 4
    batch = Batch(4, 44, qsl, [1, 2, 3, 4, 5] + [0] * 4, [0, 5, 5], lens + [0] * 4)
    _, _, out = check(batch)
    np.testing.assert_array_equal(np.asarray(out[40:]), 0)
    check(Batch(5, 16, [0, 16], [6], [0, 0, 3], [16]))

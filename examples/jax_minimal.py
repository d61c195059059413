# The gated delta rule in JAX on gdn's C++ kernels: forward, gradients, remat by name.
import jax, jax.numpy as jnp
import gdn.jax

B, T, Hk, Hv, D = 1, 300, 2, 4, 64
q, k = jax.random.normal(jax.random.key(0), (2, B, T, Hk, D))
v = jax.random.normal(jax.random.key(1), (B, T, Hv, D))
g, beta = -jax.nn.softplus(jnp.ones((B, T, Hv))), jax.nn.sigmoid(jnp.ones((B, T, Hv)))

def loss(q, k, v, g, beta):
    o, ht = gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                           use_qk_l2norm_in_kernel=True)
    return jnp.sum(o ** 2) + jnp.sum(ht ** 2)

keep = jax.checkpoint_policies.save_only_these_names(*gdn.jax.RESIDUAL_NAMES)
grads = jax.jit(jax.grad(jax.checkpoint(loss, policy=keep), argnums=(0, 1, 2, 3, 4)))(q, k, v, g, beta)
print("dq", grads[0].shape, "d_beta[0, 0, 0] =", float(grads[4][0, 0, 0]))

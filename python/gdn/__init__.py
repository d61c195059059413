"""gdn: Gated DeltaNet (the gated delta rule of Qwen3-Next and Qwen3.5) in C++, fast and exact.

The C++ library's CPU kernels, callable from JAX through XLA's FFI::

    import gdn.jax
    o, final_state = gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)

``gdn.jax`` has the core op (fla's ``chunk_gated_delta_rule``), the fused layer op
(``fused_gdn``) and Tokamax's serving call (``fused_conv1d_gdn``); docs/jax.md explains them.
"""

from gdn._gdn import __version__, cpu_isa, default_threads

__all__ = ["__version__", "cpu_isa", "default_threads"]

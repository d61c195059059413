"""Trains a small language model of gdn.jax.nn GatedDeltaNet blocks with optax on multi-query
associative recall (MQAR), generated on the fly, and prints the loss and the recall accuracy.

Each sequence lists N key-value pairs, then asks for every key again in a random order:

    k1 v1 k2 v2 ... kN vN   q1 a1 q2 a2 ... qN aN      (q a key above, a its value)

and the model must predict each answer a_i from the token q_i before it (next-token
prediction, scored at those N positions only). Keys and values are drawn from disjoint halves
of the vocabulary, so chance is 1 / (vocab / 2). A model that only sees tokens near the query
cannot do better than chance: the pair may lie 4N tokens back. The GatedDeltaNet state stores
k -> v associations with the delta rule, which is what the task needs.

The model: token embedding, L layers of [x + GDN block(RMSNorm x), x + MLP(RMSNorm x)], a
final RMSNorm and the tied embedding as the output layer; the GDN blocks are
``gdn.jax.nn.gated_delta_net`` over gdn's C++ kernels (forward and backward).

Examples:
  .venv/bin/python examples/jax_recall.py                  # train until 90 % recall (or --steps)
  .venv/bin/python examples/jax_recall.py --steps 200 --pairs 8
  .venv/bin/python examples/jax_recall.py --reference      # the pure-JAX op (slow; for checks)

With its defaults it reaches 90 % recall within its 1000 steps (400 with seed 0, 2.5 minutes on
2 busy cores); other seeds can take longer or stall (docs/jax.md, "Training example").
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gdn.jax import nn


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 128          # keys from [0, vocab / 2), values from [vocab / 2, vocab)
    pairs: int = 8            # N key-value pairs per sequence: 4 N tokens
    hidden: int = 64
    layers: int = 2
    num_k_heads: int = 2
    num_v_heads: int = 4
    # Dk = Dv = 32 and 128 sequences a step: with 16 and 32 recall climbed slowly and crossed
    # 90 % after 2700 steps on one machine, 4500 on another and not in 8000 on a third
    # (rounding alone moved it that much). These cross it after 400 steps with seed 0
    # whatever the rounding (kernel variant, XLA's threads, schedule length), 250-400 with
    # seeds 1 and 4; seeds 2 and 3 stall near 40 % (docs/jax.md, "Training example").
    head_dim: int = 32
    batch: int = 128
    lr: float = 3e-3
    seed: int = 0

    @property
    def block(self) -> nn.GatedDeltaNetConfig:
        return nn.GatedDeltaNetConfig(hidden_size=self.hidden, num_k_heads=self.num_k_heads,
                                      num_v_heads=self.num_v_heads, head_k_dim=self.head_dim,
                                      head_v_dim=self.head_dim)


def make_batch(rng: np.random.Generator, cfg: Config):
    """(tokens [B, 4N] int32, targets [B, 4N] int32, mask [B, 4N] float32): the target of
    position t is token t + 1; the mask is 1 at the N query positions."""
    half, n, b = cfg.vocab // 2, cfg.pairs, cfg.batch
    keys = np.stack([rng.choice(half, n, replace=False) for _ in range(b)])
    values = rng.integers(half, cfg.vocab, (b, n))
    order = np.stack([rng.permutation(n) for _ in range(b)])
    rows = np.arange(b)[:, None]
    context = np.stack([keys, values], axis=-1).reshape(b, 2 * n)
    queries = np.stack([keys[rows, order], values[rows, order]], axis=-1).reshape(b, 2 * n)
    seq = np.concatenate([context, queries], axis=1)
    targets = np.concatenate([seq[:, 1:], np.zeros((b, 1), seq.dtype)], axis=1)
    mask = np.zeros(seq.shape, np.float32)
    mask[:, 2 * n::2] = 1.0  # the query keys: predict the value that follows
    return jnp.asarray(seq, jnp.int32), jnp.asarray(targets, jnp.int32), jnp.asarray(mask)


def init_params(key, cfg: Config) -> dict:
    """float32 parameters (also where JAX's default dtype is float64)."""
    f32 = jnp.float32
    keys = jax.random.split(key, 2 + 3 * cfg.layers)
    h = cfg.hidden
    params = {"embed": 0.02 * jax.random.normal(keys[0], (cfg.vocab, h), f32),
              "final_norm": jnp.ones(h, f32), "layers": []}
    for i in range(cfg.layers):
        k_gdn, k_in, k_out = keys[2 + 3 * i:5 + 3 * i]
        gdn_params = nn.init_params(k_gdn, cfg.block, f32)
        # Mamba-2's time-step init: softplus(dt_bias) log-uniform in [1e-3, 1e-1], so that the
        # decay starts slow (alpha = exp(-A dt) near 1) and the state can hold a pair for the
        # whole sequence (HF's dt_bias = 1 forgets within a few tokens).
        dt = jnp.exp(jax.random.uniform(jax.random.fold_in(k_gdn, 1), (cfg.num_v_heads,), f32,
                                        minval=np.log(1e-3), maxval=np.log(1e-1)))
        gdn_params["dt_bias"] = dt + jnp.log(-jnp.expm1(-dt))  # softplus^-1(dt)
        params["layers"].append({
            "gdn": gdn_params,
            "norm1": jnp.ones(h, f32), "norm2": jnp.ones(h, f32),
            "mlp_in": jax.random.normal(k_in, (h, 4 * h), f32) * h ** -0.5,
            "mlp_out": jax.random.normal(k_out, (4 * h, h), f32) * (4 * h) ** -0.5,
        })
    return params


def rms_norm(x, w, eps=1e-6):
    return w * x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def forward(params, tokens, cfg: Config, block: Callable = nn.gated_delta_net):
    x = params["embed"][tokens]
    for layer in params["layers"]:
        x = x + block(layer["gdn"], rms_norm(x, layer["norm1"]), cfg.block)
        y = rms_norm(x, layer["norm2"])
        x = x + jax.nn.gelu(y @ layer["mlp_in"]) @ layer["mlp_out"]
    return rms_norm(x, params["final_norm"]) @ params["embed"].T


def loss_and_accuracy(params, batch, cfg: Config, block: Callable = nn.gated_delta_net):
    tokens, targets, mask = batch
    logits = forward(params, tokens, cfg, block)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    loss = jnp.sum(nll * mask) / jnp.sum(mask)
    hits = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return loss, jnp.sum(hits * mask) / jnp.sum(mask)


def make_train_step(cfg: Config, optimizer, block: Callable = nn.gated_delta_net):
    @jax.jit
    def step(params, opt_state, batch):
        (loss, acc), grads = jax.value_and_grad(loss_and_accuracy, has_aux=True)(
            params, batch, cfg, block)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, acc
    return step


def make_optimizer(cfg: Config, steps: int):
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, min(100, steps // 10 + 1),
                                                  max(steps, 2), cfg.lr * 0.1)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def train(cfg: Config, steps: int, *, target: Optional[float] = 0.9, log_every: int = 50,
          block: Callable = nn.gated_delta_net, time_limit: Optional[float] = None,
          schedule_steps: Optional[int] = None, out=None):
    """Trains for at most ``steps`` steps, the learning rate on a warm-up + cosine schedule of
    ``schedule_steps`` (default ``steps``; more runs the start of a longer training); stops
    early once the mean accuracy of the last ``log_every`` steps reaches ``target``. Returns
    (params, losses, accuracies). Progress goes to ``out`` (default: sys.stdout at the call)."""
    out = sys.stdout if out is None else out
    rng = np.random.default_rng(cfg.seed)
    params = init_params(jax.random.PRNGKey(cfg.seed), cfg)
    optimizer = make_optimizer(cfg, schedule_steps or steps)
    opt_state = optimizer.init(params)
    step = make_train_step(cfg, optimizer, block)
    losses, accs = [], []
    start = time.perf_counter()
    for i in range(1, steps + 1):
        params, opt_state, loss, acc = step(params, opt_state, make_batch(rng, cfg))
        losses.append(float(loss))
        accs.append(float(acc))
        if i % log_every == 0 or i == steps:
            window = accs[-log_every:]
            mean_acc = sum(window) / len(window)
            elapsed = time.perf_counter() - start
            print(f"step {i:5d}  loss {np.mean(losses[-log_every:]):.4f}  "
                  f"recall {100 * mean_acc:5.1f} %  {elapsed:6.1f} s", file=out, flush=True)
            if target is not None and mean_acc >= target:
                print(f"reached {100 * target:.0f} % recall after {i} steps, {elapsed:.1f} s",
                      file=out, flush=True)
                break
            if time_limit is not None and elapsed > time_limit:
                print(f"stopped at the time limit ({time_limit:.0f} s)", file=out, flush=True)
                break
    return params, losses, accs


def reference_block(params, x, cfg, **kw):
    """gdn.jax.nn's block on the pure-JAX chunked op of bench/jax_chunked.py instead of gdn's
    kernels: the same model on an op that shares no code with them."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    import jax_chunked

    return jax_chunked.reference_block(params, x, cfg, **kw)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--steps", type=int, default=1000,
                   help="most training steps, the learning-rate schedule's length (1000)")
    p.add_argument("--target", type=float, default=0.9,
                   help="stop once the recall of the last --log-every steps reaches it (0.9)")
    p.add_argument("--pairs", type=int, default=Config.pairs, help="key-value pairs (8)")
    p.add_argument("--head-dim", type=int, default=Config.head_dim,
                   help="Dk = Dv of the GDN heads (32)")
    p.add_argument("--batch", type=int, default=Config.batch, help="sequences per step (128)")
    p.add_argument("--layers", type=int, default=Config.layers, help="layers (2)")
    p.add_argument("--lr", type=float, default=Config.lr, help="peak learning rate (3e-3)")
    p.add_argument("--seed", type=int, default=0, help="data and initialisation seed (0)")
    p.add_argument("--log-every", type=int, default=50, help="steps per progress line (50)")
    p.add_argument("--time-limit", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--reference", action="store_true",
                   help="run the pure-JAX reference op instead of gdn's (slow)")
    args = p.parse_args(argv)
    if min(args.steps, args.pairs, args.batch, args.layers, args.head_dim, args.log_every) < 1:
        p.error("--steps, --pairs, --batch, --layers, --head-dim and --log-every must be "
                "positive")
    if args.pairs > 64:
        p.error(f"--pairs: expected at most 64 (distinct keys of a 128-token vocabulary), "
                f"given {args.pairs}")
    cfg = Config(pairs=args.pairs, batch=args.batch, layers=args.layers, lr=args.lr,
                 head_dim=args.head_dim, seed=args.seed)
    print(f"MQAR: {cfg.pairs} pairs ({4 * cfg.pairs} tokens), batch {cfg.batch}, "
          f"{cfg.layers} layers of hidden {cfg.hidden}, chance "
          f"{100 / (cfg.vocab // 2):.1f} %", flush=True)
    block = reference_block if args.reference else nn.gated_delta_net
    _, _, accs = train(cfg, args.steps, target=args.target, log_every=args.log_every,
                       block=block, time_limit=args.time_limit)
    window = accs[-args.log_every:]
    return 0 if sum(window) / len(window) >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())

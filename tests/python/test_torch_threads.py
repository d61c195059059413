"""gdn.torch's ops run on torch's intra-op thread count: every call hands the C++ library
``torch.get_num_threads()`` threads by default, an explicit larger ``threads`` is clamped to it,
and the count is read when the op runs, so a compiled graph follows a later
``torch.set_num_threads`` (a backward after it, a torch.export program). Observed with a spy on
the binding's calls (thread_spy.py), on one and two threads, in eager mode, under torch.compile
(aot_eager; inductor for the serving step) and torch.export, in a DataLoader worker (torch sets
one thread there) and through a patched transformers model; the results are the same bits on
one and two threads."""

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import gdn.torch  # noqa: E402
from thread_spy import threads_received  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# One case per op: inputs (fresh each time; pools are mutated), a forward that returns tensors,
# and the binding's functions the forward (and the backward, for differentiable ops) calls.
# ---------------------------------------------------------------------------------------------

def core_inputs():
    # two sequences, four value heads: several work items, so two threads share the call
    xs = [rand(2, 40, 2, 16, seed=1), rand(2, 40, 2, 16, seed=2), rand(2, 40, 4, 8, seed=3),
          -rand(2, 40, 4, seed=4).abs() / 2, rand(2, 40, 4, seed=5).sigmoid(),
          rand(2, 4, 16, 8, seed=6) / 4]
    return [x.requires_grad_() for x in xs]


def chunk(q, k, v, g, beta, h0, **kw):
    return gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                            output_final_state=True,
                                            use_qk_l2norm_in_kernel=True, chunk_size=16, **kw)


def recurrent(q, k, v, g, beta, h0, **kw):
    return gdn.torch.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0,
                                                      output_final_state=True, **kw)


def conv_inputs():
    return [rand(2, 24, 30, seed=7).requires_grad_(), (rand(24, 4, seed=8) / 2).requires_grad_(),
            rand(24, seed=9).requires_grad_()]


def conv(x, weight, bias, **kw):
    return (gdn.torch.causal_conv1d_fn(x, weight, bias, activation="silu", **kw),)


def update_inputs():
    return [rand(3, 24, seed=10), rand(5, 24, 4, seed=11), rand(24, 4, seed=8) / 2,
            rand(24, seed=9), torch.tensor([4, 0, 2])]


def conv_update(x, conv_state, weight, bias, rows, **kw):
    return (gdn.torch.causal_conv1d_update(x, conv_state, weight, bias, "silu",
                                           conv_state_indices=rows, **kw),)


HK, HV, DK, DV, K, SLOTS = 1, 2, 8, 4, 4, 6
D = 2 * HK * DK + HV * DV
HEADS = dict(num_k_heads=HK, num_v_heads=HV, head_k_dim=DK, head_v_dim=DV)


def step_inputs():
    # two decodes, a continued and a fresh prefill
    return [rand(10, D, seed=12), rand(10, HV, seed=13), rand(10, HV, seed=14),
            rand(D, K, seed=15) / 2, rand(HV, seed=16), rand(HV, seed=17),
            rand(SLOTS, K - 1, D, seed=18), rand(SLOTS, HV, DK, DV, seed=19) / 4,
            torch.tensor([1, 3, 4, 5]), torch.tensor([0, 1, 2, 6, 10]),
            torch.tensor([True, True, True, False])]


def fused_gdn_step(qkv, a, b, w, A_log, dt_bias, conv_pool, ssm_pool, slots, cu, has, **kw):
    return (gdn.torch.fused_gdn_step(qkv, a, b, w, A_log, dt_bias, conv_pool, ssm_pool, slots,
                                     cu, has, **HEADS, **kw),)


def step_op(qkv, a, b, w, A_log, dt_bias, conv_pool, ssm_pool, slots, cu, has, threads=0):
    # Tokamax's metadata for the same batch: decodes first, then the prefills
    seq_lens = torch.tensor([2, 2, 5, 4])
    return (torch.ops.gdn.step(qkv, a, b, w, None, A_log, dt_bias, conv_pool, ssm_pool, cu,
                               slots, seq_lens, torch.tensor([2, 4, 4]), None, None, HK, HV, DK,
                               DV, 0, threads),)


def references(*_):
    ref = gdn.torch.reference
    q, k, v, g, beta, h0 = (x.detach() for x in core_inputs())
    x, w, bias = (t.detach() for t in conv_inputs())
    rows = x.transpose(1, 2).reshape(-1, 24)
    return (*ref.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                        output_final_state=True),
            *ref.chunk_gated_delta_rule_bwd(q, k, v, g, beta, v, initial_state=h0)[:5],
            *ref.causal_conv1d(rows, w, bias),
            *ref.causal_conv1d_bwd(rows, w, rows, bias)[:3])


CORE = {"core_forward", "core_backward"}
OPS = {  # name: (inputs, forward, the binding's functions it calls)
    "chunk_gated_delta_rule": (core_inputs, chunk, CORE),
    "fused_recurrent_gated_delta_rule": (core_inputs, recurrent, CORE),
    "causal_conv1d_fn": (conv_inputs, conv, {"conv_forward", "conv_backward"}),
    "causal_conv1d_update": (update_inputs, conv_update, {"conv_update"}),
    "fused_gdn_step": (step_inputs, fused_gdn_step, {"step"}),
    "torch.ops.gdn.step": (step_inputs, step_op, {"step"}),
}
REFERENCES = ("reference", (lambda: [], references, CORE | {"conv_forward", "conv_backward"}))


def run(name, forward=None, **kw):
    """The op's forward (the case's own, or a compiled one) on fresh inputs, then its backward
    when an input requires grad: (outputs, gradients, inputs after the call)."""
    make, eager, _ = dict([*OPS.items(), REFERENCES])[name]
    xs = make()
    outs = (forward or eager)(*xs, **kw)
    leaves = [x for x in xs if x.requires_grad]
    grads = ()
    if leaves:
        loss = sum((o * torch.linspace(-1, 1, o.numel()).reshape(o.shape)).sum() for o in outs)
        grads = torch.autograd.grad(loss, leaves)
    return outs, grads, xs


def counts(name, seen):
    """The thread counts the binding was handed, after checking that the op called every
    function it should (an op that called none would pass any check of its counts)."""
    called = {function for function, _ in seen}
    assert called == dict([*OPS.items(), REFERENCES])[name][2], (name, seen)
    return {threads for _, threads in seen}


ALL = [*OPS, "reference"]


@pytest.mark.parametrize("torch_threads", [1, 2], ids=["torch_1_thread", "torch_2_threads"])
@pytest.mark.parametrize("name", ALL)
def test_op_hands_the_library_torchs_thread_count_by_default(name, torch_threads):
    torch.set_num_threads(torch_threads)
    with threads_received() as seen:
        run(name)
    assert counts(name, seen) == {torch_threads}


@pytest.mark.parametrize("name", list(OPS))
def test_explicit_threads_above_torchs_setting_are_clamped_to_it(name):
    for torch_threads, asked, want in ((1, 2, 1), (2, 3, 2), (2, 1, 1), (2, 2, 2)):
        torch.set_num_threads(torch_threads)
        with threads_received() as seen:
            run(name, threads=asked)
        assert counts(name, seen) == {want}, (torch_threads, asked)


def same_bits(a, b):
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y)


@pytest.mark.parametrize("name", ALL)
def test_results_are_bit_identical_on_one_and_two_torch_threads(name):
    results = []
    for torch_threads in (1, 2):
        torch.set_num_threads(torch_threads)
        with threads_received() as seen:
            results.append(run(name))
        assert counts(name, seen) == {torch_threads}  # the two runs did differ in threads
    for a, b in zip(*results):
        same_bits(a, b)


# ---------------------------------------------------------------------------------------------
# Compiled graphs. torch.compile guards on torch's thread count (a torch.set_num_threads
# recompiles the frame), so the op's reading it when it runs shows where no guard intervenes: a
# backward run after the setting changed, and a torch.export program traced once.
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def fresh_dynamo():
    # each test's graphs are compiled under two settings (torch's guard): without a reset, the
    # tests' shared lambda would pass Dynamo's recompile limit of one code object
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def expected(torch_threads, threads):
    return torch_threads if threads == 0 else min(threads, torch_threads)


@pytest.mark.parametrize("threads", [0, 2], ids=["default_threads", "explicit_2_threads"])
@pytest.mark.parametrize("name", list(OPS))
def test_compiled_op_follows_torchs_thread_count(name, threads, fresh_dynamo):
    forward = OPS[name][1]
    compiled = torch.compile(lambda *xs: forward(*xs, threads=threads), fullgraph=True,
                             backend="aot_eager")
    for torch_threads in (2, 1, 2):
        torch.set_num_threads(torch_threads)
        with threads_received() as seen:
            got = run(name, compiled)
        assert counts(name, seen) == {expected(torch_threads, threads)}, torch_threads
        for a, b in zip(got, run(name, threads=threads)):
            same_bits(a, b)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("name", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule",
                                  "causal_conv1d_fn"])
def test_backward_reads_torchs_thread_count_when_it_runs(name, mode, fresh_dynamo):
    make, forward, functions = OPS[name]
    if mode == "compiled":
        forward = torch.compile(forward, fullgraph=True, backend="aot_eager")
    for before, after in ((2, 1), (1, 2)):
        torch.set_num_threads(before)
        xs = make()
        with threads_received() as seen:
            outs = forward(*xs)
            torch.set_num_threads(after)  # between the forward and its backward
            torch.autograd.grad(sum(o.sum() for o in outs), [x for x in xs if x.requires_grad])
        assert {f for f, _ in seen} == functions
        assert {t for f, t in seen if f.endswith("forward")} == {before}, seen
        assert {t for f, t in seen if f.endswith("backward")} == {after}, seen


class _Forward(torch.nn.Module):
    def __init__(self, forward):
        super().__init__()
        self.forward_fn = forward

    def forward(self, *xs):
        return self.forward_fn(*xs)


@pytest.mark.parametrize("name", list(OPS))
def test_exported_program_reads_torchs_thread_count_when_it_runs(name):
    make, forward, functions = OPS[name]
    torch.set_num_threads(2)
    program = torch.export.export(_Forward(forward), tuple(x.detach() for x in make())).module()
    for torch_threads in (1, 2):
        torch.set_num_threads(torch_threads)
        with threads_received() as seen:
            got = program(*(x.detach() for x in make()))
        assert {f for f, _ in seen} == functions - {"core_backward", "conv_backward"}
        assert {t for _, t in seen} == {torch_threads}
        same_bits(got, run(name)[0])


def test_serving_step_compiled_by_inductor_follows_torchs_thread_count(fresh_dynamo):
    compiled = torch.compile(fused_gdn_step, fullgraph=True, backend="inductor")
    for torch_threads in (2, 1):
        torch.set_num_threads(torch_threads)
        with threads_received() as seen:
            got = run("fused_gdn_step", compiled)
        assert counts("fused_gdn_step", seen) == {torch_threads}
        want = run("fused_gdn_step")
        same_bits(got[0], want[0])
        same_bits(got[2], want[2])  # the pools


# ---------------------------------------------------------------------------------------------
# Where torch says one thread without being told here: a DataLoader worker.
# ---------------------------------------------------------------------------------------------

_WORKER_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import torch, gdn.torch
from thread_spy import threads_received

def ops():
    x, w = torch.randn(2, 24, 30), torch.randn(24, 4)
    q, k = torch.randn(1, 40, 2, 16), torch.randn(1, 40, 2, 16)
    v, g, beta = torch.randn(1, 40, 4, 8), -torch.rand(1, 40, 4), torch.rand(1, 40, 4)
    with threads_received() as seen:
        gdn.torch.causal_conv1d_fn(x, w, activation="silu")
        gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=16)
        gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=16, threads=2)
    return [threads for _, threads in seen]

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 2
    def __getitem__(self, i):
        return torch.tensor(ops()), torch.get_num_threads()

if __name__ == "__main__":
    torch.set_num_threads(2)
    print("parent", ops())
    loader = torch.utils.data.DataLoader(Items(), batch_size=None, num_workers=1)
    for threads, torch_threads in loader:
        print("worker", threads.tolist(), torch_threads)
"""


def test_a_dataloader_worker_runs_the_ops_on_one_thread(tmp_path):
    # torch sets one thread in its workers (forked from a parent that ran on two); in its own
    # process, without JAX (whose threads make any fork unsafe)
    script = tmp_path / "worker.py"
    script.write_text(_WORKER_SCRIPT)
    result = subprocess.run([sys.executable, str(script), str(Path(__file__).parent)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines == ["parent [2, 2, 2]"] + ["worker [1, 1, 1] 1"] * 2, result.stdout


# ---------------------------------------------------------------------------------------------
# Whose threads: torch's OpenMP team (ATen's backend in torch's builds on PyPI) after
# run_on_torch_threads(True), gdn's pool after (False). In a process of its own, so that no
# earlier test has started gdn's pool.
# ---------------------------------------------------------------------------------------------

_TEAM_SCRIPT = """
import os, time, torch
import gdn.torch
from gdn import _gdn

def names():
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out.append(f.read().strip())
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return out

g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 200, 4, 32, generator=g) for _ in range(3))
gates, beta = -torch.rand(2, 200, 4, generator=g), torch.rand(2, 200, 4, generator=g)
def run(f):
    o, state = f(q, k, v, gates, beta, output_final_state=True)
    return torch.cat([o.flatten(), state.flatten()])
chunk = gdn.torch.chunk_gated_delta_rule
compiled = torch.compile(chunk, backend="aot_eager", fullgraph=True)
torch.set_num_threads(1)
one = run(chunk)
torch.set_num_threads(2)
team = gdn.torch.run_on_torch_threads(True)
joined = _gdn.team_helpers_joined()
eager, graph = run(chunk), run(compiled)
# torch's second thread ran a part of every team call (each a parallel region or more)
print("team", team, "helpers joined", _gdn.team_helpers_joined() - joined >= 2,
      "gdn-worker threads", names().count("gdn-worker"))
print("same bits", torch.equal(eager, one), torch.equal(graph, one))
assert gdn.torch.run_on_torch_threads(False) is False
pool = run(chunk)
for _ in range(3000):  # the pool's helper names itself when it starts, maybe after the call
    if "gdn-worker" in names():
        break
    time.sleep(0.01)
print("pool", "gdn-worker threads", names().count("gdn-worker"), torch.equal(pool, one))
"""


def test_ops_run_on_torchs_openmp_team_with_the_bits_of_one_thread(tmp_path):
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch's ATen does not run on OpenMP")
    script = tmp_path / "team.py"
    script.write_text(_TEAM_SCRIPT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [
        "team True helpers joined True gdn-worker threads 0",  # two threads, no pool
        "same bits True True",
        "pool gdn-worker threads 1 True",  # back on the pool: its helper, the same bits
    ], result.stdout


# ---------------------------------------------------------------------------------------------
# A transformers model patched onto gdn: prefill, cached decode and a training step.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("torch_threads", [1, 2], ids=["torch_1_thread", "torch_2_threads"])
def test_patched_transformers_model_runs_on_torchs_thread_count(torch_threads):
    pytest.importorskip("transformers")
    from hf_models import qwen3_next

    model = qwen3_next()
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    gdn.torch.patch(model)
    try:
        torch.set_num_threads(torch_threads)
        with threads_received() as seen:
            with torch.no_grad():
                model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
            model.train()
            model(ids, labels=ids, use_cache=False).loss.backward()
    finally:
        gdn.torch.unpatch()
    assert {f for f, _ in seen} == {"core_forward", "core_backward", "conv_forward",
                                    "conv_backward", "conv_update"}
    assert {t for _, t in seen} == {torch_threads}

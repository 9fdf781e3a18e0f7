"""Never worse (issue 13): `optimize` against `jax.jit` on programs of the kinds users write.

Programs: `jaxrewrite.strategies.perf_programs()` - ARX round functions on word states of shapes
(4,4), (5,5), (25,), (8,), (2,8), uint32 and "uint64" (uint32 without x64: `S.arx_recipes`),
static permutation schedules, messages with fan-out, 1-24 rounds, vmapped over 16..65,536 blocks
(each threshold of the CPU cost model included), as plain code, jitted helpers or a `fori_loop`;
and stencils of `jnp.roll`s on fields.

Properties, each measured in one process, paired (jit, optimize, optimize, jit, ...), medians; a
failure is measured again (twice) before it counts; where XLA compiled the same program both ways
the run is not timed twice:
- CPU run time <= 1.15x jax.jit's (+ 20 us for timer noise on tiny programs);
- compile time (lower + compile, the rewrite included, fresh caches) <= 3x jax.jit's unless the
  run is at least 1.5x faster, and never more than 15x (+ 0.1 s on tiny programs).

The promise is the CPU's: its thresholds are XLA:CPU's and its cost model's. On another backend
(a TPU host) the tests that time programs, or read XLA:CPU's compiled module, are skipped with
that reason (`cpu_timing`); bench/accelerator.py measures the same generated programs there. The
rewrite's decisions for the CPU (`target="cpu"`) and the equivalence checks run everywhere.

Budget: the CI part draws a few small programs (batches up to 4,096, up to 6 rounds) and stops
drawing after JAXREWRITE_PERF_SECONDS (default 60); the long run (`-m slow`, .ci/run) draws
from every size, from fixed seeds, until that many seconds are spent. Shrunk failures become named tests below.
"""
import os
import re
import statistics
import sys
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

import jaxrewrite
from jaxrewrite import strategies as S
from jaxrewrite._api import rewrite_jaxpr_with_report
from jaxrewrite.testing import assert_contract_equal, assert_equivalent, primitive_counts

with warnings.catch_warnings():  # (as tests/test_fuzz.py: hypothesis's failure reporting)
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import hypothesis.extra._patching  # noqa: F401
    except ImportError:
        pass

RUN_MAX, RUN_SLACK_S = 1.15, 20e-6
COMPILE_MAX, COMPILE_NEVER, FAST_ENOUGH, COMPILE_SLACK_S = 3.0, 15.0, 1.5, 0.1
FIRST_CALL_S = 60.0  # a first call slower than this is a failure (the catastrophe never ends)

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

_on_the_cpu = pytest.mark.skipif(
    jax.default_backend() != "cpu",
    reason="holds XLA:CPU's run and compile times (or its compiled module) to the CPU's "
           "never-worse promise; on an accelerator bench/accelerator.py measures these programs")


def cpu_timing(test):
    """XLA:CPU's times: skipped off the CPU, and the CPU's decisions whatever
    JAXREWRITE_TEST_TARGET says (the TPU's forms timed on XLA:CPU promise nothing)."""
    return _on_the_cpu(pytest.mark.default_target("cpu")(test))
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink]


# --- measuring ---------------------------------------------------------------------------------

def _compile(fn, args, opt: bool):
    """(seconds, compiled): trace + rewrite + lower + compile from fresh caches."""
    jax.clear_caches()
    f = jaxrewrite.optimize(fn) if opt else jax.jit(fn)
    t = time.perf_counter()
    c = f.lower(*args).compile()
    return time.perf_counter() - t, c


def _first_call(c, args, which):
    """Call once, in a thread: a program that does not finish within FIRST_CALL_S fails. (The
    thread cannot be stopped: an unfinished program keeps a core busy for what runs after it.)"""
    out = {}

    def go():
        out["v"] = jax.block_until_ready(c(*args))

    th = threading.Thread(target=go, daemon=True)
    t = time.perf_counter()
    th.start()
    th.join(FIRST_CALL_S)
    if th.is_alive():
        pytest.fail(f"the {which} program did not finish in {FIRST_CALL_S:.0f} s")
    return out["v"], time.perf_counter() - t


def _time(c, args, n):
    t = time.perf_counter()
    for _ in range(n):
        r = c(*args)
    jax.block_until_ready(r)
    return (time.perf_counter() - t) / n


_META = re.compile(r",? (metadata|stack_frame_id)=(\{[^}]*\}|\d+)")
_REF = re.compile(r"%[\w.-]+")
_INSTR = re.compile(r"^\s*(ROOT )?(%[\w.-]+) = (.*)$")
_HEADER = re.compile(r"^(ENTRY )?(%[\w.-]+) .*\{$")


def _program_text(compiled) -> str:
    """The optimized HLO up to naming and order: each instruction stands for its opcode, shape,
    attributes and (recursively) its operands and called computations, metadata dropped; the
    result is the entry computation's root. jax.jit's and optimize's traces of the same program
    number instructions and order independent ones differently (a 20-round ARX program differed
    in nothing else)."""
    canon: dict = {}
    body: list = []
    for line in compiled.as_text().split("\n")[1:]:
        if (h := _HEADER.match(line)) is not None:
            name, body = h.group(2), []
            continue
        if (m := _INSTR.match(line)) is not None:
            text = _REF.sub(lambda r: canon.get(r.group(0), r.group(0)), _META.sub("", m.group(3)))
            key = f"({text})"
            canon[m.group(2)] = key if len(key) < 200 else f"#{hash(key):x}"
            body.append((m.group(1) is not None, canon[m.group(2)]))
        elif line.strip() == "}" and body:
            root = [k for is_root, k in body if is_root]
            canon[name] = f"{{{root[0] if root else ''}|{len(body)}}}"
            last = canon[name]
    return last


def measure(recipe, repeats: int = 5, compiles: int = 1) -> dict:
    """Paired medians of run and compile seconds, jax.jit vs optimize (the order alternating
    pair by pair); outputs compared under the contract (integers bit for bit). Where XLA
    compiled the same program both ways (nothing rewritten that XLA sees), its run time is not
    measured twice: `same` is True and the run ratio 1 (on a shared machine, timing one program
    twice differed up to 2x)."""
    fn, args = recipe.fn, recipe.args
    cj_s, co_s = [], []
    for _ in range(compiles):
        t, cj = _compile(fn, args, False)
        cj_s.append(t)
        t, co = _compile(fn, args, True)
        co_s.append(t)
    want, t_j = _first_call(cj, args, "jax.jit")
    got, t_o = _first_call(co, args, "optimized")
    # integers bit for bit, floats (the real-code families) within the contract
    assert_contract_equal(got, want, meta=False)
    same = _program_text(cj) == _program_text(co)
    # calls per sample: about 5 ms of the slower form
    n = max(1, min(200, int(5e-3 / max(t_j, t_o, 1e-6))))
    rj, ro = [], []
    for k in range(1 if same else repeats):
        for c, out in ((cj, rj), (co, ro))[::1 if k % 2 == 0 else -1]:
            out.append(_time(c, args, n))
    run_jit = statistics.median(rj)
    return dict(run_jit=run_jit, run_opt=run_jit if same else statistics.median(ro),
                compile_jit=statistics.median(cj_s), compile_opt=statistics.median(co_s),
                same=same)


def violations(m: dict) -> list[str]:
    out = []
    run = m["run_opt"] / m["run_jit"]
    comp = m["compile_opt"] / m["compile_jit"]
    if m["run_opt"] > RUN_MAX * m["run_jit"] + RUN_SLACK_S:
        out.append(f"run {run:.2f}x jax.jit (limit {RUN_MAX}x)")
    fast = m["run_opt"] * FAST_ENOUGH <= m["run_jit"]
    limit = COMPILE_NEVER if fast else COMPILE_MAX
    if m["compile_opt"] > limit * m["compile_jit"] + COMPILE_SLACK_S:
        out.append(f"compile {comp:.1f}x jax.jit (limit {limit}x; run {run:.2f}x)")
    return out


def check_never_worse(recipe, repeats: int = 5):
    """The properties; a failure is measured again (more samples, twice) and counts only if
    every measurement fails."""
    m = measure(recipe, repeats)
    bad = violations(m)
    for _ in range(2):
        if not bad:
            break
        m = measure(recipe, 2 * repeats + 1, compiles=3)
        bad = violations(m)
    assert not bad, f"{recipe}: {'; '.join(bad)} ({m})"
    return m


# --- the property, in CI (a few small programs) and long (.ci/run) ------------------------------

_BUDGET = float(os.environ.get("JAXREWRITE_PERF_SECONDS", "60") or 60)
_CI_START: list = []


@cpu_timing
@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=_SUPPRESS, phases=_PHASES)
@given(recipe=S.perf_programs(max_batch=4096, max_rounds=6))
def test_never_worse_than_jax_jit(recipe):
    if not _CI_START:
        _CI_START.append(time.monotonic())
    if time.monotonic() - _CI_START[0] > _BUDGET:
        return  # budget spent: the remaining examples are the long run's
    check_never_worse(recipe, repeats=3)


@pytest.mark.slow
@cpu_timing
@pytest.mark.skipif(not os.environ.get("JAXREWRITE_PERF_SECONDS"),
                    reason="set JAXREWRITE_PERF_SECONDS for the long never-worse run")
def test_never_worse_long_time_bounded():
    """Batches of 5 programs, batch k drawn from seed JAXREWRITE_PERF_SEED + k (default 0): the
    same programs in the same order on every run (CI is reproducible; a faster machine only
    gets further), each batch different from the last."""
    deadline = time.monotonic() + _BUDGET
    first = int(os.environ.get("JAXREWRITE_PERF_SEED", "0") or 0)
    seen = {"n": 0}

    def batch(recipe):
        seen["n"] += 1
        check_never_worse(recipe)

    k = 0
    while time.monotonic() < deadline:
        run = settings(max_examples=5, deadline=None, database=None, derandomize=False,
                       suppress_health_check=_SUPPRESS, phases=_PHASES)(
            seed(first + k)(given(recipe=S.perf_programs())(batch)))
        run()
        k += 1
    assert seen["n"] > 0


# --- the guard: XLA:CPU's concatenate fusion recomputes shared values (issue 13) ----------------

def _fold_arx(rounds, batch=4096):
    """The issue's hash compression, re-joined into 8 words: a 4x4 uint32 state, quarter rounds
    on columns and diagonals (`jnp.take` and `argsort`), 16 message words per round each used
    twice. Split, XLA:CPU fused the 8-word re-join with everything before it and computed each
    shared value once per path: 100x slower at 2 rounds, unfinished after minutes at 3."""
    return S.ArxRecipe(shape=(4, 4), rounds=rounds, batch=batch, out="fold")


def test_join_cones_count_shared_values_once_and_paths_each():
    from jaxrewrite.passes.scalarize import _join_cones

    def f(x, y):
        a = x + y
        b = (a << np.uint32(7)) ^ (a >> np.uint32(25))
        return b + a

    x = jnp.zeros((8,), jnp.uint32)
    cj = jax.make_jaxpr(f)(x, x)
    (cone,) = _join_cones(cj.jaxpr.eqns, {"v": [cj.jaxpr.outvars[0]]})
    assert cone.pieces == 1 and cone.cones == (5,) and cone.paths == (7.0,) and cone.union == 5


def test_join_model_keeps_recomputing_rejoins_apart():
    from jaxrewrite.backend import cost as _cost
    shared = _cost.JoinCone(8, (10,) * 8, (12.0,) * 8, 40)       # paths ~ cones: fuse
    blowup = _cost.JoinCone(8, (10,) * 8, (1e6,) * 8, 40)        # exponential paths: apart
    wide = _cost.JoinCone(16, (10,) * 16, (1e6,) * 16, 40)       # > 8 operands: never fused
    m = _cost.join_model([shared, blowup, wide], 10, "cpu")
    assert m.apart == (1,)
    assert m.fused == 80 + 80 + 160 and m.growth == 32.0
    assert "kept apart" in m.summary and "recomputed" in m.summary
    assert _cost.join_model([blowup], 10, "gpu").apart == ()       # not modelled there


@cpu_timing
def test_arx_fold_rejoin_is_kept_apart_and_fast():
    r = _fold_arx(2)
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args), target="cpu")
    counts = primitive_counts(res.jaxpr)
    assert "gather" not in counts                                   # split: permutations gone
    stacks = [e for e in res.jaxpr.jaxpr.eqns if e.primitive.name == "stack"]
    assert [len(e.invars) for e in stacks] == [16]                  # 8 words, twice: > 8 operands
    (ev,) = [e for e in res.report.rewrites if e.pass_name == "scalarize"]
    assert any("kept apart" in a for a in ev.after)                 # the estimate, in explain()
    # XLA:CPU compiles no concatenate fusion, and the split form is faster than jax.jit
    hlo = jaxrewrite.optimize(r.fn).lower(*r.args).compile().as_text()
    fused = [c for c in hlo.split("\n\n") if c.lstrip().startswith("%fused")]
    assert fused and not any(" concatenate(" in c for c in fused)
    m = check_never_worse(r)
    # (faster, in the best of up to three measurements: a test run on all cores has put one
    # at 1.03x)
    ratios = [m["run_opt"] / m["run_jit"]]
    while ratios[-1] >= 1.0 and len(ratios) < 3:
        m = measure(r, 11)
        ratios.append(m["run_opt"] / m["run_jit"])
    assert min(ratios) < 1.0, ratios


def test_compile_heavy_split_is_declined_with_its_estimate():
    """A 24-round permutation network on 25 lanes: split, each of 25 pieces would carry the
    whole network in its own loop fusion (444x the level's equations): declined, the estimate
    in the reason; jax.jit's program is kept (run 0.99x, compile 1.2x in the property run)."""
    r = S.ArxRecipe(shape=(5, 5), rounds=24, quarter=False, message=False, batch=4096)
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args), target="cpu")
    (why,) = [d.reason for d in res.report.declines
              if d.pass_name == "scalarize" and "fused-code estimate" in d.reason]
    assert "compile time" in why and "25 lanes" not in why
    assert primitive_counts(res.jaxpr)["gather"] == 48


@pytest.mark.slow
@cpu_timing
@pytest.mark.parametrize("batch", [4096, 65536])
def test_arx_hash_10_rounds_never_slower(batch):
    """The issue's program at 10 rounds: jax.jit 8 ms; split and fused it did not finish."""
    m = check_never_worse(_fold_arx(10, batch))
    print(f"ARX 10 rounds x {batch}: run {m['run_opt'] / m['run_jit']:.2f}x, compile "
          f"{m['compile_opt'] / m['compile_jit']:.1f}x jax.jit")
    assert m["run_opt"] <= m["run_jit"]


@cpu_timing
def test_25_lane_fori_loop_is_not_unrolled_into_gathers():
    """Shrunk from the property run: a 25-lane state in a `fori_loop` of 4 rounds, 4,096 blocks.
    Unrolled (passes/flatten.py saw a splittable axis) and then not split (the fused-code
    estimate: 54x), it ran 2.6x slower than jax.jit's rolled loop. Axes of 17..32 are split by
    the estimate only (`backend.cost.TargetCosts.cost_axis`): the loop stays rolled."""
    r = S.ArxRecipe(shape=(5, 5), rounds=4, batch=4096, seed=4, message=False, fanout=1,
                    quarter=False, out="xor", wrap="fori")
    # (tile=False: the rounds loop alone; by default it also runs inside a loop over tiles)
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args), target="cpu", tile=False)
    counts = primitive_counts(res.jaxpr)
    assert counts.get("scan") == 1 and counts.get("gather", 0) <= 2
    check_never_worse(r)


@cpu_timing
def test_small_blocks_stay_jax_jits():
    """From CI's long property runs: below 4,096 blocks a split ran faster on some programs and
    slower on others (8 words, 20 jitted rounds, 1,025 blocks: 1.15-1.5x in six paired
    measurements; 4x4 words, 3 rounds, 1,024 blocks: 1.19x run, 4.4x compile), and nothing the
    model sees told them apart. Declined by the piece size, with the reason; both split at
    4,096 blocks (0.19x, 0.60x)."""
    import dataclasses
    for small in (S.ArxRecipe(shape=(8,), dtype="uint64", rounds=20, batch=1025, seed=1000,
                              message=False, fanout=2, quarter=False, undo=True, out="fold",
                              wrap="jit"),
                  S.ArxRecipe(shape=(4, 4), rounds=3, batch=1024, seed=0, message=True,
                              fanout=1, quarter=False, undo=False, out="state")):
        res = rewrite_jaxpr_with_report(jax.make_jaxpr(small.fn)(*small.args), target="cpu")
        assert not [e for e in res.report.rewrites if e.pass_name == "scalarize"]
        assert any(d.pass_name == "scalarize" and "(minimum 4096)" in d.reason
                   for d in res.report.declines)
        check_never_worse(small)
        big = dataclasses.replace(small, batch=4096)
        res = rewrite_jaxpr_with_report(jax.make_jaxpr(big.fn)(*big.args), target="cpu")
        assert "gather" not in primitive_counts(res.jaxpr)


@cpu_timing
def test_recomputing_pieces_stay_jax_jits():
    """From CI's long property run: 8 words mixed by a permutation every round, no message,
    4,096 blocks. Each of the 8 re-joined pieces' loops recomputes nearly the whole program
    (3.14x jax.jit's work per lane at 7 rounds: split ran 1.5-1.8x slower; 2.40x at 5 rounds:
    1.1-1.7x). Declined by the work per lane, with the reason; the 20-round uint64 form whose
    40 gathers jax.jit pays for (1.99x) still splits (0.25-0.32x)."""
    for rounds in (5, 7):
        slow = S.ArxRecipe(shape=(8,), dtype="uint32", rounds=rounds, batch=4096, seed=222,
                           message=False, fanout=2, quarter=False, undo=False, out="state")
        res = rewrite_jaxpr_with_report(jax.make_jaxpr(slow.fn)(*slow.args), target="cpu")
        assert not [e for e in res.report.rewrites if e.pass_name == "scalarize"]
        assert any(d.pass_name == "scalarize" and "work per lane" in d.reason
                   for d in res.report.declines)
    check_never_worse(slow)
    fast = S.ArxRecipe(shape=(8,), dtype="uint64", rounds=20, batch=4096, seed=1000,
                       message=False, fanout=2, quarter=False, undo=True, out="fold", wrap="jit")
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(fast.fn)(*fast.args), target="cpu")
    assert "gather" not in primitive_counts(res.jaxpr)


def test_join_model_bounds_one_fusions_size():
    """The largest fusion ending at a re-join: a piece's cone where each piece has its own loop,
    all the pieces' cones where one concatenate fusion holds them. Past `max_piece_cone`
    (XLA:CPU's fusion emitter falls off a cliff near 3,000 instructions) the split is declined
    for run time; the GPU is not modelled."""
    from jaxrewrite.backend import cost as _cost
    limit = _cost.costs("cpu").max_piece_cone
    apart = _cost.JoinCone(16, (limit + 1,) * 16, (float(limit + 1),) * 16, limit + 100)
    fused = _cost.JoinCone(4, (limit // 2,) * 4, (float(limit // 2),) * 4, limit + 1)
    small = _cost.JoinCone(16, (limit,) * 16, (float(limit),) * 16, limit + 100)
    for joins in ([apart], [fused]):
        m = _cost.join_model(joins, 10 * limit, "cpu")
        assert m.largest == limit + 1
        assert "loop fusion would hold" in _cost.fused_limit(m, "cpu")
    m = _cost.join_model([small], 10 * limit, "cpu")
    assert m.largest == limit and _cost.fused_limit(m, "cpu") is None
    assert _cost.join_model([apart], 10 * limit, "gpu").largest == 0


def _deep_arx(dtype, rounds=19, batch=4096):
    """From CI's long property run: a 4x4 ARX hash with a message, 19 quarter-round steps.
    Split, each of 16 words' loop fusions held a 3,557-equation cone: uint32 did not finish in
    60 s at 65,536 blocks (20 s at 4,096, against jax.jit's 6 ms); uint64 ran 2.1x."""
    return S.ArxRecipe(shape=(4, 4), dtype=dtype, rounds=rounds, batch=batch, seed=509,
                       message=True, fanout=3, quarter=True, undo=False, out="xor", wrap="jit")


def test_a_split_whose_pieces_carry_huge_cones_is_declined():
    for dtype in ("uint32", "uint64"):
        r = _deep_arx(dtype)
        res = rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args), target="cpu")
        assert not [e for e in res.report.rewrites if e.pass_name == "scalarize"]
        assert any(d.pass_name == "scalarize" and "loop fusion would hold 3557" in d.reason
                   for d in res.report.declines)
    # the same hash 12 rounds deep splits (cones of 2,213: 0.56x jax.jit's run time)
    r = _deep_arx("uint32", rounds=12)
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args), target="cpu")
    assert [e for e in res.report.rewrites if e.pass_name == "scalarize"]
    assert "gather" not in primitive_counts(res.jaxpr)


@pytest.mark.slow
@cpu_timing
@pytest.mark.parametrize("dtype", ["uint32", "uint64"])
def test_deep_arx_hash_never_slower(dtype):
    check_never_worse(_deep_arx(dtype, batch=65536))


def test_same_program_up_to_names_and_order_is_recognised():
    """`measure` times a program once where both compiles are the same HLO up to instruction
    names, metadata and the order of independent instructions (timing one program twice on
    a shared machine differed up to 2x): a program nothing is rewritten in is `same`; one
    whose permutations became renaming is not."""
    kept = S.ArxRecipe(shape=(4, 4), rounds=20, batch=4096, seed=1000, message=False,
                       quarter=False, out="fold", wrap="jit")     # CPU: declined, compile time
    split = S.ArxRecipe(shape=(8,), rounds=4, batch=4096, message=False, quarter=False,
                        out="fold")
    for r, same in ((kept, True), (split, False)):
        a = jax.jit(r.fn).lower(*r.args).compile()
        b = jaxrewrite.optimize(r.fn, target="cpu").lower(*r.args).compile()
        assert (_program_text(a) == _program_text(b)) is same, r


# --- beyond ARX (issue 23): static .at[] updates, state machines, symmetry groups -------------

@settings(max_examples=min(16, settings.default.max_examples), deadline=None, derandomize=True,
          database=None, suppress_health_check=_SUPPRESS, phases=_PHASES)
@given(recipe=S.real_code_recipes(max_batch=256))
def test_real_code_families_are_equivalent(recipe):
    """Every new family through optimize: integers bit for bit, floats (and the gradients of the
    float programs) within the contract. (vmap=False: each program is vmapped already.)"""
    assert_equivalent(recipe.fn, *recipe.args, vmap=False)


# Programs users write beyond ARX. The static updates among them ran 1.2-13x slower when every
# static `.at[].set` became a select (vmapped face turn int8 13x, float32 7.2x; a float register
# shift 1.23x; a `jnp.select` state machine 1.7-1.8x); the CPU now keeps them in place
# (`backend.cost.update_form`, tests/test_updates.py).
REAL_CODE = [
    # a vmapped Rubik's-cube face turn, int8 stickers and float
    S.ScatterRecipe(kind="face", dtype="int8", steps=3, batch=4096),
    S.ScatterRecipe(kind="face", dtype="float32", steps=3, batch=4096),
    # a register shift, jnp.roll(s, -1).at[k].set(new): vmapped; on a leading axis in a fori_loop
    S.ScatterRecipe(kind="shift", dtype="float32", steps=3, batch=4096),
    S.ScatterRecipe(kind="shift", dtype="uint32", steps=3, batch=4096, vmap=False, wrap="fori"),
    S.ScatterRecipe(kind="column", dtype="int8", steps=3, batch=4096),
    S.ScatterRecipe(kind="add", dtype="float32", steps=3, batch=4096),
    # state machines: lax.switch under vmap, and jnp.select over every branch's result
    S.SwitchRecipe(dtype="uint32", form="switch", batch=4096),
    S.SwitchRecipe(dtype="uint32", form="select", batch=4096),
    S.SwitchRecipe(dtype="float32", form="switch", batch=4096),
    # group convolutions: tables of 256 (4x4 translations), 648 (3x3 space group), 1,296 entries
    S.SymmetryRecipe(side=4, group="translations", batch=1024),
    S.SymmetryRecipe(side=3, group="space", batch=1024),
    S.SymmetryRecipe(side=6, group="translations", batch=1024),
]


@cpu_timing
@pytest.mark.parametrize("recipe", [pytest.param(r, id=repr(r)) for r in REAL_CODE])
def test_real_code_never_worse(recipe):
    check_never_worse(recipe)


@cpu_timing
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=_SUPPRESS, phases=_PHASES)
@given(recipe=S.real_code_recipes(max_batch=4096))
def test_real_code_never_worse_drawn(recipe):
    """Drawn with fixed seeds (these six held on main; REAL_CODE above has the misses)."""
    check_never_worse(recipe, repeats=3)


# --- the recipes earlier notes named as violating the property ------------------------------
#
# Found by drawing as test_never_worse_long_time_bounded does (hypothesis seed k, 5 examples a
# batch, JAXREWRITE_PERF_SEED=0): the first recipe with each named `seed` field, at batch k.

NAMED = {
    63: S.ArxRecipe(shape=(2, 8), dtype="uint64", rounds=24, batch=4095, seed=63, message=False,
                    fanout=2, quarter=False, undo=False, out="xor", wrap="jit"),        # k=0
    843: S.ArxRecipe(shape=(2, 8), dtype="uint32", rounds=17, batch=65536, seed=843,
                     message=True, fanout=2, quarter=False, undo=True, out="state"),    # k=5
    940: S.ArxRecipe(shape=(4, 4), dtype="uint64", rounds=1, batch=4095, seed=940,
                     message=False, fanout=1, quarter=True, undo=False, wrap="fori"),   # k=9
    509: S.ArxRecipe(shape=(4, 4), dtype="uint64", rounds=19, batch=65536, seed=509,
                     message=True, fanout=3, quarter=True, undo=False, out="xor",
                     wrap="jit"),                                                       # k=21
    601: S.ArxRecipe(shape=(2, 8), dtype="uint64", rounds=10, batch=1024, seed=601,
                     message=True, fanout=2, quarter=False, undo=True, out="xor",
                     wrap="jit"),                                                       # k=66
    451: S.ArxRecipe(shape=(5, 5), dtype="uint64", rounds=16, batch=16, seed=451,
                     message=False, fanout=1, quarter=True, undo=False, out="fold",
                     wrap="fori"),                                                      # k=184
}


@pytest.mark.parametrize("seed_", sorted(NAMED))
def test_named_recipe_is_equivalent(seed_):
    """Bit for bit against jax.jit, at the drawn size (the rewrites decide by size)."""
    r = NAMED[seed_]
    assert_equivalent(r.fn, *r.args, vmap=False, bitwise=True)


@pytest.mark.slow
@cpu_timing
@pytest.mark.parametrize("seed_", sorted(NAMED))
def test_named_recipe_never_worse(seed_):
    """Each held on main when re-measured (2026-12-05: optimize compiled the same program as
    jax.jit for all six, run 1.00x; compile 0.58-1.85x in single tries on a loaded machine)."""
    check_never_worse(NAMED[seed_])

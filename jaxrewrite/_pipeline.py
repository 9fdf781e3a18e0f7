"""The pass pipeline: a fixed, documented order, run to a fixed point, with a fallback.

A pass is a pure function `run(cj: ClosedJaxpr, ctx: Context) -> (ClosedJaxpr, changed)`
living in `jaxrewrite/passes/<name>.py`. The table below is the order:

1. fold       - integer/boolean index arithmetic over constants becomes literals; small jits
                called with constants are specialised at the call site (so gathers see indices),
                and inlined where the specialised body is trivial (one function per site, else).
2. gathers    - static-index gather/scatter/dynamic_slice become structural data movement.
2a. batched_updates - (TPU) a scatter with batching dims (vmapped dynamic_update_slice, `.at[i]
                .set`) becomes selects on iota masks, where XLA would loop over the batch.
3. movement   - data-movement algebra: slice∘concatenate, rev∘rev, permutation∘inverse, ...
3a. rounds    - (CPU, TPU; `reroll="auto"`) a Python loop of identical rounds becomes a
                `lax.scan` where flatten will then carry it split, as a `fori_loop` of those
                rounds is.
3b. flatten   - small jit calls and static-trip-count loops whose small axes are permuted are
                inlined / unrolled (cost model), so scalarize sees one region.
4. dedup      - structurally identical inner jaxprs become one object (lowered once).
5. cse        - identical pure equations on identical operands are computed once.
6. scalarize  - small static axes whose uses are all static become separate arrays.
   (fold is *enabling*: if other passes are enabled and none of them changes the program,
   fold's changes are dropped and the program is returned as it came.)
   (1-6 repeat until nothing changes, at most `max_rounds` times; each pass only removes
   or specialises, and dedup/cse never create work for fold, so the loop cannot oscillate.
   A pass runs again only when a pass that may create work for it (`PassSpec.enables`) changed
   the program since it last ran: dedup only shares objects, so it wakes cse and nothing else;
   fold reaches its own fixed point in one sweep (`own_fixpoint`), so it never wakes itself.
   A pass's change is followed by dead-code elimination unless the pass cannot leave dead
   code (dedup).)
7. reroll     - chains of identical calls, and runs of repeated inline code (outlined first,
                `passes/outline.py`), become `lax.scan` (once, at the end; off by default);
                where it rolled something, flatten and scalarize run once more, so that a
                rolled loop is split as a `fori_loop` is (`PassSpec.then`).
8. tile       - (CPU) a batch-independent program whose loop state exceeds the cache runs as a
                loop over tiles of its batch axis, its loops inside (once, at the end).
8a. threefry - (TPU) JAX's Threefry draws (`random_bits`, `random_split` on a typed key) are
                opened into their rounds on 1-D pieces, the counters an iota, so that the
                kernel pass makes one kernel of each (once, just before it).
8b. kernel    - (TPU) a region of integer work on split pieces (a split loop with its words,
                or straight-line rounds) becomes one Pallas kernel over (rows, 128) tiles of
                every piece, its loops inside (once, at the end; flatten keeps a loop rolled
                where this pass will take it).
9. literals   - large literals that repeat along an axis (a vmapped index table) become
                `broadcast_in_dim` of one copy (always on, once, at the end).

If a pass raises, or its change reads or binds a variable wrongly (checked after each pass
that changed the program, on the levels it made: a later pass that rebuilds a level by
renaming would make a variable bound twice a well-formed program computing something else),
or the rewritten program fails the final check (its signature: input and output shapes,
dtypes, weak types and shardings; its bindings; its new loops' typing; with `check="types"`,
or `debug_checks`, every new equation's typing), `rewrite` returns the original program and
one warning naming the pass;
with `strict=True` the error propagates. What the check cannot see (a program that fails to
lower) is caught where JAX lowers it (`_api`'s lowering fallback): the pipeline runs again
without the last pass that changed that program (`rewrite(..., without=...)`), then without the
one before it too, and at last the original program is lowered.
"""
from __future__ import annotations

import collections
import dataclasses
import gc
import importlib
import time
import warnings
from typing import Callable

from . import _compat as C
from . import _walk
from ._options import Options
from .backend import compile_options as _compile_options
from .report.records import Report, logger


@dataclasses.dataclass(frozen=True)
class PassSpec:
    name: str          # module jaxrewrite.passes.<name>, and the report's pass name
    option: str | None  # the option that enables it (None: always on)
    fixpoint: bool     # repeated to a fixed point (True) or run once at the end (False)
    # Passes whose work a change by this one may create (None: every pass, itself included).
    # Only a pass that provably cannot create work elsewhere names a smaller set.
    enables: tuple[str, ...] | None = None
    # Whether one run reaches the pass's own fixed point (then its change never wakes itself).
    own_fixpoint: bool = False
    # Whether a change by this pass can leave dead equations (then the pipeline removes them).
    makes_dead_code: bool = True
    # Whether the pass only prepares work for the others: where no other pass changes the
    # program, its changes are dropped and the program is returned as it came.
    enabling: bool = False
    # Whether the enabling passes prepare work for this one (then, where it is enabled and
    # changes nothing, their changes are dropped). tile: no (it tiles what it is given), so
    # `fold` alone with tile on keeps fold's changes, as it did before tile.
    uses_enabling: bool = True
    # Fixed-point passes run once more after this (run-once) pass changed the program, each
    # only where the one before it changed it too: reroll's scans are loops that flatten may
    # split, and scalarize then splits their bodies (a Python loop of Keccak rounds rolled and
    # split: 2.0x -> 0.8x the hand-written form's run on the CPU). A rolled network, where
    # flatten finds nothing, pays one flatten walk, not a second scalarize analysis.
    then: tuple[str, ...] = ()
    # Whether the option's value enables the pass (default: any true value).
    enabled_by: Callable[[object], bool] = bool
    # Whether the pass emits kernels for a compiler of their own (Pallas, lowered by Mosaic):
    # a failure raised there is laid at it, not at a pass that changed the program later.
    emits_kernels: bool = False
    # Whether the pass rebuilds levels by renaming their variables (then the bindings of what
    # changed before it are checked first: `_run`).
    renames: bool = False

    def wakes(self, other: str) -> bool:
        """Whether a change by this pass may give `other` work."""
        if other == self.name and self.own_fixpoint:
            return False
        return self.enables is None or other in self.enables


PASSES: tuple[PassSpec, ...] = (
    # fold is its own fixed point in one sweep (a folded value feeds the later equations of the
    # same sweep; a specialised body is folded when it is made): it never wakes itself.
    # Its changes alone give XLA nothing (XLA folds constants itself) and cost compile time:
    # `_take` calls specialised per call site, a 20-round ARX program whose gathers all
    # declined went from 23 to 61 MLIR functions and compiled 20% slower. Enabling only.
    PassSpec("fold", "fold", True, own_fixpoint=True, enabling=True),
    PassSpec("gathers", "gathers", True),
    # On the TPU, a scatter with batching dims (vmapped dynamic_update_slice, `.at[i].set`)
    # becomes selects on iota masks; one sweep takes every one it can.
    PassSpec("batched_updates", "gathers", True, own_fixpoint=True),
    PassSpec("movement", "movement", True),
    # A Python loop of rounds rolled where flatten will split the loop's carry: just before it.
    # (fold's work reaches it through flatten, which decides whether fold's changes are kept)
    PassSpec("rounds", "reroll", True, uses_enabling=False, renames=True),
    # flatten runs before scalarize: it removes the call and loop boundaries scalarize stops at.
    PassSpec("flatten", "flatten", True, renames=True),
    # Sharing changes no structure: no work for another pass but cse, no dead code.
    PassSpec("dedup", "dedup", True, enables=("cse",), makes_dead_code=False),
    # cse before scalarize: scalarize, the costliest analysis, then sees each round's program
    # once, where after it cse's change made it run a second round on the same program to find
    # the same nothing (RubiksCube: 23 of a 150 ms rewrite)
    PassSpec("cse", "cse", True),
    PassSpec("scalarize", "scalarize", True, renames=True),
    # (reroll="auto" leaves rolling to `rounds`)
    PassSpec("reroll", "reroll", False, then=("flatten", "scalarize"), renames=True,
             enabled_by=lambda v: bool(v) and v != "auto"),
    # Last: it rebuilds the whole program at tile size (the other passes' forms inside).
    PassSpec("tile", "tile", False, uses_enabling=False, renames=True),
    # JAX's Threefry draws opened into their rounds (an iota, 32-bit words) where the kernel
    # pass, next, makes one kernel of them; enabled as that pass is.
    PassSpec("threefry", "kernel", False, uses_enabling=False, renames=True,
             enabled_by=lambda v: v is not False),
    # After every pass that splits: a region of integer work on the pieces they left becomes
    # one Pallas kernel (TPU; `kernel=True`: any target). It takes what it is given.
    PassSpec("kernel", "kernel", False, uses_enabling=False, renames=True,
             enabled_by=lambda v: v is not False, emits_kernels=True),
    # After every pass that reads literals: the large ones fold made (or constants became) go
    # to XLA as the broadcasts they are. Always on; on its own it changes nothing worth keeping.
    PassSpec("literals", None, False, enabling=True, uses_enabling=False,
             makes_dead_code=False),
)


@dataclasses.dataclass
class Context:
    """What a pass may read (options) and write (the report).

    `cache` lives for one `rewrite` (all fixed-point rounds): passes keep memos there that are
    pure functions of a jaxpr *object* (its structural key; what fold made of it), so a nested
    jaxpr that no pass replaced is not analysed again in the next round.
    """
    options: Options
    report: Report
    cache: dict = dataclasses.field(default_factory=dict)
    # Devices the program is partitioned over (its inputs' shardings, the shardings jax.jit is
    # given, sharding constraints and shard_maps inside it); 1 for a single-device program.
    devices: int = 1

    @property
    def target(self) -> str:
        return self.options.resolved_target()


@dataclasses.dataclass
class RewriteResult:
    jaxpr: C.ClosedJaxpr
    report: Report
    changed: bool
    fell_back: bool = False

    @property
    def changed_by(self) -> tuple[str, ...]:
        """The passes that changed the program, in the order they did (a later failure is laid
        at one of them: `laid_at`)."""
        return tuple(self.report.stats.get("changed_by") or ())

    @property
    def last_pass(self) -> str | None:
        """The last pass that changed the program."""
        return self.changed_by[-1] if self.changed_by else None

    @property
    def compile_options(self) -> dict:
        """XLA options the rewritten program asks to be compiled with (`backend/
        compile_options.py`), as the report records them."""
        return self.report.stats.get("compile_options", {})


class PassError(RuntimeError):
    """A pass raised, or the program it left fails the final check; names the pass."""


def laid_at(changed_by: tuple[str, ...], in_kernel: bool) -> str | None:
    """The pass a failure to lower or compile the program is laid at: the last of `changed_by`
    (the passes that changed it, in order); where the failure was raised lowering or compiling
    a kernel (`in_kernel`), the last of them that emits kernels, if one did:

        changed_by ('gathers', 'kernel', 'literals'), Mosaic refused the kernel -> 'kernel'
        the same, XLA refused the program                                      -> 'literals'
    """
    if in_kernel:
        emitters = {spec.name for spec in PASSES if spec.emits_kernels}
        for name in reversed(changed_by):
            if name in emitters:
                return name
    return changed_by[-1] if changed_by else None


def _load(spec: PassSpec) -> Callable:
    return importlib.import_module(f"jaxrewrite.passes.{spec.name}").run


def enabled_passes(options: Options, extra: tuple = ()) -> list[tuple[PassSpec, Callable]]:
    out = []
    for spec in PASSES:
        if spec.option is None or spec.enabled_by(getattr(options, spec.option)):
            out.append((spec, _load(spec)))
    out.extend(extra)
    return out


def rewrite(cj: C.ClosedJaxpr, options: Options, *, extra_passes: tuple = (),
            shardings=(), check: str = "signature", without: frozenset = frozenset()
            ) -> RewriteResult:
    """Run the pipeline on `cj`. `extra_passes` ((PassSpec, fn) pairs) are appended (tests);
    `shardings`: what `jax.jit` is given (in/out shardings, any pytree of them); `check`: the
    final check of a changed program (`_final_check`), `"signature"` (its inputs and outputs,
    bindings, new loops' typing) or `"types"` (every new equation's typing: 10-45% of the
    rewrite's time on the bench programs, so only where nothing lowers the result after:
    `make_jaxpr`, `rewrite_jaxpr`); `without`: names of passes left out, enabled or not
    (`_api`'s fallback by pass: a program that fails to lower is made again without the pass
    laid at it; the report's `stats["without"]` says which)."""
    report = Report()
    passes = enabled_passes(options, extra_passes)
    if without:
        report.stats["without"] = sorted(without)
        passes = [(s, fn) for s, fn in passes if s.name not in without]
    ctx = Context(options, report, devices=program_devices(cj, shardings))
    t0 = time.perf_counter()
    # The passes allocate many small, short-lived objects while the whole program stays live:
    # Python's cyclic collector would rescan it again and again (a quarter of the rewrite time at
    # 16k equations). Reference counting still frees the garbage; collection resumes afterwards.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        out, changed = _run(cj, ctx, passes)
        if changed:
            t1 = time.perf_counter()
            _final_check(cj, out, report, "types" if options.debug_checks else check)
            report.time("final_check", time.perf_counter() - t1)
    except PassError as err:
        if options.strict:
            if err.__cause__ is None:   # the final check: no exception of a pass's own
                raise
            raise err.__cause__ from err
        warnings.warn(f"jaxrewrite: {err}; running the original program", RuntimeWarning,
                      stacklevel=C.user_stacklevel())
        report.errors.append(str(err))
        report.time("rewrite", time.perf_counter() - t0)
        return RewriteResult(cj, report, False, fell_back=True)
    finally:
        if gc_was_on:
            gc.enable()
    report.time("rewrite", time.perf_counter() - t0)
    report.stats["eqns_before"] = _walk.count_eqns(cj)
    report.stats["eqns_after"] = _walk.count_eqns(out)
    wanted = _compile_options.wanted(report.counts, ctx.target) if changed else {}
    if wanted:
        report.stats["compile_options"] = wanted
    return RewriteResult(out, report, changed)


# New equations of these primitives are type-checked by default: JAX lowers their parameters
# unchecked (a scan of length -7 lowers to a loop of no trips), where a wrong shape or axis
# elsewhere fails to lower and is caught there. Measured on the bench programs (scale 100-1,000
# blocks, ChaCha20, BLAKE2s, 32-layer Linen, NNX and Equinox steps with and without reroll):
# signature and bindings 0.1-2.8% of the rewrite's time, these typing rules 0.1-3.2%; every new
# equation's rule 10-45%, `check_jaxpr` of the whole program 120-215%.
TYPED_BY_DEFAULT = frozenset({"scan", "while", "cond"})


def _final_check(before: C.ClosedJaxpr, after: C.ClosedJaxpr, report: Report, check: str):
    """Raise `PassError` (laid at the last pass that changed the program) where `after` does
    not take and give what `before` does, reads or binds a variable wrongly, or has a new loop
    (`check="types"`: any new equation) that is ill typed. Nothing a pass does is trusted to
    have kept them."""
    by = report.stats.get("changed_by") or ["?"]
    why = (C.signature_difference(before, after) or _walk.binding_error(after, before)
           or _walk.typing_error(after, before, None if check == "types" else TYPED_BY_DEFAULT))
    if why is not None:
        report.count("pipeline.final_check_failed")
        raise PassError(f"the rewritten program fails the final check ({why}); the last pass "
                        f"to change it: '{by[-1]}' (passes that changed it: {by})")


# Primitives whose params may name a mesh or a sharding (a program partitioned from inside).
_SHARDING_PRIMITIVES = frozenset({"sharding_constraint", "shard_map", "jit", "pjit", "mesh_cast",
                                  "reshard", "device_put"})


def program_devices(cj: C.ClosedJaxpr, shardings=()) -> int:
    """How many devices `cj` is partitioned over (1: one device, as far as it says)."""
    n = max([1] + [C.sharding_devices(getattr(v.aval, "sharding", None))
                   for v in cj.jaxpr.invars] + [C.sharding_devices(s) for s in C.leaves(shardings)])
    unspecified = C.unspecified_sharding()
    for eqn in _walk.iter_eqns(cj):
        if eqn.primitive.name in _SHARDING_PRIMITIVES:
            for v in eqn.params.values():
                for s in (v if isinstance(v, tuple) else (v,)):
                    if s is not unspecified and s is not None:
                        n = max(n, C.sharding_devices(s))
    return n


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an array in stats: not provably the same, run again
        return False


def _then(cj, spec, loop, step, report, changers):
    """`spec.then`'s passes run once on `cj`, in order, each only where the one before
    changed the program. What they record again about what they saw before (the levels the
    run-once pass left as they were) is not recorded twice."""
    if not spec.then:
        return cj
    seen = collections.Counter(report.declines)
    start = len(report.declines)
    for s, fn in [(s, fn) for name in spec.then for s, fn in loop if s.name == name]:
        # (a pass of `then` that is not enabled, or left out, is passed over)
        cj, changed = step(cj, s, fn)
        if not changed:
            break
        changers.add(s)
    kept = []
    for ev in report.declines[start:]:
        if seen[ev] > 0:
            seen[ev] -= 1
            report.counts[f"{ev.pass_name}.declined"] -= 1
        else:
            kept.append(ev)
    report.declines[start:] = kept
    return cj


def _run(cj, ctx, passes):
    ran: list[str] = []

    # (pass name, id) -> program that pass left unchanged without recording anything: passes are
    # pure functions of the program, so the same object again (the next round) is skipped.
    quiet: dict = ctx.cache.setdefault("pipeline.quiet", {})

    def snapshot():
        r = ctx.report
        return len(r.rewrites), len(r.declines), dict(r.counts), dict(r.stats)

    changed_by: list = ctx.report.stats.setdefault("changed_by", [])

    # The last program whose bindings are known good. A pass that rebuilds levels by renaming
    # (`PassSpec.renames`: scalarize on the TPU's row, in tests/test_faults.py) turns a variable
    # bound twice into a well-formed program computing something else, which the final check
    # cannot see: before such a pass, what changed since this program is checked (the levels
    # made since, set operations only). Once per renaming pass, not after every pass: checking
    # after each change was 22-25 ms of a 340-370 ms rewrite of bench/scale.py's 10,000
    # equations, Dec 7.
    checked = [cj]

    def check_bindings(cj, spec):
        if cj is checked[0]:
            return
        why = _walk.binding_error(cj, checked[0])
        if why is not None:
            ctx.report.count("pipeline.final_check_failed")
            since = changed_by[-1] if changed_by else "?"
            raise PassError(f"the rewritten program fails the bindings check before pass "
                            f"'{spec.name}' ({why}); the last pass to change it: '{since}' "
                            f"(passes that changed it: {changed_by})")
        checked[0] = cj

    def step(cj, spec, fn):
        if quiet.get((spec.name, id(cj))) is cj:
            ran.append(spec.name)
            return cj, False
        t = time.perf_counter()
        if spec.renames:
            check_bindings(cj, spec)
        before = snapshot()
        try:
            new, changed = fn(cj, ctx)
            if changed and spec.makes_dead_code:
                new = _walk.dce_closed(new)
            if ctx.options.debug_checks:
                C.check_jaxpr(new)
        except Exception as e:  # noqa: BLE001 - any failure of a pass is contained
            raise PassError(f"pass '{spec.name}' failed ({type(e).__name__}: {e}); "
                            f"passes run before it: {ran or 'none'}") from e
        ctx.report.time(f"pass.{spec.name}", time.perf_counter() - t)
        ran.append(spec.name)
        if changed and (not changed_by or changed_by[-1] != spec.name):
            changed_by.append(spec.name)
        if not changed and new is cj and _same(snapshot(), before):
            quiet[(spec.name, id(cj))] = cj
        return new, changed

    original = cj
    cj = _walk.literalize_consts(cj, ctx.options.fold_limit)
    changers: set = set()
    loop = [(s, f) for s, f in passes if s.fixpoint]
    dirty = {s.name for s, _ in loop}       # passes with possible work: all, at first
    for rnd in range(max(1, ctx.options.max_rounds)):
        for spec, fn in loop:
            if spec.name not in dirty:
                continue
            dirty.discard(spec.name)
            cj, changed = step(cj, spec, fn)
            if changed:
                changers.add(spec)
                dirty.update(s.name for s, _ in loop if spec.wakes(s.name))
        ctx.report.count("pipeline.rounds")
        if not dirty:
            break
    else:
        logger.debug("pipeline reached max_rounds=%d", ctx.options.max_rounds)
    for spec, fn in passes:
        if not spec.fixpoint:
            cj, changed = step(cj, spec, fn)
            if changed:
                changers.add(spec)
                cj = _then(cj, spec, loop, step, ctx.report, changers)
    # (where only enabling passes are enabled, their changes are what was asked for)
    if (changers and all(s.enabling for s in changers)
            and any(not s.enabling and s.uses_enabling for s, _ in passes)):
        ctx.report.count("pipeline.enabling_dropped")
        ctx.report.stats["pipeline.enabling_dropped"] = (
            f"only {', '.join(sorted(s.name for s in changers))} changed the program: "
            f"returned as it came")
        return original, False
    return cj, bool(changers)

"""The per-backend cost model for data movement: rules as a table, decisions as pure functions.

What the rules rest on (measured with bench/permutations.py, jax 0.10.2, 65,536 blocks; GPU by
XLA's deviceless H200 compile, CPU on a shared 2-core machine):

* GPU: XLA fuses elementwise chains and free data movement (slice, reshape, transpose, rev,
  broadcast, bitcast) into one kernel; a `gather` or a `concatenate`/`pad` ends or splits a
  fusion. ChaCha20 with a static `jnp.take`: 51 kernels; `jnp.roll` per row + stack: 67; one
  concatenate of runs: 77; 4 row arrays with a take each: 17; 16 separate words (permutations
  are renaming): 2.
* CPU: fewer fusions is not always faster (ChaCha20 rows form: 76 fusions; take form: 20 fusions
  but 2.2x the 16-word form's run time). XLA:CPU copies each output's whole producer cone into
  its own loop fusion (the 16-word form: 16 fusions of ~1,570 HLO instructions each), so every
  re-join of pieces costs a loop per piece, and small pieces cost more loops than they save.
* CPU, fused code: a concatenate of at most 8 operands is fused with its producers, and that
  fusion's emitter computes a shared value once per path to it (an ARX hash re-joined into 8
  words: 100x slower); a piece re-joined otherwise gets its whole producer cone in a loop
  fusion of its own (compile time). `join_model` estimates both on the emitted split form.
* CPU, one loop fusion's size: XLA:CPU's fusion emitter runs a loop fusion past ~3,000
  instructions many times slower than the same code split in two (a 4x4 ARX hash, 4,096 blocks:
  piece cones of 2,981 / 3,173 / 3,365 / 3,557 equations ran 0.79x / 1.5x / 86x / 3,500x
  jax.jit's time; with the legacy emitter, `--xla_cpu_use_fusion_emitters=false`, the last one
  ran in 2.3-3.4 ms against jax.jit's ~6 ms). `max_piece_cone` keeps each such fusion below it.
* Compile time grows with the size of one fusion, on the GPU faster than linearly (16 words,
  5/10/15/20 double rounds: 1.8/7.9/17/23 s for the H200, deviceless). XLA's own fusion limits
  end a fusion past about `segment_eqns` compute equations, cutting where many values cross.
  A longer split region may be cut by optimization barriers at its narrowest points
  (`passes/_segments.py`; Keccak-f[1600], 24 rounds: 7 -> 4 kernels), but only where
  `autotune=True` counts fewer launches: the same cut took ChaCha20's 20 double rounds from 3
  kernels to 22. A shorter region is never cut (an optimization barrier in the middle of
  ChaCha20's 10 double rounds saved ~3 s of compile but cost the kernel the hand form does not
  have).

"uint64" in the figures below: the generated uint64 recipes as the tests run them, without
`jax_enable_x64`, i.e. uint32 arithmetic whose shifts by 32 or more give 0
(`strategies.arx_recipes`).

`target` is 'cpu', 'gpu' or 'tpu' (`ctx.target`); unknown targets use the 'gpu' row (the
strictest about concatenates).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class TargetCosts:
    # Scalar replacement (passes/scalarize.py)
    max_axis: int          # largest axis that may be split into separate arrays
    max_pieces: int        # most pieces one value may be split into (product of split axes)
    max_growth: float      # most equations after / before for one jaxpr level
    max_eqns: int          # most equations one level may have after splitting (compile time)
    join_cost: float       # cost of re-joining one value (a stack: a concatenate in HLO)
    mover_gain: float      # gain of one gather / concatenate / stack turned into renaming
    # Re-join pieces with one stack ("flat") or one per axis ("nested"). Measured: nested stacks
    # compile ~8x slower on XLA:CPU (ChaCha20: 149 fusions, 40 s vs 16, 5 s) and make more H200
    # kernels (seed program: 10 vs 7), so every target uses "flat".
    join_form: str = "flat"
    # Smallest piece (elements) worth a loop of its own. CPU, seed program, split vs jax.jit run
    # time per piece size (= batch), three runs on a shared machine: 256: 1.4-2.2x, then 0.94-1.03x;
    # 1024: 1.8-3.1x, then 0.42-0.87x; 4096: 0.46-0.62x; 16384: 0.41-0.79x. Generated ARX
    # programs (tests/test_never_worse.py), paired medians: at 1,024-2,048 blocks a split ran
    # 0.44-0.75x on some and 1.1-1.5x on others (8 words, 20 jitted rounds, 1,025 blocks: 1.15-1.5x
    # in six measurements, 0.19x at 4,096; 4x4 words, 3 rounds: 1.19x / 1.11x at 1,024 / 2,048,
    # 0.60x at 4,096), which nothing in the model told apart: jax.jit's arrays stay in cache there
    # and the split's strided loops gain nothing certain. From 4,096 every one measured ran faster.
    # GPU: kernels, not loops, cost: no minimum.
    min_piece_elements: int = 0
    # Where no kernel will take the split (pieces below `kernel_min_elements`; floats and narrow
    # or 64-bit words at any size), the most a level may grow: `nokernel_max_growth` times its
    # equations, and `nokernel_large_growth` times once it would pass `nokernel_max_eqns` (0: no
    # such limit). XLA:TPU compiles the split pieces as fusions of their own, and such splits
    # gain little on the chip. TPU v5e, the never-worse sweep at 4,096 (Dec 7,
    # bench/never_worse_sweep.py, `bench/results/never_worse_sweep_tpu.jsonl`): ARX levels split
    # from 47-256 to 640-3,328 equations (10.7-14.1x) compiled 3.1-15.5x `jax.jit` for runs of
    # 0.93-1.07x, and no split there ran faster than 0.92x (float stencils at 65,536: 0.89-1.03x).
    # The same sweep compiled for a TPU v5e with no TPU (Dec 7, `--compile-only`,
    # `bench/results/never_worse_compile_tpu.jsonl`) under the former limit (600 equations and 8x
    # both): 13 programs at 4,096 compiled 3.2-3.9x, 11 ARX programs that grew 9.4-9.9x (to
    # 263-502 equations) or 5.8-5.9x (to 1,603-1,739) and two float stencils 8.6x and 9.4x (to
    # 517 and 901); every one is declined by these limits, and 18 more that compiled 1.9-2.8x
    # (31 decisions of 652 changed; growth here is the whole program's equation count). Kept:
    # Salsa20/8 (349 -> 1,048 equations, 3.0x: compile 1.19x, run 0.94x at 4,096 on the chip),
    # ChaCha20 and xoshiro128** at 4,096, switch tables (up to 2.6x growth: runs 0.09-0.24x).
    # Newly declined among the accelerator bench's programs: the bitonic sort of 16 keys at
    # 4,096 (12x to 480 equations; on the chip run 0.99x, compile 1.84x); at 65,536 its kernel
    # takes it. Still past 3x there, for the chip to decide: float stencils at 65,536 that the
    # plan sees grow 2x and 8x (compile 6.1x and 3.1-3.3x) and an int8 scatter (3.8-4.7x, half
    # `jax.jit`'s bundles).
    nokernel_max_eqns: int = 0
    nokernel_max_growth: float = 0.0
    nokernel_large_growth: float = 0.0
    # `autotune=True`: how compiled launch counts (CPU fusions, GPU kernels) decide between the
    # original and the split form. GPU: a kernel launch is the cost, so fewer kernels wins and a
    # tie goes to the model. CPU: fewer fusions is not faster (ChaCha20: take form 20 fusions,
    # 16 words 16 fusions but 2.2x faster; seed program 7 -> 16 fusions and ~3x faster), so the
    # model decides and the count only vetoes a split whose fusions grow past
    # `max_launch_growth` (nested stacks on ChaCha20: 16 -> 149 fusions, compile 5 s -> 40 s).
    counts_decide: bool = True
    max_launch_growth: float = float("inf")
    # Static scatters (passes/gathers.py) may use a concatenate form of at most this many pieces
    # by default (0: only with gathers="all"). GPU: a scatter is a copy of the operand plus a
    # scatter kernel; the select form over one small concatenate fuses into one kernel (H200,
    # `x.at[:, idx].set(0.0)`: 2 -> 1 kernels, bench/gathers.py). CPU: the concatenate form ran
    # slower than the scatter there (1.3-1.7x in two bench/gathers.py runs), so the CPU keeps it.
    scatter_concat_pieces: int = 0
    # Static updates (`x.at[i].set(v)`, `dynamic_update_slice` at literal starts) as
    # `select_n(hit, x, moved(v))` ("select") or kept as the update ("in_place"). CPU: XLA
    # updates the buffer in place, costing the elements written, where the select reads and
    # writes the whole operand; measured slower wherever it was taken (paired, CPU, vs
    # jax.jit): a vmapped cube face turn `c.at[2].set(rot90(c[2]))` over 4,096 cubes 8.1x;
    # a register shift `roll(L, -1).at[7].set(t)`, 16 steps, 4,096 x 8 words 9.7x, in a
    # `fori_loop` 2.2x; jax-cfd's pressure solve gradient 1.12-1.24x. So the CPU keeps the
    # update, and takes the select only inside a level that scalarize splits (there it is
    # renaming: `passes/scalarize.py`). GPU: the scatter is a kernel of its own after a copy of
    # the operand, the select fuses (`x.at[:, idx].set(0.0)`: 2 -> 1 H200 kernels).
    update_form: str = "select"
    # Where `update_form` is "select": operands below this many elements keep the update
    # (0: no minimum). TPU v5e (Dec 8, bench/never_worse_sweep.py, the property test's static
    # column, face and register updates): at 4,096 examples (65,536-221,184 elements) the
    # select form ran a median 1.02x jax.jit (0.92-1.07x; A/A 0.92-1.09x) and compiled
    # 1.07-1.87x, two over the never-worse limit (1.07x, 1.05x); at 65,536 examples
    # (524,288-3,538,944 elements) it ran 0.81-1.04x. The small ones are launch-bound (0.13-0.15
    # ms whichever form) and the select adds fusions, so below the minimum the update stays
    # (`jax.jit`'s launches, where the select had 4-9 -> 6-18 for column writes), except where
    # only selects read it (`update_form_decision`); scalarize still takes it where a split
    # makes it renaming, as on the CPU.
    update_select_min_elements: int = 0
    # Re-rolling (passes/reroll.py): read per-layer operands from their list inside the loop
    # instead of stacking a copy (the parameters, alive through the backward loop). CPU: temp
    # memory of the N=24 stack's gradient 9.19 -> 4.69 MB at the same run time (+5% compile).
    # GPU/TPU: the `cond` that reads a row syncs its index to the host each step; not measured,
    # so they keep the stacked form.
    reroll_list_read: bool = False
    # Re-rolling: read each layer's row of a stacked result at an offset XLA cannot fold (the
    # offsets carried round a loop of as many trips, `reroll._offsets`), so the per-layer reads
    # and their consumers are one kernel for all layers. CPU: XLA:CPU compiles identical fused
    # kernels once, and a slice at another constant offset is another kernel (adam on 12 leaves
    # x 32 layers from slices of stacked gradients: 3.89 s constant, 1.21 s runtime offsets;
    # Linen's rolled gradient 3.44 -> 2.05 s, `bench/models.py --unstack`), bit for bit the
    # same values. GPU/TPU: not measured.
    reroll_runtime_offsets: bool = False
    # Re-rolling under `jax.grad`: a backward chain reading a forward chain's residuals runs the
    # forward body again instead (`passes/recompute.py`), so the forward scan stacks only its
    # carried inputs. CPU: a scan stacking every residual runs slower than the unrolled gradient
    # (a hand-written `nn.scan` of 16 Linen blocks: 1.23x its run time; with `nn.remat`, 0.78x
    # and 0.66x its compile time); reroll's own rolled Linen gradient, 16 blocks, went from
    # 1.3x / 1.15x jax.jit's run / compile time to 0.84x / 0.77x. GPU/TPU: recomputing costs
    # flops where stacking costs memory traffic; not measured, so they keep the residuals.
    reroll_recompute: bool = False
    # Recomputation in fused code (`join_model`). XLA:CPU fuses a concatenate of at most
    # `concat_fuse_max` operands (its kMaxConcatenateArguments, 8) with its producers, and that
    # fusion's emitter computes a shared value once per path to it, not once: a 10-round ARX
    # hash re-joined into 8 words (tests/test_never_worse.py) took 7.5e4x the instructions of
    # the unfused form, and 1,024 blocks ran 100x slower at 2 rounds and did not finish in 15
    # minutes at 10. A re-join whose paths exceed `max_recompute` x its shared cone is kept
    # out of that fusion (`analysis.pieces.Builder._stack_apart`: a stack of more than 8 operands;
    # each piece then has a loop fusion of its own, where shared values are computed once).
    # 0: no concatenate fusion modelled (GPU: not measured).
    concat_fuse_max: int = 0
    max_recompute: float = float("inf")
    # Compile time: XLA:CPU copies a re-joined piece's whole producer cone into the piece's own
    # loop fusion, so the instructions it compiles are the pieces' cones summed (`join_model`):
    # at most `max_fused_growth` of those per equation of the original level. Measured (paired,
    # compile / run vs jax.jit; estimated growth): ChaCha20, 4,096 blocks, 2 and 10 double
    # rounds 28.7x -> 8.7x / 0.62x and 36.8x -> 11-17x / 0.39x; 4x4 ARX hash with a message,
    # 1,024 blocks, 2 / 6 / 10 rounds 24.4x -> 9.4x / 0.70x, 29.9x -> 6.3x / 0.44x, 31x ->
    # 7-35x / 0.39x; 8 words re-joined apart, 4 rounds 14.9x -> 2.6x / 0.31x; 25 lanes, 2
    # rounds, 65,536 blocks 41.3x -> 8.8x / 0.33x; 24 rounds 444x (declined); rolls on 4x4
    # fields, 2 steps 19.2x -> 2.8x / 0.66x, 4 steps 51x -> 1.5x / 0.72x (declined:
    # conservative where jax.jit's own compile is slow). Compile ratios on a shared 2-core
    # machine vary 2-3x from run to run; the growth does not predict the run-time gain.
    max_fused_growth: float = float("inf")
    # Fewest compute equations a re-joined piece's loop must average: each loop reads its words
    # strided (one of every block's), which only enough work per element pays for. Seed program
    # (bench/seed.py), 65,536 blocks: `col << 1` 7 times, 7 per piece: split 2.7x slower than
    # jax.jit (paired, this machine; README had 0.57x); the mixing column, 67 per piece: 0.25x;
    # rolls on 4x4 fields, 48 per piece: 0.66x.
    min_piece_cone: int = 0
    # Most work per lane the split may do, relative to jax.jit's: each re-joined piece's loop
    # computes its whole cone, so where every round mixes the state, each piece recomputes
    # nearly all of it. Work per lane: split, the fused code (`join_model`); jax.jit, each
    # equation once on all of a value's words (the most pieces a value is split into), a
    # mover (gather) `mover_work` times an elementwise equation. Measured (paired, run vs
    # jax.jit; that ratio) on 8-word ARX states, 4,096 blocks: no message, 7 rounds 3.14 ->
    # 1.51-1.80x (1.05-1.55x at 16,384 blocks, 1.17-1.28x at 65,536: the never-worse property's
    # long run), 5 rounds 2.40 -> 1.12-1.73x; uint64, 20 jitted rounds with their permutations
    # undone (40 gathers) 1.99 -> 0.25-0.32x (0.12-0.22x at 65,536).
    max_lane_work: float = float("inf")
    mover_work: float = 1.0
    # Largest producer cone one re-joined piece may carry into its loop fusion (run time).
    # XLA:CPU (jax 0.10.2, its MLIR fusion emitter) falls off a cliff near 3,000 instructions
    # in one loop fusion. Measured (paired, run vs jax.jit; largest piece cone), 4,096 blocks:
    # 4x4 ARX hash with a message, 16 / 17 / 18 / 19 rounds 2,981 -> 0.79x, 3,173 -> 1.5x,
    # 3,365 -> 86x, 3,557 -> 3,500x (CI's long property run: not finished in 60 s at 65,536;
    # uint64 2.1x); ChaCha20 14 / 17 / 20 double rounds 2,163 -> 0.69x, 2,643 -> 0.53x,
    # 3,123 -> 7.1x, 24 unfinished in minutes. The wins measured above: cones of 1,369-1,859.
    # 0: none (GPU: not measured).
    max_piece_cone: int = 0
    # Axes longer than `max_axis`, up to this, are split too where the fused-code estimate
    # (`join_model`, `fused_limit`) allows it; 0: none. (passes/flatten.py looks at loop
    # carries along such axes only where scalarize's verdict is asked first or launches decide,
    # `loop_axis`: a 25-lane `fori_loop` unrolled and then not split ran 2.6x slower than kept
    # rolled.)
    cost_axis: int = 0
    # Tiling the batch axis (passes/tile.py): the per-core cache a loop's carried state should
    # fit (0: never tile; GPU: one kernel keeps the state on chip), the fraction of it one
    # tile's carry may take (the trip also writes the new carry and its temporaries), and the
    # smallest tile (per-tile loop overhead: tiles of 256 ChaCha20 blocks ran slower, issue 26).
    # Most bytes a loop may carry per batch element and still be tiled. Measured (paired, CPU,
    # tiled vs untiled optimize): ChaCha20's 16 u32 words (64 B), 8,192-65,536 blocks 0.48-0.58x;
    # Keccak-f[1600]'s 25 u64 lanes (200 B), 65,536 states, tiles of 256-4,096: 1.17-1.47x
    # (slower; 4,096 states 0.95x; not explained yet: its body is 52 thunks a trip, copies of
    # the carried lanes included), so it is not tiled.
    tile_max_element_bytes: int = 128
    tile_cache_bytes: int = 0
    tile_budget: float = 0.25
    tile_min: int = 512
    # Cores XLA:CPU splits one fusion over (its `outer_dimension_partitions`); 0: the cores this
    # process may run on. A tile is one core's share times this, meant to keep every core busy
    # as the untiled program does. Measured since (issue 26, 2 cores, Dec 6): XLA splits a
    # fusion by the bytes it touches, and no fusion of ChaCha20's rounds loop is split in tiles
    # of 8,192 (16 of 37 at 32,768, 36 of 37 untiled at 65,536), so the tiled loop runs on one
    # core (1.1-1.25 CPU seconds a second); the same split loop by hand in tiles of 32,768 and
    # untiled, its fusions split, ran 1.43x and 1.35x its 8,192 tile (docs/measurements.md).
    # The size stays: it measured fastest (`tile_budget`).
    tile_cores: int = 0
    # Whether a loop carrying arrays per element (not split into words) is tiled. Measured on the
    # CPU: tiles win on split carries (ChaCha20, BLAKE2s); an unsplit 4x4-word ARX loop over
    # 65,536 blocks ran 1.3-8.8x jax.jit tiled. Tests turn it on to exercise the rebuild.
    tile_array_carry: bool = False
    # Structural forms of a static gather (passes/gathers.py) the target runs slower than the
    # gather itself. `tile`: the (second-minor, minor) tile XLA pads an array's last two dims
    # to (None: not modelled); a form whose arrays pad to more elements than its operand is
    # declined. `max_rev`: longest axis a form may reverse (0: any). TPU v5e (bench/
    # tpu_costs.py, 65,536 rows, paired medians vs jax.jit, Dec 6): a reshape that splits the
    # minor axis pads every (8, 128) tile (`x[:, i ^ 1]` on (65,536, 64): reshape (32, 2),
    # rev, reshape ran 1.25x; the same on the major axis 1.30x; bitonic sorts of 32 and 64
    # keys, `x[..., i ^ j]`, 1.64x and 1.83x); a rev of the whole minor or major axis of 16-64
    # elements ran 1.05-1.18x; swapping halves (a rev of an axis of 2, nothing padded)
    # 0.92-0.97x; XLA:TPU's own gather of such a static permutation ran as fast as anything.
    tile: tuple | None = None
    max_rev: int = 0
    # Scatters with batching dims (`vmap` of `dynamic_update_slice`, or of `.at[i].set(v)` at a
    # per-example index) as one select on an iota mask per window position
    # (passes/batched_updates.py). XLA:TPU runs such a scatter as a while loop over the batch
    # (jax-ml/jax#21367, openxla/xla#12982). TPU v5e, (8192, 256) f32, 8-wide windows at
    # per-row starts: jax.jit 23.7 ms (about 2.9 us a trip); 8 selects 0.58 ms, bit for bit
    # (about 0.035 ns per element and select). Every select reads the whole operand, so the
    # form is taken where one example's operand elements times the window positions (selects)
    # is at most `batched_update_max_work` (2,048 there; about 84,000 would cost as much as a
    # trip; the TPU row takes 16,384, a fifth of that, as the margin of one measurement), and
    # the positions at most `batched_update_max_positions` (each is equations: compile time).
    # Measured since (bench/batched_updates.py, Dec 6): 8 positions over 4,096 elements
    # (32,768) ran 0.10x jax.jit as the hand-written select form, so the row takes 32,768.
    # 0: never (CPU: XLA updates in place; GPU: XLA makes one scatter kernel, the issue's own
    # GPU HLO).
    batched_update_max_positions: int = 0
    batched_update_max_work: int = 0
    # Compute equations per GPU kernel a split region may be cut into (`passes/_segments.py`):
    # XLA's GPU fusion keeps a split region one multi-output fusion up to about this size and
    # cuts a longer one where many values cross. Deviceless H200, 25-word Keccak-f[1600], 16,384
    # states: 8 rounds one kernel, 9 rounds two; 24 rounds 7 kernels split, 4 cut here (5 by
    # hand). ChaCha20's 16 words: 12 double rounds one kernel, 14 two; cut at 10 of 20, 22
    # kernels (not 3): so the cut is only proposed, and taken where `autotune=True` counts
    # fewer launches. 0: never cut.
    segment_eqns: int = 0
    # One Pallas TPU kernel for a region of integer work on split pieces (passes/kernel.py,
    # `kernel="auto"`): each piece laid out as (N/128, 128) words, `kernel_tile_rows` rows of
    # it per grid step (a multiple of 8; 16 words of (8, 128) fill a quarter of the 64 vregs);
    # emitted where pieces have at least `kernel_min_elements` elements (0: never by default on
    # this target) and the region holds a loop or at least `kernel_min_eqns` equations.
    # `kernel_input_fusion`: XLA may fuse each operand's producer (the split of the user's
    # (N, 4, 4) state) into the kernel's input. TPU v5e, ChaCha20 by hand (issue 41): one
    # kernel of 8-32 rows, the 10 double rounds inside, 1.0-1.2 ms at 1,048,576 blocks on
    # word-major data, 2.0-2.2 ms with the transposes from and to (N, 4, 4), against XLA's
    # 4.6 ms for the split program (36-79 launches); the same design by hand on Dec 7
    # (bench/tpu_dump.py): 1.80-1.89 ms, with the same 320 vector operations a loop trip as
    # the pass's kernel. The pass's own kernels, measured on the
    # chip (bench/tpu_kernel.py, Dec 6): the TPU row's entries, there. `kernel_min_eqns` (for
    # straight-line regions) and input fusion (it changed nothing: 2.05 against 2.04 ms) as
    # they were.
    kernel_min_elements: int = 0
    kernel_min_eqns: int = 0
    kernel_tile_rows: int = 16
    kernel_input_fusion: bool = False
    # The kernel reads and writes the user's arrays where XLA:TPU keeps them (`kernel_in_place`,
    # backend/tpu_layout.py): a (N, 4, 4) state whose pieces the region reads is one operand,
    # its words loaded as sublane-strided rows, and a re-join of the outputs into such an array
    # is written the same way, so XLA moves nothing around the kernel. ChaCha20 compiled for a
    # TPU v5e with no TPU (bench/tpu_aot.py, Dec 7): the pieces cost five relayout fusions,
    # 650K of the program's 1.23M bundles; by hand in place, the kernel was the only launch, at
    # 0.56M bundles (bench/tpu_dump.py's `hand_native`). On the chip (Dec 7, bench/tpu_kernel.py
    # --only chacha, 1,048,576 blocks, paired): in place 1.06 ms, on pieces 1.62 ms (`jax.jit`
    # 20.85 ms), one launch against six, compile 0.44 s against 4.31 s.
    kernel_in_place: bool = False
    # JAX's Threefry draws opened into their rounds for that kernel (passes/threefry.py,
    # `kernel="auto"`): from `threefry_min_elements` elements a draw (0: never by default;
    # `kernel=True` opens every draw it can). The TPU row's is 0, measured: on a TPU v5e (Dec 6,
    # bench/threefry.py) the kernel drew 16,777,216 / 67,108,864 words at 1.01x / 1.01-1.04x
    # `jax.jit` (A/A 0.98x / 1.00x) and a bf16 dropout mask of (16, 256, 4096) at 1.02-1.04x:
    # XLA's fusion of the same rounds is as fast (both are bound by the rounds' vector work,
    # not by HBM: rbg's bits take 0.54-0.72x). 65,536-1,048,576 words: 0.80-1.19x, launch-bound.
    threefry_min_elements: int = 0
    # Rows a grid step for a kernel region that reads no piece, only scalars and the iota (a
    # Threefry draw: it only writes), 0: `kernel_tile_rows`. Such a step of 16 rows writes 8
    # KiB, and a 67,108,864-word draw takes 32,768 steps. TPU v5e (Dec 6, bench/threefry.py,
    # 67,108,864 words, `jax.jit` 1.98 ms): rows 16 / 128 / 512 / 2048 ran 3.20x / 1.13x /
    # 1.03x / 1.01x `jax.jit` (16,777,216 words: 2.22x / 1.11x / 1.03x / 1.01x).
    kernel_generator_rows: int = 0


COSTS: dict[str, TargetCosts] = {
    #                  axis pieces growth  eqns   join  mover
    # CPU: a re-join costs a loop fusion per piece (seed program, 2 permutations removed and 1
    # re-join per call: 7 -> 112 fusions, 1.2-5x slower), so it must pay for 4 movers.
    # The trade this row makes (seed program, bench/seed.py, 65,536 wide): splitting takes CPU
    # fusions 7 -> 16 and compile time to ~2.4x jax.jit's, and runs ~3x faster; the report
    # records it (`scalarize.fusion_trade`: pieces whose re-joins cost a loop each).
    # Axes of 17..32 (`cost_axis`) and up to 32 pieces where the fused-code estimate allows (a
    # 25-lane state, 2 rounds with a message, 65,536 blocks: run 0.33x, compile 8.8x jax.jit;
    # 16 was the limit and it kept its gathers).
    "cpu": TargetCosts(16, 32, 24.0, 40_000, 4.0, 1.0, min_piece_elements=4096,
                       counts_decide=False, max_launch_growth=4.0, reroll_list_read=True,
                       reroll_runtime_offsets=True, reroll_recompute=True,
                       concat_fuse_max=8, max_recompute=2.0, max_fused_growth=48.0,
                       min_piece_cone=16, max_lane_work=2.2, mover_work=4.0,
                       max_piece_cone=2400, cost_axis=32, update_form="in_place",
                       tile_cache_bytes=1 << 20),
    # GPU: axes of 17..32 and up to 32 pieces too (Keccak-f[1600]'s 25 lanes: the hand-written
    # 25-word form's kernels where 16 pieces kept every gather, bench/permutations.py --keccak).
    "gpu": TargetCosts(16, 32, 24.0, 40_000, 1.0, 1.0, scatter_concat_pieces=8, cost_axis=32,
                       segment_eqns=1750),
    # TPU v5e: splitting as the GPU's row (not measured apart from ChaCha20 and the seed
    # programs, which ran faster split: bench/tpu_costs.py); gathers' forms as measured there
    # (`tile`, `max_rev`). No minimum piece: from 4,096 elements every split measured ran at
    # or below jax.jit's time (bench/accelerator.py: ChaCha20 0.83x, xoshiro128** 0.92x,
    # Salsa20/8 0.94x, bitonic sorts of 16 keys 0.99x); at batch 1 bench/updates.py's cube step
    # split ran 2.77x (327 -> 531 launches: launch-bound), but a minimum on the smallest piece
    # (the CPU's rule) also stops splits whose small pieces are shared scalars (Philox's key),
    # so it is left open. Kernels from 65,536
    # elements a piece, 16 rows a tile (bench/tpu_kernel.py, ChaCha20: at 65,536 blocks the
    # kernel ran 0.64x jax.jit against the split XLA program's 0.67x, compiling in 0.62x
    # against 0.95x; at 1,048,576 rows of 8 / 16 / 32 ran 0.108x / 0.098x / 0.103x).
    "tpu": TargetCosts(16, 16, 24.0, 40_000, 1.0, 1.0, tile=(8, 128), max_rev=2,
                       batched_update_max_positions=64, batched_update_max_work=1 << 15,
                       kernel_min_elements=65_536, kernel_min_eqns=64, kernel_tile_rows=16,
                       kernel_in_place=True, threefry_min_elements=0,
                       kernel_generator_rows=2048, nokernel_max_growth=8.0,
                       nokernel_max_eqns=500, nokernel_large_growth=5.0,
                       update_select_min_elements=1 << 18),
}


@contextlib.contextmanager
def override_row(target: str, **fields):
    """Within the block, `target`'s cost row has `fields` replaced (a bench's sweep of a
    cost entry: `with override_row("tpu", kernel_tile_rows=32): ...`). Not thread-safe: a
    program rewritten in another thread meanwhile sees the same row."""
    before = COSTS[target]
    COSTS[target] = dataclasses.replace(before, **fields)
    try:
        yield COSTS[target]
    finally:
        COSTS[target] = before


def costs(target: str | None) -> TargetCosts:
    return COSTS.get(target or "gpu", COSTS["gpu"])


@dataclasses.dataclass(frozen=True)
class ScalarizePlan:
    """What splitting one jaxpr level would do, counted before anything is emitted."""
    eqns_before: int
    eqns_after: int        # estimated: each split equation once per piece, plus splits/joins
    movers_removed: int    # gathers / concatenates / stacks that become renaming
    joins: int             # values re-joined because a consumer needs the whole array
    mixed_inexact: int = 0 # float values used both whole and in pieces
    piece_elements: int = 0  # elements of the smallest piece
    tile_dtypes: bool = True  # every split value of a dtype a kernel's tiles hold (32-bit words)


def update_form_decision(target: str | None, operand_elements: int, updated_elements: int,
                         forced: bool = False, feeds_selects: bool = False) -> str | None:
    """Why a static update stays an update (None: take the select form). `forced`:
    `gathers="all"`, which asks for every structural form. `feeds_selects`: every use of the
    result is a `select_n` (a vmapped `switch` merging its branches), which the select form
    joins, where the update would be a kernel of its own (TPU v5e, the property test's switch
    tables at 4,096: 9-45 launches with the select form, 13-65 with the update kept, `jax.jit`
    24-129; with the select form they ran 0.07-0.28x `jax.jit`), so below the minimum too."""
    c = costs(target)
    if forced or (c.update_form == "select"
                  and (operand_elements >= c.update_select_min_elements or feeds_selects)):
        return None
    if c.update_form == "select":
        return (f"kept as an update on {target}: its operand of {operand_elements} elements is "
                f"below {c.update_select_min_elements}, where the select form measured no "
                "faster and compiled slower (taken only where scalarize splits the updated axis)")
    return (f"kept as an in-place update on {target}: it writes {updated_elements} element(s); "
            f"the select form would read and write all {operand_elements} (taken only where "
            "scalarize splits the updated axis)")


def batched_update_decision(target: str | None, positions: int,
                            example_elements: int) -> str | None:
    """Why a scatter with batching dims stays a scatter (None: take the select form):
    `positions` selects (window positions times index rows per example), each over one
    example's `example_elements` operand elements."""
    c = costs(target)
    if not c.batched_update_max_positions:
        return f"on {target} XLA does not loop over the batch: the scatter is kept"
    if positions > c.batched_update_max_positions:
        return (f"window of {positions} positions per example: above "
                f"{c.batched_update_max_positions} on {target} (one select each)")
    if positions * example_elements > c.batched_update_max_work:
        return (f"{positions} select(s) over {example_elements} elements per example: "
                f"{positions * example_elements} above {c.batched_update_max_work} on {target} "
                "(the loop's trip writes only the window)")
    return None


def padded_elements(shape, tile) -> int:
    """Elements an array of `shape` holds once its last two dims are padded to `tile`."""
    shape = tuple(int(n) for n in shape)
    if len(shape) < 2:
        shape = (1,) * (2 - len(shape)) + shape
    lead = 1
    for n in shape[:-2]:
        lead *= n
    return lead * -(-shape[-2] // tile[0]) * tile[0] * -(-shape[-1] // tile[1]) * tile[1]


def movement_form_decision(steps, target: str | None) -> str | None:
    """Why a gather's structural form runs slower than the gather on `target` (None: take
    it). `steps`: (primitive, operand shape, result shape, lengths of the axes it reverses) of
    each emitted equation. A reshape whose result pads to more elements than its operand
    (`tile`) or a rev of a long axis (`max_rev`) declines it; transposes, slices, broadcasts
    and selects are taken (the transposes a batched form puts around its program are layouts
    XLA assigns)."""
    c = costs(target)
    for prim, before, after, revs in steps:
        if prim == "reshape" and c.tile is not None and \
                padded_elements(after, c.tile) > padded_elements(before, c.tile):
            return (f"its reshape {tuple(before)} -> {tuple(after)} pads to "
                    f"{padded_elements(after, c.tile)} elements in {c.tile} tiles, from "
                    f"{padded_elements(before, c.tile)}: on {target} the gather runs faster "
                    f"(x[:, i ^ 1] 1.25x, bitonic sorts 1.6-1.8x as such forms, "
                    f"bench/tpu_costs.py)")
        if prim == "rev" and c.max_rev and any(n > c.max_rev for n in revs):
            return (f"it reverses an axis of {max(revs)} elements (more than {c.max_rev}): on "
                    f"{target} the gather runs faster (a rev of 16-64 elements 1.05-1.18x, "
                    f"bench/tpu_costs.py)")
    return None


def scalarize_limit(plan: ScalarizePlan, target: str | None) -> str | None:
    """The reasons to decline that no measurement overrides (autotune included): nothing to
    gain, gradients summed in another order, compile-time limits."""
    c = costs(target)
    if plan.movers_removed == 0:
        return "no permutation along a small axis would become renaming"
    if plan.mixed_inexact:
        return (f"{plan.mixed_inexact} float value(s) would be used both whole and in pieces: "
                f"their gradients would be summed in another order")
    if plan.eqns_after > c.max_eqns:
        return (f"splitting would make {plan.eqns_after} equations at one level "
                f"(limit {c.max_eqns}: compile time)")
    if plan.eqns_before and plan.eqns_after / plan.eqns_before > c.max_growth:
        return (f"splitting would grow the level {plan.eqns_after / plan.eqns_before:.1f}x "
                f"(limit {c.max_growth}x: compile time)")
    return None


def pick_by_counts(before: int, after: int, model_go: bool, model_why: str | None,
                   target: str | None) -> tuple[bool, str]:
    """`autotune=True`: (take the split form?, why) from the launches of both compiled forms.

    | target row            | split form taken when                                         |
    | --------------------- | ------------------------------------------------------------- |
    | counts_decide (GPU)   | fewer launches; equal launches: the model's verdict            |
    | otherwise (CPU)       | the model's verdict, unless launches grow past max_launch_growth |
    """
    c = costs(target)
    counts = f"{before} -> {after} launches on {target}"
    if c.counts_decide:
        if after != before:
            return after < before, counts
        return model_go, f"{counts}, tie: " + ("cost model goes ahead" if model_go else
                                               f"cost model: {model_why}")
    if model_go and after > before * c.max_launch_growth:
        return False, f"{counts}: more than {c.max_launch_growth}x (compile time)"
    return model_go, f"{counts}; the cost model decides on {target}" + (
        "" if model_go else f": {model_why}")


# What a split costs where it is taken, said in the report (`report.stats["scalarize.trades"]`).
TRADES = {
    "cpu": ("CPU: splitting trades compile time and loop fusions for run time: each of the {joins} "
            "re-join(s) costs a loop per piece (seed program, bench/seed.py: fusions 7 -> 16, "
            "compile ~2.4x jax.jit's, run ~3x faster)"),
    "gpu": ("GPU: splitting trades compile time for kernels: one fusion grows with the split "
            "region ({eqns} equations)"),
}


def trade(plan: ScalarizePlan, target: str | None) -> str | None:
    """The trade a split makes on `target`, as the report says it (None: none known)."""
    row = "cpu" if target == "cpu" else "gpu" if target in ("gpu", "cuda", "rocm") else None
    if row is None or (row == "cpu" and not plan.joins):
        return None
    return TRADES[row].format(joins=plan.joins, eqns=plan.eqns_after)


def scalarize_piece_bound(largest: int, target: str | None, mode) -> str | None:
    """Before any analysis: the reason to decline when no split of a level could make a piece
    worth its loop (`largest`: the biggest piece any split could cut; 0 when none can split),
    else None. The same verdict `scalarize_decision` reaches after the analysis, found in one
    look at the level's movers instead of linking every equation."""
    c = costs(target)
    if mode == "auto" and 0 < largest < c.min_piece_elements:
        return (f"pieces of at most {largest} elements: on {target} a loop per piece costs more "
                f"than the permutation (minimum {c.min_piece_elements})")
    return None


def scalarize_decision(plan: ScalarizePlan, target: str | None, mode,
                       kernel="auto") -> str | None:
    """None to go ahead, or the reason to decline. `mode` is the `scalarize` option, `kernel`
    the `kernel` option (a split no kernel will take compiles as fusions: `nokernel_max_*`).

    Both modes: splitting must remove a permutation, keep equations within the compile-time
    limits, and never use a float value both whole and in pieces (its cotangent would then be
    summed in another order: gradients off by an ulp). `True` then goes ahead when at least as
    many permutations disappear as re-joins are added; `"auto"` weighs them by the target's
    costs (on the CPU a re-join costs a loop fusion per piece).
    """
    c = costs(target)
    hard = scalarize_limit(plan, target)
    if hard is not None:
        return hard
    if mode == "auto" and plan.piece_elements < c.min_piece_elements:
        return (f"pieces of {plan.piece_elements} elements: on {target} a loop per piece costs "
                f"more than the permutation (minimum {c.min_piece_elements})")
    # (a kernel takes integer words only: a float or narrow split of any size stays fusions)
    kernel_takes = (kernel_on(kernel, target) and plan.tile_dtypes
                    and kernel_size_reason(plan.piece_elements, kernel, target) is None)
    growth = plan.eqns_after / max(1, plan.eqns_before)
    if (mode == "auto" and c.nokernel_max_growth and not kernel_takes
            and (growth > c.nokernel_max_growth
                 or (plan.eqns_after > c.nokernel_max_eqns
                     and growth > c.nokernel_large_growth))):
        return (f"splitting would grow the level {growth:.1f}x to {plan.eqns_after} equations "
                f"that no kernel takes (pieces of {plan.piece_elements} elements, "
                f"kernel={kernel!r}): on {target} they compile as fusions of their own (limit "
                f"{c.nokernel_max_growth}x, {c.nokernel_large_growth}x past "
                f"{c.nokernel_max_eqns} equations: compile time)")
    if mode == "auto" and plan.movers_removed * c.mover_gain <= plan.joins * c.join_cost:
        return (f"{plan.movers_removed} permutation(s) would become renaming but {plan.joins} "
                f"re-join(s) would be needed: no gain on {target}")
    if mode is not None and mode != "auto" and plan.movers_removed < plan.joins:
        return (f"{plan.movers_removed} permutation(s) would become renaming but {plan.joins} "
                f"re-join(s) would be needed")
    return None



@dataclasses.dataclass(frozen=True)
class JoinCone:
    """One re-join of a split level, measured on the emitted equations (scalarize._join_cones).

    `cones`: per piece, the equations in its producer cone up to the level's fusion boundaries,
    each shared value once; `paths`: per piece, the same with sharing expanded (a value counted
    once per path from the piece to it: what XLA:CPU's concatenate emitter computes);
    `union`: the equations in all the pieces' cones together."""
    pieces: int
    cones: tuple
    paths: tuple
    union: int


@dataclasses.dataclass(frozen=True)
class JoinModel:
    apart: tuple           # indices of the joins kept out of a concatenate fusion
    fused: int             # instructions XLA would compile in the fusions ending at the joins
    pieces: int            # pieces re-joined, all joins together
    growth: float          # `fused` per equation of the original level
    summary: str           # the estimate, said in the report
    lanes: int = 1         # most pieces a value is split into (words jax.jit's equations hold)
    largest: int = 0       # the most equations one fusion ending at a re-join holds


def join_model(joins: Sequence[JoinCone], eqns_before: int, target: str | None,
               lanes: int = 1) -> JoinModel:
    """How XLA:CPU fuses the re-joins of a split level, and what it computes and compiles.

    | re-join of P pieces               | XLA:CPU makes                              |
    | --------------------------------- | ------------------------------------------ |
    | P > concat_fuse_max               | a loop fusion per piece (its cone)          |
    | P <= concat_fuse_max              | one concatenate fusion (each piece's cone)  |
    | ... and sum(paths) > max_recompute | kept apart (a stack of > 8 operands): a    |
    |     x sum(cones)                  | loop fusion per piece                      |

    Largest fusion (`largest`, bounded by `max_piece_cone`): a piece's cone in its own loop,
    all the pieces' cones (their union) in one concatenate fusion.
    Instructions compiled: the sum of the pieces' cones either way. Fused, the concatenate
    emitter computes sum(paths) instead: exponential along an ARX chain, where every rotate
    uses its operand twice. Targets with `concat_fuse_max` 0 are not modelled (GPU, TPU):
    nothing apart, and no growth limit.
    """
    c = costs(target)
    if not c.concat_fuse_max or not joins:
        return JoinModel((), 0, 0, 0.0, "")
    apart, fused, worst, largest = [], 0, 0.0, 0
    for k, j in enumerate(joins):
        fused += sum(j.cones)
        largest = max(largest, max(j.cones, default=0))
        if j.pieces > c.concat_fuse_max:
            continue
        ratio = sum(j.paths) / max(1, sum(j.cones))
        worst = max(worst, ratio)
        if ratio > c.max_recompute:
            apart.append(k)
        else:  # one concatenate fusion holds all the pieces' cones
            largest = max(largest, j.union)
    growth = fused / max(1, eqns_before)
    summary = (f"fused-code estimate on {target}: {fused} instructions for {len(joins)} "
               f"re-join(s) ({growth:.1f}x the level's {eqns_before} equations)")
    if worst > 1:
        summary += f"; shared values recomputed up to {worst:.3g}x in a concatenate fusion"
    if apart:
        summary += f", {len(apart)} re-join(s) kept apart (each piece its own loop fusion)"
    return JoinModel(tuple(apart), fused, sum(j.pieces for j in joins), growth, summary,
                     max(lanes, 1), largest)


def lane_work(model: JoinModel, plan: ScalarizePlan, target: str | None) -> float:
    """The split's work per lane over jax.jit's (`TargetCosts.max_lane_work`)."""
    c = costs(target)
    jit = (plan.eqns_before + (c.mover_work - 1) * plan.movers_removed) * model.lanes
    return model.fused / max(1.0, jit)


def fused_limit(model: JoinModel, target: str | None,
                plan: ScalarizePlan | None = None) -> str | None:
    """The reason to decline a split by its fused code (too much of it: compile time; too
    little per piece, or recomputed per lane: run time), or None."""
    c = costs(target)
    if model.growth > c.max_fused_growth:
        return (f"{model.summary}: more than {c.max_fused_growth:g}x the level's equations "
                f"(compile time)")
    if c.max_piece_cone and model.largest > c.max_piece_cone:
        return (f"{model.summary}: a re-joined piece's loop fusion would hold {model.largest} "
                f"equations, more than {c.max_piece_cone} (XLA:CPU's fusion emitter runs "
                f"larger loops many times slower: run time)")
    if plan is not None and (work := lane_work(model, plan, target)) > c.max_lane_work:
        return (f"{model.summary}: {work:.2f}x jax.jit's work per lane, more than "
                f"{c.max_lane_work:g}x (each re-joined piece's loop recomputes its cone)")
    if model.pieces and model.fused < c.min_piece_cone * model.pieces:
        return (f"{model.summary}: {model.fused / model.pieces:.1f} equations per re-joined "
                f"piece's loop, fewer than {c.min_piece_cone} do not pay for reading its words "
                f"strided")
    return None


# --- Loop shape (passes/flatten.py): unroll a static-trip-count loop, or keep it rolled --------

@dataclasses.dataclass(frozen=True)
class LoopCosts:
    # Most equations a loop may have unrolled (compile time grows with them; on the GPU one
    # fusion's compile time grows faster than linearly, until XLA's own fusion limits end it).
    max_unrolled_eqns: int
    # Launches one trip of a rolled loop costs beyond its body's: the GPU evaluates the loop
    # condition as a kernel and reads it back each trip; XLA:CPU runs the loop in-process.
    trip_launches: float
    # Whether launches saved are reason enough (GPU), or the body must move data along a small
    # axis of its carry so that scalarize turns the permutations into renaming (CPU: a rolled
    # loop costs little there; unrolling alone only adds compile time).
    launches_decide: bool
    # Whether `"auto"` keeps a loop rolled and splits its carry (passes/loop_carry.py) instead
    # of unrolling it: where launches do not decide, unrolling only multiplies compile time by
    # the trip count (CPU, ChaCha20 fori_loop, 10 double rounds unrolled and split: compile
    # 21-28x jax.jit's, run 0.4-0.56x).
    split_carry: bool = False
    # Fewest permutations (static gathers, revs, concatenates of slices) of carried data per trip
    # for a carry to be split. XLA:CPU copies each carried piece every trip (the body reads it in several
    # fusions while its buffer is rewritten: 16 copies and 16 fusions a trip for a 4x4 state,
    # against jax.jit's one fusion, where a lone gather fuses into its consumer). Measured (CPU,
    # paired run ratios vs jax.jit): one permutation per trip ran slower split (4x4 ARX state,
    # 1-4 trips, 4,096-65,536 blocks: 1.5-6.8x; the seed program's inner function, 7 trips:
    # 1.15-2.2x); two or more ran faster (8 words, a permutation and its inverse: 0.27-0.39x;
    # ChaCha20, diagonals and back: 0.16x; 4x4 quarter rounds with a message: 0.31x). A gather
    # of a loop-invariant message does not count: 4x4 state, one permutation and a message
    # gather per trip ran 1.2-1.75x split.
    min_body_permutations: int = 0
    # Fewest trips for a carry to be split (CPU). The split body's compile time is paid once,
    # whatever the trip count, and only trips pay it back; a shorter loop stays as it was: an
    # unrolled split costs the same compile time for the same few trips. Measured (CPU, paired,
    # compile / run vs jax.jit): 4x4 state, quarter rounds with a message, 95 equations a trip,
    # 65,536 blocks: 2 trips unrolled and split 6.3-7.5x / 0.93-1.01x, 3 trips rolled and split
    # 3.1x / 0.61x; 25-lane state with a message, 16 equations a trip, 4,097 blocks, 2 trips
    # unrolled and split 3.7x / 0.74x (the promise: over 3x compile only for a 1.5x run).
    min_split_trips: int = 1
    # Equations a trip times trips per carried piece that a split must exceed (`split_pays`). What
    # a split costs grows with the pieces (XLA:CPU compiles a loop fusion and a copy per carried
    # piece each trip: 56 fusions for 25 pieces, against jax.jit's 3), what it saves with the work
    # the loop does. Measured (CPU, paired medians of 15, compile / run vs jax.jit; equations x
    # trips / pieces): 25 lanes, a permutation and its inverse, 14 equations a trip, 4,096 and
    # 65,536 blocks: 3 trips (1.7) 3.7-6.1x / 0.74-1.11x, 4 trips (2.2) 3.8-5.1x / 0.67-0.81x, 6
    # trips (3.4) 3.8-4.9x / 0.58x, 8 trips (4.5) 4.0-4.7x / 0.41-0.50x; the same with quarter
    # rounds and a message, 16 equations: 4 trips (2.6) 4.7x / 0.68x, 6 trips (3.8) 4.6x / 0.66x;
    # 4x4 u64, 16 equations, 4 trips (4.0) 3.8-4.8x / 0.70-0.72x; 25 u32 words, 12 equations, 10
    # trips (4.8) 4.3-5.2x / 0.42-0.44x; 4x4 quarter rounds, 95 equations, 3-4 trips (18-24):
    # 2.8-4.4x / 0.50-0.63x; CI's long never-worse run, 25 words with a message, 16 equations, 7
    # trips (4.5): 5.1x / 0.71x twice. Work alone does not separate 4-5 (noise there is +-40%),
    # so the line is drawn above it.
    min_split_work: float = 0.0
    # Fewest permutations of carried data per trip for a carry to be split where the split
    # loop's state stays out of the cache: larger than the cores' caches, and not tiled
    # (`TargetCosts.tile_max_element_bytes`, or `tile=False`). Each trip then goes to memory,
    # as jax.jit's loop does, and only the passes over the state that the permutations cost
    # jax.jit are saved. Measured (CPU, paired medians of 9, run vs jax.jit; 16,384-65,536
    # blocks): 25 u64 lanes (200 B a block, not tiled), 2 permutations a trip, 4-15 trips:
    # 0.70-1.10x for 3.9-5.1x the compile time; the same at 4,096 blocks (800 KB, in cache)
    # 0.55x; 25 u32 words, 3-4 trips at 65,536, `tile=False`: 0.79-1.03x (tiled 0.58-0.77x);
    # Keccak-f[1600] (5 a trip, bench/permutations.py --keccak) wins untiled.
    min_memory_permutations: int = 0


LOOP_COSTS: dict[str, LoopCosts] = {
    # CPU: ChaCha20 (bench/permutations.py, 65,536 blocks): the fori_loop form unrolled and split
    # ran 1.00x the hand-written 16-word form (rolled, as jax.jit: 1.68x); a rolled loop costs
    # no launches there, so only a split pays for the compile time unrolling adds.
    "cpu": LoopCosts(4000, 0.0, launches_decide=False, split_carry=True,
                     min_body_permutations=2, min_split_trips=3, min_split_work=5.0,
                     min_memory_permutations=4),
    # GPU: every trip launches the body's kernels plus the condition's. H200 (deviceless XLA
    # compile, 65,536 wide): ChaCha20 fori_loop 8 kernels / 54 launches per call -> 3 / 3
    # unrolled and split; the seed's inner function in fori_loop(0, 7): 8 / 39 -> 1 / 1.
    # 6,000 equations: Keccak-f[1600]'s 24 rounds (5,328 unrolled) are one region, as its
    # Python loop form is (bench/permutations.py --keccak).
    "gpu": LoopCosts(6000, 1.0, launches_decide=True),
    # TPU v5e: a loop unrolled to save launches gains little and compiles long; kept rolled
    # with its carry split, it runs faster and compiles faster. ChaCha20 (the author's
    # fori_loop, bench/tpu_costs.py, paired medians vs jax.jit, Dec 6), unrolled and split /
    # rolled and split: 4,096 blocks run 1.05x / 0.83x, compile 14.9x / 1.8x; 65,536 0.91x /
    # 0.69x, 5.2x / 0.79x; 262,144 0.68x / 0.39x, 4.3x / 1.2x; 1,048,576 0.23x / 0.15x, 1.5x /
    # 0.64x. The split's thresholds are the CPU's (not measured apart on the TPU).
    "tpu": LoopCosts(4000, 1.0, launches_decide=False, split_carry=True,
                     min_body_permutations=2, min_split_trips=3, min_split_work=5.0),
}


def loop_costs(target: str | None) -> LoopCosts:
    row = "cpu" if target == "cpu" else "tpu" if target == "tpu" else "gpu"
    return LOOP_COSTS[row]


def loop_axis(target: str | None) -> int:
    """Largest small axis of a loop's carry that flatten looks at. Up to `cost_axis` where
    scalarize's verdict on the split body is asked before anything changes (`split_carry`) or
    launches decide (unrolled, the loop saves its launches split or not); else `max_axis`
    (unrolled on the CPU and then not split, a 25-lane `fori_loop` ran 2.6x slower than rolled)."""
    c, lc = costs(target), loop_costs(target)
    if lc.split_carry or lc.launches_decide:
        return max(c.max_axis, c.cost_axis)
    return c.max_axis


@dataclasses.dataclass(frozen=True)
class LoopPlan:
    """A loop with a static trip count, as the unroll decision sees it."""
    trips: int
    body_eqns: int
    body_movers: int       # gathers / concatenates / stacks / revs in the body (end fusions)
    permutes: bool         # the body reorders data along a small axis of its carry (a static
                           # gather, a rev, a concatenate of slices): scalarize's seeds
    piece_elements: int = 0  # the biggest piece a split of those axes could make
    splits: bool = True    # whether scalarize runs (the `scalarize` option)
    moves: bool = True     # the body moves data (a re-join included) along a small carry axis
    body_permutations: int = 0  # equations of the body that reorder carried data


def unroll_decision(plan: LoopPlan, target: str | None, mode) -> tuple[str | None, str]:
    """(None to unroll, or the reason to keep the loop rolled; the estimate, for the report).

    Estimated launches per call: rolled, each trip launches its body's kernels (one, plus one
    per fusion-ending mover) and `trip_launches`; unrolled, a split region is one kernel and an
    unsplit one keeps its movers' kernels. `mode` is the `flatten` option: True unrolls within
    the compile-time limit whatever the estimate.
    """
    c = loop_costs(target)
    eqns = plan.trips * plan.body_eqns
    rolled = plan.trips * (1 + plan.body_movers + c.trip_launches)
    unrolled = 1 + (0 if plan.permutes else plan.trips * plan.body_movers)
    summary = (f"~{rolled:g} launches/call rolled, ~{unrolled:g} unrolled; "
               f"{plan.body_eqns} -> {eqns} equations (compile time)")
    if not plan.moves:
        return "no data movement along a small axis of the carry", summary
    if eqns > c.max_unrolled_eqns:
        return (f"{eqns} equations unrolled (limit {c.max_unrolled_eqns}: compile time); "
                f"{summary}"), summary
    if mode is True:
        return None, summary
    if not c.launches_decide:
        # unrolled, the loop gains only what scalarize then makes of it
        why = ("no permutation along a small axis of the carry to make renaming"
               if not plan.permutes else "scalarize is off" if not plan.splits else
               f"pieces of at most {plan.piece_elements} elements would not be split (minimum "
               f"{costs(target).min_piece_elements})"
               if plan.piece_elements < costs(target).min_piece_elements else None)
        if why is not None:
            return f"{why}; on {target} launches do not decide ({summary})", summary
    if unrolled >= rolled:
        return f"no launches saved ({summary})", summary
    return None, summary


# --- re-rolling (passes/reroll.py) -----------------------------------------------------------------
# What a rolled chain costs once it is differentiated, per target: rows of (has a contraction?).
# A body with a contraction (dot_general, conv: a layer) rolls forward and backward: its
# backward loop is bound by the contractions, not by the loop (bench/dedup.py's stack: compile
# ~4x faster, run ~1.0x). A body without one (a stencil or elementwise time step) is bound by
# memory traffic: XLA fuses the unrolled steps across step boundaries, the rolled backward reads
# stacked residuals step by step. Measured on XLA:CPU, 6 steps of a lattice-Boltzmann stencil
# (jnp.roll of a (128, 128, 9) field), paired medians of 7: forward rolled 0.83x jax.jit's run
# time; `jax.grad(optimize(f, reroll=True))` rolled 1.38x, `optimize(jax.grad(f), reroll=True)`
# 1.15x. So without a contraction only the forward is rolled (its derivative is the unrolled
# chain's) and a backward chain is not rolled. GPU/TPU: not measured; they take the CPU's rule.
REROLL_CONTRACTIONS = frozenset({"dot_general", "conv_general_dilated", "ragged_dot_general"})
REROLL_BACKWARD = {
    "cpu": {True: None,
            False: "the body has no contraction (a stencil): on cpu a rolled backward pass "
                   "reads its residuals step by step where the unrolled one fuses across steps "
                   "(6-step lattice-Boltzmann gradient: 1.15-1.38x jax.jit's run time)"},
}


def reroll_backward(has_contraction: bool, target: str | None) -> str | None:
    """None when a rolled chain's backward pass may be rolled too on `target`, else why not."""
    return REROLL_BACKWARD.get(target or "cpu", REROLL_BACKWARD["cpu"])[has_contraction]


# What in a body makes the rolled loop run slower (CPU), by default: rolling a body whose
# contractions sit among equations that move data or call a library every trip (`REROLL_MOVERS`)
# is declined, as a soft verdict that `autotune="time"` measures instead (`reroll_body`). Measured
# (CPU, a 2-core machine shared with 3 other jobs at load 8-15, paired medians of 9-11 rounds, a
# second optimize of the same program as A/A control; ratios: rolled / the same program unrolled
# by optimize): a 4-block e3nn-jax network (`tensor_product` -> `e3nn.flax.Linear` -> `gate`,
# flax, 4,096 samples; 3 blocks rolled, the first takes other irreps) forward run 1.18-1.26x in
# two rounds, 1.04-1.05x (A/A 0.97) and 0.96-1.13x (A/A 0.89) in two later ones, its compile
# 0.65-0.81x; gradient run 1.16x (one round), 1.24-1.25x (but a control identical to the unrolled
# program read 1.23x in that round); the issue that asked for this measured 1.3-1.4x forward and
# gradient. A 4-layer netket GCNN (4x4 square lattice, 128 symmetries, FFT mode, complex128; 3
# layers rolled): gradient compile 1.55x (2.09 s against 1.35 s, controls 1.12x and 1.27x; medians
# of 3), forward run 1.07x (A/A 1.06). Their bodies move data around their contractions every
# trip: e3nn 28 concatenates of irreps chunks per block among 66 small contractions and 39
# transposes; the GCNN gathers each layer's kernel through the group's product table, pads and
# FFTs it (3 pads, 3 FFTs, 1 contraction; its backward a scatter-add). The bodies measured winning
# rolled have contractions and no such equations (the bench/models.py transformer blocks: 8
# contractions forward, 24 forward + backward, transposes and reshapes; compile 0.13-0.92x, run
# 0.24-0.94x at 16 and 32 blocks), or such equations and no contraction (a lattice-Boltzmann step,
# `jnp.roll`: concatenates of slices, forward rolled 0.83x, `REROLL_BACKWARD`). What XLA:CPU does
# with the combination is not established: a profile of the e3nn forward (XLA:CPU thunk trace, on
# the loaded machine) did not single out one operation (the rolled time grew across contractions,
# transposing copies and concatenates); unrolled, XLA lays out each contraction's operands
# program-wide, in a loop each trip starts from the carry's fixed layout. A plain MLP (2 equations
# a layer) is not outlined at all. GPU/TPU: not measured, no limit.
REROLL_MOVERS = frozenset({"concatenate", "gather", "scatter", "scatter-add", "scatter_add",
                           "scatter-mul", "scatter-min", "scatter-max", "pad", "fft"})
REROLL_MAX_MOVERS = {"cpu": 0}      # most such equations per trip beside contractions, by default
# Fewest trips a chain of bodies with contractions is rolled in by default. Every body measured
# slower rolled on the CPU was a short chain: the e3nn-jax and GCNN chains above (3 trips), and a
# qujax circuit's layers (3 of 4 rolled, each reading its 12 angles at offsets that became the
# scan's xs; 17 small complex contractions and 14 transposes a trip, no `REROLL_MOVERS`): run
# 1.03-1.07x the unrolled program's (paired medians of 15-21 calls, A/A 0.99-1.00), with the same
# kernels (rolled 24 fusions and 17 dots a trip; unrolled 129 fusions and 79 dots in all), and
# compile 0.81x. The chains measured winning rolled had 8-32 trips (bench/models.py). What
# XLA:CPU does differently across three unrolled layers is not established; three trips save
# the compile of two bodies, so the default keeps them unrolled and `autotune="time"` measures.
REROLL_MIN_TRIPS = {"cpu": 4}


def reroll_body(movers: dict, contractions: int, trips: int, target: str | None) -> str | None:
    """None when a chain of `trips` calls whose body holds `contractions` contractions and
    `movers` (`REROLL_MOVERS` primitive -> count, at any depth) may be rolled by default on
    `target`, else the reason (the model's estimate)."""
    limit = REROLL_MAX_MOVERS.get(target or "cpu")
    n = sum(movers.values())
    if limit is None or not contractions or n <= limit:
        fewest = REROLL_MIN_TRIPS.get(target or "cpu")
        if contractions and fewest is not None and trips < fewest:
            return (f"estimate on {target}: {trips} trips of a body with {contractions} "
                    f"contraction(s) (at least {fewest} rolled by default): short chains ran "
                    f"slower rolled (qujax layers, 3 trips: 1.03-1.07x); autotune='time' "
                    f"measures it instead")
        return None
    what = ", ".join(f"{p} x{c}" for p, c in sorted(movers.items()))
    return (f"estimate on {target}: each of the {trips} trips would move data or call a library "
            f"in {n} equation(s) ({what}) beside {contractions} contraction(s) (at most {limit} "
            f"rolled by default): bodies like this ran slower rolled (e3nn-jax blocks up to "
            f"1.26x, a netket GCNN's gradient compiling 1.55x); autotune='time' measures it "
            f"instead")


# What a rolled program must measure, against the program it came from, to be kept when
# `reroll` is autotuned by time (`autotune="time"`, `backend.autotune.choose_timed`): (most compile
# time, most run time), each a ratio: rolling must win compile time and may lose run time only
# within the budget. The jaxpr does not say which programs win: before the backward pass
# recomputed its residuals (`reroll_recompute`), rolled Flax NNX and Linen steps ran 1.2x the
# unrolled ones (the forward scan stacked every residual) while Haiku and Equinox ran 0.7-0.8x
# (XLA:CPU's fusions of their unrolled backward pass across layers hold 866 and 1,196
# instructions and recompute); fusion and kernel counts did not tell them apart. With it, all
# five bench/models.py steps rolled compile 0.10-0.98x and run 0.21-0.97x jax.jit's at 16 and
# 32 blocks (CPU, seven runs; one run disturbed by a test alongside read 1.13x compile for Flax
# NNX), so the measurement is the guard for programs not measured here.
REROLL_TIMED = {"cpu": (1.0, 1.05)}


def reroll_measured(compile_ratio: float, run_ratio: float | None, target: str | None
                    ) -> tuple[bool, str]:
    """(keep the rolled program?, why) from its measured compile and run time ratios (run None:
    not run, compile decides)."""
    most_compile, most_run = REROLL_TIMED.get(target or "cpu", REROLL_TIMED["cpu"])
    ran = (f"run {run_ratio:.2f}x" if run_ratio is not None
           else "run not measured (a loop whose trips depend on the data)")
    measured = f"rolled: compile {compile_ratio:.2f}x, {ran} the unrolled program's"
    if compile_ratio > most_compile:
        return False, f"{measured}; rolling must compile in at most {most_compile:g}x"
    if run_ratio is not None and run_ratio > most_run:
        return False, f"{measured}; rolling may run at most {most_run:g}x"
    return True, measured


def split_pays(trips: int, body_eqns: int, pieces: int, permutations: int, state_bytes: int,
               element_bytes: int, tiles: bool, target: str | None) -> str | None:
    """None where a loop's split carry is expected to pay for its compile time, else why not:
    enough work per piece (`LoopCosts.min_split_work`), and a state in cache, tiled, or moved
    often enough that the saved passes over it count (`LoopCosts.min_memory_permutations`).
    `element_bytes`: the carry's bytes per batch element; `tiles`: the tile pass may run."""
    lc = loop_costs(target)
    work = trips * body_eqns / max(pieces, 1)
    if work <= lc.min_split_work:
        return (f"{trips} trip(s) x {body_eqns} equations over {pieces} pieces is {work:.1f} a "
                f"piece (more than {lc.min_split_work:g} needed): too little work to pay for "
                f"compiling a loop fusion and a copy per piece (compile time)")
    c = costs(target)
    cache = cores_cache(c)
    tiled = tiles and element_bytes <= c.tile_max_element_bytes
    if cache and 2 * state_bytes >= cache and not tiled \
            and permutations < lc.min_memory_permutations:
        return (f"a state of {state_bytes} B, out of the cores' {cache} B of cache and not "
                f"tiled ({element_bytes} B a batch element{'' if tiles else ', tile=False'}): "
                f"each trip goes to memory as jax.jit's does, and {permutations} permutation(s) "
                f"a trip (minimum {lc.min_memory_permutations}) save too few passes over it")
    return None


def cores_cache(costs: TargetCosts) -> int:
    """Bytes of cache the cores a tile is split over hold together (0: not modelled)."""
    return costs.tile_cache_bytes * cpu_cores(costs)


def cpu_cores(costs: TargetCosts) -> int:
    """The cores a tile is split over: `costs.tile_cores`, else those this process may use."""
    if costs.tile_cores:
        return costs.tile_cores
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


# --- one Pallas kernel for a region (passes/kernel.py) ------------------------------------------

def kernel_on(mode, target: str | None) -> bool:
    """Whether the kernel pass looks for regions: `kernel=True` on every target; `"auto"` where
    the target's row has a minimum piece size (the TPU)."""
    return mode is True or (mode == "auto" and costs(target).kernel_min_elements > 0)


def kernel_size_reason(elements: int, mode, target: str | None) -> str | None:
    """Why pieces of `elements` are too small for a kernel on `target`, else None (also what
    scalarize asks: a split no kernel will take compiles as fusions)."""
    c = costs(target)
    if mode is not True and elements < c.kernel_min_elements:
        return (f"pieces of {elements} elements, fewer than {c.kernel_min_elements} (the "
                f"{target} row's kernel_min_elements: below it a kernel was not measured to "
                f"pay)")
    return None


def kernel_decision(elements: int, eqns: int, loops: int, mode, target: str | None) -> str | None:
    """None where a region of `eqns` equations (`loops` of them loops) on pieces of `elements`
    gets a kernel, else why not. `kernel=True`: wherever one can be emitted."""
    if mode is True:
        return None
    c = costs(target)
    small = kernel_size_reason(elements, mode, target)
    if small is not None:
        return small
    if not loops and eqns < c.kernel_min_eqns:
        return (f"{eqns} equations and no loop, fewer than {c.kernel_min_eqns} (the {target} "
                f"row's kernel_min_eqns: XLA fuses a short region into one kernel already)")
    return None


def threefry_decision(elements: int, mode, target: str | None) -> str | None:
    """None where a Threefry draw of `elements` words is opened for the kernel
    (passes/threefry.py), else why not. `kernel=True`: wherever a kernel can be emitted."""
    if mode is True:
        return None
    c = costs(target)
    if c.threefry_min_elements <= 0:
        return (f"not by default on {target} (the row's threefry_min_elements is 0: measured on "
                f"a TPU v5e, a kernel drew Threefry's bits no faster than XLA's fusion of the "
                f"same rounds; kernel=True opens it)")
    if elements < c.threefry_min_elements:
        return (f"{elements} elements, fewer than {c.threefry_min_elements} (the {target} row's "
                f"threefry_min_elements)")
    return None

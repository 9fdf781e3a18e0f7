"""What a Pallas TPU kernel (Mosaic) takes: primitives, dtypes, tiles, and where it runs.

`passes/kernel.py` emits one `pallas_call` for a region of elementwise integer work on split
pieces; this module says what may go in it. Rules as data:

* `KERNEL_PRIMITIVES`: the primitives a kernel body evaluates as they are, on (rows, 128) tiles,
  each with the dtypes whose result Mosaic computes bit for bit as XLA does. Anything else stays
  XLA's, with the row's reason where there is one (`DECLINED_PRIMITIVES`).
* `WORD_DTYPES`, `TILE_DTYPES`: 32-bit words, one per lane of a (8, 128) vreg; booleans live
  inside a kernel as masks and cross its boundary as int32.
* the tile: `LANES` x a multiple of `SUBLANES` rows; a piece of N elements is N/128 rows, and
  the reshape (N,) -> (N/128, 128) is a bitcast where N is a whole number of (8, 128) tiles
  (XLA:TPU lays a 1-D 32-bit array out in tiles of 1,024 elements).
* `interpret()`: the one place that decides whether kernels are emitted for Pallas's
  interpreter (no TPU in this process: tests and CI) or for Mosaic.

How many rows a grid step takes, and from which piece size a kernel pays, are per-target costs
(`backend.cost.TargetCosts.kernel_*`).
"""
from __future__ import annotations

import contextlib
import contextvars

import numpy as np

LANES = 128            # a vreg's lanes (the minor dimension of a tile)
SUBLANES = 8           # a vreg's sublanes for 32-bit data (the second-minor dimension)

WORD_DTYPES = frozenset({np.dtype(np.int32), np.dtype(np.uint32)})
TILE_DTYPES = WORD_DTYPES | {np.dtype(np.bool_)}

_INT = ("int32", "uint32")
_INT_BOOL = ("int32", "uint32", "bool")

# primitive -> dtypes of its operands (results: the same, bool for comparisons). Read from
# Pallas's TPU lowering rules (jax/_src/pallas/mosaic/lowering.py, JAX 0.10.2): each lowers to
# the one `arith` op whose result is XLA's for every operand (wrapping add/sub/mul, bitwise
# ops, signed/unsigned compare, max/min, select with a mask). Shifts are XLA's only for
# amounts below 32 (`arith.shli` is poison beyond): a literal amount in range is bound as it
# is, another amount through `SHIFTS` (XLA's result for every amount).
KERNEL_PRIMITIVES: dict[str, tuple[str, ...]] = {
    "add": _INT, "sub": _INT, "mul": _INT, "neg": _INT,
    "and": _INT_BOOL, "or": _INT_BOOL, "xor": _INT_BOOL, "not": _INT_BOOL,
    "shift_left": _INT, "shift_right_logical": _INT, "shift_right_arithmetic": _INT,
    "eq": _INT_BOOL, "ne": _INT_BOOL, "lt": _INT, "le": _INT, "gt": _INT, "ge": _INT,
    # (signed only: Mosaic failed to legalize `arith.maxui` on a TPU v5e, Dec 6)
    "max": ("int32",), "min": ("int32",),
    # (two cases, a boolean predicate: `select_ok`; between booleans as logic ops, since Mosaic
    # did not compile a select of masks on a TPU v5e, Dec 6: `passes/kernel._select`)
    "select_n": _INT_BOOL,
    "convert_element_type": _INT_BOOL,
}
SHIFTS = frozenset({"shift_left", "shift_right_logical", "shift_right_arithmetic"})

# Primitives a kernel body takes as the identity on its tiles, never bound there: what
# `jnp.array(x)` and `x.copy()` leave in real code. Pallas has no TPU lowering for `copy`
# ("Unimplemented primitive in Pallas TPU lowering for tc: copy", JAX 0.10.2), and a copy of a
# tile is the tile. (A `convert_element_type` to the dtype it has is one too: `kernel.py`.)
IDENTITIES = frozenset({"copy", "copy_p"})

# Primitives Mosaic compiles on int32 words (compiled for a TPU v5e with no TPU, libtpu 0.0.42:
# tests/test_kernel.py) whose results have not been compared with XLA's on a chip yet: the
# chip's run of that test decides whether they join the table.
COMPILED_UNCHECKED = frozenset({"population_count", "clz", "integer_pow", "abs"})

# Primitives a region might hold that stay XLA's, and why (what the report says).
DECLINED_PRIMITIVES: dict[str, str] = {
    "div": "XLA defines integer division by zero and INT_MIN / -1; Mosaic's divsi/divui do not",
    "rem": "XLA defines integer remainder by zero; Mosaic's remsi/remui do not",
    **{name: "Mosaic compiles it, but its bits are not yet checked against XLA's on a TPU"
       for name in sorted(COMPILED_UNCHECKED)},
}


def dtype_reason(dtype) -> str | None:
    """Why values of `dtype` cannot be tiles of a kernel (None: they can)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return f"{dtype}: an extended dtype (PRNG keys)"
    if dt in TILE_DTYPES:
        return None
    if dt.kind == "f" or dt.kind == "c" or str(dt) == "bfloat16":
        return (f"{dt}: float regions are not emitted as kernels yet (Mosaic would round "
                f"them as it does, not as XLA's fusions do)")
    if dt.kind in "iu" and dt.itemsize == 8:
        return (f"{dt}: 64-bit lanes (Mosaic has no 64-bit vector integers; pairs of 32-bit "
                f"words are not done)")
    if dt.kind in "iu":
        return (f"{dt}: narrow integers pack {4 // dt.itemsize} to a word (tiles of "
                f"({SUBLANES * 4 // dt.itemsize}, 128)); only 32-bit words are done")
    return f"{dt}: not a 32-bit integer or boolean"


def primitive_reason(name: str, dtypes) -> str | None:
    """Why an equation of primitive `name` on operands of `dtypes` cannot be in a kernel body
    (its results' dtypes: `dtype_reason`)."""
    row = _INT_BOOL if name in IDENTITIES else KERNEL_PRIMITIVES.get(name)
    if row is None:
        why = DECLINED_PRIMITIVES.get(name, "not in the kernel's primitive table "
                                            "(backend/mosaic.py)")
        return f"'{name}': {why}"
    for dt in dtypes:
        why = dtype_reason(dt)
        if why is not None:
            return f"'{name}' on {why}"
        if np.dtype(dt).name not in row:
            return f"'{name}' on {np.dtype(dt)} (the table allows {', '.join(row)})"
    return None


def convert_ok(old, new) -> bool:
    """`convert_element_type` that Mosaic computes as XLA does: between 32-bit words (a
    reinterpretation), bool to a word (0/1), a word to bool (x != 0)."""
    return np.dtype(old) in TILE_DTYPES and np.dtype(new) in TILE_DTYPES


def select_ok(n_cases: int, predicate_dtype) -> bool:
    """Pallas lowers `select_n` with at most two cases (`arith.select` on a mask)."""
    return n_cases <= 2 and np.dtype(predicate_dtype) == np.dtype(np.bool_)


def tile_reason(elements: int, rows: int) -> str | None:
    """Why pieces of `elements` cannot be laid out as (rows, 128) tiles (None: they can).
    Pieces must be a whole number of (8, 128) tiles, so that (N,) -> (N/128, 128) is a
    bitcast; a last grid step of fewer rows than `rows` is Pallas's (a partial block)."""
    tile = SUBLANES * LANES
    if rows % SUBLANES or rows <= 0:
        return f"tile rows {rows}: not a positive multiple of {SUBLANES}"
    if elements % tile:
        return (f"pieces of {elements} elements are not a whole number of ({SUBLANES}, "
                f"{LANES}) tiles ({tile} elements): declined (padding every piece in and out "
                f"would copy it twice, not done)")
    return None


def grid(elements: int, rows: int) -> tuple[int, int]:
    """(rows of the (rows, 128) view of a piece, grid steps of `rows` rows each)."""
    total = elements // LANES
    return total, -(-total // rows)


# --- where kernels run ---------------------------------------------------------------------------

_INTERPRET: contextvars.ContextVar = contextvars.ContextVar("jaxrewrite_pallas_interpret",
                                                            default=None)


def interpret() -> bool:
    """Whether kernels are emitted for Pallas's interpreter: where this process has no TPU
    (`jax.default_backend()`), unless `emit_for` says otherwise."""
    forced = _INTERPRET.get()
    if forced is not None:
        return forced
    import jax
    return jax.default_backend() != "tpu"


@contextlib.contextmanager
def emit_for(platform: str):
    """Within the block, kernels are emitted for `platform` ("tpu": Mosaic, whatever this
    process runs on, for `lower(lowering_platforms=("tpu",))`; anything else: the
    interpreter)."""
    token = _INTERPRET.set(platform != "tpu")
    try:
        yield
    finally:
        _INTERPRET.reset(token)

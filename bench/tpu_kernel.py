"""One Pallas kernel for a split integer region on the TPU (issue 41): jax.jit vs optimize.

    python bench/tpu_kernel.py            # on the TPU (one process; about 3-4 minutes)
    python bench/tpu_kernel.py --quick    # anywhere: tiny sizes, kernels in Pallas's interpreter
    python bench/tpu_kernel.py --only chacha        # the ChaCha20 rows alone

Prints one JSON object and writes it to `$OUT/tpu_kernel.json` where `OUT` is set.

1. ChaCha20 as its author wrote it (`permutations.chacha_loop("fori")`: a jitted quarter round
   vmapped over the columns, `jnp.array` index maps, the 10 double rounds in `lax.fori_loop`),
   vmapped over 65,536 and 1,048,576 blocks (1,024 and 4,096 with --quick), as
   - `jit`, `jit (A/A)`: `jax.jit` twice (the second: what noise is);
   - `optimize kernel=False`: the split program XLA runs today (flatten + scalarize);
   - `optimize`: the default (`kernel="auto"`: a kernel from the TPU row's
     `kernel_min_elements` a piece; below it the same program as `kernel=False`);
   - `optimize kernel=True`: a kernel whatever the size;
   - at the large size, the sweep: `rows=8/16/32` (`TargetCosts.kernel_tile_rows`),
     `input fusion` (`kernel_input_fusion`: XLA may fuse the split of the (N, 4, 4) state into
     the kernel's inputs), `pieces` (`kernel_in_place=False`: the kernel on 16 pieces that XLA
     relayouts, as before Dec 7 night, not on the state where XLA keeps it); the Python-loop
     form (`chacha_loop("python")`, a straight-line kernel) under jit, `kernel=False` and the
     kernel; and a word-major caller (the state as
     (4, 4, N), vmapped over its last axis: pieces are contiguous rows, no transposes).
2. Salsa20/8 (the scrypt core, a 4x4 state in the same style), Philox-4x32-10 (counters
   vmapped, the key shared: scalar words carried in the loop; 32x32 multiplies in 16-bit
   halves), Speck64/128 (27 rounds reading a round-key table at the loop index): `jit`,
   `optimize kernel=False`, `optimize` at the large size. Keccak-f[1600] (64-bit lanes): the
   rewrite's declines only (no kernel: Mosaic has no 64-bit vector integers; the user's form
   is not split on the TPU at all).

Columns: run time (paired rounds: every variant once per round, medians of `repeats`) and its
ratio to `jit`; compile seconds (trace + rewrite + lower + compile of a fresh function, caches
cleared; the author's ChaCha20 `jit` and `optimize` rows compiled twice, medians; the others
once) and the ratio to `jit`;
`exact`: bit for bit `jax.jit`'s output and the reference (RFC 8439's block for ChaCha20, the
KATs / numpy references for the others); launches in the compiled module (XLA's launching
instructions outside fusions; a loop's body counted once); `pallas_calls` in the rewritten
program, the kernel's tiles and grid (`kernel`), the kernel pass's declines, and `errors`: a
rewritten program that failed to lower or compile (then the program made without the pass laid
at it ran: the kernel's failure leaves the split form the passes before it made, and the row
measures that, not the kernel).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite.backend import cost as _cost  # noqa: E402
from jaxrewrite.backend import xla as _xla  # noqa: E402
from permutations import RFC_OUT, _blocks, chacha_loop, rotl  # noqa: E402

NAME = "tpu_kernel"
OPT = dict(target="tpu")   # the TPU's cost row, also with --quick on another host
_M32 = 0xFFFFFFFF


# --- Salsa20/8 (the scrypt core, RFC 7914), in the ChaCha20 author's style ----------------------

SALSA_COLS = np.array([[0, 4, 8, 12], [5, 9, 13, 1], [10, 14, 2, 6], [15, 3, 7, 11]])
SALSA_ROWS = np.array([[0, 1, 2, 3], [5, 6, 7, 4], [10, 11, 8, 9], [15, 12, 13, 14]])


@jax.jit
def _salsa_quarter(v):
    """One quarter round on (a, b, c, d)."""
    a, b, c, d = v[0], v[1], v[2], v[3]
    b = b ^ rotl(a + d, 7)
    c = c ^ rotl(b + a, 9)
    d = d ^ rotl(c + b, 13)
    a = a ^ rotl(d + c, 18)
    return jnp.array([a, b, c, d], dtype=jnp.uint32)


@jax.jit
def _salsa_double(state):
    """A column round and a row round on a 4x4 state, as the ChaCha20 author moves diagonals:
    gather each quarter's (a, b, c, d) into a row with a `jnp.array` index map, a jitted
    quarter round vmapped over the rows, and the inverse map back."""
    qr = jax.vmap(_salsa_quarter)
    cols, rows = jnp.array(SALSA_COLS.ravel()), jnp.array(SALSA_ROWS.ravel())
    uncols = jnp.array(np.argsort(SALSA_COLS.ravel()))
    unrows = jnp.array(np.argsort(SALSA_ROWS.ravel()))
    s = qr(state.ravel()[cols].reshape(4, 4)).ravel()[uncols]
    return qr(s[rows].reshape(4, 4)).ravel()[unrows].reshape(4, 4)


def salsa20_8(x):
    """x: a 4x4 state; 4 double rounds in a `fori_loop`, then the feed-forward."""
    return lax.fori_loop(0, 4, lambda i, s: _salsa_double(s), x) + x


def salsa20_8_np(x: np.ndarray) -> np.ndarray:
    def r(v, n):
        return (v << np.uint32(n)) | (v >> np.uint32(32 - n))
    s = [x[:, i].copy() for i in range(16)]
    for _ in range(4):
        for a, b, c, d in list(SALSA_COLS) + list(SALSA_ROWS):
            s[b] ^= r(s[a] + s[d], 7)
            s[c] ^= r(s[b] + s[a], 9)
            s[d] ^= r(s[c] + s[b], 13)
            s[a] ^= r(s[d] + s[c], 18)
    return np.stack(s, 1) + x


# --- Philox-4x32-10 (Salmon et al., SC'11), counters vmapped, one key ---------------------------

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = np.array([0x9E3779B9, 0xBB67AE85], np.uint32)
# Random123's known-answer tests: (counter, key) -> output
PHILOX_KAT = (((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
              ((_M32,) * 4, (_M32,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)))


def _mulhilo(a: int, b):
    """(high, low) words of the 64-bit product of the constant `a` and the words `b`, in
    16-bit halves (no 64-bit words without x64)."""
    lo = np.uint32(a) * b
    a_lo, a_hi = np.uint32(a & 0xFFFF), np.uint32(a >> 16)
    b_lo, b_hi = b & np.uint32(0xFFFF), b >> np.uint32(16)
    ll, lh, hl, hh = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    cross = (ll >> np.uint32(16)) + (lh & np.uint32(0xFFFF)) + (hl & np.uint32(0xFFFF))
    return hh + (lh >> np.uint32(16)) + (hl >> np.uint32(16)) + (cross >> np.uint32(16)), lo


def _philox_round(c, k):
    hi0, lo0 = _mulhilo(PHILOX_M[0], c[0])
    hi1, lo1 = _mulhilo(PHILOX_M[1], c[2])
    return jnp.stack([hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]), k + PHILOX_W


def philox(ctr, key):
    """ctr: 4 words, key: 2 words; 10 rounds in a `fori_loop`."""
    return lax.fori_loop(0, 10, lambda i, ck: _philox_round(*ck), (ctr, key))[0]


def philox_np(ctr: np.ndarray, key) -> np.ndarray:
    c = [ctr[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    m = np.uint64(_M32)
    for _ in range(10):
        p0, p1 = np.uint64(PHILOX_M[0]) * c[0], np.uint64(PHILOX_M[1]) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & m, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & m]
        k0, k1 = (k0 + np.uint64(PHILOX_W[0])) & m, (k1 + np.uint64(PHILOX_W[1])) & m
    return np.stack([v.astype(np.uint32) for v in c], 1)


# --- Speck64/128 (Beaulieu et al., 2013): 27 rounds, round keys read at the loop index --------

SPECK_KEY = np.array([0x03020100, 0x0B0A0908, 0x13121110, 0x1B1A1918], np.uint32)  # k0, l0..l2
SPECK_KAT = ((0x3B726574, 0x7475432D), (0x8C6FA548, 0x454E028B))   # (x, y) -> (x, y)


def _rotr(x, n):
    return (x >> np.uint32(n)) | (x << np.uint32(32 - n))


def speck_round_keys(key) -> jnp.ndarray:
    k, ls = key[0], [key[1], key[2], key[3]]
    out = []
    for i in range(27):
        out.append(k)
        nl = (k + _rotr(ls[i % 3], 8)) ^ np.uint32(i)
        ls[i % 3] = nl
        k = rotl(k, 3) ^ nl
    return jnp.stack(out)


def speck(pt, rk):
    """pt: (x, y); rk: the 27 round keys."""
    def rnd(i, s):
        x = (_rotr(s[0], 8) + s[1]) ^ rk[i]
        return jnp.stack([x, rotl(s[1], 3) ^ x])
    return lax.fori_loop(0, 27, rnd, pt)


def speck_np(pt: np.ndarray, key) -> np.ndarray:
    def rl(v, n):
        return (v << np.uint32(n)) | (v >> np.uint32(32 - n))

    def rr(v, n):
        return (v >> np.uint32(n)) | (v << np.uint32(32 - n))
    k, ls = np.uint32(key[0]), [np.uint32(v) for v in key[1:]]
    x, y = pt[:, 0].copy(), pt[:, 1].copy()
    with np.errstate(over="ignore"):
        for i in range(27):
            x = (rr(x, 8) + y) ^ k
            y = rl(y, 3) ^ x
            ls[i % 3] = (k + rr(ls[i % 3], 8)) ^ np.uint32(i)
            k = rl(k, 3) ^ ls[i % 3]
    return np.stack([x, y], 1)


# --- measuring ---------------------------------------------------------------------------------

def _opt(**kw):
    return lambda f: jaxrewrite.optimize(f, **OPT, **kw)


def _launches(compiled):
    try:
        counts = _xla.launches(compiled)
    except Exception as e:  # noqa: BLE001 - a backend whose modules cannot be walked
        return f"n/a ({type(e).__name__})"
    return sum(n for op, n in counts.items() if op not in ("while", "conditional"))


def _kernel_facts(report) -> dict:
    if report is None:
        return {}
    return dict(
        pallas_calls=report.counts.get("kernel.applied", 0),
        kernel=report.stats.get("kernel", []),
        # (flatten's too: a loop not kept rolled for a kernel says why)
        kernel_declines=sorted({f"{e.pass_name}: {e.reason}" for e in report.declines
                                if e.pass_name == "kernel" or "for a kernel" in e.reason}),
        rewrite_s=report.timings.get("rewrite"),
        # (a kernel Mosaic refused: the guard ran the program made without the kernel pass,
        # and says so here)
        errors=list(report.errors))


def table(program: str, n: int, args, variants: dict, checks, repeats: int,
          twice=("jit", "optimize")) -> list[dict]:
    """`variants`: name -> (maker of a fresh jitted callable, cost-row overrides). `checks(out)`
    -> whether `out` is the reference's."""
    compiles = {k: [] for k in variants}
    compiled, facts = {}, {}
    for rnd in range(2):
        for name, (make, overrides) in variants.items():
            if rnd and name not in twice:
                continue
            print(f"[{NAME}] {program}/{n}: compile {name}", file=sys.stderr, flush=True)
            s, c, report = _common.compile_on_row(make, args, overrides)
            compiles[name].append(s)
            compiled.setdefault(name, c)
            facts.setdefault(name, _kernel_facts(report))
    ref = np.asarray(compiled["jit"](*args))
    print(f"[{NAME}] {program}/{n}: timing {len(variants)} variants", file=sys.stderr, flush=True)
    med = _common.paired({k: (lambda c=c: c(*args)) for k, c in compiled.items()},
                         repeats=repeats)
    rows = []
    for name in variants:
        out = np.asarray(compiled[name](*args))
        comp = statistics.median(compiles[name])
        rows.append(dict(
            program=program, n=n, form=name, run_ms=med[name] * 1e3,
            run_ratio_jit=med[name] / med["jit"], compile_s=comp,
            compile_ratio_jit=comp / statistics.median(compiles["jit"]),
            compile_samples=compiles[name],
            exact=bool(np.array_equal(out, ref) and checks(out)),
            launches=_launches(compiled[name]), **facts[name]))
    return rows


def chacha(quick: bool) -> list[dict]:
    rows = []
    reps = 5 if quick else 9
    for n in ((1024, 4096) if quick else (65536, 1 << 20)):
        large = n == (4096 if quick else 1 << 20)
        x = _blocks(n)                       # block 0 is RFC 8439 2.3.2's state
        author = lambda: jax.vmap(chacha_loop("fori"))  # noqa: E731 (a fresh function)
        v = {"jit": (lambda: jax.jit(author()), {}),
             "jit (A/A)": (lambda: jax.jit(lambda s: author()(s)), {}),
             "optimize kernel=False": (lambda: _opt(kernel=False)(author()), {}),
             "optimize": (lambda: _opt()(author()), {}),
             "optimize kernel=True": (lambda: _opt(kernel=True)(author()), {})}
        if large:
            for r in (8, 16, 32):
                v[f"optimize rows={r}"] = (lambda: _opt(kernel=True)(author()),
                                           {"kernel_tile_rows": r})
            v["optimize input fusion"] = (lambda: _opt(kernel=True)(author()),
                                          {"kernel_input_fusion": True})
            v["optimize pieces"] = (lambda: _opt(kernel=True)(author()),
                                    {"kernel_in_place": False})
        rows += table("chacha20 (author's fori form)", n, (x,), v,
                      lambda out: np.array_equal(out[0], RFC_OUT), reps)
        if not large:
            continue
        python = lambda: jax.vmap(chacha_loop("python"))  # noqa: E731
        v = {"jit": (lambda: jax.jit(python()), {}),
             "optimize kernel=False": (lambda: _opt(kernel=False)(python()), {}),
             "optimize": (lambda: _opt(kernel=True)(python()), {})}
        rows += table("chacha20 (Python loop: a straight-line kernel)", n, (x,), v,
                      lambda out: np.array_equal(out[0], RFC_OUT), reps, twice=())
        # the caller's layout word-major: (4, 4, N), the pieces contiguous rows
        xw = jnp.asarray(np.transpose(np.asarray(x), (1, 2, 0)))
        word = lambda: jax.vmap(chacha_loop("fori"), in_axes=2, out_axes=2)  # noqa: E731
        v = {"jit": (lambda: jax.jit(word()), {}),
             "optimize kernel=False": (lambda: _opt(kernel=False)(word()), {}),
             "optimize": (lambda: _opt(kernel=True)(word()), {})}
        rows += table("chacha20 (word-major caller: (4, 4, N))", n, (xw,), v,
                      lambda out: np.array_equal(out[:, :, 0], RFC_OUT), reps, twice=())
    return rows


def others(quick: bool) -> list[dict]:
    n = 4096 if quick else 1 << 20
    reps = 5 if quick else 7
    rng = np.random.default_rng(41)
    rows = []

    def three(program, fn, args, check):
        v = {"jit": (lambda: jax.jit(fn()), {}),
             "optimize kernel=False": (lambda: _opt(kernel=False)(fn()), {}),
             "optimize": (lambda: _opt(kernel=True if quick else "auto")(fn()), {})}
        return table(program, n, args, v, check, reps, twice=())

    xs = rng.integers(0, 2**32, (n, 16), dtype=np.uint32)
    want = salsa20_8_np(xs).reshape(n, 4, 4)
    rows += three("salsa20/8 (fori, 4x4 in the ChaCha20 author's style)",
                  lambda: jax.vmap(salsa20_8), (jnp.asarray(xs.reshape(n, 4, 4)),),
                  lambda out: np.array_equal(out, want))

    ctr = np.zeros((n, 4), np.uint32)
    ctr[:, 0] = np.arange(n, dtype=np.uint32)
    ctr[1], ctr[2] = PHILOX_KAT[0][0], PHILOX_KAT[1][0]
    key = np.array([0x12345678, 0x9ABCDEF0], np.uint32)
    want = philox_np(ctr, key)
    kat = [np.array_equal(philox_np(np.array([c], np.uint32), k)[0], np.array(o, np.uint32))
           for c, k, o in PHILOX_KAT]
    rows += three("philox-4x32-10 (fori, counters vmapped, one key)",
                  lambda: jax.vmap(philox, in_axes=(0, None)),
                  (jnp.asarray(ctr), jnp.asarray(key)),
                  lambda out: all(kat) and np.array_equal(out, want))

    pts = rng.integers(0, 2**32, (n, 2), dtype=np.uint32)
    pts[0] = SPECK_KAT[0]
    rk = speck_round_keys(jnp.asarray(SPECK_KEY))
    want = speck_np(pts, SPECK_KEY)
    rows += three("speck64/128 (fori, round keys at the loop index)",
                  lambda: jax.vmap(speck, in_axes=(0, None)), (jnp.asarray(pts), rk),
                  lambda out: np.array_equal(out, want) and tuple(out[0]) == SPECK_KAT[1])
    return rows


def keccak(quick: bool) -> list[dict]:
    """Keccak-f[1600]'s 25 uint64 lanes: the rewrite's verdict only (nothing to time). The
    user's fori form (bench/keccak.py) is not split on the TPU (25 lanes: the row's axis
    limit is 16), so the kernel pass sees no pieces; the hand-written 25-word form carries
    pieces, and the kernel declines their 64-bit lanes."""
    import keccak as K
    n = 4096 if quick else 1 << 20
    rows = []
    with jax.enable_x64(True):
        spec = jax.ShapeDtypeStruct((n, 25), np.uint64)
        for form, fn in (("keccak-f1600 (user's fori form)", jax.vmap(K.keccak_fori)),
                         ("keccak-f1600 (hand-written 25 words, fori)", K.hand_fori)):
            t = time.perf_counter()
            res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(spec), kernel=True,
                                                       **OPT)
            seconds = time.perf_counter() - t
            rows.append(dict(program=form, n=n, form="optimize kernel=True (rewrite only)",
                             **{**_kernel_facts(res.report), "rewrite_s": seconds}))
    return rows


PROGRAMS = {"chacha": chacha, "others": others, "keccak": keccak}


def main(quick: bool = False, only: list | None = None) -> list[dict]:
    """The rows (`bench/run.py` calls this; the command line below adds the metadata)."""
    if jax.config.jax_enable_x64:
        raise SystemExit("run with x64 off: Mosaic refuses the int64 grid index maps x64 makes")
    rows = []
    for name, fn in PROGRAMS.items():
        if only is None or name in only:
            rows += fn(quick)
    return rows


def cli() -> dict:
    quick = "--quick" in sys.argv[1:]
    only = None
    if "--only" in sys.argv[1:]:
        only = sys.argv[sys.argv.index("--only") + 1].split(",")
    t0 = time.perf_counter()
    rows = main(quick, only)
    row = _cost.costs("tpu")
    return dict(name=NAME, quick=quick, jax=jax.__version__, backend=jax.default_backend(),
                devices=[str(d) for d in jax.devices()], date=time.strftime("%Y-%m-%d %H:%M:%S"),
                tpu_row={k: getattr(row, k) for k in ("kernel_min_elements", "kernel_min_eqns",
                                                      "kernel_tile_rows", "kernel_input_fusion")},
                seconds=time.perf_counter() - t0, rows=rows)


if __name__ == "__main__":
    result = cli()
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], f"{NAME}.json")
        with open(path, "w") as f:
            f.write(text)
        print(f"written {path}", file=sys.stderr)

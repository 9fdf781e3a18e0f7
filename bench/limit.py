"""Toward the physical limit (issue 26): ChaCha20 on the CPU against the hand form and OpenSSL.

    python bench/limit.py [--quick]

The seed author's ChaCha20 (bench/permutations.py `chacha_loop("fori")`: a jitted quarter-round
vmapped over the columns, a jitted double round with `jnp.array` index maps, the double rounds
in `lax.fori_loop`), vmapped over 1,024 / 16,384 / 65,536 blocks (and 1,048,576 without
--quick), as
- `jit`:            `jax.jit` (the baseline); `jit (A/A)`: a second `jax.jit`, what noise is;
- `hand`:           the hand-written 16-word form (`chacha_words`) under `jax.jit`;
- `optimize tile=False`: `jaxrewrite.optimize` without tiling (the form before issue 26);
- `optimize`:       `jaxrewrite.optimize` (tiles the batch where the loop state exceeds the
                    cache: `T` is the tile, "-" where it declined);
- `optimize, XLA's copies`: the same, compiled without the option the rewrite asks for
                    (`backend/compile_options.py`): XLA's default copy of each carried piece
                    every trip, the form before it;
- `jit (Python loop)`, `optimize (Python loop)`: the same double rounds as a Python loop (the
                    author's jitted double round called 10 times); `jit (take form)`,
                    `optimize (take form)`: written inline with `jnp.take` (`chacha_take`);
- `openssl`:        `openssl speed -evp chacha20` on one core for the same bytes (64 per block),
                    its own rate measured in the same run (skipped, with the reason, where no
                    `openssl` is found).
On another backend (a TPU) the CPU-only parts are left out, each cell saying why: the one-core
runs, OpenSSL beside them, and `optimize, XLA's copies` (an XLA:CPU compile option).

Columns: run time (paired rounds, medians, one process) and its ratio to `jit`, to `hand` and to
`openssl`; `cores`: CPU seconds per wall second of a call (XLA:CPU splits a long enough fusion
over the cores; a tile's fusions are too short to be split, docs/measurements.md); the same run
with every thread of the process on one core (`jit`, `hand`, `optimize`: paired rounds of their
own) and its ratio to `hand` and to `openssl`, which is one core; compile seconds (trace +
rewrite + lower + compile from fresh caches, paired rounds, medians) and their ratio to `jit`
and to `optimize tile=False`; whether the keystream is bit for bit `jax.jit`'s.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrewrite  # noqa: E402
from permutations import RFC_OUT, _blocks, chacha_loop, chacha_take, chacha_words  # noqa: E402

NAME = "limit"
COLUMNS = ("program", "blocks", "form", "T", "run_ms", "run_ratio_jit", "run_ratio_hand",
           "run_ratio_openssl", "cores", "run_ms_one_core", "run_ratio_hand_one_core",
           "run_ratio_openssl_one_core", "compile_s", "compile_ratio_jit", "compile_ratio_untiled",
           "exact")
ONE_CORE = ("jit", "hand", "optimize")   # the forms timed again with the process on one core
BYTES_PER_BLOCK = 64
KEEP_COPIES = {"xla_cpu_copy_insertion_use_region_analysis": False}  # XLA:CPU's default


def openssl_seconds(nbytes: int, cipher: str = "chacha20",
                    seconds: int = 1) -> tuple[float | None, str]:
    """Seconds `openssl speed -evp <cipher>` (one process: one core) takes for `nbytes`, from its
    machine-readable rate for buffers of that size; (None, why) where it cannot be run."""
    exe = shutil.which("openssl") or ("/usr/bin/openssl" if os.path.exists("/usr/bin/openssl")
                                      else None)
    if exe is None:
        return None, "openssl not found"
    try:
        out = subprocess.run([exe, "speed", "-mr", "-evp", cipher, "-seconds", str(seconds),
                              "-bytes", str(nbytes)], capture_output=True, text=True,
                             timeout=60 + 4 * seconds)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"openssl failed: {e}"
    for line in out.stdout.splitlines():
        if line.startswith("+F:"):  # +F:<index>:<cipher>:<bytes per second>
            rate = float(line.rsplit(":", 1)[1])
            if rate > 0:
                return nbytes / rate, ""
    return None, f"no rate in openssl's output (exit {out.returncode})"


def _compile(make, x):
    jax.clear_caches()
    t = time.perf_counter()
    compiled = make().lower(x).compile()
    seconds = time.perf_counter() - t
    stats = (jaxrewrite.last_report().stats.get("tile") if jaxrewrite.last_report() else None)
    return seconds, compiled, stats


def chacha(n: int, quick: bool) -> list[dict]:
    x = _blocks(n)
    variants = {
        "jit": lambda: jax.jit(jax.vmap(chacha_loop("fori"))),
        "jit (A/A)": lambda: jax.jit(lambda s: jax.vmap(chacha_loop("fori"))(s)),
        "hand": lambda: jax.jit(jax.vmap(chacha_words)),
        "optimize tile=False": lambda: jaxrewrite.optimize(jax.vmap(chacha_loop("fori")),
                                                           tile=False),
        "optimize": lambda: jaxrewrite.optimize(jax.vmap(chacha_loop("fori"))),
        # (an XLA:CPU option, so on the CPU only)
        **({"optimize, XLA's copies": lambda: jaxrewrite.optimize(
            jax.vmap(chacha_loop("fori")), compiler_options=KEEP_COPIES)}
           if _common.on_cpu() else {}),
        # the same rounds as a Python loop (of the author's jitted double round; of inline
        # `jnp.take` code): jax.jit unrolls them, optimize rolls them first (passes/rounds.py)
        "jit (Python loop)": lambda: jax.jit(jax.vmap(chacha_loop("python"))),
        "optimize (Python loop)": lambda: jaxrewrite.optimize(jax.vmap(chacha_loop("python"))),
        "jit (take form)": lambda: jax.jit(jax.vmap(chacha_take)),
        "optimize (take form)": lambda: jaxrewrite.optimize(jax.vmap(chacha_take)),
    }
    rows = _table("chacha20 (author's fori form)", n, x, variants, quick, "chacha20")
    first = np.asarray(jax.jit(jax.vmap(chacha_loop("fori")))(x[:1]))[0]
    assert np.array_equal(first, RFC_OUT), "the author's form does not match RFC 8439 2.3.2"
    return rows


def _tiled(form: str) -> bool:
    return form.startswith("optimize") and form != "optimize tile=False"


def _table(program: str, n: int, x, variants: dict, quick: bool, cipher: str) -> list[dict]:
    """Rows of `variants` (name -> maker of a fresh jitted callable) on `x`, and openssl's."""
    walls: dict = {k: [] for k in variants}
    compiled, tiles = {}, {}
    for _ in range(1 if quick else 3):  # paired rounds of fresh compiles
        for name, make in variants.items():
            print(f"[{NAME}] {program}/{n} / {name}", file=sys.stderr, flush=True)
            s, c, tile = _compile(make, x)
            walls[name].append(s)
            compiled.setdefault(name, c)
            if _tiled(name):
                tiles[name] = tile
    ref = np.asarray(compiled["jit"](x))
    calls = {k: (lambda c=c: c(x)) for k, c in compiled.items()}
    reps = 5 if quick else (9 if n <= 65536 else 5)
    med, cores = _common.paired_with_cores(calls, repeats=reps)
    one, unpinned = {}, f"skipped: the programs run on {jax.default_backend()}, not the CPU"
    if _common.on_cpu():  # one core, and OpenSSL on one core, set beside the CPU's runs only
        with _common.one_core() as core:
            one = _common.paired({k: calls[k] for k in ONE_CORE if k in calls},
                                 repeats=reps) if core is not None else {}
        unpinned = "skipped: threads cannot be pinned here" if core is None else ""
        ossl, why = openssl_seconds(n * BYTES_PER_BLOCK, cipher)
    else:
        ossl, why = None, f"the programs run on {jax.default_backend()}, not the CPU"
    comp = {k: statistics.median(v) for k, v in walls.items()}
    hand = med.get("hand")
    rows = []
    for name in variants:
        tile = tiles.get(name)
        rows.append(dict(
            program=program if name != "hand" else program.split(" ")[0] + " (hand form)",
            blocks=n, form=name, T=(tile["T"] if tile else "-") if _tiled(name) else "",
            run_ms=med[name] * 1e3, run_ratio_jit=med[name] / med["jit"],
            run_ratio_hand=med[name] / hand if hand else "",
            run_ratio_openssl=(med[name] / ossl) if ossl else f"skipped: {why}",
            cores=cores[name],
            run_ms_one_core=one[name] * 1e3 if name in one else
            (unpinned if name in ONE_CORE else ""),
            run_ratio_hand_one_core=(one[name] / one["hand"]
                                     if name in one and "hand" in one else ""),
            run_ratio_openssl_one_core=(one[name] / ossl) if name in one and ossl else "",
            compile_s=comp[name], compile_ratio_jit=comp[name] / comp["jit"],
            compile_ratio_untiled=comp[name] / comp["optimize tile=False"],
            exact=bool(np.array_equal(np.asarray(compiled[name](x)), ref))))
    rows.append(dict(program=f"{cipher} (openssl speed -evp {cipher}, one core)", blocks=n,
                     form="openssl", T="", run_ms=(ossl * 1e3) if ossl else f"skipped: {why}",
                     run_ratio_jit=(ossl / med["jit"]) if ossl else "",
                     run_ratio_hand=(ossl / hand) if ossl and hand else "",
                     run_ratio_openssl=1.0 if ossl else "", cores="",
                     run_ms_one_core=(ossl * 1e3) if ossl else "",
                     run_ratio_hand_one_core=(ossl / one["hand"]) if ossl and "hand" in one
                     else "", run_ratio_openssl_one_core=1.0 if ossl else "", compile_s="",
                     compile_ratio_jit="", compile_ratio_untiled="", exact="-"))
    return rows


# --- BLAKE2s (RFC 7693), written the way the ChaCha20 author wrote theirs ----------------------
# One compression of a final 64-byte block (a 64-byte message, unkeyed, 32-byte digest) per
# batch element: a jitted G on a 4-vector vmapped over the columns, a jitted round moving
# diagonals into columns with index maps and reading its message schedule row at the loop
# index, the 10 rounds in `lax.fori_loop`.

IV = np.array([0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
               0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19], np.uint32)
SIGMA = np.array([
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
    [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
    [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
    [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
    [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
    [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
    [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
    [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
    [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0]], np.int32)


def _rotr(x, n):
    return (x >> np.uint32(n)) | (x << np.uint32(32 - n))


@jax.jit
def _g(v, xy):
    a, b, c, d = v[0], v[1], v[2], v[3]
    a = a + b + xy[0]; d = _rotr(d ^ a, 16)  # noqa: E702
    c = c + d; b = _rotr(b ^ c, 12)  # noqa: E702
    a = a + b + xy[1]; d = _rotr(d ^ a, 8)  # noqa: E702
    c = c + d; b = _rotr(b ^ c, 7)  # noqa: E702
    return jnp.array([a, b, c, d], dtype=jnp.uint32)


@jax.jit
def _blake_round(v, m, r):
    g = jax.vmap(_g, in_axes=(1, 0), out_axes=1)
    diag_map = jnp.array([0, 1, 2, 3, 5, 6, 7, 4, 10, 11, 8, 9, 15, 12, 13, 14])
    undiag_map = jnp.array([0, 1, 2, 3, 7, 4, 5, 6, 10, 11, 8, 9, 13, 14, 15, 12])
    w = m[jnp.asarray(SIGMA)[r]]
    v = g(v, w[:8].reshape(4, 2)).ravel()[diag_map].reshape(4, 4)
    return g(v, w[8:].reshape(4, 2)).ravel()[undiag_map].reshape(4, 4)


def blake2s_block(m):
    """The digest words of a 64-byte message `m` (16 little-endian u32 words)."""
    h = IV.copy()
    h[0] ^= 0x01010020                       # digest 32 bytes, unkeyed, fanout 1, depth 1
    v = np.concatenate([h, IV])
    v[12] ^= 64                              # bytes compressed
    v[14] ^= 0xFFFFFFFF                      # the final block
    v = jax.lax.fori_loop(0, 10, lambda r, v: _blake_round(v, m, r),
                          jnp.asarray(v).reshape(4, 4)).ravel()
    return jnp.asarray(h) ^ v[:8] ^ v[8:]


def blake2s(n: int, quick: bool) -> list[dict]:
    import hashlib
    msgs = np.random.default_rng(n).integers(0, 2**32, (n, 16), dtype=np.uint32)
    m = jnp.asarray(msgs)
    author = jax.vmap(blake2s_block)
    variants = {
        "jit": lambda: jax.jit(author),
        "jit (A/A)": lambda: jax.jit(lambda s: author(s)),
        "optimize tile=False": lambda: jaxrewrite.optimize(jax.vmap(blake2s_block), tile=False),
        "optimize": lambda: jaxrewrite.optimize(jax.vmap(blake2s_block)),
        **({"optimize, XLA's copies": lambda: jaxrewrite.optimize(
            jax.vmap(blake2s_block), compiler_options=KEEP_COPIES)} if _common.on_cpu() else {}),
    }
    rows = _table("blake2s (author's fori form)", n, m, variants, quick, "blake2s256")
    got = np.asarray(jax.jit(author)(m[:1]))[0].astype("<u4").tobytes()
    ok = got == hashlib.blake2s(msgs[0].astype("<u4").tobytes()).digest()
    for r in rows:
        r["exact"] = r["exact"] and ok if r["form"] != "openssl" else "-"
    return rows


def main(quick: bool = False) -> list[dict]:
    rows = []
    for n in ((1024, 16384, 65536) if quick else (1024, 16384, 65536, 1 << 20)):
        rows += chacha(n, quick)
    for n in ((65536,) if quick else (1024, 16384, 65536, 1 << 20)):
        rows += blake2s(n, quick)
    return rows


if __name__ == "__main__":
    _common.cli(NAME, main, COLUMNS)

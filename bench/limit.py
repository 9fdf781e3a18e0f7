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
- `openssl`:        `openssl speed -evp chacha20` on one core for the same bytes (64 per block),
                    its own rate measured in the same run (skipped, with the reason, where no
                    `openssl` is found).

Columns: run time (paired rounds, medians, one process) and its ratio to `jit`, to `hand` and to
`openssl`; compile seconds (trace + rewrite + lower + compile from fresh caches, paired rounds,
medians) and their ratio to `jit` and to `optimize tile=False`; whether the keystream is bit for
bit `jax.jit`'s.
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
import numpy as np  # noqa: E402

import jaxrewrite  # noqa: E402
from permutations import RFC_OUT, _blocks, chacha_loop, chacha_words  # noqa: E402

NAME = "limit"
COLUMNS = ("program", "blocks", "form", "T", "run_ms", "run_ratio_jit", "run_ratio_hand",
           "run_ratio_openssl", "compile_s", "compile_ratio_jit", "compile_ratio_untiled",
           "exact")
BYTES_PER_BLOCK = 64


def openssl_seconds(nbytes: int, seconds: int = 1) -> tuple[float | None, str]:
    """Seconds `openssl speed -evp chacha20` (one process: one core) takes for `nbytes`, from its
    machine-readable rate for buffers of that size; (None, why) where it cannot be run."""
    exe = shutil.which("openssl") or ("/usr/bin/openssl" if os.path.exists("/usr/bin/openssl")
                                      else None)
    if exe is None:
        return None, "openssl not found"
    try:
        out = subprocess.run([exe, "speed", "-mr", "-evp", "chacha20", "-seconds", str(seconds),
                              "-bytes", str(nbytes)], capture_output=True, text=True,
                             timeout=60 + 4 * seconds)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"openssl failed: {e}"
    for line in out.stdout.splitlines():
        if line.startswith("+F:"):  # +F:<index>:ChaCha20:<bytes per second>
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
    author = jax.vmap(chacha_loop("fori"))
    variants = {
        "jit": lambda: jax.jit(author),
        "jit (A/A)": lambda: jax.jit(lambda s: author(s)),
        "hand": lambda: jax.jit(jax.vmap(chacha_words)),
        "optimize tile=False": lambda: jaxrewrite.optimize(jax.vmap(chacha_loop("fori")),
                                                           tile=False),
        "optimize": lambda: jaxrewrite.optimize(jax.vmap(chacha_loop("fori"))),
    }
    walls: dict = {k: [] for k in variants}
    compiled, tiles = {}, {}
    for _ in range(1 if quick else 3):  # paired rounds of fresh compiles
        for name, make in variants.items():
            print(f"[{NAME}] chacha20/{n} / {name}", file=sys.stderr, flush=True)
            s, c, tile = _compile(make, x)
            walls[name].append(s)
            compiled.setdefault(name, c)
            if name == "optimize":
                tiles[name] = tile
    ref = np.asarray(compiled["jit"](x))
    assert np.array_equal(ref[0], RFC_OUT), "the author's form does not match RFC 8439 2.3.2"
    calls = {k: (lambda c=c: c(x)) for k, c in compiled.items()}
    reps = 5 if quick else (9 if n <= 65536 else 5)
    med = _common.paired(calls, repeats=reps)
    ossl, why = openssl_seconds(n * BYTES_PER_BLOCK)
    comp = {k: statistics.median(v) for k, v in walls.items()}
    rows = []
    for name in variants:
        tile = tiles.get(name)
        rows.append(dict(
            program="chacha20 (author's fori form)" if name not in ("hand",) else
            "chacha20 (hand form)", blocks=n, form=name,
            T=(tile["T"] if tile else "-") if name == "optimize" else "",
            run_ms=med[name] * 1e3, run_ratio_jit=med[name] / med["jit"],
            run_ratio_hand=med[name] / med["hand"],
            run_ratio_openssl=(med[name] / ossl) if ossl else f"skipped: {why}",
            compile_s=comp[name], compile_ratio_jit=comp[name] / comp["jit"],
            compile_ratio_untiled=comp[name] / comp["optimize tile=False"],
            exact=bool(np.array_equal(np.asarray(compiled[name](x)), ref))))
    rows.append(dict(program="chacha20 (openssl speed -evp chacha20, one core)", blocks=n,
                     form="openssl", T="", run_ms=(ossl * 1e3) if ossl else f"skipped: {why}",
                     run_ratio_jit=(ossl / med["jit"]) if ossl else "",
                     run_ratio_hand=(ossl / med["hand"]) if ossl else "",
                     run_ratio_openssl=1.0 if ossl else "", compile_s="",
                     compile_ratio_jit="", compile_ratio_untiled="", exact="-"))
    return rows


def main(quick: bool = False) -> list[dict]:
    rows = []
    for n in ((1024, 16384, 65536) if quick else (1024, 16384, 65536, 1 << 20)):
        rows += chacha(n, quick)
    return rows


if __name__ == "__main__":
    _common.cli(NAME, main, COLUMNS)

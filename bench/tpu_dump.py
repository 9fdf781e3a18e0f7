"""What Mosaic makes of the ChaCha20 kernels on the chip (issue 44, item 4): the kernel pass's
kernels against kernels written by hand in the same design, op for op.

    python3 bench/tpu_dump.py                  # on the TPU: about 2 minutes
    python3 bench/tpu_dump.py author hand      # some programs
    python3 bench/tpu_dump.py --quick          # anywhere: 4,096 blocks, Pallas's interpreter
    python3 bench/tpu_dump.py --bundles author threefry_jit threefry_kernel
                                               # and libtpu's own dump, a .tar.xz a program

Programs (1,048,576 blocks; block 0 RFC 8439's state):
- `author`: `optimize(vmap(chacha_loop("fori")), kernel=True)`, the state (N, 4, 4);
- `word`: the same vmapped over the last axis of a word-major (4, 4, N) state;
- `hand`, `hand_unroll2`, `hand_unroll`, `hand_r32`: one `pallas_call` written by hand in the
  design issue 41 measured (the 16 words as (rows, 128) tiles of a (16, N/128, 128) array, one
  grid step per 16 rows (32 for `hand_r32`), the 10 double rounds in a `fori_loop` inside,
  unrolled 1, 2 or 10 times, the feed-forward add inside too);
- `hand_native` (named on the command line): the same kernel reading and writing the
  author's (N, 4, 4) state where XLA:TPU keeps it, with no relayout around it (`_native`).
- `salsa`, `salsa_split`, `salsa_jit` (named on the command line): the accelerator bench's
  Salsa20/8 core on an (N, 16) state, as the kernel, the split XLA form and `jax.jit`.

Each compiles and runs in a child process of its own with
`LIBTPU_INIT_ARGS=--xla_mosaic_dump_to=DIR` (a flag libtpu reads when it starts; `--xla_dump_to`
is not one of its flags there and stops it). Per program: run time (`_common.paired`: the
median of 7 calls after a warm-up), compile seconds, bit for bit against RFC 8439's block, and
the LLO operations of each kernel's last Mosaic stage (`post-finalize-llo`), all and inside its
loop. These are operations, not VLIW bundles: libtpu's own dump (`--xla_jf_dump_to`,
`--xla_jf_dump_llo_text=true`) has the bundles, of XLA's fusions too, but wrote 5,280 files for
five programs, more than a call brings back; `--bundles` turns it on and packs each program's
into one `$OUT/bundles-<program>.tar.xz` of at most 15 MiB (all of it, or the files named for
LLO, bundles or schedules first, then the largest) with a manifest of every file beside it.
Mind the 8 files a call brings back: three programs with `--bundles` make eight.
Prints one JSON line per program; with `OUT` set, writes `$OUT/tpu_dump.json` and the Mosaic
dumps as `$OUT/mosaic.tar.xz` (not with `--quick`, whose children run on the CPU).
"""
from __future__ import annotations

import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROGRAMS = ("author", "word", "hand", "hand_unroll2", "hand_unroll", "hand_r32")
# more, named on the command line: the pass's kernel with other tile rows, the split XLA form
# (XLA's own fusions of the same rounds), and JAX's Threefry draw of 2**26 words by jax.jit and
# by the kernel (issues 44, 47: does XLA's fusion keep the VPU busier than the kernels' loops?)
MORE = ("author_r8", "author_r32", "split", "threefry_jit", "threefry_kernel", "hand_native",
        "salsa", "salsa_split", "salsa_jit")
BUNDLE_LIMIT = 15 << 20     # a file a device call brings back: 16 MiB at most


def _rotl(v, k):
    return (v << k) | (v >> (32 - k))


def _double_round(_, s):
    """ChaCha20's double round on its 16 words (a `fori_loop` body): the hand-made kernels'."""
    s = list(s)
    for a, b, c, d in ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15),
                       (0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14)):
        s[a] = s[a] + s[b]; s[d] = _rotl(s[d] ^ s[a], 16)  # noqa: E702
        s[c] = s[c] + s[d]; s[b] = _rotl(s[b] ^ s[c], 12)  # noqa: E702
        s[a] = s[a] + s[b]; s[d] = _rotl(s[d] ^ s[a], 8)   # noqa: E702
        s[c] = s[c] + s[d]; s[b] = _rotl(s[b] ^ s[c], 7)   # noqa: E702
    return tuple(s)


def _hand(n: int, rows: int, unroll: int, interpret: bool):
    """ChaCha20's block function as one Pallas kernel, written by hand: (4, 4, N) -> (4, 4, N)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        words = [x_ref[i] for i in range(16)]

        out = jax.lax.fori_loop(0, 10, _double_round, tuple(words), unroll=unroll)
        for i in range(16):
            o_ref[i] = out[i] + words[i]

    tiles = n // 128
    spec = pl.BlockSpec((16, rows, 128), lambda i: (0, i, 0))

    @jax.jit
    def f(x):
        y = pl.pallas_call(kernel, grid=(tiles // rows,), in_specs=[spec], out_specs=spec,
                           out_shape=jax.ShapeDtypeStruct((16, tiles, 128), jnp.uint32),
                           interpret=interpret)(x.reshape(16, tiles, 128))
        return y.reshape(4, 4, n)
    return f


def _native(n: int, rows: int, interpret: bool):
    """The hand-made kernel on the author's (N, 4, 4) state in place: no relayout around it.

    XLA:TPU lays a (N, 4, 4) 32-bit array out batch-minor, `{0,2,1:T(4,128)}`: for each row r
    of the state, the N/128 tiles of 128 blocks, each tile the 4 words of that row. That is the
    row-major (4, N/32, 128) array V[r, 4t + c, l] = x[128t + l, r, c], so `x` viewed as V is a
    bitcast (compiled for a TPU v5e: the kernel is the program's only launch), and word
    (r, c) of `rows` tiles is V[r, c::4] of a (4, 4 rows, 128) block: a sublane-strided load,
    and a strided store back. (The pass's kernel took 16 pieces (N/128, 128), which XLA made,
    and the (N, 4, 4) result, with 5 relayout fusions: 650K of the program's 1.23M bundles,
    `bench/tpu_aot.py`. Since Dec 7 night it reads and writes in place too, through
    `backend/tpu_layout.py`: `author` is this kernel made by the pass.)"""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        words = [x_ref.at[r][pl.ds(c, rows, stride=4), :] for r in range(4) for c in range(4)]

        out = jax.lax.fori_loop(0, 10, _double_round, tuple(words))
        for r in range(4):
            for c in range(4):
                o_ref.at[r][pl.ds(c, rows, stride=4), :] = out[4 * r + c] + words[4 * r + c]

    from jaxrewrite.backend import tpu_layout
    layout = tpu_layout.native((n, 4, 4), 4)      # (the view above: V[r, 4t + c, l])
    tiles = n // 128
    spec = pl.BlockSpec((4, 4 * rows, 128), lambda i: (0, i, 0))

    @jax.jit
    def f(x):
        y = pl.pallas_call(kernel, grid=(tiles // rows,), in_specs=[spec], out_specs=spec,
                           out_shape=jax.ShapeDtypeStruct(layout.view_shape(), jnp.uint32),
                           interpret=interpret)(layout.to_view(x))
        return layout.from_view(y)
    return f


def build(name: str, n: int, interpret: bool = False):
    """(the function, its argument) of a program: `n` blocks (Threefry: 64 words a block), for
    the TPU (`target="tpu"`: the same rewrite where this process has no TPU, `bench/tpu_aot.py`)."""
    sys.path.insert(0, HERE)
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxrewrite
    from permutations import _blocks, chacha_loop

    if name.startswith("threefry"):
        words = 64 * n                      # 2**26 at 1,048,576 blocks (the size)
        draw = lambda k: jax.random.bits(k, (words,), jnp.uint32)  # noqa: E731
        f = (jax.jit(draw) if name == "threefry_jit"
             else jaxrewrite.optimize(draw, kernel=True, target="tpu"))
        return f, jax.random.key(2026)
    if name.startswith("salsa"):
        # the accelerator bench's Salsa20/8 (scrypt's core, a vmapped (N, 16) state): issue 44's
        # item 4 asks its kernel for <= 0.5x its split form
        from accelerator import salsa20_8
        state = jnp.asarray(np.random.default_rng(0).integers(0, 2**32, (n, 16), np.uint32))
        f = jax.vmap(salsa20_8)
        return ({"salsa_jit": jax.jit(f),
                 "salsa_split": jaxrewrite.optimize(f, kernel=False, target="tpu")}.get(name)
                or jaxrewrite.optimize(f, kernel=True, target="tpu")), state
    x = _blocks(n)
    if name in ("author_r8", "author_r32"):
        import dataclasses

        from jaxrewrite.backend import cost      # this child's own row: its process alone
        cost.COSTS["tpu"] = dataclasses.replace(cost.COSTS["tpu"],
                                                kernel_tile_rows=int(name[len("author_r"):]))
    if name == "hand_native":
        return _native(n, 16, interpret), x
    if name.startswith("author"):
        return jaxrewrite.optimize(jax.vmap(chacha_loop("fori")), kernel=True, target="tpu"), x
    if name == "split":
        return jaxrewrite.optimize(jax.vmap(chacha_loop("fori")), kernel=False,
                                   target="tpu"), x
    word_major = jnp.asarray(np.transpose(np.asarray(x), (1, 2, 0)))
    if name == "word":
        return jaxrewrite.optimize(jax.vmap(chacha_loop("fori"), in_axes=2, out_axes=2),
                                   kernel=True, target="tpu"), word_major
    return _hand(n, 32 if name == "hand_r32" else 16,
                 {"hand_unroll2": 2, "hand_unroll": 10}.get(name, 1), interpret), word_major


def child(name: str, n: int, interpret: bool) -> dict:
    """Compile and run one program in this process; its row."""
    sys.path.insert(0, HERE)
    import _common
    import jax
    import jax.numpy as jnp
    import numpy as np
    from permutations import RFC_OUT

    f, arg = build(name, n, interpret)
    t = time.perf_counter()
    compiled = f.lower(arg).compile()
    compile_s = time.perf_counter() - t
    if name.startswith("threefry"):
        draw = lambda k: jax.random.bits(k, (64 * n,), jnp.uint32)  # noqa: E731
        exact = bool(jnp.array_equal(compiled(arg), jax.jit(draw)(arg)))
        run_s = _common.paired({name: lambda: compiled(arg)}, repeats=7)[name]
        return dict(program=name, words=64 * n, run_ms=round(run_s * 1e3, 3),
                    compile_s=round(compile_s, 2), exact=exact)
    if name.startswith("salsa"):
        from accelerator import salsa20_8
        exact = bool(jnp.array_equal(compiled(arg), jax.jit(jax.vmap(salsa20_8))(arg)))
        run_s = _common.paired({name: lambda: compiled(arg)}, repeats=7)[name]
        return dict(program=name, blocks=n, run_ms=round(run_s * 1e3, 3),
                    compile_s=round(compile_s, 2), exact=exact)
    out = np.asarray(compiled(arg))
    block0 = out[0] if name in ("split", "hand_native") or name.startswith("author") else (
        out[:, :, 0])
    run_s = _common.paired({name: lambda: compiled(arg)}, repeats=7)[name]
    return dict(program=name, blocks=n, run_ms=round(run_s * 1e3, 3),
                compile_s=round(compile_s, 2), exact=bool(np.array_equal(block0, RFC_OUT)))


def llo_ops(dump_dir: str) -> list[dict]:
    """Per kernel in `dump_dir`: its LLO operations at the last Mosaic stage, all and in loops."""
    kernels = []
    for path in sorted(glob.glob(os.path.join(dump_dir, "*post-finalize-llo*"))):
        total, loop = collections.Counter(), collections.Counter()
        depth = 0
        with open(path) as fh:
            lines = fh.readlines()
        for line in lines:
            ops = re.findall(r"\bllo\.(\w+)", line.split("{llo.type", 1)[0])
            total.update(o for o in ops if o != "constant")
            if depth:
                loop.update(o for o in ops if o != "constant")
            depth += line.count("scf.for")
            depth -= line.count("scf.yield")
        kernels.append(dict(file=os.path.basename(path), ops=dict(total.most_common()),
                            loop_ops=dict(loop.most_common())))
    return kernels


def pack(folder: str, dest: str, limit: int = BUNDLE_LIMIT) -> dict:
    """`folder` (libtpu's own dump of one program) as one .tar.xz a device call brings back: all
    of it where that fits `limit`, else the files whose names say LLO, bundles or schedules
    first, the largest first, as many as fit fewer bytes before compression (8, 4, 2, 1 times
    `limit`); and the manifest of every file (bytes, name) beside it."""
    files = sorted((os.path.relpath(os.path.join(d, f), folder),
                    os.path.getsize(os.path.join(d, f)))
                   for d, _, fs in os.walk(folder) for f in fs)
    with open(dest + ".manifest.txt", "w") as fh:
        fh.writelines(f"{size} {name}\n" for name, size in files)
    hints = ("llo", "bundle", "sched", "final")
    ranked = sorted(files, key=lambda f: (not any(h in f[0].lower() for h in hints), -f[1]))
    for budget in (float("inf"), 8 * limit, 4 * limit, 2 * limit, limit):
        chosen, total = [], 0
        for name, size in ranked:
            if total + size <= budget:
                chosen.append(name)
                total += size
        with tempfile.NamedTemporaryFile("w", delete=False, suffix=".txt") as lst:
            lst.write("".join(f + "\n" for f in chosen))
        subprocess.run(["tar", "cJf", dest, "-C", folder, "-T", lst.name], check=False)
        os.unlink(lst.name)
        if chosen and os.path.exists(dest) and os.path.getsize(dest) <= limit:
            return dict(files=len(files), packed=len(chosen), bytes=os.path.getsize(dest))
    if os.path.exists(dest):
        os.unlink(dest)
    return dict(files=len(files), packed=0, bytes=0)


def run(name: str, n: int, interpret: bool, dump_root: str | None,
        bundles: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if interpret:       # Pallas's interpreter runs on the CPU; a chip the caller holds opens once
        env["JAX_PLATFORMS"] = "cpu"
    dump = None
    if dump_root:
        dump = os.path.join(dump_root, name)
        env["LIBTPU_INIT_ARGS"] = (env.get("LIBTPU_INIT_ARGS", "")
                                   + f" --xla_mosaic_dump_to={dump}").strip()
        if bundles:     # libtpu's own dump: the VLIW bundles, of XLA's fusions and the kernels
            env["LIBTPU_INIT_ARGS"] += (f" --xla_jf_dump_to={dump}-jf"
                                        " --xla_jf_dump_llo_text=true")
    cmd = [sys.executable, __file__, "--child", name, str(n)] + (["--interpret"] if interpret
                                                                 else [])
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return dict(program=name, error="timeout (240 s)")
    rows = [json.loads(line[4:]) for line in r.stdout.splitlines() if line.startswith("ROW ")]
    if r.returncode or not rows:
        return dict(program=name, error=(r.stderr or r.stdout).strip().splitlines()[-3:])
    row = rows[0]
    if dump:
        row["kernels"] = llo_ops(dump)
    if dump and bundles and os.path.isdir(dump + "-jf"):
        row["bundles"] = pack(dump + "-jf", os.path.join(bundles, f"bundles-{name}.tar.xz"))
    return row


def main(argv=None) -> list[dict]:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--child"]:
        print("ROW " + json.dumps(child(args[1], int(args[2]), "--interpret" in args)),
              flush=True)
        return []
    quick = "--quick" in args
    names = [a for a in args if not a.startswith("--")] or list(PROGRAMS)
    unknown = [a for a in names if a not in PROGRAMS + MORE]
    if unknown:
        raise SystemExit(f"unknown programs {unknown}: of {PROGRAMS + MORE}")
    n = 4096 if quick else 1 << 20
    out = None if quick else os.environ.get("OUT")     # a smoke run writes over no result
    bundles = out if "--bundles" in args else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dump_root = None if quick else os.path.join(tmp, "mosaic")
        for name in names:
            rows.append(run(name, n, quick, dump_root, bundles))
            print(json.dumps(rows[-1]), flush=True)
        if out:
            with open(os.path.join(out, "tpu_dump.json"), "w") as fh:
                json.dump(rows, fh, indent=1)
            if dump_root and os.path.isdir(dump_root):
                subprocess.run(["tar", "cJf", os.path.join(out, "mosaic.tar.xz"), "-C", tmp,
                                "mosaic"], check=False)
    return rows


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checkpoints exchanged between the languages' train_linreg samples (samples/LINREG.md).

For every ordered pair (A, B) of the samples present, A trains 20 steps and saves, B
loads that checkpoint and trains 10 more: B's lines for steps 20..29 must equal those
of the C reference trained 30 steps straight, and every sample's first 20 lines must
equal C's. Lines are compared on the step number and the loss's bits.

Which samples exist is discovered: C from --c (the built binary), Python from the
script samples/python/train_linreg.py, Julia when `julia` is on PATH, Rust and Go from
--rust/--go or SX_SAMPLE_RUST/SX_SAMPLE_GO (built binaries). Absent ones are skipped,
and said so.

usage: cross_language_test.py --c PATH [--rust PATH] [--go PATH] [--python PYTHON]
"""
import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"^step (\d+) loss \S+ bits ([0-9a-f]{16})$")


def samples(args):
    """{language: command prefix} of the samples that exist, and why others are skipped."""
    found, skipped = {}, []
    if not args.c or not os.access(args.c, os.X_OK):
        sys.exit(f"the C reference sample is required: --c {args.c!r} is not an executable")
    found["c"] = [args.c]
    script = os.path.join(ROOT, "samples", "python", "train_linreg.py")
    if os.path.exists(script):
        found["python"] = [args.python, script]
    else:
        skipped.append(f"python: {script} does not exist")
    for lang in ("rust", "go"):
        path = getattr(args, lang) or os.environ.get(f"SX_SAMPLE_{lang.upper()}")
        if path and os.access(path, os.X_OK):
            found[lang] = [path]
        elif path:
            # A sample that was meant to be built and is not is a failure, not a skip.
            sys.exit(f"the {lang} sample {path} is not an executable (did bindings_{lang} build it?)")
        else:
            skipped.append(f"{lang}: no built sample given (--{lang} or SX_SAMPLE_{lang.upper()})")
    script = os.path.join(ROOT, "samples", "julia", "train_linreg.jl")
    julia = shutil.which("julia")
    if julia and os.path.exists(script):
        found["julia"] = [julia, "--threads=4", "--project=" + os.path.join(ROOT, "bindings", "julia"), script]
    else:
        skipped.append("julia: " + ("julia is not on PATH" if not julia else f"{script} is absent"))
    return found, skipped


def run(lang, command, extra, env):
    proc = subprocess.run(command + extra, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{lang} sample failed ({' '.join(command + extra)}), exit "
                         f"{proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return [(int(m.group(1)), m.group(2)) for m in map(LINE.match, proc.stdout.splitlines()) if m]


def first_difference(got, want):
    for k in range(max(len(got), len(want))):
        g = got[k] if k < len(got) else None
        w = want[k] if k < len(want) else None
        if g != w:
            fmt = lambda x: "(missing)" if x is None else f"step {x[0]} bits {x[1]}"
            return f"line {k + 1}: got {fmt(g)}, the C reference has {fmt(w)}"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--c", default=os.environ.get("SX_SAMPLE_C"), help="the C sample binary")
    parser.add_argument("--rust", help="the Rust sample binary")
    parser.add_argument("--go", help="the Go sample binary")
    parser.add_argument("--python", default=sys.executable, help="the Python interpreter")
    args = parser.parse_args()
    found, skipped = samples(args)
    env = dict(os.environ)
    lib = env.get("SX_LIBRARY")
    if lib:  # for the samples that link libsx by name
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, [os.path.dirname(os.path.abspath(lib)), env.get("LD_LIBRARY_PATH")]))
    for line in skipped:
        print("skipped", line)
    print("samples:", ", ".join(found))

    reference = run("c", found["c"], ["--steps", "30"], env)
    if [s for s, _ in reference] != list(range(30)):
        sys.exit(f"the C reference printed steps {[s for s, _ in reference]}, expected 0..29")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        saved = {}
        for lang, command in found.items():
            path = os.path.join(tmp, f"from-{lang}")
            lines = run(lang, command, ["--steps", "20", "--save", path], env)
            diff = first_difference(lines, reference[:20])
            if diff:
                failures.append(f"{lang}, 20 steps from scratch: {diff}")
            saved[lang] = path
        for a, b in itertools.product(found, repeat=2):
            lines = run(b, found[b], ["--steps", "10", "--load", saved[a]], env)
            diff = first_difference(lines, reference[20:])
            if diff:
                failures.append(f"saved by {a}, loaded by {b}: {diff}")
            else:
                print(f"ok: saved by {a}, loaded by {b}: steps 20..29 match C bit for bit")
    for f in failures:
        print("FAIL:", f)
    if failures:
        sys.exit(1)
    print(f"{len(found)} sample(s), {len(found) ** 2} pair(s): all match the C reference")


if __name__ == "__main__":
    main()

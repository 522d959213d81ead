#!/usr/bin/env python3
"""Checks that no function under src/ is longer than a limit (default 80 lines).

A function's length is its lines from the one that names it to its closing brace, as
Universal Ctags measures it (its "end" field). A long function is split where its parts
are steps of their own; docs/conventions.md, "Files and names".

Usage: check_function_lengths.py [--root DIR] [--limit N] [--allow NAME ...]

--allow names a function (as "scope::name", e.g. optim::internal::make_consts) left
longer for now; one that is no longer long is reported, so that the list only shrinks.
Exit 0: every function keeps to the limit; 1: a breach (each named by file:line, its
name and its length); 77 (ctest: skipped): no Universal Ctags to measure with.
Python 3, standard library only. ctest runs it as function_lengths (tests/layers/).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

SOURCE_EXTS = (".h", ".cc", ".cu", ".cuh", ".c")


def functions(root):
    """(length, path, line, qualified name) of every function defined under root/src."""
    files = []
    for dirpath, _, names in os.walk(os.path.join(root, "src")):
        files += [os.path.relpath(os.path.join(dirpath, n), root) for n in sorted(names) if n.endswith(SOURCE_EXTS)]
    out = subprocess.run(["ctags", "--output-format=json", "--fields=+neKS", "--kinds-c++=f", "--language-force=C++",
                          "-f", "-"] + sorted(files), cwd=root, check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        t = json.loads(line)
        if t.get("_type") != "tag" or t.get("kind") != "function" or "end" not in t:
            continue
        name = (t["scope"] + "::" if t.get("scope") else "") + t["name"]
        rows.append((t["end"] - t["line"] + 1, t["path"], t["line"], name))
    return rows


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=here)
    p.add_argument("--limit", type=int, default=80)
    p.add_argument("--allow", nargs="*", default=[])
    args = p.parse_args()
    if shutil.which("ctags") is None or b"Universal Ctags" not in subprocess.run(
            ["ctags", "--version"], capture_output=True).stdout:
        print("function_lengths: no Universal Ctags (Debian: universal-ctags) to measure with; skipped")
        return 77
    rows = functions(args.root)
    if not rows:
        print("function_lengths: ctags found no function under %s/src" % args.root)
        return 1
    long = sorted((r for r in rows if r[0] > args.limit), reverse=True)
    allowed = set(args.allow)
    breaches = [r for r in long if not any(r[3] == a or r[3].endswith("::" + a) for a in allowed)]
    stale = [a for a in allowed if not any(r[3] == a or r[3].endswith("::" + a) for r in long)]
    for n, path, line, name in breaches:
        print("%s:%d: %s is %d lines, over %d: split it into steps of their own" % (path, line, name, n, args.limit))
    for a in stale:
        print("function_lengths: %s is allowed to be long but is not (or is gone): take it off --allow" % a)
    if breaches or stale:
        return 1
    print("function_lengths: the %d functions under %s/src are at most %d lines (allowed longer: %s)"
          % (len(rows), os.path.abspath(args.root), args.limit, ", ".join(sorted(allowed)) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

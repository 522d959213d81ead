#!/usr/bin/env python3
"""Checks that a binding wraps every exported sx_* function.

A function counts as wrapped when its name appears in the binding's sources; a
function the binding leaves out on purpose is listed, with the reason, in the
binding's NOT_WRAPPED file ("sx_name: why", one per line). The list of functions
comes from sx_layout.json, and is first checked against the symbols libsx.so exports,
so a function added to the library but not to the header (or the reverse) fails too.

Usage: check_wrapped.py SX_LAYOUT_JSON LIBSX_SO BINDING_DIR [BINDING_DIR...]
"""
import json
import os
import re
import subprocess
import sys

SOURCE_SUFFIXES = (".rs", ".go", ".py", ".jl", ".c", ".h")


def exported_symbols(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines()
            if re.search(r" T sx_", line)}


def binding_text(root):
    chunks = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("target", "__pycache__", ".git")]
        for name in filenames:
            if name.endswith(SOURCE_SUFFIXES):
                with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                    chunks.append(f.read())
    return "\n".join(chunks)


def not_wrapped(root):
    listed = {}
    path = os.path.join(root, "NOT_WRAPPED")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                name, _, reason = line.partition(":")
                if not reason.strip():
                    sys.exit(f"{path}:{n}: '{name}' needs a reason after a colon")
                listed[name.strip()] = reason.strip()
    return listed


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        functions = set(json.load(f)["functions"])
    exported = exported_symbols(sys.argv[2])
    problems = []
    for name in sorted(functions - exported):
        problems.append(f"{name} is declared in sx.h but not exported by {sys.argv[2]}")
    for name in sorted(exported - functions):
        problems.append(f"{name} is exported by {sys.argv[2]} but not declared in sx.h")
    for root in sys.argv[3:]:
        text = binding_text(root)
        skipped = not_wrapped(root)
        for name in sorted(functions):
            wrapped = re.search(r"\b" + name + r"\b", text) is not None
            if not wrapped and name not in skipped:
                problems.append(f"{root}: {name} is neither wrapped nor listed in NOT_WRAPPED")
            if wrapped and name in skipped:
                problems.append(f"{root}: {name} is wrapped but also listed in NOT_WRAPPED")
        for name in sorted(set(skipped) - functions):
            problems.append(f"{root}/NOT_WRAPPED lists {name}, which sx.h does not declare")
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(f"{len(functions)} functions: exported, and wrapped or listed by {len(sys.argv) - 3} binding(s)")


if __name__ == "__main__":
    main()

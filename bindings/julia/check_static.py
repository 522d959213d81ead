#!/usr/bin/env python3
"""Checks the Julia binding without Julia, then runs its tests where Julia exists.

The module is src/SX.jl and the files by topic it includes; every src/*.jl is read.

1. Every struct mirror in src/*.jl (a `struct` whose line ends in `# sx_..._t`) has
   the fields of the C struct in sx_layout.json, in order, at the offsets and with the
   sizes that Julia's C-compatible layout of isbits fields gives them (each field at the
   next multiple of its alignment, the size rounded up to the largest alignment).
2. Every `@ccall libsx.sx_name(...)` names a function sx.h declares and passes it as
   many arguments as sx.h's prototype has.
3. `julia --project test/runtests.jl`, only when `julia` is on PATH.

Usage: check_static.py SX_LAYOUT_JSON SX_H
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "layout"))
from gen_layout import read_header, strip_comments  # noqa: E402  the same reading of sx.h

# Julia type -> (size, alignment) on the 64-bit platforms sx supports.
SCALARS = {"Int8": 1, "UInt8": 1, "Int16": 2, "UInt16": 2, "Int32": 4, "UInt32": 4,
           "Cint": 4, "Cuint": 4, "Float32": 4, "Int64": 8, "UInt64": 8, "Float64": 8,
           "Cdouble": 8, "Csize_t": 8, "Cstring": 8}


def type_layout(jtype, pointer_size):
    jtype = jtype.replace(" ", "")
    if jtype.startswith("Ptr{") or jtype == "Ptr":
        return pointer_size, pointer_size
    m = re.fullmatch(r"NTuple\{(\d+),(\w+|Ptr\{\w+\})\}", jtype)
    if m:
        size, align = type_layout(m.group(2), pointer_size)
        return int(m.group(1)) * size, align
    if jtype in SCALARS:
        return SCALARS[jtype], SCALARS[jtype]
    raise ValueError(f"no C layout known for the Julia type {jtype}")


def julia_structs(text):
    """{C typedef: [(field, julia type)]} of the annotated struct mirrors."""
    structs = {}
    for m in re.finditer(r"^(?:mutable\s+)?struct\s+(\w+)\s*#\s*(sx_\w+_t)\s*\n(.*?)^end\b",
                         text, flags=re.M | re.S):
        fields = re.findall(r"^\s*(\w+)::(.+?)\s*(?:#.*)?$", m.group(3), flags=re.M)
        structs[m.group(2)] = (m.group(1), fields)
    return structs


def check_structs(text, layout, problems):
    mirrors = julia_structs(text)
    for name in sorted(set(layout["structs"]) - set(mirrors)):
        problems.append(f"{name} has no mirror in src/*.jl")
    for cname, (jname, fields) in mirrors.items():
        spec = layout["structs"].get(cname)
        if spec is None:
            problems.append(f"{jname} mirrors {cname}, which sx.h does not define")
            continue
        want = [f["name"] for f in spec["fields"]]
        if [f for f, _ in fields] != want:
            problems.append(f"{jname}: fields {[f for f, _ in fields]}, {cname} has {want}")
            continue
        offset, max_align = 0, 1
        for (field, jtype), cfield in zip(fields, spec["fields"]):
            size, align = type_layout(jtype, layout["pointer_size"])
            offset = (offset + align - 1) // align * align
            max_align = max(max_align, align)
            if (offset, size) != (cfield["offset"], cfield["size"]):
                problems.append(f"{jname}.{field}::{jtype} lies at {offset} with size {size}; "
                                f"{cname}.{field} at {cfield['offset']} with size {cfield['size']}")
            offset += size
        total = (offset + max_align - 1) // max_align * max_align
        if (total, max_align) != (spec["size"], spec["align"]):
            problems.append(f"{jname} has size {total}, align {max_align}; {cname} has "
                            f"{spec['size']}, {spec['align']}")
    return len(mirrors)


def c_arities(header):
    text = strip_comments(header)
    arities = {}
    for m in re.finditer(r"SX_API\s+[^;(]*?\b(sx_\w+)\s*\(([^)]*)\)\s*;", text):
        params = " ".join(m.group(2).split())
        arities[m.group(1)] = 0 if params in ("", "void") else params.count(",") + 1
    return arities


def split_args(args):
    """Top-level comma-separated arguments (commas inside {} () [] do not split)."""
    depth, out, cur = 0, [], ""
    for ch in args:
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [a for a in out + [cur] if a.strip()]


def check_ccalls(text, arities, problems, filename="SX.jl"):
    calls = 0
    for m in re.finditer(r"@ccall\(?\s*libsx\.(\w+)\(", text):
        name, start, depth = m.group(1), m.end(), 1
        k = start
        while depth:
            depth += {"(": 1, ")": -1}.get(text[k], 0)
            k += 1
        args = split_args(text[start:k - 1])
        calls += 1
        line = text.count("\n", 0, m.start()) + 1
        if name not in arities:
            problems.append(f"{filename}:{line}: @ccall of {name}, which sx.h does not declare")
        elif len(args) != arities[name]:
            problems.append(f"{filename}:{line}: {name} gets {len(args)} argument(s); sx.h declares "
                            f"{arities[name]}")
        for a in args:
            if "::" not in a:
                problems.append(f"{filename}:{line}: argument {a.strip()!r} of {name} has no ::Type")
    return calls


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        layout = json.load(f)
    arities = c_arities(read_header(sys.argv[2]))
    sources = {}
    for path in sorted(glob.glob(os.path.join(HERE, "src", "*.jl"))):
        with open(path, encoding="utf-8") as f:
            sources[os.path.basename(path)] = f.read()
    problems = []
    included = set(re.findall(r'^include\("(\w+\.jl)"\)', sources.get("SX.jl", ""), flags=re.M))
    for name in sorted(set(sources) - included - {"SX.jl"}):
        problems.append(f"src/{name} is not included by src/SX.jl")
    for name in sorted(included - set(sources)):
        problems.append(f"src/SX.jl includes {name}, which src/ does not hold")
    structs = check_structs("\n".join(sources.values()), layout, problems)
    calls = sum(check_ccalls(text, arities, problems, name) for name, text in sources.items())
    for p in problems:
        print("FAIL:", p)
    if problems:
        sys.exit(1)
    print(f"src/*.jl ({len(sources)} files): {structs} struct mirrors match sx_layout.json; {calls} @ccall sites name "
          "sx.h functions with the right number of arguments")
    julia = shutil.which("julia")
    if not julia:
        print("skipped test/runtests.jl: julia is not on PATH (the static checks above ran)")
        return
    env = dict(os.environ, SX_LAYOUT_JSON=os.path.abspath(sys.argv[1]))
    subprocess.run([julia, "--threads=4", "--project=" + HERE, os.path.join(HERE, "test", "runtests.jl")],
                   env=env, check=True)


if __name__ == "__main__":
    main()

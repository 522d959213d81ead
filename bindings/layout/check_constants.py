#!/usr/bin/env python3
"""Checks that every binding carries every SX_* constant of the C headers, with its value.

The constants and their values come from sx_layout.json: the C compiler's values of every
integer #define and enumerator named SX_* in include/sx/*.h (gen_layout.py). Each
binding's constants are read from its sources, without its toolchain:

  python  sx/_lib.py           SX_NAME = value
  rust    sx-sys/src/lib.rs    pub const SX_NAME: type = value;
  go      *.go                 Go names (ErrTimeout, HPLR, ...) in const blocks, each
                               = C.SX_NAME: cgo takes the value from the header when the
                               package builds, so only the name can be wrong; which Go
                               name stands for which SX_* constant is the map in
                               layout_test.go ("SX_NAME": int64(GoName))
  julia   src/*.jl             const SX_NAME = Int32(value), and the tuple forms
                               const A, B = Int32.(0:1) and UInt32.((0x1, 0x2))

A value may be an expression of integers and constants defined before it (SX_VERSION_NUMBER).
The check fails naming every constant a binding lacks, every value that differs from C's,
and every SX_* constant a binding defines that no header does. A constant a binding leaves
out on purpose is listed, with the reason, in the binding's CONSTANTS_OMITTED file
("SX_NAME: why", one per line, # for comments); a listed constant the binding does define,
or that no header defines, fails too.

Usage: check_constants.py SX_LAYOUT_JSON BINDINGS_DIR [LANG...]
"""
import ast
import glob
import json
import operator
import os
import re
import sys

LANGS = ("python", "rust", "go", "julia")


# ---- evaluating a value -----------------------------------------------------------------

class FromHeader:
    """A value a binding takes from the header itself when it builds (Go's C.SX_NAME)."""

    def __init__(self, name):
        self.name = name


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv, ast.LShift: operator.lshift,
           ast.RShift: operator.rshift, ast.BitOr: operator.or_, ast.BitAnd: operator.and_}


def evaluate(expr, names):
    """The integer value of expr: integer literals (decimal, 0x), + - * << >> | &, unary
    minus, parentheses and names already in `names`. Raises ValueError otherwise."""
    expr = re.sub(r"\b(0[xX][0-9a-fA-F]+|[0-9]+)(?:_?[iu](?:8|16|32|64|size)|[uUlL]+)\b", r"\1",
                  expr.strip())  # 1u32, 0x1u, 1L

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"cannot evaluate {expr!r}")
    try:
        return walk(ast.parse(expr, mode="eval"))
    except SyntaxError:
        raise ValueError(f"cannot evaluate {expr!r}") from None


def strip_line_comment(line, marker):
    return line.split(marker, 1)[0].rstrip()


# ---- each binding's constants: {C name: (value or None, where)} -------------------------

def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def python_constants(root):
    path = os.path.join(root, "sx", "_lib.py")
    found, names = {}, {}
    for n, line in enumerate(read(path).splitlines(), 1):
        m = re.match(r"^(SX_\w+)\s*=\s*(.+)$", strip_line_comment(line, "#"))
        if m:
            found[m.group(1)] = _value(m.group(2), names, f"{path}:{n}")
            names[m.group(1)] = found[m.group(1)][0]
    return found


def rust_constants(root):
    path = os.path.join(root, "sx-sys", "src", "lib.rs")
    found, names = {}, {}
    text = read(path)
    for m in re.finditer(r"^\s*pub\s+const\s+(SX_\w+)\s*:\s*[^=]+=\s*([^;]+);", text, flags=re.M):
        where = f"{path}:{text.count(chr(10), 0, m.start()) + 1}"
        found[m.group(1)] = _value(strip_line_comment(m.group(2), "//"), names, where)
        names[m.group(1)] = found[m.group(1)][0]
    return found


def go_constants(root):
    """Go's constants have Go names; layout_test.go's map says which SX_* each stands for."""
    values, where_of = {}, {}
    for path in sorted(glob.glob(os.path.join(root, "*.go"))):
        if path.endswith("_test.go"):
            continue
        text = read(path)
        blocks = [m.group(1) for m in re.finditer(r"^const\s*\((.*?)^\)", text, flags=re.M | re.S)]
        blocks += [m.group(1) for m in re.finditer(r"^const\s+(\w+\s*(?:\w+\s*)?=.*)$", text, flags=re.M)]
        for block in blocks:
            for line in block.splitlines():
                m = re.match(r"^\s*(\w+)\s*(?:\w+\s*)?=\s*(.+)$", strip_line_comment(line, "//"))
                if not m:
                    continue
                cref = re.fullmatch(r"C\.(SX_\w+)", m.group(2).strip())
                if cref:
                    values[m.group(1)] = FromHeader(cref.group(1))
                    where_of[m.group(1)] = path
                    continue
                try:
                    values[m.group(1)] = evaluate(m.group(2), values)
                except ValueError:
                    continue  # not an integer constant (a string, a C.xxx value)
                where_of[m.group(1)] = path
    test = os.path.join(root, "layout_test.go")
    found = {}
    for m in re.finditer(r'"(SX_\w+)"\s*:\s*(?:\w+\()?\s*(\w+)\s*\)?', read(test)):
        cname, goname = m.group(1), m.group(2)
        if goname in values:
            found[cname] = (values[goname], f"{where_of[goname]} ({goname})")
        else:
            found[cname] = (None, f"{test}: maps {cname} to {goname}, which no const block defines")
    return found


def julia_constants(root):
    found, names = {}, {}
    for path in sorted(glob.glob(os.path.join(root, "src", "*.jl"))):
        lines = read(path).splitlines()
        n = 0
        while n < len(lines):
            start = n
            stmt = strip_line_comment(lines[n], "#")
            n += 1
            if not re.match(r"^const\s+SX_", stmt):
                continue
            while stmt.count("(") > stmt.count(")") or stmt.rstrip().endswith(","):
                stmt += " " + strip_line_comment(lines[n], "#")
                n += 1
            lhs, _, rhs = stmt[len("const"):].partition("=")
            targets = [t.strip() for t in lhs.split(",") if t.strip()]
            where = f"{path}:{start + 1}"
            for name, value in zip(targets, _julia_values(rhs, len(targets), names, where)):
                found[name] = value
                names[name] = value[0]
    return found


def _julia_values(rhs, count, names, where):
    rhs = re.sub(r"\b(?:U?Int(?:8|16|32|64)|Csize_t|Cint|Cuint)\b\.?", "", rhs).strip()
    while rhs.startswith("(") and rhs.endswith(")") and _balanced(rhs[1:-1]):
        rhs = rhs[1:-1].strip()
    m = re.fullmatch(r"(-?\w+)\s*:\s*(-?\w+)", rhs)
    if m:  # a range a:b
        lo, hi = evaluate(m.group(1), names), evaluate(m.group(2), names)
        items = [(v, where) for v in range(lo, hi + 1)]
    elif "," in rhs:  # a tuple (a trailing comma makes one of one)
        items = [_value(part, names, where) for part in rhs.split(",") if part.strip()]
    else:
        items = [_value(rhs, names, where)]
    if len(items) != count:
        return [(None, f"{where}: {count} names but {len(items)} values")] * count
    return items


def _balanced(s):
    depth = 0
    for ch in s:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def _value(expr, names, where):
    try:
        return evaluate(expr, names), where
    except ValueError as e:
        return None, f"{where}: {e}"


READERS = {"python": python_constants, "rust": rust_constants, "go": go_constants,
           "julia": julia_constants}


# ---- the check ----------------------------------------------------------------------------

def omitted(root):
    listed = {}
    path = os.path.join(root, "CONSTANTS_OMITTED")
    if os.path.exists(path):
        for n, line in enumerate(read(path).splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, reason = line.partition(":")
            if not reason.strip():
                raise SystemExit(f"{path}:{n}: '{name}' needs a reason after a colon")
            listed[name.strip()] = reason.strip()
    return listed


def check(constants, bindings_dir, langs):
    """A list of problems, each naming the binding and the constant."""
    problems = []
    for lang in langs:
        root = os.path.join(bindings_dir, lang)
        ours = READERS[lang](root)
        skip = omitted(root)
        for name in sorted(constants):
            if name in skip:
                if name in ours:
                    problems.append(f"{lang}: {name} is defined but also listed in CONSTANTS_OMITTED")
                continue
            if name not in ours:
                problems.append(f"{lang}: {name} = {constants[name]} is missing (define it, or list "
                                f"it with a reason in {lang}/CONSTANTS_OMITTED)")
                continue
            value, where = ours[name]
            if isinstance(value, FromHeader):
                if value.name != name:
                    problems.append(f"{lang}: {name} is C.{value.name} at {where}")
            elif value is None:
                problems.append(f"{lang}: {name}: {where}")
            elif value != constants[name]:
                problems.append(f"{lang}: {name} is {value} at {where}; the headers say {constants[name]}")
        for name in sorted(set(ours) - set(constants)):
            problems.append(f"{lang}: {name} is defined at {ours[name][1]}, but no header defines it")
        for name in sorted(set(skip) - set(constants)):
            problems.append(f"{lang}/CONSTANTS_OMITTED lists {name}, which no header defines")
    return problems


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        constants = json.load(f)["constants"]
    langs = sys.argv[3:] or [l for l in LANGS if os.path.isdir(os.path.join(sys.argv[2], l))]
    problems = check(constants, sys.argv[2], langs)
    for p in problems:
        print("FAIL:", p)
    if problems:
        sys.exit(1)
    print(f"{len(constants)} constants of include/sx/*.h: defined with C's values, or listed as "
          f"omitted, by {', '.join(langs)}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks that sx's modules (src/<module>/) use only the modules below them.

The layers are src/layers.txt's: a line "module: a b c" lets the module use a, b and c
(each listed on an earlier line), and itself; a line "x sees y only through: y/h1.h y/h2.h"
(a seam) lets x's files include only those of y's headers. Two things must keep to it:

  * every #include "<module>/..." in a source or header under src/ (.h .cc .cu .cuh and
    the rest; relative paths resolved; "sx/..." is the public include/ and any other
    first part is a third-party header: neither is a module);
  * every sx_<module> named in src/<module>/CMakeLists.txt (its DEPS), in every branch,
    CUDA or not.

A folder under src/ that the table does not list, and a source file directly in src/,
are breaches too.

Usage: check_layers.py [--root DIR] [--no-self-test]

First the self-test: breaches planted one at a time in a scratch tree under DIR's table
must each be caught, and the tree without them must pass. Then DIR (default: this
checkout). Exit 1 on a breach (each named by file:line, the header or target, and the
rule it breaks) or a failed self-test. ctest runs it as layer_check (tests/layers/).
Python 3, standard library only.
"""

import argparse
import os
import re
import shutil
import sys
import tempfile

SOURCE_EXTS = {".h", ".hh", ".hpp", ".inl", ".ipp", ".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
CMAKE_TARGET = re.compile(r"\bsx_([A-Za-z0-9_]+)\b")
TABLE = os.path.join("src", "layers.txt")


class Layers:
    """src/layers.txt: modules bottom first, what each may use, and its layer number."""

    def __init__(self, root, errors):
        self.allowed = {}  # module -> set of modules it may use (itself not included)
        self.layer = {}  # 0 for base; else one above its highest allowed module
        self.seams = {}  # (module, used) -> the only headers of `used` that module may include
        path = os.path.join(root, TABLE)
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError as e:
            errors.append("%s: cannot read the layer table: %s" % (TABLE, e.strerror))
            return
        for number, line in enumerate(lines, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            where = "%s:%d" % (TABLE, number)
            seam = re.fullmatch(r"([a-z0-9_]+)\s+sees\s+([a-z0-9_]+)\s+only through\s*:\s*(.*)", line)
            if seam:
                module, used, headers = seam.group(1), seam.group(2), seam.group(3).split()
                if module not in self.allowed or used not in self.allowed.get(module, set()):
                    errors.append("%s: a seam from %s to %s, which %s may not use (or is not listed above)"
                                  % (where, module, used, module))
                elif not headers or any(not h.startswith(used + "/") for h in headers):
                    errors.append('%s: the seam from %s to %s must list headers of %s ("%s/...")'
                                  % (where, module, used, used, used))
                else:
                    self.seams[(module, used)] = set(headers)
                continue
            m = re.fullmatch(r"([a-z0-9_]+)\s*:\s*([a-z0-9_\s]*)", line)
            if not m:
                errors.append('%s: "%s" is not "module: modules it may use"' % (where, line))
                continue
            module, uses = m.group(1), m.group(2).split()
            if module in self.allowed:
                errors.append("%s: %s is listed twice" % (where, module))
                continue
            for used in uses:
                if used not in self.allowed:
                    errors.append("%s: %s may use %s, which is not listed above it (list modules bottom first)"
                                  % (where, module, used))
            ok = [u for u in uses if u in self.allowed]
            self.allowed[module] = set(ok)
            self.layer[module] = 1 + max((self.layer[u] for u in ok), default=-1)

    def rule(self, module, used):
        """Why `module` may not use `used`, or None if it may."""
        if used == module or used in self.allowed[module]:
            return None
        lm, lu = self.layer[module], self.layer[used]
        if lu > lm:
            why = "%s (layer %d) is above %s (layer %d)" % (used, lu, module, lm)
        elif lu == lm:
            why = "%s and %s are on the same layer (%d) and may not use each other" % (used, module, lm)
        else:
            why = "%s is below %s but src/layers.txt does not let %s use it" % (used, module, module)
        may = ", ".join(sorted(self.allowed[module], key=lambda u: (self.layer[u], u))) or "nothing"
        return "%s; %s may use: %s (src/layers.txt)" % (why, module, may)


def module_dirs(root):
    src = os.path.join(root, "src")
    return sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))


def check_includes(root, layers, module, errors):
    src = os.path.join(root, "src")
    for dirpath, _, files in os.walk(os.path.join(src, module)):
        for name in sorted(files):
            if os.path.splitext(name)[1] not in SOURCE_EXTS:
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    header = m.group(1)
                    target = header
                    if header.startswith("."):  # relative to this file: where does it land?
                        target = os.path.relpath(os.path.normpath(os.path.join(dirpath, header)), src)
                    parts = target.replace(os.sep, "/").split("/")
                    if len(parts) < 2 or parts[0] not in layers.allowed:
                        continue  # same folder, sx/ (public), a third-party header
                    why = layers.rule(module, parts[0])
                    if why:
                        errors.append('%s:%d: #include "%s": %s' % (rel, number, header, why))
                        continue
                    seam = layers.seams.get((module, parts[0]))
                    if seam is not None and "/".join(parts) not in seam:
                        errors.append('%s:%d: #include "%s": %s sees %s only through %s (src/layers.txt)'
                                      % (rel, number, header, module, parts[0], ", ".join(sorted(seam))))


def check_cmake(root, layers, module, errors):
    folder = os.path.join(root, "src", module)
    for dirpath, _, files in os.walk(folder):
        for name in sorted(files):
            if name != "CMakeLists.txt" and not name.endswith(".cmake"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    for target in CMAKE_TARGET.findall(line.split("#", 1)[0]):
                        if target not in layers.allowed:
                            continue  # sx_module(), sx_nccl and the like: not a module
                        why = layers.rule(module, target)
                        if why:
                            errors.append("%s:%d: sx_%s: %s" % (rel, number, target, why))


def check(root):
    """Every breach under root, as messages (none: the tree keeps to its layers)."""
    errors = []
    layers = Layers(root, errors)
    if not layers.allowed:
        return errors
    src = os.path.join(root, "src")
    for name in sorted(os.listdir(src)):
        if os.path.splitext(name)[1] in SOURCE_EXTS and os.path.isfile(os.path.join(src, name)):
            errors.append("src/%s: a source file outside any module (put it in src/<module>/)" % name)
    for module in module_dirs(root):
        if module not in layers.allowed:
            errors.append("src/%s/: module %s is not in src/layers.txt (add it on the line of its layer)"
                          % (module, module))
            continue
        check_includes(root, layers, module, errors)
        check_cmake(root, layers, module, errors)
    return errors


def run(root):
    errors = check(root)
    if errors:
        print("layer_check: %d breach%s of the module layers:" % (len(errors), "es" if len(errors) > 1 else ""))
        for e in errors:
            print("  " + e)
        return 1
    layers = Layers(root, [])
    print("layer_check: every module under %s/src keeps to src/layers.txt (%s)" % (
        os.path.abspath(root), ", ".join("%s %d" % (m, layers.layer[m]) for m in layers.allowed)))
    return 0


def self_test(real_root):
    """Plants one breach at a time in a small tree under the real table; each must fail."""
    clean = {
        "src/base/status.h": "#pragma once\n",
        "src/cuda/runtime.cu": '#include "base/status.h"\n#include <cuda_runtime.h>\n',
        "src/comm/nccl/one_device.cc": '#include "comm/communicator.h"\n#include "cuda/runtime.h"\n'
                                       '#include "sx/sx.h"\n#include "gloo/context.h"\n',
        "src/comm/CMakeLists.txt": "set(comm_deps sx_base gloo)\nif(SX_HAVE_CUDA)\n"
                                   "  list(APPEND comm_deps sx_cuda sx_nccl)\nendif()\n"
                                   "sx_module(comm SOURCES nccl/one_device.cc DEPS ${comm_deps})\n",
        "src/core/group.h": '#include "optim/optimizer.h"\n',
        "src/ckpt/manifest.cc": '#include "ckpt/manifest_generated.h"\n#include "core/shard_state.h"\n',
    }
    # (file, text appended, what the one message must name): includes up, across a layer,
    # through a relative path and from a new .cuh; DEPS across and below but not allowed;
    # a module missing from the table; a broken table.
    plants = [
        ("src/comm/nccl/one_device.cc", '#include "core/group.h"\n',
         ['src/comm/nccl/one_device.cc:5: #include "core/group.h"', "core (layer 3) is above comm (layer 2)"]),
        ("src/comm/nccl/one_device.cc", '  #  include "optim/cuda_kernels.h"\n',
         ['#include "optim/cuda_kernels.h"', "optim and comm are on the same layer"]),
        ("src/cuda/runtime.cu", '#include "../optim/cuda/launch_plan.h"\n',
         ["src/cuda/runtime.cu:3", "optim (layer 2) is above cuda (layer 1)"]),
        ("src/cuda/status.cuh", '#include "io/file_ops.h"\n', ["src/cuda/status.cuh:1", "same layer"]),
        ("src/comm/CMakeLists.txt", "list(APPEND comm_deps sx_optim)  # sx_core in a comment is fine\n",
         ["src/comm/CMakeLists.txt:6: sx_optim", "optim and comm are on the same layer"]),
        ("src/comm/CMakeLists.txt", "target_link_libraries(sx_comm PRIVATE sx_io)\n",
         ["sx_io: io is below comm but src/layers.txt does not let comm use it"]),
        ("src/extra/thing.cc", "\n", ["module extra is not in src/layers.txt"]),
        ("src/ckpt/manifest.cc", '#include "core/group.h"\n',
         ['src/ckpt/manifest.cc:3: #include "core/group.h"', "ckpt sees core only through"]),
        ("src/ckpt/load.cc", '#include "../core/channel.h"\n', ["src/ckpt/load.cc:1", "ckpt sees core only through"]),
        ("src/recovery/regroup.cc", '#include "core/group.h"\n',
         ['src/recovery/regroup.cc:1: #include "core/group.h"', "recovery sees core only through"]),
        (TABLE, "ckpt sees api only through: api/handles.h\n", ["a seam from ckpt to api"]),
        (TABLE, "late: base\nbase: late\n", ["base is listed twice"]),
    ]
    failures = []
    with tempfile.TemporaryDirectory(prefix="sx_layer_check_") as scratch:
        for i, plant in enumerate([None] + plants):
            root = os.path.join(scratch, str(i))
            for rel, text in clean.items():
                os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
                with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                    f.write(text)
            shutil.copy(os.path.join(real_root, TABLE), os.path.join(root, TABLE))
            if plant is None:
                got = check(root)
                if got:
                    failures.append("the clean tree failed: %s" % got)
                continue
            rel, text, want = plant
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "a", encoding="utf-8") as f:
                f.write(text)
            got = check(root)
            if len(got) != 1 or not all(w in got[0] for w in want):
                failures.append("planting %r in %s: want one breach naming %s, got %s" % (text, rel, want, got))
    if failures:
        print("layer_check self-test FAILED:")
        for f in failures:
            print("  " + f)
        return 1
    print("layer_check self-test: the clean tree passes and all %d planted breaches are caught" % len(plants))
    return 0


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=here, help="the checkout to check (default: %(default)s)")
    p.add_argument("--no-self-test", action="store_true", help="skip the checker's check on planted breaches")
    args = p.parse_args()
    if not args.no_self_test and self_test(args.root) != 0:
        return 1
    return run(args.root)


if __name__ == "__main__":
    sys.exit(main())

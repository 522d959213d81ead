"""Every module of the package imports on its own, in a fresh interpreter, whatever was
imported before it; and no module imports another that (directly or through others)
imports it back. An import cycle works or fails by the order in which a program happens
to import the modules, so each is checked both ways: by importing the modules in several
orders, and by reading every import statement (with ast) and looking for a cycle.

The modules of sx.torch are imported where torch is installed (ctest's bindings_torch_imports
runs this file with the torch environment's Python); their imports are read everywhere.
SX_IMPORT_TEST_ONLY=<prefix> imports only the modules whose names start with it one by one
(bindings_torch_imports: sx.torch's, whose every import imports torch); the orders still
hold them all."""
import ast
import importlib.util
import json
import os
import random
import subprocess
import sys
import unittest

import sx

PACKAGE_DIR = os.path.dirname(os.path.abspath(sx.__file__))
ROOT = os.path.dirname(PACKAGE_DIR)
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def package_modules():
    """name -> (path, is_package) for every module under sx/, from the files."""
    modules = {}
    for dirpath, dirnames, filenames in os.walk(PACKAGE_DIR):
        dirnames[:] = sorted(d for d in dirnames if os.path.exists(os.path.join(dirpath, d, "__init__.py")))
        parts = os.path.relpath(dirpath, ROOT).split(os.sep)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            if name == "__init__.py":
                modules[".".join(parts)] = (os.path.join(dirpath, name), True)
            else:
                modules[".".join(parts + [name[:-3]])] = (os.path.join(dirpath, name), False)
    return modules


MODULES = package_modules()


def importable(name):
    """Whether this interpreter can import `name` (sx.torch and below need torch)."""
    return HAVE_TORCH or not (name == "sx.torch" or name.startswith("sx.torch."))


def imports_of(name, deferred):
    """The modules of the package that module `name` imports: at import time only
    (statements outside functions, class bodies included), or, with `deferred`, also those
    inside functions. `from P import x` names module P.x where there is one, else P."""
    path, is_package = MODULES[name]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = name if is_package else name.rpartition(".")[0]
    found = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not deferred:
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name in MODULES:
                        found.add(alias.name)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    source = ".".join(base + ([child.module] if child.module else []))
                else:
                    source = child.module
                for alias in child.names:
                    if f"{source}.{alias.name}" in MODULES:
                        found.add(f"{source}.{alias.name}")
                    elif source in MODULES:
                        found.add(source)
            visit(child)

    visit(tree)
    found.discard(name)
    return found


def find_cycle(graph):
    """A list of modules m0 -> m1 -> ... -> m0 if the graph has a cycle, else None."""
    state = {}  # name -> 1 while on the path, 2 when done
    path = []

    def walk(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = walk(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = walk(node)
            if cycle:
                return cycle
    return None


# Run in a fresh interpreter: imports the modules named in argv[1] (a JSON list) in that
# order. With argv[2] "bare", the packages' __init__ modules are not run first: each
# package is an empty module until the list names it, so that a module's own imports, and
# not the package's order of them, decide what is imported before it.
_IMPORTER = r"""
import importlib, importlib.util, json, os, sys
order, mode, root = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
packages = {}
if mode == "bare":
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "sx")):
        if "__init__.py" not in filenames:
            dirnames[:] = []
            continue
        name = ".".join(os.path.relpath(dirpath, root).split(os.sep))
        spec = importlib.util.spec_from_file_location(name, os.path.join(dirpath, "__init__.py"),
                                                      submodule_search_locations=[dirpath])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        packages[name] = (spec, module)
        if "." in name:
            parent, _, child = name.rpartition(".")
            setattr(sys.modules[parent], child, module)
for name in order:
    if name in packages:
        spec, module = packages.pop(name)
        spec.loader.exec_module(module)
    else:
        importlib.import_module(name)
"""


def run_imports(order, mode):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in sys.path if p]))
    done = subprocess.run([sys.executable, "-c", _IMPORTER, json.dumps(order), mode, ROOT],
                          capture_output=True, text=True, env=env, timeout=300)
    return done.returncode, done.stderr


class ImportTest(unittest.TestCase):
    def importable_modules(self):
        names = [n for n in MODULES if importable(n)]
        if not HAVE_TORCH:
            print(f"\n(torch is not installed: {len(MODULES) - len(names)} modules of sx.torch not imported)",
                  file=sys.stderr)
        return names

    def assert_imports(self, order, mode):
        code, stderr = run_imports(order, mode)
        self.assertEqual(code, 0, f"importing {order} ({mode}) in a fresh interpreter failed:\n{stderr}")

    def alone_modules(self):
        return [n for n in self.importable_modules() if n.startswith(os.environ.get("SX_IMPORT_TEST_ONLY", ""))]

    def test_each_module_alone(self):
        for name in self.alone_modules():
            with self.subTest(module=name):
                self.assert_imports([name], "plain")

    def test_each_module_alone_without_its_package_first(self):
        for name in self.alone_modules():
            with self.subTest(module=name):
                self.assert_imports([name], "bare")

    def test_modules_in_several_orders(self):
        names = self.importable_modules()
        orders = [sorted(names), sorted(names, reverse=True)]
        for seed in range(2):
            shuffled = list(names)
            random.Random(seed).shuffle(shuffled)
            orders.append(shuffled)
        for order in orders:
            for mode in ("plain", "bare"):
                with self.subTest(order=order, mode=mode):
                    self.assert_imports(order, mode)

    def test_no_import_cycle(self):
        self.assertIn("sx.group", MODULES)
        self.assertIn("sx.torch", MODULES)
        for deferred in (False, True):
            graph = {name: imports_of(name, deferred) for name in MODULES}
            cycle = find_cycle(graph)
            what = "imports inside functions included" if deferred else "at import time"
            self.assertIsNone(cycle, f"an import cycle ({what}): {' -> '.join(cycle or [])}")

    def test_the_cycle_check_finds_a_cycle(self):
        self.assertEqual(find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}), ["a", "b", "c", "a"])
        self.assertIsNone(find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}))


if __name__ == "__main__":
    unittest.main()

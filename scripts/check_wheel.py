"""Run by scripts/test.sh with the Python of a fresh venv into which a wheel of sx was
installed: imports sx with no environment variable, trains a step, and checks what the
wheel carries (every module of the source tree's package, sx.torch's included). With
--bundled (a wheel `auditwheel repair` made), the process must map no system copy of the
libraries libsx links (Gloo, libuv, ISA-L): each from the wheel's own
directory, as on a machine without Debian's packages; and the sxckpt the wheel carries
must resolve them there too. Also runs the commands the wheel installs (sxckpt,
sx-trace-summary) on a checkpoint and a trace of that step."""
import os
import subprocess
import sys
import tempfile

import sx

BUNDLED = ("libgloo", "libuv", "libisal")
SOURCE_PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bindings", "python", "sx")


def python_files(package):
    """The package's .py files, as paths relative to it (subpackages' included)."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        found.update(os.path.relpath(os.path.join(dirpath, n), package) for n in filenames if n.endswith(".py"))
    return found


def main():
    bundled = "--bundled" in sys.argv[1:]
    here = os.path.dirname(sx.__file__)
    assert os.path.exists(os.path.join(here, "libsx.so.1")), "libsx is not in the package"
    assert sx.version() == tuple(int(v) for v in sx.__version__.split(".")), (sx.version(), sx.__version__)
    missing = python_files(SOURCE_PACKAGE) - python_files(here)
    assert not missing, f"the wheel lacks modules of the source tree's package: {sorted(missing)}"
    work = tempfile.mkdtemp(prefix="sx-wheel-")
    trace = os.path.join(work, "trace.json")
    with sx.ShardGroup("local://wheel-check", 0, 1, backend="cpu", trace_path=trace) as g:
        g.add_param_group("sgd", lr=1.0)
        g.add_param("w", [3])
        g.finalize()
        g.grad_view("w")[...] = 2.0
        g.step()
        assert list(g.param_view("w")) == [-2.0] * 3
        g.save(os.path.join(work, "ckpt"), synchronous=True).wait()
    bindir = os.path.dirname(sys.executable)
    out = subprocess.run([os.path.join(bindir, "sxckpt"), "verify", os.path.join(work, "ckpt")],
                         capture_output=True, text=True)
    assert out.returncode == 0, f"sxckpt verify: {out.returncode} {out.stdout} {out.stderr}"
    out = subprocess.run([os.path.join(bindir, "sx-trace-summary"), os.path.join(work, "trace.rank0.json")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "events" in out.stdout, f"sx-trace-summary: {out.stdout} {out.stderr}"
    if bundled:
        libs = os.path.realpath(os.path.join(here, os.pardir, "sx_runtime.libs"))
        with open("/proc/self/maps") as f:
            mapped = {line.split()[-1] for line in f if "/" in line}
        for name in BUNDLED:
            paths = [p for p in mapped if os.path.basename(p).startswith(name)]
            assert paths, f"{name} is not mapped"
            outside = [p for p in paths if not os.path.realpath(p).startswith(libs + os.sep)]
            assert not outside, f"{name} mapped from outside the wheel: {outside}"
        ldd = subprocess.run(["ldd", os.path.join(here, "bin", "sxckpt")], capture_output=True, text=True).stdout
        for line in ldd.splitlines():
            if any(n in line for n in BUNDLED):
                where = os.path.realpath(line.split("=>")[1].split("(")[0].strip()) if "=>" in line else ""
                assert where.startswith(libs + os.sep), f"sxckpt resolves {line.strip()} outside the wheel"
    print("sx", sx.__version__, "imported from", here, "trained, saved; sxckpt and sx-trace-summary ran"
          + ("; Gloo, libuv and ISA-L from the wheel itself" if bundled else ""))


if __name__ == "__main__":
    main()

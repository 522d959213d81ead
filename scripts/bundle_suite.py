#!/usr/bin/env python3
"""The ctest suite's compiled programs, carried to another machine and run there
(scripts/gpu-test.sh: the CPU suite against a CUDA-enabled build on a machine with a GPU).

  bundle_suite.py list CTEST_JSON BUILD_DIR SOURCE_DIR > suite.json
      from `ctest --show-only=json-v1`: every test whose command is a program of
      BUILD_DIR (tests run through Python, Go, Rust or shell drivers are left out), with
      its arguments, environment, time limit and skip code; paths into BUILD_DIR and
      SOURCE_DIR become @BIN@ and @SRC@. Also the paths the build compiled into programs
      (the source tree, the build tree, python3 from CMakeCache.txt) and the programs
      that tests start by path (sxckpt).
  bundle_suite.py programs suite.json
      the programs' paths relative to BUILD_DIR, one per line.
  bundle_suite.py run suite.json BIN_DIR SOURCE_DIR LOG
      runs every test (several at a time, each under its time limit and in a directory of
      its own), with @BIN@ as BIN_DIR (a copy of BUILD_DIR's programs at their paths in
      it) and @SRC@ as SOURCE_DIR; prints "NAME: passed|skipped|FAILED (...)" per test and
      writes their output to LOG. Where a path compiled in on the build machine is missing
      here, it is made a link to this machine's (the source tree, the build tree as
      BIN_DIR, python3). Exits 1 if any failed.
"""
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile


def is_program(path, build):
    if not path.startswith(build + "/") or not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def list_suite(ctest_json, build, source):
    build, source = os.path.realpath(build), os.path.realpath(source)
    with open(ctest_json) as f:
        tests = json.load(f)["tests"]

    def rel(s):
        return s.replace(build, "@BIN@").replace(source, "@SRC@")

    suite = []
    for t in tests:
        cmd = t.get("command") or []
        if not cmd or not is_program(cmd[0], build):
            continue
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        labels = props.get("LABELS", [])
        if "gpu" in labels:
            continue  # run first, and under compute-sanitizer, by gpu-test.sh itself
        suite.append({
            "name": t["name"],
            "program": os.path.relpath(cmd[0], build),
            "args": [rel(a) for a in cmd[1:]],
            "env": [rel(e) for e in props.get("ENVIRONMENT", [])],
            "timeout": props.get("TIMEOUT", 1500),
            "skip_code": props.get("SKIP_RETURN_CODE"),
        })
    compiled_in = [source, build]
    cache = os.path.join(build, "CMakeCache.txt")
    if os.path.exists(cache):
        with open(cache) as f:
            for line in f:
                if line.startswith(("SX_PYTHON3:", "SX_TORCH_PYTHON:")):
                    compiled_in.append(line.split("=", 1)[1].strip())
    # Programs the tests start by their build path.
    started = [p for p in ["tools/sxckpt/sxckpt"] if os.path.exists(os.path.join(build, p))]
    json.dump({"source": source, "compiled_in": compiled_in, "started": started, "tests": suite}, sys.stdout,
              indent=1)


def link_compiled_in(suite, source, bin_dir):
    """The build machine's paths that programs carry, linked to this machine's."""
    targets = {suite["compiled_in"][0]: os.path.realpath(source), suite["compiled_in"][1]: bin_dir}
    python3 = shutil.which("python3")
    for p in suite["compiled_in"][2:]:
        if python3:
            targets[p] = python3
    for path, target in targets.items():
        if os.path.lexists(path) or path == target:
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if target == python3:
            # A script, not a link: a virtual environment's python finds its packages
            # from the path it was started by, which a link would change.
            with open(path, "w") as f:
                f.write(f'#!/bin/sh\nexec "{target}" "$@"\n')
            os.chmod(path, 0o755)
        else:
            os.symlink(target, path)
        print(f"linked {path} -> {target} (compiled in on the build machine)")


def run_suite(suite_json, bin_dir, source, log):
    with open(suite_json) as f:
        suite = json.load(f)
    bin_dir = os.path.realpath(bin_dir)
    link_compiled_in(suite, source, bin_dir)

    def sub(s):
        return s.replace("@BIN@", bin_dir).replace("@SRC@", os.path.realpath(source))

    def one(t):
        env = dict(os.environ)
        for e in t["env"]:
            k, v = sub(e).split("=", 1)
            env[k] = v
        cmd = [os.path.join(bin_dir, t["program"])] + [sub(a) for a in t["args"]]
        work = tempfile.mkdtemp(prefix="sx-" + t["name"] + "-")
        try:
            p = subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=t["timeout"])
            rc, text = p.returncode, p.stdout.decode(errors="replace")
        except subprocess.TimeoutExpired as e:
            rc, text = None, (e.stdout or b"").decode(errors="replace")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if rc == 0:
            verdict = "passed"
        elif rc is not None and rc == t["skip_code"]:
            verdict = "skipped"
        elif rc is None:
            verdict = f"FAILED (over its {t['timeout']:.0f}s limit)"
        else:
            verdict = f"FAILED (exit {rc})"
        return t["name"], verdict, text

    failed = 0
    jobs = max(1, min(8, (os.cpu_count() or 2) // 2))
    with open(log, "w") as out, concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for name, verdict, text in pool.map(one, suite["tests"]):
            out.write(f"== {name}: {verdict} ==\n{text}\n")
            print(f"{name}: {verdict}", flush=True)
            failed += verdict.startswith("FAILED")
    print(f"suite: {len(suite['tests']) - failed} of {len(suite['tests'])} passed or skipped")
    return 1 if failed else 0


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "list":
        list_suite(*sys.argv[2:])
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "programs":
        with open(sys.argv[2]) as f:
            suite = json.load(f)
            for p in [t["program"] for t in suite["tests"]] + suite["started"]:
                print(p)
        return 0
    if len(sys.argv) == 6 and sys.argv[1] == "run":
        return run_suite(*sys.argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

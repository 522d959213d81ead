#!/usr/bin/env bash
# The release rule of abi/check.sh (--compare-release) on dumps made from the newest
# pinned release by hand: a function added passes; a function removed, a field moved or a
# field removed fails, naming what broke.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
check="$here/../../abi/check.sh"
pinned=$(ls "$here"/../../abi/releases/libsx-*.abi.xml | sort -V | tail -n 1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# doctor NAME PYTHON-EXPRESSION-OVER-s: the pinned dump changed by one edit.
doctor() {
  python3 - "$pinned" "$tmp/$1.xml" "$2" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
t = eval(sys.argv[3], {"re": re, "s": s})
assert t != s, "the edit changed nothing"
open(sys.argv[2], "w").write(t)
PY
}
doctor no_version "re.sub(r'\s*<elf-symbol name=.sx_version.[^>]*/>', '', re.sub(r'\s*<function-decl name=.sx_version.*?</function-decl>', '', s, flags=re.S))"
doctor moved "s.replace(\"<data-member access='public' layout-offset-in-bits='64'>\", \"<data-member access='public' layout-offset-in-bits='96'>\", 1)"
doctor dropped "re.sub(r\"<data-member access='public' layout-offset-in-bits='64'>\s*<var-decl name='path'[^>]*/>\s*</data-member>\", '', s, count=1)"

expect() {  # expect pass|fail OLD NEW TEXT
  local out rc
  set +e
  out=$("$check" --compare-release "$2" "$3" 2>&1)
  rc=$?
  set -e
  if [ "$1" = pass ] && [ $rc -ne 0 ]; then echo "FAIL: $3 against $2 was refused: $out"; exit 1; fi
  if [ "$1" = fail ] && [ $rc -eq 0 ]; then echo "FAIL: $3 against $2 passed"; exit 1; fi
  if ! grep -qF -- "$4" <<<"$out"; then echo "FAIL: '$4' not in: $out"; exit 1; fi
  echo "ok   $1: $(basename "$3") against $(basename "$2")"
}
expect pass "$pinned" "$pinned" "compatible with"
expect pass "$tmp/no_version.xml" "$pinned" "compatible with"  # sx_version added
expect fail "$pinned" "$tmp/no_version.xml" "Removed function"
expect fail "$pinned" "$tmp/moved.xml" "'const char* path' offset changed from 64 to 96"
expect fail "$pinned" "$tmp/dropped.xml" "data member deletion"

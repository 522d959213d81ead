#!/usr/bin/env bash
# The ABI gate. Usage: abi/check.sh path/to/libsx.so [--update]
#
# Fails if libsx.so exports anything but sx_* functions, lacks debug info (a library
# without .debug_info dumps as symbols only and compares clean, hiding every type
# change), or if its ABI differs from the committed baseline abi/libsx.abi.xml, or if it
# breaks the ABI of the newest release (abi/releases/).
# The baseline and the current dump are made by the same abidw command with the same
# flags and compared XML against XML (comparing a baseline straight against a .so,
# or dumps made with different flags, has let a field inserted mid-struct through).
# --update rewrites the baseline (for a deliberate, reviewed ABI change).
# --compare-release OLD.xml NEW.xml applies the release rule (below) to two dumps.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "ABI check FAILED: $*" >&2; exit 1; }

# Every release of this major stays callable: against the newest release's pinned dump
# (abi/releases/libsx-X.Y.Z.abi.xml, never rewritten), or OLD, a dump NEW may add
# functions and append fields to versioned structs, nothing else. abidiff sets bit 8 of
# its exit code for an incompatible change (a function removed); a field moved, removed
# or retyped is a sub-type change it reports without that bit, so its report is read for
# those too.
release_compatible() {
  local new=$1 old=${2:-} report rc broken
  [ -n "$old" ] || old=$(ls "$here"/releases/libsx-*.abi.xml 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$old" ] || fail "no pinned release dump under $here/releases"
  set +e
  report=$(abidiff "$old" "$new" 2>&1)
  rc=$?
  set -e
  if [ $((rc & 3)) -ne 0 ]; then
    echo "$report" >&2
    fail "abidiff could not compare against $(basename "$old") (exit $rc)"
  fi
  broken=$(echo "$report" | grep -E "Removed functions?:|offset changed|data members? deletion|type of '.*' changed|name of '.*' changed" || true)
  if [ $((rc & 8)) -ne 0 ] || [ -n "$broken" ]; then
    echo "$report" >&2
    fail "the ABI breaks release $(basename "$old" .abi.xml | sed 's/^libsx-//'): ${broken:-an incompatible change}"
  fi
  released=$(basename "$old" .abi.xml | sed 's/^libsx-//')
}

# abi/check.sh --compare-release OLD.xml NEW.xml: the release rule alone, on two dumps.
if [ "${1:-}" = "--compare-release" ]; then
  release_compatible "${3:?usage: abi/check.sh --compare-release OLD.xml NEW.xml}" "$2"
  echo "compatible with $released"
  exit 0
fi
lib=${1:?usage: abi/check.sh path/to/libsx.so [--update]}
baseline="$here/libsx.abi.xml"

# grep without -q reads all of readelf's output: with -q it may exit first, and under
# pipefail readelf's SIGPIPE (exit 141) would fail the check on a library that has it.
readelf -S --wide "$lib" | grep '\.debug_info' >/dev/null ||
  fail "$lib has no .debug_info; build it with -g (RelWithDebInfo) so types can be compared"

# Exported symbols: defined, dynamic, global; ignore the version node (type A).
bad=$(nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}' | sed 's/@.*//' | grep -v '^sx_' || true)
[ -z "$bad" ] || fail "exported symbols not named sx_*: $(echo $bad | head -c 500)"
nsyms=$(nm -D --defined-only "$lib" | awk '$2 == "T"' | wc -l)
[ "$nsyms" -gt 0 ] || fail "$lib exports no functions"

dump() {
  abidw --exported-interfaces-only --headers-dir "$here/../include/sx" --no-corpus-path \
        --no-comp-dir-path --no-show-locs --drop-private-types --type-id-style hash --drop-undefined-syms "$1"
}
current=$(mktemp)
trap 'rm -f "$current"' EXIT
dump "$lib" > "$current"
grep -q '<function-decl name=.sx_create_shard_group' "$current" ||
  fail "the dump of $lib has no sx_create_shard_group declaration (no types were read)"

if [ "${2:-}" = "--update" ]; then
  cp "$current" "$baseline"
  echo "ABI baseline updated: $baseline"
  exit 0
fi
[ -f "$baseline" ] || fail "no baseline at $baseline (run abi/check.sh $lib --update once)"
set +e
report=$(abidiff "$baseline" "$current" 2>&1)
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "$report" >&2
  fail "libsx's ABI differs from abi/libsx.abi.xml (abidiff exit $rc); if the change is deliberate and compatible, run abi/check.sh $lib --update and commit the baseline"
fi

release_compatible "$current"
echo "ABI check passed: $nsyms exported sx_* functions, no change against abi/libsx.abi.xml, compatible with release $released"

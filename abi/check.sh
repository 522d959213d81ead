#!/usr/bin/env bash
# The ABI gate. Usage: abi/check.sh path/to/libsx.so [--update]
#
# Fails if libsx.so exports anything but sx_* functions, lacks debug info (a library
# without .debug_info dumps as symbols only and compares clean, hiding every type
# change), or if its ABI differs from the committed baseline abi/libsx.abi.xml.
# The baseline and the current dump are made by the same abidw command with the same
# flags and compared XML against XML (comparing a baseline straight against a .so,
# or dumps made with different flags, has let a field inserted mid-struct through).
# --update rewrites the baseline (for a deliberate, reviewed ABI change).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lib=${1:?usage: abi/check.sh path/to/libsx.so [--update]}
baseline="$here/libsx.abi.xml"
fail() { echo "ABI check FAILED: $*" >&2; exit 1; }

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
echo "ABI check passed: $nsyms exported sx_* functions, no change against abi/libsx.abi.xml"

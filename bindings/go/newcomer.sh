#!/bin/sh
# The first program of README.md ("A first program"), built as a new user builds it: its
# go.mod and main.go are taken from the README (the blocks after the
# `<!-- newcomer-test: ... -->` markers, so that this fails when the README drifts) into a
# new module in a temporary directory outside the tree, and its run command is run there
# with /path/to/sx replaced by this tree, in an environment of nothing but PATH and where
# go keeps its caches: no PKG_CONFIG_PATH but the README's, no CGO_* flags, no
# LD_LIBRARY_PATH, no GOFLAGS. GOPROXY=off only proves that nothing is fetched.
# usage: newcomer.sh GO SOURCE_DIR BUILD_DIR GOCACHE
set -eu
go=$1 src=$2 build=$3 cache=$4
readme="$src/bindings/go/README.md"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sx-go-newcomer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The fenced block after the marker line `<!-- newcomer-test: $1 -->`, with /path/to/sx/build
# and /path/to/sx made this build's and this tree's.
block() {
  awk -v m="<!-- newcomer-test: $1 -->" '
    $0 == m { found = 1; next }
    found == 1 && /^```/ { found = 2; next }
    found == 2 && /^```$/ { exit }
    found == 2 { print }' "$readme" |
    sed -e "s|/path/to/sx/build|$build|g" -e "s|/path/to/sx|$src|g"
}
mkdir "$tmp/trainer"
for part in go.mod main.go run; do
  block "$part" > "$tmp/trainer/$part"
  [ -s "$tmp/trainer/$part" ] || { echo "newcomer: README.md has no block marked '$part'" >&2; exit 1; }
done
echo "newcomer: in $tmp/trainer, from README.md:"
cat "$tmp/trainer/go.mod" "$tmp/trainer/run"
cd "$tmp/trainer"
out=$(env -i PATH="$(dirname "$go"):/usr/local/bin:/usr/bin:/bin" HOME="$tmp" GOCACHE="$cache" \
  GOPATH="$tmp/gopath" GOPROXY=off sh -eu ./run 2>&1) || {
  echo "$out" >&2
  echo "newcomer: the README's first program failed" >&2
  exit 1
}
echo "$out"
case $out in
  *"saved step-300"*) echo "newcomer: the README's first program built and ran" ;;
  *) echo "newcomer: the README's first program did not say 'saved step-300'" >&2; exit 1 ;;
esac

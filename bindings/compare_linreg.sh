#!/bin/sh
# Runs a binding's train_linreg beside the C reference and fails unless every line
# matches (samples/LINREG.md: same steps, same loss bits), for a fresh run and for a
# run resumed from a checkpoint the other one wrote.
# usage: compare_linreg.sh C_REFERENCE SAMPLE
set -eu
ref=$1 sample=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$ref" --steps 6 --save "$tmp/ref" | grep '^step' > "$tmp/ref.out"
"$sample" --steps 6 --save "$tmp/sample" | grep '^step' > "$tmp/sample.out"
diff "$tmp/ref.out" "$tmp/sample.out"
"$ref" --steps 3 --load "$tmp/sample" > "$tmp/ref2.out"
"$sample" --steps 3 --load "$tmp/ref" > "$tmp/sample2.out"
diff "$tmp/ref2.out" "$tmp/sample2.out"
test "$(wc -l < "$tmp/ref2.out")" -eq 3
echo "$sample matches $ref bit for bit, fresh and resumed from each other's checkpoints"

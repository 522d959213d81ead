#!/bin/sh
# (c) of train_tp_mlp: the model trained at TP=2 x DP=2 resumes at TP=1 x DP=2 (the
# unsharded model in one group of 2 processes) from the checkpoint `sxckpt join` makes of
# the two slices' checkpoints of step 10, and ends equal to the uninterrupted run.
# usage: tp_mlp_resume_joined.sh TRAIN_TP_MLP SXCKPT
set -eu
sample=$1
sxckpt=$2
dir=$(mktemp -d /tmp/sx-tp-mlp-joined-XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$sample" --dir "$dir"
"$sxckpt" join "$dir/joined" "$dir/ckpt/tp0/step-10" "$dir/ckpt/tp1/step-10"
out=$("$sample" --dir "$dir" --resume-joined "$dir/joined")
printf '%s\n' "$out"
printf '%s\n' "$out" | grep -q '^(c) resumed at TP=1 x DP=2 .*: equal)$'

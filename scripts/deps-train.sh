#!/bin/sh
# Installs what `make train-model` (bench/train) needs on Debian 12, and nothing else needs:
# CPU torch, numpy, SentencePiece, the King James Bible (the corpus) and OpenBLAS, without
# which Debian's torch multiplies through the reference BLAS about ten times slower.
set -eu
PKGS="python3-torch python3-numpy python3-sentencepiece bible-kjv bible-kjv-text libopenblas0-pthread"
. "$(dirname "$0")/apt-install.sh"
# shellcheck disable=SC2086 # one word per package
apt_install deps-train.sh $PKGS

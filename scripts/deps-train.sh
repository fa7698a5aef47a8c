#!/bin/sh
# Installs what `make train-model` (bench/train) needs on Debian 12, and nothing else needs:
# CPU torch, numpy, SentencePiece, the King James Bible (the corpus) and OpenBLAS, without
# which Debian's torch multiplies through the reference BLAS about ten times slower.
set -eu
PKGS="python3-torch python3-numpy python3-sentencepiece bible-kjv bible-kjv-text libopenblas0-pthread"
SUDO=""
if [ "$(id -u)" != 0 ]; then
	command -v sudo >/dev/null 2>&1 || { echo "deps-train.sh: not root and no sudo: install $PKGS yourself" >&2; exit 1; }
	SUDO=sudo
fi
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "deps-train.sh: installing:$missing"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

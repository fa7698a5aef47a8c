#!/bin/sh
# Builds hearth in the source tree (autoreconf, configure, make) unless it is already built
# and up to date; make itself decides what to rebuild.
set -eu
cd "$(dirname "$0")/.."
[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure -q
make -s -j"$(nproc)"

#!/bin/sh
# The README's test command: installs dependencies, builds, and runs the whole test suite
# (make check). Exits non-zero when any test fails.
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
sh scripts/build.sh
make -s -j"$(nproc)" check

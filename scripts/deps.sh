#!/bin/sh
# Installs what building and testing hearth needs on Debian 12 (the one list of packages;
# the README's commands and .ci/run both come through here).
set -eu
PKGS="build-essential autoconf automake libtool pkg-config \
libuv1-dev libmsgpack-dev libnuma-dev libsystemd-dev libcmocka-dev \
libjansson-dev libedit-dev libmicrohttpd-dev \
systemd valgrind python3 python3-jsonschema python3-msgpack python3-pytest tmux \
clang libclang-rt-14-dev nodejs"
SUDO=""
if [ "$(id -u)" != 0 ]; then
	command -v sudo >/dev/null 2>&1 || { echo "deps.sh: not root and no sudo: install $PKGS yourself" >&2; exit 1; }
	SUDO=sudo
fi
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "deps.sh: installing:$missing"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# npm ships inside some nodejs builds and as its own Debian package beside Debian's nodejs.
if ! command -v npm >/dev/null 2>&1; then
	echo "deps.sh: installing: npm"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
# The official OpenAI SDK, pinned in tests/openai/package-lock.json: the gateway's test client.
here=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -d "$here/tests/openai/node_modules/openai" ]; then
	echo "deps.sh: installing the pinned OpenAI SDK into tests/openai"
	(cd "$here/tests/openai" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

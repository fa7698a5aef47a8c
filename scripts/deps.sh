#!/bin/sh
# Installs what building and testing hearth needs on Debian 12 (the one list of packages;
# the README's commands and .ci/run both come through here).
set -eu
PKGS="build-essential autoconf automake libtool pkg-config \
libuv1-dev libmsgpack-dev libnuma-dev libsystemd-dev libcmocka-dev \
libjansson-dev libedit-dev libmicrohttpd-dev \
systemd valgrind python3 python3-jsonschema python3-msgpack python3-pytest tmux \
clang libclang-rt-14-dev nodejs"
. "$(dirname "$0")/apt-install.sh"
# shellcheck disable=SC2086 # one word per package
apt_install deps.sh $PKGS
# npm ships inside some nodejs builds and as its own Debian package beside Debian's nodejs.
command -v npm >/dev/null 2>&1 || apt_install deps.sh npm
# The official OpenAI SDK, pinned in tests/openai/package-lock.json: the gateway's test client.
here=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -d "$here/tests/openai/node_modules/openai" ]; then
	echo "deps.sh: installing the pinned OpenAI SDK into tests/openai"
	(cd "$here/tests/openai" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

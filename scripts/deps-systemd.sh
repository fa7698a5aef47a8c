#!/bin/sh
# Installs what `make check-systemd` (hearth under a real systemd as PID 1, in a Debian 12
# root booted by systemd-nspawn) needs on Debian 12 beyond scripts/deps.sh.
set -eu
. "$(dirname "$0")/apt-install.sh"
apt_install deps-systemd.sh debootstrap systemd-container

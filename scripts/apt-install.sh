# Sourced by the deps-*.sh scripts: apt_install WHO PACKAGE... installs the Debian packages of
# the list that are not installed yet (as root, or through sudo), and says which.
apt_install() {
	who=$1
	shift
	sudo=""
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null 2>&1 || { echo "$who: not root and no sudo: install $* yourself" >&2; exit 1; }
		sudo=sudo
	fi
	missing=""
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
	done
	[ -n "$missing" ] || return 0
	echo "$who: installing:$missing"
	$sudo apt-get update -qq
	# shellcheck disable=SC2086 # one word per package
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

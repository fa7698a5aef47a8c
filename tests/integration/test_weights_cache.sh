#!/bin/sh
# hearthd's weights_cache through real processes: the first start repacks and keeps the
# packed matrices, a later one reads them and serves the same tokens; a damaged, cut or
# foreign file is named, repacked over and written again; other settings or a changed model
# file repack; a dead daemon's part goes; off, or a cache that cannot be written, still
# serves. TAP.
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_weights_cache.XXXXXX") || exit 1
HPID=
trap '[ -n "$HPID" ] && kill $HPID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
B=$HEARTH_BUILDDIR
SOCK=$TMP/h.sock
FX=$HEARTH_SHARED/fixtures
. "$HEARTH_SRCDIR/tests/integration/spec_lib.sh"

echo "1..8"
mkdir -p "$TMP/wc"
cp "$FX/fx-llama.gguf" "$TMP/model.gguf"
RUN="--model=$TMP/model.gguf --max-context=256 --kv-budget=4MiB --log-level=info"
kept() { # the cache's packed-weights files
	ls "$TMP/wc" 2>/dev/null | grep '\.weights$'
}
said() { # LOG WORDS: the log has WORDS (grep -E), else the log goes to TAP's comments
	grep -Eq -- "$2" "$TMP/$1" || { sed 's/^/# /' "$TMP/$1"; false; }
}

# First start: repacked, the file kept under the model's name and identity, serving.
start first.log $RUN -o weights_cache="$TMP/wc"
gen "$TMP/out1" "hello hello" --temp 0
f=$(kept)
[ -s "$TMP/out1" ] && [ "$(kept | wc -l)" = 1 ] &&
	case $f in model-????????????????.weights) true ;; *) false ;; esac &&
	said first.log "weights: [0-9.]+ MiB of packed matrices kept in $TMP/wc/$f for the next start"
check $? "weights_cache: the first start repacks, keeps the packed matrices as <model>-<hash>.weights and serves"
stop

# Second start: read, nothing repacked, the same tokens.
cp "$TMP/wc/$f" "$TMP/good"
start second.log $RUN -o weights_cache="$TMP/wc"
gen "$TMP/out2" "hello hello" --temp 0
[ -s "$TMP/out2" ] && cmp -s "$TMP/out1" "$TMP/out2" &&
	said second.log "weights: [0-9.]+ MiB of packed matrices read from $TMP/wc/$f, nothing repacked" &&
	! grep -q "kept in" "$TMP/second.log" && cmp -s "$TMP/good" "$TMP/wc/$f"
check $? "weights_cache: a later start reads the file, repacks nothing and serves the same tokens"
stop

# One byte of the payload flipped: the checksum names it, the model is repacked and
# served the same, the file written again (the same bytes as before); a dead daemon's part
# (a pid that is gone) is removed.
size=$(stat -c %s "$TMP/good")
printf '\377' | dd of="$TMP/wc/$f" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
cmp -s "$TMP/good" "$TMP/wc/$f" && echo "# the byte was not flipped"
: >"$TMP/wc/$f.999999.part"
start damaged.log $RUN -o weights_cache="$TMP/wc"
gen "$TMP/out3" "hello hello" --temp 0
cmp -s "$TMP/out1" "$TMP/out3" && cmp -s "$TMP/good" "$TMP/wc/$f" && [ ! -e "$TMP/wc/$f.999999.part" ] &&
	said damaged.log "notice: weights cache $TMP/wc/$f: its contents do not match their checksum; repacked" &&
	said damaged.log "kept in $TMP/wc/$f"
check $? "weights_cache: a damaged file is named, repacked over and written again; a dead daemon's part is removed"
stop

# Cut short: its size disagrees with its header, before a byte of it is used.
head -c $((size - 100)) "$TMP/good" >"$TMP/wc/$f"
start cut.log $RUN -o weights_cache="$TMP/wc"
gen "$TMP/out4" "hello hello" --temp 0
cmp -s "$TMP/out1" "$TMP/out4" && cmp -s "$TMP/good" "$TMP/wc/$f" &&
	said cut.log "weights cache $TMP/wc/$f: $((size - 100)) bytes where its header says $size; repacked"
check $? "weights_cache: a file cut short is refused by its size, repacked over and written again"
stop

# Other settings (weights_group 128): the file's key refuses it; repacked for them and kept
# instead (one file per model file), and back again.
start g128.log $RUN -o weights_cache="$TMP/wc" -o weights_group=128
gen "$TMP/out5" "hello hello" --temp 0
q128=$(quant)
stop
start g64.log $RUN -o weights_cache="$TMP/wc"
gen "$TMP/out6" "hello hello" --temp 0
[ -s "$TMP/out5" ] && cmp -s "$TMP/out1" "$TMP/out6" && [ "$(kept | wc -l)" = 1 ] && cmp -s "$TMP/good" "$TMP/wc/$f" &&
	[ "$q128" != "$(quant)" ] &&
	said g128.log "weights cache $TMP/wc/$f: made for another model file, imatrix, layout or hearthd version; repacked" &&
	said g64.log "made for another model file, imatrix, layout or hearthd version; repacked"
check $? "weights_cache: other settings repack and keep their own file in its place, and the first settings theirs again"
stop

# The model file changes (its modification time): a file of its own, the old one removed.
touch -d "2001-01-01" "$TMP/model.gguf"
start changed.log $RUN -o weights_cache="$TMP/wc"
gen "$TMP/out7" "hello hello" --temp 0
g=$(kept)
cmp -s "$TMP/out1" "$TMP/out7" && [ "$(kept | wc -l)" = 1 ] && [ "$g" != "$f" ] && said changed.log "kept in $TMP/wc/$g"
check $? "weights_cache: a changed model file gets a file of its own and its old one is removed"
stop

# systemd's CACHE_DIRECTORY when weights_cache is unset; off keeps nothing even then (and
# imatrix = auto rounds plainly then: test_imatrix_self.sh).
mkdir -p "$TMP/sd"
CACHE_DIRECTORY="$TMP/sd" start sd.log $RUN -o imatrix=none
gen "$TMP/out8" "hello hello" --temp 0
stop
mkdir -p "$TMP/sdoff"
CACHE_DIRECTORY="$TMP/sdoff" start off.log $RUN -o weights_cache=off
gen "$TMP/out9" "hello hello" --temp 0
cmp -s "$TMP/out1" "$TMP/out8" && cmp -s "$TMP/out1" "$TMP/out9" && [ "$(ls "$TMP/sd" | grep -c '\.weights$')" = 1 ] &&
	[ -z "$(ls "$TMP/sdoff")" ] && ! grep -q "packed matrices" "$TMP/off.log"
check $? "weights_cache: systemd's CACHE_DIRECTORY is the cache when it is unset; off keeps nothing"
stop

# A cache that cannot be written (a file stands in its path): named, served.
: >"$TMP/notadir"
start unwritable.log $RUN -o weights_cache="$TMP/notadir/wc"
gen "$TMP/out10" "hello hello" --temp 0
cmp -s "$TMP/out1" "$TMP/out10" &&
	said unwritable.log "warning: weights cache $TMP/notadir/wc/.*: Not a directory; the packed weights are not kept"
check $? "weights_cache: a cache that cannot be written is named and the model still serves"
stop
exit $((fails > 0))

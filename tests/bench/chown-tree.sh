#!/bin/sh
# chown -R of an image-like tree through each overlay: the wall time of
# the chown and of the sync after it, and what the upper layer holds
# afterwards (allocated bytes, du -s --block-size=1; and the growth of the
# filesystem's used bytes, df). Run as root:
#
#   GOVERLAY=./goverlay tests/bench/chown-tree.sh [DIR]
#
# FILES files of KIB KiB of random data (default 10,000 of 100 KiB: 1 GB)
# in 100 directories make the lower layer, built once under DIR (default a
# fresh directory in /tmp). Page caches are dropped before each run.
set -eu
GOVERLAY=${GOVERLAY:-goverlay}
FUSE_OVERLAYFS=${FUSE_OVERLAYFS:-fuse-overlayfs}
FILES=${FILES:-10000}
KIB=${KIB:-100}
DIR=${1:-$(mktemp -d /tmp/chown-tree.XXXXXX)}
mkdir -p "$DIR"
cd "$DIR"

if [ ! -e lower.done ]; then
	rm -rf lower
	mkdir -p lower/t
	i=0
	while [ $i -lt 100 ]; do
		mkdir lower/t/d$i
		head -c $((FILES / 100 * KIB * 1024)) /dev/urandom | split -b $((KIB * 1024)) -d -a 4 - lower/t/d$i/f
		i=$((i + 1))
	done
	touch lower.done
fi

used() { df -B1 --output=used . | tail -1; }

# run NAME MOUNT-COMMAND...: the command mounts lower, upper, work on mnt.
run() {
	name=$1
	shift
	rm -rf upper work mnt
	mkdir upper work mnt
	"$@"
	sync
	echo 3 >/proc/sys/vm/drop_caches
	before=$(used)
	t0=$(date +%s.%N)
	chown -R 1000:1000 mnt/t
	t1=$(date +%s.%N)
	sync
	t2=$(date +%s.%N)
	umount mnt
	after=$(used)
	printf '%-40s chown %6.2f s  +sync %6.2f s  upper %13s bytes  df +%13s bytes\n' "$name" \
		"$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t0" | bc)" \
		"$(du -s --block-size=1 upper | cut -f1)" "$((after - before))"
}

kernel() { mount -t overlay overlay -o "lowerdir=lower,upperdir=upper,workdir=work,index=off,xino=off$1" mnt; }
run "kernel overlay" kernel ",redirect_dir=off,metacopy=off"
run "kernel overlay redirect_dir=on,metacopy=on" kernel ",redirect_dir=on,metacopy=on"
run "goverlay" "$GOVERLAY" -o lowerdir=lower,upperdir=upper,workdir=work mnt
run "goverlay metacopy=on" "$GOVERLAY" -o lowerdir=lower,upperdir=upper,workdir=work,metacopy=on mnt
run "fuse-overlayfs" "$FUSE_OVERLAYFS" -o lowerdir=lower,upperdir=upper,workdir=work mnt
rm -rf upper work mnt

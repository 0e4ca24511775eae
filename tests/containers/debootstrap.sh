#!/usr/bin/env bash
# Manual podman check on a real Debian image (too slow for CI: debootstrap
# alone takes about a minute). As root, from anywhere in the checkout:
#
#   bash tests/containers/debootstrap.sh            # goverlay and fuse-overlayfs
#   PROGS=goverlay bash tests/containers/debootstrap.sh
#
# Builds goverlay (or takes GOVERLAY=/path/to/goverlay), makes a
# `debootstrap --variant=minbase bookworm` image with hello_*.deb (from
# `apt-get download hello` on the host) in /debs, and for each mount program
# runs on a scratch podman store: dpkg -i and the installed program, real
# file work in a kept container, podman start -a of it, podman commit and a
# run of the committed image, dpkg -r. Prints each step's output, then a
# diff of goverlay's outputs against fuse-overlayfs's. Everything lives in
# one temporary folder, reset and removed at the end (also on failure).
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export PATH=/usr/local/go/bin:$PATH DEBIAN_FRONTEND=noninteractive
PROGS=${PROGS:-"fuse-overlayfs goverlay"}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

need=(debootstrap podman runc fuse-overlayfs fuse3)
missing=()
for p in "${need[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
	apt-get update -qq
	apt-get install -y -qq "${missing[@]}" >/dev/null
fi

work=$(mktemp -d /tmp/gvd.XXXXXX) # short: podman refuses a runroot over 50 characters
stores=()

pflags() { # the scratch store's flags for mount program $1
	local s=$work/s-$(basename "$1")
	echo "--root $s/storage --runroot $s/run --tmpdir $s/tmp --network-config-dir $s/net" \
		"--storage-driver overlay --storage-opt overlay.mount_program=$1" \
		"--cgroup-manager=cgroupfs --events-backend=file"
}

since() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN{printf "%.2f", e-s}'; }

cleanup() {
	set +e
	for prog in "${stores[@]}"; do
		# shellcheck disable=SC2046
		podman $(pflags "$prog") system reset --force >/dev/null 2>&1
	done
	# Lazy-unmount whatever is left under the work folder, deepest first.
	awk -v w="$work" '$5 ~ "^"w {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
		echo "left mounted (detaching): $m" >&2
		umount -l "$m"
	done
	for p in $(pgrep -f -- "$work/" || true); do
		echo "left running (killing): $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null)" >&2
		kill -9 "$p" 2>/dev/null
	done
	rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
EOF
export CONTAINERS_CONF=$work/containers.conf

if [ -n "${GOVERLAY:-}" ]; then
	gobin=$(readlink -f "$GOVERLAY")
else
	gobin=$work/bin/goverlay
	(cd "$root" && go build -o "$gobin" ./cmd/goverlay)
fi

echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -sr), $(nproc) vCPU, podman $(podman --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}'), fuse-overlayfs $(dpkg-query -W -f='${Version}' fuse-overlayfs), goverlay $(cd "$root" && git rev-parse --short HEAD)$(cd "$root" && git diff --quiet HEAD -- . 2>/dev/null || echo +changes)"

t0=$(date +%s.%N)
debootstrap --variant=minbase "$SUITE" "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
	{ tail -20 "$work/debootstrap.log"; exit 1; }
mkdir -p "$work/rootfs/debs"
(cd "$work/rootfs/debs" && apt-get download -q hello >/dev/null 2>&1)
printf '== debootstrap --variant=minbase %s: %s s, %s packages, %s\n' "$SUITE" \
	"$(since "$t0")" "$(chroot "$work/rootfs" dpkg-query -W | wc -l)" \
	"$(du -sh "$work/rootfs" | cut -f1)"

# Real work in a kept container; list.sh prints what it left.
cat >"$work/rootfs/work.sh" <<'EOF'
#!/bin/sh
set -e
if [ ! -e /root/ran ]; then
	echo "first run"
	dpkg -i /debs/hello_*.deb >/dev/null
	hello
	echo appended >> /etc/debian_version
	rm /etc/issue.net
	rm -r /usr/share/doc/apt
	chmod 600 /etc/shells
	chown 1234:5678 /etc/motd
	mv /etc/issue /etc/issue.moved
	mv /usr/share/doc/bash /usr/share/doc/bash.moved
	ln /etc/shells /etc/shells.link
	dd if=/dev/urandom of=/root/big bs=1M count=100 status=none
	md5sum /root/big | cut -d' ' -f1 > /root/big.md5
	touch /root/ran
else
	echo "next run"
	echo again >> /etc/debian_version
fi
sh /list.sh
EOF
cat >"$work/rootfs/list.sh" <<'EOF'
#!/bin/sh
cat /etc/debian_version
stat -c '%n %a %u:%g %h' /etc/motd /etc/shells /etc/shells.link /etc/issue.moved /usr/share/doc/bash.moved
for p in /etc/issue.net /usr/share/doc/apt /etc/issue /usr/share/doc/bash; do [ -e $p ] && echo "$p still there" || echo "$p gone"; done
[ "$(md5sum /root/big | cut -d' ' -f1)" = "$(cat /root/big.md5)" ] && echo "100 MB file intact"
dpkg -s hello | grep Status
hello
EOF

for name in $PROGS; do
	case $name in
	goverlay) prog=$gobin ;;
	fuse-overlayfs) prog=/usr/bin/fuse-overlayfs ;;
	*) echo "unknown program $name" >&2; exit 1 ;;
	esac
	stores+=("$prog")
	P="podman $(pflags "$prog")"
	R="run --runtime runc --network=none"
	out=$work/out-$name
	mkdir -p "$out"
	step() { # step NAME CMD...: runs CMD, keeps and prints its output and time
		local n=$1; shift
		local s; s=$(date +%s.%N)
		local rc=0
		"$@" >"$out/$n" 2>&1 || rc=$?
		printf -- '-- %s [%s]: exit %d, %s s\n' "$name" "$n" "$rc" "$(since "$s")"
		sed 's/^/   /' "$out/$n"
	}
	echo "=== mount_program: $name ($prog)"
	step import sh -c "tar -C '$work/rootfs' -c . | $P import -q - deb:min"
	# shellcheck disable=SC2086
	step dpkg-rm $P $R --rm deb:min sh -c 'dpkg -i /debs/hello_*.deb >/dev/null && hello && dpkg -r hello >/dev/null && dpkg -s hello 2>&1 | head -1'
	# shellcheck disable=SC2086
	step first-run $P $R --name work deb:min sh /work.sh
	# shellcheck disable=SC2086
	step start-a $P start -a work
	# shellcheck disable=SC2086
	step commit $P commit -q work deb:committed
	# shellcheck disable=SC2086
	step committed $P $R --rm deb:committed sh /list.sh
	# shellcheck disable=SC2086
	step find $P $R --rm deb:min sh -c 'find / -xdev | wc -l'
	# shellcheck disable=SC2086
	step rm $P rm work
	sed -i 's/^sha256:.*/<image id>/; /^[0-9a-f]\{64\}$/d' "$out"/import "$out"/commit
	if pgrep -af -- "$work/s-$(basename "$prog")/" | grep -v pgrep; then
		echo "!! $name: processes still serving the store after podman rm"
	fi
done

if [ -d "$work/out-goverlay" ] && [ -d "$work/out-fuse-overlayfs" ]; then
	echo "=== diff of the outputs (fuse-overlayfs → goverlay)"
	if diff -r "$work/out-fuse-overlayfs" "$work/out-goverlay"; then
		echo "identical"
	fi
fi

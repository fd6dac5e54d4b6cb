#!/bin/bash
# Boots a throw-away container with systemd as PID 1, per shared/HARNESS.md
# "System mode". Must be started under `unshare --mount --propagation private`.
# Usage: nspawn.sh DIR NAME MACHINE [ROOT]. NAME names the cgroup subtree,
# MACHINE is the container's hostname. DIR/share is /run/harness inside,
# DIR/bin is /usr/local/bin inside (read-only). ROOT is the root file system:
#   volatile (default): a fresh tmpfs with the host's /usr read-only; /etc
#     and /var start empty.
#   debian: as volatile, and /usr, /etc and /var are copy-on-write overlays
#     of the host's (upper layers on a tmpfs at DIR/upper), so dpkg and
#     apt work on the host's package database and configuration without
#     touching them; /etc/systemd/system is an empty tmpfs, so none of the
#     host's enabled services boots.
# Prints "ready LEADER" once the container's systemd reports running (or
# degraded), then holds until stdin reaches EOF and powers the container off.
set -u
DIR=$1
NAME=$2
MACHINE=$3
ROOT=${4:-volatile}
CG="systemd-harness-$$-$NAME"

# shellcheck source=cgroup.sh
source "$(dirname "$0")/cgroup.sh"
sweep_stale

for h in $CGS; do
	mkdir -p "$h/$CG/nspawn" || { echo "error: cannot create cgroup $h/$CG" >&2; exit 1; }
done

# nspawn keeps state below /run/systemd (propagation dirs, unix-export);
# a private tmpfs keeps that out of the host's /run.
mount -t tmpfs -o mode=0755 tmpfs /run/systemd || exit 1
mkdir -p "$DIR/share" "$DIR/bin"

# Generators only slow daemon-reload down (~0.65 s → ~0.2 s) in a container
# with an empty /etc: mask every one of them.
masks=()
for g in /usr/lib/systemd/system-generators/*; do
	[ -e "$g" ] && masks+=("--bind-ro=/dev/null:/etc/systemd/system-generators/${g##*/}")
done

root=()
boot=(systemd.firstboot=off)
case $ROOT in
volatile) ;;
debian)
	# nspawn refuses -D / with --volatile=overlay: the same, one tree at a
	# time. The upper layers are on a tmpfs of this mount namespace (not in
	# the host's /var/tmp, where nspawn puts them for an empty upper path):
	# no disk writes (dpkg fsyncs every file), and gone with the namespace.
	mkdir -p "$DIR/upper" && mount -t tmpfs -o mode=0700 tmpfs "$DIR/upper" || exit 1
	for d in usr etc var; do
		mkdir "$DIR/upper/$d" || exit 1
		root+=("--overlay=/$d:$DIR/upper/$d:/$d")
	done
	root+=(--tmpfs=/etc/systemd/system)
	# The host's /etc/hostname would name the container after the host.
	boot+=("systemd.hostname=$MACHINE")
	;;
*)
	echo "error: unknown ROOT $ROOT" >&2
	exit 2
	;;
esac

(
	for h in $CGS; do echo $BASHPID > "$h/$CG/nspawn/cgroup.procs"; done
	exec systemd-nspawn --quiet --register=no --keep-unit --console=read-only --link-journal=no \
		-D / --volatile=yes -M "$MACHINE" --private-network \
		--bind="$DIR/share:/run/harness" --bind-ro="$DIR/bin:/usr/local/bin" \
		"${root[@]}" "${masks[@]}" \
		-b "${boot[@]}" \
		</dev/null >"$DIR/console.log" 2>&1
) &
NSPAWN=$!

teardown() {
	# SIGTERM: nspawn asks the container to power off (units stopped, journal flushed).
	kill -TERM "$NSPAWN" 2>/dev/null
	for _ in $(seq 400); do
		kill -0 "$NSPAWN" 2>/dev/null || break
		sleep 0.05
	done
	for h in $CGS; do kill_tree "$h/$CG"; done
	wait "$NSPAWN" 2>/dev/null
	umount /run/systemd 2>/dev/null
	if [ "$ROOT" = debian ]; then umount "$DIR/upper" 2>/dev/null; fi
}
trap teardown EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

# The leader is nspawn's child whose comm is "systemd" (PID 1 inside).
LEADER=
for _ in $(seq 600); do
	kill -0 "$NSPAWN" 2>/dev/null || { echo "error: systemd-nspawn exited; console:" >&2; tail -20 "$DIR/console.log" >&2; exit 1; }
	for c in $(cat /proc/"$NSPAWN"/task/*/children 2>/dev/null); do
		if [ "$(cat /proc/"$c"/comm 2>/dev/null)" = systemd ]; then LEADER=$c; break; fi
	done
	[ -n "$LEADER" ] && [ -S "/proc/$LEADER/root/run/systemd/private" ] && break
	sleep 0.025
done
[ -n "$LEADER" ] && [ -S "/proc/$LEADER/root/run/systemd/private" ] ||
	{ echo "error: container systemd not up after 15s; console:" >&2; tail -20 "$DIR/console.log" >&2; exit 1; }
state=$(timeout 30 nsenter -t "$LEADER" -m -p -- systemctl is-system-running --wait 2>&1)
case $state in
running | degraded) ;;
*)
	echo "error: container system state: $state" >&2
	nsenter -t "$LEADER" -m -p -- systemctl --failed --no-pager >&2
	exit 1
	;;
esac
echo "ready $LEADER"
# Hold until the test closes our stdin (also on the test's death).
cat >/dev/null

#!/bin/bash
# Boots a throw-away container with systemd as PID 1, per shared/HARNESS.md
# "System mode". Must be started under `unshare --mount --propagation private`.
# Usage: nspawn.sh DIR NAME MACHINE. NAME names the cgroup subtree, MACHINE
# is the container's hostname. DIR/share is /run/harness inside, DIR/bin is
# /usr/local/bin inside (read-only). Prints "ready LEADER" once the
# container's systemd reports running (or degraded), then holds until stdin
# reaches EOF and powers the container off.
set -u
DIR=$1
NAME=$2
MACHINE=$3
CGS="/sys/fs/cgroup/systemd /sys/fs/cgroup/unified"
# Same pattern as harness.sh, so each script sweeps the other's leftovers.
CG="systemd-harness-$$-$NAME"

# kill_tree CGDIR: SIGKILL every process left in a cgroup subtree, then remove it.
kill_tree() {
	local root=$1 d pid
	[ -d "$root" ] || return 0
	for _ in $(seq 40); do
		local left=0
		for d in $(find "$root" -depth -type d 2>/dev/null); do
			while read -r pid; do
				[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null && left=1
			done < "$d/cgroup.procs"
		done
		[ $left = 0 ] && break
		sleep 0.05
	done
	for d in $(find "$root" -depth -type d 2>/dev/null); do
		rmdir "$d" 2>/dev/null
	done
}

# Sweep subtrees left behind by harnesses whose script died.
for h in $CGS; do
	for d in "$h"/systemd-harness-*; do
		[ -d "$d" ] || continue
		owner=${d##*/systemd-harness-}
		owner=${owner%%-*}
		kill -0 "$owner" 2>/dev/null || kill_tree "$d"
	done
done

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

(
	for h in $CGS; do echo $BASHPID > "$h/$CG/nspawn/cgroup.procs"; done
	exec systemd-nspawn --quiet --register=no --keep-unit --console=read-only --link-journal=no \
		-D / --volatile=yes -M "$MACHINE" --private-network \
		--bind="$DIR/share:/run/harness" --bind-ro="$DIR/bin:/usr/local/bin" \
		"${masks[@]}" \
		-b systemd.firstboot=off \
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

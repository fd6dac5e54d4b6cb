#!/bin/bash
# Runs a private `systemd --user` for one test, per shared/HARNESS.md.
# Must be started under `unshare --mount --propagation private`.
# Usage: harness.sh DIR NAME. Prints "ready PID" once the manager's bus is up,
# then holds until stdin reaches EOF and tears everything down.
set -u
DIR=$1
NAME=$2
CG="systemd-harness-$$-$NAME"

# shellcheck source=cgroup.sh
source "$(dirname "$0")/cgroup.sh"
sweep_stale

for h in $CGS; do
	mkdir -p "$h/$CG/manager" "$h/$CG/aux" || { echo "error: cannot create cgroup $h/$CG" >&2; exit 1; }
done

# Private mounts: the "booted with systemd" marker and a console that is not the serial port.
mkdir -p "$DIR/runsd/system" "$DIR/run" "$DIR/home/.config/systemd/user" "$DIR/home/.local/state" \
	"$DIR/empty" "$DIR/harness-units"
chmod 0700 "$DIR/run"
mount --bind "$DIR/runsd" /run/systemd || exit 1
mkfifo "$DIR/console"
mount --bind "$DIR/console" /dev/console || exit 1
mount --bind "$DIR/console" /dev/kmsg || exit 1
# Opened read-write so neither side of the FIFO ever blocks in open(2).
cat <>"$DIR/console" >"$DIR/manager.log" &
DRAIN=$!

# default.target is up as on a booted machine, so units enabled into it are
# referenced and not garbage-collected (state forgotten) when they stop.
cat > "$DIR/harness-units/harness.target" <<UNIT
[Unit]
Description=test harness
Wants=dbus.socket default.target
UNIT

# Units write to units.log. In a config file, not on the command line:
# daemon-reload resets the manager's defaults to its config files.
mkdir -p "$DIR/runsd/user.conf.d"
cat > "$DIR/runsd/user.conf.d/harness.conf" <<CONF
[Manager]
DefaultStandardOutput=inherit
DefaultStandardError=inherit
CONF

H=$DIR/home
(
	for h in $CGS; do echo $BASHPID > "$h/$CG/manager/cgroup.procs"; done
	exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
		HOME="$H" USER=root LOGNAME=root \
		XDG_RUNTIME_DIR="$DIR/run" XDG_CONFIG_HOME="$H/.config" XDG_STATE_HOME="$H/.local/state" \
		XDG_DATA_HOME="$H/.local/share" XDG_CACHE_HOME="$H/.cache" \
		DBUS_SESSION_BUS_ADDRESS="unix:path=$DIR/run/bus" \
		SYSTEMD_GENERATOR_PATH="$DIR/empty" SYSTEMD_ENVIRONMENT_GENERATOR_PATH="$DIR/empty" \
		SYSTEMD_UNIT_PATH="$H/.config/systemd/user.control:$DIR/run/systemd/user.control:$DIR/run/systemd/transient:$H/.config/systemd/user:$DIR/run/systemd/user:$DIR/harness-units:/usr/lib/systemd/user" \
		/lib/systemd/systemd --user --unit=harness.target --log-target=kmsg \
		</dev/null >>"$DIR/units.log" 2>&1
) &
MANAGER=$!

teardown() {
	kill -TERM "$MANAGER" 2>/dev/null
	for _ in $(seq 60); do
		kill -0 "$MANAGER" 2>/dev/null || break
		sleep 0.05
	done
	for h in $CGS; do kill_tree "$h/$CG"; done
	wait "$MANAGER" 2>/dev/null
	kill "$DRAIN" 2>/dev/null
	umount /dev/kmsg /dev/console /run/systemd 2>/dev/null
}
trap teardown EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

for _ in $(seq 400); do
	[ -S "$DIR/run/bus" ] && break
	kill -0 "$MANAGER" 2>/dev/null || { echo "error: systemd --user exited; log:" >&2; tail -20 "$DIR/manager.log" >&2; exit 1; }
	sleep 0.025
done
[ -S "$DIR/run/bus" ] || { echo "error: no bus socket after 10s" >&2; exit 1; }
echo "ready $MANAGER"
# Hold until the test closes our stdin (also on the test's death).
cat >/dev/null

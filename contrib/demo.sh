#!/bin/bash
# One-command demo (`make demo`): a private systemd user manager (the test
# harness, so it works where PID 1 is not systemd), the agent with its embedded
# etcd, a unit put, changed and replaced in place, then everything cleaned up.
# Needs root (cgroups, mount namespace), like the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "building agentd"
go build -o bin/agentd ./cmd/agentd
AGENTD=$PWD/bin/agentd

D=$(mktemp -d /tmp/agentd-demo.XXXXXX)
AGENT=""
cleanup() {
	set +e
	[ -n "$AGENT" ] && kill "$AGENT" 2>/dev/null && wait "$AGENT" 2>/dev/null
	# Closing the harness's stdin makes it stop the manager and remove its cgroups.
	[ -n "${HARNESS_PID:-}" ] && { exec {HARNESS[1]}>&-; wait "$HARNESS_PID" 2>/dev/null; }
	rm -rf "$D"
}
trap cleanup EXIT

say "starting a private systemd --user manager"
coproc HARNESS { unshare --mount --propagation private bash internal/systemdtest/harness.sh "$D" demo; }
read -r word pid <&"${HARNESS[0]}" || true
[ "$word" = ready ] || { echo "harness did not start"; exit 1; }
echo "systemd --user running as PID $pid, bus $D/run/bus"

export DBUS_SESSION_BUS_ADDRESS=unix:path=$D/run/bus XDG_RUNTIME_DIR=$D/run
export XDG_CONFIG_HOME=$D/home/.config XDG_STATE_HOME=$D/home/.local/state
sctl() { systemctl --user --no-pager "$@"; }

say "agentd run --user --host demo   (embedded etcd on its private socket \$XDG_RUNTIME_DIR/agentd/etcd.sock)"
"$AGENTD" run --user --host demo >"$D/agent.log" 2>&1 &
AGENT=$!
for _ in $(seq 200); do [ -S "$XDG_RUNTIME_DIR/agentd/etcd.sock" ] && break; sleep 0.05; done

cat >"$D/hello.service" <<'UNIT'
[Unit]
Description=agentd demo
[Service]
Type=exec
ExecStart=/bin/sh -c 'echo hello v1; exec sleep infinity'
UNIT
say "agentd unit put hello.service --host demo --wait"
"$AGENTD" unit put "$D/hello.service" --host demo --wait --timeout 60s --user
sctl status hello.service | head -5 || true
PID1=$(sctl show -p MainPID --value hello.service)

sed -i 's/hello v1/hello v2/' "$D/hello.service"
say "changed ExecStart; agentd unit put again --wait"
"$AGENTD" unit put "$D/hello.service" --host demo --wait --timeout 60s --user
PID2=$(sctl show -p MainPID --value hello.service)
echo "main PID $PID1 -> $PID2: restarted in place"
[ "$PID1" != "$PID2" ] || { echo "demo failed: not restarted"; exit 1; }

say "agentd status"
"$AGENTD" status --user
say "agentd unit rm hello.service --host demo --wait"
"$AGENTD" unit rm hello.service --host demo --wait --timeout 60s --user
say "what the agent logged"
grep -E 'started unit|restarted|removed unit' "$D/agent.log" || true
say "demo done, cleaning up"

#!/bin/bash
# Sourced by harness.sh and nspawn.sh: their cgroup subtrees are named
# systemd-harness-<script pid>-<name> in both hierarchies of $CGS, so either
# script sweeps the other's leftovers.
CGS="/sys/fs/cgroup/systemd /sys/fs/cgroup/unified"

# kill_tree CGDIR: SIGKILL every process left in a cgroup subtree (processes
# a harness started: nothing else lives there), then remove it deepest first.
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

# sweep_stale: remove subtrees left behind by harness scripts that died.
sweep_stale() {
	local h d owner
	for h in $CGS; do
		for d in "$h"/systemd-harness-*; do
			[ -d "$d" ] || continue
			owner=${d##*/systemd-harness-}
			owner=${owner%%-*}
			kill -0 "$owner" 2>/dev/null || kill_tree "$d"
		done
	done
}

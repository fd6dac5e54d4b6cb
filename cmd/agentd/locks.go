package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

func newLocksCmd() *cobra.Command {
	var (
		ef     etcdFlags
		group  string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "locks",
		Short: "Show every MaxUnavailable= slot and rollout halt: who holds it, since when, for what, and why the others wait",
		Long: `List every key of the MaxUnavailable= queues (<prefix>/locks/) and every rollout
halt (<prefix>/halts/), read from the registry.

A slot is held by an agent restarting (or verifying) a unit of a group — FOR
says "unit" with the unit and the hash it applies — or by a machine rebooting
through the FleetLock server (agentd run --fleetlock-listen): its holder is
"fleetlock:<client id>", FOR says "reboot", and it holds a slot of every
MaxUnavailable= queue of its group and of the group's "reboot" pool. SINCE is
when the slot was granted (for a waiting key, when it queued), by the
holder's clock. TTL is what is left of the holder's etcd lease: an agent
renews its lease while it runs (--lease-ttl), so its slots go a TTL after it
dies; a FleetLock reboot's lease is not renewed, its slots go when the
client calls steady-state or when --fleetlock-ttl runs out.

A unit with [X-Agentd] MaxUnavailableBy=KEY has one queue per value of the
host label KEY: BUCKET names it ("rack=r1", or "(no rack)" for the hosts
without the label, who share one), and a reboot takes its slot in the bucket
of the machine the FleetLock server runs on.

Why a host waits is said when the registry knows it: for a queued key, the
queue's limit (the unit's MaxUnavailable= in the group's keys now, or the
group's reboot limit) and the holders ahead of it; for a halt, the live hosts
whose status says they hold that unit back. What the registry does not hold
is not shown: a host waiting for something of its own (the rolling update of
a template's instances, a job in progress) — see "agentd status" on it, or
"agentd unit put --wait". Rollouts (a strategy over a frozen host set) are
not shown either.`,
		Example: `  agentd locks                  # every group
  agentd locks --group web --json`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			scope := ""
			if err := groupFilter(group); err != nil {
				return err
			}
			if group != "" {
				scope = "groups/" + group
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				reg.SetLogger(cliWarnings(cmd.ErrOrStderr())) // keys skipped as garbage
				rep, err := readLocks(ctx, reg, scope)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), rep)
				}
				return printLocks(cmd.OutOrStdout(), rep, time.Now())
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	cmd.Flags().StringVar(&group, "group", "", "only this group's slots and halts")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// locksReport is what `agentd locks` shows.
type locksReport struct {
	Slots []slotRow `json:"slots"`
	Halts []haltRow `json:"halts"`
}

// slotRow is one key of a MaxUnavailable= queue.
type slotRow struct {
	Scope string `json:"scope"`           // "groups/<g>"
	Group string `json:"group,omitempty"` // <g>
	// Unit is the unit (a template, for instances) the queue is for, or
	// "reboot": the group's reboot pool.
	Unit string `json:"unit"`
	// Bucket names the queue's label bucket when the unit budgets by
	// label (MaxUnavailableBy=): "rack=r1", or "(no rack)" for the hosts
	// without the label; BucketKey and BucketValue are its parts. Empty
	// for the queue of the whole group.
	Bucket      string `json:"bucket,omitempty"`
	BucketKey   string `json:"bucketKey,omitempty"`
	BucketValue string `json:"bucketValue,omitempty"`
	Holder      string `json:"holder"` // a host, or "fleetlock:<id>"
	// For is what the slot is for: "unit" (an agent applying a change to
	// Unit, Hash), "reboot" (a FleetLock client, FleetLockID), or
	// "unknown" (a value that does not decode).
	For         string `json:"for"`
	Hash        string `json:"hash,omitempty"`
	FleetLockID string `json:"fleetLockID,omitempty"`
	// State is "held", "granting" (among the first Limit, not marked yet)
	// or "waiting".
	State string `json:"state"`
	// Since is when the slot was granted, or, while not held, when the
	// holder queued; by the holder's clock.
	Since    time.Time `json:"since,omitzero"`
	Position int       `json:"position"`
	// Limit is the queue's limit as the group's keys say now; 0: not known.
	Limit int `json:"limit"`
	// TTLSeconds is what is left of the holder's lease; -1: no lease, or
	// it has just expired.
	TTLSeconds int64  `json:"ttlSeconds"`
	Lease      string `json:"lease,omitempty"` // hex, as etcdctl lease timetolive takes it
	// Ahead are the holders queued before this key, and Why says in words
	// why it waits (not held only).
	Ahead []string `json:"ahead,omitempty"`
	Why   string   `json:"why,omitempty"`
}

// haltRow is a halted rollout and the live hosts it holds back.
type haltRow struct {
	reconcile.Halt
	Group string `json:"group"`
	// Held are the live hosts whose status says they hold this unit back
	// because of the halt.
	Held []string `json:"held"`
}

// readLocks reads the slots and halts of scope ("" for every group) and
// the statuses of the live members of the halted groups.
func readLocks(ctx context.Context, reg *registry.Client, scope string) (locksReport, error) {
	slots, err := reg.Slots(ctx, scope)
	if err != nil {
		return locksReport{}, err
	}
	rep := locksReport{Slots: []slotRow{}, Halts: []haltRow{}}
	for _, s := range slots {
		rep.Slots = append(rep.Slots, slotRowOf(s))
	}
	halts, err := reg.Halts(ctx, scope)
	if err != nil {
		return locksReport{}, err
	}
	if len(halts) == 0 {
		return rep, nil
	}
	members, err := reg.Members(ctx)
	if err != nil {
		return locksReport{}, err
	}
	statuses := map[string]map[string]reconcile.Status{}
	for _, h := range halts {
		row := haltRow{Halt: h, Group: strings.TrimPrefix(h.Scope, "groups/"), Held: []string{}}
		for _, m := range members {
			if !slices.Contains(m.Groups, row.Group) {
				continue
			}
			st, ok := statuses[m.Host]
			if !ok {
				if st, err = reg.Statuses(ctx, m.Host); err != nil {
					return locksReport{}, err
				}
				statuses[m.Host] = st
			}
			for unit, s := range st {
				if s.Action == reconcile.ActionHeld && reconcile.SlotKey(unit) == h.Unit && !slices.Contains(row.Held, m.Host) {
					row.Held = append(row.Held, m.Host)
				}
			}
		}
		rep.Halts = append(rep.Halts, row)
	}
	return rep, nil
}

// slotRowOf says what a queue key is for and why it waits.
func slotRowOf(s registry.Slot) slotRow {
	r := slotRow{
		Scope: s.Scope, Unit: s.Pool, Holder: s.Holder, Position: s.Position, Limit: s.Limit,
		Bucket: s.Bucket.String(), BucketKey: s.Bucket.Key, BucketValue: s.Bucket.Value,
		Hash: s.Value.Hash, FleetLockID: s.Value.FleetLockID, TTLSeconds: int64(s.TTL / time.Second),
	}
	if g, ok := strings.CutPrefix(s.Scope, "groups/"); ok {
		r.Group = g
	}
	if s.Lease != 0 {
		r.Lease = fmt.Sprintf("%x", s.Lease)
	}
	if s.TTL < 0 {
		r.TTLSeconds = -1
	}
	switch {
	case s.Garbled:
		r.For = "unknown"
	case s.Value.FleetLockID != "":
		r.For = "reboot"
	default:
		r.For = "unit"
	}
	switch {
	case s.Held():
		r.State, r.Since = "held", s.Value.AcquiredAt
		return r
	case s.Limit > 0 && len(s.Ahead) < s.Limit:
		r.State = "granting" // among the first Limit: it marks its key next
	default:
		r.State = "waiting"
	}
	r.Since, r.Ahead = s.Value.RequestedAt, s.Ahead
	r.Why = whyWaits(s)
	return r
}

// whyWaits says why a queued key does not hold its slot.
func whyWaits(s registry.Slot) string {
	what := fmt.Sprintf("%s allows %d at once (MaxUnavailable=%d)", s.Pool, s.Limit, s.Limit)
	if s.Pool == registry.RebootPool {
		what = fmt.Sprintf("the group's reboots take %d slot(s) at once (its smallest MaxUnavailable=, or 1)", s.Limit)
	}
	if b := s.Bucket; b.Key != "" {
		// "app.service allows 1 at once in rack=r1 (MaxUnavailable=1 per rack)"
		what = fmt.Sprintf("%s allows %d at once in %s (MaxUnavailable=%d per %s)", s.Pool, s.Limit, b, s.Limit, b.Key)
		if s.Pool == registry.RebootPool {
			what = fmt.Sprintf("the group's reboots take %d slot(s) at once in %s (its smallest MaxUnavailable=, per %s)", s.Limit, b, b.Key)
		}
	}
	switch {
	case s.Garbled:
		return "its value does not decode: it holds its place in the queue until it is deleted (etcdctl del) — delete it if no agent wrote it"
	case s.Limit == 0 && s.Bucket.Key != "":
		return fmt.Sprintf("queued behind %s; the queue's limit is not known from the registry now (no key of the group sets MaxUnavailable= with MaxUnavailableBy=%s for %s any more)",
			strings.Join(s.Ahead, ", "), s.Bucket.Key, s.Pool)
	case s.Limit == 0:
		return fmt.Sprintf("queued behind %s; the queue's limit is not known from the registry now (no key of the group sets MaxUnavailable= for %s any more)",
			strings.Join(s.Ahead, ", "), s.Pool)
	case len(s.Ahead) < s.Limit:
		return what + ": a slot is free, and the holder is marking it"
	case len(s.Ahead) == s.Limit:
		return what + ", taken by " + strings.Join(s.Ahead, ", ")
	}
	return what + ", taken by " + strings.Join(s.Ahead[:s.Limit], ", ") + "; queued before it: " + strings.Join(s.Ahead[s.Limit:], ", ")
}

func printLocks(out io.Writer, rep locksReport, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if len(rep.Slots) == 0 {
		fmt.Fprintln(tw, "no MaxUnavailable= slot held or waited for")
	} else {
		// BUCKET only when a queue is by label (MaxUnavailableBy=).
		byLabel := slices.ContainsFunc(rep.Slots, func(s slotRow) bool { return s.Bucket != "" })
		bucket := func(s slotRow) string {
			if !byLabel {
				return ""
			}
			return orDash(s.Bucket) + "\t"
		}
		head := "GROUP\tUNIT\tHOLDER\tSTATE\tSINCE\tTTL\tFOR"
		if byLabel {
			head = "GROUP\tBUCKET\tUNIT\tHOLDER\tSTATE\tSINCE\tTTL\tFOR"
		}
		fmt.Fprintln(tw, head)
		for _, s := range rep.Slots {
			since := "-"
			if !s.Since.IsZero() {
				since = s.Since.Local().Format(time.RFC3339) + " (" + ago(now.Sub(s.Since)) + " ago)"
			}
			ttl := "none"
			if s.TTLSeconds >= 0 {
				ttl = ago(time.Duration(s.TTLSeconds) * time.Second)
			}
			fmt.Fprintf(tw, "%s\t%s%s\t%s\t%s\t%s\t%s\t%s\n", orDash(s.Group), bucket(s), s.Unit, s.Holder, s.State, since, ttl, slotFor(s)+prefixed(s.Why))
		}
	}
	if len(rep.Halts) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "HALTED\tUNIT\tHASH\tFAILED ON\tSINCE\tHOLDING BACK\tREASON")
		for _, h := range rep.Halts {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Group, h.Unit, short(h.Hash), h.Host,
				h.At.Local().Format(time.RFC3339)+" ("+ago(now.Sub(h.At))+" ago)", orDash(strings.Join(h.Held, ",")), h.Reason)
		}
		fmt.Fprintln(tw, "\t(a halt stays until new content for the unit is put: agentd unit put, or agentd unit revert)")
	}
	return tw.Flush()
}

// slotFor says in words what a slot is for.
func slotFor(s slotRow) string {
	switch s.For {
	case "reboot":
		return "reboot via FleetLock" // the holder names the client
	case "unit":
		return "applying " + s.Unit + " (hash " + orDash(short(s.Hash)) + ")"
	}
	return "unknown"
}

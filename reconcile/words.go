package reconcile

import "strings"

// ActionWord is what a unit's status says was last done to it or is being
// done (Status.Action): a Kind's name for an action that ran ("start",
// "restart", "update", ...), or one of the words below. Readers (`--wait`,
// `agentd hosts`, status, metrics) compare against these constants, never
// against strings of their own. On the wire it is the plain word.
type ActionWord string

// The status words that are not a Kind's name, and the Kind names readers
// act on.
const (
	ActionWait        ActionWord = "wait"         // waiting its turn: a rolling update, a job in progress
	ActionWaitSlot    ActionWord = "wait-slot"    // waiting for a MaxUnavailable= slot
	ActionHeld        ActionWord = "held"         // the group's rollout is halted
	ActionRollingBack ActionWord = "rolling-back" // putting the previous version back
	ActionRolledBack  ActionWord = "rolled-back"  // the previous version is back (KindRollback's name)
	ActionBlocked     ActionWord = "blocked"      // cannot be applied (KindBlocked's name)
	ActionAdopt       ActionWord = "adopt"        // an interrupted pass's job ran: recorded as running it
)

// ResultWord is how the action a unit's status names went (Status.Result):
// one of the words below, or the result systemd gave the agent's job when
// it was another (timeout, canceled, dependency, skipped, ...). On the wire
// it is the plain word.
type ResultWord string

// The result words the agent gives.
const (
	ResultDone    ResultWord = "done"    // it did what it meant to
	ResultFailed  ResultWord = "failed"  // it did not
	ResultRunning ResultWord = "running" // its job is in flight
	ResultWaiting ResultWord = "waiting" // it waits its turn (ActionWait)
	ResultBlocked ResultWord = "blocked" // it cannot be applied (ActionBlocked)
	ResultRefused ResultWord = "refused" // the unit was refused (a file the agent does not own, a bad signature, ...)
	ResultPending ResultWord = "pending" // not final: a rollback follows
	ResultUnknown ResultWord = "unknown" // its outcome is not known
)

// HealthWord is the agent's verdict on the version a unit runs
// (Status.Health); the zero HealthWord, no verdict yet. On the wire it is
// the plain word.
type HealthWord string

// The health words.
const (
	HealthVerifying HealthWord = "verifying" // inside its HealthySec window
	HealthHealthy   HealthWord = "healthy"
	HealthUnhealthy HealthWord = "unhealthy"
)

// heldPrefix starts the text of a unit held by a halted rollout (its
// Action.Reason and Err, and so its Status.Error); heldText writes it and
// HeldReason takes it off, so no reader strips strings of its own.
const heldPrefix = "held: "

// heldText is the reason of a unit held by a halted rollout.
func heldText(why string) string { return heldPrefix + why }

// cutHeld returns the reason of a held unit without its prefix, and
// whether text is one.
func cutHeld(text string) (string, bool) { return strings.CutPrefix(text, heldPrefix) }

// HeldReason is why a held unit (Action ActionHeld) waits: its Error
// without the prefix that marks it.
func HeldReason(st Status) string {
	why, _ := cutHeld(st.Error)
	return why
}

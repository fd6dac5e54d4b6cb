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

// Word is the status word of an action of kind k.
func (k Kind) Word() ActionWord { return ActionWord(k.String()) }

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

package reconcile

import "testing"

// The status words that are also a Kind's name must stay that name: a
// status written by a rollback job and one written by bookkeep say the same.
func TestActionWordsMatchKinds(t *testing.T) {
	for k, w := range map[Kind]ActionWord{KindRollback: ActionRolledBack, KindBlocked: ActionBlocked, KindWait: ActionWait} {
		if k.Word() != w {
			t.Errorf("%v.Word() = %q, want %q", k, k.Word(), w)
		}
	}
}

func TestHeldText(t *testing.T) {
	text := heldText("the rollout of abc is halted")
	if why, ok := cutHeld(text); !ok || why != "the rollout of abc is halted" {
		t.Fatalf("cutHeld(%q) = %q, %v", text, why, ok)
	}
	if got := HeldReason(Status{Action: ActionHeld, Error: text}); got != "the rollout of abc is halted" {
		t.Fatalf("HeldReason = %q", got)
	}
	if _, ok := cutHeld("unit failed"); ok {
		t.Fatal("cutHeld took a text that is not a held unit's")
	}
}

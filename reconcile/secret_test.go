package reconcile

import (
	"strings"
	"testing"

	"github.com/agentd/agentd/secret"
)

// sealedValue is a secret config file's registry value: plaintext
// encrypted to id, for hosts to.
func sealedValue(t *testing.T, id *secret.Identity, plaintext string, to ...string) string {
	t.Helper()
	ct, err := secret.Encrypt([]byte(plaintext), []string{id.Recipient()})
	if err != nil {
		t.Fatal(err)
	}
	return string(ConfigFile{Mode: 0o600, Owner: "root:root", Secret: true, To: to, Content: ct}.Encode())
}

// A secret is decrypted where the agent builds its desired units: the
// file it writes is the plaintext, and everything it shows of it — the
// version's key, statuses, the words of a plan — carries the ciphertext's
// hash, never the plaintext's. A host that cannot decrypt it blocks the
// unit, saying so.
func TestDesireSecret(t *testing.T) {
	id, err := secret.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const key = "db.service.files/etc/db/pass.env"
	value := sealedValue(t, id, "PASSWORD=hunter2\n", "h1")
	plainForm := string(ConfigFile{Mode: 0o600, Owner: "root:root", Content: []byte("PASSWORD=hunter2\n")}.Encode())
	snap := Snapshot{Entries: []Entry{entry("db.service", svc+"[X-Agentd]\nRestartTriggers=/etc/db/pass.env\n"), entry(key, value)}}

	d := desiredState{secrets: id}
	d.update(snap)
	u := d.units["db.service"]
	if u.Err != nil {
		t.Fatal(u.Err)
	}
	f := u.DropIns[key]
	if string(f.Content) != plainForm || f.Hash != Hash([]byte(plainForm)) || f.Sealed != Hash([]byte(value)) {
		t.Fatalf("the desired file: content %q, hash %s, sealed %s", f.Content, short(f.Hash), short(f.Sealed))
	}
	if k := ContentKey(u); strings.Contains(k, f.Hash) || !strings.Contains(k, f.Sealed) {
		t.Errorf("the version's key %q shows the plaintext's hash or not the ciphertext's", k)
	}

	// The plan writes the plaintext; its reason names the ciphertext.
	plan := Plan(d.units, Current{Host: HostFacts{Files: map[string]LocalFile{}, Units: map[string]UnitState{"db.service": absent}}})
	var writes int
	for _, w := range plan[0].Steps.Writes {
		if w.Path == key {
			writes++
			if string(w.Content) != plainForm {
				t.Errorf("the write of %s holds %q", key, w.Content)
			}
		}
	}
	if writes != 1 || strings.Contains(plan[0].Reason, short(f.Hash)) || !strings.Contains(plan[0].Reason, short(f.Sealed)) {
		t.Errorf("plan: %d writes of the secret, reason %q", writes, plan[0].Reason)
	}

	// What a status says of the file on disk: the ciphertext's hash in
	// place, a word when it differs; never the hash of the file.
	got := sealDropIns(map[string]string{key: f.Hash, "db.service": "x"}, u)
	if got[key] != f.Sealed || got["db.service"] != "x" {
		t.Errorf("in place: %v", got)
	}
	if got := sealDropIns(map[string]string{key: Hash([]byte("other"))}, u); got[key] != secretDiffers {
		t.Errorf("drifted: %v", got)
	}

	// Previews (Desire) keep it sealed: its hash is the ciphertext's.
	if p := Desire(snap)["db.service"].DropIns[key]; p.Hash != f.Sealed || string(p.Content) != value {
		t.Errorf("Desire keeps %s, want the sealed value", short(p.Hash))
	}

	// Not a recipient: the unit is blocked, naming the key and the hosts.
	other, err := secret.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d = desiredState{secrets: other}
	d.update(snap)
	if err := d.units["db.service"].Err; err == nil || !strings.Contains(err.Error(), key+": cannot decrypt") || !strings.Contains(err.Error(), "encrypted to h1") {
		t.Errorf("not a recipient: %v", err)
	}
	// No identity at all.
	d = desiredState{}
	d.update(snap)
	if err := d.units["db.service"].Err; err == nil || !strings.Contains(err.Error(), "no identity") {
		t.Errorf("no identity: %v", err)
	}
}

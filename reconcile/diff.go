package reconcile

import (
	"fmt"
	"maps"
	"slices"
)

// FileDiff pairs the registry's and the disk's version of one file.
type FileDiff struct {
	Path          string `json:"path"`
	Unit          string `json:"unit"`
	Registry      string `json:"registry"`
	InRegistry    bool   `json:"inRegistry"`
	Local         string `json:"local"`
	OnDisk        bool   `json:"onDisk"`
	Managed       bool   `json:"managed"`
	RegistryHash  string `json:"registryHash,omitempty"`
	LocalHash     string `json:"localHash,omitempty"`
	LocalReadErr  string `json:"localReadError,omitempty"`
	RegistryError string `json:"registryError,omitempty"`
	// Secret: the registry holds the file encrypted (Registry is its
	// ciphertext) and the file on disk is never shown: Local is the
	// same as Registry when the file is the decrypted one, else a note.
	Secret bool `json:"secret,omitempty"`
}

// diffFiles pairs the registry's version of every file of unit ("" for
// all units) in snap with what disk holds of it, managed being the
// Manifest's owned paths and decrypted the loop's desired units (a
// secret's decrypted hash) (Agent.Diff).
func diffFiles(snap Snapshot, managed map[string]Owned, disk Files, decrypted map[string]*DesiredUnit, unit string) ([]FileDiff, error) {
	var out []FileDiff
	desired := Desire(snap)
	files := map[string]*FileDiff{}
	for name, u := range desired {
		if unit != "" && name != unit {
			continue
		}
		if u.Err != nil {
			files[name] = &FileDiff{Path: name, Unit: name, RegistryError: u.Err.Error()}
			continue
		}
		for _, f := range u.Files() {
			files[f.Path] = &FileDiff{Path: f.Path, Unit: name, Registry: string(f.Content), InRegistry: true, RegistryHash: f.Hash, Secret: f.Sealed != ""}
		}
	}
	for p, e := range managed {
		if e.Instance || (unit != "" && UnitOfPath(p) != unit) {
			continue
		}
		if files[p] == nil {
			files[p] = &FileDiff{Path: p, Unit: UnitOfPath(p)}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		fd := files[p]
		if fd.RegistryError == "" {
			_, fd.Managed = managed[p]
			b, exists, err := disk.Read(p)
			switch {
			case err != nil:
				fd.LocalReadErr = err.Error()
			case exists && fd.Secret:
				fd.OnDisk, fd.Local, fd.LocalHash = true, "(a secret: the file on disk is not the one the registry holds; its content is not shown)\n", secretDiffers
				if d := decrypted[fd.Unit]; d != nil && d.DropIns[p].Hash == Hash(b) {
					fd.Local, fd.LocalHash = fd.Registry, fd.RegistryHash
				}
			case exists:
				fd.Local, fd.OnDisk, fd.LocalHash = string(b), true, Hash(b)
			}
		}
		out = append(out, *fd)
	}
	if unit != "" && len(out) == 0 {
		return nil, fmt.Errorf("unit %s is neither in the registry for this host nor managed by the agent", unit)
	}
	return out, nil
}

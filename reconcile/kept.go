package reconcile

// keptVersions holds the content of versions read back from the state
// directory (Manifest.Blob), by hash, while a record refers to them: every
// pass re-read every unit's previous version. Loop-owned (the view's).
type keptVersions struct {
	blobs map[string][]byte
}

// fill puts in cur.Memory.Blobs the content of the versions its records'
// units run and ran before, for classifying a change and for rolling back:
// from the file when it still holds it, else from the state directory
// (man) — read once and kept while a record refers to it.
func (k *keptVersions) fill(cur *Current, man Manifest) {
	if k.blobs == nil {
		k.blobs = map[string][]byte{}
	}
	for _, rec := range cur.Memory.Records {
		for _, m := range []map[string]string{rec.Applied, rec.Previous} {
			for p, h := range m {
				if _, ok := cur.Memory.Blobs[h]; ok {
					continue
				}
				if lf := cur.Host.Files[p]; lf.Hash == h {
					cur.Memory.Blobs[h] = lf.Content
				} else if b, ok := k.blobs[h]; ok {
					cur.Memory.Blobs[h] = b
				} else if b, ok := man.Blob(h); ok {
					cur.Memory.Blobs[h], k.blobs[h] = b, b
				}
			}
		}
	}
}

// prune drops the versions no record refers to any more.
func (k *keptVersions) prune(records map[string]UnitRecord) {
	refs := map[string]bool{}
	for _, rec := range records {
		for _, h := range rec.Applied {
			refs[h] = true
		}
		for _, h := range rec.Previous {
			refs[h] = true
		}
	}
	for h := range k.blobs {
		if !refs[h] {
			delete(k.blobs, h)
		}
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/secret"
	"github.com/agentd/agentd/selector"
)

// Secrets (issue 36): `unit put --secret` encrypts each --file of the put
// to the hosts it targets, so the registry, its history and every status
// hold only age ciphertext. Whom to encrypt to is the part to get right:
// each host's recipient as its agent publishes it (registry.KnownHosts),
// pinned on first use like ssh's known_hosts (secret.Pins), or an
// operator-kept file (--recipients) that trusts the registry for nothing
// but membership. The plaintext is read from SRC into memory and nowhere
// else: no argument, log line or error message carries it.

// secretMode is a secret's mode when --file gives none.
const secretMode = 0o600

// secretFlags are the recipients' options of `unit put --secret` and
// `secrets rekey`.
type secretFlags struct {
	on         bool     // --secret (unit put only)
	admins     []string // --admin-recipient
	recipients string   // --recipients FILE
	acceptNew  bool     // --accept-new: pin a host seen for the first time
	pins       string   // --known-recipients FILE ("": secret.DefaultPinsPath)
	credential string   // --credential NAME (unit put only)
	// sel is the put's --selector (empty: none), counted before it is
	// recorded (registry.Client.AssumeSelector).
	sel selector.Selector
}

func (s *secretFlags) bind(cmd *cobra.Command, put bool) {
	if put {
		cmd.Flags().StringVar(&s.credential, "credential", "", "with --secret and one --file: each host makes a systemd credential NAME of it (systemd-creds: TPM2 where present, else the host key) and writes that, for a unit's LoadCredentialEncrypted=NAME:DEST — no plaintext on the host's disk")
		cmd.Flags().BoolVar(&s.on, "secret", false, "encrypt every --file of the put (age) to the targeted hosts: --host H, or every member of --group G (live or down), and each --admin-recipient; the registry holds only ciphertext (default mode 0600)")
	}
	cmd.Flags().StringArrayVar(&s.admins, "admin-recipient", nil, "also encrypt to this age1… recipient or ssh-ed25519 public key, e.g. the operator's, for a later agentd secrets rekey. Repeatable")
	cmd.Flags().StringVar(&s.recipients, "recipients", "", "take the hosts' recipients from this file (\"host recipient\" lines) instead of what their agents publish in the registry")
	cmd.Flags().BoolVar(&s.acceptNew, "accept-new", true, "pin the recipient of a host seen for the first time (as ssh's StrictHostKeyChecking=accept-new); false refuses it until agentd secrets accept HOST")
	bindPinsFlag(cmd, &s.pins)
}

// bindPinsFlag binds --known-recipients (AGENTD_KNOWN_RECIPIENTS).
func bindPinsFlag(cmd *cobra.Command, path *string) {
	cmd.Flags().StringVar(path, "known-recipients", "", "the file of pinned host recipients (default $XDG_CONFIG_HOME/agentd/known_recipients)")
}

// check refuses the secret options where they mean nothing.
func (s *secretFlags) check(cmd *cobra.Command, files []string) error {
	if s.on && len(files) == 0 {
		return withCode(exitUsage, errors.New("unit put --secret: give the secret as --file DEST=SRC (the unit file itself is never encrypted)"))
	}
	if s.credential != "" {
		if err := reconcile.ValidateCredentialName(s.credential); err != nil {
			return withCode(exitUsage, fmt.Errorf("unit put --credential: %w", err))
		}
		if len(files) != 1 {
			return withCode(exitUsage, errors.New("unit put --credential: give exactly one --file, the credential's"))
		}
	}
	if !s.on {
		for _, f := range []string{"admin-recipient", "recipients", "accept-new", "known-recipients", "credential"} {
			if cmd.Flags().Changed(f) {
				return withCode(exitUsage, fmt.Errorf("unit put --%s: only with --secret", f))
			}
		}
	}
	return s.checkAdmins()
}

func (s *secretFlags) checkAdmins() error {
	for _, r := range s.admins {
		if _, err := secret.ParseRecipient(r); err != nil {
			return withCode(exitUsage, fmt.Errorf("--admin-recipient: %w", err))
		}
	}
	return nil
}

func (s *secretFlags) pinsPath() (string, error) {
	if s.pins != "" {
		return s.pins, nil
	}
	return secret.DefaultPinsPath()
}

// sealTo is whom a secret is encrypted to.
type sealTo struct {
	hosts      []string // sorted: the header's to=
	recipients []string // the hosts', then the admins'
}

// seal encrypts the config files at keys of units (as addFiles put them,
// in plain) to tg's hosts and the admins, in place. Nothing is encrypted,
// and no pin saved, when any host's recipient is missing or changed.
func (s *secretFlags) seal(cmd *cobra.Command, ef *etcdFlags, tg registry.Target, units map[string][]byte, keys []string, dryRun bool) error {
	plain := map[string]reconcile.ConfigFile{}
	for _, k := range keys {
		cf, err := reconcile.DecodeConfigFile(units[k])
		if err != nil {
			return fmt.Errorf("unit put --secret %s: %w", k, err)
		}
		if len(cf.Content) > secret.MaxPlaintext {
			_, dest, _ := reconcile.ConfigDest(k)
			return withCode(exitUsage, fmt.Errorf("unit put --secret --file %s: %d bytes, over a secret's limit of %d KiB; nothing stored", dest, len(cf.Content), secret.MaxPlaintext>>10))
		}
		if s.credential != "" {
			cf.Credential = s.credential
		}
		plain[k] = cf
	}
	return withRegistry(cmd, ef, func(ctx context.Context, reg *registry.Client) error {
		to, err := s.resolve(ctx, reg, tg, nil, cmd.ErrOrStderr(), dryRun)
		if err != nil {
			return err
		}
		for k, cf := range plain {
			if units[k], err = sealFile(cf, to); err != nil {
				_, dest, _ := reconcile.ConfigDest(k)
				return withCode(exitUsage, fmt.Errorf("unit put --secret --file %s: %w", dest, err))
			}
		}
		return nil
	})
}

// sealFile is cf encrypted to to, as the registry holds it.
func sealFile(cf reconcile.ConfigFile, to sealTo) ([]byte, error) {
	ct, err := secret.Encrypt(cf.Content, to.recipients)
	if err != nil {
		return nil, err
	}
	return reconcile.ConfigFile{Mode: cf.Mode, Owner: cf.Owner, Secret: true, To: to.hosts, Credential: cf.Credential, Content: ct}.Encode(), nil
}

// resolve finds tg's hosts and the recipient of each (pinned, or from
// --recipients), plus the admins' (extra first: rekey's own). New pins
// are saved unless dryRun, and said on w.
func (s *secretFlags) resolve(ctx context.Context, reg *registry.Client, tg registry.Target, extra []string, w io.Writer, dryRun bool) (sealTo, error) {
	if !s.sel.Empty() {
		reg.AssumeSelector(s.sel)
	}
	known, err := reg.KnownHosts(ctx)
	if err != nil {
		return sealTo{}, err
	}
	hosts, err := targetHosts(tg, known, s.recipients != "")
	if err != nil {
		return sealTo{}, withCode(exitUsage, fmt.Errorf("%w; nothing stored", err))
	}
	var byHost map[string]string
	if s.recipients != "" {
		byHost, err = fileRecipients(s.recipients, hosts)
	} else {
		byHost, err = s.pinned(hosts, known, w, dryRun)
	}
	if err != nil {
		return sealTo{}, err
	}
	to := sealTo{hosts: hosts}
	for _, h := range hosts {
		to.recipients = append(to.recipients, byHost[h])
	}
	to.recipients = append(append(to.recipients, extra...), s.admins...)
	return to, nil
}

// targetHosts are tg's hosts, sorted: the host, or every member of the
// group, live or down. A host that never joined is an error unless its
// recipient comes from a file (anyFile).
func targetHosts(tg registry.Target, known []registry.KnownHost, anyFile bool) ([]string, error) {
	if tg.Host != "" {
		if anyFile || slices.ContainsFunc(known, func(k registry.KnownHost) bool { return k.Host == tg.Host }) {
			return []string{tg.Host}, nil
		}
		return nil, fmt.Errorf("no agent has joined as %s: no key to encrypt to", tg.Host)
	}
	hosts := members(tg.Group, known)
	if len(hosts) == 0 {
		return nil, fmt.Errorf("group %s has no members: no host to encrypt to (a host joins it with agentd run --group %s)", tg.Group, tg.Group)
	}
	return hosts, nil
}

// members are group's hosts, live or down, sorted (known is).
func members(group string, known []registry.KnownHost) []string {
	var hosts []string
	for _, k := range known {
		if slices.Contains(k.Groups, group) {
			hosts = append(hosts, k.Host)
		}
	}
	return hosts
}

// fileRecipients reads --recipients FILE: every host must be in it.
func fileRecipients(path string, hosts []string) (map[string]string, error) {
	m, err := secret.LoadRecipientsFile(path)
	if err != nil {
		return nil, withCode(exitUsage, err)
	}
	var missing []string
	for _, h := range hosts {
		if m[h] == "" {
			missing = append(missing, h)
		}
	}
	if len(missing) > 0 {
		return nil, withCode(exitUsage, fmt.Errorf("--recipients %s has no line for %s; nothing stored", path, strings.Join(missing, ", ")))
	}
	return m, nil
}

// pinned checks each host's published recipient against the pins: a new
// one is pinned (with --accept-new), a changed one refused with how to
// accept it. Every host is checked before any error, so one run names
// them all.
func (s *secretFlags) pinned(hosts []string, known []registry.KnownHost, w io.Writer, dryRun bool) (map[string]string, error) {
	path, err := s.pinsPath()
	if err != nil {
		return nil, err
	}
	pins, err := secret.LoadPins(path)
	if err != nil {
		return nil, err
	}
	published := map[string]string{}
	for _, k := range known {
		published[k.Host] = k.Recipient
	}
	var errs []error
	var fresh []string
	for _, h := range hosts {
		r := published[h]
		if r == "" {
			errs = append(errs, fmt.Errorf("%s publishes no recipient: its agent is from before secrets (upgrade it), so it could not decrypt", h))
			continue
		}
		switch state, old := pins.Check(h, r); state {
		case secret.PinChanged:
			errs = append(errs, fmt.Errorf("%s's recipient changed: pinned %s, the registry now says %s — a reinstalled host, or someone answering for it; if you expect it: agentd secrets accept %s", h, old, r, h))
		case secret.PinNew:
			if !s.acceptNew {
				errs = append(errs, fmt.Errorf("%s's recipient %s is not pinned yet (--accept-new=false); check it, then: agentd secrets accept %s", h, r, h))
				continue
			}
			if err := pins.Pin(h, r); err != nil {
				errs = append(errs, err)
				continue
			}
			fresh = append(fresh, h)
		}
	}
	if len(errs) > 0 {
		return nil, withCode(exitUsage, fmt.Errorf("%w; nothing stored", errors.Join(errs...)))
	}
	if len(fresh) > 0 && !dryRun {
		if err := pins.Save(); err != nil {
			return nil, err
		}
	}
	for _, h := range fresh {
		if dryRun {
			fmt.Fprintf(w, "%s's recipient %s is new (dry run: not pinned)\n", h, published[h])
		} else {
			fmt.Fprintf(w, "pinned %s's recipient %s in %s\n", h, published[h], path)
		}
	}
	return published, nil
}

// catValue is what `unit cat` prints of a value: a secret's header and,
// instead of its armour, whom it is encrypted to and the ciphertext's
// hash; any other value as it is.
func catValue(key string, b []byte) []byte {
	if !reconcile.IsConfigPath(key) {
		return b
	}
	cf, err := reconcile.DecodeConfigFile(b)
	if err != nil || !cf.Secret {
		return b
	}
	head, _, _ := strings.Cut(string(b), "\n")
	return fmt.Appendf(nil, "%s\n(age-encrypted to %s; ciphertext sha256 %s)\n", head, strings.Join(cf.To, ", "), short(reconcile.Hash(cf.Content)))
}

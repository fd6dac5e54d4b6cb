package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"filippo.io/age"
	"filippo.io/age/armor"
	"github.com/spf13/cobra"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/secret"
)

func newSecretsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secrets",
		Short: "List, re-encrypt and trust the keys of secrets (unit put --secret)",
		Long: `A secret is a config file put with "agentd unit put UNIT --file DEST=SRC --secret":
the registry holds it encrypted (age) to the recipient of each targeted host —
the key its agent made at first start, or its SSH host key — and to each
--admin-recipient; each host decrypts it just before writing it.

Each host's recipient is pinned on first use in $XDG_CONFIG_HOME/agentd/known_recipients
(--known-recipients, AGENTD_KNOWN_RECIPIENTS), as ssh pins host keys: a put to a
host whose recipient changed is refused until "agentd secrets accept HOST".
A host that joins a group after a secret was put cannot read it ("secrets ls"
shows it): "agentd secrets rekey --group G --identity ADMIN_KEY" re-encrypts
every secret of the group to its members now, with an admin's key.`,
	}
	cmd.AddCommand(newSecretsLsCmd(), newSecretsAcceptCmd(), newSecretsRekeyCmd())
	return cmd
}

// secretRow is one secret of `secrets ls`.
type secretRow struct {
	Target        string   `json:"target"`
	Key           string   `json:"key"` // the unit key suffix: <unit>.files/<path>
	Mode          string   `json:"mode"`
	Owner         string   `json:"owner"`
	To            []string `json:"to"`
	NotRecipients []string `json:"notRecipients"` // members of the target now that it is not encrypted to
	Hash          string   `json:"hash"`          // the value's, as statuses and --wait carry it
	Revision      int64    `json:"modRevision"`
}

// listedSecret is a registry value that is a secret, decoded.
type listedSecret struct {
	registry.Listed
	file reconcile.ConfigFile
}

// listSecrets are the secrets of tg (every target: nil).
func listSecrets(ctx context.Context, reg *registry.Client, tg *registry.Target) ([]listedSecret, error) {
	ls, err := reg.List(ctx, tg)
	if err != nil {
		return nil, err
	}
	var out []listedSecret
	for _, l := range ls {
		if !reconcile.IsConfigPath(l.Unit) {
			continue
		}
		if cf, err := reconcile.DecodeConfigFile(l.Value); err == nil && cf.Secret {
			out = append(out, listedSecret{l, cf})
		}
	}
	return out, nil
}

// optionalTarget is --host, --group or --selector, or nil for every target.
func optionalTarget(tf *targetFlags) (*registry.Target, error) {
	if tf.host == "" && tf.group == "" && tf.selector == "" {
		return nil, nil
	}
	tg, err := tf.target()
	return &tg, err
}

func newSecretsLsCmd() *cobra.Command {
	var (
		ef     etcdFlags
		tf     targetFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "ls [--host H | --group G] [--json]",
		Short: "List the secrets of a target (every target by default): whom each is encrypted to, and which members cannot read it",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			tp, err := optionalTarget(&tf)
			if err != nil {
				return err
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				rows, err := secretRows(ctx, reg, tp)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), rows)
				}
				return printSecretRows(cmd.OutOrStdout(), rows)
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	tf.bind(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func secretRows(ctx context.Context, reg *registry.Client, tp *registry.Target) ([]secretRow, error) {
	secrets, err := listSecrets(ctx, reg, tp)
	if err != nil {
		return nil, err
	}
	known, err := reg.KnownHosts(ctx)
	if err != nil {
		return nil, err
	}
	rows := []secretRow{}
	for _, s := range secrets {
		now := []string{s.Host}
		if s.Group != "" {
			now = members(s.Group, known)
		}
		var not []string
		for _, h := range now {
			if !slices.Contains(s.file.To, h) {
				not = append(not, h)
			}
		}
		rows = append(rows, secretRow{
			Target: s.Target.String(), Key: s.Unit, Mode: fmt.Sprintf("%04o", uint32(s.file.Mode.Perm())),
			Owner: cmpOr(s.file.Owner, reconcile.DefaultOwner), To: s.file.To, NotRecipients: not,
			Hash: reconcile.Hash(s.Value), Revision: s.ModRevision,
		})
	}
	return rows, nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func printSecretRows(out io.Writer, rows []secretRow) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tKEY\tMODE\tOWNER\tTO\tNOT RECIPIENTS")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Target, r.Key, r.Mode, r.Owner, strings.Join(r.To, ","), orDash(strings.Join(r.NotRecipients, ",")))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if len(r.NotRecipients) > 0 {
			fmt.Fprintf(out, "\n%s cannot read some secrets: agentd secrets rekey --%s --identity ADMIN_KEY\n", strings.Join(r.NotRecipients, ", "), strings.Replace(strings.TrimSuffix(r.Target, "/"), "s/", " ", 1))
			break
		}
	}
	return nil
}

func newSecretsAcceptCmd() *cobra.Command {
	var (
		ef   etcdFlags
		pins string
	)
	cmd := &cobra.Command{
		Use:   "accept HOST...",
		Short: "Pin each host's recipient as its agent publishes it now (after a reinstall, or a new --identity)",
		Long: `Pin each host's recipient as its agent publishes it in the registry now, replacing
the one pinned before: do it once you know why it changed (the host was
reinstalled, or its agent was given another --identity). The next
"unit put --secret" or "secrets rekey" encrypts to it.`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, hosts []string) error {
			s := &secretFlags{pins: pins}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				return s.accept(ctx, cmd.OutOrStdout(), reg, hosts)
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	bindPinsFlag(cmd, &pins)
	return cmd
}

// accept pins each host's published recipient; nothing is saved when one
// host has none.
func (s *secretFlags) accept(ctx context.Context, out io.Writer, reg *registry.Client, hosts []string) error {
	path, err := s.pinsPath()
	if err != nil {
		return err
	}
	pins, err := secret.LoadPins(path)
	if err != nil {
		return err
	}
	known, err := reg.KnownHosts(ctx)
	if err != nil {
		return err
	}
	var lines []string
	for _, h := range hosts {
		i := slices.IndexFunc(known, func(k registry.KnownHost) bool { return k.Host == h })
		switch {
		case i < 0:
			return withCode(exitUsage, fmt.Errorf("secrets accept: no agent has joined as %s; nothing pinned", h))
		case known[i].Recipient == "":
			return withCode(exitUsage, fmt.Errorf("secrets accept: %s publishes no recipient (its agent is from before secrets); nothing pinned", h))
		}
		r := known[i].Recipient
		state, old := pins.Check(h, r)
		if err := pins.Pin(h, r); err != nil {
			return err
		}
		switch state {
		case secret.PinSame:
			lines = append(lines, fmt.Sprintf("%s: %s (unchanged)", h, r))
		case secret.PinNew:
			lines = append(lines, fmt.Sprintf("%s: (none) → %s", h, r))
		default:
			lines = append(lines, fmt.Sprintf("%s: %s → %s", h, old, r))
		}
	}
	if err := pins.Save(); err != nil {
		return err
	}
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
	fmt.Fprintf(out, "pinned in %s\n", path)
	return nil
}

func newSecretsRekeyCmd() *cobra.Command {
	var (
		ef       etcdFlags
		tf       targetFlags
		sf       secretFlags
		identity string
		reason   string
	)
	cmd := &cobra.Command{
		Use:   "rekey (--host H | --group G) --identity ADMIN_KEY [--admin-recipient R]...",
		Short: "Re-encrypt every secret of a target to its hosts now (a host that joined later), with an admin's key",
		Long: `Decrypt every secret of the target with ADMIN_KEY — an age identity file
(age-keygen's, or an agent's identity.age) or an SSH ed25519 private key whose
recipient was an --admin-recipient of the put — and encrypt each again to the
target's hosts now (for a group: every member, live or down; pins apply as for
"unit put --secret"), to ADMIN_KEY's own recipient, and to each
--admin-recipient. All are stored in one transaction (history keeps the
previous versions), and only if none changed since they were read. A secret
ADMIN_KEY cannot decrypt is an error naming it; nothing is stored.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			tg, err := tf.target()
			if err != nil {
				return err
			}
			if identity == "" {
				return withCode(exitUsage, errors.New("secrets rekey: give the admin's key: --identity ADMIN_KEY"))
			}
			if err := sf.checkAdmins(); err != nil {
				return err
			}
			if _, err := reasonFlag(cmd); err != nil {
				return err
			}
			id, err := loadAdminIdentity(identity)
			if err != nil {
				return withCode(exitUsage, fmt.Errorf("secrets rekey --identity: %w", err))
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				return sf.rekey(ctx, cmd, reg, tg, id)
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	tf.bind(cmd)
	sf.bind(cmd, false)
	cmd.Flags().StringVar(&identity, "identity", "", "the admin's key: an age identity file (AGE-SECRET-KEY-1…) or an SSH ed25519 private key")
	cmd.Flags().StringVar(&reason, "reason", "", reasonHelp)
	bindKeep(cmd)
	bindSign(cmd)
	return cmd
}

// rekey re-encrypts tg's secrets in one compare-and-swap transaction.
func (s *secretFlags) rekey(ctx context.Context, cmd *cobra.Command, reg *registry.Client, tg registry.Target, id *adminIdentity) error {
	secrets, err := listSecrets(ctx, reg, &tg)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if len(secrets) == 0 {
		fmt.Fprintf(out, "%s has no secrets: nothing to rekey\n", tg)
		return nil
	}
	plain := make([]reconcile.ConfigFile, len(secrets))
	var errs []error
	for i, sc := range secrets {
		p, err := id.decrypt(sc.file.Content)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: cannot decrypt with %s: %w (encrypted to %s)", sc.Key, id.path, err, strings.Join(sc.file.To, ", ")))
			continue
		}
		plain[i] = sc.file
		plain[i].Content = p
	}
	if len(errs) > 0 {
		return fmt.Errorf("secrets rekey: %w; nothing stored", errors.Join(errs...))
	}
	to, err := s.resolve(ctx, reg, tg, []string{id.recipient}, cmd.ErrOrStderr(), false)
	if err != nil {
		return err
	}
	units := map[string][]byte{}
	opts := writeOptions(cmd)
	for i, sc := range secrets {
		if units[sc.Unit], err = sealFile(plain[i], to); err != nil {
			return fmt.Errorf("secrets rekey %s: %w; nothing stored", sc.Key, err)
		}
		opts = append(opts, registry.IfModRevision(sc.Unit, sc.ModRevision))
	}
	rev, err := reg.Put(ctx, tg, units, opts...)
	if errors.Is(err, registry.ErrConflict) {
		return fmt.Errorf("secrets rekey: %w; nothing stored: run it again", err)
	}
	if err != nil {
		return writeError(err)
	}
	for _, sc := range secrets {
		fmt.Fprintf(out, "rekeyed %s/units/%s to %s (hash %s, revision %d)\n", tg, sc.Unit, strings.Join(to.hosts, ", "), short(reconcile.Hash(units[sc.Unit])), rev)
	}
	return nil
}

// adminIdentity is an operator's key to decrypt secrets with (rekey).
type adminIdentity struct {
	path, recipient string
	decrypt         func(ciphertext []byte) ([]byte, error)
}

// loadAdminIdentity reads an age identity file (X25519, as age-keygen or
// secret.LoadOrCreate write it) or an SSH ed25519 private key. Like ssh,
// it refuses a key file others may read.
func loadAdminIdentity(path string) (*adminIdentity, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, &secret.ModeError{Path: path, Mode: perm}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if !bytes.Contains(b, []byte("AGE-SECRET-KEY-")) {
		id, err := secret.LoadSSH(path)
		if err != nil {
			return nil, fmt.Errorf("%w (an age identity file holds an AGE-SECRET-KEY-1… line)", err)
		}
		return &adminIdentity{path: path, recipient: id.Recipient(), decrypt: id.Decrypt}, nil
	}
	ids, err := age.ParseIdentities(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	x, ok := ids[0].(*age.X25519Identity)
	if !ok {
		return nil, fmt.Errorf("%s: its first identity is not an X25519 one (AGE-SECRET-KEY-1…)", path)
	}
	return &adminIdentity{path: path, recipient: x.Recipient().String(), decrypt: func(ct []byte) ([]byte, error) { return ageDecrypt(ct, ids) }}, nil
}

// ageDecrypt decrypts an armoured (or binary) age ciphertext with any of
// ids, as secret.Identity.Decrypt does for one.
func ageDecrypt(ct []byte, ids []age.Identity) ([]byte, error) {
	var src io.Reader = bytes.NewReader(ct)
	if secret.IsArmored(ct) {
		src = armor.NewReader(src)
	}
	r, err := age.Decrypt(src, ids...)
	if err != nil {
		var noMatch *age.NoIdentityMatchError
		if errors.As(err, &noMatch) {
			return nil, secret.ErrNotRecipient
		}
		return nil, fmt.Errorf("%w: %v", secret.ErrCorrupt, err)
	}
	p, err := io.ReadAll(io.LimitReader(r, secret.MaxPlaintext+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", secret.ErrCorrupt, err)
	}
	if len(p) > secret.MaxPlaintext {
		return nil, fmt.Errorf("the secret is over the limit of %d bytes", secret.MaxPlaintext)
	}
	return p, nil
}

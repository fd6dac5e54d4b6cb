package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/registry"
)

type rbacOptions struct {
	host         string
	groups       []string
	prefix       string
	passwordFile string
	noPassword   bool
	json         bool
}

func newRbacCmd() *cobra.Command {
	o := &rbacOptions{}
	cmd := &cobra.Command{
		Use:   "rbac --host H [--group G]…",
		Short: "Print the etcdctl commands that create a least-privilege etcd role and user for one host's agent",
		Long: `Print the etcdctl commands that create the etcd role and user
agentd-host-<H> for the agent of host H, with exactly the permissions that
agent needs, and nothing else (see "Least privilege in etcd" in the README):

  read       <prefix>/                  (one key: the connection probe)
  read       <prefix>/hosts/H/          its own unit keys
  readwrite  <prefix>/agents/H          (one key: its membership record)
  readwrite  <prefix>/status/H/         its statuses and pass record
  readwrite  <prefix>/members/H         (one key: its member record, no lease)
  readwrite  <prefix>/facts/H           (one key: its facts, for previews)
  read       <prefix>/groups/G/         each group's unit keys
  readwrite  <prefix>/halts/groups/G/   each group's rollout halts
  readwrite  <prefix>/locks/groups/G/   each group's MaxUnavailable= queues

Run them as etcd's root user, with auth enabled (etcdctl auth enable), e.g.
  agentd rbac --host h1 --group web --password-file h1.pw |
    ETCDCTL_ENDPOINTS=https://etcd1:2379 ETCDCTL_USER=root ETCDCTL_PASSWORD=… sh
then start that host's agent with --etcd-user agentd-host-h1 and
--etcd-password-file (the same password). Without --password-file,
"etcdctl user add" prompts for the password: paste the commands into a
terminal rather than piping them into sh. Give --group exactly as the
agent's own --group flags. To change a host's groups, delete its role first
(etcdctl role delete agentd-host-H) and run the new commands. Nothing here
talks to etcd.`,
		Example: `  agentd rbac --host h1 --group web --group all
  agentd rbac --host h1 --group web --password-file /root/h1.pw | sh   # the password from the file (stdin), never in argv
  agentd rbac --host h1 --no-password   # client-certificate auth: the certificate's CN is agentd-host-h1`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return printRbac(cmd.OutOrStdout(), o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.host, "host", "", "the agent's --host (required)")
	fs.StringSliceVar(&o.groups, "group", []string{"all"}, "a group the agent is in, as its --group (repeatable)")
	fs.StringVar(&o.prefix, "prefix", registry.DefaultPrefix, "registry key prefix, as the agent's --prefix")
	fs.StringVar(&o.passwordFile, "password-file", "", "make `etcdctl user add` read the password from this file (stdin) instead of prompting")
	fs.BoolVar(&o.noPassword, "no-password", false, "create the user without a password, for client-certificate auth (certificate CN = the user name)")
	fs.BoolVar(&o.json, "json", false, "print the role and its permissions as JSON instead of etcdctl commands")
	return cmd
}

func printRbac(w io.Writer, o *rbacOptions) error {
	if o.host == "" {
		return withCode(exitUsage, fmt.Errorf("--host is required: the host name the agent runs with (its --host)"))
	}
	if o.passwordFile != "" && o.noPassword {
		return withCode(exitUsage, fmt.Errorf("--password-file and --no-password exclude each other"))
	}
	perms, err := registry.AgentPermissions(o.prefix, o.host, o.groups)
	if err != nil {
		return withCode(exitUsage, err)
	}
	name := registry.AgentRole(o.host)
	if o.json {
		type perm struct {
			Key        string `json:"key"`
			Prefix     bool   `json:"prefix"`
			Permission string `json:"permission"`
			Why        string `json:"why"`
		}
		v := struct {
			Role        string `json:"role"`
			User        string `json:"user"`
			Permissions []perm `json:"permissions"`
		}{Role: name, User: name}
		for _, p := range perms {
			v.Permissions = append(v.Permissions, perm{p.Key, p.Prefix, p.Type(), p.Why})
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# etcd role and user for the agent of host %s (groups %s, prefix %s).\n",
		o.host, strings.Join(o.groups, ","), strings.TrimRight(o.prefix, "/"))
	b.WriteString("# Run as etcd's root user with auth enabled (ETCDCTL_ENDPOINTS, ETCDCTL_USER=root, ETCDCTL_PASSWORD or TLS).\n")
	fmt.Fprintf(&b, "etcdctl role add %s\n", name)
	for _, p := range perms {
		fmt.Fprintf(&b, "# %s\n", p.Why)
		prefix := ""
		if p.Prefix {
			prefix = " --prefix=true"
		}
		fmt.Fprintf(&b, "etcdctl role grant-permission %s%s %s %s\n", name, prefix, p.Type(), shellQuote(p.Key))
	}
	switch {
	case o.noPassword:
		b.WriteString("# no password: the agent authenticates with a client certificate whose CN is the user name\n")
		fmt.Fprintf(&b, "etcdctl user add %s --no-password\n", name)
	case o.passwordFile != "":
		fmt.Fprintf(&b, "etcdctl user add %s --interactive=false < %s\n", name, shellQuote(o.passwordFile))
	default:
		b.WriteString("# prompts for the password (give the agent the same one with --etcd-password-file)\n")
		fmt.Fprintf(&b, "etcdctl user add %s\n", name)
	}
	fmt.Fprintf(&b, "etcdctl user grant-role %s %s\n", name, name)
	_, err = io.WriteString(w, b.String())
	return err
}

// shellQuote quotes s for sh when it holds anything but plain characters.
func shellQuote(s string) string {
	plain := s != ""
	for _, r := range s {
		if !(isAlnumRune(r) || strings.ContainsRune("/._-@:=,+%", r)) {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func isAlnumRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}

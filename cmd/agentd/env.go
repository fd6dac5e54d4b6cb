package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Every flag can also be set from the environment, as AGENTD_<FLAG>, and
// `agentd doctor` reads the same variables from the agent's environment
// file (/etc/default/agentd). The command line wins over the environment,
// the environment over the file.

// envVar is the variable that sets a flag: AGENTD_ETCD_ENDPOINTS for
// --etcd-endpoints.
func envVar(flag string) string {
	return "AGENTD_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyEnv fills every flag the user did not set from AGENTD_<FLAG>, e.g.
// AGENTD_ETCD_ENDPOINTS for --etcd-endpoints.
func applyEnv(cmd *cobra.Command) error {
	return setFlagsFromVars(cmd.Flags(), os.LookupEnv, "")
}

// applyEnvVars sets every flag that neither the command line nor the
// environment set from AGENTD_<FLAG> in vars.
func applyEnvVars(fs *pflag.FlagSet, vars map[string]string) error {
	return setFlagsFromVars(fs, func(name string) (string, bool) {
		if _, inEnv := os.LookupEnv(name); inEnv {
			return "", false
		}
		v, ok := vars[name]
		return v, ok
	}, " (env file)")
}

// setFlagsFromVars sets every flag the command line did not set from its
// variable, looked up with lookup; from says in an error where the value
// came from.
func setFlagsFromVars(fs *pflag.FlagSet, lookup func(name string) (string, bool), from string) error {
	var err error
	fs.VisitAll(func(fl *pflag.Flag) {
		if fl.Changed || err != nil {
			return
		}
		name := envVar(fl.Name)
		if v, ok := lookup(name); ok {
			if e := fl.Value.Set(v); e != nil {
				err = withCode(exitUsage, fmt.Errorf("%s=%q%s: %w", name, v, from, e))
			}
		}
	})
	return err
}

// readEnvFile reads KEY=VALUE lines the way systemd's EnvironmentFile=
// does for simple files: blank lines and lines starting with # or ; are
// skipped, "export " is not understood, values may be wrapped in single or
// double quotes.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want KEY=VALUE, got %q", path, n, line)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		vars[k] = v
	}
	return vars, sc.Err()
}

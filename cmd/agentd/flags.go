package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/agentd/agentd/registry"
)

// defaultEndpoint is where `agentd run` with no --etcd-endpoints serves its
// embedded etcd, so the client commands find it with no flags at all.
const defaultEndpoint = "http://127.0.0.1:2379"

// etcdFlags are the registry connection flags every registry command takes.
type etcdFlags struct {
	endpoints []string
	prefix    string
	user      string
	password  string
	cert      string
	key       string
	ca        string
	timeout   time.Duration
}

func (f *etcdFlags) bind(fs *pflag.FlagSet, endpointsHelp string) {
	fs.StringSliceVar(&f.endpoints, "etcd-endpoints", nil, endpointsHelp)
	fs.StringVar(&f.prefix, "prefix", registry.DefaultPrefix, "registry key prefix")
	fs.StringVar(&f.user, "etcd-user", "", "etcd user name")
	fs.StringVar(&f.password, "etcd-password", "", "etcd password (prefer the AGENTD_ETCD_PASSWORD environment variable)")
	fs.StringVar(&f.cert, "etcd-cert", "", "client certificate for etcd TLS")
	fs.StringVar(&f.key, "etcd-key", "", "client key for etcd TLS")
	fs.StringVar(&f.ca, "etcd-ca", "", "CA bundle to verify etcd's certificate")
	fs.DurationVar(&f.timeout, "etcd-dial-timeout", 5*time.Second, "how long to try reaching etcd before giving up")
}

func (f *etcdFlags) config(endpoints []string) registry.Config {
	return registry.Config{
		Endpoints: endpoints, Prefix: f.prefix,
		Username: f.user, Password: f.password,
		CertFile: f.cert, KeyFile: f.key, CAFile: f.ca,
		DialTimeout: f.timeout,
	}
}

// dial connects a client command to etcd; no endpoints means the local
// agent's embedded etcd.
func (f *etcdFlags) dial(ctx context.Context) (*registry.Client, error) {
	eps := f.endpoints
	if len(eps) == 0 {
		eps = []string{defaultEndpoint}
	}
	c, err := registry.Dial(ctx, f.config(eps))
	if err != nil {
		return nil, fmt.Errorf("%w (start `agentd run`, or pass --etcd-endpoints)", err)
	}
	return c, nil
}

// applyEnv fills every flag the user did not set from AGENTD_<FLAG>, e.g.
// AGENTD_ETCD_ENDPOINTS for --etcd-endpoints.
func applyEnv(cmd *cobra.Command) error {
	var err error
	cmd.Flags().VisitAll(func(fl *pflag.Flag) {
		if fl.Changed || err != nil {
			return
		}
		name := "AGENTD_" + strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if e := fl.Value.Set(v); e != nil {
				err = withCode(exitUsage, fmt.Errorf("%s=%q: %w", name, v, e))
			}
		}
	})
	return err
}

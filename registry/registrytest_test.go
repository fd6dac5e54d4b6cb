package registry_test

import (
	"testing"

	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// init hands registrytest's helpers to the tests of package registry: see
// etcd_test.go.
func init() {
	registry.StartTestEtcd = registrytest.StartEtcd
	registry.NewTestClient = registrytest.NewClient
	registry.RawTestClient = registrytest.RawClient
	registry.TestSocketDir = registrytest.SocketDir
	registry.WriteTestCerts = func(t testing.TB) *registry.TestCerts { return testCerts(registrytest.WriteCerts(t)) }
	registry.StartTestEtcdTLS = func(t testing.TB) (*registry.Embedded, *registry.TestCerts) {
		e, c := registrytest.StartEtcdTLS(t)
		return e, testCerts(c)
	}
}

func testCerts(c *registrytest.Certs) *registry.TestCerts {
	return &registry.TestCerts{
		CA: c.CA, ServerCert: c.ServerCert, ServerKey: c.ServerKey, ClientCert: c.ClientCert, ClientKey: c.ClientKey,
		StrangerCA: c.StrangerCA, StrangerCert: c.StrangerCert, StrangerKey: c.StrangerKey,
	}
}

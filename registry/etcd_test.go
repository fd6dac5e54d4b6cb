package registry

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The etcd and certificate helpers of this package's tests. They live in
// registrytest, which imports this package, so these tests (package
// registry) cannot import it; registrytest_test.go, compiled into the same
// test binary as package registry_test, sets these from it before any test
// runs. One copy of each helper, none of it in the agent binary.
var (
	StartTestEtcd    func(t testing.TB) *Embedded                         // registrytest.StartEtcd
	NewTestClient    func(t testing.TB, endpoint string) *Client          // registrytest.NewClient
	RawTestClient    func(t testing.TB, endpoint string) *clientv3.Client // registrytest.RawClient
	TestSocketDir    func(t testing.TB) string                            // registrytest.SocketDir
	WriteTestCerts   func(t testing.TB) *TestCerts                        // registrytest.WriteCerts
	StartTestEtcdTLS func(t testing.TB) (*Embedded, *TestCerts)           // registrytest.StartEtcdTLS
)

// TestCerts holds the file names of a registrytest.Certs.
type TestCerts struct {
	CA                        string
	ServerCert, ServerKey     string
	ClientCert, ClientKey     string
	StrangerCA                string
	StrangerCert, StrangerKey string
}

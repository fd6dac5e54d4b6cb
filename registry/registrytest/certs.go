package registrytest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentd/agentd/registry"
)

// Certs are PEM files for a TLS etcd in tests: a CA, a server
// certificate for 127.0.0.1 and localhost, a client certificate signed by
// the CA, and one signed by another CA (which the server must refuse).
type Certs struct {
	CA                        string // the CA that signs all but the Stranger* files
	ServerCert, ServerKey     string
	ClientCert, ClientKey     string
	StrangerCA                string // an unrelated CA
	StrangerCert, StrangerKey string // a client certificate it signed

	dir    string
	serial int64
}

// WriteCerts writes a fresh set of Certs into a temporary directory.
func WriteCerts(t testing.TB) *Certs {
	t.Helper()
	c := &Certs{dir: t.TempDir()}
	caKey, ca, caFile := c.newCA(t, "ca", "agentd test CA")
	strangerKey, stranger, strangerFile := c.newCA(t, "stranger-ca", "unrelated CA")
	c.CA, c.StrangerCA = caFile, strangerFile
	c.ServerCert, c.ServerKey = c.leaf(t, "server", "etcd", ca, caKey, x509.ExtKeyUsageServerAuth)
	c.ClientCert, c.ClientKey = c.leaf(t, "client", "agentd-client", ca, caKey, x509.ExtKeyUsageClientAuth)
	c.StrangerCert, c.StrangerKey = c.leaf(t, "stranger", "stranger", stranger, strangerKey, x509.ExtKeyUsageClientAuth)
	return c
}

func (c *Certs) newCA(t testing.TB, file, name string) (*ecdsa.PrivateKey, *x509.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(c.serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert, c.write(t, file+".pem", "CERTIFICATE", der)
}

func (c *Certs) leaf(t testing.TB, file, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(c.serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.IPAddresses, tmpl.DNSNames = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, []string{"localhost"}
		// etcd's HTTP gateway may reach etcd's gRPC through the TLS
		// listener, presenting the server's certificate as a client's.
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return c.write(t, file+".pem", "CERTIFICATE", der), c.write(t, file+"-key.pem", "EC PRIVATE KEY", kder)
}

func (c *Certs) write(t testing.TB, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// SocketDir returns a new private (0700) directory with a short path,
// removed when the test ends: unix socket paths are limited to 107 bytes,
// and t.TempDir's paths grow with the test's name.
func SocketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "agentd-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// StartEtcdTLS runs a real single-node etcd for a test the way `agentd
// run --embedded-listen https://…` does: its local listener is a unix
// socket (Endpoint), and TLSEndpoint is an https:// listener on a random
// loopback port that accepts only client certificates signed by certs.CA.
func StartEtcdTLS(t testing.TB) (*registry.Embedded, *Certs) {
	t.Helper()
	certs := WriteCerts(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := registry.StartEmbedded(ctx, registry.EmbedConfig{
		Dir:       t.TempDir(),
		ClientURL: "unix://" + filepath.Join(SocketDir(t), "etcd.sock"),
		TLSURL:    "https://127.0.0.1:0",
		CertFile:  certs.ServerCert, KeyFile: certs.ServerKey, ClientCAFile: certs.CA,
		ForTests: true,
	})
	if err != nil {
		t.Fatalf("start TLS test etcd: %v", err)
	}
	t.Cleanup(e.Close)
	return e, certs
}

// Package testport hands tests loopback ports for servers that stop and
// start again on the same port (an etcd member restarted, an embedded etcd
// reopened on its URL). A port from the kernel (":0") is in the ephemeral
// range: while its server is down, another test's listener or any outgoing
// connection may take it, and the restart fails with "address already in
// use" (seen in CI). These ports are below that range and handed out once
// per test binary.
package testport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var used struct {
	sync.Mutex
	ports map[int]bool
}

// Restartable returns a loopback TCP port that is free now, was not
// handed out before in this process, and lies below the kernel's ephemeral
// port range.
func Restartable(t testing.TB) int {
	t.Helper()
	lo, hi := 10000, ephemeralLow()-1
	if hi-lo < 1000 {
		t.Fatalf("the ephemeral port range starts at %d: no room below it for restartable ports", hi+1)
	}
	used.Lock()
	defer used.Unlock()
	if used.ports == nil {
		used.ports = map[int]bool{}
	}
	for range 1000 {
		p := lo + rand.N(hi-lo)
		if used.ports[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		used.ports[p] = true
		return p
	}
	t.Fatal("no free loopback port below the ephemeral range")
	return 0
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}

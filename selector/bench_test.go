package selector

import (
	"fmt"
	"testing"
	"time"
)

// hostLabels are n hosts' label sets of 8 labels each, the five facts an
// agent publishes and three given ones, varied so a selector matches some.
func hostLabels(n int) []map[string]string {
	envs, arches, ids := []string{"prod", "staging", "dev"}, []string{"amd64", "arm64"}, []string{"debian", "ubuntu", "fedora"}
	hosts := make([]map[string]string, n)
	for i := range hosts {
		hosts[i] = map[string]string{
			"hostname":         fmt.Sprintf("web-%05d", i),
			"arch":             arches[i%len(arches)],
			"os.id":            ids[i%len(ids)],
			"os.version_id":    "12",
			"systemd.version":  "257",
			"env":              envs[i%len(envs)],
			"rack":             fmt.Sprintf("r%d", i%40),
			"example.com/team": "storage",
		}
	}
	return hosts
}

// benchmarkMatch evaluates one selector of three requirements against n
// hosts per iteration and reports the cost per host.
func benchmarkMatch(b *testing.B, n int) {
	s, err := Parse("env=prod,arch in (arm64,riscv64),!drain")
	if err != nil {
		b.Fatal(err)
	}
	hosts := hostLabels(n)
	matched := 0
	start := time.Now()
	for b.Loop() {
		matched = 0
		for _, h := range hosts {
			if s.Matches(h) {
				matched++
			}
		}
	}
	if matched == 0 || matched == n {
		b.Fatalf("%d of %d hosts matched: the selector does not discriminate", matched, n)
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*n), "ns/host")
}

// go test ./selector -run '^$' -bench Match
func BenchmarkMatch1000Hosts(b *testing.B)  { benchmarkMatch(b, 1000) }
func BenchmarkMatch10000Hosts(b *testing.B) { benchmarkMatch(b, 10000) }

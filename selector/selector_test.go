package selector

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"empty matches all", "", ""},
		{"blank matches all", "  \t", ""},
		// Kubernetes' documented examples (concepts/overview/working-with-objects/labels).
		{"k8s equality", "environment = production", "environment=production"},
		{"k8s inequality", "tier != frontend", "tier!=frontend"},
		{"k8s both", "environment=production,tier!=frontend", "environment=production,tier!=frontend"},
		{"k8s in", "environment in (production, qa)", "environment in (production,qa)"},
		{"k8s notin", "tier notin (frontend, backend)", "tier notin (backend,frontend)"},
		{"k8s exists", "partition", "partition"},
		{"k8s does not exist", "!partition", "!partition"},
		{"k8s mixed", "partition,environment notin (qa)", "environment!=qa,partition"},
		// Spellings of one selector.
		{"double equals", "env==prod", "env=prod"},
		{"in with one value is =", "env in (prod)", "env=prod"},
		{"notin with one value is !=", "env notin (prod)", "env!=prod"},
		{"sorted by key", "zone=a,arch=arm64,env=prod", "arch=arm64,env=prod,zone=a"},
		{"values sorted and distinct", "rack in (r3,r1,r3,r2)", "rack in (r1,r2,r3)"},
		{"repeats dropped", "env=prod, env == prod,env in (prod)", "env=prod"},
		{"one key, several ops", "env!=dev,env,env=prod", "env=prod,env!=dev,env"},
		{"whitespace everywhere", " env \t=\tprod ,\n! drain , rack in( r1 ,r2 ) ", "!drain,env=prod,rack in (r1,r2)"},
		{"no space before paren", "rack notin(r1,r2)", "rack notin (r1,r2)"},
		{"empty value", "env=", "env="},
		{"empty value then more", "env=,arch=amd64", "arch=amd64,env="},
		{"empty value in set", "env in (prod,)", "env in (,prod)"},
		{"empty set is the empty value", "env in ()", "env="},
		{"prefixed key", "example.com/tier=db", "example.com/tier=db"},
		{"dotted name", "os.id=debian,os.version_id=12", "os.id=debian,os.version_id=12"},
		{"in as a value", "mode=in", "mode=in"},
		{"in as a key", "in in (a)", "in=a"},
		{"notin as a bare key", "notin", "notin"},
		{"63 characters", "k=" + strings.Repeat("v", 63), "k=" + strings.Repeat("v", 63)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.in)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.in, err)
			}
			if got := s.String(); got != tc.want {
				t.Fatalf("Parse(%q).String() = %q, want %q", tc.in, got, tc.want)
			}
			again, err := Parse(s.String())
			if err != nil || again.String() != s.String() {
				t.Fatalf("String %q re-parses to %q, %v", s, again, err)
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		pos      int
		text     string // the offending token
		msg      string // part of the message
	}{
		{"trailing comma", "env=prod,", 10, "", "requirement after"},
		{"double comma", "env=prod,,arch", 10, ",", "label key"},
		{"leading comma", ",env", 1, ",", "label key"},
		{"no key", "=prod", 1, "=", "label key"},
		{"bang alone", "!", 2, "", "label key"},
		{"bang with op", "!env=prod", 5, "=", "\",\" or the end"},
		{"two values", "env=prod dev", 10, "dev", "\",\" or the end"},
		{"space in key", "my env=prod", 4, "env", "=, ==, !="},
		{"unknown operator", "env ~ prod", 5, "~", "=, ==, !="},
		{"greater than", "replicas>3", 1, "replicas>3", "'>'"},
		{"in without parens", "env in prod", 8, "prod", "\"(\" after in"},
		{"notin unclosed", "env notin (a,b", 15, "", "in the values of notin"},
		{"nested parens", "env in ((a))", 9, "(", "in the values of in"},
		{"paren after =", "env=(prod)", 5, "(", "label value"},
		{"bad value char", "env=pr:od", 5, "pr:od", "':'"},
		{"value starts with dot", "env=.prod", 5, ".prod", "start and end"},
		{"value too long", "k=" + strings.Repeat("v", 64), 3, strings.Repeat("v", 64), "64 characters"},
		{"key too long", strings.Repeat("k", 64), 1, strings.Repeat("k", 64), "64 characters"},
		{"bad value in set", "env in (prod,-x)", 14, "-x", "start and end"},
		{"uppercase prefix", "Example.com/tier=db", 1, "Example.com/tier", "DNS subdomain"},
		{"empty prefix", "/tier", 1, "/tier", "empty prefix"},
		{"empty name", "example.com/=x", 1, "example.com/", "empty name"},
		{"two slashes", "a/b/c", 1, "a/b/c", "'/'"},
		{"non-ASCII", "env=prød", 5, "prød", "'ø'"},
		{"stray close", "env)", 4, ")", "=, ==, !="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.in)
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("Parse(%q) = %q, %v; want a *SyntaxError", tc.in, s, err)
			}
			if se.Pos != tc.pos || se.Text != tc.text || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Parse(%q): %v (Pos %d, Text %q); want Pos %d, Text %q, a message with %q",
					tc.in, err, se.Pos, se.Text, tc.pos, tc.text, tc.msg)
			}
		})
	}
}

func TestMatches(t *testing.T) {
	web := map[string]string{"env": "prod", "arch": "arm64", "rack": "r12", "os.id": "debian", "empty": ""}
	bare := map[string]string{}
	for _, tc := range []struct {
		sel       string
		web, bare bool
	}{
		{"", true, true},
		{"env=prod", true, false},
		{"env==dev", false, false},
		{"env!=dev", true, true}, // no env label: != holds
		{"env!=prod", false, true},
		{"env in (dev,prod)", true, false},
		{"env notin (dev,prod)", false, true},
		{"env notin (dev,qa)", true, true},
		{"env", true, false},
		{"!env", false, true},
		{"!zone", true, true},
		{"empty=", true, false},
		{"empty", true, false},
		{"env=", false, false},
		{"env=prod,arch=arm64,rack in (r11,r12)", true, false},
		{"env=prod,arch=amd64", false, false},
		{"os.id in (debian,ubuntu),!drain", true, false},
	} {
		t.Run(tc.sel, func(t *testing.T) {
			s, err := Parse(tc.sel)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Matches(web); got != tc.web {
				t.Errorf("Matches(web) = %v, want %v", got, tc.web)
			}
			if got := s.Matches(bare); got != tc.bare {
				t.Errorf("Matches(no labels) = %v, want %v", got, tc.bare)
			}
			if got := s.Matches(nil); got != tc.bare {
				t.Errorf("Matches(nil) = %v, want %v", got, tc.bare)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	good := [][2]string{
		{"rack", "r12"}, {"env", ""}, {"os.id", "ubuntu"}, {"os.version_id", "24.04"},
		{"example.com/tier", "db"}, {"a-b.c/X_y.Z", "A-1_b.2"}, {"k", strings.Repeat("v", 63)},
		{strings.Repeat("p", 253) + "/k", "v"},
	}
	for _, kv := range good {
		if err := Validate(kv[0], kv[1]); err != nil {
			t.Errorf("Validate(%q, %q): %v", kv[0], kv[1], err)
		}
	}
	bad := [][2]string{
		{"", "v"}, {"-rack", "v"}, {"rack.", "v"}, {"ra ck", "v"}, {"Ex.com/k", "v"}, {"ex..com/k", "v"},
		{"-ex.com/k", "v"}, {"ex.com/", "v"}, {strings.Repeat("p", 254) + "/k", "v"}, {"k", "v w"},
		{"k", "_v"}, {"k", strings.Repeat("v", 64)}, {"k", "v/w"}, {"k", "v=w"},
	}
	for _, kv := range bad {
		err := Validate(kv[0], kv[1])
		if err == nil {
			t.Errorf("Validate(%q, %q) accepted", kv[0], kv[1])
			continue
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%q", kv[0])) && !strings.Contains(err.Error(), fmt.Sprintf("%q", kv[1])) {
			t.Errorf("Validate(%q, %q): %v does not name the bad text", kv[0], kv[1], err)
		}
	}
}

// FuzzParse: Parse never panics; what it accepts has a canonical form that
// parses back to itself and selects the same hosts.
//
//	go test ./selector -run '^$' -fuzz '^FuzzParse$' -fuzztime 60s -parallel 1
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "env=prod", "tier != frontend", "environment in (production, qa)", "tier notin (frontend, backend)",
		"partition", "!partition", "partition,environment notin (qa)", "env in ()", "env in (a,)", "k==v,k!=w",
		"example.com/tier=db", "os.id=debian,arch in (amd64,arm64),!drain", "env=prod,", "env in (a", "!",
	} {
		f.Add(s, "env", "prod")
	}
	f.Fuzz(func(t *testing.T, in, k, v string) {
		s, err := Parse(in)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || se.Pos < 1 || se.Pos > len(in)+1 {
				t.Fatalf("Parse(%q): %v: want a *SyntaxError inside the input", in, err)
			}
			return
		}
		canon := s.String()
		again, err := Parse(canon)
		if err != nil {
			t.Fatalf("Parse(%q).String() = %q does not parse: %v", in, canon, err)
		}
		if again.String() != canon {
			t.Fatalf("Parse(%q): String %q re-parses to %q", in, canon, again.String())
		}
		for _, labels := range []map[string]string{nil, {k: v}, {k: v, "env": "prod", "arch": "arm64"}} {
			if s.Matches(labels) != again.Matches(labels) {
				t.Fatalf("Parse(%q) and its String %q disagree on %v", in, canon, labels)
			}
		}
	})
}

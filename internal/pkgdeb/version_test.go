package pkgdeb

import (
	"os/exec"
	"testing"
)

func TestVersionFromGit(t *testing.T) {
	for _, c := range []struct {
		long    string
		commits int
		plain   string
		debian  string
	}{
		{"v1.2.3-0-gabc1234", 9, "v1.2.3", "1.2.3-1"},
		{"v1.2.3-5-gabc1234", 9, "v1.2.3-5-gabc1234", "1.2.3+git5.abc1234-1"},
		{"v1.2.3-5-gabc1234-dirty", 9, "v1.2.3-5-gabc1234-dirty", "1.2.3+git5.abc1234+dirty-1"},
		{"v1.2.3-0-gabc1234-dirty", 9, "v1.2.3-dirty", "1.2.3+dirty-1"},
		{"v1.3.0-rc1-0-gabc1234", 9, "v1.3.0-rc1", "1.3.0~rc1-1"},
		{"2.0-2-g0123456", 9, "2.0-2-g0123456", "2.0+git2.0123456-1"},
		{"abc1234", 262, "abc1234", "0.0~git262.abc1234-1"},
		{"1234567", 262, "1234567", "0.0~git262.1234567-1"}, // a hash of digits is no tag
		{"abc1234-dirty", 262, "abc1234-dirty", "0.0~git262.abc1234+dirty-1"},
	} {
		plain, debian, err := versionFromGit(c.long, c.commits)
		if err != nil || plain != c.plain || debian != c.debian {
			t.Errorf("versionFromGit(%q, %d) = %q, %q, %v; want %q, %q", c.long, c.commits, plain, debian, err, c.plain, c.debian)
		}
	}
	for _, bad := range []string{"release_1-0-gabc1234", "vX-0-gabc1234", "", "not a describe"} {
		if _, d, err := versionFromGit(bad, 3); err == nil {
			t.Errorf("versionFromGit(%q) = %q, want an error", bad, d)
		}
	}
}

func TestVersionFromDescribe(t *testing.T) {
	for in, want := range map[string]string{
		"v1.2.3":                  "1.2.3-1",
		"v1.2.3-dirty":            "1.2.3+dirty-1",
		"v1.2.3-5-gabc1234":       "1.2.3+git5.abc1234-1",
		"v1.2.3-5-gabc1234-dirty": "1.2.3+git5.abc1234+dirty-1",
		"0.9":                     "0.9-1",
	} {
		if got, err := versionFromDescribe(in); err != nil || got != want {
			t.Errorf("versionFromDescribe(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"abc1234", "dev", ""} {
		if got, err := versionFromDescribe(bad); err == nil {
			t.Errorf("versionFromDescribe(%q) = %q, want an error", bad, got)
		}
	}
}

// The versions sort as the commits do, by dpkg's own rules.
func TestVersionsSortAsDpkgDoes(t *testing.T) {
	dpkg, err := exec.LookPath("dpkg")
	if err != nil {
		needTool(t, "dpkg", err)
		return
	}
	order := []string{
		"0.0~git262.abc1234-1",
		"0.0~git263.0123456-1",
		"0.0~git263.0123456+dirty-1",
		"1.3.0~rc1-1",
		"1.3.0-1",
		"1.3.0+dirty-1",
		"1.3.0+git2.abc1234-1",
		"1.3.0+git10.0123456-1",
		"1.3.1-1",
	}
	for i := 1; i < len(order); i++ {
		if err := exec.Command(dpkg, "--compare-versions", order[i-1], "lt", order[i]).Run(); err != nil {
			t.Errorf("dpkg: %s is not < %s (%v)", order[i-1], order[i], err)
		}
	}
}

package pkgdeb

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// debianRevision is the Debian revision of every package this builder
// makes: it packages the tree as it is, so there is one packaging per
// upstream version.
const debianRevision = "1"

var (
	// describedTag is a describe string past a tag: TAG-N-gHASH[-dirty].
	describedTag = regexp.MustCompile(`^(.+)-([0-9]+)-g([0-9a-f]{4,})(-dirty)?$`)
	// bareHash is what --always prints without any tag: HASH[-dirty].
	bareHash = regexp.MustCompile(`^([0-9a-f]{4,})(-dirty)?$`)
	// upstreamChars is what Debian allows in an upstream version that has
	// a revision (deb-version(7)); it must start with a digit.
	upstreamChars = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~-]*$`)
)

// versionFromGit turns the output of `git describe --tags --long --always
// --dirty` (long: a tag is always followed by -N-gHASH, so a bare hash is
// never mistaken for a tag) and the number of commits of HEAD into the
// describe string `agentd --version` prints (that of git describe without
// --long) and the Debian version:
//
//	v1.2.3-0-gabc1234        → v1.2.3                  1.2.3-1
//	v1.2.3-5-gabc1234        → v1.2.3-5-gabc1234       1.2.3+git5.abc1234-1
//	v1.3.0-rc1-0-gabc1234    → v1.3.0-rc1              1.3.0~rc1-1
//	abc1234 (no tag, 262)    → abc1234                 0.0~git262.abc1234-1
//	… -dirty                 → … -dirty                …+dirty-1
//
// Versions sort as the commits do: a pre-release before its release, a
// commit after its tag, untagged history before the first tag.
func versionFromGit(long string, commits int) (describe, debian string, err error) {
	long = strings.TrimSpace(long)
	if m := describedTag.FindStringSubmatch(long); m != nil {
		tag, n, hash, dirty := m[1], m[2], m[3], m[4]
		describe = tag + "-" + n + "-g" + hash + dirty
		if n == "0" {
			describe = tag + dirty
		}
		up, err := upstreamOfTag(tag)
		if err != nil {
			return "", "", err
		}
		if n != "0" {
			up += "+git" + n + "." + hash
		}
		return describe, withRevision(up, dirty != ""), nil
	}
	if m := bareHash.FindStringSubmatch(long); m != nil {
		if commits <= 0 {
			return "", "", fmt.Errorf("git describe %q: no tag, and no commit count", long)
		}
		up := "0.0~git" + strconv.Itoa(commits) + "." + m[1]
		return long, withRevision(up, m[2] != ""), nil
	}
	return "", "", fmt.Errorf("git describe %q: not TAG-N-gHASH or HASH", long)
}

// versionFromDescribe is the Debian version of a describe string given by
// hand (a source tree without git): TAG or TAG-N-gHASH, with -dirty or not.
func versionFromDescribe(describe string) (string, error) {
	if m := describedTag.FindStringSubmatch(describe); m != nil {
		_, debian, err := versionFromGit(describe, 0)
		return debian, err
	}
	tag, dirty := strings.CutSuffix(describe, "-dirty")
	up, err := upstreamOfTag(tag)
	if err != nil {
		return "", err
	}
	return withRevision(up, dirty), nil
}

// upstreamOfTag maps a release tag to a Debian upstream version: v1.2.3 →
// 1.2.3, v1.3.0-rc1 → 1.3.0~rc1 (sorts before 1.3.0).
func upstreamOfTag(tag string) (string, error) {
	up := tag
	if len(up) > 1 && up[0] == 'v' && up[1] >= '0' && up[1] <= '9' {
		up = up[1:]
	}
	up = strings.ReplaceAll(up, "-", "~")
	if !upstreamChars.MatchString(up) {
		return "", fmt.Errorf("tag %q: a Debian version needs a tag like v1.2.3 (digits first; letters, digits and . + ~ - only)", tag)
	}
	return up, nil
}

func withRevision(upstream string, dirty bool) string {
	if dirty {
		upstream += "+dirty"
	}
	return upstream + "-" + debianRevision
}

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"
)

// newManPagesCmd is the hidden `agentd man-pages DIR`: it writes agentd(8)
// and one page per subcommand (agentd-unit-put(8), …), generated from this
// very command tree, into DIR. The .deb builder (internal/pkgdeb) runs it on
// the binary it packages, so the pages always match that binary's flags.
func newManPagesCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "man-pages DIR",
		Short:  "Write the man pages (section 8) of every command into DIR",
		Hidden: true,
		Args:   usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Reproducible pages: the date is SOURCE_DATE_EPOCH's when set
			// (the builder sets the commit's), else today.
			date := time.Now()
			if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
				sec, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					return withCode(exitUsage, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", s, err))
				}
				date = time.Unix(sec, 0).UTC()
			}
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true
			plainToMarkdown(root)
			// No Title: each page's is its own name (AGENTD-UNIT-PUT).
			return doc.GenManTree(root, &doc.GenManHeader{
				Section: "8",
				Date:    &date,
				Source:  "agentd " + version,
				Manual:  "System Administration",
			}, args[0])
		},
	}
}

// plainToMarkdown rewrites the help texts of cmd and its subcommands, written
// as plain text for the terminal, into the Markdown that cobra/doc feeds to
// md2man, so that the pages say what --help says: special characters are
// escaped (AGENTD_<FLAG> would lose "<FLAG>" as an HTML tag, "_" would start
// emphasis), and indented lines (the exit codes, lists) stay lines, as a
// preformatted block. It changes the commands in place: run it only on a tree
// that prints man pages and exits.
func plainToMarkdown(cmd *cobra.Command) {
	seen := map[*pflag.Flag]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Short = escapeMarkdown(c.Short)
		c.Long = textToMarkdown(c.Long)
		for _, fs := range []*pflag.FlagSet{c.LocalFlags(), c.InheritedFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				if !seen[f] {
					seen[f] = true
					f.Usage = escapeMarkdown(f.Usage)
				}
			})
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd)
}

// textToMarkdown turns plain text into Markdown: unindented lines are
// escaped prose (md2man joins a paragraph's lines and refills them);
// indented lines become a preformatted block, kept line by line.
func textToMarkdown(s string) string {
	var b strings.Builder
	code := false
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		indented := strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t")
		switch {
		case line == "":
			code = false
		case indented && !code:
			b.WriteString("\n") // a block needs a blank line before it
			code = true
		case !indented && code:
			b.WriteString("\n")
			code = false
		}
		if code {
			b.WriteString("    " + line + "\n")
		} else {
			b.WriteString(escapeMarkdown(line) + "\n")
		}
	}
	return b.String()
}

// markdownSpecial escapes the characters Markdown would read as markup.
var markdownSpecial = strings.NewReplacer(
	`\`, `\\`, "`", "\\`", `*`, `\*`, `_`, `\_`, `[`, `\[`, `]`, `\]`,
	`<`, `\<`, `>`, `\>`, `#`, `\#`, `|`, `\|`, `&`, `\&`,
)

// escapeMarkdown escapes s for use as Markdown prose, including a leading
// "-", "+" or "1." that would start a list.
func escapeMarkdown(s string) string {
	s = markdownSpecial.Replace(s)
	t := strings.TrimLeft(s, " ")
	if strings.HasPrefix(t, "- ") || strings.HasPrefix(t, "+ ") {
		return s[:len(s)-len(t)] + `\` + t
	}
	if i := strings.IndexFunc(t, func(r rune) bool { return r < '0' || r > '9' }); i > 0 && strings.HasPrefix(t[i:], ". ") {
		return s[:len(s)-len(t)] + t[:i] + `\` + t[i:]
	}
	return s
}

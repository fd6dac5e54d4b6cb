// Command mkdeb builds agentd's Debian package (`make deb`):
//
//	go run ./cmd/mkdeb [-o dist] [-version DESCRIBE] [-arch GOARCH]
//
// run from the root of the source tree. It prints the package's path. The
// work is internal/pkgdeb's; see its documentation for what goes in.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/agentd/agentd/internal/pkgdeb"
)

func main() {
	os.Exit(run())
}

func run() int {
	out := flag.String("o", "dist", "directory for the .deb")
	describe := flag.String("version", "", "version to stamp, as `git describe --tags --always --dirty` prints it (default: ask git)")
	arch := flag.String("arch", "", "target GOARCH (default: this machine's)")
	quiet := flag.Bool("q", false, "print only the package's path")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "mkdeb: no arguments expected; see -h")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	o := pkgdeb.Options{Dir: ".", OutDir: *out, Describe: *describe, GoArch: *arch}
	if !*quiet {
		o.Log = os.Stderr
	}
	p, err := pkgdeb.Build(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkdeb:", err)
		return 1
	}
	fmt.Println(p.Path)
	return 0
}

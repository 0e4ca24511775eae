// Command goverlay-bench compares goverlay with the kernel's overlayfs and
// fuse-overlayfs over scratch layers it makes and removes itself
// (docs/BENCHMARKS.md). `goverlay bench` runs it.
//
// It is a program of its own so that its chart and progress-bar libraries
// stay out of goverlay's: Go initialises every package a program links at
// each start, and goverlay starts twice per mount (cmd/goverlay/daemon.go;
// docs/BENCHMARKS.md, "Many mounts of one image").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/goverlay/goverlay/cmd/internal/bench"
)

// Exit codes, as goverlay's for the same failures.
const (
	exitOK      = 0
	exitUsage   = 1
	exitFailed  = 4
	exitStopped = 130
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == bench.AgentFlag {
		return bench.Agent(args[1:], os.Stdin, stdout, stderr)
	}
	c, err := bench.ParseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "goverlay bench: %v\n", err)
		return exitUsage
	}
	// The table goes to stdout; the progress bar to stderr, and only
	// when it is a terminal.
	c.Out, c.Progress = stdout, stderr
	if _, err := bench.Run(context.Background(), c); err != nil {
		fmt.Fprintf(stderr, "goverlay bench: %v\n", err)
		if errors.Is(err, context.Canceled) {
			return exitStopped
		}
		return exitFailed
	}
	return exitOK
}

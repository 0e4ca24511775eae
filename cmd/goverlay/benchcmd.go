package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/goverlay/goverlay/cmd/goverlay/internal/bench"
)

// runBench is `goverlay bench`: the side-by-side comparison of
// docs/BENCHMARKS.md, over scratch layers it makes and removes itself.
func runBench(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == bench.AgentFlag {
		return bench.Agent(args[1:], os.Stdin, stdout, stderr)
	}
	c, err := bench.ParseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "goverlay: %v\n", err)
		return exitUsage
	}
	// The table goes to stdout; the progress bar to stderr, and only
	// when it is a terminal.
	c.Out, c.Progress = stdout, stderr
	if _, err := bench.Run(context.Background(), c); err != nil {
		fmt.Fprintf(stderr, "goverlay: bench: %v\n", err)
		if errors.Is(err, context.Canceled) {
			return 130
		}
		return exitMount
	}
	return exitOK
}

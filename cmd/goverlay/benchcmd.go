package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// benchProgram is the program `goverlay bench` runs: cmd/goverlay-bench,
// kept out of this binary (its packages' initialisation would cost every
// mount, see cmd/goverlay-bench).
const benchProgram = "goverlay-bench"

// runBench is `goverlay bench`: it replaces this process with
// goverlay-bench, found beside this binary or in PATH, which runs this
// goverlay unless --binary names another. It returns only on failure.
func runBench(args []string, stdout, stderr io.Writer) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "goverlay: bench: cannot find this program: %v\n", err)
		return exitUsage
	}
	prog := filepath.Join(filepath.Dir(self), benchProgram)
	if _, err := os.Stat(prog); err != nil {
		p, lerr := exec.LookPath(benchProgram)
		if lerr != nil {
			fmt.Fprintf(stderr, "goverlay: bench: %s is neither beside %s nor in PATH; build it with make, or go build -o %s ./cmd/goverlay-bench\n",
				benchProgram, self, filepath.Dir(self))
			return exitUsage
		}
		prog = p
	}
	// A later --binary in args wins: the flag package keeps the last.
	argv := append([]string{benchProgram, "--binary", self}, args...)
	err = syscall.Exec(prog, argv, os.Environ())
	fmt.Fprintf(stderr, "goverlay: bench: cannot run %s: %v\n", prog, err)
	return exitUsage
}

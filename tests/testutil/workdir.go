package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// WorkEmpty fails t unless the overlay left nothing in workdir/work (the
// scratch directory of copy-ups and removals, which must be empty after a
// clean unmount or a remount).
func WorkEmpty(t testing.TB, work string) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(work, "work"))
	if err != nil {
		t.Errorf("workdir: %v", err)
		return
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) > 0 {
		t.Errorf("%s/work holds %q", work, names)
	}
}

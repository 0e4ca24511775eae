package overlay

import (
	"strings"
	"testing"
)

func TestKernelVersion(t *testing.T) {
	for rel, want := range map[string][2]int{"6.18.44-fc-v669": {6, 18}, "6.9.0": {6, 9}, "5.15.0-91-generic": {5, 15}, "6.10rc1": {6, 10}, "5.11-rc7": {5, 11}} {
		if maj, min, ok := kernelVersion(rel); !ok || maj != want[0] || min != want[1] {
			t.Errorf("kernelVersion(%q) = %d.%d %v", rel, maj, min, ok)
		}
	}
	for _, rel := range []string{"", "6", "x.y", "6.x"} {
		if _, _, ok := kernelVersion(rel); ok {
			t.Errorf("kernelVersion(%q) read a version", rel)
		}
	}
}

// TestCheckKernel: the minimum is compared as numbers, major first; an
// unreadable release is let through.
func TestCheckKernel(t *testing.T) {
	for rel, refused := range map[string]bool{
		"4.19.300":          true,
		"5.4.0-150-generic": true,
		"5.9.16":            true,
		"5.10.0-28-amd64":   true,
		"5.11.0":            false,
		"5.11-rc7":          false,
		"5.15.0-91-generic": false,
		"5.100.0":           false,
		"6.0.0":             false,
		"6.18.44-fc-v669":   false,
		"10.0":              false,
		"weird":             false,
		"":                  false,
	} {
		err := CheckKernel(rel)
		if (err != nil) != refused {
			t.Errorf("CheckKernel(%q) = %v, want refused %v", rel, err, refused)
		}
		if err != nil && (!strings.Contains(err.Error(), rel) || !strings.Contains(err.Error(), "5.11")) {
			t.Errorf("CheckKernel(%q): %q names neither the release nor the minimum", rel, err)
		}
	}
}

func TestOlderThan(t *testing.T) {
	for _, c := range []struct {
		maj, min int
		want     [2]int
		older    bool
	}{
		{5, 10, [2]int{5, 11}, true},
		{5, 11, [2]int{5, 11}, false},
		{5, 12, [2]int{5, 11}, false},
		{4, 99, [2]int{5, 11}, true},
		{6, 0, [2]int{5, 11}, false},
		{6, 8, [2]int{6, 9}, true},
		{6, 10, [2]int{6, 9}, false},
	} {
		if got := olderThan(c.maj, c.min, c.want); got != c.older {
			t.Errorf("olderThan(%d, %d, %v) = %v", c.maj, c.min, c.want, got)
		}
	}
}

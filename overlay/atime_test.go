package overlay

import (
	"testing"

	"github.com/goverlay/goverlay/lower"
)

// TestAtimeOf: the daemon's access-time policy from the mount flags, with
// strictatime winning over noatime as in the kernel's path_mount().
func TestAtimeOf(t *testing.T) {
	for _, c := range []struct {
		opts []string
		want lower.Atime
	}{
		{nil, lower.Atime{}},
		{[]string{"nosuid", "noatime"}, lower.Atime{Mode: lower.Noatime}},
		{[]string{"strictatime"}, lower.Atime{Mode: lower.Strictatime}},
		{[]string{"noatime", "strictatime"}, lower.Atime{Mode: lower.Strictatime}},
		{[]string{"nodiratime", "lazytime"}, lower.Atime{NoDirs: true}},
	} {
		if got := atimeOf(c.opts); got != c.want {
			t.Errorf("atimeOf(%q) = %+v, want %+v", c.opts, got, c.want)
		}
	}
}

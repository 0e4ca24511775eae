package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestBadInput: each bad command line fails with one line on stderr that
// names the problem, and mounts nothing.
func TestBadInput(t *testing.T) {
	testutil.RequireRoot(t)
	type setup func(t *testing.T, lower, mnt, base string) (newMnt string, args []string)
	cases := []struct {
		name  string
		setup setup
		keys  []string
	}{
		{"no-options", func(t *testing.T, lower, mnt, base string) (string, []string) {
			return mnt, []string{mnt}
		}, []string{"lowerdir"}},
		{"misspelt-keys", func(t *testing.T, lower, mnt, base string) (string, []string) {
			u, w := mkdirs(t, base, "upper", "work")
			return mnt, []string{"-o", "lowerdir=" + lower + ",uppperdir=" + u + ",wrkdir=" + w, mnt}
		}, []string{"uppperdir", "did you mean upperdir"}},
		{"no-lowerdir", func(t *testing.T, lower, mnt, base string) (string, []string) {
			u, w := mkdirs(t, base, "upper", "work")
			return mnt, []string{"-o", "upperdir=" + u + ",workdir=" + w, mnt}
		}, []string{"lowerdir"}},
		{"layer-missing", func(t *testing.T, lower, mnt, base string) (string, []string) {
			return mnt, []string{"-o", "lowerdir=" + lower + ":" + filepath.Join(base, "nonexistent-layer"), mnt}
		}, []string{"nonexistent-layer", "exist|no such"}},
		{"layer-is-a-file", func(t *testing.T, lower, mnt, base string) (string, []string) {
			return mnt, []string{"-o", "lowerdir=" + filepath.Join(lower, "file"), mnt}
		}, []string{"not a directory"}},
		{"mountpoint-missing", func(t *testing.T, lower, mnt, base string) (string, []string) {
			m := filepath.Join(base, "nonexistent-mnt")
			return m, []string{"-o", "lowerdir=" + lower, m}
		}, []string{"nonexistent-mnt", "exist|no such"}},
		{"mountpoint-is-a-file", func(t *testing.T, lower, mnt, base string) (string, []string) {
			m := filepath.Join(base, "mnt-file")
			must(t, os.WriteFile(m, nil, 0o644))
			return m, []string{"-o", "lowerdir=" + lower, m}
		}, []string{"mnt-file", "not a directory"}},
		{"upperdir-without-workdir", func(t *testing.T, lower, mnt, base string) (string, []string) {
			u, _ := mkdirs(t, base, "upper", "work")
			return mnt, []string{"-o", "lowerdir=" + lower + ",upperdir=" + u, mnt}
		}, []string{"workdir"}},
		{"workdir-without-upperdir", func(t *testing.T, lower, mnt, base string) (string, []string) {
			_, w := mkdirs(t, base, "upper", "work")
			return mnt, []string{"-o", "lowerdir=" + lower + ",workdir=" + w, mnt}
		}, []string{"upperdir"}},
		{"workdir-on-another-filesystem", func(t *testing.T, lower, mnt, base string) (string, []string) {
			u, _ := mkdirs(t, testutil.Tmpfs(t), "upper", "unused")
			_, w := mkdirs(t, base, "unused", "work")
			return mnt, []string{"-o", "lowerdir=" + lower + ",upperdir=" + u + ",workdir=" + w, mnt}
		}, []string{"workdir", "filesystem|device"}},
		{"workdir-inside-upperdir", func(t *testing.T, lower, mnt, base string) (string, []string) {
			u, _ := mkdirs(t, base, "upper", "unused")
			_, w := mkdirs(t, u, "unused", "work")
			return mnt, []string{"-o", "lowerdir=" + lower + ",upperdir=" + u + ",workdir=" + w, mnt}
		}, []string{"workdir", "inside|within|nested|overlap"}},
		{"upperdir-inside-workdir", func(t *testing.T, lower, mnt, base string) (string, []string) {
			_, w := mkdirs(t, base, "unused", "work")
			u, _ := mkdirs(t, w, "upper", "unused")
			return mnt, []string{"-o", "lowerdir=" + lower + ",upperdir=" + u + ",workdir=" + w, mnt}
		}, []string{"upperdir", "inside|within|nested|overlap"}},
		{"layer-inside-mountpoint", func(t *testing.T, lower, mnt, base string) (string, []string) {
			in, _ := mkdirs(t, mnt, "layer", "unused")
			return mnt, []string{"-o", "lowerdir=" + lower + ":" + in, mnt}
		}, []string{"mountpoint", "inside|within|nested"}},
		{"upperdir-inside-mountpoint", func(t *testing.T, lower, mnt, base string) (string, []string) {
			u, _ := mkdirs(t, mnt, "upper", "unused")
			_, w := mkdirs(t, base, "unused", "work")
			return mnt, []string{"-o", "lowerdir=" + lower + ",upperdir=" + u + ",workdir=" + w, mnt}
		}, []string{"mountpoint", "inside|within|nested"}},
		{"mountpoint-inside-layer", func(t *testing.T, lower, mnt, base string) (string, []string) {
			m, _ := mkdirs(t, lower, "mnt", "unused")
			return m, []string{"-o", "lowerdir=" + lower, m}
		}, []string{"mountpoint", "inside|within|nested|contain"}},
		{"mountpoint-is-the-upperdir", func(t *testing.T, lower, mnt, base string) (string, []string) {
			u, w := mkdirs(t, base, "upper", "work")
			return u, []string{"-o", "lowerdir=" + lower + ",upperdir=" + u + ",workdir=" + w, u}
		}, []string{"mountpoint", "upperdir"}},
		{"same-lower-twice", func(t *testing.T, lower, mnt, base string) (string, []string) {
			return mnt, []string{"-o", "lowerdir=" + lower + ":" + lower, mnt}
		}, []string{"same|twice|duplicate|more than once"}},
		{"same-lower-twice-via-symlink", func(t *testing.T, lower, mnt, base string) (string, []string) {
			link := filepath.Join(base, "link-to-lower")
			must(t, os.Symlink(lower, link))
			return mnt, []string{"-o", "lowerdir=" + lower + ":" + link, mnt}
		}, []string{"same|twice|duplicate|more than once"}},
		{"upperdir-is-a-lower", func(t *testing.T, lower, mnt, base string) (string, []string) {
			_, w := mkdirs(t, base, "unused", "work")
			return mnt, []string{"-o", "lowerdir=" + lower + ",upperdir=" + lower + ",workdir=" + w, mnt}
		}, []string{"same|twice|duplicate|more than once|inside"}},
		{"malformed-unterminated-quote", func(t *testing.T, lower, mnt, base string) (string, []string) {
			return mnt, []string{"-o", "lowerdir=" + lower + `,fsname="oops`, mnt}
		}, []string{"quote"}},
		{"malformed-nameless-option", func(t *testing.T, lower, mnt, base string) (string, []string) {
			return mnt, []string{"-o", "lowerdir=" + lower + ",=value", mnt}
		}, []string{"option|name"}},
		{"malformed-empty-layer", func(t *testing.T, lower, mnt, base string) (string, []string) {
			other, _ := mkdirs(t, base, "other", "unused")
			return mnt, []string{"-o", "lowerdir=" + lower + "::" + other, mnt}
		}, []string{"lowerdir"}},
		{"xattr-permissions-3", func(t *testing.T, lower, mnt, base string) (string, []string) {
			u, w := mkdirs(t, base, "upper", "work")
			return mnt, []string{"-o", "lowerdir=" + lower + ",upperdir=" + u + ",workdir=" + w + ",xattr_permissions=3", mnt}
		}, []string{"xattr_permissions", "0, 1 or 2", `"3"`}},
		{"xattr-permissions-x", func(t *testing.T, lower, mnt, base string) (string, []string) {
			u, w := mkdirs(t, base, "upper", "work")
			return mnt, []string{"-o", "lowerdir=" + lower + ",upperdir=" + u + ",workdir=" + w + ",xattr_permissions=x", mnt}
		}, []string{"xattr_permissions", "0, 1 or 2", `"x"`}},
		{"xattr-permissions-empty", func(t *testing.T, lower, mnt, base string) (string, []string) {
			return mnt, []string{"-o", "lowerdir=" + lower + ",xattr_permissions=", mnt}
		}, []string{"xattr_permissions", "needs a value"}},
		// A mask names profiles and features joined with "+"; an unknown
		// name is refused with the names it takes.
		{"mask-unknown-feature", func(t *testing.T, lower, mnt, base string) (string, []string) {
			u, w := mkdirs(t, base, "upper", "work")
			return mnt, []string{"-o", "lowerdir=" + lower + ",upperdir=" + u + ",workdir=" + w + ",mask=passthrough+warp_drive", mnt}
		}, []string{`mask`, `"warp_drive"`, "known", "linux-5.15", "linux-6.1", "linux-6.8", "passthrough", "uring", "fchmodat2", "xattrat", `"+"`}},
		{"mask-profile-too-old", func(t *testing.T, lower, mnt, base string) (string, []string) {
			return mnt, []string{"-o", "lowerdir=" + lower + ",mask=linux-4.19", mnt}
		}, []string{"linux-4.19", "5.11", "known", "linux-5.15"}},
		{"mask-comma-separated", func(t *testing.T, lower, mnt, base string) (string, []string) {
			// The comma ends the option: "uring" is then an option
			// of its own, which needs a value.
			return mnt, []string{"-o", "lowerdir=" + lower + ",mask=passthrough,uring", mnt}
		}, []string{"uring", "needs a value", `joined with "+"`}},
		{"mask-comma-separated-feature", func(t *testing.T, lower, mnt, base string) (string, []string) {
			// Not a warning and a mount that masks passthrough alone.
			return mnt, []string{"-o", "lowerdir=" + lower + ",mask=passthrough,tmpfile", mnt}
		}, []string{`"tmpfile"`, `joined with "+"`, "mask=A+tmpfile"}},
		{"mask-empty", func(t *testing.T, lower, mnt, base string) (string, []string) {
			return mnt, []string{"-o", "lowerdir=" + lower + ",mask=", mnt}
		}, []string{"mask", "needs a value"}},
		{"malformed-dangling-o", func(t *testing.T, lower, mnt, base string) (string, []string) {
			return mnt, []string{mnt, "-o"}
		}, []string{"-o|option"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			lower, mnt := layers(t)
			m, args := c.setup(t, lower, mnt, filepath.Dir(mnt))
			expectRefused(t, m, args, c.keys...)
		})
	}
}

// TestUnknownOption: an unknown -o key is a warning naming it, and the
// mount goes ahead.
func TestUnknownOption(t *testing.T) {
	t.Parallel()
	lower, _ := layers(t)
	m := testutil.Mount(t, testutil.Options{Lower: []string{lower}, Extra: []string{"-o", "bogus_option_xyz=1"}})
	if _, err := os.Stat(filepath.Join(m.Dir, "file")); err != nil {
		t.Fatalf("mount with an unknown option does not work: %v", err)
	}
	out, _ := os.ReadFile(m.OutFile)
	log := []byte{}
	if m.LogFile != "" {
		log, _ = os.ReadFile(m.LogFile)
	}
	if !strings.Contains(string(out)+string(log), "bogus_option_xyz") {
		t.Errorf("no warning naming the unknown option; output %q, log %q", out, log)
	}
}

// mkdirs makes base/a and base/b (or nothing for "unused").
func mkdirs(t *testing.T, base, a, b string) (string, string) {
	t.Helper()
	var out [2]string
	for i, n := range []string{a, b} {
		if n == "unused" {
			continue
		}
		out[i] = filepath.Join(base, n)
		must(t, os.MkdirAll(out[i], 0o755))
	}
	return out[0], out[1]
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

package main

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// checkParseError asserts what every parser error must be: a usage error
// with a non-empty one-line message.
func checkParseError(t *testing.T, input any, err error) {
	t.Helper()
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitUsage {
		t.Fatalf("%q: error %v is not a usage exitError", input, err)
	}
	if ee.msg == "" || strings.ContainsAny(ee.msg, "\n\r") {
		t.Fatalf("%q: bad message %q", input, ee.msg)
	}
}

// FuzzParseArgs feeds whole command lines (arguments separated by NUL) to
// parseArgs: it must never panic, fail only with a one-line usage error, and
// return absolute, clean paths when it succeeds.
func FuzzParseArgs(f *testing.F) {
	for _, seed := range [][]string{
		{"-o", "lowerdir=/a:/b,upperdir=/u,workdir=/w", "/m"},
		{"src", "/m", "-o", "rw,nosuid,nodev,lowerdir=/a"},
		{"-f", "-d", "-olowerdir=a", "--pidfile", "p", "--log=l", "m"},
		{"-o", `lowerdir=/a\:b,context="x:y,z",,volatile`, "--", "-m"},
		{"-o", "lowerdir=a::b", "m"},
		{"-o", `"unterminated`, "m"},
		{"-h"}, {"-V"}, {"-o"}, {"--pidfile="}, {""}, {"a", "b", "c"},
	} {
		f.Add(strings.Join(seed, "\x00"))
	}
	old := getwd
	getwd = func() (string, error) { return "/cwd", nil }
	f.Cleanup(func() { getwd = old })
	f.Fuzz(func(t *testing.T, line string) {
		args := strings.Split(line, "\x00")
		c, err := parseArgs(args)
		if err != nil {
			checkParseError(t, args, err)
			return
		}
		if c.Help || c.Version || c.OptionsMarkdown {
			return
		}
		paths := append([]string{c.Upper, c.Work, c.Mountpoint, c.PidFile, c.LogFile}, c.Lower...)
		for _, p := range paths {
			if p != "" && (!filepath.IsAbs(p) || filepath.Clean(p) != p) {
				t.Fatalf("%q: path %q is not absolute and clean", args, p)
			}
		}
		if c.Mountpoint == "" || c.FsName == "" {
			t.Fatalf("%q: empty mountpoint or fsname: %+v", args, c)
		}
		for _, k := range c.KernelOptions {
			if info := optionByKey[k]; info == nil || info.Status != optKernel && k != "ro" {
				t.Fatalf("%q: %q passed to the kernel", args, k)
			}
		}
	})
}

// FuzzParseOptions feeds one -o string to the option parser.
func FuzzParseOptions(f *testing.F) {
	for _, seed := range []string{
		"lowerdir=/a:/b,upperdir=/u,workdir=/w",
		`lowerdir=/a\:b:/c,upperdir=/u\,v`,
		`context="system_u:object_r:container_file_t:s0:c1,c2"`,
		",,volatile,,", "fsync=0,nosec=off,passthrough=off", `a\`, `"`, `\"`, "=", "lowerdir=::", "nosuid=1,suid,ro,rw",
		"uidmapping=0:1000:1:1:100000:65536,gidmapping=0:1000:1",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c := &config{}
		st := newOptState(c)
		if err := st.parse(s); err != nil {
			checkParseError(t, s, err)
			return
		}
		if err := st.finish(); err != nil {
			checkParseError(t, s, err)
			return
		}
		for _, l := range c.Lower {
			if l == "" {
				t.Fatalf("%q: empty lower layer in %q", s, c.Lower)
			}
		}
		if c.ReadOnly != slices.Contains(c.KernelOptions, "ro") {
			t.Fatalf("%q: ReadOnly %v but kernel options %q", s, c.ReadOnly, c.KernelOptions)
		}
	})
}

// escapeLayer is the inverse of the lowerdir parsing: how a caller must
// write a path that contains the special characters.
func escapeLayer(p string) string {
	r := strings.NewReplacer(`\`, `\\`, `,`, `\,`, `:`, `\:`, `"`, `\"`)
	return r.Replace(p)
}

// FuzzLowerdirRoundTrip checks that any two non-empty paths survive being
// escaped, joined into a lowerdir option and parsed back.
func FuzzLowerdirRoundTrip(f *testing.F) {
	f.Add("/a", "/b")
	f.Add(`/we:ird,\path`, `"quoted"`)
	f.Add("/x=y", "/ü")
	f.Fuzz(func(t *testing.T, a, b string) {
		if a == "" || b == "" || !utf8.ValidString(a+b) {
			return
		}
		opt := "lowerdir=" + escapeLayer(a) + ":" + escapeLayer(b)
		c := &config{}
		st := newOptState(c)
		if err := st.parse(opt); err != nil {
			t.Fatalf("%q: %v", opt, err)
		}
		if !slices.Equal(c.Lower, []string{a, b}) {
			t.Fatalf("%q: got %q, want %q", opt, c.Lower, []string{a, b})
		}
	})
}

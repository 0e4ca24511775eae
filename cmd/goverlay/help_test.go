package main

import (
	"bytes"
	"fmt"
	"runtime/debug"
	"strings"
	"testing"
)

func TestHelpListsEverything(t *testing.T) {
	var b bytes.Buffer
	printHelp(&b)
	help := b.String()
	for _, o := range optionTable {
		if !strings.Contains(help, "  "+optionSyntax(o)+" ") {
			t.Errorf("--help does not list %q", optionSyntax(o))
		}
	}
	for _, e := range exitCodes {
		if !strings.Contains(help, fmt.Sprintf("  %d  %s", e.Code, e.Desc)) {
			t.Errorf("--help does not list exit code %d", e.Code)
		}
	}
	for _, flag := range []string{"-f", "-d, --debug", "--pidfile FILE", "--log FILE", "-V, --version", "-h, --help"} {
		if !strings.Contains(help, flag) {
			t.Errorf("--help does not mention %s", flag)
		}
	}
}

func TestExitCodesAreDistinct(t *testing.T) {
	seen := map[int]bool{}
	for _, e := range exitCodes {
		if seen[e.Code] {
			t.Errorf("exit code %d listed twice", e.Code)
		}
		seen[e.Code] = true
	}
	for _, c := range []int{exitOK, exitUsage, exitBadLayer, exitFuse, exitMount, exitDaemon} {
		if !seen[c] {
			t.Errorf("exit code %d missing from the table", c)
		}
	}
}

func TestOptionsMarkdown(t *testing.T) {
	var b bytes.Buffer
	printOptionsMarkdown(&b)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != len(optionTable)+2 {
		t.Fatalf("%d lines for %d options", len(lines), len(optionTable))
	}
	for i, l := range lines {
		// Every row has exactly four unescaped pipes.
		if n := strings.Count(l, "|") - strings.Count(l, `\|`); n != 4 {
			t.Errorf("line %d has %d cell separators: %q", i, n, l)
		}
	}
}

func TestVersion(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "1.2.3"
	var b bytes.Buffer
	printVersion(&b)
	if !strings.HasPrefix(b.String(), "goverlay 1.2.3\ngo-fuse ") {
		t.Errorf("version output %q", b.String())
	}
}

// TestVersionFromBuildInfo: without -ldflags -X, the version comes from
// what the go command recorded, and never reads as a bare "dev".
func TestVersionFromBuildInfo(t *testing.T) {
	vcs := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	for _, c := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"go install @version", debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}, "v1.4.0"},
		{"git checkout", debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: vcs("vcs", "git", "vcs.revision", "032f20687312bc4aec957406bffc62cfb118c714", "vcs.time", "2026-11-30T13:45:57Z", "vcs.modified", "false")},
			"devel-032f20687312 (2026-11-30T13:45:57Z)"},
		{"modified checkout", debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: vcs("vcs.revision", "032f20687312bc4aec957406bffc62cfb118c714", "vcs.modified", "true")},
			"devel-032f20687312-dirty"},
		{"no vcs information", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "unknown (built without VCS information; build with make)"},
	} {
		if got := versionFromBuildInfo(&c.bi); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

func TestRunHelpAndUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"--help"}, &out, &errOut); code != exitOK || !strings.HasPrefix(out.String(), "usage: ") {
		t.Errorf("--help: code %d, output %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"-o", "lowerdir=a::b", "/m"}, &out, &errOut); code != exitUsage {
		t.Errorf("bad option: code %d", code)
	}
	if got := errOut.String(); !strings.HasPrefix(got, "goverlay: lowerdir \"a::b\"") || strings.Count(got, "\n") != 1 {
		t.Errorf("stderr %q", got)
	}
	errOut.Reset()
	if code := run([]string{"-o", "lowerdir=/nonexistent-goverlay-test,xino=on", "/"}, &out, &errOut); code != exitBadLayer {
		t.Errorf("missing layer: code %d", code)
	}
	want := "goverlay: option \"xino\" is not implemented yet, ignored\n" +
		"goverlay: lowerdir /nonexistent-goverlay-test does not exist; create it or fix the path\n"
	if errOut.String() != want {
		t.Errorf("stderr\n got %q\nwant %q", errOut.String(), want)
	}
}

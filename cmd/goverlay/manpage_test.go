package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cpuguy83/go-md2man/v2/md2man"

	"github.com/goverlay/goverlay/overlay"
)

const (
	manSource = "../../docs/goverlay.1.md"
	manPage   = "../../docs/goverlay.1"
)

// TestManPageCurrent: docs/goverlay.1 is what go-md2man makes of
// docs/goverlay.1.md today, so the page make install ships says what the
// Markdown says.
func TestManPageCurrent(t *testing.T) {
	src, err := os.ReadFile(manSource)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(manPage)
	if err != nil {
		t.Fatal(err)
	}
	if want := md2man.Render(src); !bytes.Equal(got, want) {
		t.Errorf("docs/goverlay.1 is not what go-md2man makes of docs/goverlay.1.md; run make man")
	}
}

// TestManPageOptions: every -o key the parser knows is described in the
// man page, as a definition-list term.
func TestManPageOptions(t *testing.T) {
	src, err := os.ReadFile(manSource)
	if err != nil {
		t.Fatal(err)
	}
	md := string(src)
	for _, o := range optionTable {
		term := "\n**" + strings.ReplaceAll(o.Key, "_", `\_`) + "**"
		if !strings.Contains(md, term+"\n") && !strings.Contains(md, term+"=") {
			t.Errorf("option %q has no entry in docs/goverlay.1.md", o.Key)
		}
	}
}

// TestManPageRenders formats docs/goverlay.1 with man(1), warnings on, and
// fails on any warning; it also checks the text that Markdown-to-roff
// conversions tend to mangle.
func TestManPageRenders(t *testing.T) {
	man, err := exec.LookPath("man")
	if err != nil {
		t.Skip("man is not installed (apt-get install man-db); cannot check how docs/goverlay.1 renders")
	}
	page, err := filepath.Abs(manPage)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(man, "--warnings", "-l", page)
	cmd.Env = append(os.Environ(), "MANPAGER=cat", "PAGER=cat", "MANWIDTH=80", "LC_ALL=C.UTF-8")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("man --warnings -l %s: %v\n%s", page, err, stderr.String())
	}
	if w := strings.TrimSpace(stderr.String()); w != "" {
		t.Errorf("man --warnings -l %s warns:\n%s", page, w)
	}
	// man(1) hyphenates and justifies: join the words again before
	// looking for text.
	text := strings.Join(strings.Fields(strings.ReplaceAll(stdout.String(), "\u2010\n", "")), " ")
	for _, want := range []string{
		"GOVERLAY(1)",
		"--pidfile FILE",
		`"\:" escapes a colon`,
		`"user.overlay.*"`,
		"lowerdir=DIR[:DIR...]",
		"squash_to_root",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the rendered man page lacks %q", want)
		}
	}
}

// TestManPageMaskFeatures: every feature -o mask= takes, and the profiles
// of the container hosts' kernels, are described under KERNEL FEATURES.
func TestManPageMaskFeatures(t *testing.T) {
	src, err := os.ReadFile(manSource)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(src), "\n# KERNEL FEATURES\n")
	if !ok {
		t.Fatal("docs/goverlay.1.md has no KERNEL FEATURES section")
	}
	section, _, _ = strings.Cut(section, "\n# ")
	for _, n := range append(overlay.FeatureNames(), "linux-5.11", "linux-5.14", "linux-5.15", "linux-6.1", "linux-6.8") {
		if !strings.Contains(section, "**"+strings.ReplaceAll(n, "_", `\_`)+"**") {
			t.Errorf("KERNEL FEATURES does not describe %s", n)
		}
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/goverlay/goverlay/overlay"
)

// jsonKeys lists the keys of a JSON object in their order.
func jsonKeys(t *testing.T, b []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	var keys []string
	if _, err := dec.Token(); err != nil { // {
		t.Fatal(err)
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// TestStatsTextMatchesJSON: the text output has one line per JSON field,
// in the same order, labelled with the JSON name (spaces for
// underscores), so what a script reads and what a person reads agree.
func TestStatsTextMatchesJSON(t *testing.T) {
	s := overlay.Stats{Mountpoint: "/m", PID: 7, NoSec: true, NoSecReason: "upper is ext4", OpensCached: 3, LayerAnswers: 5}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	keys := jsonKeys(t, b)
	var rowKeys []string
	for _, r := range statsRows(s) {
		rowKeys = append(rowKeys, r.key)
	}
	if !reflect.DeepEqual(rowKeys, keys) {
		t.Errorf("text rows %q, JSON keys %q", rowKeys, keys)
	}
	var out bytes.Buffer
	writeStats(&out, s)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != len(keys) {
		t.Fatalf("%d text lines for %d JSON keys:\n%s", len(lines), len(keys), out.String())
	}
	for i, k := range keys {
		if label := strings.ReplaceAll(k, "_", " "); !strings.HasPrefix(lines[i], label+"  ") {
			t.Errorf("line %d %q does not start with %q", i, lines[i], label)
		}
	}
	for _, want := range []string{"opens through goverlay    3   (file opens", "names from listings", "nosec                     on   (whether", "nosec reason              upper is ext4\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, out.String())
		}
	}
	// The words the text used to have, which meant nothing to a reader.
	for _, jargon := range []string{"settled", "fast-exec", "restricted\t"} {
		if strings.Contains(out.String(), jargon) {
			t.Errorf("text output says %q:\n%s", jargon, out.String())
		}
	}
}

// TestStatsNotGoverlay: stats on a path that is not a goverlay mount says
// so in words, not with the control socket's "connection refused".
func TestStatsNotGoverlay(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		path string
		want string
	}{
		{filepath.Join(dir, "missing"), "does not exist"},
		{dir, "is not a mount point"},
		{"/proc", "is not a goverlay mount (its filesystem is proc)"},
	} {
		var out, errOut bytes.Buffer
		code := runStats([]string{c.path}, &out, &errOut)
		if code != exitBadLayer || !strings.Contains(errOut.String(), c.want) || strings.Contains(errOut.String(), "refused") {
			t.Errorf("stats %s: exit %d, stderr %q; want exit %d and %q", c.path, code, errOut.String(), exitBadLayer, c.want)
		}
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/a/b`:             "/a/b",
		`/with\040space`:   "/with space",
		`/back\134slash`:   `/back\slash`,
		`/trailing\04`:     `/trailing\04`,
		`/tab\011and\012n`: "/tab\tand\nn",
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

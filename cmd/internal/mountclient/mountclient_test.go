package mountclient

import (
	"bytes"
	"testing"
)

func TestParseReport(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		code int
		text string
		ok   bool
	}{
		{"ok\n", 0, "", true},
		{"fail 2\nlowerdir /x does not exist", 2, "lowerdir /x does not exist", true},
		{"fail 4\n", 4, "", true},
		{"", 0, "", false},          // the child died
		{"ok", 0, "", false},        // truncated
		{"fail 0\nx", 0, "", false}, // failure with success code
		{"fail 300\nx", 0, "", false},
		{"fail x\ny", 0, "", false},
		{"fail 2", 0, "", false},
		{"panic: boom", 0, "", false},
	} {
		code, text, ok := ParseReport([]byte(tc.msg))
		if code != tc.code || text != tc.text || ok != tc.ok {
			t.Errorf("ParseReport(%q) = %d %q %v, want %d %q %v", tc.msg, code, text, ok, tc.code, tc.text, tc.ok)
		}
	}
}

// rw writes to w and reads from r.
type rw struct {
	w *bytes.Buffer
	r *bytes.Buffer
}

func (c rw) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c rw) Read(p []byte) (int, error)  { return c.r.Read(p) }

// TestAsk: the request goes out as one JSON line, and the warnings come
// back, one a line, before the report.
func TestAsk(t *testing.T) {
	c := rw{w: &bytes.Buffer{}, r: &bytes.Buffer{}}
	if err := WriteWarnings(c.r, []string{`unknown option "x" ignored`, "two\nlines"}); err != nil {
		t.Fatal(err)
	}
	c.r.WriteString("fail 2\nno such lowerdir")
	warnings, code, text, ok, err := Ask(c, Request{Args: []string{"-o", "a", "m"}, Cwd: "/w", Warn: true})
	if err != nil || !ok || code != 2 || text != "no such lowerdir" {
		t.Errorf("report %d %q %v %v; want 2, the message, true, nil", code, text, ok, err)
	}
	if want := []string{`unknown option "x" ignored`, "two lines"}; len(warnings) != 2 || warnings[0] != want[0] || warnings[1] != want[1] {
		t.Errorf("warnings %q, want %q", warnings, want)
	}
	if got, want := c.w.String(), `{"args":["-o","a","m"],"cwd":"/w","warn":true}`+"\n"; got != want {
		t.Errorf("request %q, want %q", got, want)
	}
}

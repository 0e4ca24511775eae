package mountclient

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/goverlay/goverlay/overlay/rundir"
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

// TestAsk: the request goes out encoded, and the warnings come back, one
// a line, before the report.
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
	if got, want := c.w.String(), RequestMagic+"\x00warn\x00/w\x003\x00-o\x00a\x00m\x00"; got != want {
		t.Errorf("request %q, want %q", got, want)
	}
}

// TestReadRequest: a request read back is the one encoded, byte for
// byte (paths need not be UTF-8; arguments may be empty); one that is
// cut short, from another build, or with a bad count is an error, and
// one that is not a request fails at its first byte, without waiting
// for more.
func TestReadRequest(t *testing.T) {
	for _, req := range []Request{
		{Args: []string{"-o", "lowerdir=/l\xff\xfe,upperdir=/u", "/m\n"}, Cwd: "/caf\xe9", Warn: true},
		{Args: []string{"", "x"}, Cwd: ""},
		{Args: []string{}},
	} {
		got, err := ReadRequest(bytes.NewReader(req.Encode()))
		if err != nil || got.Cwd != req.Cwd || got.Warn != req.Warn || !slices.Equal(got.Args, req.Args) {
			t.Errorf("ReadRequest(Encode(%+q)) = %+q, %v", req.Args, got.Args, err)
		}
	}
	whole := string(Request{Args: []string{"-o", "a", "m"}, Cwd: "/w"}.Encode())
	for _, bad := range []string{
		"",
		whole[:len(whole)-1],
		strings.Replace(whole, RequestMagic, "goverlay-mount-request-0", 1),
		strings.Replace(whole, "\x003\x00", "\x004\x00", 1),
		strings.Replace(whole, "\x003\x00", "\x00-1\x00", 1),
		strings.Replace(whole, "\x003\x00", "\x00three\x00", 1),
		`{"args":["-o","a","m"],"cwd":"/w"}` + "\n",
		RequestMagic + "x\x00",
	} {
		if got, err := ReadRequest(strings.NewReader(bad)); err == nil {
			t.Errorf("ReadRequest(%q) = %+q, nil; want an error", bad, got.Args)
		}
	}
	// A reader that blocks after "n": ReadRequest must not read on.
	r, w := io.Pipe()
	defer w.Close()
	go w.Write([]byte("n"))
	if _, err := ReadRequest(r); err == nil || !strings.Contains(err.Error(), "not one") {
		t.Errorf("ReadRequest of a stream starting with n: %v; want the request refused", err)
	}
}

// TestCClient: goverlay-mount, in C, uses this package's magic and exit
// code (its behaviour is tested in tests/cli, TestGoverlayMount).
func TestCClient(t *testing.T) {
	src, err := os.ReadFile("../../goverlay-mount/goverlay-mount.c")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf("#define EXIT_DAEMON %d\n", ExitDaemon),
		fmt.Sprintf("#define REQUEST_MAGIC %q\n", RequestMagic),
		fmt.Sprintf("#define ROOT_DIR %q\n", rundir.RootDir),
	} {
		if !strings.Contains(string(src), want) {
			t.Errorf("goverlay-mount.c lacks %q", want)
		}
	}
}

package testutil

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/goverlay/goverlay/overlay"
)

// The suites under a kernel profile.
//
// GOVERLAY_TEST_MASK set to a value of goverlay's -o mask= (a profile such
// as linux-5.15, or features joined with "+") makes every mount of Mount
// and MountWith behave as on a kernel without those features, so that a
// suite runs goverlay's fallbacks for them on a kernel that has them. The
// kernel overlay the suites compare with is the running kernel's: what a
// test expects does not change, only what goverlay uses to get there.
// Tests of a feature the mask hides skip (SkipIfMasked).

// MaskEnv names the mask the suites run under.
const MaskEnv = "GOVERLAY_TEST_MASK"

var testMask = sync.OnceValues(func() (overlay.Mask, error) {
	v := os.Getenv(MaskEnv)
	if v == "" {
		return overlay.Mask{}, nil
	}
	m, err := overlay.ParseMask(v)
	if err != nil {
		return m, fmt.Errorf("%s=%s: %v", MaskEnv, v, err)
	}
	return m, nil
})

// TestMask is the mask of GOVERLAY_TEST_MASK, or the zero Mask. A value
// goverlay refuses fails the test.
func TestMask(t testing.TB) overlay.Mask {
	t.Helper()
	m, err := testMask()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// MaskArgs are the arguments that give a goverlay mount the mask of
// GOVERLAY_TEST_MASK: none without one.
func MaskArgs(t testing.TB) []string {
	t.Helper()
	if m := TestMask(t); !m.Empty() {
		return []string{"-o", "mask=" + m.String()}
	}
	return nil
}

// MaskOpt appends the mask of GOVERLAY_TEST_MASK to an -o string, for a
// test that runs goverlay itself.
func MaskOpt(t testing.TB, opts string) string {
	t.Helper()
	if m := TestMask(t); !m.Empty() {
		return opts + ",mask=" + m.String()
	}
	return opts
}

// Masked reports whether GOVERLAY_TEST_MASK hides feature (a name of
// goverlay's mask=).
func Masked(t testing.TB, feature string) bool {
	t.Helper()
	return TestMask(t).Masks(feature)
}

// Hides is Masked for helpers without a test at hand: a value goverlay
// refuses hides nothing here, and fails every mount (TestMask).
func Hides(feature string) bool {
	m, err := testMask()
	return err == nil && m.Masks(feature)
}

// SkipIfMasked skips a test of what, which needs feature, when
// GOVERLAY_TEST_MASK hides it.
func SkipIfMasked(t testing.TB, feature, what string) {
	t.Helper()
	if Masked(t, feature) {
		t.Skipf("%s=%s hides %s, which %s needs", MaskEnv, TestMask(t), feature, what)
	}
}

// OptionsEnv names -o options every mount of Mount and MountWith gets
// before the test's own (GOVERLAY_TEST_OPTIONS=sharecache=on runs a suite
// with lower files shared through passthrough), for suites run by hand
// under an option that is not the default.
const OptionsEnv = "GOVERLAY_TEST_OPTIONS"

// SkipIfOptions skips a test of goverlay's defaults when
// GOVERLAY_TEST_OPTIONS sets options, which every mount gets.
func SkipIfOptions(t testing.TB, what string) {
	t.Helper()
	if v := os.Getenv(OptionsEnv); v != "" {
		t.Skipf("%s=%s: every mount gets it, and %s is of goverlay without it", OptionsEnv, v, what)
	}
}

// OptionsArgs are the arguments of GOVERLAY_TEST_OPTIONS: none when it is
// not set.
func OptionsArgs() []string {
	if v := os.Getenv(OptionsEnv); v != "" {
		return []string{"-o", v}
	}
	return nil
}

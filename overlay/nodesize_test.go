package overlay

import (
	"testing"
	"unsafe"
)

// TestNodeSize: a node fits the runtime's 288-byte size class. The next
// classes are 320 and 352 bytes, 32 or 64 more for every cached inode,
// which take the daemon towards 1 KiB per cached inode (goverlay bench
// --workloads mem-per-inode). Keep small fields together (bools share a
// word), and fields few nodes set in rareFields.
func TestNodeSize(t *testing.T) {
	if n := unsafe.Sizeof(node{}); n > 288 {
		t.Errorf("node is %d bytes, want at most 288", n)
	}
}

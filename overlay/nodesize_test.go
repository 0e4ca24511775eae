package overlay

import (
	"testing"
	"unsafe"
)

// TestNodeSize: a node fits the runtime's 352-byte size class. The next
// class is 384 bytes, 32 more for every cached inode, which takes the
// daemon past 1 KiB per cached inode (goverlay bench --workloads
// mem-per-inode). Keep small fields together (bools share a word).
func TestNodeSize(t *testing.T) {
	if n := unsafe.Sizeof(node{}); n > 352 {
		t.Errorf("node is %d bytes, want at most 352", n)
	}
}

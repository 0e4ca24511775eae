package oracle_test

import (
	"testing"

	"github.com/goverlay/goverlay/tests/testutil"
)

// TestUring runs the oracle's comparisons again with goverlay serving its
// requests over io_uring, one queue per CPU, where the kernel has FUSE over
// io_uring: every mount is made while the kernel offers it, and fails its
// test unless it took it.
func TestUring(t *testing.T) {
	testutil.OfferUring(t)
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"Oracle", TestOracle},
		{"WriteScenarios", TestWriteScenarios},
		{"WriteScenariosOpens", TestWriteScenariosOpens},
		{"CycleScenarios", TestCycleScenarios},
		{"WriteConcurrentPwrite", TestWriteConcurrentPwrite},
		{"WriteConcurrentCopyUp", TestWriteConcurrentCopyUp},
		{"WriteConcurrentCreateUnlink", TestWriteConcurrentCreateUnlink},
		{"RootListing", TestRootListing},
		{"ReaddirEachNameOnce", TestReaddirEachNameOnce},
		{"Seekdir", TestSeekdir},
		{"Statfs", TestStatfs},
		{"SparseSeek", TestSparseSeek},
		{"PrivateXattrs", TestPrivateXattrs},
		{"InodeNumbers", TestInodeNumbers},
		{"ACLInherit", TestACLInherit},
	} {
		t.Run(c.name, c.fn)
	}
}

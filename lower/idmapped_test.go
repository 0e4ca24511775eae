package lower

import "testing"

// TestMountHasOption reads the mount's own options (the sixth field), not
// the superblock's after the separator, and tells a mount missing from
// the table.
func TestMountHasOption(t *testing.T) {
	info := []byte(`27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,idmapped
48 46 254:0 /st/overlay /st/overlay/ID/mapped/0 rw,relatime,idmapped - ext4 /dev/vda rw,discard
49 46 0:5 / /dev rw,nosuid - devtmpfs udev rw
`)
	for _, c := range []struct {
		id   uint64
		want bool
	}{{27, false}, {48, true}, {49, false}} {
		got, err := mountHasOption(info, c.id, "idmapped")
		if err != nil || got != c.want {
			t.Errorf("mount %d: %v, %v; want %v", c.id, got, err, c.want)
		}
	}
	if _, err := mountHasOption(info, 4, "idmapped"); err == nil {
		t.Errorf("mount 4, not in the table: no error")
	}
}

package bench

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// The shared lower layer. It is built once per Run and only read: every
// target of every round gets fresh upper and work directories over it.
const (
	bigFile    = "big"                          // copyup: a 64 MiB file
	bigSize    = 64 << 20                       //
	deepPath   = "deep1/deep2/deep3/deep4/leaf" // stat-deep: 5 components
	metaDir    = "meta"                         // metadata: a merged directory
	untarDir   = "untar"                        // untar: extracted below this merged directory
	pathDirs   = 7                              // path-miss: PATH directories p1..p7
	pathBinary = "goverlay-bench-true"          // path-miss: /bin/true, copied into p7 on the target
	smallFiles = 100                            // "some files" in files/
)

func pathDir(i int) string { return fmt.Sprintf("path/p%d", i) }

func buildLower(dir string) error {
	mk := func(rel string) error { return os.MkdirAll(filepath.Join(dir, rel), 0o755) }
	write := func(rel string, data []byte) error {
		return os.WriteFile(filepath.Join(dir, rel), data, 0o644)
	}
	for _, d := range []string{"files", filepath.Dir(deepPath), metaDir, untarDir} {
		if err := mk(d); err != nil {
			return err
		}
	}
	for i := 1; i <= pathDirs; i++ {
		if err := mk(pathDir(i)); err != nil {
			return err
		}
	}
	for i := 0; i < smallFiles; i++ {
		if err := write(fmt.Sprintf("files/f%03d", i), pattern(1024+i*37)); err != nil {
			return err
		}
	}
	for i := 0; i < 16; i++ {
		if err := write(fmt.Sprintf("%s/lower%02d", metaDir, i), pattern(100)); err != nil {
			return err
		}
	}
	if err := write(deepPath, pattern(4096)); err != nil {
		return err
	}
	// The big file, in 1 MiB writes.
	f, err := os.OpenFile(filepath.Join(dir, bigFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	chunk := pattern(1 << 20)
	for n := 0; n < bigSize; n += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// pattern returns n bytes that are not all zeroes.
func pattern(n int) []byte {
	b := make([]byte, n)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// copyTree copies the regular files and directories of src into dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return copyFile(p, to, info.Mode().Perm())
	})
}

func copyFile(from, to string, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// prepareTarget does the untimed per-round setup on a live target: the
// path-miss binary goes into the 7th PATH directory, written through the
// target (so it is an upper file on the overlays).
func prepareTarget(inst *instance) error {
	to := filepath.Join(inst.root, pathDir(pathDirs), pathBinary)
	if err := copyFile("/bin/true", to, 0o755); err != nil {
		return fmt.Errorf("copy /bin/true into the target: %w", err)
	}
	return nil
}

// The untar tree: untarFiles small files in untarDirs directories.
const (
	untarFiles = 2000
	untarDirs  = 100
)

// buildTarball makes the archive the untar workload extracts, in memory.
func buildTarball() ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	data := pattern(8192)
	perDir := untarFiles / untarDirs
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tree/", Mode: 0o755, ModTime: mtime}); err != nil {
		return nil, err
	}
	for d := 0; d < untarDirs; d++ {
		dir := fmt.Sprintf("tree/d%03d/", d)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: mtime}); err != nil {
			return nil, err
		}
		for i := 0; i < perDir; i++ {
			n := d*perDir + i
			size := (n * 997) % 8192 // 0..8 KiB, about 4 KiB on average
			h := &tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("%sf%04d", dir, n), Mode: 0o644, Size: int64(size), ModTime: mtime}
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data[:size]); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// fsTypeName names the filesystem dir is on.
func fsTypeName(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "unknown"
	}
	names := map[int64]string{
		0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x01021994: "tmpfs",
		0xF2F52010: "f2fs", 0x2FC12FC1: "zfs", 0x858458F6: "ramfs", 0x794C7630: "overlay",
		0x65735546: "fuse", 0xCAFE4A11: "bcachefs",
	}
	if n, ok := names[int64(st.Type)]; ok {
		return n
	}
	return fmt.Sprintf("0x%x", st.Type)
}

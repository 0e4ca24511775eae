package overlay

import (
	"os"
	"testing"
)

// BenchmarkWrite1K is UnixBench fstime's write loop: 1 KiB writes,
// rewinding every 2000 blocks, through each {nosec} × {passthrough} mount.
//
//	go test -run XXX -bench Write1K ./overlay/
func BenchmarkWrite1K(b *testing.B) {
	for _, m := range matrix {
		b.Run(m.name, func(b *testing.B) {
			lo, up, work := b.TempDir(), b.TempDir(), b.TempDir()
			f, err := New(Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: m.mode, Passthrough: m.passthrough})
			if err != nil {
				b.Fatal(err)
			}
			mnt := b.TempDir()
			srv, err := f.Mount(mnt)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { srv.Unmount(); srv.Wait(); f.Close() }()
			w, err := os.Create(mnt + "/dummy")
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			buf := make([]byte, 1024)
			b.SetBytes(1024)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i%2000 == 0 {
					w.Seek(0, 0)
				}
				if _, err := w.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(f.privs.CapGetxattr.Load())*1000/float64(b.N), "getxattr/1000writes")
		})
	}
}

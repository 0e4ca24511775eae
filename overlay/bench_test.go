package overlay

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkWrite1K is UnixBench fstime's write loop: 1 KiB writes,
// rewinding every 2000 blocks, through each {nosec} × {passthrough} mount.
//
//	go test -run XXX -bench Write1K ./overlay/
func BenchmarkWrite1K(b *testing.B) {
	for _, m := range matrix {
		b.Run(m.name, func(b *testing.B) {
			lo, up, work := b.TempDir(), b.TempDir(), b.TempDir()
			mnt, f := mountFS(b, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: m.mode, Passthrough: m.passthrough, OpenRequests: m.opens, Writeback: m.writeback})
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

// BenchmarkReaddir reads the names of a merged directory of 20,000
// entries, spread over three lowers and the upper, again and again: the
// daemon's share of a warm readdir (bench's readdir-100k).
//
//	go test -run XXX -bench Readdir -cpuprofile /tmp/cpu.out ./overlay/
func BenchmarkReaddir(b *testing.B) {
	const n = 20000
	layers := []string{b.TempDir(), b.TempDir(), b.TempDir()}
	up, work := b.TempDir(), b.TempDir()
	for i := 0; i < n; i++ {
		dir := layers[i%3]
		if i%40 == 0 {
			dir = up
		}
		if err := os.MkdirAll(dir+"/big", 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(fmt.Sprintf("%s/big/f%06d", dir, i), nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	mnt := mountT(b, Options{Lower: layers, Upper: up, Work: work, NoSec: NoSecOn, Passthrough: true, OpenRequests: true})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, err := os.Open(mnt + "/big")
		if err != nil {
			b.Fatal(err)
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil || len(names) != n {
			b.Fatalf("%d names, %v", len(names), err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "entries/s")
}

// BenchmarkCreate is the bench's metadata workload in process: create
// (O_CREAT|O_EXCL, close) and unlink empty files in a directory of the
// lower layer, through mounts with and without passthrough, so that
// -cpuprofile shows where the daemon's time goes:
//
//	go test -run XXX -bench Create -cpuprofile /tmp/create.prof ./overlay/
func BenchmarkCreate(b *testing.B) {
	for _, m := range matrix[:2] {
		b.Run(m.name, func(b *testing.B) {
			lo, up, work := b.TempDir(), b.TempDir(), b.TempDir()
			if err := os.Mkdir(lo+"/d", 0o755); err != nil {
				b.Fatal(err)
			}
			mnt := mountT(b, Options{Lower: []string{lo}, Upper: up, Work: work, NoSec: m.mode, Passthrough: m.passthrough, OpenRequests: m.opens, Writeback: m.writeback})
			dir := mnt + "/d/"
			names := make([]string, 256)
			for i := range names {
				names[i] = dir + "f" + strconv.Itoa(i)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p := names[i%len(names)]
				fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
				if err != nil {
					b.Fatal(err)
				}
				unix.Close(fd)
				if i%len(names) == len(names)-1 {
					for _, p := range names {
						if err := unix.Unlink(p); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
		})
	}
}

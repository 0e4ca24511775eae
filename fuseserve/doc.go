// Package fuseserve is goverlay's FUSE transport: how the kernel's
// requests reach a filesystem written against go-fuse's RawFileSystem.
// Mount mounts it and has go-fuse's server read /dev/fuse, with the Go
// scheduler tuned for its readers (yield.go); where the kernel offers FUSE
// over io_uring, one queue per CPU answers requests through go-fuse's
// ProtocolServer (uring.go). What a request means is the filesystem's:
// fuseserve imports nothing of goverlay's.
package fuseserve

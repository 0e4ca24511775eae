// Package fuseserve is goverlay's FUSE transport: how the kernel's
// requests reach a filesystem written against go-fuse's RawFileSystem.
// Mount mounts it, with mount(2) or through fusermount3, keeping the
// /dev/fuse descriptor (mount.go), and has go-fuse's server read
// requests there, with the Go scheduler tuned for its readers (yield.go);
// where the kernel offers FUSE over io_uring, one queue per CPU answers
// requests through go-fuse's ProtocolServer (uring.go). What a request
// means is the filesystem's: fuseserve imports nothing of goverlay's.
package fuseserve

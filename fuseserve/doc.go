// Package fuseserve is goverlay's FUSE transport: how the kernel's
// requests reach a filesystem written against go-fuse's RawFileSystem.
// Mount mounts it, with mount(2) or through fusermount3, keeping the
// /dev/fuse descriptor (mount.go); go-fuse's server answers INIT, and one
// inline reader per mount serves the requests through go-fuse's
// ProtocolServer (inline.go), with the Go scheduler tuned for it
// (yield.go); where the kernel offers FUSE over io_uring, one queue per
// CPU answers them instead (uring.go). What a request
// means is the filesystem's: fuseserve imports nothing of goverlay's.
package fuseserve

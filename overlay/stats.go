package overlay

import "sync/atomic"

// stats counts what the mount did, for `goverlay stats`.
type stats struct {
	copyUps   atomic.Uint64
	whiteouts atomic.Uint64
	// COPY_FILE_RANGE requests served by copying between the layers' files
	copyRanges atomic.Uint64
	// opens by the I/O mode they got
	opensPassthrough, opensCached atomic.Uint64
	// lookups that reached the daemon, those that found nothing, and
	// attribute refreshes (GETATTR) served
	lookups, negativeLookups, getattrs atomic.Uint64
	// files whose data a LOOKUP started reading during a read walk
	prefetches atomic.Uint64
	// directories instantiated, by their fast-exec bit
	fastExecDirs, restrictedDirs atomic.Uint64
}

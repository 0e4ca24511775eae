# goverlay: build, install and uninstall.
#
#   make                  build ./goverlay, ./goverlay-bench (goverlay bench
#                         runs it) and ./goverlay-mount (the shared server's
#                         quick mount command, in C: it needs cc), static,
#                         the version from git describe
#   make install          install the three and the man page (as root)
#   make uninstall        remove what install put in place
#   make man              regenerate docs/goverlay.1 from docs/goverlay.1.md
#   make check            go vet and the test suite (as root: tests mount)
#
# PREFIX, BINDIR, MANDIR and DESTDIR work as in other projects' Makefiles:
# make install PREFIX=/usr puts the binary in /usr/bin.
#
# mount -t fuse.goverlay runs mount.fuse3, which runs "/bin/sh -c 'goverlay
# SOURCE MOUNTPOINT -o OPTS'"; mount(8) gives its helpers the PATH
# /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin whatever the
# caller's, so the binary must be in one of those directories: BINDIR is
# /usr/local/bin or /usr/bin for that. containers/storage runs the absolute
# path given as mount_program.

PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
MANDIR  ?= $(PREFIX)/share/man
DESTDIR ?=

GO      ?= go
CC      ?= cc
CFLAGS  ?= -O2 -Wall -Wextra
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
LDFLAGS := $(if $(VERSION),-X main.version=$(VERSION))

# Static: a mount starts goverlay twice, and the dynamic loader was a
# quarter of each start (docs/BENCHMARKS.md, "Many mounts of one image").
CGO_ENABLED ?= 0
export CGO_ENABLED

.PHONY: all install uninstall man check clean

# BIN is where the build goes; BENCH and MOUNT beside it.
BIN     ?= goverlay
BENCH   ?= $(dir $(BIN))goverlay-bench
MOUNT   ?= $(dir $(BIN))goverlay-mount

all: $(BIN) $(BENCH) $(MOUNT)

# Always rebuilt: go build knows what is stale.
$(BIN): FORCE
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./cmd/goverlay

$(BENCH): FORCE
	$(GO) build -trimpath -o $@ ./cmd/goverlay-bench

# goverlay-mount is C: it starts in 2 ms, a Go program in 5 (its source
# says why). Static for the same reason as goverlay.
$(MOUNT): cmd/goverlay-mount/goverlay-mount.c
	$(CC) $(CFLAGS) -static -o $@ cmd/goverlay-mount/goverlay-mount.c

FORCE:

install: $(BIN) $(BENCH) $(MOUNT) docs/goverlay.1
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1
	install -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/goverlay
	install -m 0755 $(BENCH) $(DESTDIR)$(BINDIR)/goverlay-bench
	install -m 0755 $(MOUNT) $(DESTDIR)$(BINDIR)/goverlay-mount
	install -m 0644 docs/goverlay.1 $(DESTDIR)$(MANDIR)/man1/goverlay.1
	@test -n "$(DESTDIR)" || mandb -q >/dev/null 2>&1 || true

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/goverlay $(DESTDIR)$(BINDIR)/goverlay-bench $(DESTDIR)$(BINDIR)/goverlay-mount $(DESTDIR)$(MANDIR)/man1/goverlay.1
	@test -n "$(DESTDIR)" || mandb -q >/dev/null 2>&1 || true

man: FORCE
	$(GO) tool go-md2man -in docs/goverlay.1.md -out docs/goverlay.1

check:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...

clean:
	rm -f $(BIN) $(BENCH) $(MOUNT)

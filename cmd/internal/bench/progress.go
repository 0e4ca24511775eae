package bench

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress is the bar on a terminal and nothing otherwise: a log or a pipe
// gets only the table at the end.
type progress struct {
	bar *progressbar.ProgressBar
}

func newProgress(w io.Writer, steps int) *progress {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) || steps <= 0 {
		return &progress{}
	}
	bar := progressbar.NewOptions(steps,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("goverlay bench"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(24),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
	return &progress{bar: bar}
}

func (p *progress) describe(s string) {
	if p.bar != nil {
		p.bar.Describe(s)
	}
}

func (p *progress) add() {
	if p.bar != nil {
		p.bar.Add(1)
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		p.bar.Finish()
		p.bar.Clear()
		p.bar = nil
	}
}

package bench

import (
	"fmt"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// WriteSVG draws a grouped bar chart of the medians to path: one group per
// workload, one bar colour per target, each value relative to the kernel
// target's median on that workload (kernel = 1.0), so that KB/s, ops/s and
// µs share one axis. Times are inverted (kernel time / target time) so that
// a taller bar is always faster. Without a kernel result the first target
// that ran is the reference, and the title says so.
func (r *Report) WriteSVG(path string) error {
	p, width, height, err := r.chart()
	if err != nil {
		return err
	}
	c := vgsvg.New(width, height)
	p.Draw(draw.New(c))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// chart builds the plot and says how big to draw it.
func (r *Report) chart() (*plot.Plot, vg.Length, vg.Length, error) {
	r.finish()
	ref := r.Reference
	var targets []string
	for _, t := range r.Targets {
		if r.ran(t.Name) {
			targets = append(targets, t.Name)
		}
	}
	if ref == "" && len(targets) > 0 {
		ref = targets[0]
	}
	var workloads []string
	for _, w := range r.Config.Workloads {
		if res := r.result(w, ref); res != nil && res.Median != nil {
			workloads = append(workloads, w)
		}
	}

	p := plot.New()
	p.Title.Text = fmt.Sprintf("goverlay bench: median of %d run(s) per workload, normalised to %s = 1.0 (higher is faster)", r.Config.Runs, ref)
	p.Y.Label.Text = fmt.Sprintf("relative to %s (for µs: %s time / target time)", ref, ref)
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.X.Tick.Label.Rotation = math.Pi / 6
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YCenter
	p.Add(plotter.NewGrid())

	n := len(targets)
	barWidth := vg.Points(7)
	ymax := 1.0
	for i, t := range targets {
		vals := make(plotter.Values, len(workloads))
		for j, w := range workloads {
			res := r.result(w, t)
			if res == nil || res.Median == nil {
				continue
			}
			if v := r.relative(res, ref); v != nil {
				vals[j] = *v
				ymax = math.Max(ymax, *v)
			}
		}
		bars, err := plotter.NewBarChart(vals, barWidth)
		if err != nil {
			return nil, 0, 0, err
		}
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = vg.Length(0)
		bars.Offset = barWidth * vg.Length(float64(i)-float64(n-1)/2)
		p.Add(bars)
		p.Legend.Add(t, bars)
	}
	// Room above the bars for the legend.
	p.Y.Max = ymax * (1.15 + 0.06*float64(n))
	if len(workloads) > 0 {
		p.NominalX(workloads...)
	}
	// A line at 1.0: the reference.
	if line, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(workloads)) - 0.5, Y: 1}}); err == nil {
		line.LineStyle.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(line)
	}

	width := vg.Points(math.Max(700, float64(len(workloads))*(float64(n)*7+16)+120))
	return p, width, vg.Points(480), nil
}

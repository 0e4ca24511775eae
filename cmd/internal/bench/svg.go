package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The chart: one panel per kind of unit (throughput, latency, memory),
// one row per workload, and in each row one dot per target at its median
// with a whisker from its slowest to its fastest run. The x axis is the
// target's speed relative to the reference on a log scale, so that 0.5×
// and 2× lie as far from 1× on either side, and 30× does not squash the
// rest; right is always better.

// okabeIto is the Okabe–Ito palette, whose colours readers with any
// common colour vision deficiency tell apart, in the order the targets
// take them: native, kernel (black, the reference), fuse-overlayfs, then
// the goverlay variants.
var okabeIto = []color.Color{
	color.RGBA{0x56, 0xB4, 0xE9, 0xFF}, // sky blue
	color.RGBA{0x00, 0x00, 0x00, 0xFF}, // black
	color.RGBA{0xE6, 0x9F, 0x00, 0xFF}, // orange
	color.RGBA{0x00, 0x72, 0xB2, 0xFF}, // blue
	color.RGBA{0x00, 0x9E, 0x73, 0xFF}, // bluish green
	color.RGBA{0xCC, 0x79, 0xA7, 0xFF}, // reddish purple
	color.RGBA{0xD5, 0x5E, 0x00, 0xFF}, // vermilion
	color.RGBA{0xF0, 0xE4, 0x42, 0xFF}, // yellow
}

// glyphs give the targets shapes too, for print and grey scale: with the
// colours, no two of eight targets look alike.
var glyphs = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.BoxGlyph{}, draw.PyramidGlyph{}}

// chartPanel is one panel: the workloads whose units are of one kind, all
// relative to one reference target.
type chartPanel struct {
	Title string
	// Axis says what the x axis shows.
	Axis      string
	Reference string
	Workloads []string
	// Points has one entry per (workload, target) with a median.
	Points []chartPoint
}

// chartPoint is one target on one workload: the median and the extremes
// of its runs, as speed (or smallness) relative to the reference's median;
// Lo ≤ Med ≤ Hi.
type chartPoint struct {
	Workload, Target string
	Lo, Med, Hi      float64
}

// unitKind sorts a unit into the chart's panels.
func unitKind(unit string) string {
	switch unit {
	case "µs", "ms", "s", "ns":
		return "latency"
	case "MiB", "KiB", "bytes", "bytes/inode", "B":
		return "memory"
	}
	return "throughput"
}

// panels lays the report out as chart panels. Throughput and latency are
// relative to the kernel overlay (the first target that ran, without
// one); memory, which only FUSE daemons use, to fuse-overlayfs (else the
// first daemon that ran).
func (r *Report) panels() []chartPanel {
	r.finish()
	var ran []string
	for _, t := range r.Targets {
		if r.ran(t.Name) {
			ran = append(ran, t.Name)
		}
	}
	speedRef := r.Reference
	if speedRef == "" && len(ran) > 0 {
		speedRef = ran[0]
	}
	kinds := []struct{ kind, title string }{
		{"throughput", "Throughput"},
		{"latency", "Latency"},
		{"memory", "Daemon memory"},
	}
	var out []chartPanel
	for _, k := range kinds {
		p := chartPanel{Title: k.title, Reference: speedRef}
		if k.kind == "memory" {
			p.Reference = ""
			for _, cand := range append([]string{"fuse-overlayfs"}, ran...) {
				if res := r.firstOfKind(k.kind, cand); res != nil {
					p.Reference = cand
					break
				}
			}
		}
		if p.Reference == "" {
			continue
		}
		for _, w := range r.Config.Workloads {
			base := r.result(w, p.Reference)
			if base == nil || base.Median == nil || *base.Median <= 0 || unitKind(base.Unit) != k.kind {
				continue
			}
			units := base.Unit
			var pts []chartPoint
			for _, t := range ran {
				res := r.result(w, t)
				if res == nil || res.Median == nil || *res.Min <= 0 {
					continue
				}
				rel := func(v float64) float64 {
					if res.HigherIsBetter {
						return v / *base.Median
					}
					return *base.Median / v
				}
				lo, med, hi := rel(*res.Min), rel(*res.Median), rel(*res.Max)
				if lo > hi {
					lo, hi = hi, lo
				}
				pts = append(pts, chartPoint{Workload: w, Target: t, Lo: lo, Med: med, Hi: hi})
			}
			if len(pts) == 0 {
				continue
			}
			p.Workloads = append(p.Workloads, w+" ("+units+")")
			for i := range pts {
				pts[i].Workload = p.Workloads[len(p.Workloads)-1]
			}
			p.Points = append(p.Points, pts...)
		}
		if len(p.Workloads) == 0 {
			continue
		}
		switch k.kind {
		case "memory":
			p.Axis = fmt.Sprintf("%s's memory ÷ the target's (right: smaller)", p.Reference)
		case "latency":
			p.Axis = fmt.Sprintf("%s's time ÷ the target's (right: faster)", p.Reference)
		default:
			p.Axis = fmt.Sprintf("the target's rate ÷ %s's (right: faster)", p.Reference)
		}
		out = append(out, p)
	}
	return out
}

// firstOfKind returns a result of target with a median on a workload whose
// unit is of kind.
func (r *Report) firstOfKind(kind, target string) *Result {
	for _, res := range r.Results {
		if res.Target == target && res.Median != nil && *res.Median > 0 && unitKind(res.Unit) == kind {
			return res
		}
	}
	return nil
}

// WriteSVG writes the chart to path (see WriteChart).
func (r *Report) WriteSVG(path string) error {
	return r.WriteChart(path)
}

// WriteChart writes the chart to path, as PNG when path ends in ".png" and
// as SVG otherwise.
func (r *Report) WriteChart(path string) error {
	return r.writeChart(path, strings.EqualFold(filepath.Ext(path), ".png"))
}

func (r *Report) writeChart(path string, asPNG bool) error {
	panels := r.panels()
	if len(panels) == 0 {
		return fmt.Errorf("no results to chart")
	}
	var targets []string
	seen := map[string]bool{}
	for _, t := range r.Targets {
		for _, p := range panels {
			for _, pt := range p.Points {
				if pt.Target == t.Name && !seen[t.Name] {
					seen[t.Name] = true
					targets = append(targets, t.Name)
				}
			}
		}
	}
	lay := newChartLayout(panels, targets)
	var cw vg.CanvasWriterTo
	if asPNG {
		cw = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(lay.width, lay.height), vgimg.UseDPI(144))}
	} else {
		cw = vgsvg.New(lay.width, lay.height)
	}
	dc := draw.New(cw)
	if err := r.drawChart(dc, lay, panels, targets); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := cw.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// chartLayout is the size of the figure and of its parts, top to bottom:
// title, subtitle, legend rows, then the panels, their workload names in a
// column of their own on the left so that the panels line up.
type chartLayout struct {
	width, height vg.Length
	header        vg.Length
	labelWidth    vg.Length
	legendRows    [][]int // indexes into the targets
	panelHeights  []vg.Length
}

const (
	chartWidth   = 760 // points
	rowPitch     = 4   // points of height per target in a workload's row
	rowPadding   = 10  // points between rows
	panelChrome  = 72  // points of a panel's title, x axis, its label and the gap below
	legendSwatch = 16  // points from a legend glyph to its name
	legendGap    = 18  // points between legend entries
	legendPitch  = 18  // points between legend rows
)

var (
	labelStyle  = textStyle(10, draw.XRight, draw.YCenter)
	legendStyle = textStyle(10.5, draw.XLeft, draw.YCenter)
)

func newChartLayout(panels []chartPanel, targets []string) chartLayout {
	l := chartLayout{width: vg.Points(chartWidth)}
	// Legend entries fill rows as wide as the figure less its margins.
	var row []int
	x := vg.Length(0)
	for i, t := range targets {
		w := legendSwatch + legendStyle.Width(t)
		if len(row) > 0 && x+legendGap+w > l.width-40 {
			l.legendRows = append(l.legendRows, row)
			row, x = nil, 0
		}
		if len(row) > 0 {
			x += legendGap
		}
		row = append(row, i)
		x += w
	}
	l.legendRows = append(l.legendRows, row)
	l.header = vg.Points(58 + legendPitch*float64(len(l.legendRows)))
	for _, p := range panels {
		for _, w := range p.Workloads {
			l.labelWidth = max(l.labelWidth, labelStyle.Width(w))
		}
	}
	l.labelWidth += 12
	l.height = l.header
	for _, p := range panels {
		h := vg.Points(float64(len(p.Workloads))*(float64(len(targets))*rowPitch+rowPadding) + panelChrome)
		l.panelHeights = append(l.panelHeights, h)
		l.height += h
	}
	return l
}

func textStyle(size vg.Length, xa text.XAlignment, ya text.YAlignment) text.Style {
	return text.Style{
		Color:   color.Black,
		Font:    font.From(plot.DefaultFont, size),
		XAlign:  xa,
		YAlign:  ya,
		Handler: plot.DefaultTextHandler,
	}
}

func (r *Report) drawChart(dc draw.Canvas, lay chartLayout, panels []chartPanel, targets []string) error {
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	top := dc.Max.Y
	mid := (dc.Min.X + dc.Max.X) / 2

	title := "goverlay bench: each target against the kernel overlay"
	if ref := panels[0].Reference; ref != "kernel" {
		title = "goverlay bench: each target against " + ref
	}
	dc.FillText(textStyle(15, draw.XCenter, draw.YTop), vg.Point{X: mid, Y: top - 8}, title)
	m := r.Machine
	sub := fmt.Sprintf("dot: median of %d run(s); whisker: slowest to fastest run; log scale, right is better", r.Config.Runs)
	if m.Kernel != "" {
		sub += fmt.Sprintf(" · Linux %s, %d CPU(s), scratch on %s", m.Kernel, m.NProc, m.ScratchFS)
	}
	dc.FillText(textStyle(9.5, draw.XCenter, draw.YTop), vg.Point{X: mid, Y: top - 28}, sub)

	// The legend: rows of each target's glyph and name, centred.
	y := top - 56
	for _, row := range lay.legendRows {
		total := vg.Length(0)
		for k, i := range row {
			if k > 0 {
				total += legendGap
			}
			total += legendSwatch + legendStyle.Width(targets[i])
		}
		x := mid - total/2
		for _, i := range row {
			dc.DrawGlyph(glyphStyle(i, 4), vg.Point{X: x + 5, Y: y})
			dc.FillText(legendStyle, vg.Point{X: x + legendSwatch, Y: y}, targets[i])
			x += legendSwatch + legendStyle.Width(targets[i]) + legendGap
		}
		y -= legendPitch
	}

	y = top - lay.header
	for i, p := range panels {
		h := lay.panelHeights[i]
		// Bottom gap between panels, and the label column on the left.
		c := draw.Crop(dc, lay.labelWidth, -12, y-h+10-dc.Min.Y, y-dc.Max.Y)
		pl, err := panelPlot(p, targets)
		if err != nil {
			return err
		}
		pl.Draw(c)
		// The workload names, level with their rows.
		da := pl.DataCanvas(c)
		_, trY := pl.Transforms(&da)
		for j, w := range p.Workloads {
			dc.FillText(labelStyle, vg.Point{X: c.Min.X - 6, Y: trY(float64(len(p.Workloads) - 1 - j))}, w)
		}
		y -= h
	}
	return nil
}

func glyphStyle(i int, radius vg.Length) draw.GlyphStyle {
	return draw.GlyphStyle{Color: okabeIto[i%len(okabeIto)], Radius: radius, Shape: glyphs[i%len(glyphs)]}
}

// panelPlot builds one panel as a gonum plot: workloads on the y axis,
// top to bottom in the order they ran, each target a little below the
// previous one in its row.
func panelPlot(p chartPanel, targets []string) (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = p.Title
	pl.Title.TextStyle.Font.Size = 12
	pl.Title.Padding = vg.Points(4)
	pl.X.Label.Text = p.Axis
	pl.X.Label.TextStyle.Font.Size = 10
	pl.X.Scale = plot.LogScale{}
	pl.X.Tick.Marker = ratioTicks{}
	pl.X.Tick.Label.Font.Size = 9.5
	pl.Y.Tick.Label.Font.Size = 10
	pl.Y.Tick.Length = 0
	pl.Y.Padding = 0

	n := len(p.Workloads)
	row := map[string]int{}
	for i, w := range p.Workloads {
		row[w] = n - 1 - i
	}
	lo, hi := 1.0, 1.0
	for _, pt := range p.Points {
		lo, hi = math.Min(lo, pt.Lo), math.Max(hi, pt.Hi)
	}
	// Room for the value labels right of the whiskers.
	lo, hi = lo/1.25, hi*2.2
	pl.X.Min, pl.X.Max = lo, hi
	pl.Y.Min, pl.Y.Max = -0.6, float64(n)-0.4

	// Grid lines at the ticks, and a line at 1: as good as the reference.
	grid := plotter.NewGrid()
	grid.Horizontal.Color = color.Transparent
	grid.Vertical.Color = color.Gray{0xDD}
	pl.Add(grid)
	if one, err := plotter.NewLine(plotter.XYs{{X: 1, Y: -0.6}, {X: 1, Y: float64(n) - 0.4}}); err == nil {
		one.LineStyle.Color = color.Gray{0x55}
		one.LineStyle.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		pl.Add(one)
	}

	nt := len(targets)
	for ti, t := range targets {
		d := &dotRanges{style: glyphStyle(ti, 3.2), label: strings.HasPrefix(t, "goverlay") && ti == firstGoverlay(targets)}
		for _, pt := range p.Points {
			if pt.Target != t {
				continue
			}
			// Spread the targets over 70% of the row, first on top.
			off := 0.0
			if nt > 1 {
				off = 0.35 - 0.7*float64(ti)/float64(nt-1)
			}
			d.pts = append(d.pts, chartPoint{Workload: pt.Workload, Target: t, Lo: pt.Lo, Med: pt.Med, Hi: pt.Hi})
			d.ys = append(d.ys, float64(row[pt.Workload])+off)
		}
		pl.Add(d)
	}
	// The names are drawn beside the panel (drawChart), so that every
	// panel's plot area starts at the same x.
	ticks := make([]plot.Tick, n)
	for i := range ticks {
		ticks[i] = plot.Tick{Value: float64(i)}
	}
	pl.Y.Tick.Marker = plot.ConstantTicks(ticks)
	return pl, nil
}

// firstGoverlay is the index of the first goverlay target: its medians
// get a value label.
func firstGoverlay(targets []string) int {
	for i, t := range targets {
		if strings.HasPrefix(t, "goverlay") {
			return i
		}
	}
	return -1
}

// dotRanges draws one target's points of a panel: a whisker from Lo to Hi
// and the target's glyph at Med, and, with label set, the median as text
// right of the whisker.
type dotRanges struct {
	pts   []chartPoint
	ys    []float64
	style draw.GlyphStyle
	label bool
}

func (d *dotRanges) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	line := draw.LineStyle{Color: d.style.Color, Width: vg.Points(1.3)}
	lbl := textStyle(8.5, draw.XLeft, draw.YCenter)
	for i, pt := range d.pts {
		y := trY(d.ys[i])
		x0, x1 := trX(pt.Lo), trX(pt.Hi)
		c.StrokeLine2(line, x0, y, x1, y)
		c.StrokeLine2(line, x0, y-2.5, x0, y+2.5)
		c.StrokeLine2(line, x1, y-2.5, x1, y+2.5)
		c.DrawGlyph(d.style, vg.Point{X: trX(pt.Med), Y: y})
		if d.label {
			c.FillText(lbl, vg.Point{X: x1 + 5, Y: y}, fmtRatio(pt.Med))
		}
	}
}

// DataRange is fixed by panelPlot; the points never widen it.
func (d *dotRanges) DataRange() (xmin, xmax, ymin, ymax float64) {
	return math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
}

// fmtRatio prints a ratio with two significant digits and a ×.
func fmtRatio(v float64) string {
	switch {
	case v >= 10:
		return fmt.Sprintf("%.0f×", v)
	case v >= 1:
		return fmt.Sprintf("%.1f×", v)
	case v >= 0.01:
		return fmt.Sprintf("%.2f×", v)
	default:
		return strconv.FormatFloat(v, 'g', 2, 64) + "×"
	}
}

// ratioTicks marks a log axis at 1, 2 and 5 times powers of ten, labelled
// as ratios ("0.5×", "1×", "20×"): more finely on an axis that spans less
// than a decade, only at powers of ten on one that spans more than four.
type ratioTicks struct{}

func (ratioTicks) Ticks(min, max float64) []plot.Tick {
	var steps []float64
	switch span := max / min; {
	case span < 4:
		steps = []float64{1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9}
	case span < 12:
		steps = []float64{1, 1.5, 2, 3, 5, 7}
	case span <= 1e4:
		steps = []float64{1, 2, 5}
	default:
		steps = []float64{1}
	}
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(min)); e <= math.Ceil(math.Log10(max)); e++ {
		for _, s := range steps {
			v := s * math.Pow(10, e)
			if v < min || v > max {
				continue
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: trimRatio(v)})
		}
	}
	return ticks
}

// trimRatio labels a tick: "0.05×", "1×", "200×".
func trimRatio(v float64) string {
	s := fmt.Sprintf("%.6f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + "×"
}

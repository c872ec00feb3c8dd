package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// chartContenders are the bars of each panel, top to bottom.
var chartContenders = []string{"raw-wazero", "extism-sdk", "wasmtools-sandbox", "native", "wasmtools", "process-per-session"}

// chartLabels name the contenders for readers of the chart.
var chartLabels = map[string]string{
	"raw-wazero":          "raw wazero, no MCP (floor)",
	"extism-sdk":          "Extism Go SDK, no MCP",
	"wasmtools-sandbox":   "wasmtools sandbox, no MCP",
	"native":              "native Go tool, MCP, no isolation",
	"wasmtools":           "wasmtools, MCP session",
	"process-per-session": "process per session, MCP",
}

// chartSeries are the two plugins, one bar each per contender.
var chartSeries = []struct {
	cas, label string
	color      color.Color
}{
	{"small", "small plugin (600-byte WAT)", color.RGBA{R: 0x4c, G: 0x78, B: 0xa8, A: 0xff}},
	{"go", "Go plugin (Extism Go PDK)", color.RGBA{R: 0xf5, G: 0x85, B: 0x18, A: 0xff}},
}

// panel is one chart: a metric of one benchmark on a log scale.
type panel struct {
	title, bench, unit string
	// scale converts the metric to the axis unit; ticks label the powers
	// of ten of the axis unit, from 10⁰ up.
	scale float64
	ticks []string
}

var panels = []panel{
	{
		title: "New session: first call (lower is better)", bench: "SessionStart", unit: "ns/op",
		scale: 1e-3, ticks: []string{"1 µs", "10 µs", "100 µs", "1 ms", "10 ms", "100 ms", "1 s", "10 s"},
	},
	{
		title: "Memory per idle session (lower is better)", bench: "IdleSessionMemory", unit: "KiB/session",
		scale: 1, ticks: []string{"1 KiB", "10 KiB", "100 KiB", "1 MiB", "10 MiB", "100 MiB", "1 GiB"},
	},
}

// Chart draws the session-start cost and memory per idle session of every
// contender, for both plugins, as a PNG.
func Chart(r *Results, w io.Writer) error {
	const width, height = 13 * vg.Inch, 5.5 * vg.Inch
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
	plotter.DefaultFont = plot.DefaultFont
	var plots []*plot.Plot
	for _, pn := range panels {
		p, err := pn.plot(r)
		if err != nil {
			return err
		}
		plots = append(plots, p)
	}
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(120))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(18), PadX: vg.Points(36)}
	canvases := plot.Align([][]*plot.Plot{plots}, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[0][i])
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("write chart: %w", err)
	}
	return nil
}

func (pn panel) plot(r *Results) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.title
	p.Title.TextStyle.Font.Size = vg.Points(13)
	// Contenders top to bottom: the nominal axis counts from the bottom.
	// The empty name on top leaves room for the legend.
	names := slices.Clone(chartContenders)
	slices.Reverse(names)
	var labels []string
	for _, n := range names {
		labels = append(labels, chartLabels[n])
	}
	p.NominalY(append(labels, "")...)
	p.Y.Min, p.Y.Max = -0.6, float64(len(names))+0.2
	p.Y.Tick.Label.Font.Size = vg.Points(11)
	p.X.Tick.Label.Font.Size = vg.Points(10)
	p.X.Label.Text = "log scale"
	p.X.Label.TextStyle.Font.Size = vg.Points(9)
	maxLog := 1.0
	for si, s := range chartSeries {
		vals := make(plotter.Values, len(names))
		var xys plotter.XYs
		var labels []string
		shift := 0.18
		if si == 0 {
			shift = -0.18
		}
		for i, who := range names {
			v, ok := r.Median(pn.bench+"/"+s.cas+"/"+who, pn.unit)
			if !ok || v <= 0 {
				continue
			}
			x := math.Max(math.Log10(v*pn.scale), 0.02)
			vals[i] = x
			maxLog = math.Max(maxLog, x)
			xys = append(xys, plotter.XY{X: x, Y: float64(i) - shift})
			labels = append(labels, " "+formatValue(v, pn.unit))
		}
		bars, err := plotter.NewBarChart(vals, vg.Points(13))
		if err != nil {
			return nil, err
		}
		bars.Horizontal = true
		bars.XMin = -shift
		bars.Color = s.color
		bars.LineStyle.Width = 0
		p.Add(bars)
		p.Legend.Add(s.label, bars)
		if len(xys) > 0 {
			l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
			if err != nil {
				return nil, err
			}
			for i := range l.TextStyle {
				l.TextStyle[i].Font.Size = vg.Points(9)
				l.TextStyle[i].YAlign = draw.YCenter
			}
			p.Add(l)
		}
	}
	p.X.Min = 0
	p.X.Max = math.Min(math.Ceil(maxLog+0.6), float64(len(pn.ticks)-1))
	var ticks []plot.Tick
	for k := 0; k <= int(p.X.Max); k++ {
		ticks = append(ticks, plot.Tick{Value: float64(k), Label: pn.ticks[k]})
		for m := 2; m < 10 && k < int(p.X.Max); m++ {
			ticks = append(ticks, plot.Tick{Value: float64(k) + math.Log10(float64(m))})
		}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	grid := plotter.NewGrid()
	grid.Horizontal.Color = nil
	p.Add(grid)
	p.Legend.Top = true
	p.Legend.Left = false
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	return p, nil
}

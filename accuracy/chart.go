package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"strings"
	"text/template"
)

// series is one algorithm's line in the figure: the most admitted in the
// trailing W ms, per step of the time axis.
type series struct {
	name   string
	color  string
	from   int64   // ms from the boundary of the first point
	step   int64   // ms per point
	counts []int64 // per point, the most in the trailing W ms within its step
	peak   int64   // the most over the whole figure
}

// chartAlgorithms are the figure's panels, top to bottom, with their colors.
var chartAlgorithms = []struct{ name, color string }{
	{"fixed window", "#d62728"},
	{"sliding (this library)", "#1f77b4"},
	{"strict (k=10)", "#2ca02c"},
	{"exact log", "#444444"},
}

// boundaryChart replays the boundary attacker's first client through the
// figure's algorithms and returns, around its first attack, the admitted
// count of the trailing W ms: from W/12 before the boundary to W/12 after
// the next one.
func boundaryChart(c config, tr *traceResult) []series {
	var reqs []request
	for _, r := range tr.reqs {
		if r.client == 0 {
			reqs = append(reqs, r)
		}
	}
	if len(reqs) == 0 {
		return nil
	}
	// The first request opens the first attack, in the window before the
	// boundary.
	b := (reqs[0].t/c.Window + 1) * c.Window
	from, to, step := b-c.Window/12, b+c.Window+c.Window/12, max(c.Window/300, 1)

	var out []series
	for _, ca := range chartAlgorithms {
		d := algorithmNamed(ca.name).new(c.limit())
		s := series{name: ca.name, color: ca.color, from: from - b, step: step}
		var log spanLog
		next := 0
		for t := from; t < to; t += step {
			most := int64(0)
			for u := t; u < t+step; u++ {
				for ; next < len(reqs) && reqs[next].t <= u; next++ {
					if d.allow(reqs[next].t, int64(reqs[next].n)) {
						log.add(reqs[next].t, int64(reqs[next].n))
					}
				}
				log.expire(u, c.Window)
				most = max(most, log.sum)
			}
			s.counts = append(s.counts, most)
			s.peak = max(s.peak, most)
		}
		out = append(out, s)
	}
	return out
}

// algorithmNamed returns the algorithm of that name.
func algorithmNamed(name string) algorithm {
	for _, a := range algorithms {
		if a.name == name {
			return a
		}
	}
	panic("accuracy: no algorithm " + name)
}

// Layout of the figure, in SVG user units.
const (
	chartWidth  = 860
	panelHeight = 150
	panelGap    = 42
	marginLeft  = 78
	marginRight = 20
	marginTop   = 52
	plotHeight  = panelHeight - 20
)

type svgPanel struct {
	Top, Bottom float64 // y of the plot's top and of its x axis
	Title       string
	Color       string
	Points      string
	YTicks      []svgTick
	LimitY      float64
}

type svgTick struct {
	Pos   float64
	Label string
}

type svgChart struct {
	Width, Height      float64
	Left, Right        float64
	Title, Subtitle    string
	XLabel, YLabel     string
	XTicks             []svgTick
	Boundaries         []float64
	Panels             []svgPanel
	LimitLabel         string
	XLabelY, YLabelMid float64
}

var svgTemplate = template.Must(template.New("svg").Funcs(template.FuncMap{
	"add": func(a, b float64) float64 { return a + b },
	"sub": func(a, b float64) float64 { return a - b },
	"mid": func(a, b float64) float64 { return (a + b) / 2 },
}).Parse(`<svg xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" font-family="Helvetica, Arial, sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{{.Left}}" y="20" font-size="15" font-weight="bold">{{.Title}}</text>
<text x="{{.Left}}" y="38" fill="#555">{{.Subtitle}}</text>
{{- range .Panels}}
<g>
<text x="{{$.Left}}" y="{{printf "%.1f" .Top}}" dy="-6" font-weight="bold" fill="{{.Color}}">{{.Title}}</text>
<rect x="{{$.Left}}" y="{{printf "%.1f" .Top}}" width="{{printf "%.1f" (sub $.Right $.Left)}}" height="{{printf "%.1f" (sub .Bottom .Top)}}" fill="#fafafa" stroke="#ccc"/>
{{- $p := .}}
{{- range .YTicks}}
<line x1="{{$.Left}}" x2="{{$.Right}}" y1="{{printf "%.1f" .Pos}}" y2="{{printf "%.1f" .Pos}}" stroke="#e4e4e4"/>
<text x="{{$.Left}}" dx="-6" y="{{printf "%.1f" .Pos}}" dy="4" text-anchor="end" fill="#555">{{.Label}}</text>
{{- end}}
{{- range $.Boundaries}}
<line x1="{{printf "%.1f" .}}" x2="{{printf "%.1f" .}}" y1="{{printf "%.1f" $p.Top}}" y2="{{printf "%.1f" $p.Bottom}}" stroke="#999" stroke-dasharray="2,3"/>
{{- end}}
<line x1="{{$.Left}}" x2="{{$.Right}}" y1="{{printf "%.1f" .LimitY}}" y2="{{printf "%.1f" .LimitY}}" stroke="#000" stroke-dasharray="6,4"/>
<text x="{{printf "%.1f" (mid $.Left $.Right)}}" y="{{printf "%.1f" .LimitY}}" dy="15" text-anchor="middle">{{$.LimitLabel}}</text>
<polyline fill="none" stroke="{{.Color}}" stroke-width="2" stroke-linejoin="round" points="{{.Points}}"/>
{{- range $.XTicks}}
<line x1="{{printf "%.1f" .Pos}}" x2="{{printf "%.1f" .Pos}}" y1="{{printf "%.1f" $p.Bottom}}" y2="{{printf "%.1f" (add $p.Bottom 4)}}" stroke="#555"/>
<text x="{{printf "%.1f" .Pos}}" y="{{printf "%.1f" (add $p.Bottom 16)}}" text-anchor="middle" fill="#555">{{.Label}}</text>
{{- end}}
</g>
{{- end}}
<text x="{{printf "%.1f" (mid .Left .Right)}}" y="{{printf "%.1f" .XLabelY}}" text-anchor="middle">{{.XLabel}}</text>
<text transform="translate(18,{{printf "%.1f" .YLabelMid}}) rotate(-90)" text-anchor="middle">{{.YLabel}}</text>
</svg>
`))

// renderChart draws the series as stacked panels, one per algorithm, with
// the limit and the window boundaries marked.
func renderChart(c config, all []series) ([]byte, error) {
	if len(all) == 0 {
		return nil, fmt.Errorf("accuracy: no series to draw")
	}
	first := all[0]
	x0 := float64(first.from)
	x1 := float64(first.from + first.step*int64(len(first.counts)))
	left, right := float64(marginLeft), float64(chartWidth-marginRight)
	xPos := func(ms float64) float64 { return left + (ms-x0)/(x1-x0)*(right-left) }
	yMax := float64(2 * c.Rate)
	for _, s := range all {
		yMax = max(yMax, float64(s.peak))
	}
	yMax *= 1.08

	ch := svgChart{
		Width:      chartWidth,
		Left:       left,
		Right:      right,
		Title:      "Boundary attacker: admitted requests in the trailing window, around a window boundary",
		Subtitle:   esc(fmt.Sprintf("Limit R = %d per %s; the attacker sends R in the last %s before the boundary at 0, then keeps hammering.", c.Rate, seconds(c.Window), seconds(c.Window/60))),
		XLabel:     esc(fmt.Sprintf("time from the window boundary (s); dotted lines: boundaries of the %s windows", seconds(c.Window))),
		YLabel:     esc(fmt.Sprintf("admitted in the last %s", seconds(c.Window))),
		LimitLabel: esc(fmt.Sprintf("limit R = %d", c.Rate)),
		Boundaries: []float64{xPos(0), xPos(float64(c.Window))},
	}
	tick := c.Window / 6
	for t := -(-int64(x0) / tick) * tick; float64(t) < x1; t += tick { // from ceil(x0/tick) ticks
		ch.XTicks = append(ch.XTicks, svgTick{xPos(float64(t)), fmt.Sprintf("%g", float64(t)/1000)})
	}
	for i, s := range all {
		top := float64(marginTop + i*(panelHeight+panelGap) + 16)
		bottom := top + plotHeight
		yPos := func(v float64) float64 { return bottom - v/yMax*(bottom-top) }
		var pts strings.Builder
		for k, v := range s.counts {
			// Each count holds for its step: draw it flat across the step.
			xa := xPos(float64(s.from + int64(k)*s.step))
			xb := xPos(float64(s.from + int64(k+1)*s.step))
			fmt.Fprintf(&pts, "%.1f,%.1f %.1f,%.1f ", xa, yPos(float64(v)), xb, yPos(float64(v)))
		}
		p := svgPanel{
			Top: top, Bottom: bottom, Color: s.color,
			Title:  esc(fmt.Sprintf("%s: at most %.2f× R in any %s", s.name, float64(s.peak)/float64(c.Rate), seconds(c.Window))),
			Points: strings.TrimSpace(pts.String()),
			LimitY: yPos(float64(c.Rate)),
		}
		for _, v := range []int64{0, c.Rate / 2, c.Rate, 3 * c.Rate / 2, 2 * c.Rate} {
			p.YTicks = append(p.YTicks, svgTick{yPos(float64(v)), fmt.Sprintf("%d", v)})
		}
		ch.Panels = append(ch.Panels, p)
	}
	lastBottom := ch.Panels[len(ch.Panels)-1].Bottom
	ch.XLabelY = lastBottom + 36
	ch.Height = lastBottom + 50
	ch.YLabelMid = (float64(marginTop) + lastBottom) / 2

	var buf bytes.Buffer
	if err := svgTemplate.Execute(&buf, ch); err != nil {
		return nil, fmt.Errorf("accuracy: drawing the chart: %w", err)
	}
	return buf.Bytes(), nil
}

// esc escapes text for XML.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder never fails
	return b.String()
}

// seconds formats ms as seconds: "60 s", "1 s".
func seconds(ms int64) string {
	if ms%1000 == 0 {
		return fmt.Sprintf("%d s", ms/1000)
	}
	return fmt.Sprintf("%g s", float64(ms)/1000)
}

package httplimit

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

// sfItem is one member of a Structured Fields List whose value is a bare
// item: a string, token, integer or boolean, with its parameters in order.
type sfItem struct {
	Value  any // string (sf-string), sfToken, int64 or bool
	Params []sfParam
}

type sfToken string

type sfParam struct {
	Key   string
	Value any
}

// parseSFList parses s as an sf-list (RFC 9651 §4.2.1), strictly: anything
// that is not valid, and inner lists, decimals, byte sequences, dates and
// display strings, which the middleware never sends, is an error.
func parseSFList(s string) ([]sfItem, error) {
	p := &sfParser{s: s}
	p.skipSP()
	var items []sfItem
	for p.i < len(p.s) {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		items = append(items, it)
		p.skipOWS()
		if p.i == len(p.s) {
			return items, nil
		}
		if p.s[p.i] != ',' {
			return nil, p.errorf("expected ',' after a list member")
		}
		p.i++
		p.skipOWS()
		if p.i == len(p.s) {
			return nil, p.errorf("trailing comma")
		}
	}
	if len(items) == 0 {
		return nil, errors.New("empty list") // a field that is sent must not be empty
	}
	return items, nil
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) errorf(format string, args ...any) error {
	return fmt.Errorf("at %d of %q: %s", p.i, p.s, fmt.Sprintf(format, args...))
}

func (p *sfParser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	v, err := p.bareItem()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{Value: v}
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return sfItem{}, err
		}
		var val any = true
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			if val, err = p.bareItem(); err != nil {
				return sfItem{}, err
			}
		}
		for _, prm := range it.Params {
			if prm.Key == key {
				return sfItem{}, p.errorf("parameter %q twice", key)
			}
		}
		it.Params = append(it.Params, sfParam{key, val})
	}
	return it, nil
}

func (p *sfParser) bareItem() (any, error) {
	if p.i == len(p.s) {
		return nil, p.errorf("expected an item")
	}
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		return p.integer()
	case c == '"':
		return p.str()
	case c == '*' || isAlpha(c):
		return p.token(), nil
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, p.errorf("bad boolean")
	}
	return nil, p.errorf("not a string, token, integer or boolean")
}

func (p *sfParser) integer() (int64, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits := p.i
	for p.i < len(p.s) && isDigit(p.s[p.i]) {
		p.i++
	}
	if n := p.i - digits; n == 0 || n > 15 {
		return 0, p.errorf("integer needs 1 to 15 digits")
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		return 0, p.errorf("decimals are not expected")
	}
	return strconv.ParseInt(p.s[start:p.i], 10, 64)
}

func (p *sfParser) str() (string, error) {
	p.i++ // the opening quote
	var out []byte
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i == len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return "", p.errorf("bad escape in string")
			}
			out = append(out, p.s[p.i])
			p.i++
		case c == '"':
			return string(out), nil
		case c < 0x20 || c > 0x7e:
			return "", p.errorf("byte %#x in string", c)
		default:
			out = append(out, c)
		}
	}
	return "", p.errorf("unterminated string")
}

func (p *sfParser) token() sfToken {
	start := p.i
	p.i++
	for p.i < len(p.s) && (isTChar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
		p.i++
	}
	return sfToken(p.s[start:p.i])
}

func (p *sfParser) key() (string, error) {
	if p.i == len(p.s) || !(p.s[p.i] == '*' || isLCAlpha(p.s[p.i])) {
		return "", p.errorf("bad key")
	}
	start := p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || ('A' <= c && c <= 'Z') }
func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || (c < 0x80 && c > 0x20 && indexByte("!#$%&'*+-.^_`|~", c))
}

func indexByte(s string, c byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return true
		}
	}
	return false
}

// TestParserRejects keeps the parser honest: it must fail on what is not a
// valid list of the kind the middleware sends.
func TestParserRejects(t *testing.T) {
	for _, s := range []string{
		``, `"a`, `"a";q=`, `"a";q=x y`, `"a";Q=1`, `"a";q=1,`, `"a" "b"`, `"a\n"`, `"a\x"`, `"é"`,
		`"a";q=1.5`, `"a";q=1234567890123456`, `"a";q=1;q=2`, `("a")`, `"a";=1`, `"a",,"b"`,
	} {
		_, err := parseSFList(s)
		require.Error(t, err, s)
	}
	got, err := parseSFList(` "a\"b";q=-3;w=?1, tok/x:y;z`)
	require.NoError(t, err)
	require.Equal(t, []sfItem{
		{Value: `a"b`, Params: []sfParam{{"q", int64(-3)}, {"w", true}}},
		{Value: sfToken("tok/x:y"), Params: []sfParam{{"z", true}}},
	}, got)
}

// TestIETFHeadersAreStructuredFields sends every kind of decision, under
// names and limits of every awkward kind, and parses each RateLimit-Policy
// and RateLimit value as an sf-list of one string item with the expected
// integer parameters.
func TestIETFHeadersAreStructuredFields(t *testing.T) {
	names := []struct{ given, sent string }{
		{"default", "default"},
		{`say "hi"`, `say "hi"`},
		{`back\slash`, `back\slash`},
		{"tab\tnew\nline", "tab_new_line"},
		{"naïve", "na__ve"},
		{"", "100-per-60s"},
	}
	limits := []ratelimit.Limit{
		ratelimit.PerMinute(100), ratelimit.PerSecond(1), ratelimit.PerHour(1 << 40),
		{Rate: 5, Window: 1500 * time.Millisecond}, {Rate: 1, Window: time.Millisecond},
	}
	results := []ratelimit.Result{
		{Allowed: true, Count: 1, Remaining: 99, ResetAfter: 59_001 * time.Millisecond},
		{Allowed: false, Count: 100, RetryAfter: 1, ResetAfter: 2 * time.Minute},
		{Allowed: false, Count: 3, Remaining: 2, RetryAfter: ratelimit.InfDuration, ResetAfter: time.Millisecond},
		{Allowed: true, Degraded: true, Remaining: 100},
		{Allowed: true, Count: 0, Remaining: 1 << 40},
	}
	for _, n := range names {
		for _, limit := range limits {
			name, sent := n.given, n.sent
			if name == "" {
				name, sent = derivedName(limit), derivedName(limit)
			}
			for _, res := range results {
				res.Limit = limit
				h := http.Header{}
				setHeaders(h, allHeaders, newPlan([]ratelimit.Limit{named(limit, name)}), []ratelimit.Result{res}, res, time.Now)

				items, err := parseSFList(h.Get(HeaderPolicy))
				require.NoError(t, err)
				require.Equal(t, []sfItem{{Value: sent, Params: []sfParam{
					{"q", limit.Rate}, {"w", seconds(limit.Window)},
				}}}, items)
				require.GreaterOrEqual(t, seconds(limit.Window), int64(1))

				if res.Degraded {
					require.Empty(t, h.Values(HeaderRateLimit))
					continue
				}
				params := []sfParam{{"r", res.Remaining}, {"t", ResetSeconds(res)}}
				if res.RetryAfter == ratelimit.InfDuration { // can never pass: no t to retry at
					params = params[:1]
				}
				items, err = parseSFList(h.Get(HeaderRateLimit))
				require.NoError(t, err)
				require.Equal(t, []sfItem{{Value: sent, Params: params}}, items)
			}
		}
	}
}

// TestSeveralPoliciesAreStructuredFields sends decisions of plans of two
// and three policies, under awkward names, shadowed policies among them,
// and parses every rate-limit header: RateLimit-Policy and RateLimit as an
// sf-list of one string item per enforced policy, in order, with the
// expected integer parameters; the X-RateLimit headers and Retry-After as
// integers of the binding Result. A shadowed policy, and a decision shadow
// mode let through, appear nowhere.
func TestSeveralPoliciesAreStructuredFields(t *testing.T) {
	ms := time.Millisecond
	burst := named(ratelimit.PerSecond(10), "burst")
	daily := ratelimit.Limit{Name: `"daily", \quota`, Rate: 10_000, Window: 24 * time.Hour}
	odd := ratelimit.Limit{Name: "naïve\tmix", Rate: 7, Window: 1500 * ms, Strict: true}
	unnamed := ratelimit.PerMinute(100)
	shadowed := func(l ratelimit.Limit) ratelimit.Limit { l.Shadow = true; return l }
	plans := [][]ratelimit.Limit{
		{burst, daily},
		{daily, burst},
		{burst, unnamed, daily},
		{odd, burst},
		{burst, shadowed(daily)},
		{shadowed(burst), unnamed, daily},
		{shadowed(burst), shadowed(daily)},
	}
	// Each outcome gives the Results of one decision: result(i, last, limit)
	// is that of the i-th enforced policy, the last one if last. Shadowed
	// policies get a Result that would have denied, with the decision's
	// Allowed.
	outcomes := []struct {
		name    string
		allowed bool
		result  func(i int, last bool, limit ratelimit.Limit) ratelimit.Result
	}{
		{"allowed", true, func(i int, _ bool, limit ratelimit.Limit) ratelimit.Result {
			return ratelimit.Result{Count: int64(i + 1), Remaining: limit.Rate - int64(i+1), ResetAfter: time.Duration(i+1) * 700 * ms}
		}},
		{"denied by the first", false, func(i int, _ bool, limit ratelimit.Limit) ratelimit.Result {
			if i == 0 {
				return ratelimit.Result{Count: limit.Rate, RetryAfter: 300 * ms, ResetAfter: 2 * time.Second}
			}
			return ratelimit.Result{Count: 2, Remaining: limit.Rate - 2, ResetAfter: time.Hour}
		}},
		{"denied by all", false, func(i int, _ bool, limit ratelimit.Limit) ratelimit.Result {
			return ratelimit.Result{Count: limit.Rate, RetryAfter: time.Duration(i+1) * 1100 * ms, ResetAfter: 3 * time.Hour}
		}},
		{"never passes under the last", false, func(i int, last bool, limit ratelimit.Limit) ratelimit.Result {
			res := ratelimit.Result{Count: 1, Remaining: limit.Rate - 1, RetryAfter: time.Duration(i) * 500 * ms, ResetAfter: time.Second}
			if last {
				res.RetryAfter = ratelimit.InfDuration
			}
			return res
		}},
		{"degraded", true, func(_ int, _ bool, limit ratelimit.Limit) ratelimit.Result {
			return ratelimit.Result{Degraded: true, Remaining: limit.Rate}
		}},
		{"let through by WithShadow", true, func(_ int, _ bool, limit ratelimit.Limit) ratelimit.Result {
			return ratelimit.Result{Shadowed: true, Count: limit.Rate, RetryAfter: 2 * time.Second}
		}},
	}
	for pi, given := range plans {
		pl, err := NewPlan(given...)
		require.NoError(t, err)
		ps := pl.Limits()
		enforced := 0
		for _, p := range ps {
			if !p.Shadow {
				enforced++
			}
		}
		for _, o := range outcomes {
			t.Run(fmt.Sprintf("plan %d %s", pi, o.name), func(t *testing.T) {
				results := make([]ratelimit.Result, len(ps))
				e := 0
				for i, p := range ps {
					if p.Shadow {
						results[i] = ratelimit.Result{Shadowed: true, Count: p.Rate, RetryAfter: 2 * time.Second, ResetAfter: 5 * time.Second}
					} else {
						results[i] = o.result(e, e == enforced-1, p)
						e++
					}
					results[i].Limit = p
					results[i].Allowed = o.allowed
				}
				h := http.Header{}
				setHeaders(h, allHeaders, pl, results, ratelimit.Binding(results), time.Now)

				var wantPolicy, wantState []sfItem
				var visible []ratelimit.Result
				never := false
				for i, p := range ps {
					res := results[i]
					if p.Shadow || res.Shadowed {
						continue
					}
					visible = append(visible, res)
					never = never || (!res.Allowed && res.RetryAfter == ratelimit.InfDuration)
				}
				if len(visible) == 0 {
					require.Empty(t, h, "nothing is shown")
					return
				}
				for i, p := range ps {
					res := results[i]
					if p.Shadow || res.Shadowed {
						continue
					}
					name := p.Name
					if name == "" {
						name = derivedName(p)
					}
					sent := sfSent(name)
					wantPolicy = append(wantPolicy, sfItem{Value: sent, Params: []sfParam{{"q", p.Rate}, {"w", seconds(p.Window)}}})
					params := []sfParam{{"r", res.Remaining}, {"t", ResetSeconds(res)}}
					if never {
						params = params[:1]
					}
					wantState = append(wantState, sfItem{Value: sent, Params: params})
				}
				items, err := parseSFList(h.Get(HeaderPolicy))
				require.NoError(t, err)
				require.Equal(t, wantPolicy, items)

				b := ratelimit.Binding(visible)
				require.Equal(t, strconv.FormatInt(b.Limit.Rate, 10), h.Get(HeaderLimit))
				if visible[0].Degraded {
					require.Empty(t, h.Values(HeaderRateLimit))
					require.Empty(t, h.Values(HeaderRemaining))
					require.Empty(t, h.Values(HeaderReset))
					require.Empty(t, h.Values(HeaderRetryAfter))
					return
				}
				items, err = parseSFList(h.Get(HeaderRateLimit))
				require.NoError(t, err)
				require.Equal(t, wantState, items)

				require.Equal(t, strconv.FormatInt(b.Remaining, 10), h.Get(HeaderRemaining))
				if never {
					require.Empty(t, h.Values(HeaderReset))
					require.Empty(t, h.Values(HeaderRetryAfter))
					return
				}
				reset, err := strconv.ParseInt(h.Get(HeaderReset), 10, 64)
				require.NoError(t, err)
				require.Equal(t, ResetSeconds(b), reset)
				if b.Allowed {
					require.Empty(t, h.Values(HeaderRetryAfter))
					return
				}
				retry, err := strconv.ParseInt(h.Get(HeaderRetryAfter), 10, 64)
				require.NoError(t, err)
				require.GreaterOrEqual(t, retry, int64(1))
				require.Equal(t, reset, retry, "Retry-After is the binding limit's t")
				for _, res := range visible {
					require.GreaterOrEqual(t, time.Duration(retry)*time.Second, res.RetryAfter, "no limit still denies after Retry-After")
				}
			})
		}
	}
}

// sfSent is what a name reads as once sent as an sf-string and parsed:
// bytes outside printable ASCII became '_'.
func sfSent(name string) string {
	b := []byte(name)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '_'
		}
	}
	return string(b)
}

func TestPolicyName(t *testing.T) {
	tests := []struct {
		limit ratelimit.Limit
		want  string
	}{
		{ratelimit.PerMinute(100), "100-per-60s"},
		{ratelimit.PerSecond(10), "10-per-1s"},
		{ratelimit.PerHour(5000), "5000-per-3600s"},
		{ratelimit.Limit{Rate: 10, Window: 500 * time.Millisecond}, "10-per-500ms"},
		{ratelimit.Limit{Rate: 3, Window: 1500 * time.Millisecond}, "3-per-1500ms"},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, derivedName(tc.limit))
		require.Equal(t, `"`+tc.want+`"`, PolicyName(tc.limit))
	}
	for name, want := range map[string]string{
		"burst":          `"burst"`,
		`say "hi" \ bye`: `"say \"hi\" \\ bye"`,
		"naïve\tmix":     `"na__ve_mix"`,
	} {
		require.Equal(t, want, PolicyName(named(ratelimit.PerMinute(100), name)), "%q", name)
	}
}

// TestResetSeconds pins the rounding: always up to a whole second, and on a
// denial that can pass the wait for it, at least 1. A denial that can never
// pass sends no reset at all.
func TestResetSeconds(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name  string
		res   ratelimit.Result
		reset string // X-RateLimit-Reset, and RateLimit's t
		retry string
	}{
		{"allowed: reset rounds up", ratelimit.Result{Allowed: true, ResetAfter: 1001 * ms}, "2", ""},
		{"allowed: whole seconds stay", ratelimit.Result{Allowed: true, ResetAfter: 2000 * ms}, "2", ""},
		{"allowed: nothing counted", ratelimit.Result{Allowed: true}, "0", ""},
		{"denied: 1ms is 1s", ratelimit.Result{RetryAfter: 1 * ms, ResetAfter: 90 * time.Second}, "1", "1"},
		{"denied: 999ms", ratelimit.Result{RetryAfter: 999 * ms, ResetAfter: 90 * time.Second}, "1", "1"},
		{"denied: 1000ms", ratelimit.Result{RetryAfter: 1000 * ms, ResetAfter: 90 * time.Second}, "1", "1"},
		{"denied: 1001ms", ratelimit.Result{RetryAfter: 1001 * ms, ResetAfter: 90 * time.Second}, "2", "2"},
		{"denied: 59.5s", ratelimit.Result{RetryAfter: 59_500 * ms, ResetAfter: 90 * time.Second}, "60", "60"},
		{"denied: a wait near math.MaxInt64 does not wrap", ratelimit.Result{RetryAfter: math.MaxInt64, ResetAfter: math.MaxInt64}, "9223372037", "9223372037"},
		{"denied forever, some usage: no reset", ratelimit.Result{RetryAfter: ratelimit.InfDuration, ResetAfter: 2500 * ms}, "", ""},
		{"denied forever, no usage: no reset", ratelimit.Result{RetryAfter: ratelimit.InfDuration}, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.res.Limit = ratelimit.PerMinute(10)
			h := http.Header{}
			setHeaders(h, allHeaders, newPlan([]ratelimit.Limit{named(tc.res.Limit, "p")}), []ratelimit.Result{tc.res}, tc.res, time.Now)
			require.Equal(t, tc.retry, h.Get(HeaderRetryAfter))
			require.Equal(t, tc.reset, h.Get(HeaderReset))
			rl := `"p";r=0`
			if tc.reset != "" {
				require.Equal(t, tc.reset, strconv.FormatInt(ResetSeconds(tc.res), 10))
				rl += ";t=" + tc.reset
			}
			require.Equal(t, rl, h.Get(HeaderRateLimit))
		})
	}
}

// named returns limit with its Name set to name.
func named(limit ratelimit.Limit, name string) ratelimit.Limit {
	limit.Name = name
	return limit
}

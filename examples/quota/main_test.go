package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
)

// The header's session on a clock set an hour before December in New
// York (5.5 hours into December 1st in Kolkata): acme's month ends in an
// hour, and its 429 says so; globex's month is its own.
func TestSession(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	clk := clock.NewFake(time.Date(2026, 11, 30, 23, 0, 0, 0, ny))
	s, err := newServer(ratelimit.New(client, ratelimit.WithClock(clk.Now)))
	require.NoError(t, err)
	get := func(tenant, query string) *httptest.ResponseRecorder {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, "/complete?"+query, nil)
		r.Header.Set("X-Tenant", tenant)
		w := httptest.NewRecorder()
		s.complete(w, r)
		return w
	}
	body := func(w *httptest.ResponseRecorder) map[string]any {
		t.Helper()
		var m map[string]any
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &m))
		return m
	}

	w := get("acme", "used=400")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, map[string]any{"tenant": "acme", "used": 400.0, "month_used": 400.0, "month_left": 600.0,
		"month": "2026-11-01T00:00:00-04:00/2026-12-01T00:00:00-05:00"}, body(w))
	clk.Add(time.Second) // past the burst limit's second
	w = get("acme", "used=700")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, 1100.0, body(w)["month_used"])
	w = get("acme", "used=10")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "3599", w.Header().Get("Retry-After")) // to midnight, New York time
	require.Contains(t, w.Body.String(), "monthly-tokens: 1100 of 1000 used")

	w = get("globex", "")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "2026-12-01T00:00:00+05:30/2027-01-01T00:00:00+05:30", body(w)["month"])
	require.Equal(t, http.StatusOK, get("globex", "").Code)
	require.Equal(t, http.StatusTooManyRequests, get("globex", "").Code) // the burst limit
	clk.Add(2 * time.Second)                                             // the burst window has slid past the two
	require.Equal(t, 3.0, body(get("globex", ""))["month_used"])         // the request the burst limit refused took no token
}

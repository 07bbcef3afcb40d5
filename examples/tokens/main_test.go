package main

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

// TestRetryAfter: a request that can wait for its tokens is told to retry
// in a second or more; one that can never fit (2,000 tokens against 1,000
// a minute) gets no Retry-After at all, never "Retry-After: 0", which
// would tell it to retry at once, for ever.
func TestRetryAfter(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	limiter := ratelimit.New(client)
	get := func(query string) *httptest.ResponseRecorder {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, "/complete?"+query, nil)
		w := httptest.NewRecorder()
		complete(limiter, w, r)
		return w
	}

	require.Equal(t, http.StatusOK, get("max_tokens=900").Code)

	w := get("max_tokens=300")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	retry, err := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
	require.NoError(t, err)
	require.GreaterOrEqual(t, retry, int64(1))

	w = get("max_tokens=2000")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Empty(t, w.Header().Values("Retry-After"))
}

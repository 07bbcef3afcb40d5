package ratelimittest_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
	"github.com/slidingwindow/ratelimit/ratelimittest"
)

// A test of a handler limited to 2 requests a second, which crosses into
// the next window by moving the clock, not by sleeping. The body of asTest
// is the body of a test function: t is its *testing.T.
func Example() {
	asTest(func(t testing.TB) {
		limiter, clock := ratelimittest.New(t)
		hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })
		h := httplimit.Middleware(limiter, ratelimit.PerSecond(2))(hello)
		get := func() *httptest.ResponseRecorder {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			return w
		}

		fmt.Println(get().Code, get().Code)
		w := get()
		retryAfter := w.Header().Get("Retry-After")
		fmt.Println(w.Code, "Retry-After:", retryAfter)

		seconds, _ := strconv.Atoi(retryAfter)
		clock.Advance(time.Duration(seconds) * time.Second)
		fmt.Println(get().Code, clock.Now().Format(time.TimeOnly))
	})
	// Output:
	// 200 200
	// 429 Retry-After: 2
	// 200 00:00:02
}

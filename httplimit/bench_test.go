package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// BenchmarkMiddleware is a request through the middleware, allowed, from
// one of 1,000 addresses, on a redis-server (skipped, saying so, without
// one): with one identity and with a second one (WithLimitsPer).
//
//	go test -run '^$' -bench Middleware -benchmem ./httplimit
func BenchmarkMiddleware(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts []httplimit.Option
	}{
		{"one-identity", nil},
		{"two-identities", []httplimit.Option{httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.PerMinute(1<<30))}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			client := redistest.Start(b).Client(b)
			l := ratelimit.New(client, ratelimit.WithTimeout(time.Minute))
			mw, err := httplimit.New(l, ratelimit.Limit{Name: "per-key", Rate: 1 << 30, Window: time.Hour}, tc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			reqs := make([]*http.Request, 1000)
			for i := range reqs {
				reqs[i] = httptest.NewRequest(http.MethodGet, "/", nil)
				reqs[i].RemoteAddr = "192.0.2." + strconv.Itoa(i%250) + ":" + strconv.Itoa(1000+i)
			}
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				clear(w.Header())
				h.ServeHTTP(w, reqs[i%len(reqs)])
			}
		})
	}
}

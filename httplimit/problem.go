package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/slidingwindow/ratelimit"
)

// Problem is the body of the default responses: an RFC 9457 problem
// details object, sent as application/problem+json.
type Problem struct {
	// Type is "about:blank": the status code says what happened.
	Type string `json:"type"`
	// Title is the status code's reason phrase.
	Title string `json:"title"`
	// Status is the status code.
	Status int `json:"status"`
	// Detail says what the client can do about it.
	Detail string `json:"detail,omitempty"`
}

// WriteProblem writes status with an RFC 9457 problem+json body whose
// detail is detail, for handlers given to WithDeniedHandler and
// WithErrorHandler that only want another wording.
func WriteProblem(w http.ResponseWriter, status int, detail string) {
	body, err := json.Marshal(Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
	if err != nil { // not reachable: Problem holds only strings and an int
		http.Error(w, http.StatusText(status), status)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// tooManyRequests is the default denied handler.
func tooManyRequests(w http.ResponseWriter, r *http.Request) {
	detail := "Rate limit exceeded."
	if res, ok := FromContext(r.Context()); ok {
		if res.RetryAfter == ratelimit.InfDuration {
			detail = "This request costs more than the rate limit allows in any window (" +
				strconv.FormatInt(res.Limit.Rate, 10) + "); it cannot succeed by waiting."
		} else if s := w.Header().Get(HeaderRetryAfter); s != "" {
			detail = "Rate limit exceeded; retry in " + s + " s."
		}
	}
	WriteProblem(w, http.StatusTooManyRequests, detail)
}

// defaultErrorHandler answers 503 when the limiter could not decide, and
// 500, with a log line, when it was given something it cannot decide.
func defaultErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, ratelimit.ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		WriteProblem(w, http.StatusServiceUnavailable, "The rate limiter is unavailable; try again later.")
		return
	}
	slog.Default().ErrorContext(r.Context(), "httplimit: the limiter rejected the request's input; check the configuration",
		"error", err, "method", r.Method, "path", r.URL.Path)
	WriteProblem(w, http.StatusInternalServerError, "")
}

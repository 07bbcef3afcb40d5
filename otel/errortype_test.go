package otel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

func TestErrorType(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("ratelimit: no reply within 100ms: %w", context.DeadlineExceeded), "timeout"},
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, "timeout"},
		{redis.ErrPoolTimeout, "timeout"},
		{fmt.Errorf("%w: list too short", ratelimit.ErrBadReply), "bad_reply"},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, "unavailable"},
		{fmt.Errorf("ratelimit: no reply within 100ms: %w (last dial error: %w)", context.DeadlineExceeded,
			&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), "unavailable"},
		{&net.DNSError{Err: "no such host", Name: "redis"}, "unavailable"},
		{io.EOF, "unavailable"},
		{redis.ErrClosed, "unavailable"},
		{errors.New("ERR unknown command"), "other"},
	} {
		require.Equal(t, tc.want, errorTypeNames[errorType(tc.err)], "%v", tc.err)
	}
}

// A script call through go-redis: EVALSHA, EVAL after NOSCRIPT, TRYAGAIN,
// and never a second send of a call that may have run.

package transport

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// noRetry and noRetryInts mark the script's command as one go-redis must
// not send again once it may have reached the server. go-redis retries a
// command whose reply was lost (an EOF, a reset), but the script may have
// run and counted the request: a second run would count it twice. A lost
// reply becomes a failure for the policy to decide instead. Each holds a
// pointer and nothing else, so that a Cmder of one allocates nothing.
type (
	noRetry     struct{ *redis.Cmd }
	noRetryInts struct{ *redis.IntSliceCmd }
)

// NoRetry tells go-redis not to send the command twice.
func (noRetry) NoRetry() bool { return true }

// NoRetry tells go-redis not to send the command twice.
func (noRetryInts) NoRetry() bool { return true }

// eval sends args, an EVALSHA command of sc with its SHA at args[1], and
// EVAL with the source if the server does not have the script. A NOSCRIPT
// reply means the script did not run, so sending it again cannot count
// twice; so does TRYAGAIN, which eval sends again after a pause (see
// tryAgain).
//
// NOSCRIPT is told by the reply's error code, its first word, whatever
// the text after it: Redis's "NOSCRIPT No matching script. Please use
// EVAL.", Valkey 8's "NOSCRIPT No matching script." (valkey-io/valkey#1537),
// an ElastiCache Serverless node's now and then (Effect-TS/effect-smol#2328);
// "ERR NOSCRIPT …" too, as go-redis reads Kvrocks's. An error that only
// mentions NOSCRIPT further on is not one: a script's own error (a
// redis.call inside it that failed) comes from a script that ran and may
// have written, and sent again it could count twice. A call reloads the
// script at most once: EVAL carries it, and is never answered NOSCRIPT. It returns the reply's integers in the long form's layout.
// short is the number of requests of a call in the short form, whose reply
// packs each request in one integer when it can (0 for the long form):
// their flags and counts are unpacked.
func eval(ctx context.Context, c redis.UniversalClient, sc *script.Script, args []any, short int) ([]int64, error) {
	cmd := newScriptCmd(ctx, args, short)
	err := c.Process(ctx, cmd)
	for try := 0; err != nil; try++ {
		if redis.HasErrorPrefix(err, "NOSCRIPT") && args[0] == "evalsha" {
			args[0], args[1] = "eval", sc.Src
		} else if !tryAgain(ctx, sc, err, try) {
			break
		}
		cmd = newScriptCmd(ctx, args, short)
		err = c.Process(ctx, cmd)
	}
	if err != nil {
		return nil, classify(err, sc)
	}
	if cmd, ok := cmd.(noRetryInts); ok {
		if short > 1 && len(cmd.Val()) == short {
			return script.UnpackAll(cmd.Val())
		}
		return cmd.Val(), nil
	}
	return script.Unpack(cmd.(noRetry).Val())
}

// Pauses before a script call answered TRYAGAIN goes again: the first, then
// twice as long each time, up to the last. A slot's keys stay split between
// two masters while MIGRATE moves them, a round trip per pipeline of keys
// (10 with redis-cli's default), and a decision whose keys are not all on
// one master is answered TRYAGAIN until they are, or until the slot is the
// target's: milliseconds.
const (
	firstTryAgainPause = 2 * time.Millisecond
	lastTryAgainPause  = 16 * time.Millisecond
	// tryAgainFor bounds the pauses of a call whose ctx has no deadline
	// (a Limiter WithTimeout(0), or a batch of such decisions): the
	// Limiter's default timeout.
	tryAgainFor = 100 * time.Millisecond
)

// tryAgain reports whether a script call of sc that failed with err, try
// times sent again already, goes again, after it has paused for as long as
// try says. Only TRYAGAIN goes again, and only on a call of one slot's keys:
// it is the one reply of the kind that says the script did not run
// (Redis answers it before running a command whose keys a resharding has
// split between two masters) and ends within the Limiter's timeout.
// MOVED and ASK the Cluster client follows itself; it also sends a command
// again on READONLY, from a replica that was its master. LOADING, BUSY,
// MASTERDOWN, CLUSTERDOWN (a master failed, and the cluster waits for the
// node timeout and a vote) last seconds: sent again, a decision would wait
// out its whole timeout for the same reply. A cross-slot batch goes on its
// master's own client, which follows no redirect: refused with TRYAGAIN,
// it goes again at once, each of its decisions alone through the Cluster
// client (batch.go), and each of those calls comes here.
//
// The pause is at most half of what is left until ctx's deadline, so that
// the call sent after it has time to be answered, and there is none once
// that half is below firstTryAgainPause; with no deadline, the pauses add
// up to at most tryAgainFor. It returns false once ctx is done.
func tryAgain(ctx context.Context, sc *script.Script, err error, try int) bool {
	if sc.Cross || !redis.HasErrorPrefix(err, "TRYAGAIN") {
		return false
	}
	pause := min(firstTryAgainPause<<min(try, 8), lastTryAgainPause)
	if d, ok := ctx.Deadline(); ok {
		pause = min(pause, time.Until(d)/2)
	} else if time.Duration(try)*lastTryAgainPause >= tryAgainFor {
		// No pause is longer than the last, so the try pauses so far
		// took at most try times it.
		return false
	}
	if pause < firstTryAgainPause {
		return false // too close to the deadline for a pause and a call
	}
	timer := time.NewTimer(pause)
	defer timer.Stop()
	select {
	case <-timer.C:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

// newScriptCmd returns the command of a script call of args: for one short
// request, one that takes an integer or a list; otherwise one that takes a
// list of integers. Neither is sent twice.
func newScriptCmd(ctx context.Context, args []any, short int) redis.Cmder {
	if short == 1 {
		cmd := redis.NewCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		return noRetry{cmd}
	}
	cmd := redis.NewIntSliceCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return noRetryInts{cmd}
}

// classify marks the errors of a reply that go-redis read but could not
// take as an array of integers (a nil, a string, a status: the reply was
// of the wrong shape), and the errors that say the server cannot run sc
// as it is configured (misconfigured); every other error (the server's,
// the network's, the pool's) passes as it is.
func classify(err error, sc *script.Script) error {
	var numErr *strconv.NumError
	switch {
	case errors.Is(err, redis.Nil) || errors.As(err, &numErr) || strings.HasPrefix(err.Error(), "redis: can't parse"):
		return fmt.Errorf("%w: %w", script.ErrBadReply, err)
	}
	return misconfigured(err, sc)
}

// misconfigured returns err wrapped in ErrMisconfigured, with what to do,
// when it is a server's reply that no number of calls will change: the
// server runs no Lua (Garnet without --lua; a server without scripting),
// the ACL user may not run a command the Limiter sends, or the server
// refuses the flags of sc's first line (the engine's: WithScriptFlags).
// sc is nil for a command that is no script. Any other error is returned
// as it is. None of these says the server is down, so none opens a
// breaker; the root's failure policy does not decide them either (an
// allow would hide, for as long as it lasts, that no limit is enforced).
func misconfigured(err error, sc *script.Script) error {
	var redisErr redis.Error
	if !errors.As(err, &redisErr) {
		return err
	}
	msg := strings.ToLower(redisErr.Error())
	var what string
	switch {
	case strings.Contains(msg, "unknown command") && (strings.Contains(msg, "'evalsha'") || strings.Contains(msg, "'eval'")),
		strings.Contains(msg, "lua scripting support disabled"): // Garnet without --lua
		what = "the server does not run Lua scripts, which every decision needs (Garnet: start it with --lua)"
	case redis.HasErrorPrefix(err, "NOPERM") || strings.Contains(msg, "user executing the script can't run"):
		what = "the Redis user may not run a command the Limiter sends (docs/failure-modes.md, Least privilege)"
	case sc != nil && sc.Header != "" && (strings.Contains(msg, "shebang") || strings.Contains(msg, "compiling script")):
		what = fmt.Sprintf("the server refuses the scripts' first line %q (WithScriptFlags: docs/engines.md)", sc.Header)
	default:
		return err
	}
	return Wrap("ratelimit: "+what, ErrMisconfigured, err)
}

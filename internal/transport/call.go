// One script call on the wire: asked of a server's breaker, sent on the
// caller's goroutine or watched from another, judged by the Limiter's
// timeout; and the commands that are no decision (Delete).

package transport

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/group"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// exchange makes one script call of sc for reqs through c, as a call to
// srv: srv's breaker is asked first and told how it went, one call, one
// success or failure, judged by wire, the call's context. Its caller waits
// until leave is done: wire itself, or the caller's own ctx when its
// deadline comes before wire's (see wire).
//
// A call whose caller waits as long as wire lasts is made on the caller's
// goroutine: the client stops at wire's deadline by itself
// (ContextTimeoutEnabled), or its socket's deadlines do (t.timed: see
// routed), or wire has none. Otherwise it is watched from a goroutine of its own
// (sendWatched), and a caller who leaves first (its deadline, or its
// cancel) gets a *CallerLeft: the call goes on to wire's deadline, and a
// goroutine of the transport's tells the breaker, and the CallerLeft's
// Late, how it went.
func (t *Transport) exchange(leave, wire context.Context, srv *server, c redis.UniversalClient, sc *script.Script, reqs []*script.Request, out []script.Reply) error {
	probe := false
	if b := srv.breaker; b != nil {
		ok, p := b.allow()
		if !ok {
			t.reload()
			return ErrCircuitOpen
		}
		probe = p
	}
	var err error
	if leave == wire && (t.ctxAware || t.timed != nil || wire.Done() == nil) {
		err = t.call(t.routed(wire), c, sc, reqs, out)
	} else {
		vals, w, callErr := t.sendWatched(leave, t.routed(wire), c, sc, reqs)
		switch {
		case w != nil && (leave != wire || canceled(wire)): // the caller left
			gone := &CallerLeft{err: ctxErr(leave), Late: &Late{}}
			t.work.Go(func() { t.judgeLate(w, wire, srv, probe, gone.Late) })
			return gone
		case w != nil:
			err = wire.Err()
		case callErr != nil:
			err = callErr
		default:
			err = decode(vals, reqs, out)
		}
	}
	t.judge(wire, srv, probe, err, err != nil && t.abandoned(wire))
	return err
}

// judge tells srv's breaker how a call that wire bounded went (left: it
// ended for its caller's sake, which says nothing of Redis), and has the
// slot map reloaded after an outage; the first success on a server has its
// eviction policy checked.
func (t *Transport) judge(wire context.Context, srv *server, probe bool, err error, left bool) {
	if b := srv.breaker; b != nil {
		switch {
		case left:
			b.abandon(probe)
		case err != nil && opensBreaker(err):
			b.done(probe, err)
		default: // Redis answered, even if with an error about one id's data
			b.done(probe, nil)
		}
	}
	if err != nil && !left && IsOutage(err) {
		t.reload()
	}
	if err == nil {
		if _, seen := t.checked.Load(srv.name); !seen {
			if _, seen := t.checked.LoadOrStore(srv.name, struct{}{}); !seen {
				t.work.Go(func() { t.checkEviction(srv) })
			}
		}
	}
}

// abandoned reports whether a call that wire bounded ended for its caller's
// sake, not Redis's: wire was canceled (its caller's ctx was), or its
// deadline, which passed, was the caller's own (no Limiter timeout).
func (t *Transport) abandoned(wire context.Context) bool {
	return canceled(wire) || t.timeout <= 0 && expired(wire)
}

// judgeLate waits for the end of w, a call whose caller left, or for wire's
// deadline, whichever comes first, and judges the call by it: a failure goes
// to the breaker and to l. A call its caller canceled (wire with it) goes
// on all the same, on a client that does not stop at its ctx: it is
// followed to its end, or to the Limiter's deadline it had.
func (t *Transport) judgeLate(w *watchedCall, wire context.Context, srv *server, probe bool, l *Late) {
	end, followed := wire.Done(), canceled(wire)
	var deadline <-chan time.Time
	if followed {
		end = nil
		if d, ok := wire.Deadline(); ok && t.timeout > 0 {
			timer := time.NewTimer(time.Until(d))
			defer timer.Stop()
			deadline = timer.C
		}
	}
	var err error
	select {
	case <-w.done:
		err = w.err
	case <-end:
		err = wire.Err()
	case <-deadline:
		err = context.DeadlineExceeded
	}
	t.judge(wire, srv, probe, err, err != nil && !followed && t.abandoned(wire))
	if err != nil {
		err = t.explain(wire, srv, err)
	}
	l.end(err)
}

// canceled reports whether ctx was canceled, rather than past its deadline.
func canceled(ctx context.Context) bool { return errors.Is(ctx.Err(), context.Canceled) }

// call sends one script call of sc for reqs to c and decodes its reply into
// out, on this goroutine.
func (t *Transport) call(ctx context.Context, c redis.UniversalClient, sc *script.Script, reqs []*script.Request, out []script.Reply) error {
	vals, err := send(ctx, c, sc, reqs)
	if err != nil {
		return err
	}
	return decode(vals, reqs, out)
}

// decode checks the reply vals of a call of reqs, and stores each
// request's reply in out.
func decode(vals []int64, reqs []*script.Request, out []script.Reply) error {
	switch reqs[0].Kind {
	case script.KindConcurrency:
		return script.DecodeConcurrency(vals, &out[0])
	case script.KindDelete:
		out[0] = script.Reply{Allowed: true}
		return nil
	}
	return script.Decode(vals, reqs, out)
}

// A watchedCall is a script call that a goroutine of its own makes for a
// caller that may leave before it ends: what watch does for any command,
// for decisions without the closures and channel each would allocate.
type watchedCall struct {
	ctx  context.Context
	c    redis.UniversalClient
	sc   *script.Script
	reqs []*script.Request
	vals []int64
	err  error
	done chan struct{} // buffered: the goroutine never waits for its caller
	work *group.Group  // counts its goroutine
}

// watchedCalls holds the watchedCalls whose callers took their replies:
// their goroutines have sent on done and touch them no more. One whose
// caller left stays its goroutine's, and is never pooled: its late reply
// reaches no one.
var watchedCalls = sync.Pool{New: func() any { return &watchedCall{done: make(chan struct{}, 1)} }}

// run makes w's call, then lets its caller know; it touches w no more.
func (w *watchedCall) run() {
	defer w.work.Done()
	w.vals, w.err = send(w.ctx, w.c, w.sc, w.reqs)
	w.done <- struct{}{}
}

// sendWatched is send under ctx on a goroutine of its own, as watch runs a
// command: it returns the reply, or the call itself if leave is done first,
// which is then its goroutine's until the client's own timeouts end it: its
// done receives once, when it ends.
func (t *Transport) sendWatched(leave, ctx context.Context, c redis.UniversalClient, sc *script.Script, reqs []*script.Request) ([]int64, *watchedCall, error) {
	w := watchedCalls.Get().(*watchedCall)
	w.ctx, w.c, w.sc, w.reqs, w.work = ctx, c, sc, reqs, t.work
	t.work.Add() // done by run
	go w.run()
	select {
	case <-w.done:
		vals, err := w.vals, w.err
		*w = watchedCall{done: w.done}
		watchedCalls.Put(w)
		return vals, nil, err
	case <-leave.Done():
		return nil, w, nil
	}
}

// send makes the call of reqs (the script call of sc, or a delete) on c
// and returns its reply's integers.
func send(ctx context.Context, c redis.UniversalClient, sc *script.Script, reqs []*script.Request) ([]int64, error) {
	switch reqs[0].Kind {
	case script.KindConcurrency:
		var buf [8]any
		return eval(ctx, c, sc, script.AppendConcurrency(buf[:0], sc, reqs[0]), 0)
	case script.KindDelete:
		return nil, c.Del(ctx, reqs[0].Keys...).Err()
	}
	cross := sc.Cross
	short, n := script.ShortCall(reqs, cross), 0
	if short {
		n = len(reqs)
	}
	buf := argLists.Get().(*[]any)
	if need := script.CallLen(reqs, short); cap(*buf) < need {
		*buf = make([]any, 0, need)
	}
	args := script.AppendCall((*buf)[:0], sc, reqs, cross, short)
	vals, err := eval(ctx, c, sc, args, n)
	if err == nil && short && len(reqs[0].Keys) == 1 {
		vals, err = script.OneKey(vals)
	}
	if err == nil && cap(args) <= maxCallValues {
		clear(args) // nothing kept alive by the list: the requests are the caller's
		*buf = args[:0]
		argLists.Put(buf)
	}
	return vals, err
}

// argLists holds the argument lists of calls that were answered, for calls
// to come: a call's list is as long as it has values (10 for one request),
// 16 bytes each. go-redis reads a command's arguments until its reply has
// been read, and not after; a call that failed may have left its command
// in go-redis's hands (one whose caller stopped waiting), so its list is
// not reused; nor is one longer than maxCallValues. (A go-redis hook that
// kept a command past its return would see a later call's arguments there.)
var argLists = sync.Pool{New: func() any { return new([]any) }}

// Watch runs fn in a goroutine, counted in work if it is not nil, and
// returns when fn does or when ctx is done, whichever comes first: the
// client may not stop at ctx's deadline by itself. In the second case fn
// goes on until the client's own timeouts end it, and its result is
// dropped.
func Watch[T any](ctx context.Context, work *group.Group, fn func(context.Context) (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	run := func() {
		v, err := fn(ctx)
		done <- result{v, err}
	}
	if work != nil {
		work.Go(run)
	} else {
		go run()
	}
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// HonoursContext reports whether client stops waiting at its ctx deadline
// by itself, so that the transport need not watch for it.
func HonoursContext(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// The statsd output of the metrics, as the reference's USE_STATSD asks.

package main

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/slidingwindow/ratelimit/rls"
)

// statsdSettings are the reference's USE_STATSD, STATSD_HOST, STATSD_PORT,
// EXTRA_TAGS and STATS_FLUSH_INTERVAL, and gostats's STATSD_PROTOCOL.
type statsdSettings struct {
	enabled    bool
	host       string
	port       int
	network    string // tcp, as the reference's gostats sink, or udp
	tags       map[string]string
	flushEvery time.Duration
}

// statsdTimeout bounds a dial and a flush's write, as gostats's (1.5 s, 1 s).
const statsdTimeout = time.Second

// startStatsd writes st to the statsd server every s.flushEvery until
// the returned stop is called, which writes it a last time and returns
// once written.
func startStatsd(s statsdSettings, st *rls.Statsd, log *slog.Logger) (stop func()) {
	w := &statsdWriter{addr: net.JoinHostPort(s.host, strconv.Itoa(s.port)), network: s.network, st: st, log: log}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(s.flushEvery)
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
				w.flush()
			case <-ctx.Done():
				w.flush()
				w.close()
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}

// statsdWriter writes a Statsd to a statsd server, connecting again after
// a failure. A flush that cannot connect leaves the counts for the next.
type statsdWriter struct {
	addr, network string
	st            *rls.Statsd
	log           *slog.Logger
	conn          net.Conn
	failing       bool // the last flush failed: logged once until one succeeds
}

// flush writes what was counted since the last flush.
func (w *statsdWriter) flush() {
	if w.conn == nil {
		conn, err := net.DialTimeout(w.network, w.addr, statsdTimeout)
		if err != nil {
			w.failed(err)
			return
		}
		w.conn = conn
	}
	_ = w.conn.SetWriteDeadline(time.Now().Add(statsdTimeout))
	if _, err := w.st.WriteTo(w.conn); err != nil {
		w.failed(err)
		w.close()
		return
	}
	if w.failing {
		w.failing = false
		w.log.Info("ratelimit-rls: statsd written again", "addr", w.addr)
	}
}

// failed logs err, once until a flush succeeds.
func (w *statsdWriter) failed(err error) {
	if !w.failing {
		w.failing = true
		w.log.Warn("ratelimit-rls: statsd", "network", w.network, "addr", w.addr, "error", err)
	}
}

func (w *statsdWriter) close() {
	if w.conn != nil {
		_ = w.conn.Close()
		w.conn = nil
	}
}

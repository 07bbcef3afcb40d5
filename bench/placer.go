package bench

import (
	"runtime"
	"sync"
	"time"
)

// A Placer is the clock of a fleet's Limiters (ratelimit.WithClock) that
// notes each reading for the goroutine that made it, so that the harness
// knows the ms at which the Limiter placed each decision. A Limiter reads
// its clock once per decision, on the caller's goroutine, before anything
// else of the decision's timing; its lease sweeper reads it too, on a
// goroutine of its own, which has no slot and is not noted.
//
// Finding the goroutine costs about a microsecond a reading
// (runtime.Stack): for the per-window accounting, not for decisions/s.
type Placer struct {
	slots sync.Map // goroutine id → *int64, the last reading's Unix ms
}

// Now returns time.Now(), noted in the calling goroutine's slot if it has
// one.
func (p *Placer) Now() time.Time {
	t := time.Now()
	if s, ok := p.slots.Load(goid()); ok {
		*s.(*int64) = t.UnixMilli()
	}
	return t
}

// slot returns the calling goroutine's slot, making it if need be. Only
// that goroutine may read or write it.
func (p *Placer) slot() *int64 {
	s, _ := p.slots.LoadOrStore(goid(), new(int64))
	return s.(*int64)
}

// goid returns the calling goroutine's id, from the first line of its
// stack trace: "goroutine 123 [running]:".
func goid() uint64 {
	var buf [32]byte
	b := buf[:runtime.Stack(buf[:], false)]
	const prefix = "goroutine "
	if len(b) < len(prefix) {
		return 0
	}
	var id uint64
	for _, c := range b[len(prefix):] {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}

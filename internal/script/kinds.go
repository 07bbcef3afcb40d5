// The requests that are no decision of sliding_window.lua: a concurrency
// limit's (concurrency.lua) and a delete (Reset). The transport sends each
// of them alone, through the same entry, deadline and breaker as a
// decision.

package script

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"
)

// Kind says which command carries a Request.
type Kind uint8

const (
	// KindWindow is a decision, look, charge or give-back of
	// sliding_window.lua: the zero Kind.
	KindWindow Kind = iota
	// KindConcurrency is one call of concurrency.lua on a concurrency
	// limit's sorted set, Keys[0]: see Concurrency.
	KindConcurrency
	// KindDelete deletes Keys (Reset).
	KindDelete
)

// Concurrency is what a KindConcurrency request asks of concurrency.lua:
// Op is "a" to acquire, "r" to release, "e" to extend, for Token; Max and
// Lease (ms) as that script takes them.
type Concurrency struct {
	Op         string
	Token      string
	Max, Lease int64
}

// AppendConcurrency appends the EVALSHA command of sc, concurrency.lua,
// for r to args.
func AppendConcurrency(args []any, sc *Script, r *Request) []any {
	c := r.Concurrency
	args = append(args, "evalsha", sc.SHA, smallInts[1], &r.Keys[0], c.Op, &c.Token)
	if c.Op != "r" {
		args = append(args, &c.Max, &c.Lease)
	}
	return args
}

// DecodeConcurrency checks concurrency.lua's reply to r, three integers,
// and stores it in out: Allowed for its flag, Counts the slots held and
// the ms to wait.
func DecodeConcurrency(vals []int64, out *Reply) error {
	if len(vals) != 3 || vals[0] != 0 && vals[0] != 1 || vals[1] < 0 || vals[2] < 0 {
		return fmt.Errorf("%w: %v from the concurrency script", ErrBadReply, vals)
	}
	*out = Reply{Allowed: vals[0] == 1, Counts: vals[1:3:3]}
	return nil
}

// Slot returns the request of op ("a" acquire, "r" release, "e" extend)
// for token, on the slots at key: at most max held (an acquire's), each
// for lease (an acquire's and an extend's).
func Slot(key, op, token string, max int64, lease time.Duration) *Request {
	return &Request{Kind: KindConcurrency, NLimits: 1, Keys: []string{key},
		Concurrency: &Concurrency{Op: op, Token: token, Max: max, Lease: lease.Milliseconds()}}
}

// Release returns the request that releases what r, an acquire, may have
// taken.
func Release(r *Request) *Request {
	rel := *r
	c := *r.Concurrency
	c.Op, rel.Concurrency = "r", &c
	return &rel
}

// NewToken returns a slot's token: 128 random bits, in hex.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// The requests that are no decision of sliding_window.lua: a concurrency
// limit's (concurrency.lua) and a delete (Reset). The transport sends each
// of them alone, through the same entry, deadline and breaker as a
// decision.

package script

import "fmt"

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

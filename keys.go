package ratelimit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// maxProduct bounds Rate × Window (in milliseconds). The script weighs the
// previous window's count in Lua numbers (IEEE doubles), and every integer
// product up to 2^53 is exact there; beyond it the estimate could be off by one.
const maxProduct = 1 << 53

// validate reports what is wrong with one decision's input, before Redis is
// consulted. n is the cost; Peek passes 1.
func validate(id string, limit Limit, n int64) error {
	if id == "" {
		return fmt.Errorf("%w: id is empty", ErrInvalidID)
	}
	if err := limit.Validate(); err != nil {
		return err
	}
	if n < 1 {
		return fmt.Errorf("%w: cost %d is below 1", ErrInvalidCost, n)
	}
	return nil
}

// Validate reports what makes l unusable, as every method of a Limiter would:
// a Rate below 1, a Window below 1ms or not a whole number of milliseconds,
// or a Rate × Window (in ms) above 2^53. The error wraps ErrInvalidLimit.
// Check limits from configuration with it at start-up.
func (l Limit) Validate() error {
	if l.Rate < 1 {
		return fmt.Errorf("%w: rate %d is below 1", ErrInvalidLimit, l.Rate)
	}
	if l.Window < time.Millisecond {
		return fmt.Errorf("%w: window %v is shorter than 1ms", ErrInvalidLimit, l.Window)
	}
	if l.Window%time.Millisecond != 0 {
		return fmt.Errorf("%w: window %v is not a whole number of milliseconds", ErrInvalidLimit, l.Window)
	}
	if w := l.Window.Milliseconds(); l.Rate > maxProduct/w {
		return fmt.Errorf("%w: rate %d per %v is too large (rate × window in ms must not exceed 2^53; at most %d per %v)",
			ErrInvalidLimit, l.Rate, l.Window, maxProduct/w, l.Window)
	}
	return nil
}

// keyPair returns the keys of window i and window i-1 for one id and window
// length w (in milliseconds):
//
//	<prefix>:{<id>}:<w>:<i>
//
// The id is escaped so that the hash tag is exactly the id and never empty:
// both keys then hash to one Redis Cluster slot, and different ids never share
// a key. The two keys are slices of one string: one allocation.
func (l *Limiter) keyPair(id string, w, i int64) (cur, prev string) {
	var num [20]byte
	var b strings.Builder
	head := len(l.keyPrefix) + escapedLen(id) + len("}:") + len(strconv.AppendInt(num[:0], w, 10)) + len(":")
	b.Grow(2*head + 2*len(num))
	b.WriteString(l.keyPrefix)
	writeEscaped(&b, id)
	b.WriteString("}:")
	b.Write(strconv.AppendInt(num[:0], w, 10))
	b.WriteByte(':')
	b.Write(strconv.AppendInt(num[:0], i, 10))
	split := b.Len()
	b.WriteString(b.String()[:head]) // within the capacity grown above: no copy
	b.Write(strconv.AppendInt(num[:0], i-1, 10))
	s := b.String()
	return s[:split], s[split:]
}

// keyPrefixFor returns the fixed start of every key: the prefix, with braces
// and '%' escaped so that it cannot open or close the hash tag, then ":{".
func keyPrefixFor(prefix string) string {
	var b strings.Builder
	writeEscaped(&b, prefix)
	b.WriteString(":{")
	return b.String()
}

// escapedLen returns the length of s once escaped.
func escapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i]) {
			n += 2
		}
	}
	return n
}

// writeEscaped writes s with '%', '{' and '}' percent-encoded and every other
// byte as it is. Escaping '%' itself keeps the mapping injective.
func writeEscaped(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c) {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
}

func needsEscape(c byte) bool { return c == '%' || c == '{' || c == '}' }

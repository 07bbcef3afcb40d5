package ratelimit

import (
	"fmt"
	"strconv"
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
	if err := limit.validate(); err != nil {
		return err
	}
	if n < 1 {
		return fmt.Errorf("%w: cost %d is below 1", ErrInvalidCost, n)
	}
	return nil
}

func (l Limit) validate() error {
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
// a key. The two keys share one allocation.
func (l *Limiter) keyPair(id string, w, i int64) (cur, prev string) {
	// Room for both keys: the shared head twice, and two window indexes.
	head := len(l.keyPrefix) + escapedLen(id) + len("}:") + 20 + len(":")
	b := make([]byte, 0, 2*(head+20))
	b = append(b, l.keyPrefix...)
	b = appendEscaped(b, id)
	b = append(b, "}:"...)
	b = strconv.AppendInt(b, w, 10)
	b = append(b, ':')
	head = len(b)
	b = strconv.AppendInt(b, i, 10)
	split := len(b)
	b = append(b, b[:head]...)
	b = strconv.AppendInt(b, i-1, 10)
	s := string(b)
	return s[:split], s[split:]
}

// keyPrefixFor returns the fixed start of every key: the prefix, with braces
// escaped so that it cannot open or close the hash tag, then ":{".
func keyPrefixFor(prefix string) string {
	return string(appendEscaped(nil, prefix)) + ":{"
}

// escapedLen returns len(appendEscaped(nil, s)).
func escapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i]) {
			n += 2
		}
	}
	return n
}

// appendEscaped appends s with '%', '{' and '}' percent-encoded and every
// other byte as it is. Escaping '%' itself keeps the mapping injective.
func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c) {
			b = append(b, '%', hex[c>>4], hex[c&15])
			continue
		}
		b = append(b, c)
	}
	return b
}

func needsEscape(c byte) bool { return c == '%' || c == '{' || c == '}' }

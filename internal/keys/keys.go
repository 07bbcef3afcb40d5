// Package keys names the Redis keys of an id's counts and concurrency
// slots: a prefix, the id's Cluster hash tag, and what the count is.
package keys

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit/internal/window"
)

// MaxID is the longest id kept as it is in keys. A longer id (an id often
// comes from a client: a header, a user name) is keyed by its SHA-256
// digest instead, so that what an id costs in Redis is bounded whatever its
// length.
const MaxID = 1024

// Keys names the keys of one key prefix.
type Keys struct {
	head string // the prefix, escaped, then ":{"
}

// New returns the keys of prefix: braces and '%' in it are percent-encoded
// so that the prefix cannot open or close the hash tag.
func New(prefix string) Keys {
	var b strings.Builder
	writeEscaped(&b, prefix)
	b.WriteString(":{")
	return Keys{head: b.String()}
}

// Append appends the keys a limit reads at position p for id, current
// window first. A sliding limit reads windows i and i-1:
//
//	<prefix>:{<id>}:<window in ms>:<i>
//
// A strict limit reads sub-windows j down to j-subs:
//
//	<prefix>:{<id>}:<window in ms>/<subs>:<j>
//
// A calendar limit reads one key, its period's, named by the period's
// kind, its zone's name and its first date there:
//
//	<prefix>:{<id>}:<daily|weekly|monthly|yearly>:<zone>:<yyyy-mm-dd>
//
// The id is escaped so that the hash tag is exactly the id and never empty:
// all keys of a decision hash to one Redis Cluster slot, and different ids
// never share a key. An id longer than MaxID is replaced by "%H" and the
// hex of its SHA-256, which no escaped id can spell. The keys are slices of
// one string: one allocation.
func (k Keys) Append(dst []string, id string, p window.Position) []string {
	if p.Period != 0 {
		var tail [64]byte
		t := appendPeriod(tail[:0], p)
		var b strings.Builder
		b.Grow(k.tagLen(id) + len(t))
		k.writeTag(&b, id)
		b.Write(t)
		return append(dst, b.String())
	}
	var num [20]byte
	win := p.W
	if p.Subs != 0 {
		win *= p.Subs
	}
	n := p.Keys()
	// Exactly the keys' length: the head every key shares, then an index
	// of at most as many digits as the longest of the first and the last.
	size := k.tagLen(id) + 1 + len(strconv.AppendInt(num[:0], win, 10)) + 1
	if p.Subs != 0 {
		size += 1 + len(strconv.AppendInt(num[:0], p.Subs, 10))
	}
	index := max(len(strconv.AppendInt(num[:0], p.I, 10)), len(strconv.AppendInt(num[:0], p.I-int64(n-1), 10)))
	var b strings.Builder
	b.Grow(n * (size + index))
	k.writeTag(&b, id)
	b.WriteByte(':')
	b.Write(strconv.AppendInt(num[:0], win, 10))
	if p.Subs != 0 {
		b.WriteByte('/')
		b.Write(strconv.AppendInt(num[:0], p.Subs, 10))
	}
	b.WriteByte(':')
	head := b.Len()
	var ends [1 + window.SubWindows]int
	for j := range n {
		if j > 0 {
			b.WriteString(b.String()[:head]) // within the capacity grown above: no copy
		}
		b.Write(strconv.AppendInt(num[:0], p.I-int64(j), 10))
		ends[j] = b.Len()
	}
	s, start := b.String(), 0
	for _, end := range ends[:n] {
		dst = append(dst, s[start:end])
		start = end
	}
	return dst
}

// appendPeriod appends what a calendar period's key holds after the id's
// tag: ":<period>:<zone>:<the period's first date>", as in
// ":monthly:Europe/Berlin:2026-12-01".
func appendPeriod(b []byte, p window.Position) []byte {
	b = append(b, ':')
	b = append(b, p.Period.Name()...)
	b = append(b, ':')
	b = append(b, p.Loc.String()...)
	b = append(b, ':')
	return time.UnixMilli(p.I).In(p.Loc).AppendFormat(b, time.DateOnly)
}

// Slots returns the key of id's slots of the concurrency limit named name:
// <prefix>:{<id>}:slots, then :<name> when it has one, escaped as ids are.
func (k Keys) Slots(id, name string) string {
	var b strings.Builder
	b.Grow(k.tagLen(id) + len(":slots:") + escapedLen(name))
	k.writeTag(&b, id)
	b.WriteString(":slots")
	if name != "" {
		b.WriteByte(':')
		writeEscaped(&b, name)
	}
	return b.String()
}

// writeTag writes what every key of id starts with, the keys of its
// windows and of its concurrency limits alike: the prefix, the hash tag of
// id escaped (or of its digest, for an id longer than MaxID), and the
// tag's end, '}'.
func (k Keys) writeTag(b *strings.Builder, id string) {
	b.WriteString(k.head)
	if len(id) > MaxID {
		sum := sha256.Sum256([]byte(id))
		var digest [2 + 2*sha256.Size]byte
		digest[0], digest[1] = '%', 'H'
		hex.Encode(digest[2:], sum[:])
		b.Write(digest[:])
	} else {
		writeEscaped(b, id)
	}
	b.WriteByte('}')
}

// tagLen returns the length of what writeTag writes for id.
func (k Keys) tagLen(id string) int {
	if len(id) > MaxID {
		return len(k.head) + 2 + 2*sha256.Size + 1
	}
	return len(k.head) + escapedLen(id) + 1
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

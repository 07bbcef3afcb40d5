// The Redis keys of an id's windows, with their Cluster hash tag; and the
// hash of an id that a Result carries for Refund.

package ratelimit

import (
	"crypto/sha256"
	"encoding/hex"
	"hash/maphash"
	"strconv"
	"strings"
)

// maxIDLength is the longest id kept as it is in keys. A longer id (an id
// often comes from a client: a header, a user name) is keyed by its SHA-256
// digest instead, so that what an id costs in Redis is bounded whatever its
// length.
const maxIDLength = 1024

// appendKeys appends the keys a limit reads at position p for id, current
// window first. A sliding limit reads windows i and i-1:
//
//	<prefix>:{<id>}:<window in ms>:<i>
//
// A strict limit reads sub-windows j down to j-subs:
//
//	<prefix>:{<id>}:<window in ms>/<subs>:<j>
//
// The id is escaped so that the hash tag is exactly the id and never empty:
// all keys of a decision hash to one Redis Cluster slot, and different ids
// never share a key. An id longer than maxIDLength (1,024 bytes) is
// replaced by "%H" and the hex of its SHA-256, which no escaped id can
// spell. The keys are slices of one string: one allocation.
//
// A calendar limit reads one key, its period's, named by the period's kind,
// its zone's name and its first date there:
//
//	<prefix>:{<id>}:<daily|weekly|monthly|yearly>:<zone>:<yyyy-mm-dd>
func (l *Limiter) appendKeys(dst []string, id string, p position) []string {
	if p.cal != 0 {
		var tail [64]byte
		t := appendPeriod(tail[:0], p)
		var b strings.Builder
		b.Grow(l.tagLen(id) + len(t))
		l.writeTag(&b, id)
		b.Write(t)
		return append(dst, b.String())
	}
	var num [20]byte
	window := p.w
	if p.subs != 0 {
		window *= p.subs
	}
	n := p.keys()
	// Exactly the keys' length: the head every key shares, then an index
	// of at most as many digits as the longest of the first and the last.
	size := l.tagLen(id) + 1 + len(strconv.AppendInt(num[:0], window, 10)) + 1
	if p.subs != 0 {
		size += 1 + len(strconv.AppendInt(num[:0], p.subs, 10))
	}
	index := max(len(strconv.AppendInt(num[:0], p.i, 10)), len(strconv.AppendInt(num[:0], p.i-int64(n-1), 10)))
	var b strings.Builder
	b.Grow(n * (size + index))
	l.writeTag(&b, id)
	b.WriteByte(':')
	b.Write(strconv.AppendInt(num[:0], window, 10))
	if p.subs != 0 {
		b.WriteByte('/')
		b.Write(strconv.AppendInt(num[:0], p.subs, 10))
	}
	b.WriteByte(':')
	head := b.Len()
	ends := make([]int, 0, 1+StrictSubWindows)
	for k := range n {
		if k > 0 {
			b.WriteString(b.String()[:head]) // within the capacity grown above: no copy
		}
		b.Write(strconv.AppendInt(num[:0], p.i-int64(k), 10))
		ends = append(ends, b.Len())
	}
	s, start := b.String(), 0
	for _, end := range ends {
		dst = append(dst, s[start:end])
		start = end
	}
	return dst
}

// writeTag writes what every key of id starts with, the keys of its
// windows and of its concurrency limits alike: the prefix, the hash tag of
// id escaped (or of its digest, for an id longer than maxIDLength), and
// the tag's end, '}'.
func (l *Limiter) writeTag(b *strings.Builder, id string) {
	b.WriteString(l.keyPrefix)
	if len(id) > maxIDLength {
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
func (l *Limiter) tagLen(id string) int {
	if len(id) > maxIDLength {
		return len(l.keyPrefix) + 2 + 2*sha256.Size + 1
	}
	return len(l.keyPrefix) + escapedLen(id) + 1
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

// idHash hashes an id for a Result, so that Refund can tell a Result made
// for another id.
func idHash(id string) uint64 { return maphash.String(idSeed, id) | 1 } // never 0: 0 is "none yet"

// idSeed hashes ids for idHash.
var idSeed = maphash.MakeSeed()

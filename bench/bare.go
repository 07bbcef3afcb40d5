package bench

import (
	"context"
	_ "embed" // for the scripts
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed article.lua
var articleSource string

//go:embed incr.lua
var incrSource string

// keyPrefix is the Limiter's default key prefix (WithPrefix).
const keyPrefix = "ratelimit"

// bareIncr sends incr.lua by EVALSHA with nothing around it: one INCR and
// one PEXPIRE of the library's key for the current window
// ("ratelimit:{<id>}:<window ms>:<window index>", with the library's TTL:
// two windows and a margin of min(window, 1s)), and a
// request allowed if its count is at most the rate. It is a fixed-window
// counter, not a sliding limiter: the reference whose Redis time per call
// the library's script is compared with. The bench's ids need no escaping,
// so the key is the one the library writes.
type bareIncr struct {
	client *redis.Client
	sha    string
	rate   int64
	ms     int64  // the window
	head   string // "ratelimit:{"
	mid    string // "}:<window ms>:"
	now    func() time.Time
}

func newBareIncr(ctx context.Context, env Env) (*bareIncr, error) {
	sha, err := env.Client.ScriptLoad(ctx, incrSource).Result()
	if err != nil {
		return nil, fmt.Errorf("bench: loading incr.lua: %w", err)
	}
	ms := env.Limit.Window.Milliseconds()
	return &bareIncr{client: env.Client, sha: sha, rate: env.Limit.Rate, ms: ms,
		head: keyPrefix + ":{", mid: "}:" + strconv.FormatInt(ms, 10) + ":", now: env.Now}, nil
}

// Allow decides one request of cost 1.
func (b *bareIncr) Allow(ctx context.Context, id string) (bool, error) {
	i := b.now().UnixMilli() / b.ms
	var key strings.Builder
	key.Grow(len(b.head) + len(id) + len(b.mid) + 20)
	key.WriteString(b.head)
	key.WriteString(id)
	key.WriteString(b.mid)
	var num [20]byte
	key.Write(strconv.AppendInt(num[:0], i, 10))
	n, err := b.client.EvalSha(ctx, b.sha, []string{key.String()}, 2*b.ms+min(b.ms, 1000)).Int64()
	if err != nil {
		return false, err
	}
	return n <= b.rate, nil
}

// bareArticle sends the article's script by EVALSHA, with its key names
// ("rate:<id>:<window index>") and arguments in seconds.
type bareArticle struct {
	client *redis.Client
	sha    string
	rate   int64
	secs   int64
	now    func() time.Time
}

func newBareArticle(ctx context.Context, env Env) (*bareArticle, error) {
	if env.Limit.Window%time.Second != 0 {
		return nil, fmt.Errorf("bench: the article's script counts in seconds; window %v is not whole", env.Limit.Window)
	}
	sha, err := env.Client.ScriptLoad(ctx, articleSource).Result()
	if err != nil {
		return nil, fmt.Errorf("bench: loading article.lua: %w", err)
	}
	return &bareArticle{client: env.Client, sha: sha, rate: env.Limit.Rate,
		secs: int64(env.Limit.Window / time.Second), now: env.Now}, nil
}

// Allow decides one request.
func (b *bareArticle) Allow(ctx context.Context, id string) (bool, error) {
	now := b.now().Unix()
	cur, prev := bareKeyPair("rate:", id, ":", now/b.secs)
	vals, err := b.client.EvalSha(ctx, b.sha, []string{cur, prev}, b.rate, b.secs, now).Int64Slice()
	if err != nil {
		return false, err
	}
	if len(vals) != 2 {
		return false, fmt.Errorf("bench: article.lua replied %d values, want 2", len(vals))
	}
	return vals[0] == 1, nil
}

// bareKeyPair returns head+id+mid+i and head+id+mid+(i-1), sharing one
// allocation.
func bareKeyPair(head, id, mid string, i int64) (cur, prev string) {
	n := len(head) + len(id) + len(mid)
	b := make([]byte, 0, 2*(n+20))
	b = append(b, head...)
	b = append(b, id...)
	b = append(b, mid...)
	b = strconv.AppendInt(b, i, 10)
	split := len(b)
	b = append(b, b[:n]...)
	b = strconv.AppendInt(b, i-1, 10)
	s := string(b)
	return s[:split], s[split:]
}

package bench

import (
	"context"
	_ "embed" // for the scripts
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// slidingWindowSource is a copy of the library's ../sliding_window.lua (an
// embed cannot reach outside its module); TestScriptCopy keeps it identical.
//
//go:embed sliding_window.lua
var slidingWindowSource string

//go:embed article.lua
var articleSource string

// bareOurs sends our script by EVALSHA with nothing around it but building
// the keys and arguments the way the library does, and reading the flag:
// one request of cost 1 against one sliding limit per call, as the library
// sends a decision that is not batched.
type bareOurs struct {
	s        redis.Scripter
	sha      string
	rate, ms int64
	mid      string // "}:<window ms>:"
	now      func() time.Time
}

func newBareOurs(ctx context.Context, env Env, s redis.Scripter) (*bareOurs, error) {
	sha, err := env.Client.ScriptLoad(ctx, slidingWindowSource).Result()
	if err != nil {
		return nil, fmt.Errorf("bench: loading sliding_window.lua: %w", err)
	}
	ms := env.Limit.Window.Milliseconds()
	return &bareOurs{s: s, sha: sha, rate: env.Limit.Rate, ms: ms, mid: "}:" + strconv.FormatInt(ms, 10) + ":", now: env.Now}, nil
}

// Allow decides one request of cost 1.
func (b *bareOurs) Allow(ctx context.Context, id string) (bool, error) {
	now := b.now().UnixMilli()
	i := now / b.ms
	cur, prev := bareKeyPair("ratelimit:{", id, b.mid, i)
	// One request, no keys in ARGV; its cost, one limit, denials not
	// counted; the limit's rate, ms left in the window, window, TTL of a
	// new key.
	vals, err := b.s.EvalSha(ctx, b.sha, []string{cur, prev},
		1, 0, 1, 1, 0, b.rate, b.ms-now%b.ms, b.ms, 2*b.ms).Int64Slice()
	if err != nil {
		return false, err
	}
	if len(vals) != 3 {
		return false, fmt.Errorf("bench: sliding_window.lua replied %d values, want 3", len(vals))
	}
	return vals[0] == 1, nil
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
// allocation, as the library does.
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

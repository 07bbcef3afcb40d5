// What other programs may leave under a key a Limiter reads: values that
// are no count, and keys of other types.

package redistest

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Foreign is something another program left under a key.
type Foreign struct {
	Name  string
	Store func(ctx context.Context, c redis.UniversalClient, key string) error
	// Dump returns what the key holds, to check that nothing changed it.
	Dump func(ctx context.Context, c redis.UniversalClient, key string) (string, error)
}

// foreignString is a string value that INCRBY would refuse, or that is not
// a count in [0, 2^53] (Lua's tonumber takes some of them).
func foreignString(v string) Foreign {
	return Foreign{
		Name: strconv.Quote(v),
		Store: func(ctx context.Context, c redis.UniversalClient, key string) error {
			return c.Set(ctx, key, v, 0).Err()
		},
		Dump: func(ctx context.Context, c redis.UniversalClient, key string) (string, error) {
			return c.Get(ctx, key).Result()
		},
	}
}

// Foreigners are the values and types a key holding a count must not be
// taken for: strings INCRBY would refuse or that pass 2^53, a hash and a
// list.
var Foreigners = []Foreign{
	foreignString("5.0"), foreignString("1e3"), foreignString(" 7"), foreignString("7 "),
	foreignString("0x10"), foreignString("-0"), foreignString(""), foreignString("abc"),
	foreignString("-5"), foreignString("1.5"), foreignString("007"), foreignString("9007199254740993"),
	{
		Name: "hash",
		Store: func(ctx context.Context, c redis.UniversalClient, key string) error {
			return c.HSet(ctx, key, "f", "1").Err()
		},
		Dump: func(ctx context.Context, c redis.UniversalClient, key string) (string, error) {
			m, err := c.HGetAll(ctx, key).Result()
			return fmt.Sprint(m), err
		},
	},
	{
		Name: "list",
		Store: func(ctx context.Context, c redis.UniversalClient, key string) error {
			return c.RPush(ctx, key, "1", "2").Err()
		},
		Dump: func(ctx context.Context, c redis.UniversalClient, key string) (string, error) {
			l, err := c.LRange(ctx, key, 0, -1).Result()
			return fmt.Sprint(l), err
		},
	},
}

module github.com/slidingwindow/ratelimit/accuracy

go 1.26.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/slidingwindow/ratelimit v1.0.0
	go.uber.org/goleak v1.3.0
)

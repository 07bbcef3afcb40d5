module github.com/slidingwindow/ratelimit/tools

go 1.26.0

require golang.org/x/mod v0.41.0

require (
	github.com/redis/go-redis/v9 v9.23.0
	github.com/slidingwindow/ratelimit v1.0.0
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/tools v0.51.0
)

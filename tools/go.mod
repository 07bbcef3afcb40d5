module github.com/slidingwindow/ratelimit/tools

go 1.26.0

require golang.org/x/mod v0.41.0

require (
	github.com/google/go-containerregistry v0.22.1
	github.com/redis/go-redis/v9 v9.23.0
	github.com/slidingwindow/ratelimit v1.0.0
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/tools v0.51.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

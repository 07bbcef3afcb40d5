module github.com/slidingwindow/ratelimit/accuracy

go 1.26.0

require github.com/slidingwindow/ratelimit v1.0.0

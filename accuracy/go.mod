module github.com/slidingwindow/ratelimit/accuracy

go 1.26.0

require github.com/slidingwindow/ratelimit v0.0.0

replace github.com/slidingwindow/ratelimit => ../

package group

import (
	"context"
	"testing"
	"time"
)

func TestWaitEndsWhenEverythingEnds(t *testing.T) {
	var g Group
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("an empty group: %v", err)
	}
	release := make(chan struct{})
	for range 3 {
		g.Go(func() { <-release })
	}
	g.Add()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := g.Wait(ctx); err != context.DeadlineExceeded {
		t.Fatalf("Wait with work running: %v, want the ctx's error", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- g.Wait(context.Background()) }()
	close(release)
	select {
	case err := <-waited:
		t.Fatalf("Wait returned %v with a task still counted", err)
	case <-time.After(20 * time.Millisecond):
	}
	g.Go(func() {}) // an Add while Wait waits
	g.Done()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
}

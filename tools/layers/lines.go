package main

import (
	"fmt"
	"slices"
)

// testServers is the dir of the package of Redis servers for tests,
// internal but no part of the core.
const testServers = "internal/redistest"

// lineCounts are the lines of the root package and of the core.
type lineCounts struct{ root, core int }

// reportLines prints the lines of the root package and of each internal
// package, and returns those of the root and of the core.
func reportLines(r *repo) lineCounts {
	core := r.core()
	var n lineCounts
	all := 0
	fmt.Println("## Lines (non-test .go files, as wc -l counts)")
	fmt.Println()
	fmt.Println("| package | files | lines | |")
	fmt.Println("|---|--:|--:|---|")
	for _, d := range r.sortedDirs() {
		if d != "." && !under(d, "internal") {
			continue
		}
		p := r.pkgs[d]
		lines := p.lines()
		role := "core"
		switch {
		case slices.Contains(core, d):
			n.core += lines
			all += lines
		case d == testServers:
			role = "test servers"
		default:
			role = "not imported by the root"
			all += lines
		}
		fmt.Printf("| %s | %d | %d | %s |\n", d, len(p.files), lines, role)
	}
	n.root = r.pkgs["."].lines()
	fmt.Println()
	fmt.Printf("root: %d lines\n", n.root)
	fmt.Printf("core (root + the internal packages it imports): %d lines\n", n.core)
	fmt.Printf("root + every internal package but %s: %d lines\n", testServers, all)
	return n
}

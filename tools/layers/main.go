// Command layers reads a checkout of this repository and prints a report
// of its layering that a change can be held to: the lines of each package
// of the library's core, the imports among the root module's packages
// (with the policy's violations), the root package's files that call each
// other in a cycle, and the functions each operation of a Limiter reaches.
//
//	cd tools && go run ./layers [-dir repo] [-reach Allow,Reset,Slot.Release]
//		[-max-root-lines N] [-max-core-lines N] [-max-cycle N] [-max-pairs N]
//
// Its four sections:
//
//   - Lines: newlines (as wc -l counts them) of each package's non-test
//     .go files, for the root package and each package under internal/.
//     The core is the root package and the internal packages it imports,
//     directly or not; internal/redistest (test servers) and internal
//     packages the root does not import are listed beside it.
//   - Imports: which of the root module's packages each of them imports
//     (non-test files; examples/ left out), read with go/parser alone. A
//     violation is an internal package importing the root package, one of
//     the stateful packages internal/lease, internal/local and
//     internal/denycache importing another, or any file (tests too) of
//     another module of the repository importing an internal package of
//     the root module.
//   - Files: the root package's non-test files as a graph, with an edge
//     A→B when a function body in A (closures in it included) calls a
//     function or concrete method declared in B ≠ A, the callee named by
//     an identifier or selector. Calls through interfaces or func values,
//     and functions named without being called, are not edges. It prints
//     the largest strongly connected component and the pairs of files
//     that call each other both ways.
//   - Reach: for each operation (the exported methods of *Limiter and
//     Slot, or those -reach names), the distinct declared functions and
//     methods of the core reachable from it in the static call graph
//     (golang.org/x/tools/go/callgraph/static: direct calls, go and defer
//     statements, closures called where they are written; no interface or
//     func-value calls). A generic function counts once, whatever its
//     instantiations; closures and synthetic wrappers are walked through
//     but not counted; the operation itself counts.
//
// The type-checked sections load the checkout's own code with GOWORK=off
// (its root module alone), never the module this command is built in.
//
// It exits 1 when an import violates the policy or a -max limit (unset
// when negative) is exceeded, 2 when the checkout cannot be read or
// loaded.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("layers: ")
	dir := flag.String("dir", ".", "the checkout's root")
	reach := flag.String("reach", "", "comma-separated operations to report the reach of (Allow, Slot.Release, ...); all when empty")
	maxRoot := flag.Int("max-root-lines", -1, "fail when the root package has more lines than this")
	maxCore := flag.Int("max-core-lines", -1, "fail when the core has more lines than this")
	maxCycle := flag.Int("max-cycle", -1, "fail when more root files than this call each other in a cycle")
	maxPairs := flag.Int("max-pairs", -1, "fail when more pairs of root files than this call each other both ways")
	flag.Parse()
	if flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		fatal(err)
	}
	var ops []string
	if *reach != "" {
		ops = strings.Split(*reach, ",")
	}

	repo, err := readRepo(abs)
	if err != nil {
		fatal(err)
	}
	fmt.Printf("# Layers of %s (module %s)\n\n", abs, repo.module)
	var fails []string
	lines := reportLines(repo)
	fails = append(fails, limit("root lines", lines.root, *maxRoot)...)
	fails = append(fails, limit("core lines", lines.core, *maxCore)...)
	fails = append(fails, reportImports(repo)...)

	prog, err := load(abs, repo)
	if err != nil {
		fatal(err)
	}
	cycle, pairs := reportFiles(prog.root)
	fails = append(fails, limit("largest cycle of root files", cycle, *maxCycle)...)
	fails = append(fails, limit("two-way file pairs", pairs, *maxPairs)...)
	if err := reportReach(prog, ops); err != nil {
		fatal(err)
	}

	if len(fails) > 0 {
		fmt.Println("\n## Failed")
		for _, f := range fails {
			fmt.Println("- " + f)
		}
		os.Exit(1)
	}
}

// fatal reports err and exits 2: the checkout could not be read.
func fatal(err error) {
	log.Print(err)
	os.Exit(2)
}

// limit returns a failure when n exceeds most, unless most is negative.
func limit(what string, n, most int) []string {
	if most < 0 || n <= most {
		return nil
	}
	return []string{fmt.Sprintf("%s: %d, more than %d", what, n, most)}
}

package main

import (
	"fmt"
	"go/ast"
	"go/types"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
)

// A fileGraph has an edge from file A to file B ≠ A, both of one package,
// when a function body in A calls a function or concrete method declared
// in B.
type fileGraph map[string]map[string]bool

// reportFiles prints the largest cycle of pkg's files calling each other
// and the pairs of them calling each other both ways, and returns the
// cycle's size (0 without one) and the number of pairs.
func reportFiles(pkg *packages.Package) (cycle, pairs int) {
	g := callGraph(pkg)
	edges := 0
	for _, to := range g {
		edges += len(to)
	}
	scc := g.largestSCC()
	if len(scc) < 2 {
		scc = nil
	}
	var two []string
	for _, a := range g.files() {
		for b := range g[a] {
			if a < b && g[b][a] {
				two = append(two, a+" <-> "+b)
			}
		}
	}
	slices.Sort(two)

	fmt.Println()
	fmt.Println("## Root files calling each other (non-test files; A -> B: a body in A calls a function or concrete method declared in B)")
	fmt.Println()
	fmt.Printf("%d files, %d edges\n", len(g), edges)
	fmt.Printf("largest cycle: %d files: %s\n", len(scc), strings.Join(scc, ", "))
	fmt.Printf("two-way pairs: %d\n", len(two))
	for _, p := range two {
		fmt.Println("- " + p)
	}
	return len(scc), len(two)
}

// callGraph returns the graph of pkg's files calling each other.
func callGraph(pkg *packages.Package) fileGraph {
	g := fileGraph{}
	fileOf := func(n ast.Node) string { return filepath.Base(pkg.Fset.Position(n.Pos()).Filename) }
	for _, f := range pkg.Syntax {
		from := fileOf(f)
		g[from] = map[string]bool{}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if call, ok := n.(*ast.CallExpr); ok {
					if callee := calledFunc(pkg.TypesInfo, call); callee != nil && callee.Pkg() == pkg.Types {
						if to := filepath.Base(pkg.Fset.Position(callee.Pos()).Filename); to != from {
							g[from][to] = true
						}
					}
				}
				return true
			})
		}
	}
	return g
}

// calledFunc returns the function or concrete method (generic, not an
// instance) that call calls by name, or nil.
func calledFunc(info *types.Info, call *ast.CallExpr) *types.Func {
	fun := ast.Unparen(call.Fun)
	switch x := fun.(type) {
	case *ast.IndexExpr:
		fun = x.X
	case *ast.IndexListExpr:
		fun = x.X
	}
	var id *ast.Ident
	switch x := fun.(type) {
	case *ast.Ident:
		id = x
	case *ast.SelectorExpr:
		id = x.Sel
	default:
		return nil
	}
	fn, ok := info.Uses[id].(*types.Func)
	if !ok {
		return nil
	}
	if recv := fn.Signature().Recv(); recv != nil && types.IsInterface(recv.Type()) {
		return nil
	}
	return fn.Origin()
}

// files returns g's files, sorted.
func (g fileGraph) files() []string {
	return slices.Sorted(maps.Keys(g))
}

// largestSCC returns the files of g's largest strongly connected
// component, sorted; of components of one size, the one whose first
// file sorts first.
func (g fileGraph) largestSCC() []string {
	// Tarjan's algorithm.
	index := map[string]int{}
	low := map[string]int{}
	onStack := map[string]bool{}
	var stack, best []string
	var visit func(v string)
	visit = func(v string) {
		index[v] = len(index)
		low[v] = index[v]
		stack = append(stack, v)
		onStack[v] = true
		for _, w := range slices.Sorted(maps.Keys(g[v])) {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] != index[v] {
			return
		}
		var scc []string
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[w] = false
			scc = append(scc, w)
			if w == v {
				break
			}
		}
		slices.Sort(scc)
		if len(scc) > len(best) || len(scc) == len(best) && scc[0] < best[0] {
			best = scc
		}
	}
	for _, v := range g.files() {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	return best
}

package main

import (
	"fmt"
	"slices"
	"strings"
)

// stateful are the dirs of the packages that keep a Limiter's state in
// memory; none of them may import another.
var stateful = []string{"internal/denycache", "internal/lease", "internal/local"}

// reportImports prints which of the root module's packages each of them
// imports, and the imports that break the policy, which it returns.
func reportImports(r *repo) []string {
	fmt.Println()
	fmt.Println("## Imports among the root module's packages (non-test files, examples/ left out)")
	fmt.Println()
	fmt.Println("| package | imports |")
	fmt.Println("|---|---|")
	var bad []string
	for _, d := range r.sortedDirs() {
		deps := r.deps(d)
		fmt.Printf("| %s | %s |\n", d, strings.Join(deps, ", "))
		for _, dep := range deps {
			switch {
			case under(d, "internal") && dep == ".":
				bad = append(bad, fmt.Sprintf("%s imports the root package (%s)", d, r.importers(d, r.module)))
			case slices.Contains(stateful, d) && slices.Contains(stateful, dep):
				bad = append(bad, fmt.Sprintf("%s imports %s (%s)", d, dep, r.importers(d, r.module+"/"+dep)))
			}
		}
	}
	bad = append(bad, r.foreignInternal()...)
	fmt.Println()
	if len(bad) == 0 {
		fmt.Println("Import violations: none")
		return nil
	}
	fmt.Printf("Import violations: %d\n", len(bad))
	for i, b := range bad {
		fmt.Println("- " + b)
		bad[i] = "import: " + b
	}
	return bad
}

// importers returns the files of the package in dir that import imp, as
// a comma-separated list.
func (r *repo) importers(dir, imp string) string {
	var files []string
	for _, f := range r.pkgs[dir].files {
		if slices.Contains(f.imports, imp) {
			files = append(files, f.rel)
		}
	}
	return strings.Join(files, ", ")
}

// foreignInternal returns, for each import of an internal package of the
// root module by a file of another module, a sentence saying so, sorted.
func (r *repo) foreignInternal() []string {
	prefix := r.module + "/internal/"
	var bad []string
	for _, f := range r.others {
		for _, imp := range f.imports {
			if strings.HasPrefix(imp, prefix) {
				bad = append(bad, fmt.Sprintf("%s (module %s) imports %s", f.rel, f.module, strings.TrimPrefix(imp, r.module+"/")))
			}
		}
	}
	slices.Sort(bad)
	return bad
}

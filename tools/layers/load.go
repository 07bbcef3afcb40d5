package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/go/ssa"
	"golang.org/x/tools/go/ssa/ssautil"
)

// A program is a checkout's core, type-checked and built in SSA form.
type program struct {
	root *packages.Package // the root package
	core map[string]bool   // the core packages' import paths
	ssa  *ssa.Program
}

// load type-checks the core of the checkout at dir, as r found it, and
// builds it in SSA form (the packages it imports from elsewhere without
// bodies). It loads with GOWORK=off, the checkout's root module alone,
// and fails unless every file it read is in dir.
func load(dir string, r *repo) (*program, error) {
	var patterns []string
	for _, d := range r.core() {
		patterns = append(patterns, "./"+d)
	}
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedImports | packages.NeedTypes |
			packages.NeedTypesSizes | packages.NeedSyntax | packages.NeedTypesInfo,
		Dir: dir,
		Env: append(os.Environ(), "GOWORK=off"),
	}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return nil, err
	}
	if packages.PrintErrors(pkgs) > 0 {
		return nil, fmt.Errorf("%s: the core does not type-check", dir)
	}
	p := &program{core: map[string]bool{}}
	for _, pkg := range pkgs {
		for _, f := range pkg.CompiledGoFiles {
			if !strings.HasPrefix(f, dir+string(filepath.Separator)) {
				return nil, fmt.Errorf("%s: loaded from %s, not %s", pkg.PkgPath, f, dir)
			}
		}
		p.core[pkg.PkgPath] = true
		if pkg.PkgPath == r.module {
			p.root = pkg
		}
	}
	if p.root == nil {
		return nil, fmt.Errorf("%s: no package %s loaded", dir, r.module)
	}
	p.ssa, _ = ssautil.Packages(pkgs, 0)
	p.ssa.Build()
	return p, nil
}

package main

import (
	"bytes"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/mod/modfile"
)

// A repo is what a checkout's Go files say, parsed for their imports only.
type repo struct {
	module string          // the root module's path
	pkgs   map[string]*pkg // the root module's packages by dir ("." for the root), examples/ left out
	others []*goFile       // every Go file of the other modules, tests too
}

// A pkg is a package of the root module and its non-test files.
type pkg struct {
	files []*goFile
}

// A goFile is a Go file of the checkout.
type goFile struct {
	rel     string // slash-separated, relative to the checkout
	module  string // the path of the module it belongs to
	lines   int    // its newlines, as wc -l counts them
	imports []string
}

// lines returns the lines of p's files.
func (p *pkg) lines() int {
	n := 0
	for _, f := range p.files {
		n += f.lines
	}
	return n
}

// readRepo parses the Go files of the checkout at dir: those of the root
// module by package, and those of the modules nested in it (directories
// with a go.mod of their own). Directories named testdata or vendor, or
// starting with . or _, are left out.
func readRepo(dir string) (*repo, error) {
	root, err := modulePath(dir)
	if err != nil {
		return nil, err
	}
	r := &repo{module: root, pkgs: map[string]*pkg{}}
	mods := map[string]string{".": root}
	fset := token.NewFileSet()
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "." {
				return nil
			}
			if n := d.Name(); n == "testdata" || n == "vendor" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_") {
				return filepath.SkipDir
			}
			m, err := modulePath(p)
			switch {
			case err == nil:
				mods[rel] = m
			case !errors.Is(err, fs.ErrNotExist):
				return err
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, p, src, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir := path.Dir(rel)
		gf := &goFile{rel: rel, module: moduleOf(mods, dir), lines: bytes.Count(src, []byte("\n"))}
		for _, spec := range f.Imports {
			imp, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				return fmt.Errorf("%s: %v", rel, err)
			}
			gf.imports = append(gf.imports, imp)
		}
		switch {
		case gf.module != root:
			r.others = append(r.others, gf)
		case strings.HasSuffix(rel, "_test.go") || under(dir, "examples"):
		default:
			if r.pkgs[dir] == nil {
				r.pkgs[dir] = &pkg{}
			}
			r.pkgs[dir].files = append(r.pkgs[dir].files, gf)
		}
		return nil
	})
	if err == nil && r.pkgs["."] == nil {
		err = fmt.Errorf("%s: no root package", dir)
	}
	return r, err
}

// modulePath returns the path of the module whose go.mod is in dir.
func modulePath(dir string) (string, error) {
	name := filepath.Join(dir, "go.mod")
	data, err := os.ReadFile(name)
	if err != nil {
		return "", err
	}
	m := modfile.ModulePath(data)
	if m == "" {
		return "", fmt.Errorf("%s: no module path", name)
	}
	return m, nil
}

// moduleOf returns the path of the module of the directory dir: that of
// the nearest go.mod at or above it.
func moduleOf(mods map[string]string, dir string) string {
	for {
		if m, ok := mods[dir]; ok {
			return m
		}
		dir = path.Dir(dir)
	}
}

// under reports whether dir is parent or a directory below it.
func under(dir, parent string) bool {
	return dir == parent || strings.HasPrefix(dir, parent+"/")
}

// dirOf returns the directory, in the checkout, of the root module's
// package imp, and whether imp is one of them.
func (r *repo) dirOf(imp string) (string, bool) {
	dir := "."
	if imp != r.module {
		rest, ok := strings.CutPrefix(imp, r.module+"/")
		if !ok {
			return "", false
		}
		dir = rest
	}
	_, ok := r.pkgs[dir]
	return dir, ok
}

// deps returns the sorted dirs of the root module's packages that the
// package in dir imports.
func (r *repo) deps(dir string) []string {
	var deps []string
	for _, f := range r.pkgs[dir].files {
		for _, imp := range f.imports {
			if d, ok := r.dirOf(imp); ok && !slices.Contains(deps, d) {
				deps = append(deps, d)
			}
		}
	}
	slices.Sort(deps)
	return deps
}

// core returns the sorted dirs of the core: the root package and the
// internal packages it imports, directly or not.
func (r *repo) core() []string {
	seen := map[string]bool{".": true}
	core := []string{"."}
	for i := 0; i < len(core); i++ {
		for _, d := range r.deps(core[i]) {
			if under(d, "internal") && !seen[d] {
				seen[d] = true
				core = append(core, d)
			}
		}
	}
	slices.Sort(core)
	return core
}

// sortedDirs returns the dirs of the root module's packages, sorted.
func (r *repo) sortedDirs() []string {
	return slices.Sorted(maps.Keys(r.pkgs))
}

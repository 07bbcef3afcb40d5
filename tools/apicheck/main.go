// Command apicheck lists the exported API of Go packages, one line per
// exported name, method and struct field, in a stable, sorted text form,
// and checks it against a listing kept from a release: every line of the
// release must still be there, word for word. A line gone or changed is a
// change a user's code may not survive (a name removed, a signature or a
// type changed, a method added to an interface, which is listed with its
// whole method set); lines only added are new API.
//
//	go run ./apicheck -dir .. -write ../api/v1.txt ./... ./otel/... # keep a release's API
//	go run ./apicheck -dir .. -check ../api/v1.txt ./... ./otel/... # fail on what it lost
//
// Patterns are as for go list, from -dir; internal packages, main packages
// and tests are left out.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/types"
	"log"
	"os"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
)

func main() {
	dir := flag.String("dir", ".", "the directory the patterns are relative to")
	write := flag.String("write", "", "write the listing to this file")
	check := flag.String("check", "", "fail if a line of this file is missing from the listing")
	flag.Parse()
	lines, err := list(*dir, flag.Args())
	if err != nil {
		log.Fatalf("apicheck: %v", err)
	}
	switch {
	case *write != "":
		if err := os.WriteFile(*write, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			log.Fatalf("apicheck: %v", err)
		}
	case *check != "":
		missing, err := missingLines(*check, lines)
		if err != nil {
			log.Fatalf("apicheck: %v", err)
		}
		if len(missing) > 0 {
			fmt.Printf("apicheck: %d lines of %s are gone: an incompatible change, which needs a new major version\n", len(missing), *check)
			for _, l := range missing {
				fmt.Println("  - " + l)
			}
			os.Exit(1)
		}
		fmt.Printf("apicheck: every line of %s is still there (%d lines now)\n", *check, len(lines))
	default:
		fmt.Println(strings.Join(lines, "\n"))
	}
}

// missingLines returns the lines of the file at path that lines lacks.
func missingLines(path string, lines []string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	have := map[string]bool{}
	for _, l := range lines {
		have[l] = true
	}
	var missing []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !have[l] {
			missing = append(missing, l)
		}
	}
	return missing, sc.Err()
}

// list returns the API lines of the packages patterns name, sorted.
func list(dir string, patterns []string) ([]string, error) {
	cfg := &packages.Config{Dir: dir, Mode: packages.NeedName | packages.NeedTypes | packages.NeedTypesInfo}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, p := range pkgs {
		if len(p.Errors) > 0 {
			return nil, fmt.Errorf("%s: %v", p.PkgPath, p.Errors[0])
		}
		if p.Name == "main" || strings.Contains(p.PkgPath, "/internal/") || strings.HasSuffix(p.PkgPath, "/internal") {
			continue
		}
		lines = append(lines, pkgLines(p.Types)...)
	}
	slices.Sort(lines)
	return slices.Compact(lines), nil
}

// pkgLines returns the API lines of pkg.
func pkgLines(pkg *types.Package) []string {
	qual := func(p *types.Package) string {
		if p == pkg {
			return ""
		}
		return p.Path()
	}
	var lines []string
	add := func(format string, args ...any) {
		lines = append(lines, pkg.Path()+": "+fmt.Sprintf(format, args...))
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch obj := obj.(type) {
		case *types.Const:
			add("const %s %s = %s", name, types.TypeString(obj.Type(), qual), obj.Val().ExactString())
		case *types.Var:
			add("var %s %s", name, typeString(obj.Type(), qual))
		case *types.Func:
			add("func %s%s", name, signature(obj.Type().(*types.Signature), qual))
		case *types.TypeName:
			lines = append(lines, typeLines(pkg, obj, qual)...)
		}
	}
	return lines
}

// typeLines returns the lines of an exported type: its kind (an
// interface with its whole method set, so that adding a method is a
// change), its exported fields and its exported methods.
func typeLines(pkg *types.Package, obj *types.TypeName, qual types.Qualifier) []string {
	var lines []string
	add := func(format string, args ...any) {
		lines = append(lines, pkg.Path()+": "+fmt.Sprintf(format, args...))
	}
	name := obj.Name()
	if obj.IsAlias() {
		add("type %s = %s", name, types.TypeString(obj.Type(), qual))
		return lines
	}
	under := obj.Type().Underlying()
	switch u := under.(type) {
	case *types.Struct:
		add("type %s struct", name)
		for i := range u.NumFields() {
			if f := u.Field(i); f.Exported() {
				add("type %s struct, field %s %s", name, f.Name(), typeString(f.Type(), qual))
			}
		}
	case *types.Interface:
		var methods []string
		for i := range u.NumMethods() {
			m := u.Method(i)
			methods = append(methods, m.Name()+signature(m.Type().(*types.Signature), qual))
		}
		add("type %s interface { %s }", name, strings.Join(methods, "; "))
	default:
		add("type %s %s", name, typeString(under, qual))
	}
	named, ok := obj.Type().(*types.Named)
	if !ok {
		return lines
	}
	for i := range named.NumMethods() {
		m := named.Method(i)
		if !m.Exported() {
			continue
		}
		sig := m.Type().(*types.Signature)
		recv := name
		if _, ptr := sig.Recv().Type().(*types.Pointer); ptr {
			recv = "*" + name
		}
		add("method (%s) %s%s", recv, m.Name(), signature(sig, qual))
	}
	return lines
}

// signature returns sig's parameters and results, without names: renaming
// a parameter breaks no caller.
func signature(sig *types.Signature, qual types.Qualifier) string {
	tuple := func(t *types.Tuple, variadic bool) string {
		var parts []string
		for i := range t.Len() {
			typ := t.At(i).Type()
			if variadic && i == t.Len()-1 {
				parts = append(parts, "..."+typeString(typ.(*types.Slice).Elem(), qual))
				continue
			}
			parts = append(parts, typeString(typ, qual))
		}
		return strings.Join(parts, ", ")
	}
	s := "(" + tuple(sig.Params(), sig.Variadic()) + ")"
	switch res := tuple(sig.Results(), false); {
	case sig.Results().Len() == 1:
		s += " " + res
	case sig.Results().Len() > 1:
		s += " (" + res + ")"
	}
	return s
}

// typeString is types.TypeString, but a function type is written without
// its parameters' names, which a caller never depends on.
func typeString(t types.Type, qual types.Qualifier) string {
	if sig, ok := t.(*types.Signature); ok {
		return "func" + signature(sig, qual)
	}
	return types.TypeString(t, qual)
}

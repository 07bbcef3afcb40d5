// Command callpath reads a Delve trace of a program of this repository
// (dlv trace, every function of the module) and prints the path of what
// ran between the first two calls of main.marker: the files it passed
// through in order, with the functions called in each, and every call
// into a file that was already on the calling goroutine's stack below its
// caller (a path that returns to a file it has left).
//
//	go build -gcflags='all=-N -l' -o /tmp/probe ./tools/callpath/probe
//	dlv trace --exec /tmp/probe 'main.marker|github.com/slidingwindow/ratelimit' > /tmp/trace.txt 2>&1
//	cd tools && go run ./callpath -dir .. /tmp/trace.txt
package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

const module = "github.com/slidingwindow/ratelimit"

func main() {
	dir := flag.String("dir", ".", "the repository's root")
	flag.Parse()
	if flag.NArg() != 1 {
		log.Fatal("usage: callpath [-dir repo] trace.txt")
	}
	files, err := index(*dir)
	if err != nil {
		log.Fatal(err)
	}
	events, err := read(flag.Arg(0))
	if err != nil {
		log.Fatal(err)
	}
	report(events, files)
}

// A funcKey names a function: its package's directory in the repository,
// its receiver's type name (empty for none) and its name.
type funcKey struct{ dir, recv, name string }

// index returns the file of every function declared in dir's Go files
// (tests left out), by funcKey.
func index(dir string) (map[funcKey]string, error) {
	files := map[funcKey]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		pkg := filepath.Dir(rel)
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok {
				files[funcKey{pkg, recvName(fn), fn.Name.Name}] = rel
			}
		}
		return nil
	})
	return files, err
}

// recvName returns the type name of fn's receiver, or "" for a function.
func recvName(fn *ast.FuncDecl) string {
	if fn.Recv == nil {
		return ""
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// An event is a call (or, with ret, a return) of a function of the module,
// on goroutine g.
type event struct {
	g   string
	ret bool
	fn  string // as Delve names it: pkg.(*T).name, pkg.T.name, pkg.name
}

var line = regexp.MustCompile(`^(>>?) goroutine\((\d+)\): (` + regexp.QuoteMeta(module) + `[\w/]*\.(?:\(\*?\w+(?:\[[^\]]*\])?\)\.)?[\w.]+|main\.marker)`)

// read returns the events of the trace at path between the first two calls
// of main.marker.
func read(path string) ([]event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var events []event
	marks := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		if m[3] == "main.marker" {
			if m[1] == ">" {
				marks++
			}
			continue
		}
		if marks == 1 {
			events = append(events, event{g: m[2], ret: m[1] == ">>", fn: m[3]})
		}
	}
	if marks < 2 {
		return nil, fmt.Errorf("%s: main.marker called %d times, not twice", path, marks)
	}
	return events, sc.Err()
}

var (
	closure = regexp.MustCompile(`\.(func\d+|gowrap\d+|deferwrap\d+)(\.\d+)*$`)
	generic = regexp.MustCompile(`\[[^\]]*\]`)
)

// locate returns the file of the function Delve names fn, and its short
// name (T.name, or name).
func locate(fn string, files map[funcKey]string) (file, short string) {
	rest := strings.TrimPrefix(fn, module)
	dir := "."
	if strings.HasPrefix(rest, "/") {
		i := strings.Index(rest, ".")
		dir, rest = rest[1:i], rest[i:]
	}
	rest = strings.TrimPrefix(rest, ".")
	rest = generic.ReplaceAllString(closure.ReplaceAllString(rest, ""), "")
	recv, name := "", rest
	if i := strings.LastIndex(rest, "."); i >= 0 {
		recv, name = strings.Trim(rest[:i], "()*"), rest[i+1:]
		short = recv + "." + name
	} else {
		short = name
	}
	if file, ok := files[funcKey{dir, recv, name}]; ok {
		return file, short
	}
	if file, ok := files[funcKey{dir, "", name}]; ok {
		return file, short
	}
	return dir + "/?", short
}

// A frame is one call on a goroutine's stack.
type frame struct{ file, fn string }

// report prints the files events passed through and the calls into a file
// already on the stack.
func report(events []event, files map[funcKey]string) {
	stacks := map[string][]frame{}
	type stretch struct {
		g, file string
		fns     []string
	}
	var path []stretch
	var reentries []string
	for _, e := range events {
		file, short := locate(e.fn, files)
		st := stacks[e.g]
		if e.ret {
			for i := len(st) - 1; i >= 0; i-- {
				if st[i].fn == e.fn {
					stacks[e.g] = st[:i]
					break
				}
			}
			continue
		}
		if n := len(st); n > 0 && st[n-1].file != file && slices.ContainsFunc(st[:n-1], func(f frame) bool { return f.file == file }) {
			var chain []string
			for _, f := range st {
				if len(chain) == 0 || chain[len(chain)-1] != f.file {
					chain = append(chain, f.file)
				}
			}
			reentries = append(reentries, fmt.Sprintf("goroutine %s: %s -> %s (%s)", e.g, strings.Join(chain, " > "), file, short))
		}
		stacks[e.g] = append(st, frame{file, e.fn})
		if n := len(path); n > 0 && path[n-1].g == e.g && path[n-1].file == file {
			if !slices.Contains(path[n-1].fns, short) {
				path[n-1].fns = append(path[n-1].fns, short)
			}
			continue
		}
		path = append(path, stretch{e.g, file, []string{short}})
	}
	for _, s := range path {
		fmt.Printf("g%-4s %-34s %s\n", s.g, s.file, strings.Join(s.fns, ", "))
	}
	fmt.Printf("\ncalls into a file already on the stack below the caller: %d\n", len(reentries))
	for _, r := range reentries {
		fmt.Println("  " + r)
	}
}

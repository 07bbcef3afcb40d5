// Command modproxy writes a Go module proxy directory (the GOPROXY file
// layout) holding modules of this repository's working tree at one
// version, so that a fresh module outside the repository can `go get` them
// as a user would, with GOPROXY=file://DIR, before any tag exists:
//
//	go run ./modproxy -out /tmp/proxy -version v1.0.0 \
//	    github.com/slidingwindow/ratelimit=.. \
//	    github.com/slidingwindow/ratelimit/otel=../otel
//
// Each module's zip is made by golang.org/x/mod/zip from its directory, as
// the go command would make it from a tag: nested modules, vendor
// directories and files no module may hold are left out, and a module whose
// go.mod names another path is refused.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	out := flag.String("out", "", "the proxy directory to write")
	version := flag.String("version", "", "the version every module is given, say v1.0.0")
	flag.Parse()
	if *out == "" || *version == "" || flag.NArg() == 0 {
		log.Fatal("usage: modproxy -out DIR -version vX.Y.Z path=dir ...")
	}
	for _, arg := range flag.Args() {
		path, dir, ok := strings.Cut(arg, "=")
		if !ok {
			log.Fatalf("modproxy: %q is not path=dir", arg)
		}
		if err := write(*out, module.Version{Path: path, Version: *version}, dir); err != nil {
			log.Fatalf("modproxy: %s: %v", path, err)
		}
		fmt.Printf("%s@%s from %s\n", path, *version, dir)
	}
}

// write adds mod, made from dir, to the proxy directory out.
func write(out string, mod module.Version, dir string) error {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	f, err := modfile.ParseLax("go.mod", gomod, nil)
	if err != nil {
		return err
	}
	if f.Module == nil || f.Module.Mod.Path != mod.Path {
		return fmt.Errorf("%s/go.mod is not module %s", dir, mod.Path)
	}
	escaped, err := module.EscapePath(mod.Path)
	if err != nil {
		return err
	}
	vdir := filepath.Join(out, escaped, "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	var zipped bytes.Buffer
	if err := zip.CreateFromDir(&zipped, mod, dir); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{mod.Version, time.Now().UTC()})
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		mod.Version + ".zip":  zipped.Bytes(),
		mod.Version + ".mod":  gomod,
		mod.Version + ".info": info,
		"list":                []byte(mod.Version + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

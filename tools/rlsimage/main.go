// Command rlsimage builds the OCI image of ratelimit-rls, the Envoy rate
// limit service of ../rls/cmd/ratelimit-rls, without a container runtime:
//
//	cd tools && go run ./rlsimage -out /tmp/rls-image -tar /tmp/rls-image.tar
//
// It is a drop-in for envoyproxy/ratelimit's image: the program is
// /bin/ratelimit, the path Envoy Gateway runs. The binary is static
// (CGO_ENABLED=0, GOOS=linux, -trimpath, no build ID) and the image's one
// layer holds it with /etc/passwd and /etc/group naming the user nonroot
// (65532), its home, /etc/nsswitch.conf and /tmp; no shell, no libc, no CA
// file (the binary carries Go's fallback roots for REDIS_TLS). The image
// runs as 65532:65532.
//
// The output is reproducible: every timestamp is SOURCE_DATE_EPOCH when set,
// else the Unix epoch, and the layer's entries are in a fixed order with
// fixed owners, so two runs on the same commit with the same Go write the
// same bytes and print the same digest. -out is an OCI image layout
// directory (for skopeo, crane, podman, or a registry push); -tar is the
// same image as a tarball that `docker load` takes, tagged -tag.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// options are what an image is built from and written to.
type options struct {
	rlsDir string    // the rls module's directory
	arch   string    // GOARCH, which is also the image's architecture
	tag    string    // the tarball's tag, and the layout's ref.name
	out    string    // the OCI layout directory to write
	tar    string    // the docker-load tarball to write, if not ""
	epoch  time.Time // every timestamp
}

// report is what build wrote.
type report struct {
	digest       v1.Hash // the image manifest's
	layer        int64   // the layer, compressed
	uncompressed int64   // the layer, uncompressed
	total        int64   // manifest, config and layer: what a registry stores
	tarSize      int64   // the tarball's, if written
}

// user is the one the image runs as, distroless's nonroot.
const user = 65532

// architectures are the GOARCH values whose OCI architecture is the same
// word, with no variant.
var architectures = map[string]bool{"amd64": true, "arm64": true, "ppc64le": true, "s390x": true, "riscv64": true}

func main() {
	o := options{}
	flag.StringVar(&o.out, "out", "", "the OCI image layout directory to write (replaced if it is one)")
	flag.StringVar(&o.tar, "tar", "", "also write a tarball for docker load to this file")
	flag.StringVar(&o.arch, "arch", "amd64", "the architecture (GOARCH): amd64, arm64, ppc64le, s390x or riscv64")
	flag.StringVar(&o.tag, "tag", "ratelimit-rls:dev", "the image's tag: the tarball's, and the layout's ref.name (its tag part)")
	flag.StringVar(&o.rlsDir, "rls", "../rls", "the rls module's directory")
	flag.Parse()
	if o.out == "" || flag.NArg() > 0 {
		log.Fatal("usage: rlsimage -out DIR [-tar FILE] [-arch amd64] [-tag ratelimit-rls:dev] [-rls ../rls]")
	}
	var err error
	if o.epoch, err = sourceDateEpoch(os.Getenv("SOURCE_DATE_EPOCH")); err != nil {
		log.Fatalf("rlsimage: %v", err)
	}
	r, err := build(o)
	if err != nil {
		log.Fatalf("rlsimage: %v", err)
	}
	fmt.Printf("image %s (linux/%s), %s\n", r.digest, o.arch, o.out)
	fmt.Printf("layer %d bytes compressed, %d uncompressed; image %d bytes compressed\n", r.layer, r.uncompressed, r.total)
	if o.tar != "" {
		fmt.Printf("tarball %s, %d bytes, tagged %s\n", o.tar, r.tarSize, o.tag)
	}
}

// sourceDateEpoch is the time SOURCE_DATE_EPOCH (seconds since the Unix
// epoch) names, or the epoch itself without one.
func sourceDateEpoch(v string) (time.Time, error) {
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	s, err := strconv.ParseInt(v, 10, 64)
	if err != nil || s < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q is not a number of seconds since 1970", v)
	}
	return time.Unix(s, 0).UTC(), nil
}

// build builds the binary and writes the image as o says.
func build(o options) (report, error) {
	if !architectures[o.arch] {
		return report{}, fmt.Errorf("-arch %q: want amd64, arm64, ppc64le, s390x or riscv64", o.arch)
	}
	tag, err := name.NewTag(o.tag)
	if err != nil {
		return report{}, fmt.Errorf("-tag: %w", err)
	}
	if err := clearOut(o.out); err != nil {
		return report{}, err
	}
	bin, err := goBuild(o.rlsDir, o.arch)
	if err != nil {
		return report{}, err
	}
	tarBytes, err := layerTar(bin, o.epoch)
	if err != nil {
		return report{}, err
	}
	img, err := image(tarBytes, o.arch, o.epoch)
	if err != nil {
		return report{}, err
	}
	r := report{uncompressed: int64(len(tarBytes))}
	if r.digest, err = img.Digest(); err != nil {
		return report{}, err
	}
	if r.total, err = imageSize(img); err != nil {
		return report{}, err
	}
	layers, err := img.Layers()
	if err != nil {
		return report{}, err
	}
	if r.layer, err = layers[0].Size(); err != nil {
		return report{}, err
	}
	if err := writeLayout(o.out, img, tag, o.arch); err != nil {
		return report{}, fmt.Errorf("writing %s: %w", o.out, err)
	}
	if o.tar != "" {
		if err := tarball.WriteToFile(o.tar, tag, img); err != nil {
			return report{}, fmt.Errorf("writing %s: %w", o.tar, err)
		}
		fi, err := os.Stat(o.tar)
		if err != nil {
			return report{}, err
		}
		r.tarSize = fi.Size()
	}
	return r, nil
}

// goBuild builds ratelimit-rls in rlsDir, static, for linux/arch, and
// returns the binary. The environment (GOFLAGS, GOPROXY, GOWORK, ...) is
// this process's, with the settings of a static, reproducible build.
func goBuild(rlsDir, arch string) ([]byte, error) {
	tmp, err := os.MkdirTemp("", "rlsimage")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "ratelimit")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", bin, "./cmd/ratelimit-rls")
	cmd.Dir = rlsDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build in %s: %v\n%s", rlsDir, err, out)
	}
	return os.ReadFile(bin)
}

// entry is one file or directory of the image's layer.
type entry struct {
	name string
	mode int64 // permissions, and 0o1000 for sticky
	uid  int   // and gid
	dir  bool
	data []byte
}

// files are the layer's entries, in their order, with bin as /bin/ratelimit.
func files(bin []byte) []entry {
	return []entry{
		{name: "bin/", mode: 0o755, dir: true},
		{name: "bin/ratelimit", mode: 0o755, data: bin},
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\n" +
			"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, uid: user, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
	}
}

// layerTar returns the layer, uncompressed: files(bin), in USTAR
// format, every one dated t.
func layerTar(bin []byte, t time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range files(bin) {
		h := &tar.Header{
			Typeflag: tar.TypeReg, Name: e.name, Mode: e.mode, Size: int64(len(e.data)),
			Uid: e.uid, Gid: e.uid, Uname: "root", Gname: "root", ModTime: t, Format: tar.FormatUSTAR,
		}
		if e.dir {
			h.Typeflag = tar.TypeDir
		}
		if e.uid == user {
			h.Uname, h.Gname = "nonroot", "nonroot"
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer: %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("layer: %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return buf.Bytes(), nil
}

// image is the OCI image of the layer tarBytes, for linux/arch, made at t.
func image(tarBytes []byte, arch string, t time.Time) (v1.Image, error) {
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression) // no name, no time: the same bytes each run
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(tarBytes); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	compressed := gz.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(compressed)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      v1.Time{Time: t},
		Config: v1.Config{
			Entrypoint: []string{"/bin/ratelimit"},
			User:       fmt.Sprintf("%d:%d", user, user),
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			WorkingDir: "/",
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	return mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: t}, CreatedBy: "tools/rlsimage", Comment: "/bin/ratelimit: ratelimit-rls, static"},
	})
}

// imageSize is the size of img's manifest, config and layers, as stored.
func imageSize(img v1.Image) (int64, error) {
	m, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	c, err := img.RawConfigFile()
	if err != nil {
		return 0, err
	}
	n := int64(len(m) + len(c))
	layers, err := img.Layers()
	if err != nil {
		return 0, err
	}
	for _, l := range layers {
		s, err := l.Size()
		if err != nil {
			return 0, err
		}
		n += s
	}
	return n, nil
}

// clearOut readies dir for a layout: one already there (it has an oci-layout
// file) is removed; any other directory that is not empty is refused.
func clearOut(dir string) error {
	names, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist) || err == nil && len(names) == 0:
		return nil
	case err != nil:
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
		return fmt.Errorf("-out %s is neither empty nor an OCI image layout", dir)
	}
	return os.RemoveAll(dir)
}

// writeLayout writes img as the one image of the OCI layout dir, for
// linux/arch, named by tag's tag.
func writeLayout(dir string, img v1.Image, tag name.Tag, arch string) error {
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{
		Add: img,
		Descriptor: v1.Descriptor{
			Platform:    &v1.Platform{OS: "linux", Architecture: arch},
			Annotations: map[string]string{"org.opencontainers.image.ref.name": tag.TagStr()},
		},
	})
	_, err := layout.Write(dir, idx)
	return err
}

package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/redis/go-redis/v9"
)

// wantFiles is every entry of the image's layer, in order.
var wantFiles = []struct {
	name     string
	typ      byte
	mode     int64
	uid, gid int
}{
	{"bin/", tar.TypeDir, 0o755, 0, 0},
	{"bin/ratelimit", tar.TypeReg, 0o755, 0, 0},
	{"etc/", tar.TypeDir, 0o755, 0, 0},
	{"etc/group", tar.TypeReg, 0o644, 0, 0},
	{"etc/nsswitch.conf", tar.TypeReg, 0o644, 0, 0},
	{"etc/passwd", tar.TypeReg, 0o644, 0, 0},
	{"home/", tar.TypeDir, 0o755, 0, 0},
	{"home/nonroot/", tar.TypeDir, 0o700, 65532, 65532},
	{"tmp/", tar.TypeDir, 0o1777, 0, 0},
}

// The image as the tool writes it, read back from its OCI layout: its
// config and layer, the static binary, and then, as root, its entrypoint
// run in the unpacked rootfs as user 65532, serving on a redis-server.
func TestImage(t *testing.T) {
	if !architectures[runtime.GOARCH] {
		t.Skipf("the image is not built for %s, so this machine cannot run it", runtime.GOARCH)
	}
	dir := t.TempDir()
	o := options{
		rlsDir: filepath.Join("..", "..", "rls"), arch: runtime.GOARCH, tag: "ratelimit-rls:dev",
		out: filepath.Join(dir, "oci"), tar: filepath.Join(dir, "image.tar"), epoch: time.Unix(0, 0).UTC(),
	}
	r, err := build(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s: layer %d bytes compressed, %d uncompressed", r.digest, r.layer, r.uncompressed)

	img := readLayout(t, o.out, r.digest)
	checkConfig(t, img)
	rootfs := filepath.Join(dir, "rootfs")
	unpack(t, img, rootfs)
	checkStatic(t, filepath.Join(rootfs, "bin", "ratelimit"))

	tag, err := name.NewTag(o.tag)
	if err != nil {
		t.Fatal(err)
	}
	fromTar, err := tarball.ImageFromPath(o.tar, &tag)
	if err != nil {
		t.Fatalf("the docker-load tarball: %v", err)
	}
	if !sameBlobs(t, fromTar, img) {
		t.Error("the tarball's config and layer are not the layout's")
	}

	t.Run("entrypoint", func(t *testing.T) { runEntrypoint(t, img, rootfs) })
}

// readLayout reads the OCI layout dir back, checks it holds the one image
// digest, for linux/GOARCH, valid, and returns it.
func readLayout(t *testing.T, dir string, digest v1.Hash) v1.Image {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("the layout is not a valid image index: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex || len(im.Manifests) != 1 {
		t.Fatalf("index.json: %s with %d manifests, want an OCI index of one", im.MediaType, len(im.Manifests))
	}
	m := im.Manifests[0]
	if m.Digest != digest || m.MediaType != types.OCIManifestSchema1 {
		t.Errorf("index.json lists %s %s, want %s %s", m.MediaType, m.Digest, types.OCIManifestSchema1, digest)
	}
	if m.Platform == nil || m.Platform.OS != "linux" || m.Platform.Architecture != runtime.GOARCH {
		t.Errorf("index.json: platform %+v, want linux/%s", m.Platform, runtime.GOARCH)
	}
	if ref := m.Annotations["org.opencontainers.image.ref.name"]; ref != "dev" {
		t.Errorf("index.json: ref.name %q, want dev", ref)
	}
	img, err := idx.Image(m.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// checkConfig checks img's config and manifest.
func checkConfig(t *testing.T, img v1.Image) {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != types.OCIConfigJSON || len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("manifest: config %s and layers %v, want %s and one %s", m.Config.MediaType, m.Layers, types.OCIConfigJSON, types.OCILayer)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/bin/ratelimit"}) || len(c.Cmd) != 0 {
		t.Errorf("config: Entrypoint %q Cmd %q, want [/bin/ratelimit] and none", c.Entrypoint, c.Cmd)
	}
	if c.User != "65532:65532" || c.WorkingDir != "/" {
		t.Errorf("config: User %q WorkingDir %q, want 65532:65532 and /", c.User, c.WorkingDir)
	}
	if !slices.ContainsFunc(c.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=/") }) {
		t.Errorf("config: Env %q has no PATH", c.Env)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH || !cf.Created.Equal(time.Unix(0, 0)) {
		t.Errorf("config: %s/%s created %v, want linux/%s at the epoch", cf.OS, cf.Architecture, cf.Created, runtime.GOARCH)
	}
}

// unpack checks img's layer, entry by entry, and writes its files to rootfs
// with their modes, and their owners when this process may set them.
func unpack(t *testing.T, img v1.Image, rootfs string) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(rc)
	var got []string
	for i := 0; ; i++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the layer: %v", err)
		}
		got = append(got, h.Name)
		switch base := path.Base(h.Name); base {
		case "sh", "bash", "dash", "ash", "busybox":
			t.Errorf("the layer has a shell: %s", h.Name)
		}
		if i >= len(wantFiles) {
			continue
		}
		w := wantFiles[i]
		if h.Name != w.name || h.Typeflag != w.typ || h.Mode != w.mode || h.Uid != w.uid || h.Gid != w.gid || !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("layer entry %d: %s type %c mode %o owner %d:%d time %v, want %s type %c mode %o owner %d:%d at the epoch",
				i, h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.ModTime, w.name, w.typ, w.mode, w.uid, w.gid)
		}
		if !filepath.IsLocal(h.Name) {
			t.Fatalf("layer entry %q is outside the rootfs", h.Name)
		}
		target := filepath.Join(rootfs, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.Mkdir(target, 0o700)
		case tar.TypeReg:
			var data []byte
			if data, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(target, data, 0o600)
			}
		default:
			t.Fatalf("layer entry %s has type %c, want a file or a directory", h.Name, h.Typeflag)
		}
		if err == nil {
			err = os.Chmod(target, h.FileInfo().Mode())
		}
		if err == nil && os.Geteuid() == 0 {
			err = os.Lchown(target, h.Uid, h.Gid)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != len(wantFiles) {
		t.Errorf("the layer holds %q, want %d entries", got, len(wantFiles))
	}
	for file, want := range map[string]string{"etc/passwd": "\nnonroot:x:65532:65532:", "etc/group": "\nnonroot:x:65532:\n"} {
		b, err := os.ReadFile(filepath.Join(rootfs, file))
		if err != nil || !bytes.Contains(b, []byte(want)) {
			t.Errorf("/%s is %q (%v), want a line %q", file, b, err, strings.TrimSpace(want))
		}
	}
}

// checkStatic checks that bin is a static linux executable, with Go's
// fallback roots in it.
func checkStatic(t *testing.T, bin string) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("/bin/ratelimit is not static: it has a %s program header", p.Type)
		}
	}
	if f.Type != elf.ET_EXEC {
		t.Errorf("/bin/ratelimit is an ELF %s, want %s", f.Type, elf.ET_EXEC)
	}
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" || settings["GOOS"] != "linux" {
		t.Errorf("/bin/ratelimit was built with %v, want CGO_ENABLED=0 -trimpath GOOS=linux", settings)
	}
	if !slices.ContainsFunc(bi.Deps, func(m *debug.Module) bool { return m.Path == "golang.org/x/crypto/x509roots/fallback" }) {
		t.Error("/bin/ratelimit does not hold golang.org/x/crypto/x509roots/fallback, the roots REDIS_TLS needs in the image")
	}
}

// sameBlobs reports whether a and b have the same config and layers (a
// docker-load tarball's image has another manifest than its OCI layout's).
func sameBlobs(t *testing.T, a, b v1.Image) bool {
	t.Helper()
	blobs := func(img v1.Image) []v1.Hash {
		c, err := img.ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		hs := []v1.Hash{c}
		for _, l := range layers {
			d, err := l.Digest()
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, d)
		}
		return hs
	}
	return slices.Equal(blobs(a), blobs(b))
}

// runEntrypoint runs img's entrypoint in rootfs as 65532:65532, as a
// container runtime would, against a redis-server, and asks it for a
// decision over HTTP.
func runEntrypoint(t *testing.T, img v1.Image, rootfs string) {
	if os.Geteuid() != 0 {
		t.Skipf("running the entrypoint in the rootfs needs root (chroot, and setuid to 65532); this test runs as uid %d", os.Geteuid())
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	uid, gid, ok := strings.Cut(cf.Config.User, ":")
	u, err1 := strconv.ParseUint(uid, 10, 32)
	g, err2 := strconv.ParseUint(gid, 10, 32)
	if !ok || err1 != nil || err2 != nil || u == 0 {
		t.Fatalf("config: User %q is not uid:gid of a user other than root", cf.Config.User)
	}
	inImage := func(env []string, args ...string) *exec.Cmd {
		cmd := exec.Command(cf.Config.Entrypoint[0], args...)
		cmd.Dir = cf.Config.WorkingDir
		cmd.Env = append(slices.Clone(cf.Config.Env), env...)
		// no Groups: root's supplementary groups are dropped too
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs, Credential: &syscall.Credential{Uid: uint32(u), Gid: uint32(g)}}
		return cmd
	}

	out, err := inImage(nil, "-version").CombinedOutput()
	if errors.Is(err, syscall.EPERM) {
		t.Skipf("chroot or setuid is not permitted here (%v), so the entrypoint is not run", err)
	}
	if err != nil || !strings.HasPrefix(string(out), "ratelimit-rls ") {
		t.Fatalf("%s -version in the image: %v\n%s", cf.Config.Entrypoint[0], err, out)
	}
	t.Logf("in the image: %s", bytes.TrimSpace(out))

	redisAddr := startRedis(t)
	config := filepath.Join(rootfs, "data", "ratelimit", "config")
	if err := os.MkdirAll(config, 0o755); err != nil {
		t.Fatal(err)
	}
	yaml := "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
	if err := os.WriteFile(filepath.Join(config, "config.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	httpPort, grpcPort := freePort(t), freePort(t)
	cmd := inImage([]string{
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"HOST=127.0.0.1", fmt.Sprint("PORT=", httpPort), "GRPC_HOST=127.0.0.1", fmt.Sprint("GRPC_PORT=", grpcPort),
		"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "LOG_LEVEL=info",
	})
	logs, exited := start(t, cmd)

	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			err = errors.New(resp.Status)
		}
		select {
		case <-exited:
			t.Fatalf("the entrypoint exited: %v\n%s", cmd.ProcessState, logs())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /healthcheck: %v after 30 s\n%s", err, logs())
		}
		time.Sleep(20 * time.Millisecond) // a process starting
	}

	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		ids[k] = strings.Join(strings.Fields(v), " ")
	}
	if want := fmt.Sprintf("%d %d %d %d", u, u, u, u); ids["Uid"] != want {
		t.Errorf("the process's Uid is %q, want %q", ids["Uid"], want)
	}
	if want := fmt.Sprintf("%d %d %d %d", g, g, g, g); ids["Gid"] != want {
		t.Errorf("the process's Gid is %q, want %q", ids["Gid"], want)
	}
	if ids["Groups"] != "" {
		t.Errorf("the process has the supplementary groups %q, want none", ids["Groups"])
	}

	resp, err := http.Post(base+"/json", "application/json",
		strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var decision struct{ OverallCode string }
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &decision) != nil || decision.OverallCode != "OK" {
		t.Fatalf("POST /json: %s %s, want 200 and overallCode OK\n%s", resp.Status, body, logs())
	}
}

// start starts cmd with its output in a file, and kills it when t ends. It
// returns the output so far, and a channel closed when cmd has exited.
func start(t *testing.T, cmd *exec.Cmd) (logs func() string, exited <-chan struct{}) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("%s: %v", cmd.Path, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		f.Close()
	})
	return func() string {
		b, _ := os.ReadFile(f.Name())
		return string(b)
	}, done
}

// startRedis starts redis-server (RATELIMIT_REDIS_SERVER if set) on a free
// loopback port and returns its address once it answers PING. Without the
// program the test skips, or fails under RATELIMIT_REQUIRE_REDIS=1.
func startRedis(t *testing.T) string {
	t.Helper()
	program := os.Getenv("RATELIMIT_REDIS_SERVER")
	if program == "" {
		program = "redis-server"
	}
	if _, err := exec.LookPath(program); err != nil {
		if os.Getenv("RATELIMIT_REQUIRE_REDIS") == "1" {
			t.Fatalf("%s is not installed, and RATELIMIT_REQUIRE_REDIS=1", program)
		}
		t.Skipf("%s is not installed: apt-get install redis-server to run this test", program)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(program, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	logs, exited := start(t, cmd)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return addr
		}
		select {
		case <-exited:
			t.Fatalf("%s exited: %v\n%s", program, cmd.ProcessState, logs())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s on %s: no answer to PING: %v\n%s", program, addr, err, logs())
		}
		time.Sleep(20 * time.Millisecond) // a process starting
	}
}

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

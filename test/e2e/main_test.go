package e2e

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// env is what TestMain found or built; tests read it only.
var env struct {
	root      string            // module root
	tmp       string            // scratch directory of the whole run
	server    string            // dflash_server binary
	modelTool string            // dflash-model binary
	plugins   map[string]string // "backend-scripted" → binary path
	libDir    string            // directory of libdflash_cpu.so, "" if none
	binDir    string            // DFLASH_BIN_DIR, "" when built here
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "dflash-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	if err := setup(tmp); err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		return 1
	}
	return m.Run()
}

// shippedPlugins are the plugin packages `make build` puts in bin/plugins.
var shippedPlugins = []string{"backend-qwen-dflash", "backend-ds4", "policy-primary-first", "policy-by-name"}

func setup(tmp string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	env.root, env.tmp = root, tmp
	env.plugins = map[string]string{}
	out := filepath.Join(tmp, "bin")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}

	// The scripted backend is a test double and never shipped: always build it.
	pkgs := []string{"./plugins/backend-scripted"}
	if bin := os.Getenv("DFLASH_BIN_DIR"); bin != "" {
		env.binDir = bin
		env.server = filepath.Join(bin, "dflash_server")
		env.modelTool = filepath.Join(bin, "dflash-model")
		files, _ := filepath.Glob(filepath.Join(bin, "plugins", "dflash-*"))
		for _, f := range files {
			if strings.HasSuffix(f, ".sha256") {
				continue
			}
			env.plugins[strings.TrimPrefix(filepath.Base(f), "dflash-")] = f
		}
		env.libDir = filepath.Join(bin, "lib")
		if env.plugins["backend-scripted"] != "" {
			pkgs = nil // a machine without Go (the GPU machine, scripts/gpu/pack.sh) brings every binary prebuilt
		}
	} else {
		pkgs = append(pkgs, "./cmd/dflash_server", "./cmd/dflash-model")
		for _, p := range shippedPlugins {
			pkgs = append(pkgs, "./plugins/"+p)
		}
		env.server = filepath.Join(out, "dflash_server")
		env.modelTool = filepath.Join(out, "dflash-model")
		env.libDir = filepath.Join(root, "bin", "lib")
	}
	if d := os.Getenv("DFLASH_LIB_DIR"); d != "" {
		env.libDir = d
	}
	if _, err := os.Stat(filepath.Join(env.libDir, "libdflash_cpu.so")); err != nil {
		env.libDir = ""
	}
	// One go build for every main package: the linker runs in parallel.
	if len(pkgs) > 0 {
		if err := goBuild(root, out, pkgs); err != nil {
			return err
		}
	}
	for _, p := range pkgs {
		name := filepath.Base(p)
		if !strings.HasPrefix(name, "backend-") && !strings.HasPrefix(name, "policy-") {
			continue
		}
		dst := filepath.Join(out, "dflash-"+name)
		if err := os.Rename(filepath.Join(out, name), dst); err != nil {
			return fmt.Errorf("rename plugin %s: %w", name, err)
		}
		env.plugins[name] = dst
	}
	for _, f := range []string{env.server} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("server binary: %w", err)
		}
	}
	for _, p := range []string{"backend-scripted", "policy-primary-first", "policy-by-name"} {
		if env.plugins[p] == "" {
			return fmt.Errorf("plugin dflash-%s not found (DFLASH_BIN_DIR=%q)", p, env.binDir)
		}
	}
	return nil
}

func goBuild(root, out string, pkgs []string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		// go test exports GOROOT to the test binary.
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	args := append([]string{"build", "-o", out + string(filepath.Separator)}, pkgs...)
	cmd := exec.Command(gobin, args...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(pkgs, " "), err, b)
	}
	return nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// needLib skips tests that run the native engine when no libdflash_cpu.so
// was found.
func needLib(t *testing.T) {
	t.Helper()
	if env.libDir == "" {
		unavailable(t, "needs libdflash_cpu.so: run `make build` or set DFLASH_LIB_DIR")
	}
	if env.plugins["backend-qwen-dflash"] == "" {
		unavailable(t, "needs the dflash-backend-qwen-dflash plugin")
	}
}

// unavailable skips a test whose prerequisites (engine library, npm
// packages) are missing here, but fails under CI, where make test provides
// all of them.
func unavailable(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// Lib is a loaded engine library for one device kind. It stays loaded for the life of the process.
type Lib struct {
	api    *capi
	path   string
	kind   string
	device int
}

var (
	libsMu sync.Mutex
	libs   = map[string]*capi{} // by path: dlopen once
)

// ParseDevice splits "cpu", "cpu:0", "cuda:1", "hip" into the kind and index.
func ParseDevice(device string) (kind string, index int, err error) {
	kind, idx, has := strings.Cut(strings.TrimSpace(device), ":")
	kind = strings.ToLower(kind)
	if kind == "" {
		return "", 0, fmt.Errorf("device %q: empty device kind (want cpu, cuda:N or hip:N)", device)
	}
	for _, r := range kind {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
			return "", 0, fmt.Errorf("device %q: bad device kind (want cpu, cuda:N or hip:N)", device)
		}
	}
	if has {
		index, err = strconv.Atoi(idx)
		if err != nil || index < 0 {
			return "", 0, fmt.Errorf("device %q: bad device index %q", device, idx)
		}
	}
	return kind, index, nil
}

// LibName is the file name of the engine library for a device kind: libdflash_<kind>.so.
func LibName(kind string) string { return "libdflash_" + kind + ".so" }

// Open loads the engine library for device (e.g. "cpu", "cuda:0") from libDir. A missing library is reported as
// "engine library libdflash_cuda.so not found in DIR: this build has no cuda support".
func Open(libDir, device string) (*Lib, error) {
	kind, index, err := ParseDevice(device)
	if err != nil {
		return nil, err
	}
	name := LibName(kind)
	path := filepath.Join(libDir, name)
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("engine library %s not found in %s: this build has no %s support", name, libDir, kind)
		}
		return nil, fmt.Errorf("engine library %s: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("engine library %s: %w", path, err)
	}
	libsMu.Lock()
	defer libsMu.Unlock()
	api := libs[abs]
	if api == nil {
		api, err = openAPI(abs)
		if err != nil {
			return nil, fmt.Errorf("load engine library %s (ABI v%d): %w", abs, ABIVersion, err)
		}
		libs[abs] = api
	}
	l := &Lib{api: api, path: abs, kind: kind, device: index}
	if got := api.kind(); got != kind {
		return nil, fmt.Errorf("engine library %s serves device kind %q, not %q", abs, got, kind)
	}
	if kind != "cpu" {
		if n := api.deviceCount(); index >= n {
			return nil, fmt.Errorf("device %s: the engine sees %d %s device(s)", device, n, kind)
		}
	}
	return l, nil
}

// Kind is the device kind ("cpu", "cuda", ...).
func (l *Lib) Kind() string { return l.kind }

// Device is the device index the library's models load onto.
func (l *Lib) Device() int { return l.device }

// Path is the absolute path of the loaded library.
func (l *Lib) Path() string { return l.path }

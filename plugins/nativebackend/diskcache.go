package nativebackend

import (
	"crypto/sha256"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"

	"github.com/dflash/dflash_server/sdk/statecache"
	"github.com/dflash/dflash_server/sdk/transport"
)

// DiskCacheOptions are a block's disk prefix cache flags (--disk-prefix-cache, -dir, -max-gb).
type DiskCacheOptions struct {
	On    bool
	Dir   string  // "" = DefaultDiskCacheDir()
	MaxGB float64 // size bound of the model's entries
}

// DefaultDiskCacheDir is $XDG_CACHE_HOME/dflash_server/prefix, else ~/.cache/dflash_server/prefix.
func DefaultDiskCacheDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "dflash_server", "prefix")
	}
	return filepath.Join(os.TempDir(), "dflash_server-prefix")
}

// openDiskCache opens the disk prefix cache of a model file. The identity covers what a stored state depends on: the
// file (its size and first 16 MiB: header, metadata, the first tensors), the engine options that shape the state
// (cache types, block size) and the metadata the backend overrode (Spec.Configure: e.g. fewer routed experts give
// other states); the native blob header checks the shapes again on import.
func openDiskCache(o DiskCacheOptions, path string, eo EngineOptions, overrides map[string]any) (*statecache.Cache, error) {
	id, err := fileIdentity(path)
	if err != nil {
		return nil, fmt.Errorf("--disk-prefix-cache: %w", err)
	}
	id = fmt.Appendf(id, "|k=%s|v=%s|bs=%d", eo.CacheK, eo.CacheV, eo.KVBlockSize)
	for _, k := range slices.Sorted(maps.Keys(overrides)) {
		id = fmt.Appendf(id, "|%s=%v", k, overrides[k])
	}
	dir := o.Dir
	if dir == "" {
		dir = DefaultDiskCacheDir()
	}
	log := transport.PluginLogger("disk-prefix-cache")
	c, err := statecache.Open(dir, id, int64(o.MaxGB*(1<<30)), log.Warn)
	if err != nil {
		return nil, fmt.Errorf("--disk-prefix-cache-dir %s: %w", dir, err)
	}
	return c, nil
}

func fileIdentity(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d|", st.Size())
	if _, err := io.CopyN(h, f, 16<<20); err != nil && err != io.EOF {
		return nil, err
	}
	return h.Sum(nil), nil
}

// changedMeta are the metadata entries of after that before lacks or holds
// with another value: what a backend's Configure overrode.
func changedMeta(before, after map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range after {
		if old, ok := before[k]; !ok || !reflect.DeepEqual(old, v) {
			out[k] = v
		}
	}
	return out
}

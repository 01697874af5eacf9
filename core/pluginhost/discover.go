package pluginhost

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/go-multierror"

	"github.com/dflash/dflash_server/sdk/transport"
)

// Kind is a plugin kind, named by its binary prefix.
type Kind string

const (
	KindBackend Kind = "backend"
	KindPolicy  Kind = "policy"
)

// File is one plugin binary found in the plugin directory.
type File struct {
	Kind Kind
	// Name is the binary name without its dflash-<kind>- prefix.
	Name string
	Path string
	// Checksum is the pinned sha256 from a "<binary>.sha256" sidecar, or nil.
	Checksum []byte
}

// Discover lists the plugin binaries in dir: executables named
// dflash-backend-NAME or dflash-policy-NAME. Directories, non-executables and
// other names are skipped. A sidecar NAME.sha256 (hex digest, optionally
// followed by the file name, as sha256sum writes it) pins the binary's hash.
func Discover(dir string) ([]File, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("plugin directory %s: %w", dir, unwrapPathErr(err))
	}
	var files []File
	var errs *multierror.Error
	for _, e := range entries {
		kind, name, ok := classify(e.Name())
		if !ok || e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		info, err := os.Stat(path)
		if err != nil {
			errs = multierror.Append(errs, fmt.Errorf("plugin %s: %w", path, unwrapPathErr(err)))
			continue
		}
		if !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
			continue
		}
		f := File{Kind: kind, Name: name, Path: path}
		sum, err := readChecksum(path + ".sha256")
		if err != nil {
			errs = multierror.Append(errs, err)
			continue
		}
		f.Checksum = sum
		files = append(files, f)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files, errs.ErrorOrNil()
}

func classify(base string) (Kind, string, bool) {
	if strings.HasSuffix(base, ".sha256") {
		return "", "", false
	}
	for _, k := range []struct {
		kind   Kind
		prefix string
	}{{KindBackend, transport.BackendPrefix}, {KindPolicy, transport.PolicyPrefix}} {
		if name, ok := strings.CutPrefix(base, k.prefix); ok && name != "" {
			return k.kind, name, true
		}
	}
	return "", "", false
}

func readChecksum(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("plugin checksum %s: %w", path, unwrapPathErr(err))
	}
	fields := bytes.Fields(b)
	if len(fields) == 0 {
		return nil, fmt.Errorf("plugin checksum %s: empty file", path)
	}
	sum, err := hex.DecodeString(string(fields[0]))
	if err != nil || len(sum) != 32 {
		return nil, fmt.Errorf("plugin checksum %s: want a hex sha256 digest", path)
	}
	return sum, nil
}

// unwrapPathErr drops the *fs.PathError path so messages name the file once.
func unwrapPathErr(err error) error {
	var pe *fs.PathError
	if errorsAs(err, &pe) {
		return pe.Err
	}
	return err
}

package server

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-multierror"

	"github.com/dflash/dflash_server/core/launch"
	"github.com/dflash/dflash_server/core/pluginhost"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/transport"
)

// catalog implements launch.Catalog over the plugin directory. It starts
// each backend binary once, asks its Info, and stops it again; the result is
// cached for the rest of the launch.
type catalog struct {
	dir    string
	logger hclog.Logger

	once     sync.Once
	files    []pluginhost.File
	backends []backendEntry
	err      error
}

type backendEntry struct {
	file pluginhost.File
	info sdk.BackendInfo
}

var _ launch.Catalog = (*catalog)(nil)

func newCatalog(dir string, logger hclog.Logger) *catalog {
	return &catalog{dir: dir, logger: logger}
}

func (c *catalog) load() {
	c.once.Do(func() {
		files, err := pluginhost.Discover(c.dir)
		if err != nil {
			c.err = err
			return
		}
		c.files = files
		var errs *multierror.Error
		for _, f := range files {
			if f.Kind != pluginhost.KindBackend {
				continue
			}
			info, err := probeBackend(f, c.logger)
			if err != nil {
				// Reported here too: the error itself only surfaces when no
				// other plugin serves the architecture asked for.
				reason := err.Error()
				var le *pluginhost.LaunchError
				if errors.As(err, &le) {
					reason = le.Reason
				}
				c.logger.Warn("skipped plugin", "file", f.Path, "reason", reason)
				errs = multierror.Append(errs, err)
				continue
			}
			c.backends = append(c.backends, backendEntry{file: f, info: info})
		}
		c.err = flatten(errs.ErrorOrNil())
	})
}

func probeBackend(f pluginhost.File, logger hclog.Logger) (sdk.BackendInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := pluginhost.LaunchBackend(ctx, f, pluginhost.Options{Logger: logger})
	if err != nil {
		return sdk.BackendInfo{}, err
	}
	defer b.Kill()
	return b.Info(ctx)
}

// DetectArch reads general.architecture from the file's header.
func (c *catalog) DetectArch(path string) (string, error) {
	return gguf.ReadArch(path)
}

// Backend finds the backend serving arch.
func (c *catalog) Backend(arch string) (string, []sdk.OptionSpec, error) {
	c.load()
	for _, b := range c.backends {
		for _, a := range b.info.Architectures {
			if a == arch {
				return b.info.Name, b.info.Options, nil
			}
		}
	}
	if c.err != nil {
		return "", nil, fmt.Errorf("no backend plugin serves architecture %q (%v)", arch, c.err)
	}
	var served []string
	for _, b := range c.backends {
		served = append(served, b.info.Name+": "+strings.Join(b.info.Architectures, ","))
	}
	if len(served) == 0 {
		return "", nil, fmt.Errorf("no backend plugin serves architecture %q: no dflash-backend-* plugins in %s", arch, c.dir)
	}
	return "", nil, fmt.Errorf("no backend plugin in %s serves architecture %q (found %s)", c.dir, arch, strings.Join(served, "; "))
}

// Backends lists the discovered backends for --help.
func (c *catalog) Backends() []launch.BackendHelp {
	c.load()
	var out []launch.BackendHelp
	for _, b := range c.backends {
		out = append(out, launch.BackendHelp{Name: b.info.Name, Architectures: b.info.Architectures, Options: b.info.Options})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// file returns the plugin binary of a kind and name.
func (c *catalog) file(kind pluginhost.Kind, name string) (pluginhost.File, error) {
	c.load()
	for _, f := range c.files {
		if f.Kind == kind && f.Name == name {
			return f, nil
		}
	}
	if c.err != nil {
		return pluginhost.File{}, c.err
	}
	prefix := transport.BackendPrefix
	if kind == pluginhost.KindPolicy {
		prefix = transport.PolicyPrefix
	}
	return pluginhost.File{}, fmt.Errorf("plugin %s%s not found in %s", prefix, name, c.dir)
}

// flatten turns a multierror into one line.
func flatten(err error) error {
	if err == nil {
		return nil
	}
	if me, ok := err.(*multierror.Error); ok {
		var parts []string
		for _, e := range me.Errors {
			parts = append(parts, e.Error())
		}
		return fmt.Errorf("%s", strings.Join(parts, "; "))
	}
	return err
}

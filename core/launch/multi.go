package launch

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/go-multierror"
)

// selectPrimary picks the primary block and the load set.
func (p *parser) selectPrimary(cfg *Config, primaryGPU string, given bool) error {
	cfg.Primary = 0
	if given {
		dev, ok := normalizeDevice(primaryGPU)
		if !ok {
			return usagef("--load-balancing-primary-gpu must be BACKEND:GPU such as cuda:0, hip:1 or cpu:0 but got %q", primaryGPU)
		}
		var matches []int
		for i, b := range cfg.Blocks {
			if b.Device == dev {
				matches = append(matches, i)
			}
		}
		switch len(matches) {
		case 1:
			cfg.Primary = matches[0]
		case 0:
			return usagef("--load-balancing-primary-gpu %s matches no model block; the blocks' --target-device values are %s",
				dev, describeDevices(cfg.Blocks, nil))
		default:
			return usagef("--load-balancing-primary-gpu %s matches several model blocks (%s); give the primary a device of its own",
				dev, describeDevices(cfg.Blocks, matches))
		}
	}
	cfg.PrimaryDevice = cfg.Blocks[cfg.Primary].Device
	cfg.Load = []int{cfg.Primary}
	if cfg.LoadBalancing || cfg.Policy == PolicyByName {
		for i := range cfg.Blocks {
			if i != cfg.Primary {
				cfg.Load = append(cfg.Load, i)
			}
		}
	}
	return nil
}

// describeDevices lists "cpu:0 (--model #1)" for the given block indices
// (all when idx is nil).
func describeDevices(blocks []Block, idx []int) string {
	if idx == nil {
		for i := range blocks {
			idx = append(idx, i)
		}
	}
	parts := make([]string, len(idx))
	for j, i := range idx {
		parts[j] = fmt.Sprintf("%s (--model #%d)", blocks[i].Device, blocks[i].Index)
	}
	return strings.Join(parts, ", ")
}

// checkMulti applies the rules of a launch that loads several models:
// names non-empty, not "auto" and unique, and no plugin option that sets a
// shared-process policy. Every problem is reported, on one line.
func (p *parser) checkMulti(cfg *Config) error {
	if len(cfg.Load) < 2 {
		return nil
	}
	why := "--load-balancing"
	if !cfg.LoadBalancing {
		why = "--routing-policy by-name"
	}
	merr := &multierror.Error{ErrorFormat: joinOneLine}
	firstUse := map[string]int{}
	for _, i := range sortedCopy(cfg.Load) {
		b := &cfg.Blocks[i]
		berr := func(format string, args ...any) {
			merr = multierror.Append(merr, &UsageError{Block: b.Index, Path: b.Path, Msg: fmt.Sprintf(format, args...)})
		}
		switch {
		case strings.EqualFold(b.Name, "auto"):
			berr("model name %q is reserved for clients that let the server choose; set --model-name", b.Name)
		case firstUse[b.Name] != 0:
			other := cfg.Blocks[firstUse[b.Name]-1]
			berr("model name %q is already used by --model #%d (%s); names must be unique with %s, set --model-name",
				b.Name, other.Index, other.Path, why)
		default:
			firstUse[b.Name] = i + 1
		}
		names := make([]string, 0, len(b.Options))
		for name := range b.Options {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			spec, ok := findSpec(p.specs[b.Index], name)
			if !ok || !spec.SharedProcessPolicy || sameValue(spec, b.Options[name], spec.Default) {
				continue
			}
			berr("--%s=%s sets a shared-process policy, which is refused when several models load (%s)", name, b.Options[name], why)
		}
	}
	if merr.Len() == 1 {
		return merr.Errors[0]
	}
	if err := merr.ErrorOrNil(); err != nil {
		return &UsageError{Msg: err.Error(), err: err}
	}
	return nil
}

func sortedCopy(xs []int) []int {
	out := append([]int(nil), xs...)
	sort.Ints(out)
	return out
}

func joinOneLine(errs []error) string {
	parts := make([]string, len(errs))
	for i, e := range errs {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

package launch

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/dflash/dflash_server/sdk"
)

// detectArch reads the block's model architecture into rb.arch.
func (p *parser) detectArch(rb *rawBlock) error {
	arch, err := p.cat.DetectArch(rb.path)
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "failed to detect architecture from ") {
			msg = fmt.Sprintf("failed to detect architecture from %s: %s", rb.path, msg)
		}
		return &UsageError{Block: rb.index, Path: rb.path, Msg: msg, err: err}
	}
	rb.arch = arch
	return nil
}

// parseBlock detects the block's architecture and backend, partitions its
// tokens into core, listener (first block only) and plugin options, and
// checks each. It returns the first block's listener tokens for the
// global grammar.
func (p *parser) parseBlock(rb *rawBlock) (*Block, []string, error) {
	arch := rb.arch
	backend, specs, err := p.cat.Backend(arch)
	if err != nil {
		return nil, nil, &UsageError{Block: rb.index, Path: rb.path, Msg: err.Error(), err: err}
	}
	p.specs[rb.index] = specs
	byName := make(map[string]*flagDef, len(specs))
	for i := range specs {
		s := &specs[i]
		byName[s.Name] = &flagDef{name: s.Name, scope: scopePlugin, isBool: s.Kind == sdk.OptionBool, spec: s}
	}
	lookup := func(name string) *flagDef {
		if d := p.core[name]; d != nil {
			return d
		}
		return byName[name]
	}

	b := &Block{Index: rb.index, Path: rb.path, Arch: arch, Backend: backend, Args: redact(rb.args)}
	var coreToks, listenerToks []string
	for i := 0; i < len(rb.opts); {
		tok := rb.opts[i]
		if tok == "--" {
			return nil, nil, p.blockErr(rb, `"--" is not supported`)
		}
		if !isFlag(tok) {
			return nil, nil, p.blockErr(rb, "unexpected argument %s", tok)
		}
		occ, next := readFlag(rb.opts, i, lookup)
		i = next
		if occ.def == nil {
			if owners := p.owners(occ.name, backend); len(owners) > 0 {
				return nil, nil, p.blockErr(rb, "%s is not an option of backend %s (architecture %s); backend %s declares it",
					occ.display, backend, arch, strings.Join(owners, ", "))
			}
			return nil, nil, p.blockErr(rb, "%s", p.unknown(occ, specs))
		}
		switch occ.def.scope {
		case scopeRemoved:
			return nil, nil, p.blockErr(rb, "%s", removedMsg(occ))
		case scopeGlobal:
			return nil, nil, p.blockErr(rb, "%s is a global option; put it before the first --model", occ.display)
		case scopeListener:
			if rb.index != 1 {
				return nil, nil, p.blockErr(rb, "%s is a listener option; put it before the first --model or in the first model block", occ.display)
			}
		}
		if occ.missing {
			return nil, nil, p.blockErr(rb, "%s: missing value", occ.display)
		}
		switch occ.def.scope {
		case scopeListener:
			listenerToks = append(listenerToks, kongToken(occ))
		case scopeBlock:
			coreToks = append(coreToks, kongToken(occ))
		case scopePlugin:
			v, err := checkOption(occ)
			if err != nil {
				return nil, nil, p.blockErr(rb, "%s", err)
			}
			if b.Options == nil {
				b.Options = map[string]string{}
			}
			b.Options[occ.name] = v
		}
	}

	var f blockFlags
	if err := parseKong(&f, coreToks); err != nil {
		return nil, nil, p.blockErr(rb, "%s", err)
	}
	if err := p.applyBlock(b, f); err != nil {
		return nil, nil, p.blockErr(rb, "%s", err)
	}
	return b, listenerToks, nil
}

// redact hides API keys from a block's recorded tokens.
func redact(args []string) []string {
	out := append([]string(nil), args...)
	for i, a := range out {
		switch {
		case a == "--api-key" && i+1 < len(out):
			out[i+1] = "REDACTED"
		case strings.HasPrefix(a, "--api-key="):
			out[i] = "--api-key=REDACTED"
		}
	}
	return out
}

var devicePattern = regexp.MustCompile(`^(cpu|cuda|hip)(?::([0-9]+))?$`)

// normalizeDevice accepts cpu:N, cuda:N, hip:N and a bare kind meaning :0.
func normalizeDevice(s string) (string, bool) {
	m := devicePattern.FindStringSubmatch(s)
	if m == nil {
		return "", false
	}
	n := m[2]
	if n == "" {
		n = "0"
	}
	i, err := strconv.Atoi(n)
	if err != nil {
		return "", false
	}
	return fmt.Sprintf("%s:%d", m[1], i), true
}

// defaultName is the file's base name without .gguf.
func defaultName(path string) string {
	base := filepath.Base(path)
	if ext := filepath.Ext(base); strings.EqualFold(ext, ".gguf") {
		base = strings.TrimSuffix(base, ext)
	}
	return base
}

func (p *parser) applyBlock(b *Block, f blockFlags) error {
	b.Name = defaultName(b.Path)
	if f.ModelName != nil {
		if strings.TrimSpace(*f.ModelName) == "" {
			return fmt.Errorf("--model-name must not be empty")
		}
		b.Name = *f.ModelName
	}
	dev, ok := normalizeDevice(f.TargetDevice)
	if !ok {
		return fmt.Errorf("--target-device must be cpu:N, cuda:N or hip:N but got %q", f.TargetDevice)
	}
	b.Device = dev
	for _, v := range []struct {
		name string
		n    int
		dst  *int
	}{
		{"max-ctx", f.MaxCtx, &b.MaxCtx},
		{"max-concurrency", f.MaxConcurrency, &b.MaxConcurrency},
		{"kv-pool-tokens", f.KVPoolTokens, &b.KVPoolTokens},
		{"default-max-tokens", f.DefaultMaxTokens, &b.DefaultMaxTokens},
		{"max-tokens", f.MaxTokens, &b.MaxTokens},
		{"hard-limit-reply-budget", f.HardLimitReplyBudget, &b.HardLimitReplyBudget},
		{"think-max-tokens", f.ThinkMaxTokens, &b.ThinkMaxTokens},
	} {
		if v.n < 0 {
			return fmt.Errorf("--%s must not be negative (got %d)", v.name, v.n)
		}
		*v.dst = v.n
	}
	if b.MaxTokens > 0 && b.DefaultMaxTokens > b.MaxTokens {
		return fmt.Errorf("--default-max-tokens %d exceeds --max-tokens %d", b.DefaultMaxTokens, b.MaxTokens)
	}
	for _, e := range []struct {
		level string
		n     *int
	}{{"low", f.ReasoningBudgetLow}, {"medium", f.ReasoningBudgetMed}, {"high", f.ReasoningBudgetHigh}} {
		if e.n == nil {
			continue
		}
		if *e.n < 0 {
			return fmt.Errorf("--reasoning-budget-%s must not be negative (got %d)", e.level, *e.n)
		}
		if b.EffortBudgets == nil {
			b.EffortBudgets = map[string]int{}
		}
		b.EffortBudgets[e.level] = *e.n
	}
	return nil
}

package launch

import (
	"errors"
	"fmt"

	"github.com/dflash/dflash_server/sdk"
)

// Parse turns args (without the program name) into a Config, asking cat
// for each block's architecture and backend options. It returns ErrHelp
// for -h/--help, a *UsageError for any mistake on the command line, and
// other errors only for bugs. It neither prints nor exits.
func Parse(args []string, cat Catalog) (*Config, error) {
	for _, a := range args {
		if a == "-h" || a == "--help" {
			return nil, ErrHelp
		}
	}
	if cat == nil {
		return nil, errors.New("launch: Parse needs a Catalog")
	}
	core, err := loadCoreFlags()
	if err != nil {
		return nil, err
	}
	p := &parser{cat: cat, core: core, specs: map[int][]sdk.OptionSpec{}}
	return p.parse(args)
}

type parser struct {
	cat  Catalog
	core coreFlags
	// backends caches cat.Backends() for hints and suggestions; see
	// backendList.
	backends []BackendHelp
	listed   bool
	// specs are the options each block's backend declared, by block index.
	specs map[int][]sdk.OptionSpec
}

func (p *parser) blockErr(rb *rawBlock, format string, args ...any) *UsageError {
	return &UsageError{Block: rb.index, Path: rb.path, Msg: fmt.Sprintf(format, args...)}
}

// backendList is cat.Backends(), asked only when a hint needs it: the real
// catalog starts every backend binary to answer.
func (p *parser) backendList() []BackendHelp {
	if !p.listed {
		p.backends, p.listed = p.cat.Backends(), true
	}
	return p.backends
}

func (p *parser) parse(args []string) (*Config, error) {
	headArgs, blocks, err := splitBlocks(args)
	if err != nil {
		return nil, err
	}
	headToks, given, positional, err := p.walkHead(headArgs)
	if err != nil {
		return nil, err
	}
	if positional != nil {
		blocks = append([]*rawBlock{positional}, blocks...)
	}
	for i, rb := range blocks {
		rb.index = i + 1
	}
	var head headFlags
	if err := parseKong(&head, headToks); err != nil {
		return nil, usagef("%s", err)
	}
	if len(blocks) == 0 {
		return nil, usagef("no model given: dflash_server [options] MODEL.gguf [model options], or --model <path> [model options] for each model")
	}

	// Model files are read before any backend is asked for its options:
	// the real catalog starts each plugin binary to ask, which a command
	// line naming a missing first model should not cost. Blocks before an
	// unreadable one are still parsed first, so the first mistake on the
	// command line is the one reported.
	parsed, detectErr := len(blocks), error(nil)
	for i, rb := range blocks {
		if err := p.detectArch(rb); err != nil {
			parsed, detectErr = i, err
			break
		}
	}

	cfg := &Config{}
	var listenerToks []string
	for _, rb := range blocks[:parsed] {
		b, lt, err := p.parseBlock(rb)
		if err != nil {
			return nil, err
		}
		if len(lt) > 0 {
			// The first block's listener options: checked alone so that
			// errors name the block, then merged after the head's (last
			// wins).
			if err := parseKong(&listenerFlags{}, lt); err != nil {
				return nil, p.blockErr(rb, "%s", err)
			}
			listenerToks = lt
		}
		cfg.Blocks = append(cfg.Blocks, *b)
	}
	if detectErr != nil {
		return nil, detectErr
	}
	if len(listenerToks) > 0 {
		for _, t := range listenerToks {
			given[flagName(t)] = true
		}
		head = headFlags{}
		if err := parseKong(&head, append(headToks, listenerToks...)); err != nil {
			return nil, usagef("%s", err)
		}
	}
	if err := p.applyGlobals(cfg, head, given); err != nil {
		return nil, err
	}
	if err := p.selectPrimary(cfg, head.PrimaryGPU, given["load-balancing-primary-gpu"]); err != nil {
		return nil, err
	}
	if err := p.checkMulti(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

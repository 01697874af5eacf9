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
	// backends caches cat.Backends() for hints and suggestions.
	backends []BackendHelp
	// specs are the options each block's backend declared, by block index.
	specs map[int][]sdk.OptionSpec
}

func (p *parser) blockErr(rb *rawBlock, format string, args ...any) *UsageError {
	return &UsageError{Block: rb.index, Path: rb.path, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) parse(args []string) (*Config, error) {
	p.backends = p.cat.Backends()

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

	cfg := &Config{}
	var listenerToks []string
	for _, rb := range blocks {
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

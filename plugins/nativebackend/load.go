package nativebackend

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/hashicorp/go-multierror"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/statecache"
	"github.com/dflash/dflash_server/sdk/tokenizer"
)

// LibDir finds the engine libraries: the block's LibDir, $DFLASH_LIB_DIR,
// else ../lib next to this binary (bin/plugins → bin/lib).
func LibDir(cfg sdk.ModelConfig) string {
	if cfg.LibDir != "" {
		return cfg.LibDir
	}
	if d := os.Getenv("DFLASH_LIB_DIR"); d != "" {
		return d
	}
	exe, err := os.Executable()
	if err != nil {
		return "lib"
	}
	return filepath.Join(filepath.Dir(exe), "..", "lib")
}

// Spec says what a backend serves, for Load.
type Spec struct {
	// Name is the backend's name, for messages.
	Name string
	// Architectures are the GGUF general.architecture values it serves.
	Architectures []string
	// Features go into the model description.
	Features sdk.Features
	// Configure, when set, edits the native model spec before the weights
	// load: how a backend passes its own options to the engine (metadata
	// overrides of the architecture's keys). An error fails the load.
	Configure func(ms *native.ModelSpec) error
}

// Loaded is one model block loaded on the native engine and running in
// sdk/engine's loop.
type Loaded struct {
	Cfg    sdk.ModelConfig
	File   *gguf.File
	Native *native.Model
	Engine *engine.Engine
	Tok    *tokenizer.Tokenizer
	Tmpl   *chat.Template
	// TemplateSource is the GGUF's chat template text.
	TemplateSource string
	Desc           sdk.ModelDescription
	// WeightFileBytes is the size of every tensor in the file (progress).
	WeightFileBytes int64
	// draft is the speculative-decoding draft, nil without one.
	draft *draft
	// store is the disk prefix cache, nil when off.
	store *statecache.Cache
}

// Load loads cfg's model for spec: engine library for the device, the
// mapped GGUF, tokenizer and chat template, capacity defaults, weights and
// the engine. report receives progress (mapping, uploading); the caller
// reports ready once it has kept the model.
func Load(cfg sdk.ModelConfig, spec Spec, opts EngineOptions, report func(sdk.LoadProgress)) (l *Loaded, err error) {
	device := cfg.Device
	if device == "" {
		device = "cpu"
	}
	lib, err := native.Open(LibDir(cfg), device)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", cfg.Path, err)
	}
	report(sdk.LoadProgress{Stage: "mapping"})
	f, err := gguf.Open(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", cfg.Path, err)
	}
	defer func() {
		if err == nil {
			return
		}
		if cerr := f.Close(); cerr != nil {
			err = multierror.Append(err, cerr)
		}
	}()
	arch := f.Arch()
	if !slices.Contains(spec.Architectures, arch) {
		return nil, fmt.Errorf("load %s: architecture %q is not served by %s (serves %v)", cfg.Path, arch, spec.Name, spec.Architectures)
	}
	tok, err := tokenizer.FromMetadata(f.Meta)
	if err != nil {
		return nil, fmt.Errorf("load %s: tokenizer: %w", cfg.Path, err)
	}
	src, err := f.String("tokenizer.chat_template")
	if err != nil {
		return nil, fmt.Errorf("load %s: chat template: %w", cfg.Path, err)
	}
	tmpl, err := chat.NewTemplate(src)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", cfg.Path, err)
	}

	maxCtx := cfg.MaxCtx
	if maxCtx <= 0 {
		maxCtx = DefaultMaxCtx
		if n, err := f.Uint32(arch + ".context_length"); err == nil && n > 0 {
			maxCtx = min(maxCtx, int(n))
		}
	}
	slots := OrDefault(cfg.MaxConcurrency, DefaultMaxConcurrency)
	pool := OrDefault(cfg.KVPoolTokens, slots*maxCtx)
	ms, err := native.SpecFromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", cfg.Path, err)
	}
	var overrides map[string]any
	if spec.Configure != nil {
		before := maps.Clone(ms.Meta)
		if err := spec.Configure(&ms); err != nil {
			return nil, fmt.Errorf("load %s: %w", cfg.Path, err)
		}
		overrides = changedMeta(before, ms.Meta)
	}
	var total, params int64
	for _, t := range f.Tensors() {
		total += int64(t.Size)
		params += int64(t.Elements())
	}
	var d *draft
	if opts.Draft.Path != "" {
		if cfg.MultiModel && opts.Draft.Device != "" && opts.Draft.Device != device {
			return nil, fmt.Errorf("load %s: --draft-device %s: a draft on another device than the target's (%s) is not offered when several models share the server", cfg.Path, opts.Draft.Device, device)
		}
		report(sdk.LoadProgress{Stage: "uploading draft"})
		// The draft loads first so that a GPU target sizes its KV pool from what the draft leaves free.
		if d, err = loadDraft(opts.Draft, f, LibDir(cfg), device, slots+opts.PrefixSlots, maxCtx, opts); err != nil {
			return nil, fmt.Errorf("load %s: %w", cfg.Path, err)
		}
		defer func() {
			if err != nil {
				if cerr := d.close(); cerr != nil {
					err = multierror.Append(err, cerr)
				}
			}
		}()
	}
	ms.Options = native.Options{
		KVPoolTokens: pool, BlockSize: opts.KVBlockSize, MaxSeqs: slots + opts.PrefixSlots,
		CacheK: opts.CacheK, CacheV: opts.CacheV, Threads: opts.Threads,
	}
	if cfg.KVPoolTokens <= 0 && lib.Kind() != "cpu" {
		// On a GPU the pool is what the device's free memory holds next to the weights, up to every slot's context.
		// A draft's verify steps keep records of the rows they verify for rollback (allocated at the first one)
		if ms.Options.KVPoolTokens, err = devicePool(lib, ms, slots+opts.PrefixSlots, slots, d.verifyRows(opts.Draft),
			opts.Draft.TreeBudget > 0, pool, maxCtx); err != nil {
			return nil, fmt.Errorf("load %s: %w", cfg.Path, err)
		}
	}
	report(sdk.LoadProgress{Stage: "uploading", BytesTotal: total})
	nm, err := lib.LoadModel(ms)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", cfg.Path, err)
	}
	info := nm.Info()
	if info.AttnLayers == 0 {
		// The engine's admission counts KV blocks; a model without any
		// full-attention layer has none to count.
		_ = nm.Close()
		return nil, fmt.Errorf("load %s: the model has no full-attention layer (%d layers, all recurrent); this backend needs at least one (for qwen35 see %s.full_attention_interval)", cfg.Path, info.Layers, arch)
	}
	if tok.VocabSize() > info.Vocab {
		_ = nm.Close()
		return nil, fmt.Errorf("load %s: tokenizer has %d tokens, the model's output only %d", cfg.Path, tok.VocabSize(), info.Vocab)
	}
	var store *statecache.Cache
	if opts.Disk.On {
		if store, err = openDiskCache(opts.Disk, cfg.Path, opts, overrides); err != nil {
			_ = nm.Close()
			return nil, fmt.Errorf("load %s: %w", cfg.Path, err)
		}
	}
	ecfg := engine.Config{
		Model: NewModel(nm), Vocab: tok, MaxConcurrency: slots, MaxCtx: maxCtx,
		StepTokens: opts.StepTokens, DecodeHeadroom: opts.DecodeHeadroom, PrefixCacheSlots: opts.PrefixSlots,
		// DFLASH_WHOLE_ROW_DRAWS=1: sampled requests without top-k read whole rows, as before candidate draws (the
		// same tokens; for comparisons in one run, scripts/gpu/run.sh demo)
		WholeRowDraws: os.Getenv("DFLASH_WHOLE_ROW_DRAWS") == "1",
		Special: func(id int32) bool {
			switch tok.TokenType(id) {
			case tokenizer.TypeNormal, tokenizer.TypeUndefined, tokenizer.TypeByte:
				return false
			}
			return true
		},
	}
	if store != nil {
		ecfg.Store = store
	}
	features := spec.Features
	draftDevice := ""
	if d != nil {
		ecfg.Drafter, ecfg.DraftBlock, ecfg.DraftAlways = &drafter{d: d}, opts.Draft.Block, opts.Draft.Always
		ecfg.SampledDrafts = opts.Draft.SampledDrafts
		ecfg.TreeBudget = opts.Draft.TreeBudget
		features.Speculative, draftDevice = true, d.device
	}
	if warmupOn(opts.Warmup, lib.Kind()) {
		report(sdk.LoadProgress{Stage: "warming"})
		if err = warmUp(ecfg, tok, lib.Kind() != "cpu"); err != nil {
			err = fmt.Errorf("warm-up: %w", err)
		}
	}
	var eng *engine.Engine
	if err == nil {
		eng, err = engine.New(ecfg)
	}
	if err != nil {
		if store != nil {
			store.Close()
		}
		_ = nm.Close()
		return nil, fmt.Errorf("load %s: %w", cfg.Path, err)
	}
	lim := eng.Limits()
	return &Loaded{
		Cfg: cfg, File: f, Native: nm, Engine: eng, Tok: tok, Tmpl: tmpl, TemplateSource: src, WeightFileBytes: total,
		draft: d, store: store,
		Desc: sdk.ModelDescription{
			Name: cfg.Name, Architecture: arch, Device: device, DraftDevice: draftDevice,
			MaxConcurrency: lim.MaxConcurrency, KVPoolTokens: lim.KVPoolTokens, MaxCtx: lim.MaxCtx,
			DefaultMaxTokens: OrDefault(cfg.DefaultMaxTokens, min(DefaultMaxTokens, maxCtx/2)),
			MaxTokens:        OrDefault(cfg.MaxTokens, maxCtx),
			Features:         features,
			ParameterCount:   params, WeightBytes: int64(info.WeightBytes),
		},
	}, nil
}

// Close stops the engine (within ctx) and frees the weights and the
// mapping, reporting every failure.
func (l *Loaded) Close(ctx context.Context) error {
	var errs *multierror.Error
	errs = multierror.Append(errs, l.Engine.Close(ctx))
	if l.store != nil {
		l.store.Close() // the queued writes finish
	}
	errs = multierror.Append(errs, l.Native.Close())
	if l.draft != nil {
		errs = multierror.Append(errs, l.draft.close())
	}
	errs = multierror.Append(errs, l.File.Close())
	return errs.ErrorOrNil()
}

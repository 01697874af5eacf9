package launch

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/go-multierror"

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

// rawBlock is a block's tokens as split from argv.
type rawBlock struct {
	index int
	path  string
	args  []string // from --model (or the positional path) on
	opts  []string // after the path
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

// splitBlocks cuts argv at every --model <path> / --model=<path>. A literal
// --model is always a boundary, even where a flag value was expected.
func splitBlocks(args []string) (head []string, blocks []*rawBlock, err error) {
	var cur *rawBlock
	for i := 0; i < len(args); i++ {
		tok := args[i]
		var path string
		var start []string
		switch {
		case tok == "--model":
			if i+1 >= len(args) || strings.HasPrefix(args[i+1], "-") {
				return nil, nil, usagef("--model needs a path: --model <path> [model options]")
			}
			path, start = args[i+1], args[i:i+2]
			i++
		case strings.HasPrefix(tok, "--model="):
			path, start = strings.TrimPrefix(tok, "--model="), args[i:i+1]
			if path == "" {
				return nil, nil, usagef("--model needs a path: --model <path> [model options]")
			}
		default:
			if cur == nil {
				head = append(head, tok)
			} else {
				cur.args = append(cur.args, tok)
				cur.opts = append(cur.opts, tok)
			}
			continue
		}
		cur = &rawBlock{path: path, args: append([]string(nil), start...)}
		blocks = append(blocks, cur)
	}
	return head, blocks, nil
}

// occurrence is one flag as written.
type occurrence struct {
	def     *flagDef // nil when unknown
	display string   // the flag as written, without any =value: "--max-ctx", "-x"
	name    string   // without dashes
	value   string
	inline  bool // the value came with =
	missing bool // a value was needed and none followed
}

// isFlag says whether tok is written as a flag rather than a value.
func isFlag(tok string) bool { return len(tok) > 1 && tok[0] == '-' }

// readFlag reads the flag at toks[i] and, when it takes one, its value;
// it returns the index of the next unread token.
func readFlag(toks []string, i int, lookup func(string) *flagDef) (occurrence, int) {
	tok := toks[i]
	var occ occurrence
	body := strings.TrimPrefix(tok, "-")
	long := strings.HasPrefix(body, "-")
	body = strings.TrimPrefix(body, "-")
	occ.name, occ.value, occ.inline = strings.Cut(body, "=")
	occ.display, _, _ = strings.Cut(tok, "=")
	if long {
		occ.def = lookup(occ.name)
	}
	next := i + 1
	if occ.def == nil || occ.def.isBool || occ.inline {
		return occ, next
	}
	if next < len(toks) && !strings.HasPrefix(toks[next], "--") {
		occ.value = toks[next]
		return occ, next + 1
	}
	occ.missing = true
	return occ, next
}

// kongToken writes occ for a kong grammar, always as one token so that
// values starting with "-" are never taken for flags.
func kongToken(occ occurrence) string {
	if occ.def.isBool && !occ.inline {
		return "--" + occ.name
	}
	return "--" + occ.name + "=" + occ.value
}

func flagName(kongTok string) string {
	name, _, _ := strings.Cut(strings.TrimPrefix(kongTok, "--"), "=")
	return name
}

func (p *parser) lookupCore(name string) *flagDef { return p.core[name] }

// walkHead checks what precedes the first block: global and listener
// options, and possibly the first model path written without --model.
func (p *parser) walkHead(head []string) (toks []string, given map[string]bool, positional *rawBlock, err error) {
	given = map[string]bool{}
	for i := 0; i < len(head); {
		tok := head[i]
		if tok == "--" {
			return nil, nil, nil, usagef(`"--" is not supported`)
		}
		if !isFlag(tok) {
			positional = &rawBlock{path: tok, args: append([]string(nil), head[i:]...), opts: head[i+1:]}
			return toks, given, positional, nil
		}
		occ, next := readFlag(head, i, p.lookupCore)
		if msg := p.misplacedInHead(occ); msg != "" {
			return nil, nil, nil, usagef("%s", msg)
		}
		if occ.missing {
			return nil, nil, nil, usagef("%s: missing value", occ.display)
		}
		toks = append(toks, kongToken(occ))
		given[occ.name] = true
		i = next
	}
	return toks, given, nil, nil
}

func (p *parser) misplacedInHead(occ occurrence) string {
	if occ.def == nil {
		if len(p.owners(occ.name, "")) > 0 {
			return fmt.Sprintf("%s is a model option; put it after --model <path>", occ.display)
		}
		return p.unknown(occ, nil)
	}
	switch occ.def.scope {
	case scopeRemoved:
		return removedMsg(occ)
	case scopeBlock:
		return fmt.Sprintf("%s is a model option; put it after --model <path>", occ.display)
	}
	return ""
}

func removedMsg(occ occurrence) string {
	return fmt.Sprintf("%s was removed; %s", occ.display, occ.def.removed)
}

// owners lists the backends (other than except) that declare option name.
func (p *parser) owners(name, except string) []string {
	var out []string
	for _, b := range p.backends {
		if b.Name == except {
			continue
		}
		for _, o := range b.Options {
			if o.Name == name {
				out = append(out, b.Name)
				break
			}
		}
	}
	return out
}

// unknown is kong's "unknown flag" message with suggestions from every
// flag the launch knows, removed ones included, so that a near miss of a
// flag from another place leads to the message about where it belongs.
func (p *parser) unknown(occ occurrence, extra []sdk.OptionSpec) string {
	msg := "unknown flag " + occ.display
	seen := map[string]bool{}
	type cand struct {
		name string
		dist int
	}
	var cands []cand
	add := func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		d := levenshtein(occ.name, name)
		if d <= 2 || (len(occ.name) >= 3 && strings.HasPrefix(name, occ.name)) {
			cands = append(cands, cand{name, d})
		}
	}
	for name := range p.core {
		add(name)
	}
	for _, b := range p.backends {
		for _, o := range b.Options {
			add(o.Name)
		}
	}
	for _, o := range extra {
		add(o.Name)
	}
	if len(cands) == 0 {
		return msg
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].dist != cands[j].dist {
			return cands[i].dist < cands[j].dist
		}
		return cands[i].name < cands[j].name
	})
	if len(cands) > 4 {
		cands = cands[:4]
	}
	if len(cands) == 1 {
		return fmt.Sprintf("%s, did you mean %q?", msg, "--"+cands[0].name)
	}
	quoted := make([]string, len(cands))
	for i, c := range cands {
		quoted[i] = strconv.Quote("--" + c.name)
	}
	return fmt.Sprintf("%s, did you mean one of %s?", msg, strings.Join(quoted, ", "))
}

// levenshtein is the edit distance between a and b, by runes.
func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// parseBlock detects the block's architecture and backend, partitions its
// tokens into core, listener (first block only) and plugin options, and
// checks each. It returns the first block's listener tokens for the
// global grammar.
func (p *parser) parseBlock(rb *rawBlock) (*Block, []string, error) {
	arch, err := p.cat.DetectArch(rb.path)
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "failed to detect architecture from ") {
			msg = fmt.Sprintf("failed to detect architecture from %s: %s", rb.path, msg)
		}
		return nil, nil, &UsageError{Block: rb.index, Path: rb.path, Msg: msg, err: err}
	}
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

// checkOption type-checks a plugin-owned option against its spec and
// returns the value to pass on ("true"/"false" for bools).
func checkOption(occ occurrence) (string, error) {
	s := occ.def.spec
	v := occ.value
	switch s.Kind {
	case sdk.OptionBool:
		if !occ.inline {
			return "true", nil
		}
		switch strings.ToLower(v) {
		case "true", "1", "yes":
			return "true", nil
		case "false", "0", "no":
			return "false", nil
		}
		return "", fmt.Errorf("%s: bool value must be true, 1, yes, false, 0 or no but got %q", occ.display, v)
	case sdk.OptionInt:
		if _, err := strconv.ParseInt(v, 10, 64); err != nil {
			return "", fmt.Errorf("%s: expected a valid 64 bit int but got %q", occ.display, v)
		}
	case sdk.OptionFloat:
		if _, err := strconv.ParseFloat(v, 64); err != nil {
			return "", fmt.Errorf("%s: expected a float but got %q", occ.display, v)
		}
	case sdk.OptionEnum:
		for _, e := range s.Enum {
			if v == e {
				return v, nil
			}
		}
		quoted := make([]string, len(s.Enum))
		for i, e := range s.Enum {
			quoted[i] = strconv.Quote(e)
		}
		return "", fmt.Errorf("%s must be one of %s but got %q", occ.display, strings.Join(quoted, ","), v)
	}
	return v, nil
}

// parseKong decodes already partitioned tokens into grammar with a fresh
// parser (no state leaks between blocks).
func parseKong(grammar any, toks []string) error {
	k, err := newKong(grammar)
	if err != nil {
		return fmt.Errorf("launch: grammar: %w", err)
	}
	_, err = k.Parse(toks)
	return err
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

var policyNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

func (p *parser) applyGlobals(cfg *Config, h headFlags, given map[string]bool) error {
	g, l := h.globalFlags, h.listenerFlags

	cfg.Host, cfg.Port, cfg.QueueLimit = l.Host, l.Port, l.QueueLimit
	if strings.TrimSpace(l.Host) == "" {
		return usagef("--host must not be empty")
	}
	if l.Port < 0 || l.Port > 65535 {
		return usagef("--port must be between 0 and 65535 (got %d)", l.Port)
	}
	if l.QueueLimit < 0 {
		return usagef("--routing-queue-limit must not be negative (got %d)", l.QueueLimit)
	}
	for _, o := range l.CORSOrigin {
		if !validOrigin(o) {
			return usagef("--cors-origin %q: expected * or scheme://host[:port]", o)
		}
	}
	if len(l.CORSOrigin) > 0 {
		cfg.CORSOrigins = l.CORSOrigin
	}
	for _, k := range l.APIKey {
		if strings.TrimSpace(k) == "" {
			return usagef("--api-key must not be empty")
		}
	}
	cfg.APIKeys = append(cfg.APIKeys, l.APIKey...)
	if given["api-key-file"] {
		keys, err := readKeyFile(l.APIKeyFile)
		if err != nil {
			return &UsageError{Msg: "--api-key-file: " + err.Error(), err: err}
		}
		cfg.APIKeys = append(cfg.APIKeys, keys...)
	}

	if g.QueueTimeout < 0 {
		return usagef("--routing-queue-timeout must not be negative (got %s)", g.QueueTimeout)
	}
	if g.DrainTimeout < 0 {
		return usagef("--drain-timeout must not be negative (got %s)", g.DrainTimeout)
	}
	cfg.QueueTimeout, cfg.DrainTimeout = g.QueueTimeout, g.DrainTimeout
	cfg.LogLevel, cfg.PluginDir, cfg.ContinueOnLoadFailure = g.LogLevel, g.PluginDir, g.ContinueOnLoadFailure
	cfg.LoadBalancing = g.LoadBalancing

	cfg.Policy = PolicyPrimaryFirst
	if given["routing-policy"] {
		if !policyNamePattern.MatchString(g.RoutingPolicy) {
			return usagef("--routing-policy: %q is not a policy name (lower-case letters, digits, '-', e.g. by-name)", g.RoutingPolicy)
		}
		cfg.Policy = g.RoutingPolicy
	}
	if given["model-routing"] {
		if g.ModelRouting != "name" {
			return usagef("--model-routing must be \"name\" but got %q; choose other policies with --routing-policy", g.ModelRouting)
		}
		if given["routing-policy"] && g.RoutingPolicy != PolicyByName {
			return usagef("--model-routing name means --routing-policy by-name and conflicts with --routing-policy %s", g.RoutingPolicy)
		}
		cfg.Policy = PolicyByName
	}
	cfg.UnknownModel = "reject"
	if given["unknown-model"] {
		if g.UnknownModel != "reject" && g.UnknownModel != "primary" {
			return usagef("--unknown-model must be one of \"reject\",\"primary\" but got %q", g.UnknownModel)
		}
		if cfg.Policy != PolicyByName {
			return usagef("--unknown-model applies only to by-name routing; add --routing-policy by-name (or --model-routing name)")
		}
		cfg.UnknownModel = g.UnknownModel
	}
	if cfg.LoadBalancing && len(cfg.Blocks) < 2 {
		return usagef("--load-balancing needs at least two model blocks (got %d); add another --model <path>", len(cfg.Blocks))
	}
	return nil
}

func validOrigin(o string) bool {
	if o == "*" {
		return true
	}
	u, err := url.Parse(o)
	if err != nil {
		return false
	}
	return (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.Path == "" &&
		u.RawQuery == "" && u.Fragment == "" && u.User == nil
}

// readKeyFile reads one key per line; blank lines and lines starting with
// # are skipped.
func readKeyFile(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var keys []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		keys = append(keys, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s holds no keys", path)
	}
	return keys, nil
}

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

func findSpec(specs []sdk.OptionSpec, name string) (sdk.OptionSpec, bool) {
	for _, s := range specs {
		if s.Name == name {
			return s, true
		}
	}
	return sdk.OptionSpec{}, false
}

// sameValue compares an option value with its default by kind.
func sameValue(s sdk.OptionSpec, v, def string) bool {
	switch s.Kind {
	case sdk.OptionBool:
		return (v == "true") == (strings.EqualFold(def, "true") || def == "1" || strings.EqualFold(def, "yes"))
	case sdk.OptionInt:
		a, err1 := strconv.ParseInt(v, 10, 64)
		b, err2 := strconv.ParseInt(def, 10, 64)
		return err1 == nil && err2 == nil && a == b
	case sdk.OptionFloat:
		a, err1 := strconv.ParseFloat(v, 64)
		b, err2 := strconv.ParseFloat(def, 64)
		return err1 == nil && err2 == nil && a == b
	}
	return v == def
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

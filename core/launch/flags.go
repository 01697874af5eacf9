package launch

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/alecthomas/kong"

	"github.com/dflash/dflash_server/sdk"
)

// globalFlags are whole-launch options: only before the first model.
type globalFlags struct {
	LoadBalancing         bool          `name:"load-balancing" help:"Load every model block and fall back from the primary to the others, in block order, when it is busy. Needs at least two blocks."`
	PrimaryGPU            string        `name:"load-balancing-primary-gpu" placeholder:"BACKEND:GPU" help:"Make the block whose --target-device is this device the primary (default: the first block). Changes neither placement nor balancing."`
	RoutingPolicy         string        `name:"routing-policy" placeholder:"NAME" help:"Routing policy plugin (default: primary-first; by-name routes by the request's model field)."`
	ModelRouting          string        `name:"model-routing" placeholder:"name" help:"Compatibility spelling: --model-routing name is --routing-policy by-name."`
	UnknownModel          string        `name:"unknown-model" placeholder:"reject|primary" help:"By-name routing: answer 404 for an unknown model name (reject, default) or send it to the primary."`
	PluginDir             string        `name:"plugin-dir" placeholder:"DIR" help:"Directory searched for dflash-backend-* and dflash-policy-* plugins (default: plugins/ next to dflash_server)."`
	QueueTimeout          time.Duration `name:"routing-queue-timeout" default:"0s" help:"Longest a request waits for a free model; 0 waits without deadline."`
	DrainTimeout          time.Duration `name:"drain-timeout" default:"30s" help:"On shutdown, how long running requests may finish before they are cancelled."`
	AdmissionTimeout      time.Duration `name:"admission-timeout" default:"60s" help:"How long a model's backend may take to admit or refuse a request before it counts as unavailable for that request (a hung plugin); 0 waits without deadline."`
	LogLevel              string        `name:"log-level" default:"info" enum:"trace,debug,info,warn,error" help:"Log level (trace, debug, info, warn, error)."`
	ContinueOnLoadFailure bool          `name:"continue-on-load-failure" help:"Start without the models that fail to load instead of exiting."`
}

// listenerFlags configure the one HTTP listener: before the first model or
// in the first block.
type listenerFlags struct {
	Host       string   `name:"host" default:"127.0.0.1" help:"Address to listen on."`
	Port       int      `name:"port" default:"8080" help:"Port to listen on."`
	QueueLimit int      `name:"routing-queue-limit" default:"32" help:"Most requests waiting for a busy model; 0 answers 503 at once."`
	CORSOrigin []string `name:"cors-origin" sep:"none" placeholder:"ORIGIN" help:"Allowed CORS origin, or * for any (repeatable)."`
	APIKey     []string `name:"api-key" sep:"none" placeholder:"KEY" help:"Accepted API key (repeatable); without keys the API is open."`
	APIKeyFile string   `name:"api-key-file" placeholder:"FILE" help:"File of accepted API keys, one per line (# starts a comment)."`
}

// headFlags is the grammar of everything that may precede the first model.
type headFlags struct {
	globalFlags
	listenerFlags
}

// blockFlags are the core-owned options of a model block.
type blockFlags struct {
	ModelName            *string `name:"model-name" placeholder:"NAME" help:"Model name served on the API (default: file name without .gguf)."`
	TargetDevice         string  `name:"target-device" default:"cpu:0" placeholder:"DEVICE" help:"Where the model runs: cpu:N, cuda:N or hip:N (cpu = cpu:0; default cpu:0)."`
	MaxCtx               int     `name:"max-ctx" placeholder:"N" help:"Context length per sequence (0 = backend default)."`
	MaxConcurrency       int     `name:"max-concurrency" placeholder:"N" help:"Sequences generating at once (0 = backend default)."`
	KVPoolTokens         int     `name:"kv-pool-tokens" placeholder:"N" help:"KV cache tokens shared by all sequences (0 = backend default)."`
	DefaultMaxTokens     int     `name:"default-max-tokens" placeholder:"N" help:"Completion length when a request sets none (0 = backend default)."`
	MaxTokens            int     `name:"max-tokens" placeholder:"N" help:"Largest completion a request may ask for (0 = backend default)."`
	HardLimitReplyBudget int     `name:"hard-limit-reply-budget" placeholder:"N" help:"Close reasoning when this many tokens of the completion cap remain (0 disables)."`
	ThinkMaxTokens       int     `name:"think-max-tokens" placeholder:"N" help:"Cap on reasoning tokens (0 = no cap)."`
	ReasoningBudgetLow   *int    `name:"reasoning-budget-low" placeholder:"N" help:"Reasoning budget for reasoning effort low."`
	ReasoningBudgetMed   *int    `name:"reasoning-budget-medium" placeholder:"N" help:"Reasoning budget for reasoning effort medium."`
	ReasoningBudgetHigh  *int    `name:"reasoning-budget-high" placeholder:"N" help:"Reasoning budget for reasoning effort high."`
}

// removedFlags are old spellings rejected with the replacement; they are
// never shown in --help but are candidates for "did you mean".
var removedFlags = map[string]string{
	"primary-gpu":               "use --load-balancing-primary-gpu <backend:gpu>",
	"next-model":                "start each model block with --model <path>",
	"load-balancing-next-model": "use --load-balancing and start each model block with --model <path>",
}

// newKong builds a fresh, silent parser: kong never prints, never exits
// and has no help flag of its own (Parse handles -h/--help).
func newKong(grammar any) (*kong.Kong, error) {
	return kong.New(grammar,
		kong.Name("dflash_server"),
		kong.NoDefaultHelp(),
		kong.Exit(func(int) {}),
		kong.Writers(io.Discard, io.Discard),
	)
}

// scope says where a flag belongs.
type scope int

const (
	scopeGlobal scope = iota + 1
	scopeListener
	scopeBlock
	scopeRemoved
	scopePlugin
)

// flagDef is one known flag.
type flagDef struct {
	name    string
	scope   scope
	isBool  bool   // takes no separate value (--flag or --flag=false)
	removed string // scopeRemoved: what to use instead
	spec    *sdk.OptionSpec
}

// coreFlags are the flags the core declares, by name without dashes.
type coreFlags map[string]*flagDef

// loadCoreFlags reads the kong grammars once.
var loadCoreFlags = sync.OnceValues(func() (coreFlags, error) {
	flags := coreFlags{}
	for _, g := range []struct {
		grammar any
		scope   scope
	}{{&globalFlags{}, scopeGlobal}, {&listenerFlags{}, scopeListener}, {&blockFlags{}, scopeBlock}} {
		k, err := newKong(g.grammar)
		if err != nil {
			return nil, fmt.Errorf("launch: grammar: %w", err)
		}
		for _, f := range k.Model.Flags {
			flags[f.Name] = &flagDef{name: f.Name, scope: g.scope, isBool: f.IsBool()}
		}
	}
	for name, instead := range removedFlags {
		flags[name] = &flagDef{name: name, scope: scopeRemoved, isBool: true, removed: instead}
	}
	return flags, nil
})

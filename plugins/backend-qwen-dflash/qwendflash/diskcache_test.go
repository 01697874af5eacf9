package qwendflash

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
)

// TestDiskPrefixCache: with --disk-prefix-cache on, a backend stores the state of a prompt up to its generation
// prompt; a new backend process on the same directory (a restart) answers a later turn of the conversation from
// it: the shared prefix is reported as cached, and the output equals the output without the cache, for qwen3 and
// qwen35 (recurrent state) models.
func TestDiskPrefixCache(t *testing.T) {
	q3, q35 := tinyModels(t)
	system := "You are a careful assistant. Answer in one short sentence, and never mention the weather or any of the other topics people like to talk about."
	turn := func(cfg sdk.ModelConfig, msgs ...string) ([]int32, sdk.Usage) {
		t.Helper()
		b, c, _ := load(t, cfg)
		defer b.Shutdown(context.Background())
		req := chatReq("", 12)
		req.Messages = []sdk.Message{{Role: "system", Content: system}}
		for i, m := range msgs {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			req.Messages = append(req.Messages, sdk.Message{Role: role, Content: m})
		}
		s := newStream()
		if err := c.Start(context.Background(), req, s); err != nil {
			t.Fatal(err)
		}
		r := s.summary()
		return r.tokens, r.finish.Usage
	}
	for _, tc := range []struct{ name, path, arch string }{{"qwen3", q3, "qwen3"}, {"qwen35", q35, "qwen35"}} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			dir := t.TempDir()
			cfg := blockConfig(t, tc.path)
			cfg.Architecture = tc.arch
			plain, _ := turn(cfg, "What is Go?", "A language.", "Who made it?")
			cfg.Options = map[string]string{"threads": "1", "disk-prefix-cache": "on", "disk-prefix-cache-dir": dir}
			_, u := turn(cfg, "What is Go?", "A language.", "Who made it?")
			is.Equal(u.CachedTokens, 0) // nothing stored yet
			files, _ := filepath.Glob(filepath.Join(dir, "*", "*.state"))
			is.Equal(len(files), 1) // the prompt up to its generation prompt went to disk when the backend shut down
			got, u := turn(cfg, "What is Go?", "A language.", "Who made it?")
			is.True(u.CachedTokens > 20) // a fresh backend started from the stored state
			is.Equal(fmt.Sprint(got), fmt.Sprint(plain))
			// A damaged entry is ignored (one warning on the plugin's log) and the answer is the same.
			is.NoErr(os.WriteFile(files[0], []byte("garbage"), 0o644))
			got, u = turn(cfg, "What is Go?", "A language.", "Who made it?")
			is.Equal(u.CachedTokens, 0)
			is.Equal(fmt.Sprint(got), fmt.Sprint(plain))
		})
	}
}

package engine_test

import (
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/engine/enginetest"
	"github.com/dflash/dflash_server/sdk/statecache"
)

// TestStateStoreAcrossEngines: an engine stores the state of its prompts (up to SnapshotAt) in a disk state cache;
// a new engine on a new model instance (a restart) starts a prompt sharing that prefix from the stored state — same
// output, the shared tokens counted as cached, only the rest prefilled — for attention-only and recurrent models.
func TestStateStoreAcrossEngines(t *testing.T) {
	for _, recurrent := range []bool{false, true} {
		t.Run(map[bool]string{false: "attention", true: "recurrent"}[recurrent], func(t *testing.T) {
			is := is.New(t)
			dir := t.TempDir()
			system := "a long system prompt that many conversations share, "
			first := &engine.Request{Prompt: enginetest.Encode(system + "first question"), MaxTokens: 8,
				SnapshotAt: len(system), Detokenizer: &enginetest.Detokenizer{}}
			second := &engine.Request{Prompt: enginetest.Encode(system + "another question"), MaxTokens: 8,
				SnapshotAt: len(system), Detokenizer: &enginetest.Detokenizer{}}
			newStore := func() *statecache.Cache {
				c, err := statecache.Open(dir, []byte("fake"), 1<<20, func(string, ...any) { t.Error("unexpected warning") })
				is.NoErr(err)
				return c
			}
			store := newStore()
			m := enginetest.NewFakeModel(4, 64, 1)
			m.RecurrentState = recurrent
			e := newEngine(t, m, engine.Config{Store: store, StepTokens: 16})
			c, err := run(e, first)
			is.NoErr(err)
			is.Equal(c.result().finish.Usage.CachedTokens, 0)
			store.Close() // waits for the background write

			store = newStore() // a restart
			defer store.Close()
			m2 := enginetest.NewFakeModel(4, 64, 1)
			m2.RecurrentState = recurrent
			e2 := newEngine(t, m2, engine.Config{Store: store, StepTokens: 16})
			c2, err := run(e2, second)
			is.NoErr(err)
			is.Equal(m2.Imports(), 1)
			is.Equal(c2.result().finish.Usage.CachedTokens, len(system))
			is.Equal(c2.result().tokens, plainTokens(t, system+"another question", 8, recurrent)) // same output
			prefilled := 0
			for _, step := range m2.Steps() {
				for _, ent := range step {
					if ent.Logits != engine.LogitsAll {
						prefilled += ent.Tokens
					}
				}
			}
			is.Equal(prefilled, len("another question")+7) // only the rest of the prompt, then 7 decode steps
		})
	}
}

func TestStateStoreNeedsAStateModel(t *testing.T) {
	is := is.New(t)
	store, err := statecache.Open(t.TempDir(), []byte("x"), 1<<20, func(string, ...any) {})
	is.NoErr(err)
	defer store.Close()
	_, err = engine.New(engine.Config{Model: noStates{enginetest.NewFakeModel(4, 16, 1)}, Vocab: enginetest.ByteVocab{}, MaxCtx: 32, Store: store})
	is.True(err != nil)
}

// noStates hides FakeModel's Export and Import.
type noStates struct{ engine.Model }

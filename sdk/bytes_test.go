package sdk_test

import (
	"context"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/sdktest"
)

// rawBackend is a test double whose Start emits one fixed event and whose
// Detokenize returns fixed text: what a model emitted, byte for byte.
type rawBackend struct {
	sdk.Backend // only Start and Detokenize are called
	ev          sdk.Event
	detok       string
}

func (b *rawBackend) Start(_ context.Context, _ *sdk.ChatRequest, emit sdk.Emitter) error {
	if err := emit.Admit(sdk.Admission{Outcome: sdk.OutcomeAdmitted, PromptTokens: 1}); err != nil {
		return err
	}
	return emit.Emit(b.ev)
}

func (b *rawBackend) Detokenize(context.Context, []int32) (string, error) { return b.detok, nil }

type collect struct{ events []sdk.Event }

func (c *collect) Admit(sdk.Admission) error { return nil }
func (c *collect) Emit(e sdk.Event) error    { c.events = append(c.events, e); return nil }

// TestModelBytesCrossTheBoundary: byte-level BPE splits multi-byte
// characters across tokens, so anything a model emits may be an incomplete
// UTF-8 sequence. None of it may make the transport fail, and all of it
// arrives exactly.
func TestModelBytesCrossTheBoundary(t *testing.T) {
	half := "\xe6\x97" // the first two bytes of 日
	lone := "\x80\xff" // never valid anywhere
	tests := []struct {
		name string
		ev   sdk.Event
	}{
		{"text", sdk.Event{Text: "a" + half}},
		{"reasoning", sdk.Event{Reasoning: lone + "b"}},
		{"tool call", sdk.Event{ToolCalls: []sdk.ToolCallDelta{{Index: 0, ID: "call_" + half, Name: "f" + lone, ArgumentsDelta: `{"q":"` + half}}}},
		{"logprob token", sdk.Event{TokenIDs: []int32{7}, Logprobs: []sdk.TokenLogprob{{Token: half, Bytes: []byte(half), Logprob: -0.5}}}},
		{"top logprob token", sdk.Event{TokenIDs: []int32{7}, Logprobs: []sdk.TokenLogprob{{Token: "x", Bytes: []byte("x"), Logprob: -0.1,
			Top: []sdk.TopLogprob{{Token: "x", Bytes: []byte("x"), Logprob: -0.1}, {Token: lone, Bytes: []byte(lone), Logprob: -3}}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			client := sdktest.Backend(t, &rawBackend{ev: tt.ev})
			var got collect
			err := client.Start(context.Background(), &sdk.ChatRequest{}, &got)
			is.NoErr(err)                  // a model's bytes must not fail the stream
			is.Equal(len(got.events), 1)   // the one event arrived
			is.Equal(got.events[0], tt.ev) // byte for byte
		})
	}
	t.Run("detokenize", func(t *testing.T) {
		is := is.New(t)
		client := sdktest.Backend(t, &rawBackend{detok: "ok" + half})
		got, err := client.Detokenize(context.Background(), []int32{1, 2})
		is.NoErr(err) // ids that end inside a character must not fail the call
		is.Equal(got, "ok"+half)
	})
}

package ds4

import (
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/plugins/nativebackend"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat"
	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/tokenizer"
)

// chatModel is the tiny model's tokenizer and template with the ds4
// Chat, without the native weights: request preparation does not need
// them.
func chatModel(t *testing.T) *nativebackend.ChatModel {
	t.Helper()
	f, err := gguf.Open(tinyModel(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	tok, err := tokenizer.FromMetadata(f.Meta)
	if err != nil {
		t.Fatal(err)
	}
	src, err := f.String("tokenizer.chat_template")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.NewTemplate(src)
	if err != nil {
		t.Fatal(err)
	}
	l := &nativebackend.Loaded{Tok: tok, Tmpl: tmpl, TemplateSource: src,
		Desc: sdk.ModelDescription{Name: "tiny-ds4", Architecture: Arch, DefaultMaxTokens: 16, MaxTokens: 256}}
	return nativebackend.NewChatModel(l, deepseekChat(l))
}

// TestPrepare: requests are rendered with DeepSeek V4's template and
// parsed as its family; the prefix cache snapshots where the generation
// prompt starts; thinking is off unless asked for.
func TestPrepare(t *testing.T) {
	m := chatModel(t)
	assistant, ok := m.Tok.Special("<｜Assistant｜>")
	if !ok {
		t.Fatal("the test tokenizer has no <｜Assistant｜>")
	}
	think := func(on bool) *bool { return &on }
	tests := []struct {
		name     string
		req      sdk.ChatRequest
		prompt   string // the rendered prompt's end
		thinking bool   // the preset's mode, by the open reasoning token
		refused  string
	}{
		{"one turn", sdk.ChatRequest{Messages: []sdk.Message{{Role: "user", Content: "Hello!"}}},
			"<｜begin▁of▁sentence｜><｜User｜>Hello!<｜Assistant｜></think>", false, ""},
		{"thinking on", sdk.ChatRequest{Messages: []sdk.Message{{Role: "user", Content: "Why?"}}, Reasoning: sdk.Reasoning{Enabled: think(true)}},
			"<｜User｜>Why?<｜Assistant｜><think>", true, ""},
		{"a later turn", sdk.ChatRequest{Messages: []sdk.Message{{Role: "user", Content: "Pick one."}, {Role: "assistant", Content: "7"}, {Role: "user", Content: "Why?"}}},
			"<｜Assistant｜></think>7<｜end▁of▁sentence｜><｜User｜>Why?<｜Assistant｜></think>", false, ""},
		{"forced tool call", sdk.ChatRequest{Messages: []sdk.Message{{Role: "user", Content: "Weather?"}},
			Tools: []sdk.Tool{{Name: "weather", Parameters: []byte(`{"type":"object"}`)}}, ToolChoice: "required"}, "", false,
			`tool_choice "required" is not supported by the ds4 backend`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			is.Equal(m.Family, chat.FamilyDeepSeekV4)
			req := tt.req
			req.Sampling.Temperature = f64(0)
			er, err := m.Prepare(&req)
			if tt.refused != "" {
				is.True(err != nil && strings.Contains(err.Error(), tt.refused)) // refused, saying why
				return
			}
			is.NoErr(err)
			prompt, err := m.Render(&req)
			is.NoErr(err)
			if !strings.HasSuffix(prompt, tt.prompt) {
				t.Errorf("prompt %q does not end with %q", prompt, tt.prompt)
			}
			is.Equal(m.Tok.Decode(er.Prompt), prompt)             // tokenized as rendered
			is.Equal(er.Prompt[er.SnapshotAt], assistant)         // snapshot before the generation prompt
			is.Equal(chat.ThinkingOpen(prompt), tt.thinking)      // the template's thinking default
			is.Equal(m.Tok.Decode(er.CloseReasoning), "</think>") // a budget closes reasoning as the template does
			is.Equal(er.Sampling.Temperature, float32(0))         // the request's greedy setting over DeepSeek's preset
		})
	}
	t.Run("preset", func(t *testing.T) {
		is := is.New(t)
		er, err := m.Prepare(&sdk.ChatRequest{Messages: []sdk.Message{{Role: "user", Content: "Hi"}}})
		is.NoErr(err)
		is.Equal(er.Sampling.Temperature, float32(1)) // DeepSeek's recommendation
		is.Equal(er.Sampling.TopP, float32(1))
		is.Equal(er.MaxTokens, 16) // the block's default
	})
}

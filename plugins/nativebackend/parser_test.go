package nativebackend

import (
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk/chat"
)

func TestOutputParserMapsPieces(t *testing.T) {
	is := is.New(t)
	p := OutputParser{chat.NewParser(chat.FamilyQwen3, chat.ParserOptions{
		ThinkingOpen: true, Tools: true, NewID: func(i int) string { return "call_test" },
	})}
	is.True(p.InReasoning()) // the prompt opened <think>
	var reasoning, text, args string
	var names []string
	out := "Let me check.\n</think>\n\nSure.<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>"
	for _, piece := range strings.SplitAfter(out, "") { // one byte at a time, like a tokenizer might cut it
		o := p.Feed(piece)
		reasoning += o.Reasoning
		text += o.Text
		for _, c := range o.ToolCalls {
			if c.Name != "" {
				names = append(names, c.Name)
				is.Equal(c.ID, "call_test")
			}
			args += c.ArgumentsDelta
		}
	}
	o := p.Close()
	text += o.Text
	is.True(!p.InReasoning())
	is.Equal(reasoning, "Let me check.")
	is.Equal(strings.TrimSpace(text), "Sure.")
	is.Equal(names, []string{"get_time"})
	is.Equal(args, `{"tz": "UTC"}`)
}

package nativebackend

import (
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/jsonprefix"
)

// OutputParser adapts a model family's chat parser to engine.Parser.
type OutputParser struct{ P *chat.Parser }

var _ engine.Parser = OutputParser{}

func (o OutputParser) Feed(text string) engine.Output { return pieces(o.P.Feed(text)) }
func (o OutputParser) Close() engine.Output           { return pieces(o.P.Close()) }
func (o OutputParser) InReasoning() bool              { return o.P.InReasoning() }

func pieces(ps []chat.Piece) engine.Output {
	var out engine.Output
	for _, p := range ps {
		switch p.Kind {
		case chat.PieceText:
			out.Text += p.Text
		case chat.PieceReasoning:
			out.Reasoning += p.Text
		case chat.PieceToolCallStart:
			out.ToolCalls = append(out.ToolCalls, sdk.ToolCallDelta{Index: p.Index, ID: p.ID, Name: p.Name})
		case chat.PieceToolCallArgs:
			out.ToolCalls = append(out.ToolCalls, sdk.ToolCallDelta{Index: p.Index, ArgumentsDelta: p.Text})
		}
	}
	return out
}

// ForcedCallParser is the output parser of a request whose tool_choice
// forces a call: the backend ended the prompt with the call's opening
// (Prefill) and the engine holds the generated text to the call's JSON
// object, finishing when it closes. The parser sees the prefill as if the
// model had written it, so it starts inside the call; once the object is
// complete, Close feeds Suffix (what closes the call) before closing.
type ForcedCallParser struct {
	P       *chat.Parser
	Prefill string
	Suffix  string

	fed bool
	obj jsonprefix.State // the generated text, to know the object closed
}

var _ engine.Parser = (*ForcedCallParser)(nil)

func (f *ForcedCallParser) Feed(text string) engine.Output {
	f.obj.Feed([]byte(text))
	if !f.fed {
		f.fed = true
		text = f.Prefill + text
	}
	return pieces(f.P.Feed(text))
}

func (f *ForcedCallParser) Close() engine.Output {
	var out []chat.Piece
	if !f.fed {
		f.fed = true
		out = append(out, f.P.Feed(f.Prefill)...)
	}
	if f.obj.Complete() {
		out = append(out, f.P.Feed(f.Suffix)...)
	}
	return pieces(append(out, f.P.Close()...))
}

// InReasoning is false before the first Feed too: the prefill closes any
// reasoning the prompt opened, and the engine must constrain the very
// first token.
func (f *ForcedCallParser) InReasoning() bool { return f.fed && f.P.InReasoning() }

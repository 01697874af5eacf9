package nativebackend

import (
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat"
	"github.com/dflash/dflash_server/sdk/engine"
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

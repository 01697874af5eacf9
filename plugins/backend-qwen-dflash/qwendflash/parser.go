package qwendflash

import (
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat"
	"github.com/dflash/dflash_server/sdk/engine"
)

// outputParser adapts the family's chat parser to engine.Parser.
type outputParser struct{ p *chat.Parser }

var _ engine.Parser = outputParser{}

func (o outputParser) Feed(text string) engine.Output { return pieces(o.p.Feed(text)) }
func (o outputParser) Close() engine.Output           { return pieces(o.p.Close()) }
func (o outputParser) InReasoning() bool              { return o.p.InReasoning() }

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

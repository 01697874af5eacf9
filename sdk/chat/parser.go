package chat

import (
	"crypto/rand"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/dflash/dflash_server/sdk"
)

// PieceKind says what a Piece carries.
type PieceKind uint8

const (
	// PieceText is visible answer text.
	PieceText PieceKind = iota + 1
	// PieceReasoning is thinking text (reasoning_content).
	PieceReasoning
	// PieceToolCallStart opens tool call Index with its ID and Name.
	PieceToolCallStart
	// PieceToolCallArgs is a fragment of tool call Index's arguments; the
	// fragments of one call concatenate to a JSON object.
	PieceToolCallArgs
)

func (k PieceKind) String() string {
	switch k {
	case PieceText:
		return "text"
	case PieceReasoning:
		return "reasoning"
	case PieceToolCallStart:
		return "tool_call_start"
	case PieceToolCallArgs:
		return "tool_call_args"
	}
	return "invalid"
}

// Piece is one typed part of the generated output.
type Piece struct {
	Kind PieceKind
	// Text is the text for PieceText and PieceReasoning and the JSON
	// fragment for PieceToolCallArgs.
	Text string
	// Index numbers tool calls from 0 in the order they start.
	Index int
	// ID and Name are set on PieceToolCallStart.
	ID   string
	Name string
}

// ParserOptions configure a Parser for one generation.
type ParserOptions struct {
	// ThinkingOpen says the prompt ended inside a thinking block (see
	// ThinkingOpen), so output starts as reasoning.
	ThinkingOpen bool
	// Tools enables tool-call extraction; without it tool syntax is text.
	Tools bool
	// ToolSchemas type the parameters of XML and DSML tool calls (string,
	// integer, number, boolean, object, array), as vLLM's qwen3_coder
	// parser does. Optional.
	ToolSchemas []sdk.Tool
	// NewID makes tool call IDs; nil gives "call_" and 24 random letters.
	NewID func(index int) string
}

// Parser splits one generation's text into typed pieces incrementally.
// It is not safe for concurrent use.
type Parser struct {
	fam    Family
	opts   ParserOptions
	syntax familySyntax
	types  paramTypes

	buf    string // input not yet consumed
	mode   parseMode
	seg    segment
	sawAny bool // anything but whitespace arrived outside reasoning
	out    []Piece
	closed bool

	calls int       // tool calls started
	call  *toolCall // the call being parsed, if any
}

type parseMode uint8

const (
	modeText parseMode = iota
	modeReasoning
	modeToolCall  // inside <tool_call> (Qwen) or <｜DSML｜tool_calls> (DeepSeek)
	modeAfterCall // a call ended; waiting for its closing tag
)

type familySyntax struct {
	toolOpen   string
	reasonTail string // ReasoningCloseTag
	// reasonTrim are the characters the family's template puts around the
	// reasoning and at the start of the answer after it; the parser drops
	// them there and nowhere else.
	reasonTrim string
}

const (
	thinkOpen  = "<think>"
	thinkClose = "</think>"
	dsml       = "｜DSML｜"
)

func syntaxOf(f Family) familySyntax {
	switch f {
	case FamilyQwen3, FamilyQwen35:
		// The templates render a finished thought as
		// "<think>\n" + reasoning.strip('\n') + "\n</think>\n\n" +
		// answer.lstrip('\n').
		return familySyntax{toolOpen: "<tool_call>", reasonTail: "\n</think>\n\n", reasonTrim: "\n"}
	case FamilyDeepSeekV4:
		// encoding_dsv4 renders reasoning + "</think>" + answer.
		return familySyntax{toolOpen: "<" + dsml + "tool_calls>", reasonTail: thinkClose}
	}
	return familySyntax{reasonTail: thinkClose}
}

// NewParser returns a parser for one generation of a model of family f.
func NewParser(f Family, opts ParserOptions) *Parser {
	p := &Parser{fam: f, opts: opts, syntax: syntaxOf(f), types: newParamTypes(opts.ToolSchemas)}
	if f == FamilyUnknown {
		p.opts.Tools = false
	}
	if opts.ThinkingOpen {
		p.mode = modeReasoning
		p.seg.lead = p.syntax.reasonTrim
	}
	return p
}

// InReasoning reports whether the output is inside a thinking block, where
// a reasoning budget would force ReasoningCloseTag.
func (p *Parser) InReasoning() bool { return p.mode == modeReasoning }

// ReasoningCloseTag is the text that ends a thinking block the way the
// family's template renders one; feed it to the model (and to Feed) to
// force reasoning closed.
func (p *Parser) ReasoningCloseTag() string { return p.syntax.reasonTail }

// Feed parses the next piece of generated text.
func (p *Parser) Feed(text string) []Piece {
	if p.closed || text == "" {
		return nil
	}
	p.buf += text
	p.run(false)
	return p.take()
}

// Close flushes what was held back and closes an unfinished tool call so its
// arguments are still valid JSON. The parser takes no input afterwards.
func (p *Parser) Close() []Piece {
	if p.closed {
		return nil
	}
	p.run(true)
	if p.mode == modeToolCall && p.call != nil {
		p.call.abort(p)
	}
	p.closed = true
	return p.take()
}

func (p *Parser) take() []Piece {
	out := p.out
	p.out = nil
	return out
}

// emit appends a piece, merging it into the previous one of the same kind.
func (p *Parser) emit(k PieceKind, text string, index int) {
	if text == "" {
		return
	}
	if n := len(p.out); n > 0 {
		last := &p.out[n-1]
		if last.Kind == k && k != PieceToolCallStart && last.Index == index {
			last.Text += text
			return
		}
	}
	p.out = append(p.out, Piece{Kind: k, Text: text, Index: index})
}

func (p *Parser) startCall(name string) int {
	idx := p.calls
	p.calls++
	id := ""
	if p.opts.NewID != nil {
		id = p.opts.NewID(idx)
	} else {
		id = randomCallID()
	}
	p.out = append(p.out, Piece{Kind: PieceToolCallStart, Index: idx, ID: id, Name: name})
	return idx
}

func randomCallID() string {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	var b [24]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = letters[int(b[i])%len(letters)]
	}
	return "call_" + string(b[:])
}

func (p *Parser) run(final bool) {
	for {
		var progressed bool
		switch p.mode {
		case modeText, modeReasoning:
			progressed = p.scanText(final)
		case modeToolCall:
			progressed = p.call.step(p, final)
		case modeAfterCall:
			progressed = p.scanAfterCall(final)
		}
		if !progressed {
			return
		}
	}
}

// tags lists what ends the current text or reasoning segment.
func (p *Parser) tags(dst []string) []string {
	if p.mode == modeReasoning {
		dst = append(dst, thinkClose)
		if !p.seg.visible {
			dst = append(dst, thinkOpen) // a repeated opening tag is dropped
		}
		return dst
	}
	if p.opts.Tools && p.syntax.toolOpen != "" {
		dst = append(dst, p.syntax.toolOpen)
	}
	if !p.sawAny {
		dst = append(dst, thinkOpen)
	}
	return dst
}

// scanText moves text or reasoning out of buf up to the next tag, holding
// back a tail that might still become a tag or is an incomplete UTF-8 rune.
func (p *Parser) scanText(final bool) bool {
	var arr [3]string
	tags := p.tags(arr[:0])
	idx, tag := findFirst(p.buf, tags)
	if tag == thinkOpen && strings.TrimLeft(p.buf[:idx], " \t\r\n") != "" {
		// <think> only counts before any other text.
		tags = slices.DeleteFunc(tags, func(t string) bool { return t == thinkOpen })
		idx, tag = findFirst(p.buf, tags)
	}
	kind := PieceText
	if p.mode == modeReasoning {
		kind = PieceReasoning
	}
	if idx < 0 {
		n := len(p.buf)
		if !final {
			n -= max(holdBack(p.buf, tags), partialRune(p.buf))
		}
		p.segText(kind, p.buf[:n])
		p.buf = p.buf[n:]
		if final {
			if kind == PieceText {
				// The answer ends here: held whitespace is the model's.
				p.emit(kind, p.seg.ws, 0)
			}
			p.seg = segment{}
		}
		return false
	}
	p.segText(kind, p.buf[:idx])
	p.buf = p.buf[idx+len(tag):]
	switch {
	case tag == thinkOpen && p.mode == modeReasoning:
		// stay in reasoning
	case tag == thinkOpen:
		// Whitespace held before the tag is dropped with it.
		p.seg = segment{lead: p.syntax.reasonTrim}
		p.mode = modeReasoning
	case tag == thinkClose:
		p.seg = segment{lead: p.syntax.reasonTrim}
		p.mode = modeText
		p.sawAny = true
	default: // tool-call opening tag
		p.call = newToolCall(p.fam)
		p.call.preWS = p.seg.ws
		p.seg = segment{}
		p.sawAny = true
		p.mode = modeToolCall
	}
	return true
}

// segment is one run of reasoning or answer text. Its text is the model's,
// exactly (code completions keep their indentation), except for what the
// family's output format puts between segments: the characters in lead at
// its start (the newlines around a Qwen thought), whitespace before a tool
// call or an opening <think>, and the newlines before </think>. Trailing
// whitespace is held until what follows shows whether it was the model's.
type segment struct {
	started bool   // text of the segment was emitted
	visible bool   // anything but whitespace arrived in the segment
	lead    string // format characters dropped at the segment's start
	ws      string // trailing whitespace held back
}

func (p *Parser) segText(kind PieceKind, s string) {
	if s == "" {
		return
	}
	if strings.TrimLeft(s, " \t\r\n") != "" {
		p.seg.visible = true
		if kind == PieceText {
			p.sawAny = true
		}
	}
	if !p.seg.started && p.seg.ws == "" {
		if s = strings.TrimLeft(s, p.seg.lead); s == "" {
			return
		}
	}
	hold := " \t\r\n" // before a tool call it is the format's
	if kind == PieceReasoning {
		hold = p.syntax.reasonTrim // before </think>
	}
	body := strings.TrimRight(s, hold)
	if body == "" {
		p.seg.ws += s
		return
	}
	p.seg.started = true
	p.emit(kind, p.seg.ws+body, 0)
	p.seg.ws = s[len(body):]
}

// scanAfterCall waits for the closing tag of a finished call, skipping
// whitespace; anything else ends the wait and is parsed as text.
func (p *Parser) scanAfterCall(final bool) bool {
	tail := p.call.closeTag
	s := strings.TrimLeft(p.buf, " \t\r\n")
	switch {
	case strings.HasPrefix(s, tail):
		p.buf = s[len(tail):]
	case s == "" && !final:
		p.buf = ""
		return false
	case strings.HasPrefix(tail, s) && !final:
		return false
	default:
		p.buf = s
	}
	p.call = nil
	p.mode = modeText
	// Text after a call starts after the whitespace that separates blocks.
	p.seg = segment{lead: " \t\r\n"}
	return true
}

// findFirst returns the earliest occurrence of any tag in s.
func findFirst(s string, tags []string) (int, string) {
	best, bestTag := -1, ""
	for _, t := range tags {
		if i := strings.Index(s, t); i >= 0 && (best < 0 || i < best) {
			best, bestTag = i, t
		}
	}
	return best, bestTag
}

// holdBack is the length of the longest suffix of s that is a proper prefix
// of a tag.
func holdBack(s string, tags []string) int {
	longest := 0
	for _, t := range tags {
		for n := min(len(s), len(t)-1); n > longest; n-- {
			if strings.HasSuffix(s, t[:n]) {
				longest = n
				break
			}
		}
	}
	return longest
}

// partialRune is the length of an incomplete UTF-8 sequence ending s.
func partialRune(s string) int {
	for n := 1; n <= 3 && n <= len(s); n++ {
		c := s[len(s)-n]
		if c < 0x80 {
			return 0
		}
		if c >= 0xC0 { // a lead byte: complete if it has all its continuations
			if utf8.FullRuneInString(s[len(s)-n:]) {
				return 0
			}
			return n
		}
	}
	return 0
}

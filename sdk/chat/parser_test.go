package chat

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
)

func seqIDs(i int) string { return fmt.Sprintf("call_%d", i) }

// coalesce merges neighbouring pieces of one kind (and call), so outputs
// fed in different splits compare equal.
func coalesce(ps []Piece) []Piece {
	var out []Piece
	for _, p := range ps {
		if n := len(out); n > 0 && p.Kind != PieceToolCallStart && out[n-1].Kind == p.Kind && out[n-1].Index == p.Index {
			out[n-1].Text += p.Text
			continue
		}
		out = append(out, p)
	}
	return out
}

func parseChunks(f Family, opts ParserOptions, chunks ...string) []Piece {
	if opts.NewID == nil {
		opts.NewID = seqIDs
	}
	p := NewParser(f, opts)
	var out []Piece
	for _, c := range chunks {
		out = append(out, p.Feed(c)...)
	}
	return coalesce(append(out, p.Close()...))
}

func txt(s string) Piece { return Piece{Kind: PieceText, Text: s} }
func rsn(s string) Piece { return Piece{Kind: PieceReasoning, Text: s} }
func args(i int, s string) Piece {
	return Piece{Kind: PieceToolCallArgs, Index: i, Text: s}
}
func start(i int, name string) Piece {
	return Piece{Kind: PieceToolCallStart, Index: i, ID: seqIDs(i), Name: name}
}

var testSchemas = []sdk.Tool{
	{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},"ratio":{"type":["number","null"]}}}`)},
	{Name: "search_web", Parameters: json.RawMessage(`{"type":"object","properties":{"query":{"type":"string"},"filters":{"type":"object"},"tags":{"type":"array"}}}`)},
}

type parserCase struct {
	name string
	fam  Family
	opts ParserOptions
	in   string
	want []Piece
}

var parserCases = []parserCase{
	{name: "qwen3 thinking then answer", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in:   "<think>\nLet me think.\nTwo lines.\n</think>\n\nThe answer is 4.",
		want: []Piece{rsn("Let me think.\nTwo lines."), txt("The answer is 4.")}},
	{name: "qwen3 no thinking", fam: FamilyQwen3, opts: ParserOptions{},
		in: "Hello <b>there</b> a<t", want: []Piece{txt("Hello <b>there</b> a<t")}},
	{name: "qwen3 tool call", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in:   "<think>\nNeed weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}\n</tool_call>",
		want: []Piece{rsn("Need weather."), start(0, "get_weather"), args(0, `{"city": "Oslo", "days": 3}`)}},
	{name: "qwen3 text then two calls", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in: "Let me check both.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bergen\", \"nested\": {\"a\": [1, 2.5e3, true, null, \"x\\\"y\"]}}}\n</tool_call>",
		want: []Piece{txt("Let me check both."), start(0, "get_weather"), args(0, `{"city": "Oslo"}`),
			start(1, "get_weather"), args(1, `{"city": "Bergen", "nested": {"a": [1, 2.5e3, true, null, "x\"y"]}}`)}},
	{name: "qwen3 arguments before name", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in:   "<tool_call>\n{\"arguments\": {\"a\": 1}, \"name\": \"f\"}\n</tool_call>",
		want: []Piece{start(0, "f"), args(0, `{"a": 1}`)}},
	{name: "qwen3 arguments as a string", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in:   "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>",
		want: []Piece{start(0, "f"), args(0, `{"a": 1}`)}},
	{name: "qwen3 parameters instead of arguments", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in:   "<tool_call>\n{\"name\": \"f\", \"parameters\": {\"a\": true}}\n</tool_call>",
		want: []Piece{start(0, "f"), args(0, `{"a": true}`)}},
	{name: "qwen3 no arguments", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in:   "<tool_call>\n{\"name\": \"now\"}\n</tool_call>",
		want: []Piece{start(0, "now"), args(0, `{}`)}},
	{name: "qwen3 tools off keeps the tag as text", fam: FamilyQwen3, opts: ParserOptions{},
		in:   "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
		want: []Piece{txt("<tool_call>\n{\"name\": \"f\"}\n</tool_call>")}},
	{name: "qwen3 tag that is not a call", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in: "Use <tool_call> hello", want: []Piece{txt("Use <tool_call> hello")}},
	{name: "qwen3 broken json before the name", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in: "<tool_call>{nope}", want: []Piece{txt("<tool_call>{nope}")}},
	{name: "qwen3 cut inside the arguments", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in:   "<tool_call>\n{\"name\": \"search_web\", \"arguments\": {\"query\": \"hel",
		want: []Piece{start(0, "search_web"), args(0, `{"query": "hel"}`)}},
	{name: "qwen3 cut inside a key", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in:   "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2], \"qu",
		want: []Piece{start(0, "f"), args(0, `{"a": [1, 2]}`)}},
	{name: "qwen3 cut inside a number", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in:   "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 12",
		want: []Piece{start(0, "f"), args(0, `{}`)}},
	{name: "qwen3 cut before the arguments", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in: "Hi\n<tool_call>\n{\"name\": \"f\", \"argu", want: []Piece{txt("Hi")}},
	{name: "qwen3 cut inside the reasoning", fam: FamilyQwen3, opts: ParserOptions{},
		in: "<think>\nstill going\n</thi", want: []Piece{rsn("still going\n</thi")}},
	{name: "qwen3 unicode and a partial tag at the end", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in: "Grüße 👋 日本語 <tool_", want: []Piece{txt("Grüße 👋 日本語 <tool_")}},
	// The answer is the model's text exactly; only what the template puts
	// around a thought or a tool call is format.
	{name: "qwen3 leading tab is content", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in: "\tlib = load()\n", want: []Piece{txt("\tlib = load()\n")}},
	{name: "qwen3 leading space is content", fam: FamilyQwen3, opts: ParserOptions{},
		in: " khaki", want: []Piece{txt(" khaki")}},
	{name: "qwen3 whitespace only", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in: "\n \n", want: []Piece{txt("\n \n")}},
	{name: "qwen3 inner and trailing whitespace kept", fam: FamilyQwen3, opts: ParserOptions{},
		in: "a  \n\n  b \t", want: []Piece{txt("a  \n\n  b \t")}},
	{name: "qwen3 whitespace before think is dropped", fam: FamilyQwen3, opts: ParserOptions{},
		in: "\n<think>\nr\n</think>\n\nA", want: []Piece{rsn("r"), txt("A")}},
	{name: "qwen3 answer indentation after think", fam: FamilyQwen3, opts: ParserOptions{},
		in:   "<think>\n  spaced thought  \n</think>\n\n    return x\n",
		want: []Piece{rsn("  spaced thought  "), txt("    return x\n")}},
	{name: "qwen3 leading whitespace before a tag that is text", fam: FamilyQwen3, opts: ParserOptions{Tools: true},
		in: "  <tool_call> hello", want: []Piece{txt("  <tool_call> hello")}},
	{name: "deepseek answer after think is exact", fam: FamilyDeepSeekV4, opts: ParserOptions{ThinkingOpen: true},
		in: "\nR \n</think>\n A", want: []Piece{rsn("\nR \n"), txt("\n A")}},

	{name: "qwen35 pre-opened thinking", fam: FamilyQwen35, opts: ParserOptions{ThinkingOpen: true, Tools: true},
		in:   "Let me think.\n</think>\n\nAnswer.",
		want: []Piece{rsn("Let me think."), txt("Answer.")}},
	{name: "qwen35 repeated think tag", fam: FamilyQwen35, opts: ParserOptions{ThinkingOpen: true},
		in:   "<think>\nHmm.\n</think>\n\nOk.",
		want: []Piece{rsn("Hmm."), txt("Ok.")}},
	{name: "qwen35 xml tool call typed by schema", fam: FamilyQwen35, opts: ParserOptions{ThinkingOpen: true, Tools: true, ToolSchemas: testSchemas},
		in:   "I'll check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=ratio>\nNone\n</parameter>\n</function>\n</tool_call>",
		want: []Piece{rsn("I'll check."), start(0, "get_weather"), args(0, `{"city": "New York", "days": 3, "metric": true, "ratio": null}`)}},
	{name: "qwen35 multi-line string and json params", fam: FamilyQwen35, opts: ParserOptions{Tools: true, ToolSchemas: testSchemas},
		in:   "<tool_call>\n<function=search_web>\n<parameter=query>\ndef f():\n    return \"x\"\\n\n\n</parameter>\n<parameter=filters>\n{\"site\": \"a\",\n \"max\": 2}\n</parameter>\n<parameter=tags>\nnot json\n</parameter>\n</function>\n</tool_call>\nDone.",
		want: []Piece{start(0, "search_web"), args(0, `{"query": "def f():\n    return \"x\"\\n\n", "filters": {"site":"a","max":2}, "tags": "not json"}`), txt("Done.")}},
	{name: "qwen35 no schema guesses types", fam: FamilyQwen35, opts: ParserOptions{Tools: true},
		in:   "<tool_call>\n<function=f>\n<parameter=n>\n5\n</parameter>\n<parameter=s>\nfive\n</parameter>\n<parameter=o>\n[1]\n</parameter>\n</function>\n</tool_call>",
		want: []Piece{start(0, "f"), args(0, `{"n": 5, "s": "five", "o": [1]}`)}},
	{name: "qwen35 parameter unknown to the schema is a string", fam: FamilyQwen35, opts: ParserOptions{Tools: true, ToolSchemas: testSchemas},
		in:   "<tool_call>\n<function=get_weather>\n<parameter=zip>\n0150\n</parameter>\n</function>\n</tool_call>",
		want: []Piece{start(0, "get_weather"), args(0, `{"zip": "0150"}`)}},
	{name: "qwen35 missing closing parameter tags", fam: FamilyQwen35, opts: ParserOptions{Tools: true, ToolSchemas: testSchemas},
		in:   "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n</function>\n</tool_call>",
		want: []Piece{start(0, "get_weather"), args(0, `{"city": "Oslo", "days": 2}`)}},
	{name: "qwen35 cut inside a string parameter", fam: FamilyQwen35, opts: ParserOptions{Tools: true, ToolSchemas: testSchemas},
		in:   "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n<parameter=city>\nNew Yo",
		want: []Piece{start(0, "get_weather"), args(0, `{"days": 2, "city": "New Yo"}`)}},
	{name: "qwen35 cut inside a typed parameter", fam: FamilyQwen35, opts: ParserOptions{Tools: true, ToolSchemas: testSchemas},
		in:   "<tool_call>\n<function=get_weather>\n<parameter=days>\n2",
		want: []Piece{start(0, "get_weather"), args(0, `{}`)}},
	{name: "qwen35 json form still works", fam: FamilyQwen35, opts: ParserOptions{Tools: true},
		in:   "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
		want: []Piece{start(0, "f"), args(0, `{}`)}},

	{name: "deepseek thinking then answer", fam: FamilyDeepSeekV4, opts: ParserOptions{ThinkingOpen: true, Tools: true},
		in: "Reasoning here.</think>The answer.", want: []Piece{rsn("Reasoning here."), txt("The answer.")}},
	{name: "deepseek dsml calls", fam: FamilyDeepSeekV4, opts: ParserOptions{ThinkingOpen: true, Tools: true, ToolSchemas: testSchemas},
		in: "Thinking.</think>Let me look.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Oslo \"Sentrum\"</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"search_web\">\n<｜DSML｜parameter name=\"filters\" string=\"false\">{\"max\": 2}</｜DSML｜parameter>\n<｜DSML｜parameter name=\"query\" string=\"false\">not json</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
		want: []Piece{rsn("Thinking."), txt("Let me look."), start(0, "get_weather"), args(0, `{"city": "Oslo \"Sentrum\"", "days": 3}`),
			start(1, "search_web"), args(1, `{"filters": {"max":2}, "query": "not json"}`)}},
	{name: "deepseek cut inside an invoke", fam: FamilyDeepSeekV4, opts: ParserOptions{Tools: true},
		in:   "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"q\" string=\"true\">abc",
		want: []Piece{start(0, "f"), args(0, `{"q": "abc"}`)}},
	{name: "deepseek fullwidth bars in plain text", fam: FamilyDeepSeekV4, opts: ParserOptions{Tools: true},
		in: "a ｜ b <｜DSML｜tool", want: []Piece{txt("a ｜ b <｜DSML｜tool")}},
}

func TestParser(t *testing.T) {
	for _, tc := range parserCases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			got := parseChunks(tc.fam, tc.opts, tc.in)
			is.Equal(got, tc.want)
			checkArgsValid(t, got)
		})
	}
}

// TestParserSplits feeds every case split at every byte position, and byte
// by byte, and wants the pieces of the whole-string parse.
func TestParserSplits(t *testing.T) {
	for _, tc := range parserCases {
		t.Run(tc.name, func(t *testing.T) {
			whole := parseChunks(tc.fam, tc.opts, tc.in)
			for i := 1; i < len(tc.in); i++ {
				got := parseChunks(tc.fam, tc.opts, tc.in[:i], tc.in[i:])
				if !equalPieces(got, whole) {
					t.Fatalf("split at %d (%q | %q):\n got %v\nwant %v", i, tc.in[:i], tc.in[i:], got, whole)
				}
			}
			bytesIn := make([]string, len(tc.in))
			for i := 0; i < len(tc.in); i++ {
				bytesIn[i] = tc.in[i : i+1]
			}
			if got := parseChunks(tc.fam, tc.opts, bytesIn...); !equalPieces(got, whole) {
				t.Fatalf("byte by byte:\n got %v\nwant %v", got, whole)
			}
		})
	}
}

func equalPieces(a, b []Piece) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// checkArgsValid wants every call's fragments to make one JSON object.
func checkArgsValid(t *testing.T, ps []Piece) {
	t.Helper()
	argsOf := map[int]*strings.Builder{}
	for _, p := range ps {
		switch p.Kind {
		case PieceToolCallStart:
			argsOf[p.Index] = &strings.Builder{}
		case PieceToolCallArgs:
			b, ok := argsOf[p.Index]
			if !ok {
				t.Fatalf("arguments for call %d before its start", p.Index)
			}
			b.WriteString(p.Text)
		}
	}
	for i, b := range argsOf {
		var obj map[string]any
		if err := json.Unmarshal([]byte(b.String()), &obj); err != nil {
			t.Fatalf("call %d arguments %q: %v", i, b.String(), err)
		}
	}
}

func TestParserReasoningState(t *testing.T) {
	for _, fam := range []Family{FamilyQwen3, FamilyQwen35, FamilyDeepSeekV4} {
		t.Run(fam.String(), func(t *testing.T) {
			is := is.New(t)
			p := NewParser(fam, ParserOptions{ThinkingOpen: true, NewID: seqIDs})
			is.True(p.InReasoning())
			out := p.Feed("a long thought")
			is.True(p.InReasoning())
			// A reasoning budget forces the block closed with the family's tag.
			out = append(out, p.Feed(p.ReasoningCloseTag())...)
			is.True(!p.InReasoning())
			out = append(out, p.Feed("answer")...)
			out = append(out, p.Close()...)
			is.Equal(coalesce(out), []Piece{rsn("a long thought"), txt("answer")})
		})
	}
	is := is.New(t)
	is.Equal(NewParser(FamilyQwen35, ParserOptions{}).ReasoningCloseTag(), "\n</think>\n\n")
	is.Equal(NewParser(FamilyDeepSeekV4, ParserOptions{}).ReasoningCloseTag(), "</think>")
	p := NewParser(FamilyQwen3, ParserOptions{})
	is.True(!p.InReasoning())
	p.Feed("<think>")
	is.True(p.InReasoning()) // Qwen3 opens thinking itself
}

func TestParserRandomIDs(t *testing.T) {
	is := is.New(t)
	p := NewParser(FamilyQwen3, ParserOptions{Tools: true})
	out := p.Feed("<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>")
	var ids []string
	for _, pc := range out {
		if pc.Kind == PieceToolCallStart {
			ids = append(ids, pc.ID)
		}
	}
	is.Equal(len(ids), 2)
	is.True(strings.HasPrefix(ids[0], "call_") && len(ids[0]) == 29)
	is.True(ids[0] != ids[1])
}

func TestThinkingOpenAndFamily(t *testing.T) {
	is := is.New(t)
	is.True(ThinkingOpen("<|im_start|>assistant\n<think>\n"))
	is.True(!ThinkingOpen("<|im_start|>assistant\n<think>\n\n</think>\n\n"))
	is.True(ThinkingOpen("<｜Assistant｜><think>"))
	is.True(!ThinkingOpen("<｜Assistant｜></think>"))
	is.Equal(DetectFamily("qwen3", ""), FamilyQwen3)
	is.Equal(DetectFamily("qwen35", ""), FamilyQwen35)
	is.Equal(DetectFamily("deepseek4", ""), FamilyDeepSeekV4)
	is.Equal(DetectFamily("llama", ""), FamilyUnknown)
	is.Equal(DetectFamily("qwen35", "{{ '<tool_call>' }}"), FamilyQwen3) // the template decides
}

func TestRequestOptions(t *testing.T) {
	is := is.New(t)
	off := false
	req := &sdk.ChatRequest{Tools: testSchemas, Reasoning: sdk.Reasoning{Enabled: &off},
		TemplateKwargs: map[string]any{"preserve_thinking": true}}
	ro := RequestRenderOptions(req)
	is.True(ro.AddGenerationPrompt)
	is.Equal(len(ro.Tools), 2)
	is.Equal(*ro.EnableThinking, false)
	is.Equal(ro.Extra["preserve_thinking"], true)
	po := RequestParserOptions(req, "<|im_start|>assistant\n<think>\n")
	is.True(po.ThinkingOpen && po.Tools)
	req.ToolChoice = "none"
	is.Equal(len(RequestRenderOptions(req).Tools), 0)
	is.True(!RequestParserOptions(req, "").Tools)
}

func TestParserDuplicateArguments(t *testing.T) {
	is := is.New(t)
	got := parseChunks(FamilyQwen3, ParserOptions{Tools: true},
		"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"arguments\": {\"b\": 2}}</tool_call>")
	is.Equal(got, []Piece{start(0, "f"), args(0, `{"a": 1}`)})
}

// TestToolCallArgumentsKeepUTF8 checks that streamed JSON arguments carry
// the model's bytes: a byte once became the rune of the same number.
func TestToolCallArgumentsKeepUTF8(t *testing.T) {
	is := is.New(t)
	p := NewParser(FamilyQwen3, ParserOptions{Tools: true})
	var args string
	for _, pc := range append(p.Feed("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": \"Zürich 東京\"}}\n</tool_call>"), p.Close()...) {
		if pc.Kind == PieceToolCallArgs {
			args += pc.Text
		}
	}
	is.Equal(args, `{"city": "Zürich 東京"}`)
}

package chat

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// markup is the tag set of a parameter-style tool call: Qwen3.5's XML form
// and DeepSeek V4's DSML form share one parser.
type markup struct {
	funcOpen, paramOpen, paramClose, funcClose, blockClose string
	// trimNL strips the newline the template puts after the opening and
	// before the closing parameter tag.
	trimNL bool
	// quoted: names are attributes (name="x") rather than <function=x>.
	quoted bool
}

var (
	qwenXML = markup{
		funcOpen: "<function=", paramOpen: "<parameter=", paramClose: "</parameter>",
		funcClose: "</function>", blockClose: "</tool_call>", trimNL: true,
	}
	deepseekDSML = markup{
		funcOpen: "<" + dsml + `invoke name="`, paramOpen: "<" + dsml + `parameter name="`,
		paramClose: "</" + dsml + "parameter>", funcClose: "</" + dsml + "invoke>",
		blockClose: "</" + dsml + "tool_calls>", quoted: true,
	}
)

type callState uint8

const (
	csDetect     callState = iota // Qwen: JSON object or <function=…>?
	csJSON                        // Qwen3 JSON object
	csBlock                       // DeepSeek: between invokes
	csFuncName                    // reading the function name
	csInFunc                      // between parameters
	csParamName                   // reading a parameter header
	csParamValue                  // inside a parameter value
)

// toolCall parses the inside of one tool-call block.
type toolCall struct {
	preWS    string // whitespace before the tag, restored if it is text
	mk       markup
	closeTag string // what ends the block after the call (Qwen)
	state    callState

	index   int
	started bool // ToolCallStart sent for the current function
	name    string
	nParams int
	param   paramValue
	json    *jsonCall
}

func newToolCall(f Family) *toolCall {
	if f == FamilyDeepSeekV4 {
		return &toolCall{mk: deepseekDSML, state: csBlock}
	}
	return &toolCall{mk: qwenXML, closeTag: "</tool_call>", state: csDetect}
}

// step consumes what it can of p.buf; false means it needs more input.
func (c *toolCall) step(p *Parser, final bool) bool {
	switch c.state {
	case csDetect:
		s := strings.TrimLeft(p.buf, " \t\r\n")
		switch {
		case strings.HasPrefix(s, c.mk.funcOpen):
			p.buf = s[len(c.mk.funcOpen):]
			c.state = csFuncName
		case strings.HasPrefix(s, "{"):
			p.buf = s
			c.json = newJSONCall()
			c.state = csJSON
		case (s == "" || strings.HasPrefix(c.mk.funcOpen, s)) && !final:
			return false
		default:
			// Not a tool call after all: the tag was text.
			p.emit(PieceText, c.preWS+p.syntax.toolOpen, 0)
			p.seg.started = true
			p.call = nil
			p.mode = modeText
		}
		return true
	case csJSON:
		return c.json.step(p, c, final)
	case csBlock:
		return c.scanTags(p, final, []string{c.mk.funcOpen, c.mk.blockClose}, nil)
	case csFuncName, csParamName:
		i := strings.IndexByte(p.buf, '>')
		if i < 0 {
			if final {
				p.buf = ""
			}
			return false
		}
		header := p.buf[:i]
		p.buf = p.buf[i+1:]
		if c.state == csFuncName {
			c.beginFunc(p, strings.TrimSuffix(strings.TrimSpace(header), `"`))
			return true
		}
		c.beginParam(p, header)
		return true
	case csInFunc:
		return c.scanTags(p, final, []string{c.mk.paramOpen, c.mk.funcClose, c.mk.blockClose}, nil)
	case csParamValue:
		return c.scanTags(p, final,
			[]string{c.mk.paramClose, c.mk.paramOpen, c.mk.funcClose, c.mk.blockClose}, &c.param)
	}
	return false
}

// scanTags finds the next tag of the state; text before it is the current
// parameter's value (val) or ignored.
func (c *toolCall) scanTags(p *Parser, final bool, tags []string, val *paramValue) bool {
	idx, tag := findFirst(p.buf, tags)
	if idx < 0 {
		n := len(p.buf)
		if !final {
			n -= max(holdBack(p.buf, tags), partialRune(p.buf))
		}
		if val != nil {
			n -= c.valueText(p, p.buf[:n], false, final)
		}
		p.buf = p.buf[n:]
		return false
	}
	if val != nil {
		c.valueText(p, p.buf[:idx], true, final)
		c.endParam(p)
		if tag != c.mk.paramClose {
			// A missing </parameter>: the tag belongs to the function.
			p.buf = p.buf[idx:]
			c.state = csInFunc
			return true
		}
	}
	p.buf = p.buf[idx+len(tag):]
	switch tag {
	case c.mk.funcOpen:
		c.state = csFuncName
	case c.mk.paramOpen:
		c.state = csParamName
	case c.mk.funcClose:
		c.endFunc(p)
		if c.closeTag != "" { // Qwen: one function per <tool_call>
			p.mode = modeAfterCall
			return true
		}
		c.state = csBlock
	case c.mk.blockClose:
		c.endFunc(p)
		p.call = nil
		p.mode = modeText
	}
	return true
}

func (c *toolCall) beginFunc(p *Parser, name string) {
	c.name = name
	c.index = p.startCall(name)
	c.started = true
	c.nParams = 0
	p.emit(PieceToolCallArgs, "{", c.index)
	c.state = csInFunc
}

func (c *toolCall) endFunc(p *Parser) {
	if !c.started {
		return
	}
	p.emit(PieceToolCallArgs, "}", c.index)
	c.started = false
}

func (c *toolCall) beginParam(p *Parser, header string) {
	name := strings.TrimSpace(header)
	kind := vkUnset
	if c.mk.quoted {
		// name" string="true|false"
		rest := ""
		if i := strings.IndexByte(header, '"'); i >= 0 {
			name, rest = header[:i], header[i+1:]
		}
		switch {
		case strings.Contains(rest, `string="true"`):
			kind = vkString
		case strings.Contains(rest, `string="false"`):
			kind = vkRawJSON
		}
	}
	c.param = paramValue{name: name, kind: kind, schema: p.types.kind(c.name, name), leading: c.mk.trimNL}
	if c.param.kind == vkUnset {
		c.param.kind = c.param.schema
	}
	if c.param.kind == vkString {
		p.emit(PieceToolCallArgs, c.sep()+jsonString(name)+`: "`, c.index)
	}
	c.state = csParamValue
}

func (c *toolCall) sep() string {
	c.nParams++
	if c.nParams == 1 {
		return ""
	}
	return ", "
}

// valueText takes the next part of a parameter value; last says the closing
// tag follows it. It returns how many trailing bytes of s it left unread.
func (c *toolCall) valueText(p *Parser, s string, last, final bool) int {
	v := &c.param
	if v.leading {
		if s == "" && !last && !final {
			return 0 // cannot tell yet whether a newline comes first
		}
		s = strings.TrimPrefix(s, "\n")
		v.leading = false
	}
	back := 0
	if c.mk.trimNL {
		if last {
			s = strings.TrimSuffix(s, "\n")
		} else if !final && strings.HasSuffix(s, "\n") {
			// May be the newline before </parameter>: keep it back.
			s, back = s[:len(s)-1], 1
		}
	}
	if v.kind == vkString {
		p.emit(PieceToolCallArgs, escapeJSON(s), c.index)
	} else {
		v.raw.WriteString(s)
	}
	return back
}

func (c *toolCall) endParam(p *Parser) {
	v := &c.param
	if v.kind == vkString {
		p.emit(PieceToolCallArgs, `"`, c.index)
	} else {
		p.emit(PieceToolCallArgs, c.sep()+jsonString(v.name)+": "+v.json(), c.index)
	}
	c.param = paramValue{}
	c.state = csInFunc
}

// abort closes a call cut off by the end of generation; a parameter value
// still being collected is dropped, a streaming string is closed.
func (c *toolCall) abort(p *Parser) {
	switch c.state {
	case csJSON:
		c.json.abort(p)
		return
	case csParamValue:
		if c.param.kind == vkString {
			p.emit(PieceToolCallArgs, `"`, c.index)
		}
	}
	c.endFunc(p)
}

// jsonCall parses Qwen3's {"name": …, "arguments": {…}} form, streaming the
// arguments object once the name is known.
type jsonCall struct {
	lx        jsonLexer
	raw       []byte
	pos       int
	keyStart  int
	key       string
	valStart  int
	name      string
	haveName  bool
	args      []byte
	haveArgs  bool
	stream    *jsonStreamer
	streaming bool
	streamed  bool
	outerDone bool
	index     int
	started   bool
}

func newJSONCall() *jsonCall {
	j := &jsonCall{}
	j.lx.events = j.event
	return j
}

func (j *jsonCall) event(ev lexEvent, depth int, consumed bool) {
	end := j.pos
	if consumed {
		end++
	}
	switch {
	case depth == 0 && ev == evValueEnd:
		j.outerDone = true
	case depth != 1:
	case ev == evKeyStart:
		j.keyStart = j.pos
	case ev == evKeyEnd:
		j.key = ""
		_ = json.Unmarshal(j.raw[j.keyStart:end], &j.key)
	case ev == evValueStart:
		j.valStart = j.pos
		if isArgsKey(j.key) && j.haveName && !j.streamed && !j.haveArgs && j.raw[j.pos] == '{' {
			j.streaming = true
			j.stream = &jsonStreamer{}
		}
	case ev == evValueEnd:
		val := j.raw[j.valStart:end]
		switch j.key {
		case "name":
			j.haveName = json.Unmarshal(val, &j.name) == nil
		case "arguments", "parameters":
			if !j.streaming && !j.haveArgs {
				j.args, j.haveArgs = append([]byte(nil), val...), true
			}
		}
	}
}

// isArgsKey: "arguments" is the Qwen form; some models write "parameters".
func isArgsKey(k string) bool { return k == "arguments" || k == "parameters" }

func (j *jsonCall) step(p *Parser, c *toolCall, final bool) bool {
	for i := 0; i < len(p.buf); i++ {
		b := p.buf[i]
		j.pos = len(j.raw)
		j.raw = append(j.raw, b)
		if !j.lx.step(b) {
			j.raw = j.raw[:j.pos]
			if j.lx.failed {
				p.buf = p.buf[i:]
				j.fail(p, c)
				return true
			}
		} else if j.streaming {
			if !j.started {
				j.start(p)
			}
			j.stream.feed(p.buf[i : i+1]) // the byte as it is: string(b) would make it a rune
			p.emit(PieceToolCallArgs, j.stream.take(), j.index)
			if j.stream.lx.done {
				j.streaming, j.streamed = false, true
			}
		}
		if j.outerDone {
			p.buf = p.buf[i+1:]
			j.finish(p, c)
			p.mode = modeAfterCall
			return true
		}
	}
	p.buf = ""
	if final {
		j.abort(p)
		p.call = nil
		p.mode = modeText
	}
	return false
}

func (j *jsonCall) start(p *Parser) {
	j.index = p.startCall(j.name)
	j.started = true
}

// finish sends a call whose name came after its arguments, or whose
// arguments were not an object.
func (j *jsonCall) finish(p *Parser, c *toolCall) {
	if j.streamed {
		return
	}
	if !j.haveName {
		p.emit(PieceText, c.preWS+p.syntax.toolOpen+string(j.raw), 0)
		return
	}
	if !j.started {
		j.start(p)
	}
	p.emit(PieceToolCallArgs, argumentsObject(j.args, j.haveArgs), j.index)
	j.streamed = true
}

// argumentsObject turns a collected "arguments" value into a JSON object:
// an object as is, a string holding an object (some models encode it
// twice) unwrapped, anything else "{}".
func argumentsObject(raw []byte, ok bool) string {
	raw = bytes.TrimSpace(raw)
	if !ok || len(raw) == 0 {
		return "{}"
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "{}"
		}
		raw = bytes.TrimSpace([]byte(s))
	}
	if len(raw) == 0 || raw[0] != '{' || !json.Valid(raw) {
		return "{}"
	}
	return string(raw)
}

// fail handles broken JSON: a started call is closed; otherwise the block was
// text after all.
func (j *jsonCall) fail(p *Parser, c *toolCall) {
	if j.started {
		j.abort(p)
		p.mode = modeAfterCall
		return
	}
	p.emit(PieceText, c.preWS+p.syntax.toolOpen+string(j.raw), 0)
	p.call = nil
	p.mode = modeText
}

func (j *jsonCall) abort(p *Parser) {
	if j.started && !j.streamed {
		p.emit(PieceToolCallArgs, j.stream.finish(), j.index)
		j.streamed = true
	}
}

// paramValue is one parameter being parsed.
type paramValue struct {
	name    string
	kind    valueKind // how the value is encoded
	schema  valueKind // what the tool schema says
	leading bool      // a leading newline may still need trimming
	raw     strings.Builder
}

// json renders a collected (non-streaming) value.
func (v *paramValue) json() string {
	s := v.raw.String()
	if v.kind == vkRawJSON {
		if t := strings.TrimSpace(s); t != "" && json.Valid([]byte(t)) {
			return compactJSON(t)
		}
		return convertValue(v.schema, s)
	}
	return convertValue(v.kind, s)
}

func compactJSON(s string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) != nil {
		return s
	}
	return b.String()
}

// jsonString encodes s as a JSON string without HTML escaping.
func jsonString(s string) string { return `"` + escapeJSON(s) + `"` }

// escapeJSON escapes s for the inside of a JSON string. Invalid UTF-8
// becomes U+FFFD, as encoding/json does.
func escapeJSON(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b.WriteString(`\ufffd`)
			} else {
				b.WriteString(s[i : i+size])
			}
			i += size
			continue
		}
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if c < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hex[c>>4])
				b.WriteByte(hex[c&0xF])
			} else {
				b.WriteByte(c)
			}
		}
		i++
	}
	return b.String()
}
